/**
 * Fork: new sandboxes whose workspace is a copy of one sandbox's at one
 * instant, while the source keeps running.
 *
 * - Under the source's lock, its container's processes are frozen (Docker's
 *   pause, the cgroup freezer: a task parked in a write into the volume
 *   leaves the system call, so nothing holds the superblock), then its volume
 *   is frozen (`fsfreeze`) while the image is copied sparse and reflink-aware
 *   (`copyFrozenImage`, as a snapshot's save), then thawed and unpaused. The
 *   source's processes go on where they were: none is stopped or restarted.
 *   A sandbox that was paused already stays paused.
 * - The copy is made once, as the first target's image (under a work name
 *   in its state root); the other targets get copies of it (reflinked where
 *   the filesystem can), outside the source's lock.
 * - Each target, under its own lock, gets the copy as its `volume.img`
 *   (linked in: never over an image that appeared meanwhile), its volume
 *   mounted and everything on it but `workspace/` set aside (the source's
 *   `outbound/` with its results, its spare, leftovers): the target's
 *   `outbound/` is a fresh, empty one, its inbound queue is its own, and its
 *   container, quota and egress identity are its own, made by its `ensure`.
 *
 * Running processes are not forked: a target starts with the source's files
 * and nothing running. A target that already exists (its volume or its
 * container) is refused before anything is done; a target that fails later
 * is removed again with every other one of the same call.
 *
 * @module
 */
import type { SandboxConfig } from "../config/config.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";
import type { DockerClient } from "../docker/client.ts";
import { QueueError, UsageError } from "../errors.ts";
import { lexists } from "../fs.ts";
import { dirname, join } from "../path.ts";
import { messageOf } from "../queue/connection.ts";
import { ownedBy } from "./ensure.ts";
import type { Ensured } from "./ensure.ts";
import type { StatePaths } from "./identity.ts";
import { withLock } from "./lock.ts";
import { readPause, writePause } from "./pause_record.ts";
import { ensureVolume, removeVolume } from "./quota.ts";
import { healAndPrepare, requireSupport, who } from "./snapshot.ts";
import { copyFrozenImage, copyImage, SNAPSHOT_COPY_TIMEOUT_MS } from "./snapshot_copy.ts";
import { prepareState, purgeState, removeSetAsideTrees } from "./state_dir.ts";
import { writeWarm } from "./warm.ts";
import { mark } from "../trace.ts";

/** At most this many targets per fork (E2B allows up to 100). */
export const MAX_FORK_TARGETS = 100;

/** What a fork uses of its source: `openSandbox`'s result is one. */
export interface ForkSource {
  /** Whose sandbox, and its container name. */
  readonly key: SandboxKey;
  /** Its state directories. */
  readonly paths: StatePaths;
  /** Its settings (the disk quota). */
  readonly config: SandboxConfig;
}

/** What a fork uses of a target: a sandbox opened for the new user (`openSandbox`). */
export interface ForkTarget extends ForkSource {
  /** What its last ensure did. */
  readonly lastEnsure: Ensured | undefined;
  /** Creates and starts its container (the sandbox's `ensure`). */
  ensure(): Promise<void | false>;
}

/** Options of {@linkcode forkSandbox}. */
export interface ForkOptions {
  /** Docker client; default from `DOCKER_HOST`. */
  docker?: DockerClient;
  /**
   * Start each target's container (its runner beating) before returning.
   * Default false: as an opened sandbox, a target starts on its first
   * command (about half a second of a fork's time otherwise).
   */
  start?: boolean;
  /**
   * Removes a target a failed fork made (container, volume, state); default:
   * its container, volume and state root. `removeSandbox(…, { purge: true })`
   * also forgets its egress identity.
   */
  discard?: (target: ForkTarget) => Promise<void>;
}

/** One sandbox a fork made. */
export interface ForkedSandbox {
  /** Its user id. */
  user: string;
  /** Its container, once started. */
  containerId: string | undefined;
}

/** What {@linkcode forkSandbox} did. */
export interface ForkResult {
  /** The source's user id. */
  source: string;
  /** The new sandboxes, in the order asked. */
  targets: ForkedSandbox[];
  /** The instant the copy was taken (ISO 8601, UTC). */
  forkedAt: string;
  /** How long the source's processes and volume were frozen, in ms. */
  frozenMs: number;
  /** How long the whole fork took, in ms (the targets' starts included). */
  forkMs: number;
  /** Always false: files are forked, running processes are not. */
  processesForked: false;
}

/**
 * Forks a sandbox: each target gets a copy of the source's workspace taken
 * at one instant, and its own queue, container, quota and egress.
 *
 * @param source The sandbox to copy (from `openSandbox`); it keeps running.
 * @param targets Sandboxes opened for the new users (from `openSandbox`), none existing yet.
 * @param options Docker client, whether to start the targets, how to discard a failed one.
 * @returns The targets and timings.
 * @throws {UsageError} When the source has no volume, a target already
 *   exists or is named twice or is the source, too many targets, or the host
 *   cannot copy a volume. Nothing is made then.
 * @throws {QueueError} When the copy or a target's setup fails (every target
 *   is removed again).
 *
 * @example
 * ```ts ignore
 * const source = openSandbox("alice");
 * const forked = await forkSandbox(source, [
 *   openSandbox("alice-1", { fromPool: false }),
 *   openSandbox("alice-2", { fromPool: false }),
 * ]);
 * console.log(`forked in ${forked.forkMs} ms, source frozen ${forked.frozenMs} ms`);
 * ```
 */
export async function forkSandbox(
  source: ForkSource,
  targets: readonly ForkTarget[],
  options: ForkOptions = {},
): Promise<ForkResult> {
  const started = Date.now();
  requireSupport();
  checkTargets(source, targets);
  const docker = options.docker ?? new (await import("../docker/client.ts")).DockerClient();
  if (!lexists(join(source.paths.root, "volume.img"))) {
    throw new UsageError(`No sandbox for ${who(source)} to fork`);
  }
  for (const target of targets) {
    if (await sandboxExists(docker, target)) {
      throw new UsageError(`Cannot fork to ${who(target)}: that sandbox exists already`);
    }
  }
  mark("fork: targets checked");
  const [first, ...rest] = targets;
  const staged = join(first!.paths.root, `volume.img.fork-${crypto.randomUUID().slice(0, 8)}`);
  const made: ForkTarget[] = [];
  try {
    const { frozenMs, forkedAt } = await withLock(
      source.paths.lock,
      () => copySource(source, { docker, target: staged }),
    );
    mark("fork: source copied");
    for (const target of rest) await install(target, { from: staged, link: false, docker, made });
    await install(first!, { from: staged, link: true, docker, made });
    mark("fork: targets installed");
    if (options.start === true) { for (const target of targets) await target.ensure(); }
    return {
      source: source.key.user,
      targets: targets.map((t) => ({ user: t.key.user, containerId: t.lastEnsure?.containerId })),
      forkedAt,
      frozenMs,
      forkMs: Date.now() - started,
      processesForked: false,
    };
  } catch (error) {
    for (const target of made) {
      await (options.discard ?? ((t) => discardTarget(docker, t)))(target).catch(() => {});
    }
    throw error;
  } finally {
    await Deno.remove(staged).catch(() => {});
  }
}

/**
 * Whether a sandbox exists: it has a volume image, files on its volume
 * directory, or a container of this home. A sandbox only opened (its queue
 * made, nothing ensured) does not.
 *
 * @param docker The Docker client.
 * @param sandbox Its key and paths.
 * @returns True when it does.
 */
export async function sandboxExists(
  docker: DockerClient,
  sandbox: Pick<ForkSource, "key" | "paths">,
): Promise<boolean> {
  if (lexists(join(sandbox.paths.root, "volume.img"))) return true;
  try {
    for (const _ of Deno.readDirSync(sandbox.paths.volume)) return true;
  } catch {
    // No volume directory.
  }
  const container = await docker.inspectContainer(sandbox.key.containerName);
  return container !== null && ownedBy(container, sandbox.paths.root);
}

function checkTargets(source: ForkSource, targets: readonly ForkTarget[]): void {
  if (targets.length === 0) throw new UsageError("Nothing to fork to: name at least one target");
  if (targets.length > MAX_FORK_TARGETS) {
    throw new UsageError(
      `Cannot fork to ${targets.length} sandboxes at once: at most ${MAX_FORK_TARGETS}`,
    );
  }
  const seen = new Set<string>([source.paths.root]);
  for (const target of targets) {
    if (target.config.home !== source.config.home) {
      throw new UsageError(`Cannot fork to ${who(target)}: it is in another waffle home`);
    }
    if (seen.has(target.paths.root)) {
      throw new UsageError(
        target.paths.root === source.paths.root
          ? `Cannot fork ${who(source)} to itself`
          : `Cannot fork to ${who(target)} twice`,
      );
    }
    seen.add(target.paths.root);
  }
}

/**
 * Copies a sandbox's volume image at one instant, its processes kept
 * running (frozen for the copy only), as {@linkcode forkSandbox} does: the
 * image a snapshot of `waffle serve` keeps. Takes the sandbox's lock.
 *
 * @param source The sandbox.
 * @param target A new file (in a directory only the host writes).
 * @param options The Docker client.
 * @returns How long the sandbox was frozen, and the instant of the copy.
 * @throws {UsageError} When the sandbox has no volume, or the host cannot copy one.
 * @throws {QueueError} When the copy fails (nothing is left at `target`).
 */
export async function captureImage(
  source: ForkSource,
  target: string,
  options: { docker?: DockerClient } = {},
): Promise<{ frozenMs: number; forkedAt: string }> {
  requireSupport();
  if (!lexists(join(source.paths.root, "volume.img"))) {
    throw new UsageError(`No sandbox for ${who(source)} to copy`);
  }
  const docker = options.docker ?? new (await import("../docker/client.ts")).DockerClient();
  try {
    return await withLock(source.paths.lock, () => copySource(source, { docker, target }));
  } catch (error) {
    await Deno.remove(target).catch(() => {});
    throw error;
  }
}

/**
 * Makes a new sandbox from a volume image ({@linkcode captureImage}'s): the
 * image's workspace with a fresh, empty queue, and starts it. A target that
 * exists already is refused; one that fails is discarded.
 *
 * @param target A sandbox opened for the new user (`openSandbox(user, { fromPool: false })`), not existing yet.
 * @param image The image (copied, never changed).
 * @param options Docker client, whether to start it, how to discard it.
 * @throws {UsageError} When the target exists already.
 * @throws {QueueError} When the copy, the mount or the start fails (the target is discarded).
 */
export async function sandboxFromImage(
  target: ForkTarget,
  image: string,
  options: ForkOptions = {},
): Promise<void> {
  requireSupport();
  const docker = options.docker ?? new (await import("../docker/client.ts")).DockerClient();
  const made: ForkTarget[] = [];
  try {
    await install(target, { from: image, link: false, docker, made });
    if (options.start ?? true) await target.ensure();
  } catch (error) {
    for (const t of made) {
      await (options.discard ?? ((x) => discardTarget(docker, x)))(t).catch(() => {});
    }
    throw error;
  }
}

// Under the source's lock: its processes frozen (the cgroup freezer), then
// its volume (fsfreeze) while the image is copied; thawed, then unpaused.
async function copySource(
  source: ForkSource,
  options: { docker: DockerClient; target: string },
): Promise<{ frozenMs: number; forkedAt: string }> {
  const { docker } = options;
  const volume = await healAndPrepare(source);
  const found = await docker.inspectContainer(source.key.containerName);
  const container = found !== null && ownedBy(found, source.paths.root) ? found : null;
  const freeze = container !== null && container.State.Running && !container.State.Paused;
  const started = Date.now();
  if (freeze) {
    // As a pause: recorded first (a host waiting on a request judges the
    // frozen runner by the record, never kills it), and no warm path leads
    // into a frozen sandbox.
    writePause(source.paths.root, { state: "paused", at: started });
    writeWarm(source.paths.root, undefined);
    await docker.pauseContainer(container.Id);
  }
  try {
    await copyFrozenImage({
      mountPoint: volume.mountPoint,
      image: join(dirname(volume.mountPoint), "volume.img"),
      target: options.target,
      timeoutMs: SNAPSHOT_COPY_TIMEOUT_MS,
    });
  } finally {
    if (freeze) {
      await docker.unpauseContainer(container.Id).catch(() => {});
      if (readPause(source.paths.root)?.state === "paused") {
        writePause(source.paths.root, { state: "resumed", at: Date.now() });
      }
    }
  }
  return { frozenMs: Date.now() - started, forkedAt: new Date(started).toISOString() };
}

// Under the target's lock: the copy becomes its volume, everything on the
// volume but the workspace is set aside, and its state is made around it.
async function install(
  target: ForkTarget,
  options: { from: string; link: boolean; docker: DockerClient; made: ForkTarget[] },
): Promise<void> {
  const { paths, config } = target;
  await withLock(paths.lock, async () => {
    // Made meanwhile by another call: refused, and never discarded.
    if (await sandboxExists(options.docker, target)) {
      throw new UsageError(`Cannot fork to ${who(target)}: that sandbox exists already`);
    }
    options.made.push(target);
    Deno.mkdirSync(paths.root, { recursive: true, mode: 0o700 });
    const image = join(paths.root, "volume.img");
    try {
      if (options.link) {
        Deno.linkSync(options.from, image); // never over an image made meanwhile
      } else {
        await copyImage(options.from, image);
      }
    } catch (cause) {
      if (cause instanceof QueueError) throw cause;
      throw new QueueError(`Cannot copy the volume of ${who(target)}: ${messageOf(cause)}`, {
        cause,
      });
    }
    mark("fork: image in place");
    const volume = await ensureVolume(paths.root, { bytes: config.quotaBytes });
    mark("fork: volume mounted");
    if (!volume.enforced) {
      throw new QueueError(
        `Cannot mount the forked volume of ${who(target)}: ${volume.reason ?? "no quota"}`,
      );
    }
    setAsideAllButWorkspace(volume.mountPoint);
    await prepareState(paths, { quotaBytes: config.quotaBytes });
    removeSetAsideTrees(paths);
  });
}

// Everything on a forked volume but `workspace/` and `lost+found/` is the
// source's (its outbound/ with its results, its spare, leftovers): renamed
// aside under the names the state's clean-up removes in the background.
function setAsideAllButWorkspace(volume: string): void {
  for (const entry of [...Deno.readDirSync(volume)]) {
    if (entry.name === "workspace" || entry.name === "lost+found") continue;
    const aside = `outbound.damaged-${Date.now()}-${crypto.randomUUID().slice(0, 8)}`;
    Deno.renameSync(join(volume, entry.name), join(volume, aside));
  }
}

// The default discard: the target's container, volume and state root.
async function discardTarget(docker: DockerClient, target: ForkTarget): Promise<void> {
  await withLock(target.paths.lock, async () => {
    const container = await docker.inspectContainer(target.key.containerName);
    if (container !== null && ownedBy(container, target.paths.root)) {
      await docker.removeContainer(container.Id, { force: true });
    }
    await removeVolume(target.paths.root);
    await purgeState(target.paths);
  });
}
