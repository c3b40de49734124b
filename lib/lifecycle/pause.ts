/**
 * Pause and resume: every process of a sandbox frozen by Docker's pause
 * (the cgroup freezer: memory kept, no CPU), then thawed where it was.
 *
 * A paused runner stops beating, which every host would otherwise judge as
 * death and repair by killing the container. So a pause is recorded where
 * only the host can write (`pause_record.ts`), under the sandbox lock,
 * before the freeze; the record decides three things:
 * - a submission (`ensure` without trouble) fails at once with
 *   {@linkcode SandboxPausedError}, without a Docker call, and is never
 *   queued, so nothing runs late or twice after the resume;
 * - a host waiting on a request that ran when the pause came judges the
 *   runner stale; its revival is void (`judgedWhilePaused`): it keeps
 *   waiting, and the request finishes after the resume, once;
 * - a judgement made just before a resume's fresh beat is void too: for
 *   {@linkcode STALE_AFTER_MS} after a resume, a stale runner is given the
 *   time any runner gets to beat again.
 *
 * Docker's word wins where it differs: `ensureContainer` refuses a paused
 * container whoever paused it, and `resumeSandbox` of a container that is
 * not paused only records the resume.
 *
 * @module
 */
import type { SandboxConfig } from "../config/config.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";
import type { DockerClient } from "../docker/mod.ts";
import { UsageError } from "../errors.ts";
import { judgeRunner, STALE_AFTER_MS } from "../queue/liveness.ts";
import { queuePaths } from "../queue/schema.ts";
import { ownedBy } from "./ensure.ts";
import { statePaths } from "./identity.ts";
import { withLock } from "./lock.ts";
import { writeWarm } from "./warm.ts";
import { clearPause, readPause, writePause } from "./pause_record.ts";

/** Options of {@linkcode pauseSandbox} and {@linkcode resumeSandbox}. */
export interface PauseOptions {
  /** The config of this waffle home. */
  config: SandboxConfig;
}

/**
 * Freezes every process of a user's sandbox (Docker's pause). Commands then
 * fail at once with {@linkcode SandboxPausedError} until
 * {@linkcode resumeSandbox}.
 *
 * @example
 * ```ts ignore
 * await pauseSandbox(new DockerClient(), sandboxKey("default", "alice"), { config: loadConfig() });
 * ```
 *
 * @param docker The Docker client.
 * @param key Whose sandbox.
 * @param options Config.
 * @returns True when it was paused now; false when it already was.
 * @throws {UsageError} When the user has no sandbox here, or it is not running.
 */
export async function pauseSandbox(
  docker: DockerClient,
  key: SandboxKey,
  options: PauseOptions,
): Promise<boolean> {
  const paths = statePaths(options.config.home, key);
  return await withLock(paths.lock, async () => {
    const container = await docker.inspectContainer(key.containerName);
    if (container === null || !ownedBy(container, paths.root)) throw noSandbox(key);
    if (container.State.Paused) {
      writePause(paths.root, { state: "paused", at: Date.now() });
      return false;
    }
    if (!container.State.Running) {
      throw new UsageError(
        `Sandbox '${key.user}' of tenant '${key.tenant}' is not running (${container.State.Status}); nothing to pause`,
      );
    }
    // Recorded first: a host killed between the two leaves a sandbox that
    // refuses commands until a resume, never a frozen one judged dead.
    writePause(paths.root, { state: "paused", at: Date.now() });
    writeWarm(paths.root, undefined);
    await docker.pauseContainer(container.Id);
    return true;
  });
}

/** How long a resume waits for the thawed runner's first beat. */
const BEAT_WAIT_MS = STALE_AFTER_MS;

/**
 * Thaws a user's paused sandbox: its processes go on where they were (none
 * is restarted), and it takes commands again once its runner has beaten.
 *
 * @example
 * ```ts ignore
 * await resumeSandbox(new DockerClient(), sandboxKey("default", "alice"), { config: loadConfig() });
 * ```
 *
 * @param docker The Docker client.
 * @param key Whose sandbox.
 * @param options Config.
 * @returns True when it was paused and now runs; false when it was not paused.
 * @throws {UsageError} When the user has no sandbox here.
 */
export async function resumeSandbox(
  docker: DockerClient,
  key: SandboxKey,
  options: PauseOptions,
): Promise<boolean> {
  const paths = statePaths(options.config.home, key);
  return await withLock(paths.lock, async () => {
    const container = await docker.inspectContainer(key.containerName);
    if (container === null || !ownedBy(container, paths.root)) {
      clearPause(paths.root);
      throw noSandbox(key);
    }
    if (!container.State.Paused) {
      // Never frozen (a host killed before the freeze) or thawed by hand.
      if (readPause(paths.root)?.state === "paused") {
        writePause(paths.root, { state: "resumed", at: Date.now() });
      }
      return false;
    }
    const { heartbeat } = queuePaths(paths.queue, { outboundDir: paths.outbound });
    const before = judgeRunner(heartbeat, { queue: paths.queue }).beat?.seq;
    await docker.unpauseContainer(container.Id);
    await nextBeat(heartbeat, { queue: paths.queue, before });
    writePause(paths.root, { state: "resumed", at: Date.now() });
    return true;
  });
}

// Waits (bounded) for a beat after the thaw, so the next command finds a
// runner judged alive; a runner that does not beat is judged as any other.
async function nextBeat(
  heartbeat: string,
  options: { queue: string; before: number | undefined },
): Promise<void> {
  const deadline = Date.now() + BEAT_WAIT_MS;
  while (Date.now() < deadline) {
    const judged = judgeRunner(heartbeat, { queue: options.queue });
    if (judged.state === "alive" && judged.beat?.seq !== options.before) return;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function noSandbox(key: SandboxKey): UsageError {
  return new UsageError(`No sandbox for user '${key.user}' of tenant '${key.tenant}'`);
}
