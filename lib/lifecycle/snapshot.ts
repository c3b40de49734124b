/**
 * Snapshots of a sandbox's workspace: save, restore, list, remove.
 *
 * What a snapshot holds: the sandbox's volume image as it was at one
 * instant (see `snapshot_store.ts` for where it lives), of which a restore
 * brings back the `workspace/` tree only. The queue is never rolled back: the
 * host's `inbound.db` lives outside the volume, and the runner's `outbound/`
 * on the volume is left as it is by a restore, so no request runs twice and
 * no result is lost.
 *
 * - Save: under the sandbox's lock, once no request runs (refused, or waited
 *   for with `waitMs`), the volume is frozen (`fsfreeze`) while its image is
 *   copied sparse and reflink-aware: nothing writes meanwhile, not even a
 *   process a command left running. The copy is made under a work name and
 *   published by one rename (or one atomic exchange with `force`).
 * - Restore: under the lock, once no request runs, the container is stopped
 *   (it mounts the workspace directory itself, and whatever a command left
 *   running ends); the snapshot's workspace is copied from its image mounted
 *   read-only (nosuid, nodev, noexec, in a child's private mount namespace)
 *   into a fresh directory on the volume, which is then swapped with the
 *   current workspace in one `renameat2(RENAME_EXCHANGE)`: a host killed at
 *   any point leaves the old workspace or the new one, never a mix. The old
 *   tree is removed in the background; the container (same name, same id,
 *   same queue) is started again when it was running.
 *
 * Needs the disk-quota volume (root and loop devices, see `quota.ts`),
 * `fsfreeze`, `unshare`, `mount`, GNU `cp` and `timeout`, and FFI for
 * `renameat2`.
 *
 * @module
 */
import type { DockerClient } from "../docker/client.ts";
import type { ContainerInspect } from "../docker/mod.ts";
import { QueueError, UsageError } from "../errors.ts";
import { dirname, join } from "../path.ts";
import type { Queue } from "../queue/queue.ts";
import { openDatabase } from "../queue/connection.ts";
import { OPEN_REQUEST } from "../queue/open_requests.ts";
import { ownedBy } from "./ensure.ts";
import { withLock } from "./lock.ts";
import { LABELS } from "./posture.ts";
import { quotaSupport, type VolumeStatus } from "./quota.ts";
import { removeTree } from "./remove_tree.ts";
import type { SandboxConfig } from "../config/config.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";
import type { Ensured } from "./ensure.ts";
import type { StatePaths } from "./identity.ts";
import {
  copyFrozenImage,
  copyWorkspaceOut,
  exchangePaths,
  killPoint,
  missingProgram,
  thawVolume,
} from "./snapshot_copy.ts";
import {
  checkSnapshotName,
  deleteSnapshotDir,
  ensureStore,
  IMAGE_FILE,
  readSnapshot,
  readSnapshots,
  removeStoreLeftovers,
  type SnapshotInfo,
  storeDir,
  workName,
  writeMeta,
} from "./snapshot_store.ts";
import { prepareState } from "./state_dir.ts";
import { writeWarm } from "./warm.ts";

export type { SnapshotInfo } from "./snapshot_store.ts";

/** Options of {@linkcode saveSnapshot}. */
export interface SaveSnapshotOptions {
  /** Replace a snapshot of the same name (atomically). Default: refuse. */
  force?: boolean;
  /** Wait this long for running requests to end; default 0: refuse while one runs. */
  waitMs?: number;
  /** Docker client; default from `DOCKER_HOST`. */
  docker?: DockerClient;
}

/** Options of {@linkcode restoreSnapshot}. */
export interface RestoreSnapshotOptions {
  /** Wait this long for running requests to end; default 0: refuse while one runs. */
  waitMs?: number;
  /** Docker client; default from `DOCKER_HOST`. */
  docker?: DockerClient;
}

/** What {@linkcode restoreSnapshot} did. */
export interface RestoredSnapshot {
  /** The snapshot restored. */
  snapshot: SnapshotInfo;
  /** How long the restore took, in ms (the container's restart included). */
  restoreMs: number;
  /** The sandbox's container (the same one as before), when there is one. */
  containerId: string | undefined;
  /** Whether the container was running and was started again. */
  restarted: boolean;
}

/**
 * What the snapshot functions use of a sandbox: `openSandbox`'s result is
 * one (they act under its lock, on its state and container).
 */
export interface SnapshotSandbox {
  /** Whose sandbox, and its container name. */
  readonly key: SandboxKey;
  /** The sandbox's state directories on the host. */
  readonly paths: StatePaths;
  /** Its settings (`max_snapshots`, `snapshot_bytes`). */
  readonly config: SandboxConfig;
  /** Its queue: whether a request still runs. */
  readonly queue: Queue;
  /** What the last ensure did (undefined before the first). */
  readonly lastEnsure: Ensured | undefined;
  /** Creates, adopts or starts its container (the sandbox's `ensure`). */
  ensure(): Promise<void | false>;
}

/**
 * Saves the workspace of a sandbox as snapshot `name`.
 *
 * @param sandbox The sandbox (from `openSandbox`).
 * @param name The snapshot's name: 1-64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit.
 * @param options `force` to replace one of the same name; `waitMs` to wait for running requests.
 * @returns The snapshot.
 * @throws {UsageError} On a bad name, an existing name without `force`, a
 *   limit reached (`max_snapshots`, `snapshot_bytes`), requests still
 *   running, or a host without the disk-quota volume.
 * @throws {QueueError} When the copy fails (nothing is published then).
 *
 * @example
 * ```ts ignore
 * const sandbox = openSandbox("alice");
 * const snapshot = await saveSnapshot(sandbox, "before-migration");
 * console.log(`${snapshot.bytes} bytes in ${snapshot.saveMs} ms`);
 * ```
 */
export async function saveSnapshot(
  sandbox: SnapshotSandbox,
  name: string,
  options: SaveSnapshotOptions = {},
): Promise<SnapshotInfo> {
  checkSnapshotName(name);
  requireSupport();
  const { paths } = sandbox;
  const docker = options.docker ?? new (await import("../docker/client.ts")).DockerClient();
  const stop = { wasRunning: false };
  try {
    return await withLock(
      paths.lock,
      () => saveLocked(sandbox, name, { ...options, docker, stop }),
    );
  } finally {
    // Started again as it was, also after a failure.
    if (stop.wasRunning) await sandbox.ensure();
  }
}

// The save itself, under the sandbox's lock. The container is stopped first:
// a process a command left behind (one parked in a splice into the volume)
// could otherwise hold fsfreeze forever, and the lock with it.
async function saveLocked(
  sandbox: SnapshotSandbox,
  name: string,
  options: SaveSnapshotOptions & { docker: DockerClient; stop: { wasRunning: boolean } },
): Promise<SnapshotInfo> {
  const { paths } = sandbox;
  const volume = await healAndPrepare(sandbox);
  const store = ensureStore(paths.root);
  const existing = readSnapshot(paths.root, name);
  if (existing !== undefined && !options.force) {
    throw new UsageError(
      `Snapshot '${name}' of ${who(sandbox)} already exists: pass --force to replace it`,
    );
  }
  const image = join(dirname(volume.mountPoint), "volume.img");
  checkLimits(sandbox, existing, allocated(image));
  await untilIdle(sandbox, { what: `save snapshot '${name}'`, waitMs: options.waitMs ?? 0 });
  await stopForCopy(sandbox, options);
  const work = join(store, workName("saving"));
  Deno.mkdirSync(work, { mode: 0o700 });
  let published = false;
  let exchanged = false;
  try {
    const started = Date.now();
    await copyFrozenImage({
      mountPoint: volume.mountPoint,
      image,
      target: join(work, IMAGE_FILE),
    });
    const saveMs = Date.now() - started;
    const createdAt = new Date(started).toISOString();
    writeMeta(work, { name, createdAt, volumeBytes: Deno.statSync(image).size, saveMs });
    killPoint("saved");
    exchanged = publish(work, join(store, name));
    published = true;
  } finally {
    // Unpublished: the partial copy. Published over an old one: the old one.
    if (!published || exchanged) await deleteSnapshotDir(work).catch(() => {});
  }
  return readSnapshot(paths.root, name)!;
}

/**
 * Restores the workspace of a sandbox from snapshot `name`, keeping the
 * sandbox's identity (container, queue) and its `outbound/` as they are.
 *
 * @param sandbox The sandbox (from `openSandbox`).
 * @param name The snapshot's name.
 * @param options `waitMs` to wait for running requests; the Docker client.
 * @returns The snapshot, how long it took and the container.
 * @throws {UsageError} On a bad or unknown name, requests still running, or
 *   a host without the disk-quota volume.
 * @throws {QueueError} When the copy or the swap fails (the workspace is
 *   then the one from before).
 *
 * @example
 * ```ts ignore
 * await restoreSnapshot(openSandbox("alice"), "before-migration", { waitMs: 60_000 });
 * ```
 */
export async function restoreSnapshot(
  sandbox: SnapshotSandbox,
  name: string,
  options: RestoreSnapshotOptions = {},
): Promise<RestoredSnapshot> {
  checkSnapshotName(name);
  requireSupport();
  const started = Date.now();
  const docker = options.docker ?? new (await import("../docker/client.ts")).DockerClient();
  // Set once the container is stopped: it is started again, also after a failure.
  const stop = { wasRunning: false };
  let done: { snapshot: SnapshotInfo; containerId: string | undefined };
  try {
    done = await withLock(
      sandbox.paths.lock,
      () => restoreLocked(sandbox, name, { docker, waitMs: options.waitMs ?? 0, stop }),
    );
  } catch (error) {
    // The same container on the old workspace: the swap never happened.
    if (stop.wasRunning) await sandbox.ensure().catch(() => {});
    throw error;
  }
  // The same container (name, id, queue) on the restored workspace.
  if (stop.wasRunning) await sandbox.ensure();
  return {
    snapshot: done.snapshot,
    restoreMs: Date.now() - started,
    containerId: sandbox.lastEnsure?.containerId ?? done.containerId,
    restarted: stop.wasRunning,
  };
}

// The restore itself, under the sandbox's lock (see the module doc).
async function restoreLocked(
  sandbox: SnapshotSandbox,
  name: string,
  options: { docker: DockerClient; waitMs: number; stop: { wasRunning: boolean } },
): Promise<{ snapshot: SnapshotInfo; containerId: string | undefined }> {
  const { paths } = sandbox;
  const { docker } = options;
  const volume = await healAndPrepare(sandbox);
  const snapshot = readSnapshot(paths.root, name);
  if (snapshot === undefined) throw new UsageError(`No snapshot '${name}' of ${who(sandbox)}`);
  await untilIdle(sandbox, { what: `restore snapshot '${name}'`, waitMs: options.waitMs, docker });
  const container = await stopForCopy(sandbox, options);
  killPoint("stopped");
  const tree = join(volume.mountPoint, workName("restore"));
  const mountDir = join(storeDir(paths.root), workName("mount"));
  Deno.mkdirSync(mountDir, { mode: 0o700 });
  try {
    await copyWorkspaceOut({
      image: join(storeDir(paths.root), name, IMAGE_FILE),
      mountDir,
      target: tree,
    });
    killPoint("copied");
    // Nothing may have started it meanwhile (every start takes this lock).
    if (container !== null) await stopped(docker, container.Id);
    exchangePaths(tree, join(volume.mountPoint, "workspace"));
    killPoint("exchanged");
  } finally {
    // Before the swap: a partial copy; after it: the old workspace.
    removeTree(tree, { background: true }).catch(() => false);
    try {
      Deno.removeSync(mountDir); // empty: the mount lived in the child's namespace only
    } catch {
      // Left for the next call's clean-up.
    }
  }
  return { snapshot, containerId: container?.Id };
}

/**
 * Lists a sandbox's snapshots, oldest first.
 *
 * @param sandbox The sandbox.
 * @returns Its snapshots.
 *
 * @example
 * ```ts ignore
 * for (const s of await listSnapshots(openSandbox("alice"))) console.log(s.name, s.bytes);
 * ```
 */
export function listSnapshots(sandbox: SnapshotSandbox): Promise<SnapshotInfo[]> {
  return Promise.resolve(readSnapshots(sandbox.paths.root));
}

/**
 * Removes snapshot `name` of a sandbox.
 *
 * @param sandbox The sandbox.
 * @param name The snapshot's name.
 * @returns The snapshot removed.
 * @throws {UsageError} On a bad or unknown name.
 * @throws {QueueError} When it cannot be removed entirely (it is unpublished
 *   first: what is left goes with a later call).
 *
 * @example
 * ```ts ignore
 * await removeSnapshot(openSandbox("alice"), "before-migration");
 * ```
 */
export async function removeSnapshot(
  sandbox: SnapshotSandbox,
  name: string,
): Promise<SnapshotInfo> {
  checkSnapshotName(name);
  const { paths } = sandbox;
  return await withLock(paths.lock, async () => {
    await removeStoreLeftovers(paths.root);
    const snapshot = readSnapshot(paths.root, name);
    if (snapshot === undefined) throw new UsageError(`No snapshot '${name}' of ${who(sandbox)}`);
    const aside = join(storeDir(paths.root), workName("removing"));
    Deno.renameSync(join(storeDir(paths.root), name), aside);
    await deleteSnapshotDir(aside);
    return snapshot;
  });
}

/**
 * Names a sandbox's owner for a message.
 *
 * @param sandbox The sandbox.
 * @returns `user 'U'`, or `user 'U' of tenant 'T'` outside the default tenant.
 */
export function who(sandbox: Pick<SnapshotSandbox, "key">): string {
  const { tenant, user } = sandbox.key;
  return tenant === "default" ? `user '${user}'` : `user '${user}' of tenant '${tenant}'`;
}

/**
 * Refuses, with a one-line reason, on a host that cannot copy a volume
 * (no disk-quota volume, a program missing).
 *
 * @throws {UsageError} Saying what is missing.
 */
export function requireSupport(): void {
  const support = quotaSupport();
  if (!support.supported) {
    throw new UsageError(
      `Snapshots need the sandbox's disk-quota volume, which this host cannot mount: ${support.reason}`,
    );
  }
  const missing = missingProgram();
  if (missing !== undefined) {
    throw new UsageError(`Snapshots need the program '${missing}', which is not installed`);
  }
}

/**
 * Undoes what a killed call left (a frozen volume, work directories, a
 * half-copied or swapped-out workspace), then mounts the volume if needed.
 * Callers hold the sandbox's lock.
 *
 * @param sandbox The sandbox.
 * @returns Its mounted volume.
 * @throws {UsageError} When its disk quota is not enforced (no volume to copy).
 */
export async function healAndPrepare(
  sandbox: Pick<SnapshotSandbox, "key" | "paths" | "config">,
): Promise<VolumeStatus> {
  const { paths, config } = sandbox;
  const real = Deno.realPathSync(paths.root);
  // First: a frozen volume would block the preparation's own writes.
  await thawVolume(join(real, "volume"), join(real, "volume.img"));
  await removeStoreLeftovers(paths.root);
  const volume = await prepareState(paths, { quotaBytes: config.quotaBytes });
  if (!volume.enforced) {
    throw new UsageError(
      `Snapshots need the sandbox's disk-quota volume, and ${who(sandbox)} has none: ${
        volume.reason ?? "quotas are not enforced"
      }`,
    );
  }
  for (const entry of Deno.readDirSync(volume.mountPoint)) {
    if (/^\.restore-[0-9a-f]{8}$/.test(entry.name)) {
      removeTree(join(volume.mountPoint, entry.name), { background: true }).catch(() => false);
    }
  }
  return volume;
}

function allocated(path: string): number {
  return (Deno.statSync(path).blocks ?? 0) * 512;
}

function checkLimits(
  sandbox: SnapshotSandbox,
  replacing: SnapshotInfo | undefined,
  estimate: number,
): void {
  const { maxSnapshots, snapshotBytes } = sandbox.config;
  const kept = readSnapshots(sandbox.paths.root).filter((s) => s.name !== replacing?.name);
  if (kept.length >= maxSnapshots) {
    throw new UsageError(
      `Snapshot limit reached: ${
        who(sandbox)
      } has ${kept.length} of the ${maxSnapshots} snapshots [sandbox] max_snapshots allows; remove one with 'waffle snapshot rm'`,
    );
  }
  const total = kept.reduce((sum, s) => sum + s.bytes, 0) + estimate;
  if (snapshotBytes > 0 && total > snapshotBytes) {
    throw new UsageError(
      `Snapshot limit reached: the snapshots of ${
        who(sandbox)
      } would take ${total} bytes, over the ${snapshotBytes} of [sandbox] snapshot_bytes`,
    );
  }
}

// Publishes a finished save under its name: a rename, or (over an old one)
// an atomic exchange that leaves the old one under the work name (then true).
function publish(work: string, final: string): boolean {
  try {
    Deno.lstatSync(final);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
    Deno.renameSync(work, final);
    return false;
  }
  exchangePaths(work, final);
  return true;
}

// Stops the sandbox's container (recording whether it ran) so that nothing
// writes the volume while it is copied; no warm path leads into it meanwhile.
async function stopForCopy(
  sandbox: SnapshotSandbox,
  options: { docker: DockerClient; stop: { wasRunning: boolean } },
): Promise<ContainerInspect | null> {
  const found = await options.docker.inspectContainer(sandbox.key.containerName);
  const container = found !== null && ownedBy(found, sandbox.paths.root) ? found : null;
  writeWarm(sandbox.paths.root, undefined);
  options.stop.wasRunning = container?.State.Running === true;
  if (container !== null) await stopped(options.docker, container.Id);
  return container;
}

// Stops a container and makes sure it is not running.
async function stopped(docker: DockerClient, id: string): Promise<void> {
  const state = await docker.inspectContainer(id);
  if (state === null || !state.State.Running) return;
  await docker.stopContainer(id, { timeoutSeconds: 10 });
  if ((await docker.inspectContainer(id))?.State.Running) {
    await docker.killContainer(id).catch(() => {});
    await docker.waitContainer(id, { timeoutMs: 10_000 }).catch(() => {});
  }
  if ((await docker.inspectContainer(id))?.State.Running) {
    throw new QueueError(`Container '${id.slice(0, 12)}' does not stop`);
  }
}

/** How often a waiting save or restore looks at the queue again. */
const IDLE_POLL_MS = 100;

async function untilIdle(
  sandbox: SnapshotSandbox,
  options: { what: string; waitMs: number; docker?: DockerClient },
): Promise<void> {
  const deadline = Date.now() + options.waitMs;
  for (;;) {
    const busy = await busyWith(sandbox, options.docker);
    if (busy === undefined) return;
    if (Date.now() >= deadline) {
      throw new UsageError(
        options.waitMs > 0
          ? `Cannot ${options.what}: after waiting ${options.waitMs / 1000} s, ${busy}`
          : `Cannot ${options.what}: ${busy}; pass --wait to wait for them`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, IDLE_POLL_MS));
  }
}

// What keeps a save (requests) or a restore (also restricted sessions, which
// mount the workspace themselves) from going ahead, or undefined.
async function busyWith(
  sandbox: SnapshotSandbox,
  docker?: DockerClient,
): Promise<string | undefined> {
  const running = runningRequests(sandbox.queue);
  if (running.length > 0) {
    const count = running.length === 1 ? "1 request is" : `${running.length} requests are`;
    return `${count} running in the sandbox of ${who(sandbox)} (first '${running[0]}')`;
  }
  if (docker === undefined) return undefined;
  const sessions = (await docker.listContainers({
    labels: [`${LABELS.restricted}=${sandbox.key.hash}`],
  })).filter((c) => c.Labels[LABELS.state] === sandbox.paths.root);
  if (sessions.length === 0) return undefined;
  const count = sessions.length === 1
    ? "1 restricted session reads"
    : `${sessions.length} restricted sessions read`;
  return `${count} the workspace of ${who(sandbox)}`;
}

/** Open requests looked at per check: the newest. */
const OPEN_LOOKED_AT = 256;

/**
 * Requests that run or are about to: open by the host's record and taken by
 * the runner without a result yet, or queued while a live runner would take
 * them. A finished one nobody collected does not count; while the runner's
 * file cannot be read, every open request counts if the runner is alive.
 */
function runningRequests(queue: Queue): string[] {
  const inbound = openDatabase(queue.paths.inbound, { role: "reader" });
  let ids: string[];
  try {
    ids = (inbound.prepare(
      `SELECT id FROM requests r WHERE ${OPEN_REQUEST} ORDER BY seq DESC LIMIT ${OPEN_LOOKED_AT}`,
    ).all() as { id: string }[]).map((row) => row.id);
  } finally {
    inbound.close();
  }
  if (ids.length === 0) return [];
  const alive = queue.liveness().state === "alive";
  return ids.filter((id) => {
    try {
      const { state } = queue.state(id);
      return state === "accepted" || state === "started" || (state === "queued" && alive);
    } catch {
      return alive;
    }
  });
}
