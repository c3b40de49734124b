/**
 * The queue section: what one tool execution costs through the two SQLite
 * files with a live runner, against the floor of what it must cost.
 *
 * - `floor`: three durable commits with the queue's pragmas (request into a
 *   fresh `inbound.db`, "started" and result into a fresh `outbound.db`,
 *   opened with `openDatabase` and written with `transaction()`), plus one
 *   `Deno.Command("true").output()`, per iteration.
 * - `queue_roundtrip`: `submit({argv:["true"]})` until `wait()` returns, with
 *   a runner process serving the queue; each iteration then `ack()`s (timed
 *   apart, see the details).
 * - `throughput_1|4|16`: that many concurrent submit→wait→ack loops sharing
 *   one `Queue` for a fixed time; `throughput_16_c4` is 16 loops against a
 *   runner with `--concurrency 4`.
 *
 * `floor` and `queue_roundtrip` run interleaved, ten iterations at a time,
 * so that their ratio compares like with like on a shared machine. All files
 * live under the context's root, so floor and queue share one filesystem.
 *
 * @module
 */
import { queuePaths } from "../lib/queue/schema.ts";
import { join } from "node:path";
import type { DatabaseSync } from "node:sqlite";
import { openDatabase, transaction } from "../lib/queue/connection.ts";
import { Queue } from "../lib/queue/queue.ts";
import { INBOUND_SCHEMA, OUTBOUND_SCHEMA } from "../lib/queue/schema.ts";
import type { ExecResult } from "../lib/queue/protocol.ts";
import { startBenchRunner } from "./runner_process.ts";
import type { BenchContext, Section } from "./section.ts";
import {
  type BenchRatio,
  type BenchReport,
  type BenchResult,
  now,
  ratioOf,
  stageMeans,
  summarize,
} from "./stats.ts";

/** Case names of the queue section, in run order. */
export const QUEUE_CASES = [
  "floor",
  "queue_roundtrip",
  "throughput_1",
  "throughput_4",
  "throughput_16",
  "throughput_16_c4",
] as const;

/** The command every case runs. */
const COMMAND = ["true"];
/** Acknowledged rows are garbage-collected this often, outside the timed window. */
const GC_EVERY = 50;

/** The queue section, for `main.ts`. */
export const queueSection: Section = {
  name: "queue",
  cases: QUEUE_CASES,
  run: runQueueSection,
};

/**
 * Runs the wanted queue cases and derives their ratios.
 *
 * @param context Counts, root directory, filter, progress and cleanup.
 * @returns Results and ratios.
 */
export async function runQueueSection(context: BenchContext): Promise<BenchReport> {
  const results: BenchResult[] = [];
  const wantsQueue = ["queue_roundtrip", "throughput_1", "throughput_4", "throughput_16"]
    .some((name) => context.wants(name));
  if (!wantsQueue) {
    if (context.wants("floor")) results.push(...await measureLatency(context, undefined));
  } else {
    await withQueue(context, "queue", {}, async (live) => {
      results.push(...await measureLatency(context, live));
      for (const submitters of [1, 4, 16]) {
        const name = `throughput_${submitters}`;
        if (context.wants(name)) {
          results.push(await measureThroughput(context, live, name, submitters));
        }
      }
    });
  }
  if (context.wants("throughput_16_c4")) {
    await withQueue(context, "queue_c4", { concurrency: 4 }, async (live) => {
      const result = await measureThroughput(context, live, "throughput_16_c4", 16);
      result.note = `${result.note ?? ""}, runner --concurrency 4`;
      results.push(result);
    });
  }
  return { results, ratios: queueRatios(results) };
}

/**
 * The ratios the queue section reports, for whichever results exist.
 *
 * @param results Results of this run.
 * @returns `queue_roundtrip / floor` (p50s) and the throughput scaling ratios.
 */
export function queueRatios(results: readonly BenchResult[]): BenchRatio[] {
  const find = (name: string): BenchResult | undefined =>
    results.find((result) => result.name === name);
  return [
    ratioOf("queue_roundtrip / floor", find("queue_roundtrip"), find("floor")),
    ratioOf("throughput_4_vs_1", find("throughput_4"), find("throughput_1"), "per_s"),
    ratioOf("throughput_16_vs_1", find("throughput_16"), find("throughput_1"), "per_s"),
    ratioOf("throughput_16_c4_vs_16", find("throughput_16_c4"), find("throughput_16"), "per_s"),
  ].filter((ratio): ratio is BenchRatio => ratio !== undefined);
}

/** A queue with a runner serving it. */
export interface LiveQueue {
  /** The host side. */
  queue: Queue;
  /** Its directory. */
  dir: string;
  /** The runner process's pid. */
  runnerPid: number;
}

/** Iterations of one kind run back to back before switching to the other. */
const BLOCK = 10;

/**
 * `floor` and `queue_roundtrip` (whichever are wanted), interleaved in
 * blocks of ten iterations so that both see the same machine load: their
 * ratio is what matters, and a shared machine drifts.
 *
 * @param context Counts, root directory, filter and progress.
 * @param live A queue with a live runner; undefined measures the floor only.
 * @returns The wanted results, floor first.
 */
export async function measureLatency(
  context: BenchContext,
  live: LiveQueue | undefined,
): Promise<BenchResult[]> {
  const floor = context.wants("floor") ? openFloor(join(context.root, "floor")) : undefined;
  const roundtrip = context.wants("queue_roundtrip") ? live : undefined;
  // CPU of the measured round-trip blocks only (the floor runs in this process too).
  const cpu = { host: 0, runner: 0 };
  const release = context.cleanup.add(() => floor?.close());
  try {
    const floorSamples: Record<string, number>[] = [];
    const roundtripSamples: Record<string, number>[] = [];
    const total = context.warmup + context.n;
    for (let block = 0; block < total; block += BLOCK) {
      const size = Math.min(BLOCK, total - block);
      if (floor !== undefined) {
        for (let i = block; i < block + size; i++) {
          const sample = await floor.iteration();
          if (i < context.warmup) continue;
          floorSamples.push(sample);
          context.progress.step(
            "floor",
            floorSamples.length,
            context.n,
            () => `p50 ${median(floorSamples)}`,
          );
        }
      }
      if (roundtrip !== undefined) {
        const before = cpuSample(roundtrip.runnerPid);
        for (let i = block; i < block + size; i++) {
          const sample = await roundtripIteration(roundtrip.queue);
          if (i % GC_EVERY === GC_EVERY - 1) await roundtrip.queue.gc();
          if (i < context.warmup) continue;
          roundtripSamples.push(sample);
          context.progress.step(
            "queue_roundtrip",
            roundtripSamples.length,
            context.n,
            () => `p50 ${median(roundtripSamples)}`,
          );
        }
        if (block >= context.warmup) addCpu(cpu, before, cpuSample(roundtrip.runnerPid));
      }
    }
    const results: BenchResult[] = [];
    if (floor !== undefined) {
      results.push(summarizeStages("floor", floorSamples, "3 durable commits + spawn `true`"));
    }
    if (roundtrip !== undefined) {
      const result = summarizeStages(
        "queue_roundtrip",
        roundtripSamples,
        "submit → wait; ack timed apart",
      );
      const iteration = summarize("", roundtripSamples.map((sample) => sample.iteration!));
      result.details = {
        ...result.details,
        iteration_p50: iteration.p50_ms,
        iteration_p99: iteration.p99_ms,
        ...cpuPerRequest(cpu, roundtripSamples.length),
      };
      results.push(result);
    }
    return results;
  } finally {
    await release();
  }
}

/** The floor's two database files and its one iteration. */
export interface FloorRig {
  /**
   * Three durable commits and one spawn.
   *
   * @returns `total` and each stage, in milliseconds.
   */
  iteration(): Promise<Record<string, number>>;
  /** Closes both files. */
  close(): void;
}

/**
 * Opens a fresh pair of database files with the queue's schema and pragmas
 * (`openDatabase`, owner role) for the floor.
 *
 * @param dir A new directory on the queue's filesystem.
 * @returns The rig.
 */
export function openFloor(dir: string): FloorRig {
  Deno.mkdirSync(dir, { recursive: true });
  const inbound = openDatabase(join(dir, "inbound.db"), { role: "owner", schema: INBOUND_SCHEMA });
  let outbound: DatabaseSync;
  try {
    outbound = openDatabase(join(dir, "outbound.db"), { role: "owner", schema: OUTBOUND_SCHEMA });
  } catch (error) {
    inbound.close();
    throw error;
  }
  const insertRequest = inbound.prepare(
    `INSERT INTO requests (id, tool_use_id, kind, payload, timeout_ms, created_at)
     VALUES (?, ?, 'exec', ?, NULL, ?)`,
  );
  const insertStarted = outbound.prepare(
    `INSERT INTO states (request_id, state, boot_id, accepted_at, started_at)
     VALUES (?1, 'started', ?2, ?3, ?3)`,
  );
  const insertResult = outbound.prepare(
    "INSERT INTO results (request_id, body, created_at) VALUES (?, ?, ?)",
  );
  const markDone = outbound.prepare("UPDATE states SET state = 'done' WHERE request_id = ?");
  const bootId = crypto.randomUUID();
  const payload = JSON.stringify({ argv: COMMAND });
  let open = true;
  return {
    async iteration(): Promise<Record<string, number>> {
      const id = crypto.randomUUID();
      const t0 = now();
      transaction(inbound, () => insertRequest.run(id, id, payload, Date.now()));
      const t1 = now();
      transaction(outbound, () => insertStarted.run(id, bootId, Date.now()));
      const t2 = now();
      const output = await new Deno.Command(COMMAND[0]!, { args: COMMAND.slice(1) }).output();
      const t3 = now();
      const body = JSON.stringify({ requestId: id, exitCode: output.code });
      transaction(outbound, () => {
        insertResult.run(id, body, Date.now());
        markDone.run(id);
      });
      const t4 = now();
      if (!output.success) throw new Error(`'${COMMAND.join(" ")}' exited with ${output.code}`);
      return {
        total: t4 - t0,
        request_commit: t1 - t0,
        started_commit: t2 - t1,
        spawn: t3 - t2,
        result_commit: t4 - t3,
      };
    },
    close(): void {
      if (!open) return;
      open = false;
      inbound.close();
      outbound.close();
    },
  };
}

/**
 * One sequential round trip: `submit` → `wait` (`total`), then `ack`
 * (timed apart). The runner-side stages come from the result's own epoch-ms
 * stamps (`startedAt`/`endedAt`), so only their means are meaningful.
 *
 * @param queue A queue with a live runner.
 * @returns `total`, `iteration` (with the ack) and the stages, in milliseconds.
 */
export async function roundtripIteration(queue: Queue): Promise<Record<string, number>> {
  const wall0 = Date.now();
  const t0 = now();
  const id = await queue.submit({ argv: COMMAND });
  const t1 = now();
  const result = await queue.wait(id);
  const t2 = now();
  const wall2 = Date.now();
  await queue.ack(id);
  const t3 = now();
  requireSuccess(result);
  return {
    total: t2 - t0,
    iteration: t3 - t0,
    submit: t1 - t0,
    submit_to_spawn: (result.startedAt ?? Number.NaN) - wall0,
    exec: result.durationMs,
    exec_end_to_result: wall2 - result.endedAt,
    ack: t3 - t2,
  };
}

// A result from samples that carry `total` plus per-stage times.
function summarizeStages(
  name: string,
  samples: readonly Record<string, number>[],
  note: string,
): BenchResult {
  // `iteration` (round trip plus ack) is reported as percentiles, not as a stage.
  const stages = samples.map(({ total: _total, iteration: _iteration, ...rest }) => rest);
  return summarize(name, samples.map((sample) => sample.total!), {
    details: stageMeans(stages, "mean_"),
    note,
  });
}

/**
 * `submitters` concurrent submit → wait → ack loops on one queue for the
 * context's time budget.
 *
 * @param context Time budget, warm-up and progress.
 * @param live The queue, its directory (for the files' change counters) and
 *   the runner's pid (for its CPU time).
 * @param name The result's name.
 * @param submitters Concurrent loops.
 * @returns Requests per second, per-request latency percentiles, commits and
 *   CPU time per request.
 */
export async function measureThroughput(
  context: BenchContext,
  live: LiveQueue,
  name: string,
  submitters: number,
): Promise<BenchResult> {
  const { queue, dir: queueDir } = live;
  // A short warm-up with the same concurrency, untimed.
  await Promise.all(
    Array.from({ length: submitters }, () => oneRequest(queue)),
  );
  await queue.gc();

  const budgetMs = context.seconds * 1000;
  const latencies: number[] = [];
  const hostCommitsBefore = queue.commits;
  const paths = queuePaths(queueDir);
  const inboundBefore = changeCounter(paths.inbound);
  const outboundBefore = changeCounter(paths.outbound);
  const cpuBefore = cpuSample(live.runnerPid);
  const start = now();
  const deadline = start + budgetMs;
  const loop = async (): Promise<void> => {
    while (now() < deadline) {
      latencies.push(await oneRequest(queue));
      context.progress.timed(name, now() - start, budgetMs, () => `${latencies.length} done`);
    }
  };
  await Promise.all(Array.from({ length: submitters }, loop));
  const elapsed = now() - start;
  const cpu = addCpu({ host: 0, runner: 0 }, cpuBefore, cpuSample(live.runnerPid));
  const completed = latencies.length;
  context.progress.done(name, `${completed} requests in ${(elapsed / 1000).toFixed(1)} s`);
  const hostCommits = queue.commits - hostCommitsBefore;
  const inboundCommits = changeCounter(paths.inbound) - inboundBefore;
  const outboundCommits = changeCounter(paths.outbound) - outboundBefore;
  await queue.gc();
  const perRequest = (count: number): number => completed === 0 ? Number.NaN : count / completed;
  return summarize(name, latencies, {
    per_s: completed / (elapsed / 1000),
    details: {
      submitters,
      seconds: elapsed / 1000,
      host_commits_per_req: perRequest(hostCommits),
      inbound_writes_per_req: perRequest(inboundCommits),
      outbound_writes_per_req: perRequest(outboundCommits),
      ...cpuPerRequest(cpu, completed),
    },
    note: `${submitters} submitter${submitters === 1 ? "" : "s"}, ${
      perRequest(hostCommits).toFixed(2)
    } host commits/req`,
  });
}

// One submit → wait → ack; returns the submit → wait latency.
async function oneRequest(queue: Queue): Promise<number> {
  const t0 = now();
  const id = await queue.submit({ argv: COMMAND });
  const result = await queue.wait(id);
  const latency = now() - t0;
  await queue.ack(id);
  requireSuccess(result);
  return latency;
}

/**
 * Creates `<root>/<label>/{queue,workspace}`, opens the queue, starts a
 * runner on it, runs `fn`, and stops and removes everything afterwards.
 *
 * @param context Root directory, cleanup and progress.
 * @param label Sub-directory name.
 * @param runner Runner flags.
 * @param fn The measurements; gets the queue, its directory and the runner's pid.
 */
export async function withQueue(
  context: BenchContext,
  label: string,
  runner: { concurrency?: number; pollMs?: number },
  fn: (live: LiveQueue) => Promise<void>,
): Promise<void> {
  const base = join(context.root, label);
  const queueDir = join(base, "queue");
  const workspace = join(base, "workspace");
  const queue = Queue.open(queueDir, { create: true });
  const closeQueue = context.cleanup.add(() => queue.close());
  const started = now();
  const runnerProcess = await startBenchRunner(queueDir, { workspace, ...runner });
  const stopRunner = context.cleanup.add(async () => {
    const status = await runnerProcess.stop();
    if (!status.success) {
      context.progress.note(`runner ${runnerProcess.pid} exited with ${status.code}; see its log`);
    }
  });
  context.progress.note(
    `${label}: runner pid ${runnerProcess.pid} ready in ${(now() - started).toFixed(0)} ms${
      runner.concurrency === undefined ? "" : ` (--concurrency ${runner.concurrency})`
    }`,
  );
  try {
    await fn({ queue, dir: queueDir, runnerPid: runnerProcess.pid });
  } finally {
    await stopRunner();
    await closeQueue();
    await Deno.remove(base, { recursive: true }).catch(() => {});
  }
}

interface CpuTimes {
  host: number;
  runner: number;
}

// User+system CPU milliseconds of this process and of the runner (not of
// the runner's reaped children), from /proc (tick resolution: 10 ms).
function cpuSample(runnerPid: number): CpuTimes {
  return { host: processCpuMs(Deno.pid), runner: processCpuMs(runnerPid) };
}

function addCpu(total: CpuTimes, before: CpuTimes, after: CpuTimes): CpuTimes {
  total.host += after.host - before.host;
  total.runner += after.runner - before.runner;
  return total;
}

function cpuPerRequest(cpu: CpuTimes, requests: number): Record<string, number> {
  if (requests === 0 || !Number.isFinite(cpu.host + cpu.runner)) return {};
  return { host_cpu_ms_per_req: cpu.host / requests, runner_cpu_ms_per_req: cpu.runner / requests };
}

function processCpuMs(pid: number): number {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    // Fields after "(comm) ": state is [0]; utime and stime are fields 14 and 15, i.e. [11], [12].
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return Number.NaN;
  }
}

// SQLite's file change counter (header bytes 24..27): in rollback-journal
// mode it moves once per write transaction, whoever made it.
function changeCounter(path: string): number {
  const file = Deno.openSync(path, { read: true });
  try {
    const header = new Uint8Array(28);
    let read = 0;
    while (read < header.length) {
      const got = file.readSync(header.subarray(read));
      if (got === null) break;
      read += got;
    }
    return new DataView(header.buffer).getUint32(24);
  } finally {
    file.close();
  }
}

function requireSuccess(result: ExecResult): void {
  if (result.exitCode !== 0) {
    throw new Error(
      `'${COMMAND.join(" ")}' failed through the queue: exit ${result.exitCode}, ${
        result.error ?? "no error"
      }`,
    );
  }
}

function median(samples: readonly Record<string, number>[]): string {
  return `${summarize("", samples.map((sample) => sample.total!)).p50_ms.toFixed(2)} ms`;
}
