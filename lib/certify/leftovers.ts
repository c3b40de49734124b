/**
 * What certification runs that died left behind (a `kill -9`, a crash, a
 * lost terminal): their disposable containers, with the anonymous volumes
 * an image's VOLUME gave them, their named volumes, and their throwaway
 * sandboxes with the quota volume and home of each. Only a run whose owner
 * is gone (`owner.ts`) is swept; a run still going, or owned elsewhere, is
 * left alone.
 *
 * @module
 */
import type { DockerClient } from "../docker/client.ts";
import { LABELS } from "../lifecycle/posture.ts";
import { basename, dirname, join } from "../path.ts";
import { CERTIFY_LABEL, type Cleanup } from "./cleanup.ts";
import { CERTIFY_OWNER_LABEL, OWNER_FILE, ownerGone } from "./owner.ts";
import { CERTIFY_TENANT, RIG_HOME_PREFIX } from "./rig.ts";

/**
 * Registers with `cleanup` what dead runs left: containers and volumes
 * labelled with a gone owner, and certification sandboxes whose home names
 * a gone owner (the container, its quota volume and the home). The caller
 * runs the cleanup.
 *
 * @param docker The daemon.
 * @param cleanup The current run's cleanup.
 * @returns The dead runs' ids, where their resources name one.
 * @throws {DockerError} When the daemon cannot list containers or volumes.
 *
 * @example
 * ```ts ignore
 * const dead = await registerLeftovers(docker, cleanup);
 * await cleanup.run();
 * ```
 */
export async function registerLeftovers(docker: DockerClient, cleanup: Cleanup): Promise<string[]> {
  const runs = new Set<string>();
  const labelled = await docker.listContainers({ all: true, labels: [CERTIFY_OWNER_LABEL] });
  for (const container of labelled) {
    if (!ownerGone(container.Labels[CERTIFY_OWNER_LABEL])) continue;
    runs.add(container.Labels[CERTIFY_LABEL] ?? "?");
    cleanup.container(container.Id);
  }
  for (const volume of await docker.listVolumes({ labels: [CERTIFY_OWNER_LABEL] })) {
    if (!ownerGone(volume.Labels[CERTIFY_OWNER_LABEL])) continue;
    runs.add(volume.Labels[CERTIFY_LABEL] ?? "?");
    cleanup.volume(volume.Name);
  }
  const sandboxes = await docker.listContainers({
    all: true,
    labels: [`${LABELS.tenant}=${CERTIFY_TENANT}`],
  });
  for (const container of sandboxes) {
    const root = container.Labels[LABELS.state];
    const home = root === undefined ? undefined : rigHomeOf(root);
    if (root === undefined || home === undefined || !ownerGone(readOwner(home))) continue;
    if (container.Labels[CERTIFY_LABEL] !== undefined) runs.add(container.Labels[CERTIFY_LABEL]);
    cleanup.container(container.Id, { stateRoot: root });
    cleanup.quota(root);
    cleanup.dir(home);
  }
  runs.delete("?");
  return [...runs].sort();
}

// The throwaway home a certification sandbox's state root is in
// (`<home>/sandboxes/<hash>`), when it is one.
function rigHomeOf(root: string): string | undefined {
  const home = dirname(dirname(root));
  const layout = basename(dirname(root)) === "sandboxes" &&
    basename(home).startsWith(RIG_HOME_PREFIX);
  return layout ? home : undefined;
}

function readOwner(home: string): string | undefined {
  try {
    return Deno.readTextFileSync(join(home, OWNER_FILE));
  } catch {
    // No home here (another host's, or gone): not judged.
    return undefined;
  }
}
