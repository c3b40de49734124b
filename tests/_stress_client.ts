// deno-lint-ignore-file no-console
/**
 * Load and crash helpers for `stress_test.ts` and `integrity_test.ts`, and the
 * child process those tests spawn as an independent host.
 *
 * As a program (`deno run -A tests/_stress_client.ts MODE …`):
 *
 * - `stress QUEUE_DIR DEADLINE_MS PREFIX WORKERS`: submits, collects,
 *   checks, acks and GCs in `WORKERS` loops until the epoch-ms deadline, then
 *   prints one JSON {@linkcode StressSummary} line.
 * - `writer QUEUE_DIR PREFIX BATCH`: prints `ready`, then submits batches of
 *   `BATCH` concurrent requests (one group commit each) until killed, printing
 *   `<toolUseId> <requestId>` once each submit resolved (the request is
 *   durable at that point).
 *
 * @module
 */
import { fileURLToPath } from "node:url";
import { isBusyError, openDatabase } from "../lib/queue/connection.ts";
import type { Heartbeat } from "../lib/queue/protocol.ts";
import { Queue, type SubmitOptions } from "../lib/queue/queue.ts";
import { type QueuePaths, queuePaths } from "../lib/queue/schema.ts";

const encoder = new TextEncoder();

/** One request of the load mix and what it must produce. */
export interface StressRequest {
  options: SubmitOptions & { toolUseId: string };
  stdout: string;
  stderr: string;
  exitCode: number;
}

/**
 * The `n`-th request of the load mix: plain argv, a shell with stderr, stdin
 * through `cat`, and a non-zero exit. Every output names the tool-use id, so
 * a result delivered to the wrong request cannot match.
 *
 * @param toolUseId Unique id of the request.
 * @param n Selects the kind.
 * @returns Submit options and the expected outcome.
 */
export function stressRequest(toolUseId: string, n: number): StressRequest {
  switch (n % 4) {
    case 0:
      return {
        options: { argv: ["echo", toolUseId], toolUseId },
        stdout: `${toolUseId}\n`,
        stderr: "",
        exitCode: 0,
      };
    case 1:
      return {
        options: { shell: `echo ${toolUseId}; echo err-${toolUseId} >&2`, toolUseId },
        stdout: `${toolUseId}\n`,
        stderr: `err-${toolUseId}\n`,
        exitCode: 0,
      };
    case 2:
      return {
        options: { argv: ["cat"], stdin: encoder.encode(`in-${toolUseId}\n`), toolUseId },
        stdout: `in-${toolUseId}\n`,
        stderr: "",
        exitCode: 0,
      };
    default:
      return {
        options: { shell: `echo ${toolUseId}; echo e >&2; exit 3`, toolUseId },
        stdout: `${toolUseId}\n`,
        stderr: "e\n",
        exitCode: 3,
      };
  }
}

/** What a set of stress loops did. */
export interface StressSummary {
  /** Submits that resolved. */
  requests: number;
  /** Collects that returned a result. */
  results: number;
  /** Results whose output or exit code did not match the request. */
  mismatches: string[];
  /** Tool-use ids of the resolved submits. */
  toolUseIds: string[];
  /** Every error thrown by the queue API. */
  errors: string[];
  /** How many of `errors` were lock timeouts. */
  busyErrors: number;
  /** Requests forgotten by `gc()`. */
  collected: number;
  /** The largest heartbeat gap this process saw (see {@linkcode HeartbeatObserver}). */
  heartbeat?: HeartbeatStats;
}

/**
 * An empty summary.
 *
 * @returns A summary with zero counts.
 */
export function newSummary(): StressSummary {
  return {
    requests: 0,
    results: 0,
    mismatches: [],
    toolUseIds: [],
    errors: [],
    busyErrors: 0,
    collected: 0,
  };
}

/**
 * Submits, collects, verifies and acknowledges requests one after another
 * until `deadline`; every 8th request also runs `gc()`.
 *
 * @param queue The host handle (may be shared by several loops).
 * @param prefix Makes the tool-use ids of this loop unique.
 * @param deadline Epoch milliseconds after which no new request is submitted.
 * @param summary Receives the counts.
 */
export async function stressLoop(
  queue: Queue,
  prefix: string,
  deadline: number,
  summary: StressSummary,
): Promise<void> {
  const decoder = new TextDecoder();
  for (let n = 0; Date.now() < deadline; n++) {
    const request = stressRequest(`${prefix}-${n}`, n);
    try {
      const id = await queue.submit(request.options);
      summary.requests++;
      summary.toolUseIds.push(request.options.toolUseId);
      const { result, stdout, stderr } = await queue.collect(id);
      summary.results++;
      const got = {
        stdout: decoder.decode(stdout),
        stderr: decoder.decode(stderr),
        exitCode: result.exitCode,
      };
      if (
        got.stdout !== request.stdout || got.stderr !== request.stderr ||
        got.exitCode !== request.exitCode || result.requestId !== id
      ) {
        summary.mismatches.push(`${request.options.toolUseId}: ${JSON.stringify(got)}`);
      }
      await queue.ack(id);
      if (n % 8 === 7) summary.collected += await queue.gc();
    } catch (error) {
      if (isBusyError(error)) summary.busyErrors++;
      summary.errors.push(
        `${request.options.toolUseId}: ${error instanceof Error ? error.message : String(error)}`,
      );
    }
  }
}

/** What a {@linkcode HeartbeatObserver} saw. */
export interface HeartbeatStats {
  /** Reads of the heartbeat. */
  samples: number;
  /** Distinct heartbeats seen (same boot). */
  beats: number;
  /** Largest difference between the times of two successive distinct heartbeats. */
  maxGapMs: number;
  /** Largest `seq` step between two successive distinct heartbeats (1 = none missed). */
  maxSeqStep: number;
  /** Reads that found no valid heartbeat after the first one. */
  unreadable: number;
  /** Longest time between two reads (how well the observer itself kept up). */
  maxSampleIntervalMs: number;
}

/**
 * Samples `queue.heartbeat()` on a timer and records the largest gap between
 * successive distinct heartbeats of one runner boot.
 */
export class HeartbeatObserver {
  #queue: Queue;
  #timer: ReturnType<typeof setInterval> | undefined;
  #last: Heartbeat | undefined;
  #lastSampleAt = 0;
  /** The statistics so far. */
  readonly stats: HeartbeatStats = {
    samples: 0,
    beats: 0,
    maxGapMs: 0,
    maxSeqStep: 0,
    unreadable: 0,
    maxSampleIntervalMs: 0,
  };

  /** @param queue A host handle used only for sampling. */
  constructor(queue: Queue) {
    this.#queue = queue;
  }

  /**
   * Starts sampling.
   *
   * @param intervalMs Sampling interval.
   */
  start(intervalMs = 100): void {
    this.sample();
    this.#timer = setInterval(() => this.sample(), intervalMs);
  }

  /**
   * Stops sampling.
   *
   * @returns The statistics.
   */
  stop(): HeartbeatStats {
    clearInterval(this.#timer);
    this.sample();
    return this.stats;
  }

  /** Takes one sample. */
  sample(): void {
    const now = Date.now();
    const stats = this.stats;
    if (this.#lastSampleAt > 0) {
      stats.maxSampleIntervalMs = Math.max(stats.maxSampleIntervalMs, now - this.#lastSampleAt);
    }
    this.#lastSampleAt = now;
    stats.samples++;
    const beat = this.#queue.heartbeat();
    if (beat === undefined) {
      if (this.#last !== undefined) stats.unreadable++;
      return;
    }
    const last = this.#last;
    this.#last = beat;
    if (last === undefined || last.bootId !== beat.bootId || last.seq === beat.seq) return;
    stats.beats++;
    stats.maxGapMs = Math.max(stats.maxGapMs, beat.time - last.time);
    stats.maxSeqStep = Math.max(stats.maxSeqStep, beat.seq - last.seq);
  }
}

/** Row counts of both queue files. */
export interface QueueCounts {
  requests: number;
  cancels: number;
  acks: number;
  states: number;
  chunks: number;
  results: number;
}

/**
 * Counts the rows of every table of a queue, through fresh reader connections.
 *
 * @param queueDir The queue directory.
 * @returns Row counts.
 */
export function queueCounts(queue: string | QueuePaths): QueueCounts {
  const paths = typeof queue === "string" ? queuePaths(queue) : queue;
  const inbound = openDatabase(paths.inbound, { role: "reader" });
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
    inbound.close();
    outbound.close();
  }
}

/**
 * `PRAGMA integrity_check` of one queue file, through a fresh read-only
 * connection (which refuses a file with a hot journal: its owner recovers it).
 *
 * @param path A queue file.
 * @returns "ok", or the problems SQLite found.
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
 * `integrityCheck` of both files of a queue.
 *
 * @param queueDir The queue directory.
 * @returns The result per file.
 */
export function integrityOfQueue(
  queue: string | QueuePaths,
): { inbound: string; outbound: string } {
  const paths = typeof queue === "string" ? queuePaths(queue) : queue;
  return { inbound: integrityCheck(paths.inbound), outbound: integrityCheck(paths.outbound) };
}

/**
 * `integrityCheck` of a queue file as its owner would find it after
 * recovery, run on a copy (file and journal) so the real files stay as they
 * are: the owner's read-write connection rolls a hot journal back first.
 *
 * @param path A queue file.
 * @returns "ok", or the problems SQLite found.
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

/**
 * Sizes in bytes of both queue files.
 *
 * @param queueDir The queue directory.
 * @returns Bytes per file.
 */
export function queueFileSizes(queue: string | QueuePaths): { inbound: number; outbound: number } {
  const paths = typeof queue === "string" ? queuePaths(queue) : queue;
  return {
    inbound: Deno.statSync(paths.inbound).size,
    outbound: Deno.statSync(paths.outbound).size,
  };
}

const JOURNAL_MAGIC = [0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7];

/**
 * Whether a queue file has a hot rollback journal: one whose header SQLite
 * has synced, so the database file may already hold half a transaction and
 * the next connection must roll it back. (A journal of a writer that died
 * before syncing starts with zeros and is ignored.)
 *
 * @param dbPath The database file (not the journal).
 * @returns True when `<dbPath>-journal` starts with the journal magic.
 */
export function hotJournal(dbPath: string): boolean {
  let file: Deno.FsFile;
  try {
    file = Deno.openSync(`${dbPath}-journal`);
  } catch {
    return false;
  }
  try {
    const header = new Uint8Array(JOURNAL_MAGIC.length);
    return file.readSync(header) === header.length &&
      JOURNAL_MAGIC.every((byte, i) => header[i] === byte);
  } finally {
    file.close();
  }
}

/**
 * Busy-polls (without yielding: the writer is another process) until a
 * queue file has a hot journal or the time is up, then SIGKILLs `pid`.
 *
 * @param dbPath The database file the process writes.
 * @param kill Sends the SIGKILL.
 * @param withinMs How long to hunt before killing anyway.
 * @returns True when the kill was aimed at a hot journal.
 */
export function killInsideCommit(dbPath: string, kill: () => void, withinMs: number): boolean {
  const until = Date.now() + withinMs;
  let aimed = false;
  while (Date.now() < until) {
    if (hotJournal(dbPath)) {
      aimed = true;
      break;
    }
  }
  kill();
  return aimed;
}

/**
 * A number from the environment.
 *
 * @param name Variable name.
 * @param fallback Used when unset or not a positive number.
 * @returns The value.
 */
export function envNumber(name: string, fallback: number): number {
  const value = Number(Deno.env.get(name));
  return Number.isFinite(value) && value > 0 ? value : fallback;
}

/**
 * Spawns this file as a child process.
 *
 * @param args Mode and its arguments.
 * @returns The child; stdout is piped, stderr inherited.
 */
export function spawnClient(args: string[]): Deno.ChildProcess {
  const root = fileURLToPath(new URL("../", import.meta.url));
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", "--no-prompt", fileURLToPath(import.meta.url), ...args],
    cwd: root,
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
}

async function stressMain(
  queueDir: string,
  deadline: number,
  prefix: string,
  workers: number,
): Promise<void> {
  const queue = Queue.open(queueDir);
  const observerQueue = Queue.open(queueDir);
  const observer = new HeartbeatObserver(observerQueue);
  observer.start();
  const summary = newSummary();
  await Promise.all(
    Array.from(
      { length: workers },
      (_, w) => stressLoop(queue, `${prefix}w${w}`, deadline, summary),
    ),
  );
  summary.heartbeat = observer.stop();
  queue.close();
  observerQueue.close();
  console.log(JSON.stringify(summary));
}

async function writerMain(queueDir: string, prefix: string, batch: number): Promise<void> {
  const queue = Queue.open(queueDir);
  console.log("ready");
  // A safety stop in case the parent died without killing us.
  const stopAt = Date.now() + 120_000;
  for (let round = 0; Date.now() < stopAt; round++) {
    await Promise.all(
      Array.from({ length: batch }, (_, i) => {
        const toolUseId = `${prefix}-${round}-${i}`;
        return queue.submit({
          argv: ["sh", "-c", `echo ${toolUseId} >> ran.log; echo ${toolUseId}`],
          toolUseId,
        })
          .then((id) => console.log(`${toolUseId} ${id}`));
      }),
    );
  }
  queue.close();
}

if (import.meta.main) {
  const [mode, queueDir, ...rest] = Deno.args;
  if (mode === "stress" && queueDir !== undefined) {
    await stressMain(queueDir, Number(rest[0]), rest[1] ?? "child", Number(rest[2] ?? 2));
  } else if (mode === "writer" && queueDir !== undefined) {
    await writerMain(queueDir, rest[0] ?? "writer", Number(rest[1] ?? 16));
  } else {
    console.error("usage: _stress_client.ts stress|writer QUEUE_DIR …");
    Deno.exit(2);
  }
}
