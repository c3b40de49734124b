/**
 * Wakes a queue side when the other side committed: each side rings a
 * doorbell file (`inbound.bell`, `outbound.bell`) after every commit, and the
 * other side watches it with `Deno.watchFs` (inotify follows bind mounts on
 * Linux), plus a short fallback poll for mounts that drop events (Docker
 * Desktop's VirtioFS). The caller then checks `PRAGMA data_version`.
 *
 * Why a doorbell and not the database file itself: inotify reports the
 * database file's modification while the writer is still inside its commit,
 * so the woken reader runs into the write lock and SQLite's busy handler
 * sleeps at least a millisecond (and its read lock then delays the writer's
 * next commit). The bell rings only after COMMIT returned.
 *
 * Never watch the database files or the queue directory itself: Deno's
 * watcher opens and closes each file it reports on, and closing any handle to
 * a file drops every POSIX lock the process holds on it, so SQLite's own
 * locks in this process would silently vanish (seen as inconsistent reads).
 *
 * @module
 */
import { QueueError } from "../errors.ts";

/** Default fallback poll interval. */
export const DEFAULT_POLL_MS = 100;

/** Options for {@linkcode ChangeWatcher}. */
export interface ChangeWatcherOptions {
  /** Fallback poll interval in milliseconds. */
  pollMs?: number;
}

/**
 * Resolves `wait()` on the next change event of the watched files or after
 * the poll interval, whichever comes first. Events that arrive between two
 * waits are remembered, so none is lost.
 */
export class ChangeWatcher {
  #watcher: Deno.FsWatcher | undefined;
  #pending = false;
  #wake: (() => void) | undefined;
  #pollMs: number;

  /**
   * Starts watching; falls back to polling alone when the files cannot be watched.
   *
   * @param paths Files to watch: the other side's doorbell.
   * @param options Poll interval.
   */
  constructor(paths: string[], options: ChangeWatcherOptions = {}) {
    this.#pollMs = options.pollMs ?? DEFAULT_POLL_MS;
    try {
      this.#watcher = Deno.watchFs(paths, { recursive: false });
      this.#pump(this.#watcher);
    } catch {
      // No change events here: the fallback poll alone keeps the queue moving.
      this.#watcher = undefined;
    }
  }

  async #pump(watcher: Deno.FsWatcher): Promise<void> {
    try {
      for await (const event of watcher) {
        if (event.kind === "access") continue;
        this.#pending = true;
        this.#wake?.();
      }
    } catch {
      // Watcher closed or the platform dropped it: polling continues.
    }
  }

  /**
   * Waits for a change (or the poll interval).
   *
   * @param signal Aborting resolves the wait early.
   */
  wait(signal?: AbortSignal): Promise<void> {
    if (this.#pending || signal?.aborted) {
      this.#pending = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", done);
        this.#wake = undefined;
        this.#pending = false;
        resolve();
      };
      const timer = setTimeout(done, this.#pollMs);
      signal?.addEventListener("abort", done, { once: true });
      this.#wake = done;
    });
  }

  /** Stops watching. */
  close(): void {
    try {
      this.#watcher?.close();
    } catch {
      // Already closed.
    }
    this.#wake?.();
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
