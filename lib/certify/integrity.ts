/**
 * What the queue's files hold after a load or a crash: row counts and
 * `PRAGMA integrity_check`, through fresh read-only connections (a reader
 * never rolls a journal back), or on a copy as the file's owner would
 * recover it. Meant for a queue whose runner is waffle's own in a throwaway
 * sandbox (certification, tests): a hostile runner's `outbound.db` is read
 * through `queue/sandbox_file.ts` only.
 *
 * @module
 */
import { openDatabase } from "../queue/connection.ts";
import { type QueuePaths, queuePaths } from "../queue/schema.ts";

/** `integrity_check` of both files of a queue: "ok", or what SQLite found. */
export interface QueueIntegrity {
  /** The host's `inbound.db`. */
  inbound: string;
  /** The runner's `outbound.db`. */
  outbound: string;
}

/** Row counts of both queue files. */
export interface QueueCounts {
  /** `inbound.requests`. */
  requests: number;
  /** `inbound.cancels`. */
  cancels: number;
  /** `inbound.acks`. */
  acks: number;
  /** `outbound.states`. */
  states: number;
  /** `outbound.chunks`. */
  chunks: number;
  /** `outbound.results`. */
  results: number;
}

/**
 * Counts the rows of every table of a queue, through fresh reader connections.
 *
 * @param queue The queue directory or its paths.
 * @returns Row counts.
 * @throws {QueueError} When a file cannot be opened.
 *
 * @example
 * ```ts ignore
 * queueCounts("/tmp/q").results; // 0 once everything was collected
 * ```
 */
export function queueCounts(queue: string | QueuePaths): QueueCounts {
  const paths = typeof queue === "string" ? queuePaths(queue) : queue;
  const inbound = openDatabase(paths.inbound, { role: "reader" });
  try {
    const outbound = openDatabase(paths.outbound, { role: "reader" });
    try {
      const count = (db: typeof inbound, table: string): number =>
        Number((db.prepare(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n);
      return {
        requests: count(inbound, "requests"),
        cancels: count(inbound, "cancels"),
        acks: count(inbound, "acks"),
        states: count(outbound, "states"),
        chunks: count(outbound, "chunks"),
        results: count(outbound, "results"),
      };
    } finally {
      outbound.close();
    }
  } finally {
    inbound.close();
  }
}

/**
 * `PRAGMA integrity_check` of one queue file, through a fresh read-only
 * connection (which refuses a file with a hot journal: its owner recovers it).
 *
 * @param path A queue file.
 * @returns "ok", or the problems SQLite found.
 * @throws {QueueError} When the file cannot be opened.
 *
 * @example
 * ```ts ignore
 * integrityCheck("/tmp/q/inbound/inbound.db"); // "ok"
 * ```
 */
export function integrityCheck(path: string): string {
  const db = openDatabase(path, { role: "reader" });
  try {
    const rows = db.prepare("PRAGMA integrity_check").all() as Record<string, unknown>[];
    return rows.map((row) => String(Object.values(row)[0])).join("; ");
  } finally {
    db.close();
  }
}

/**
 * {@linkcode integrityCheck} of both files of a queue.
 *
 * @param queue The queue directory or its paths.
 * @returns The result per file.
 *
 * @example
 * ```ts ignore
 * integrityOfQueue("/tmp/q"); // { inbound: "ok", outbound: "ok" }
 * ```
 */
export function integrityOfQueue(queue: string | QueuePaths): QueueIntegrity {
  const paths = typeof queue === "string" ? queuePaths(queue) : queue;
  return { inbound: integrityCheck(paths.inbound), outbound: integrityCheck(paths.outbound) };
}

/**
 * {@linkcode integrityCheck} of a queue file as its owner would find it after
 * recovery, run on a copy (file and journal) so the real files stay as they
 * are: the owner's read-write connection rolls a hot journal back first.
 *
 * @param path A queue file.
 * @returns "ok", or the problems SQLite found.
 *
 * @example
 * ```ts ignore
 * recoveredIntegrity("/tmp/q/outbound/outbound.db"); // "ok" after a SIGKILL mid-write
 * ```
 */
export function recoveredIntegrity(path: string): string {
  const dir = Deno.makeTempDirSync({ prefix: "waffle-recover-" });
  try {
    const copy = `${dir}/copy.db`;
    Deno.copyFileSync(path, copy);
    try {
      Deno.copyFileSync(`${path}-journal`, `${copy}-journal`);
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    }
    openDatabase(copy, { role: "owner" }).close();
    return integrityCheck(copy);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
}
