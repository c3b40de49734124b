/**
 * Wakes a queue side when the other side's file changes: `Deno.watchFs`
 * where the platform delivers events (inotify follows bind mounts on Linux),
 * plus a short fallback poll for mounts that drop them (Docker Desktop's
 * VirtioFS). The caller then checks `PRAGMA data_version`, so a spurious wake
 * costs one cheap read.
 *
 * @module
 */

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
   * @param paths Files to watch (the other side's database file).
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
