/**
 * Wakes a queue side when the other side committed: each side rings a
 * doorbell file (`inbound.bell`, `outbound.bell`) after every commit, and the
 * other side watches for it with inotify, plus a short fallback poll for
 * mounts that drop events (Docker Desktop's VirtioFS). The caller then checks
 * whether the data changed.
 *
 * A ring sets the bell's times (`futimens`: `IN_ATTRIB`), not its bytes. The
 * database and journal beside it are written many times per commit, and
 * each write is an `IN_MODIFY` on the same directory watch: watched, they
 * made about ten drains per round trip and ran the drain budget below dry
 * (measured: 1,357 drains and 69 throttled waits for 100 round trips, against
 * 391 and none with the ring on `IN_ATTRIB` alone).
 *
 * Why a doorbell and not the database file: inotify reports the database
 * file's writes while the writer is still inside its commit; the bell rings
 * only after COMMIT returned.
 *
 * Why inotify through FFI, with `IN_DONT_FOLLOW`, and not `Deno.watchFs`:
 * Deno's watcher opens the watched name on every event (following a symlink,
 * blocking on a FIFO), and the other side can replace that name at will. An
 * inotify watch opens nothing. (Closing a handle to a database file would
 * also drop this process's POSIX locks on it.)
 *
 * Why the bell's directory and not the bell: a watch on a file follows its
 * inode, so a bell given a new inode needs a new watch, and the other side
 * can do that as often as it likes (each old inode kept alive by a hard
 * link: 17,488 watches held by one waiting host, against a limit of about
 * 190,000 for every process of the user). One watch on the directory, the
 * events filtered by the bell's name, costs the same however often the bell
 * is replaced. The directory is watched again only when its own name points
 * at another directory (the host set `outbound/` aside), the old watch
 * removed first, at most once per {@linkcode REWATCH_GAP_MS}.
 *
 * Everything the other side writes in that directory raises events, so the
 * work is bounded whatever it writes: a drain reads at most
 * {@linkcode MAX_READ_BYTES}, drains beyond a burst are spaced
 * {@linkcode DRAIN_GAP_MS} apart (a flood of events or rings costs a bounded
 * rate of wakeups, never a spinning loop), and a queue overflow counts as one
 * ring.
 *
 * @module
 */
import { basename, dirname } from "../path.ts";
import {
  EAGAIN,
  errno,
  type Libc,
  libc,
  O_CLOEXEC,
  O_NOFOLLOW,
  O_NONBLOCK,
  O_WRONLY,
  POLLIN,
} from "../libc.ts";
import { QueueError } from "../errors.ts";

/** Default fallback poll interval. */
export const DEFAULT_POLL_MS = 100;
/** A watched directory is watched again (after replacement) at most this often. */
export const REWATCH_GAP_MS = 1000;
/** Drains beyond the burst are at least this far apart. */
export const DRAIN_GAP_MS = 2;
/** Drains allowed back to back before {@linkcode DRAIN_GAP_MS} applies. */
export const DRAIN_BURST = 64;
/** Most event bytes one drain reads (the rest wait for the next drain). */
export const MAX_READ_BYTES = 64 * 1024;

const IN_NONBLOCK = 0o4000;
const IN_CLOEXEC = 0o2000000;
const IN_ATTRIB = 0x4;
const IN_CLOSE_WRITE = 0x8;
const IN_MOVED_TO = 0x80;
const IN_CREATE = 0x100;
const IN_DELETE_SELF = 0x400;
const IN_MOVE_SELF = 0x800;
const IN_Q_OVERFLOW = 0x4000;
const IN_IGNORED = 0x8000;
const IN_ONLYDIR = 0x01000000;
const IN_DONT_FOLLOW = 0x02000000;
/**
 * A ring (the bell's times set, or a bell written and closed by hand), a
 * bell put in place (created or renamed over), and the directory itself
 * moved or deleted; not `IN_MODIFY`, which every database write raises.
 * Only a real directory is watched, never a link's target.
 */
const WATCH_MASK = IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF |
  IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW;
/** `struct inotify_event` without its name: wd, mask, cookie, len. */
const EVENT_HEADER = 16;
const READ_BUFFER = 16 * 1024;
/** One poll(2) slice: how long a closed watcher's last poll may outlive it. */
const POLL_SLICE_MS = 50;

/** Options for {@linkcode ChangeWatcher}. */
export interface ChangeWatcherOptions {
  /** Fallback poll interval in milliseconds. */
  pollMs?: number;
}

/** One watched directory and the bell names in it. */
interface WatchedDir {
  dir: string;
  /** The watched base names, as the kernel reports them. */
  names: Uint8Array[];
  /** The watch descriptor, or -1. */
  wd: number;
  /** `dev:ino` of the directory the watch is on; "" when it must be looked at again. */
  key: string;
  /** Earliest `performance.now()` at which the directory may be watched again. */
  rewatchAt: number;
}

/**
 * Resolves `wait()` on the next change of the watched files or after the poll
 * interval, whichever comes first. Events that arrive between two waits are
 * remembered (as one), so none is lost. Holds one inotify descriptor and one
 * watch per distinct parent directory, whatever happens to the files.
 *
 * @example
 * ```ts
 * const watcher = new ChangeWatcher(["/tmp/q/outbound/outbound.bell"]);
 * await watcher.wait(); // rung, replaced, or a poll interval passed
 * watcher.close();
 * ```
 */
export class ChangeWatcher {
  #pollMs: number;
  #lib: Libc | undefined;
  #fd = -1;
  #closed = false;
  #dirs: WatchedDir[] = [];
  #pending = false;
  #buffer = new Uint8Array(READ_BUFFER);
  #view = new DataView(this.#buffer.buffer);
  #waiters = new Set<() => void>();
  #listening = false;
  #polling: Promise<void> | undefined;
  #nap: { timer: ReturnType<typeof setTimeout>; resolve: () => void } | undefined;
  #tokens = DRAIN_BURST;
  #tokensAt = performance.now();
  #wakes = 0;

  /**
   * Starts watching; falls back to polling alone when inotify is not there.
   *
   * @param paths Files to watch: the other side's doorbell.
   * @param options Poll interval.
   */
  constructor(paths: string[], options: ChangeWatcherOptions = {}) {
    this.#pollMs = options.pollMs ?? DEFAULT_POLL_MS;
    this.#lib = libc();
    const encoder = new TextEncoder();
    for (const path of paths) {
      const dir = dirname(path);
      const name = encoder.encode(basename(path));
      const known = this.#dirs.find((entry) => entry.dir === dir);
      if (known !== undefined) known.names.push(name);
      else this.#dirs.push({ dir, names: [name], wd: -1, key: "", rewatchAt: 0 });
    }
    if (this.#lib !== undefined) this.#fd = this.#lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    // Without inotify the fallback poll alone keeps the queue moving.
    this.#rewatch();
  }

  /**
   * How many waits a change ended: a ring, the bell put in place, an
   * overflow, or a new watch (anything may have happened before it); not
   * the poll interval, an abort or close().
   *
   * @returns The count since construction.
   */
  get wakes(): number {
    return this.#wakes;
  }

  /**
   * Waits for a change (or the poll interval).
   *
   * @param signal Aborting resolves the wait early.
   * @returns Resolves on a change, the poll interval, an abort or close.
   */
  wait(signal?: AbortSignal): Promise<void> {
    // A directory replaced since the last wait is watched from now.
    this.#rewatch();
    if (this.#pending && !this.#closed) {
      this.#pending = false;
      this.#wakes++;
      return Promise.resolve();
    }
    if (signal?.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const finish = (): void => {
        if (!this.#waiters.delete(finish)) return;
        clearTimeout(timer);
        signal?.removeEventListener("abort", finish);
        resolve();
      };
      const timer = setTimeout(() => {
        this.#rewatch();
        finish();
      }, this.#pollMs);
      signal?.addEventListener("abort", finish, { once: true });
      this.#waiters.add(finish);
      void this.#listen();
    });
  }

  /** Stops watching: releases the descriptor (and so its watch) and ends every wait. */
  close(): void {
    this.#closed = true;
    this.#release();
    if (this.#nap !== undefined) {
      clearTimeout(this.#nap.timer);
      this.#nap.resolve();
    }
    for (const finish of [...this.#waiters]) finish();
  }

  // One loop for all waiters: drains while there are waiters, waking them
  // all on a ring, within the drain budget.
  async #listen(): Promise<void> {
    if (this.#listening) return;
    this.#listening = true;
    try {
      while (this.#waiters.size > 0 && this.#fd >= 0) {
        const owed = this.#drainDelay();
        if (owed > 0) {
          await this.#sleep(owed);
          continue;
        }
        const { read, hit } = this.#drain();
        if (read) this.#tokens--;
        if (hit) {
          this.#wakes++;
          for (const finish of [...this.#waiters]) finish();
        } else if (!read) await this.#pollOnce();
      }
    } finally {
      this.#listening = false;
    }
  }

  // Milliseconds until the next drain is allowed (token bucket).
  #drainDelay(): number {
    const now = performance.now();
    this.#tokens = Math.min(DRAIN_BURST, this.#tokens + (now - this.#tokensAt) / DRAIN_GAP_MS);
    this.#tokensAt = now;
    return this.#tokens >= 1 ? 0 : Math.ceil((1 - this.#tokens) * DRAIN_GAP_MS);
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = (): void => {
        this.#nap = undefined;
        resolve();
      };
      this.#nap = { timer: setTimeout(done, ms), resolve: done };
    });
  }

  // One poll(2) in flight at a time, on FFI's own thread, in short slices so
  // a closed watcher lets go of it soon.
  #pollOnce(): Promise<void> {
    if (this.#polling !== undefined) return this.#polling;
    if (this.#lib === undefined || this.#fd < 0) return Promise.resolve();
    const fds = new Uint8Array(8);
    const view = new DataView(fds.buffer);
    view.setInt32(0, this.#fd, true);
    view.setInt16(4, POLLIN, true);
    this.#polling = this.#lib.poll(fds, 1n, POLL_SLICE_MS).then(() => {
      this.#polling = undefined;
    });
    return this.#polling;
  }

  // Closes the descriptor: the kernel drops its watches with it.
  #release(): void {
    if (this.#fd >= 0) this.#lib?.close(this.#fd);
    this.#fd = -1;
    for (const entry of this.#dirs) entry.wd = -1;
  }

  // Reads up to MAX_READ_BYTES of events; `hit` when one is a ring (or may
  // hide one: an overflow, the directory moved).
  #drain(): { read: boolean; hit: boolean } {
    let hit = this.#pending;
    this.#pending = false;
    let read = false;
    if (this.#fd < 0 || this.#lib === undefined) return { read, hit };
    for (let bytes = 0; bytes < MAX_READ_BYTES;) {
      const got = Number(this.#lib.read(this.#fd, this.#buffer, BigInt(this.#buffer.length)));
      if (got <= 0) {
        if (got < 0 && errno(this.#lib) !== EAGAIN) this.#release();
        break;
      }
      read = true;
      bytes += got;
      if (this.#scan(got)) hit = true;
    }
    return { read, hit };
  }

  // Walks the events in the buffer's first `length` bytes.
  #scan(length: number): boolean {
    let hit = false;
    for (let at = 0; at + EVENT_HEADER <= length;) {
      const wd = this.#view.getInt32(at, true);
      const mask = this.#view.getUint32(at + 4, true);
      const size = this.#view.getUint32(at + 12, true);
      const nameAt = at + EVENT_HEADER;
      at = nameAt + size;
      // Events were dropped: any of them may have been a ring.
      if ((mask & IN_Q_OVERFLOW) !== 0) hit = true;
      for (const entry of this.#dirs) {
        if (entry.wd !== wd) continue;
        if ((mask & IN_IGNORED) !== 0) {
          entry.wd = -1;
          entry.key = "";
          hit = true;
        } else if ((mask & (IN_MOVE_SELF | IN_DELETE_SELF)) !== 0) {
          entry.key = ""; // looked at (and watched again) on the next wait
          hit = true;
        } else if (entry.names.some((name) => this.#named(nameAt, size, name))) {
          hit = true;
        }
      }
    }
    return hit;
  }

  // Whether the NUL-padded name at `at` (`size` bytes) is `name`.
  #named(at: number, size: number, name: Uint8Array): boolean {
    if (name.length > size || (name.length < size && this.#buffer[at + name.length] !== 0)) {
      return false;
    }
    for (let i = 0; i < name.length; i++) if (this.#buffer[at + i] !== name[i]) return false;
    return true;
  }

  // Watches each directory whose name now points at another directory than
  // the one watched (or none yet), removing the old watch first; at most
  // once per REWATCH_GAP_MS each. Only lstat: nothing is opened.
  #rewatch(): void {
    if (this.#fd < 0 || this.#lib === undefined) return;
    for (const entry of this.#dirs) {
      let key: string;
      try {
        const info = Deno.lstatSync(entry.dir);
        if (!info.isDirectory) continue;
        key = `${info.dev}:${info.ino}`;
      } catch {
        continue;
      }
      if (key === entry.key && entry.wd >= 0) continue;
      const now = performance.now();
      if (now < entry.rewatchAt) continue;
      entry.rewatchAt = now + REWATCH_GAP_MS;
      if (entry.wd >= 0 && !this.#dirs.some((other) => other !== entry && other.wd === entry.wd)) {
        this.#lib.inotify_rm_watch(this.#fd, entry.wd);
      }
      entry.wd = -1;
      entry.key = "";
      // The key was taken before the watch: a swap in between shows as a
      // changed key on the next wait, and is watched again then.
      const wd = this.#lib.inotify_add_watch(
        this.#fd,
        new TextEncoder().encode(`${entry.dir}\0`),
        WATCH_MASK,
      );
      if (wd >= 0) {
        entry.wd = wd;
        entry.key = key;
        this.#pending = true; // anything may have happened before the watch
      }
    }
  }
}

/**
 * A doorbell file: its times set after each commit (see the module's notes).
 */
export class Bell {
  #file: Deno.FsFile | undefined;
  #path: Uint8Array;
  /** Setting the times was refused (a bell owned by another uid): rings open and close it. */
  #byClose = false;

  /**
   * @param path The bell file; a missing one leaves the other side on its poll.
   * @throws {QueueError} When the path is a symlink (it would redirect a host write).
   */
  constructor(path: string) {
    this.#path = new TextEncoder().encode(`${path}\0`);
    try {
      if (Deno.lstatSync(path).isSymlink) throw new QueueError(`Doorbell '${path}' is a symlink`);
      this.#file = Deno.openSync(path, { write: true });
    } catch (error) {
      if (error instanceof QueueError) throw error;
      this.#file = undefined;
    }
  }

  /** Wakes the watchers; never throws (a missed ring is caught by the poll). */
  ring(): void {
    if (this.#file === undefined) return;
    if (!this.#byClose) {
      try {
        const now = new Date();
        this.#file.utimeSync(now, now);
        return;
      } catch {
        // Explicit times need the file's owner; opening for write does not.
        this.#byClose = true;
      }
    }
    // IN_CLOSE_WRITE, without a write: never following a link put under the
    // name, never blocking on a FIFO. A failure leaves the other side its poll.
    // By name, so only for a bell in a directory the other side cannot
    // write (the host's inbound/; the runner's own outbound/): closing a
    // descriptor of a hard link to a database would drop our locks on it.
    const lib = libc();
    const fd = lib?.open(this.#path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0) ?? -1;
    if (fd >= 0) lib?.close(fd);
  }

  /** Closes the file. */
  close(): void {
    try {
      this.#file?.close();
    } catch {
      // Already closed.
    }
    this.#file = undefined;
  }
}
