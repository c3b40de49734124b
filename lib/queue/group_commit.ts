/**
 * Group commit: writes requested during one turn of the event loop share a
 * single `BEGIN IMMEDIATE … COMMIT`, so N concurrent submitters pay for one
 * fsync instead of N.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { afterThisTask } from "../async.ts";
import { QueueError } from "../errors.ts";
import { busyTimeoutOf, isBusyError, setBusyTimeout, transaction } from "./connection.ts";
import type { Bell } from "./watch.ts";

interface Pending {
  write: () => unknown;
  resolve: (value: unknown) => void;
  reject: (error: unknown) => void;
}

/**
 * Batches writes to one owner connection.
 *
 * @example
 * ```ts ignore
 * const commits = new GroupCommit(db);
 * await Promise.all([commits.add(() => insertA()), commits.add(() => insertB())]); // one commit
 * ```
 */
export class GroupCommit {
  #db: DatabaseSync;
  #pending: Pending[] = [];
  #scheduled = false;
  /** Number of transactions committed so far (for benchmarks and tests). */
  commits = 0;

  #bell: Bell | undefined;
  #lockWaitMs: number | undefined;
  #busySince: number | undefined;
  #retry: ReturnType<typeof setTimeout> | undefined;

  /**
   * Creates a batcher for one owner connection.
   *
   * @param db The owner connection all writes go to.
   * @param options `bell`: rung after every commit, to wake the other side.
   *   `lockWaitMs`: for a connection with `busy_timeout` 0, how long a batch
   *   that meets a lock is retried (asynchronously, so the event loop keeps
   *   serving everyone else) before its writes fail.
   */
  constructor(db: DatabaseSync, options: { bell?: Bell; lockWaitMs?: number } = {}) {
    this.#db = db;
    this.#bell = options.bell;
    this.#lockWaitMs = options.lockWaitMs;
    this.#busyTimeout = busyTimeoutOf(db);
  }

  #busyTimeout: number;

  /**
   * Queues a write for the next shared transaction.
   *
   * @param write Runs inside the transaction; must be synchronous.
   * @returns What `write` returned, once the transaction is durable.
   */
  add<T>(write: () => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.#pending.push({ write, resolve: resolve as (value: unknown) => void, reject });
      if (!this.#scheduled) {
        this.#scheduled = true;
        // After the current macrotask, not a microtask: submitters woken by the
        // same event all get in.
        afterThisTask(() => this.flush());
      }
    });
  }

  /**
   * Commits everything queued so far, now.
   *
   * @param final No retry later: a batch that meets a lock fails now (on close).
   */
  flush(final = false): void {
    this.#scheduled = false;
    clearTimeout(this.#retry);
    this.#retry = undefined;
    const batch = this.#pending;
    this.#pending = [];
    if (batch.length === 0) return;
    const values: unknown[] = [];
    const errors = new Map<number, unknown>();
    try {
      transaction(this.#db, () => {
        batch.forEach((item, index) => {
          // A savepoint per write: one bad write fails alone, not the whole group.
          this.#db.exec("SAVEPOINT w");
          try {
            values[index] = item.write();
            this.#db.exec("RELEASE w");
          } catch (error) {
            this.#db.exec("ROLLBACK TO w");
            this.#db.exec("RELEASE w");
            errors.set(index, error);
          }
        });
        // COMMIT waits for the other side's readers to leave: never on this
        // thread when the other side may hold its lock for good.
        if (this.#lockWaitMs !== undefined) setBusyTimeout(this.#db, 0);
      });
      this.commits++;
      this.#busySince = undefined;
      this.#bell?.ring();
    } catch (error) {
      if (this.#retryLater(batch, error, final)) return;
      for (const item of batch) item.reject(error);
      return;
    } finally {
      if (this.#lockWaitMs !== undefined) this.#restoreBusyTimeout();
    }
    batch.forEach((item, index) => {
      if (errors.has(index)) item.reject(errors.get(index));
      else item.resolve(values[index]);
    });
  }

  // A connection closed under a scheduled flush has nothing to restore (its
  // writes were rejected above); throwing here would escape the task uncaught.
  #restoreBusyTimeout(): void {
    try {
      setBusyTimeout(this.#db, this.#busyTimeout);
    } catch {
      // Closed.
    }
  }

  // Puts a batch that met a lock back in front and tries again shortly, until
  // the lock wait runs out. Nothing was written: the transaction rolled back.
  #retryLater(batch: Pending[], error: unknown, final: boolean): boolean {
    if (this.#lockWaitMs === undefined || final || !isBusyError(error)) return false;
    const now = Date.now();
    this.#busySince ??= now;
    const waited = now - this.#busySince;
    if (waited >= this.#lockWaitMs) {
      this.#busySince = undefined;
      const locked = new QueueError(
        `Queue file is locked by the other side: no write for ${Math.round(waited / 1000)} s`,
        { cause: error },
      );
      for (const item of batch) item.reject(locked);
      return true;
    }
    this.#pending = [...batch, ...this.#pending];
    this.#retry = setTimeout(() => this.flush(), Math.min(50, 2 + waited / 10));
    return true;
  }
}
