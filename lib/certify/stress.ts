/**
 * The queue under load across the container boundary: several host handles
 * submit, collect, check and acknowledge requests for N seconds, counted from
 * the runner's first heartbeat, while an observer samples the heartbeat.
 * Passes with non-zero completed work, as many results and distinct tool-use
 * ids as requests, no error (no lock timeout above all), no heartbeat gap
 * over 4 s, both files intact, and the same runner still serving.
 *
 * @module
 */
import { messageOf } from "../queue/connection.ts";
import { type CheckResult, type Failure, judged } from "./check.ts";
import {
  HeartbeatObserver,
  type HeartbeatStats,
  MAX_HEARTBEAT_GAP_MS,
} from "./heartbeat_observer.ts";
import { integrityOfQueue, queueCounts, type QueueIntegrity } from "./integrity.ts";
import type { QueueRig } from "./rig.ts";
import { newSummary, stressLoop, type StressSummary } from "./stress_loop.ts";
import { pollUntil } from "./_poll.ts";

/** The stress's default duration: two minutes, as the support statement asks. */
export const DEFAULT_STRESS_SECONDS = 120;

/** Concurrent submitters by default, each with its own host handle. */
export const STRESS_SUBMITTERS = 8;

/** What the stress measured. */
export interface StressFigures {
  /** Seconds asked for. */
  seconds: number;
  /** How long the load ran, from the first heartbeat. */
  elapsedMs: number;
  /** Host handles submitting at once. */
  submitters: number;
  /** Submits that resolved. */
  requests: number;
  /** Distinct tool-use ids among them. */
  distinctToolUseIds: number;
  /** Results collected. */
  results: number;
  /** Results a second. */
  perSecond: number;
  /** Errors of the queue API (the first few are in `firstErrors`). */
  errors: number;
  /** How many of them were lock timeouts. */
  busyErrors: number;
  /** Up to 5 of the errors. */
  firstErrors: string[];
  /** Results whose output did not match their request (up to 5 shown in `firstMismatches`). */
  mismatches: number;
  /** Up to 5 mismatches. */
  firstMismatches: string[];
  /** What the heartbeat observer saw. */
  heartbeat: HeartbeatStats;
  /** Whether every acknowledged row was collected by both sides afterwards. */
  rowsCollected: boolean;
  /** `integrity_check` of both files afterwards. */
  integrity: QueueIntegrity;
  /** The container still running afterwards. */
  containerRunning: boolean;
  /** Restarts of the container during the load. */
  restartCount: number;
  /** The runner that served the first request also served the last. */
  sameRunner: boolean;
}

/** The stress check's result. */
export type StressCheck = CheckResult<StressFigures>;

/** Options of {@linkcode stressCheck}. */
export interface StressOptions {
  /** How long to load the queue, from the first heartbeat. */
  seconds: number;
  /** Host handles; default {@linkcode STRESS_SUBMITTERS}. */
  submitters?: number;
  /** Receives a progress line every `progressEveryMs` (default 5 s). */
  onProgress?: (line: string) => void;
  /** How often to report progress. */
  progressEveryMs?: number;
}

/**
 * Runs the stress against a rig whose runner serves.
 *
 * @param rig The runner and the queue.
 * @param options Duration, handles, progress.
 * @returns The result with its figures; failed (mode `harness`) when it could not finish.
 *
 * @example
 * ```ts ignore
 * const check = await stressCheck(rig, { seconds: 30 });
 * check.status; // "passed"
 * ```
 */
export async function stressCheck(rig: QueueRig, options: StressOptions): Promise<StressCheck> {
  const started = performance.now();
  const submitters = options.submitters ?? STRESS_SUBMITTERS;
  const first = rig.queue.heartbeat();
  // Counted from the first heartbeat: the rig is only handed over once it was seen.
  const clock = Date.now();
  const deadline = clock + options.seconds * 1000;
  const observerQueue = rig.openQueue();
  const observer = new HeartbeatObserver(observerQueue);
  const queues = Array.from({ length: submitters }, () => rig.openQueue());
  const summaries: StressSummary[] = queues.map(() => newSummary());
  const progress = setInterval(() => {
    const done = summaries.reduce((n, s) => n + s.results, 0);
    const at = Math.min(options.seconds, Math.round((Date.now() - clock) / 1000));
    options.onProgress?.(`stress (${rig.mount}) ${at}/${options.seconds} s, ${done} results`);
  }, options.progressEveryMs ?? 5000);
  let elapsedMs = 0;
  let rowsCollected = true;
  try {
    observer.start(100);
    options.onProgress?.(`stress (${rig.mount}) 0/${options.seconds} s, 0 results`);
    await Promise.all(
      queues.map((queue, i) =>
        stressLoop(queue, { prefix: `d${i}`, deadline, summary: summaries[i]! })
      ),
    );
    elapsedMs = Date.now() - clock;
    // Everything was acknowledged: the runner and the host collect the rows.
    await pollUntil(async () => {
      await queues[0]!.gc();
      const counts = queueCounts(rig.paths);
      return counts.requests === 0 && counts.results === 0;
    }, { timeoutMs: 30_000, what: "acknowledged rows to be collected", intervalMs: 50 })
      .catch(() => (rowsCollected = false));
  } finally {
    clearInterval(progress);
    observer.stop();
    for (const queue of [...queues, observerQueue]) queue.close();
  }
  const still = await rig.docker.inspectContainer(rig.containerId);
  const figures: StressFigures = {
    ...tally(summaries, { seconds: options.seconds, elapsedMs, submitters }),
    heartbeat: observer.stats,
    rowsCollected,
    integrity: integrityOf(rig),
    containerRunning: still?.State.Running === true,
    restartCount: still?.RestartCount ?? 0,
    sameRunner: first !== undefined && rig.queue.heartbeat()?.bootId === first.bootId,
  };
  return judged("stress", {
    mount: rig.mount,
    started,
    summary: describeStress(figures),
    figures,
    failures: stressFailures(figures),
  });
}

// The loops' counts, summed.
function tally(
  summaries: StressSummary[],
  run: { seconds: number; elapsedMs: number; submitters: number },
): Omit<
  StressFigures,
  "heartbeat" | "rowsCollected" | "integrity" | "containerRunning" | "restartCount" | "sameRunner"
> {
  const sum = (pick: (s: StressSummary) => number): number =>
    summaries.reduce((n, s) => n + pick(s), 0);
  const errors = summaries.flatMap((s) => s.errors);
  const mismatches = summaries.flatMap((s) => s.mismatches);
  const results = sum((s) => s.results);
  return {
    ...run,
    requests: sum((s) => s.requests),
    distinctToolUseIds: new Set(summaries.flatMap((s) => s.toolUseIds)).size,
    results,
    perSecond: run.elapsedMs > 0 ? Math.round(results / (run.elapsedMs / 1000)) : 0,
    errors: errors.length,
    busyErrors: sum((s) => s.busyErrors),
    firstErrors: errors.slice(0, 5),
    mismatches: mismatches.length,
    firstMismatches: mismatches.slice(0, 5),
  };
}

function integrityOf(rig: QueueRig): QueueIntegrity {
  try {
    return integrityOfQueue(rig.paths);
  } catch (error) {
    const message = `not checked: ${messageOf(error)}`;
    return { inbound: message, outbound: message };
  }
}

/**
 * What a stress's figures fail on, by mode.
 *
 * @param f The figures.
 * @returns The failures; empty when it passed.
 */
export function stressFailures(f: StressFigures): Failure[] {
  const failures: Failure[] = [];
  const fail = (mode: Failure["mode"], detail: string): number => failures.push({ mode, detail });
  if (f.busyErrors > 0) fail("busy", `${f.busyErrors} lock timeouts (SQLITE_BUSY)`);
  if (f.errors > f.busyErrors) {
    fail("lost results", `${f.errors - f.busyErrors} errors: ${f.firstErrors[0] ?? ""}`);
  }
  if (f.results === 0) fail("lost results", "nothing completed");
  if (f.results !== f.requests) {
    fail("lost results", `${f.requests} requests, ${f.results} results`);
  }
  if (f.distinctToolUseIds !== f.requests) {
    fail("lost results", `${f.requests} requests, ${f.distinctToolUseIds} distinct tool-use ids`);
  }
  if (f.mismatches > 0) {
    fail("lost results", `${f.mismatches} outputs not their request's: ${f.firstMismatches[0]}`);
  }
  if (!f.rowsCollected) fail("lost results", "acknowledged rows were not collected within 30 s");
  if (f.heartbeat.beats === 0) fail("heartbeat", "no heartbeat seen during the load");
  if (f.heartbeat.maxGapMs >= MAX_HEARTBEAT_GAP_MS) {
    fail("heartbeat", `heartbeat gap ${f.heartbeat.maxGapMs} ms (limit ${MAX_HEARTBEAT_GAP_MS})`);
  }
  if (f.heartbeat.unreadable > 0) fail("heartbeat", `${f.heartbeat.unreadable} unreadable beats`);
  for (const file of ["inbound", "outbound"] as const) {
    if (f.integrity[file] !== "ok") fail("corruption", `${file}.db: ${f.integrity[file]}`);
  }
  if (!f.containerRunning) fail("runner", "the container stopped during the load");
  if (f.restartCount > 0) fail("runner", `${f.restartCount} container restarts`);
  if (!f.sameRunner) fail("runner", "the runner restarted during the load");
  return failures;
}

function describeStress(f: StressFigures): string {
  return `${(f.elapsedMs / 1000).toFixed(1)} s, ${f.submitters} handles: ${f.requests} requests, ` +
    `${f.distinctToolUseIds} distinct ids, ${f.results} results (${f.perSecond}/s), ` +
    `${f.errors} errors (${f.busyErrors} busy), ${f.mismatches} mismatches, max heartbeat gap ` +
    `${f.heartbeat.maxGapMs} ms (${f.heartbeat.beats} beats), integrity ` +
    `${f.integrity.inbound}/${f.integrity.outbound}`;
}
