/**
 * Removing a user's sandbox: its container, and with `purge` its state and
 * its egress identity (the proxy stops serving it), under the sandbox lock.
 * This home's container only, never another's of the same (tenant, user).
 *
 * @module
 */
import type { SandboxConfig } from "../config/config.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";
import type { DockerClient } from "../docker/mod.ts";
import { recordedLaunch } from "../lifecycle/egress_record.ts";
import { ownedBy } from "../lifecycle/ensure.ts";
import { statePaths } from "../lifecycle/identity.ts";
import { withLock } from "../lifecycle/lock.ts";
import { hostCanChown, SANDBOX_UID } from "../lifecycle/posture.ts";
import { removeVolume } from "../lifecycle/quota.ts";
import { purgeState } from "../lifecycle/state_dir.ts";
import { resolveTaken } from "../lifecycle/pool.ts";
import { writeWarm } from "../lifecycle/warm.ts";
import { clearPause } from "../lifecycle/pause_record.ts";

/**
 * Removes a user's container; with `purge`, also their state (queue and workspace).
 *
 * @param docker The Docker client.
 * @param key Whose sandbox.
 * @param options Config and purge.
 * @returns True when a container was removed.
 */
export async function removeSandbox(
  docker: DockerClient,
  key: SandboxKey,
  options: { config: SandboxConfig; purge?: boolean },
): Promise<boolean> {
  const paths = statePaths(options.config.home, key);
  return await withLock(paths.lock, async () => {
    // The name may be held by the same (tenant, user) of another WAFFLE_HOME: leave that one.
    const container = await docker.inspectContainer(key.containerName);
    const ours = container !== null && ownedBy(container, paths.root);
    if (options.purge && ours && !hostCanChown()) {
      // A host that is not root cannot delete what commands wrote (uid
      // SANDBOX_UID): empty the workspace as that uid, inside the container.
      if (!container.State.Running) await docker.startContainer(container.Id);
      else if (container.State.Paused) await docker.unpauseContainer(container.Id);
      await docker.exec(container.Id, [
        "/bin/sh",
        "-c",
        "chmod -R u+rwX /workspace; find /workspace -mindepth 1 -maxdepth 1 -exec rm -rf {} +",
      ], { user: `${SANDBOX_UID}:${SANDBOX_UID}`, timeoutMs: 60_000 });
    }
    const removed = ours && await docker.removeContainer(container.Id, { force: true });
    if (!options.purge) {
      // The state stays for the next call to heal: no warm record outlives its container.
      writeWarm(paths.root, undefined);
      // Nor a pause record: the next call makes a running container.
      clearPause(paths.root);
      return removed;
    }
    // A sandbox taken from a warm pool: its state is the member's, its own
    // root and channel directory are links to it.
    const { paths: lying, links } = resolveTaken(paths);
    await removeVolume(lying.root);
    const egress = recordedLaunch(lying.root);
    if (egress !== undefined) {
      // Loaded here, for a sandbox that had egress only.
      const { forgetIdentity } = await import("../egress/policy_writer.ts");
      await forgetIdentity(options.config.home, egress.id);
    }
    // Never a recursive delete in this process: the workspace and outbound/
    // are trees the sandbox shaped (see remove_tree.ts).
    await purgeState(lying);
    for (const link of links) Deno.removeSync(link);
    // The member's own lock: nothing takes it once the member was taken.
    if (links.length > 0) await Deno.remove(lying.lock).catch(() => {});
    return removed;
  });
}
