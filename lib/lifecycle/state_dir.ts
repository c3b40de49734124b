/**
 * Per-user host state: `$WAFFLE_HOME/sandboxes/<hash>/`.
 *
 * ```
 * <root>/                 the host's, 0700
 *   queue/inbound/        the host's: inbound.db, inbound.bell (read-only in the sandbox)
 *   volume.img            the disk quota's image (when the host can mount one)
 *   volume/               its mount point (or a plain directory)
 *     outbound/           the runner's: outbound.db, its bell and lock
 *     workspace/          the commands': /workspace
 * ```
 *
 * No directory the host opens a name in is writable by a command: the
 * runner (the container's root) owns `outbound/`, commands (uid 10001) own
 * only `workspace/`, and the host's own `inbound/` is read-only inside. When
 * the host is not root it cannot hand directories to other uids, so
 * `inbound/` and `outbound/` are shared with the runner through the host
 * user's group (which the container's runner is given), never with commands.
 *
 * @module
 */
import { basename, dirname, join } from "../path.ts";
import { lexists } from "../fs.ts";
import { QueueError, UsageError } from "../errors.ts";
import { messageOf } from "../queue/connection.ts";
import { initQueue } from "../queue/schema.ts";
import type { StatePaths } from "./identity.ts";
import { hostCanChown, SANDBOX_UID } from "./posture.ts";
import { ensureVolume, type VolumeStatus } from "./quota.ts";
import { markOutboundReplaced, outboundReplaced } from "./outbound_in_place.ts";
import { removeTree } from "./remove_tree.ts";
import { makeChannelDir, removeChannelDir } from "../queue/channel.ts";
import { writeWarm } from "./warm.ts";
import { errno, libc, O_CLOEXEC, O_DIRECTORY, O_NOFOLLOW, O_RDONLY } from "../libc.ts";

/** Options for {@linkcode prepareState}. */
export interface PrepareStateOptions {
  /** The disk quota of the sandbox's volume, in bytes. */
  quotaBytes: number;
}

/**
 * Creates (or checks) a sandbox's state directory and mounts its volume.
 * Idempotent; callers hold the sandbox's lock.
 *
 * @param paths The sandbox's state paths.
 * @param options The disk quota.
 * @returns The volume's status (whether the quota is enforced).
 * @throws {UsageError} When the host user's uid or primary group is the sandbox's command uid.
 * @throws {QueueError} When the directories cannot be created.
 */
export async function prepareState(
  paths: StatePaths,
  options: PrepareStateOptions,
): Promise<VolumeStatus> {
  if (Deno.uid() === SANDBOX_UID) {
    throw new UsageError(
      `The host user's uid '${SANDBOX_UID}' is the sandbox's command uid: run waffle as another user`,
    );
  }
  // The runner shares the host user's group (its directories are 0750 and
  // 02770): a command whose own gid were that group would share them too.
  if (Deno.uid() !== 0 && Deno.gid() === SANDBOX_UID) {
    throw new UsageError(
      `The host user's group '${SANDBOX_UID}' is the sandbox's command group: run waffle with another primary group`,
    );
  }
  const root = hostCanChown();
  try {
    Deno.mkdirSync(dirname(paths.lock), { recursive: true, mode: 0o700 });
    Deno.mkdirSync(paths.root, { recursive: true, mode: 0o700 });
    Deno.chmodSync(paths.root, 0o700);
    makeChannelDir(paths.channel);
    initQueue(paths.queue, {
      outboundDir: paths.outbound,
      mode: root ? 0o700 : 0o750,
    });
  } catch (cause) {
    if (cause instanceof QueueError) throw cause;
    throw new QueueError(`Cannot create sandbox state '${paths.root}': ${messageOf(cause)}`, {
      cause,
    });
  }
  const volume = await ensureVolume(paths.root, { bytes: options.quotaBytes });
  try {
    // A missing outbound/ (a host killed mid-reset, a hand-made mess) is made
    // anew; the mark first, so a container still running on the old one is
    // restarted before it serves, even if this host dies right here.
    if (!lexists(paths.outbound)) markOutboundReplaced(paths);
    placeOutbound(paths);
    // 0711: the runner (uid 0 without DAC capabilities) walks into it to
    // check a request's working directory; only commands list or write it.
    ownDirectory(
      paths.workspace,
      root ? { mode: 0o711, owner: SANDBOX_UID } : { mode: 0o777 },
    );
  } catch (cause) {
    throw new QueueError(`Cannot create sandbox state '${paths.root}': ${messageOf(cause)}`, {
      cause,
    });
  }
  // While the mark is there a container started before the reset may still
  // run on a set-aside tree: those go once a runner beats in the new one.
  if (!outboundReplaced(paths)) removeSetAsideTrees(paths);
  return volume;
}

// An empty directory kept beside outbound/ on the volume, made while there is
// room: a reset renames it into place instead of making one, so it needs no
// inode on a volume whose every inode a command has taken (mkdir would fail
// with ENOSPC and leave the sandbox without an outbound/). Never mounted, so
// the sandbox cannot have written in it.
function sparePath(paths: StatePaths): string {
  return join(dirname(paths.outbound), "outbound.spare");
}

// Puts an outbound/ in place when it is missing (the spare if there is one),
// sets its mode and owner, then makes a new spare if there is room.
function placeOutbound(paths: StatePaths): void {
  if (!lexists(paths.outbound)) {
    try {
      Deno.renameSync(sparePath(paths), paths.outbound);
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    }
  }
  ownDirectory(paths.outbound, hostCanChown() ? { mode: 0o700 } : { mode: 0o2770 });
  try {
    Deno.mkdirSync(sparePath(paths), { mode: 0o700 });
  } catch {
    // There already, or no room now: the next call makes it.
  }
}

/** Names of the `outbound/` trees a reset set aside, beside it: `outbound.damaged-<ms>[-<random>]`. */
const SET_ASIDE = /^outbound\.damaged-\d+(-[0-9a-f]{8})?$/;

/** How many leftover set-aside trees one call starts removing. */
const LEFTOVERS_PER_CALL = 4;

/** The steps of {@linkcode resetOutbound}, for its test-only kill points. */
export type ResetStep = "invalidated" | "set-aside" | "replaced" | "removing";

/**
 * Tests only: the host kills itself (SIGKILL) right after this step of a
 * reset, to show that a host killed between any two steps leaves a sandbox
 * that the next call heals. Read by the reset alone.
 */
export const RESET_KILL_ENV = "WAFFLE_TEST_KILL_RESET_AT";

/**
 * Replaces a damaged `outbound/` with an empty one, in steps that each leave
 * a sandbox the next call heals, with the workspace kept, wherever the host
 * is killed between two:
 *
 * 1. `warm.json` goes and the replaced mark is made: from here no call takes
 *    the warm path, and a container still running on the old directory is
 *    restarted by the next ensure before it serves;
 * 2. the old directory is renamed aside (its parent is the host's, so no
 *    name in it can be swapped);
 * 3. a new, empty one is made (as {@linkcode prepareState} does for a
 *    missing one, should the host die before);
 * 4. the old one, and any earlier leftover, is removed in the background
 *    within a time bound, in a child process that never follows a link and
 *    never recurses in this one (see `remove_tree.ts`); what a killed host
 *    leaves is removed once a container started on the new one beats.
 *
 * The container should be stopped: it mounts the directory when it starts.
 * Returns once the empty directory is in place (the old one may still be going).
 *
 * @param paths The sandbox's state paths.
 * @throws {QueueError} When the directory cannot be replaced.
 */
export function resetOutbound(paths: StatePaths): void {
  try {
    writeWarm(paths.root, undefined);
    markOutboundReplaced(paths);
  } catch (cause) {
    throw new QueueError(`Cannot reset '${paths.outbound}': ${messageOf(cause)}`, { cause });
  }
  killPoint("invalidated");
  const aside = `${paths.outbound}.damaged-${Date.now()}-${crypto.randomUUID().slice(0, 8)}`;
  try {
    Deno.renameSync(paths.outbound, aside);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) {
      throw new QueueError(`Cannot set aside '${paths.outbound}': ${messageOf(error)}`, {
        cause: error,
      });
    }
  }
  killPoint("set-aside");
  try {
    placeOutbound(paths);
  } catch (cause) {
    if (cause instanceof QueueError) throw cause;
    throw new QueueError(`Cannot create '${paths.outbound}': ${messageOf(cause)}`, { cause });
  }
  killPoint("replaced");
  removeSetAsideTrees(paths);
  killPoint("removing");
}

/** What {@linkcode inspectState} found in a sandbox's state directory. */
export interface StateReport {
  /** `outbound/`: a directory, missing, or something else (a file, a link). */
  outbound: "directory" | "missing" | "other";
  /** `workspace/`, the same way. */
  workspace: "directory" | "missing" | "other";
  /** `outbound/` was made anew since the container last started. */
  replaced: boolean;
  /** Set-aside `outbound/` trees still waiting for removal. */
  setAside: number;
}

/**
 * Looks at a sandbox's state directory without reading anything the
 * sandbox wrote: names in the host's own directories and the types of the
 * two the sandbox owns. Bounded whatever the sandbox did.
 *
 * @param paths The sandbox's state paths.
 * @returns What is there.
 */
export function inspectState(paths: Omit<StatePaths, "lock" | "channel">): StateReport {
  const kind = (path: string): StateReport["outbound"] => {
    try {
      return Deno.lstatSync(path).isDirectory ? "directory" : "other";
    } catch (error) {
      return error instanceof Deno.errors.NotFound ? "missing" : "other";
    }
  };
  return {
    outbound: kind(paths.outbound),
    workspace: kind(paths.workspace),
    replaced: outboundReplaced(paths),
    setAside: setAsideTrees(paths.volume).length,
  };
}

/**
 * Starts removing the `outbound/` trees set aside beside the current one, a
 * few per call, in the background (see `remove_tree.ts`): a host that dies
 * before one is gone leaves it for a later call. Call only when no container
 * runs on one of them: with the container stopped, or once a runner started
 * on today's `outbound/` beats.
 *
 * @param paths The sandbox's state paths.
 */
export function removeSetAsideTrees(paths: StatePaths): void {
  for (const name of setAsideTrees(paths.volume).slice(0, LEFTOVERS_PER_CALL)) {
    removeTree(join(paths.volume, name), { background: true }).catch(() => false);
  }
}

// The set-aside trees in the volume: names in the host's own directory
// (only the host makes names there), never a look inside them.
function setAsideTrees(volume: string): string[] {
  const names: string[] = [];
  try {
    for (const entry of Deno.readDirSync(volume)) {
      if (SET_ASIDE.test(entry.name)) names.push(entry.name);
    }
  } catch {
    // No volume yet: nothing set aside.
  }
  return names;
}

// Tests only (see RESET_KILL_ENV).
function killPoint(step: ResetStep): void {
  let at: string | undefined;
  try {
    at = Deno.env.get(RESET_KILL_ENV);
  } catch {
    return;
  }
  if (at === step) Deno.kill(Deno.pid, "SIGKILL");
}

/**
 * Deletes a sandbox's state root for `rm --purge`, after `removeVolume`:
 * renamed aside first, within the host's `sandboxes/` (so the sandbox's name
 * is free at once and a host killed midway leaves nothing half-deleted under
 * it), then removed within a time bound without following a link (see
 * `remove_tree.ts`), with what earlier purges of this sandbox left.
 *
 * @param paths The sandbox's state paths.
 * @param options `timeoutMs`: the bound of each removal.
 * @throws {QueueError} When the root cannot be set aside, or some of it is left.
 */
export async function purgeState(
  paths: StatePaths,
  options: { timeoutMs?: number } = {},
): Promise<void> {
  const parent = dirname(paths.root);
  const prefix = `.purged-${basename(paths.root)}-`;
  removeChannelDir(paths.channel);
  try {
    Deno.renameSync(paths.root, join(parent, `${prefix}${Date.now()}`));
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) {
      throw new QueueError(`Cannot purge sandbox state '${paths.root}': ${messageOf(error)}`, {
        cause: error,
      });
    }
  }
  const left: string[] = [];
  let names: string[] = [];
  try {
    names = [...Deno.readDirSync(parent)].map((entry) => entry.name)
      .filter((name) => name.startsWith(prefix));
  } catch {
    // No sandboxes directory: nothing to remove.
  }
  for (const name of names) {
    const path = join(parent, name);
    if (!(await removeTree(path, options))) left.push(path);
  }
  if (left.length > 0) {
    throw new QueueError(
      `Cannot purge sandbox state '${paths.root}': '${
        left[0]
      }' is not fully removed; run the purge again`,
    );
  }
}

// Creates a directory (if missing) with an exact mode and, as root, owner.
// The parent is the host's, but the mode and owner are set through a
// descriptor opened with O_NOFOLLOW | O_DIRECTORY all the same: a name
// swapped for a link between a check and a chmod by name would hand any host
// path to the sandbox.
function ownDirectory(path: string, options: { mode: number; owner?: number }): void {
  try {
    Deno.mkdirSync(path, { mode: 0o700 });
  } catch (error) {
    if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
  }
  const lib = libc();
  if (lib === undefined) throw new QueueError(`Cannot set up '${path}': libc is not available`);
  const fd = lib.open(
    new TextEncoder().encode(`${path}\0`),
    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
    0,
  );
  if (fd < 0) throw new QueueError(`'${path}' is not a directory (errno ${errno(lib)})`);
  try {
    if (options.owner !== undefined && lib.fchown(fd, options.owner, options.owner) !== 0) {
      throw new QueueError(`Cannot hand '${path}' to uid ${options.owner} (errno ${errno(lib)})`);
    }
    if (lib.fchmod(fd, options.mode) !== 0) {
      throw new QueueError(`Cannot set the mode of '${path}' (errno ${errno(lib)})`);
    }
  } finally {
    lib.close(fd);
  }
}

/**
 * Whether a sandbox's state directory still exists. Only a definite "not
 * there" counts as gone: a path this process may not look into (another
 * user's home) is reported as existing, so sweep never mistakes someone
 * else's live sandbox for an orphan.
 *
 * @param root The state root.
 * @returns False when it is missing or not a directory.
 */
export function stateExists(root: string): boolean {
  try {
    return Deno.statSync(root).isDirectory;
  } catch (error) {
    return !(error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory);
  }
}
