/**
 * The one way the host removes a directory tree the sandbox can shape: a
 * set-aside `outbound/` (the runner's), a purged state root (its workspace is
 * the commands'), a restricted session's queue, doctor's throwaway homes.
 *
 * Why a child process running GNU `rm -rf --one-file-system`, and never
 * `Deno.remove(path, { recursive: true })` or a walk of our own in process:
 * - `Deno.remove` recurses in Rust's `remove_dir_all`, one native stack frame
 *   per level: a tree 20,000 levels deep overflows the worker thread's stack
 *   and aborts the whole host process (exit 134), every other user's calls in
 *   it with it. No `catch` stops an abort.
 * - GNU rm walks with fts, iteratively and relative to descriptors (`openat`,
 *   `unlinkat`), so depth costs it heap, not stack. It never follows a
 *   symlink (a link is unlinked, its target untouched), checks the device and
 *   inode of every directory it goes back up into (a `..` renamed by the
 *   sandbox meanwhile cannot lead it out of the tree), and with
 *   `--one-file-system` never descends into another mount.
 * - Whatever the tree does to it stays in the child: the host sees an exit
 *   status. `timeout -s KILL` bounds its run even after the host process that
 *   started it has exited (a CLI call returns without waiting for it), and
 *   `nice` keeps it behind the host's own calls. It reads directory entries,
 *   never file contents, so the bytes in the tree cost it nothing; entries are
 *   bounded by the volume's inodes (with a disk quota) and by the time bound.
 *   What a killed removal leaves keeps its name and is removed by a later call.
 *
 * Needs `--allow-run` and `--allow-read`; Linux with GNU coreutils (`rm`,
 * `timeout`). Without them nothing is removed and the tree stays for later.
 *
 * @module
 */
import { normalize } from "../path.ts";
import { UsageError } from "../errors.ts";
import { isFile, lexists } from "../fs.ts";

/** How long one removal may run before its process is killed: 2 minutes. */
export const REMOVE_TIMEOUT_MS = 120_000;

/** Options for {@linkcode removeTree}. */
export interface RemoveTreeOptions {
  /** Kill the remover after this long (what is left stays for a later call); default 2 min. */
  timeoutMs?: number;
  /**
   * Do not keep this process alive for it: a CLI call may exit while the
   * remover runs on (bounded by its own timeout). Default false.
   */
  background?: boolean;
}

// Removals under way in this process, by path: a second request joins the
// first (and keeps the process alive for it, unless it too is background).
const running = new Map<string, { done: Promise<boolean>; keepAlive(): void }>();

/**
 * Removes a directory tree the sandbox may have shaped, in a child process,
 * without following any link in it and within a time bound. A symlink or a
 * file at `path` is unlinked itself; a missing `path` is already removed.
 * Never throws for what the tree holds.
 *
 * @param path Absolute path of the tree (its parent must be the host's: the
 * sandbox must not be able to swap the name itself).
 * @param options Time bound and whether to keep the process alive for it.
 * @returns True once nothing is left at `path`; false when some of it is
 * left (time bound, permissions, no GNU rm), for a later call to remove.
 * Rejects with a {@linkcode UsageError} when `path` is not absolute and
 * normalized, or ends in a slash.
 *
 * @example
 * ```ts ignore
 * const gone = await removeTree("/var/lib/waffle/sandboxes/ab12/volume/outbound.damaged-1");
 * if (!gone) console.warn("left for the next call");
 * ```
 */
export function removeTree(path: string, options: RemoveTreeOptions = {}): Promise<boolean> {
  // No trailing slash either: `rm -rf link/` would follow the link.
  if (
    !path.startsWith("/") || normalize(path) !== path || path.endsWith("/") || path.includes("\0")
  ) {
    return Promise.reject(
      new UsageError(
        `Refusing to remove '${path}': use an absolute, normalized path below '/' without a trailing slash`,
      ),
    );
  }
  const joined = running.get(path);
  if (joined !== undefined) {
    if (!options.background) joined.keepAlive();
    return joined.done;
  }
  let child: Deno.ChildProcess | undefined;
  const entry = {
    done: removeNow(path, options, (spawned) => (child = spawned))
      .finally(() => running.delete(path)),
    keepAlive: () => child?.ref(),
  };
  running.set(path, entry);
  return entry.done;
}

/**
 * Waits until every removal this process started has ended (for a clean
 * shutdown of a library process, and for tests).
 *
 * @returns Once none is running.
 */
export async function settleRemovals(): Promise<void> {
  while (running.size > 0) {
    const pending = [...running.values()];
    for (const entry of pending) entry.keepAlive();
    await Promise.allSettled(pending.map((entry) => entry.done));
  }
}

async function removeNow(
  path: string,
  options: RemoveTreeOptions,
  spawned: (child: Deno.ChildProcess) => void,
): Promise<boolean> {
  let info: Deno.FileInfo;
  try {
    info = Deno.lstatSync(path);
  } catch (error) {
    return error instanceof Deno.errors.NotFound;
  }
  if (!info.isDirectory) {
    // A link or a file: unlinked itself, never followed.
    try {
      Deno.removeSync(path);
    } catch (error) {
      return error instanceof Deno.errors.NotFound;
    }
    return true;
  }
  const [rm, timeout] = [findProgram("rm"), findProgram("timeout")];
  if (rm === undefined || timeout === undefined) return false;
  const nice = findProgram("nice");
  const seconds = Math.max(0.1, (options.timeoutMs ?? REMOVE_TIMEOUT_MS) / 1000);
  const child = new Deno.Command(timeout, {
    args: [
      "--signal=KILL",
      `${seconds}s`,
      ...(nice === undefined ? [] : [nice, "-n", "19"]),
      rm,
      "-rf",
      "--one-file-system",
      "--",
      path,
    ],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  if (options.background) child.unref();
  spawned(child);
  await child.status;
  return !lexists(path);
}

// coreutils from the standard places first: the host's PATH is trusted, but
// a service's PATH is often minimal.
function findProgram(name: string): string | undefined {
  let path = "";
  try {
    path = Deno.env.get("PATH") ?? "";
  } catch {
    // No env permission: the standard places only.
  }
  const dirs = ["/usr/bin", "/bin", ...path.split(":")];
  return dirs.filter((dir) => dir.startsWith("/")).map((dir) => `${dir}/${name}`).find(isFile);
}
