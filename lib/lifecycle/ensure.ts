/**
 * ensure: make the sandbox of one (tenant, user) exist, match today's image
 * and posture, run, and have a live runner. Callers hold the sandbox lock.
 *
 * inspect → reuse running | start stopped | recreate when dead, restarting,
 * or when the image id or posture differ → wait for the runner's first
 * heartbeat. A paused container (`pause.ts`) is refused, never recreated:
 * its processes are waiting for a resume.
 *
 * @module
 */
import type { SandboxConfig } from "../config/config.ts";
import { type DockerClient, DockerConflictError } from "../docker/mod.ts";
import type { ContainerInspect } from "../docker/types.ts";
import { DockerError, RunnerError, SandboxPausedError } from "../errors.ts";
import { settleAll } from "../async.ts";
import type { Queue } from "../queue/queue.ts";
import type { RunnerTrouble } from "../queue/liveness.ts";
import { mark } from "../trace.ts";
import type { StatePaths } from "./identity.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";
import {
  type ContainerSpec,
  containerSpec,
  type ImageFacts,
  LABELS,
  postureDrift,
  refuseUncoverableVolumes,
} from "./posture.ts";
import { outboundMounted, outboundReplaced } from "./outbound_in_place.ts";
import { readBinding } from "./pool.ts";
import { removeSetAsideTrees, resetOutbound, stateExists } from "./state_dir.ts";

/**
 * What ensure had to do. `warm`: the last full ensure's findings still held
 * (see `warm.ts`), so the container was not inspected.
 */
export type EnsureAction = "warm" | "reused" | "started" | "created" | "recreated";

/** The outcome of {@linkcode ensureContainer}. */
export interface Ensured {
  /** The sandbox container's id. */
  containerId: string;
  /** The immutable id of the image the container runs. */
  imageId: string;
  /** That image's settings the sandbox takes (see {@linkcode ImageFacts}). */
  image: ImageFacts;
  /** The posture hash it was created with (today's). */
  postureHash: string;
  /** Its init process's pid as Docker reports it (0 when not running). */
  pid: number;
  /** What was done to get there. */
  action: EnsureAction;
}

/** Options for {@linkcode ensureContainer}. */
export interface EnsureOptions {
  /** The image, limits and posture settings the container must match. */
  config: SandboxConfig;
  /** The sandbox's state directories, bind-mounted into the container. */
  paths: StatePaths;
  /** The host side of this sandbox's queue (to watch the heartbeat). */
  queue: Queue;
  /** How long to wait for the first heartbeat. Default 20 s. */
  readyTimeoutMs?: number;
  /**
   * How long a recycle waits for in-flight requests to finish. Default 60 s.
   * The runner's own count decides nothing beyond this bound.
   */
  drainTimeoutMs?: number;
  /**
   * Work the container's mounts depend on (the volume), already under way:
   * it runs beside the inspects and is awaited before anything is created
   * or started.
   */
  prepared?: Promise<unknown>;
  /**
   * What a waiting host found wrong with the runner: `stale` and `locked`
   * kill the container (everything in it dies, locks included) and start it
   * again; `damaged` also replaces `outbound/` with an empty one.
   */
  trouble?: RunnerTrouble;
}

/**
 * Resolves a configured image reference to its immutable id. Every
 * container of the configured image (a sandbox, a restricted session's,
 * the egress proxy, `doctor --deep`'s) is built from what this returns, so
 * an image with a VOLUME no capped tmpfs can cover is refused here, before
 * anything is made.
 *
 * @param docker The Docker client.
 * @param ref Image reference.
 * @returns The image's id and the settings the sandbox takes from it.
 * @throws {DockerError} When the image does not exist.
 * @throws {UncoverableVolumeError} When it declares a VOLUME no capped tmpfs can cover.
 */
export async function resolveImage(docker: DockerClient, ref: string): Promise<ImageFacts> {
  const image = await docker.inspectImage(ref);
  if (image === null) {
    throw new DockerError(
      `Image '${ref}' not found; build it with 'bash scripts/build_image.sh' (the default image) or 'bash scripts/build_images.sh python'`,
    );
  }
  const { id, env, workingDir, volumes } = image;
  refuseUncoverableVolumes(ref, image);
  return { id, env, workingDir, volumes };
}

/**
 * Why a container's Docker state makes it unusable whatever its config
 * (dead, restarting, being removed), or undefined. Unlike
 * {@linkcode incompatibility} it needs no config, so it can judge another
 * home's container. A paused container is usable once resumed: not a
 * reason (see `pause.ts`).
 *
 * @example
 * ```ts ignore
 * const reason = unusableState((await docker.inspectContainer(id))!.State); // e.g. "dead"
 * ```
 *
 * @param state The inspected container's state.
 * @returns A reason to recreate, or undefined.
 */
export function unusableState(state: ContainerInspect["State"]): string | undefined {
  if (state.Dead || state.Status === "dead") return "dead";
  if (state.Restarting || state.Status === "restarting") return "restarting";
  if (state.Status === "removing") return "being removed";
  return undefined;
}

/**
 * Why an existing container cannot be reused as it is, or undefined.
 *
 * @param container The inspected container.
 * @param expected Today's image id and posture hash.
 * @returns A reason to recreate, or undefined when it is compatible.
 */
export function incompatibility(
  container: ContainerInspect,
  expected: { imageId: string; postureHash: string; spec?: ContainerSpec },
): string | undefined {
  const unusable = unusableState(container.State);
  if (unusable !== undefined) return unusable;
  if (
    container.Image !== expected.imageId ||
    container.Config.Labels[LABELS.image] !== expected.imageId
  ) {
    return "image changed";
  }
  if (container.Config.Labels[LABELS.posture] !== expected.postureHash) return "posture changed";
  const drift = expected.spec === undefined ? undefined : postureDrift(container, expected.spec);
  return drift === undefined ? undefined : `posture changed (${drift})`;
}

/**
 * Ensures the sandbox container runs today's image and posture with a live
 * runner. The caller must hold the sandbox's lock.
 *
 * @param docker The Docker client.
 * @param key Whose sandbox.
 * @param options Config, state paths and the queue.
 * @returns The container id, image id and what was done.
 */
export async function ensureContainer(
  docker: DockerClient,
  key: SandboxKey,
  options: EnsureOptions,
): Promise<Ensured> {
  const { config, paths, queue } = options;
  // Both answers are needed on every call (a same-tag rebuild must recycle):
  // ask for them at once. Every one settles before a failure is thrown: a
  // refused image must not leave the state's preparation (a quota volume
  // being mounted) running after this call, and its caller's clean-up, ended.
  const [image, found] = await settleAll([
    resolveImage(docker, config.image),
    docker.inspectContainer(key.containerName),
    options.prepared ?? Promise.resolve(),
  ]);
  mark("image and container inspected");
  const imageId = image.id;
  const spec = containerSpec(key, { config, image, paths });
  const postureHash = spec.postureHash;
  // A pool member taken for this user whose rename did not happen yet.
  let container = found ?? await takenContainer(docker, paths, spec.name);
  let action: EnsureAction = "reused";

  if (container !== null) {
    // Names carry the home's fingerprint, so another home's label under our
    // name means tampering or a collision: never replace a live sandbox of
    // another home.
    const foreign = !ownedBy(container, paths.root);
    if (foreign) refuseForeign(container, spec.name, paths.root);
    // Whoever paused it, its processes wait for a resume: never recycled,
    // never judged dead by its silent heartbeat.
    else if (container.State.Paused) throw new SandboxPausedError(key);
    const reason = foreign
      ? "its WAFFLE_HOME state is gone"
      : incompatibility(container, { imageId, postureHash: spec.postureHash, spec });
    if (reason !== undefined) {
      // Drain our own queue only: a foreign orphan's requests are not ours to wait for.
      if (!foreign && container.State.Running && !container.State.Paused) {
        await drain(queue, options.drainTimeoutMs);
      }
      await docker.removeContainer(container.Id, { force: true });
      container = null;
      action = "recreated";
    }
  }
  // outbound/ made anew since the container started (a reset, or a missing
  // one recreated by prepareState): a running container still has the old
  // directory mounted, so it is restarted like a wedged one.
  const trouble = options.trouble !== undefined && options.trouble !== "none"
    ? options.trouble
    : container?.State.Running && outboundReplaced(paths)
    ? "stale"
    : undefined;
  if (container !== null && trouble !== undefined) {
    if (trouble !== "exited" && container.State.Running) {
      // The runner is wedged (stopped, killed by force, or holding a lock):
      // kill the whole container so nothing a command left behind survives.
      await docker.killContainer(container.Id).catch(() => {});
      await docker.waitContainer(container.Id, { timeoutMs: 10_000 }).catch(() => {});
    } else if (container.State.Running) {
      await docker.waitContainer(container.Id, { timeoutMs: 10_000 }).catch(() => {});
    }
    // A runner stopped while it held outbound.db's lock hid any damage (the
    // host read its last copy and judged the beat): judged again, unlocked.
    if (trouble === "damaged" || await queue.outboundDamaged()) resetOutbound(paths);
    container = await docker.inspectContainer(container.Id);
  }
  if (container === null) {
    const before = queue.heartbeat()?.bootId;
    let id: string;
    try {
      id = await docker.createContainer(spec.name, spec.body);
      mark("container created");
      if (action === "reused") action = "created";
    } catch (error) {
      // Another process created it between our inspect and create: adopt it
      // (it holds today's spec: it was created under the same lock protocol).
      if (!(error instanceof DockerConflictError)) throw error;
      const adopted = await docker.inspectContainer(spec.name);
      if (adopted === null) throw error;
      if (!ownedBy(adopted, paths.root)) {
        refuseForeign(adopted, spec.name, paths.root, { orphanToo: true });
      }
      id = adopted.Id;
    }
    const pid = await startReady(docker, id, { ...options, before });
    await queue.syncGeneration();
    return { containerId: id, imageId, image, postureHash, pid, action };
  }

  if (container.State.Running) {
    const judged = queue.liveness();
    if (judged.state === "alive") {
      const pid = container.State.Pid;
      return { containerId: container.Id, imageId, image, postureHash, pid, action };
    }
    if (judged.state === "none") {
      // Still booting (no outbound file or heartbeat yet).
      await waitReady(docker, container.Id, {
        queue,
        before: undefined,
        timeoutMs: options.readyTimeoutMs,
      });
      await queue.syncGeneration();
      const pid = container.State.Pid;
      return { containerId: container.Id, imageId, image, postureHash, pid, action };
    }
    // Exited (idle exit, SIGTERM) and about to stop, or judged dead: the
    // waiting host decides the latter (it has watched the heartbeat); here a
    // runner that said it exited is given a moment, then killed.
    await docker.waitContainer(container.Id, { timeoutMs: 5000 }).catch(async () => {
      await docker.killContainer(container!.Id).catch(() => {});
      await docker.waitContainer(container!.Id, { timeoutMs: 10_000 }).catch(() => {});
    });
    if (judged.state === "damaged" || await queue.outboundDamaged()) resetOutbound(paths);
  }
  const before = queue.heartbeat()?.bootId;
  const pid = await startReady(docker, container.Id, { ...options, before });
  await queue.syncGeneration();
  return { containerId: container.Id, imageId, image, postureHash, pid, action: "started" };
}

// The container of a pool member taken for this sandbox (its binding is in
// the host-only root), renamed to the sandbox's name; null when there is none.
async function takenContainer(
  docker: DockerClient,
  paths: StatePaths,
  name: string,
): Promise<ContainerInspect | null> {
  const binding = readBinding(paths.root);
  if (binding === undefined) return null;
  const container = await docker.inspectContainer(binding.containerId);
  if (container === null || !ownedBy(container, paths.root)) return null;
  await docker.renameContainer(container.Id, name);
  return await docker.inspectContainer(container.Id);
}

// The pid of a container's init process after a start (0 when it is gone).
async function pidOf(docker: DockerClient, id: string): Promise<number> {
  return (await docker.inspectContainer(id))?.State.Pid ?? 0;
}

/**
 * Whether a container's `waffle.state` label names this sandbox's state root
 * (the same directory, however spelled).
 *
 * @param container The container.
 * @param root The sandbox's state root.
 * @returns True when it is this sandbox's container.
 */
export function ownedBy(
  container: { Config: { Labels: Record<string, string> } },
  root: string,
): boolean {
  const owner = container.Config.Labels[LABELS.state];
  if (owner === undefined || owner === "") return false;
  if (owner === root) return true;
  try {
    return Deno.realPathSync(owner) === Deno.realPathSync(root);
  } catch {
    return false;
  }
}

/**
 * Throws unless a container holding this sandbox's name is an orphan of a
 * waffle home whose state directory is gone (safe to replace).
 *
 * @param container The container found under the sandbox's name.
 * @param name The name.
 * @param root This sandbox's state root.
 * @param options `orphanToo`: refuse orphans as well (nothing may be adopted from another home).
 * @throws {DockerError} When the container belongs to another live home or is not waffle's.
 */
function refuseForeign(
  container: ContainerInspect,
  name: string,
  root: string,
  options: { orphanToo?: boolean } = {},
): void {
  const owner = container.Config.Labels[LABELS.state] ?? "";
  if (owner !== "" && !options.orphanToo && !stateExists(owner)) return;
  throw new DockerError(
    `Container '${name}' belongs to ${
      owner === "" ? "no waffle sandbox" : `the sandbox state '${owner}'`
    }, not '${root}' (the same tenant and user under another WAFFLE_HOME?); refusing to replace it`,
  );
}

// Starts the container and waits for its runner; returns the pid of its
// init process (asked while the runner boots). A runner that stops during
// start is given a second start; then its directory, which may hold names it
// cannot use (a compromised runner's leftovers), is replaced for a third.
async function startReady(
  docker: DockerClient,
  id: string,
  options: EnsureOptions & { before: string | undefined },
): Promise<number> {
  const ready = { queue: options.queue, before: options.before, timeoutMs: options.readyTimeoutMs };
  for (let attempt = 1;; attempt++) {
    await docker.startContainer(id);
    mark("container started");
    const pid = pidOf(docker, id).catch(() => 0);
    try {
      await waitReady(docker, id, ready);
      // A runner booted on today's outbound/ beats in it: no restart is owed,
      // and no container runs on a set-aside tree any more.
      outboundMounted(options.paths);
      removeSetAsideTrees(options.paths);
      mark("runner ready");
      return await pid;
    } catch (error) {
      if (!(error instanceof RunnerError) || attempt === 3) throw error;
    }
    await docker.killContainer(id).catch(() => {});
    await docker.waitContainer(id, { timeoutMs: 10_000 }).catch(() => {});
    if (attempt === 2) resetOutbound(options.paths);
  }
}

/** How long a start waits on a queue file the host cannot read before giving up. */
const DAMAGED_GRACE_MS = 2000;

// Waits for a fresh heartbeat from a runner booted after `before` (any
// runner when `before` is undefined).
async function waitReady(
  docker: DockerClient,
  id: string,
  options: { queue: Queue; before: string | undefined; timeoutMs: number | undefined },
): Promise<void> {
  const deadline = Date.now() + (options.timeoutMs ?? 20_000);
  let checks = 0;
  let damagedSince: number | undefined;
  while (Date.now() < deadline) {
    const judged = options.queue.liveness();
    // Ready: a valid beat from a runner booted after `before` that the host judges alive.
    if (
      judged.state === "alive" && judged.beat !== undefined &&
      judged.beat.bootId !== options.before
    ) return;
    // A file the host cannot read (too big, not waffle's schema) never shows
    // a heartbeat: after a moment for the runner to set it aside itself, give
    // up on this start, so the next attempt (the third replaces outbound/)
    // comes in seconds, not after the whole timeout each.
    if (judged.state !== "damaged") damagedSince = undefined;
    else if (Date.now() - (damagedSince ??= Date.now()) > DAMAGED_GRACE_MS) {
      throw new RunnerError(`Runner in container '${id.slice(0, 12)}': ${judged.detail}`);
    }
    if (++checks % 25 === 0) {
      const state = await docker.inspectContainer(id);
      if (state === null || !state.State.Running) {
        throw new RunnerError(
          `Runner container '${id.slice(0, 12)}' stopped during start (exit code ${
            state?.State.ExitCode ?? "unknown"
          }${state?.State.Error ? `: ${state.State.Error}` : ""}); see 'docker logs ${
            id.slice(0, 12)
          }'`,
        );
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new RunnerError(
    `Runner in container '${id.slice(0, 12)}' sent no heartbeat within ${
      Math.round((options.timeoutMs ?? 20_000) / 1000)
    } s`,
  );
}

// A recycle lets commands other hosts wait for finish, within a bound: the
// runner's count of what is in flight is the sandbox's word, so it can delay
// a recycle by at most the grace, never block it.
async function drain(queue: Queue, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline && queue.liveness().state === "alive") {
    if (queue.inFlight({ sessions: false }).length === 0) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
