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
import { dirname } from "../path.ts";
import { QueueError, UsageError } from "../errors.ts";
import { messageOf } from "../queue/connection.ts";
import { initQueue } from "../queue/schema.ts";
import type { StatePaths } from "./identity.ts";
import { hostCanChown, SANDBOX_UID } from "./posture.ts";
import { ensureVolume, type VolumeStatus } from "./quota.ts";
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
 * @throws {UsageError} When the host user is the sandbox's command uid.
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
  const root = hostCanChown();
  try {
    Deno.mkdirSync(dirname(paths.lock), { recursive: true, mode: 0o700 });
    Deno.mkdirSync(paths.root, { recursive: true, mode: 0o700 });
    Deno.chmodSync(paths.root, 0o700);
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
    ownDirectory(paths.outbound, root ? { mode: 0o700 } : { mode: 0o2770 });
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
  return volume;
}

/**
 * Replaces a damaged `outbound/` with an empty one. The old directory is
 * renamed away first (its parent is the host's, so no name in it can be
 * swapped), then removed without following any link in it. The container
 * must be stopped: it mounts the directory by its path when it starts.
 *
 * @param paths The sandbox's state paths.
 * @returns Once the empty directory is in place.
 * @throws {QueueError} When the directory cannot be replaced.
 */
export async function resetOutbound(paths: StatePaths): Promise<void> {
  const aside = `${paths.outbound}.damaged-${Date.now()}`;
  try {
    Deno.renameSync(paths.outbound, aside);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) {
      throw new QueueError(`Cannot set aside '${paths.outbound}': ${messageOf(error)}`, {
        cause: error,
      });
    }
  }
  // Rust's remove_dir_all (behind Deno.remove) never follows symlinks. Off
  // the event loop: the directory may hold every inode of the volume.
  try {
    await Deno.remove(aside, { recursive: true });
  } catch {
    // Left for the next reset or `rm --purge`; the fresh directory is what matters.
  }
  ownDirectory(paths.outbound, hostCanChown() ? { mode: 0o700 } : { mode: 0o2770 });
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
