/**
 * Wakes a queue side when the other side committed: each side rings a
 * doorbell file (`inbound.bell`, `outbound.bell`) after every commit, and the
 * other side watches for it with inotify, plus a short fallback poll for
 * mounts that drop events (Docker Desktop's VirtioFS). The caller then checks
 * whether the data changed.
 *
 * Why a doorbell and not the database file: inotify reports the database
 * file's writes while the writer is still inside its commit; the bell rings
 * only after COMMIT returned.
 *
 * Why inotify through FFI, with `IN_DONT_FOLLOW`, and not `Deno.watchFs`:
 * Deno's watcher opens the watched name on every event (following a symlink,
 * blocking on a FIFO), and the other side can replace that name at will. An
 * inotify watch opens nothing: it watches the inode the name has when the
 * watch is added (a link itself, never its target), and is added again when
 * the name comes to point at another inode. (Closing a handle to a database
 * file would also drop this process's POSIX locks on it.)
 *
 * @module
 */
import { errno, type Libc, libc } from "../libc.ts";
import { QueueError } from "../errors.ts";

/** Default fallback poll interval. */
export const DEFAULT_POLL_MS = 100;

const IN_NONBLOCK = 0o4000;
const IN_CLOEXEC = 0o2000000;
const IN_MODIFY = 0x2;
const IN_CLOSE_WRITE = 0x8;
const IN_DONT_FOLLOW = 0x02000000;
/** What ringing a bell (rewriting its byte) raises. */
const RING = IN_MODIFY | IN_CLOSE_WRITE;
const POLLIN = 1;
const EAGAIN = 11;

/** Options for {@linkcode ChangeWatcher}. */
export interface ChangeWatcherOptions {
  /** Fallback poll interval in milliseconds. */
  pollMs?: number;
}

/**
 * Resolves `wait()` on the next change of the watched files or after the poll
 * interval, whichever comes first. Events that arrive between two waits are
 * remembered, so none is lost.
 */
export class ChangeWatcher {
  #pollMs: number;
  #lib: Libc | undefined;
  #fd = -1;
  #files = new Map<string, number>();
  #pending = false;
  #buffer = new Uint8Array(4096);
  #polling: Promise<void> | undefined;

  /**
   * Starts watching; falls back to polling alone when inotify is not there.
   *
   * @param paths Files to watch: the other side's doorbell.
   * @param options Poll interval.
   */
  constructor(paths: string[], options: ChangeWatcherOptions = {}) {
    this.#pollMs = options.pollMs ?? DEFAULT_POLL_MS;
    this.#lib = libc();
    for (const path of paths) this.#files.set(path, -1);
    if (this.#lib !== undefined) this.#fd = this.#lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    // Without inotify the fallback poll alone keeps the queue moving.
    this.#rewatch();
  }

  /**
   * Waits for a change (or the poll interval).
   *
   * @param signal Aborting resolves the wait early (within a poll interval).
   */
  wait(signal?: AbortSignal): Promise<void> {
    // A bell created (or replaced) since the last wait is watched from now.
    this.#rewatch();
    if (this.#drain() || signal?.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      let done = false;
      const finish = (): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", finish);
        resolve();
      };
      const timer = setTimeout(() => {
        this.#rewatch();
        finish();
      }, this.#pollMs);
      signal?.addEventListener("abort", finish, { once: true });
      const listen = async (): Promise<void> => {
        while (!done && this.#fd >= 0) {
          await this.#pollOnce();
          if (this.#drain()) finish();
        }
      };
      void listen();
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
    this.#polling = this.#lib.poll(fds, 1n, 50).then(() => {
      this.#polling = undefined;
    });
    return this.#polling;
  }

  /** Stops watching. */
  close(): void {
    if (this.#fd >= 0) this.#lib?.close(this.#fd);
    this.#fd = -1;
  }

  // Reads every queued event; true when one names a watched file.
  #drain(): boolean {
    if (this.#pending) {
      this.#pending = false;
      return true;
    }
    if (this.#fd < 0 || this.#lib === undefined) return false;
    let hit = false;
    while (true) {
      const got = Number(this.#lib.read(this.#fd, this.#buffer, BigInt(this.#buffer.length)));
      if (got <= 0) {
        if (got < 0 && errno(this.#lib) !== EAGAIN) this.close();
        return hit;
      }
      // Every watch is on a watched file: any event is a ring.
      hit = true;
    }
  }

  // (Re)adds a watch on each file whose name now points at another inode (a
  // replaced file keeps its old watch silent otherwise).
  #rewatch(): void {
    if (this.#fd < 0 || this.#lib === undefined) return;
    for (const [path, watched] of this.#files) {
      let ino: number;
      try {
        ino = Deno.lstatSync(path).ino ?? -1;
      } catch {
        continue;
      }
      if (ino === watched) continue;
      const name = new TextEncoder().encode(`${path}\0`);
      if (this.#lib.inotify_add_watch(this.#fd, name, RING | IN_DONT_FOLLOW) >= 0) {
        this.#files.set(path, ino);
        this.#pending = true; // anything may have happened before the watch
      }
    }
  }
}

/**
 * A doorbell file: one byte rewritten in place after each commit.
 */
export class Bell {
  #file: Deno.FsFile | undefined;
  #byte = new Uint8Array(1);

  /**
   * @param path The bell file; a missing one leaves the other side on its poll.
   * @throws {QueueError} When the path is a symlink (it would redirect a host write).
   */
  constructor(path: string) {
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
    try {
      this.#byte[0] = (this.#byte[0]! + 1) & 0xff;
      this.#file?.seekSync(0, Deno.SeekMode.Start);
      this.#file?.writeSync(this.#byte);
    } catch {
      // The poll fallback still wakes the other side.
    }
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
