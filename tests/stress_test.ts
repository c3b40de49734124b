// deno-lint-ignore-file no-console
/**
 * Concurrent queue load: one real runner process, many hosts at once (eight
 * `Queue` instances in this process, two more client processes), real
 * SQLite files. Asserts behaviour only: every request gets exactly its own
 * output, nothing fails (no lock timeouts), the heartbeat keeps its bound,
 * the files stay intact and acknowledged rows are collected.
 *
 * The last test holds a read lock on outbound.db past the busy timeout: the
 * runner's writes fail for a while, and it must retry rather than drop them.
 *
 * `WAFFLE_STRESS_SECONDS` sets the load duration (default 5), counted from
 * the runner's first heartbeat.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { BUSY_TIMEOUT_MS, openDatabase } from "../lib/queue/connection.ts";
import { Queue } from "../lib/queue/queue.ts";
import { queuePaths } from "../lib/queue/schema.ts";
import { delay, MAX_HEARTBEAT_GAP_MS, startRunner, tempQueue, text, waitFor } from "./_helpers.ts";
import {
  envNumber,
  HeartbeatObserver,
  integrityOfQueue,
  newSummary,
  queueCounts,
  queueFileSizes,
  spawnClient,
  stressLoop,
  type StressSummary,
} from "./_stress_client.ts";

const IN_PROCESS_QUEUES = 8;
const LOOPS_PER_QUEUE = 2;
const CHILD_PROCESSES = 2;
const LOOPS_PER_CHILD = 2;
/** A file of a queue whose acknowledged rows are collected stays far below this. */
const MAX_FILE_BYTES = 4 * 1024 * 1024;

async function childSummary(child: Deno.ChildProcess): Promise<StressSummary> {
  const output = await child.output();
  const lines = new TextDecoder().decode(output.stdout).trim().split("\n");
  assert.equal(output.code, 0, `stress client exited with ${output.code}`);
  return JSON.parse(lines.at(-1) ?? "{}") as StressSummary;
}

async function concurrentLoad(concurrency: number | undefined): Promise<void> {
  const seconds = envNumber("WAFFLE_STRESS_SECONDS", 5);
  await using q = await tempQueue();
  await using runner = await startRunner(q.queueDir, {
    workspace: q.workspace,
    ...(concurrency === undefined ? {} : { concurrency }),
  });
  const started = Date.now();
  const deadline = started + seconds * 1000;

  const observerQueue = Queue.open(q.queueDir);
  const observer = new HeartbeatObserver(observerQueue);
  observer.start();
  const children = Array.from(
    { length: CHILD_PROCESSES },
    (_, k) =>
      spawnClient(["stress", q.queueDir, String(deadline), `c${k}`, String(LOOPS_PER_CHILD)]),
  );
  const queues = Array.from({ length: IN_PROCESS_QUEUES }, () => Queue.open(q.queueDir));
  const local = queues.map(() => newSummary());
  await Promise.all(
    queues.flatMap((queue, i) =>
      Array.from(
        { length: LOOPS_PER_QUEUE },
        (_, w) => stressLoop(queue, { prefix: `p${i}w${w}`, deadline, summary: local[i]! }),
      )
    ),
  );
  const remote = await Promise.all(children.map(childSummary));
  const elapsed = Date.now() - started;

  // A request whose loop failed was never acknowledged, so GC could never
  // collect it: say why first, not that GC waited.
  const failed = [...local, ...remote].flatMap((s) => s.errors);
  assert.deepEqual(failed.slice(0, 5), [], `${failed.length} queue calls failed`);
  // Everything was acknowledged: GC until both files are empty of requests.
  const gcQueue = queues[0]!;
  let lastCounts: unknown;
  await waitFor(async () => {
    await gcQueue.gc();
    const counts = queueCounts(q.queueDir);
    lastCounts = counts;
    return counts.requests === 0 && counts.results === 0;
  }, { timeoutMs: 30_000, what: "acknowledged rows to be collected" }).catch((error) => {
    throw new Error(`${error.message}: ${JSON.stringify(lastCounts)}`);
  });
  const beats = observer.stop();
  for (const queue of queues) queue.close();
  observerQueue.close();
  const status = await runner.stop("SIGTERM");
  assert.equal(status.code, 0, "runner did not stop cleanly");

  const all = [...local, ...remote];
  const sum = (pick: (s: StressSummary) => number): number => all.reduce((n, s) => n + pick(s), 0);
  const requests = sum((s) => s.requests);
  const results = sum((s) => s.results);
  const distinct = new Set(all.flatMap((s) => s.toolUseIds)).size;
  const errors = all.flatMap((s) => s.errors);
  const mismatches = all.flatMap((s) => s.mismatches);
  const busy = sum((s) => s.busyErrors);
  const maxGapMs = Math.max(beats.maxGapMs, ...remote.map((s) => s.heartbeat?.maxGapMs ?? 0));
  const maxSeqStep = Math.max(beats.maxSeqStep, ...remote.map((s) => s.heartbeat?.maxSeqStep ?? 0));
  const unreadable = beats.unreadable +
    remote.reduce((n, s) => n + (s.heartbeat?.unreadable ?? 0), 0);
  const integrity = integrityOfQueue(q.queueDir);
  const counts = queueCounts(q.queueDir);
  const sizes = queueFileSizes(q.queueDir);

  console.log(
    `stress concurrency=${concurrency ?? 1}: ${(elapsed / 1000).toFixed(1)} s, ` +
      `${requests} requests (${remote.map((s) => s.requests).join("+")} from child processes), ` +
      `${results} results, ${(results / (elapsed / 1000)).toFixed(0)} req/s, ` +
      `max heartbeat gap ${maxGapMs} ms (seq step ${maxSeqStep}, ${beats.beats} beats seen here, ` +
      `observer max sample interval ${beats.maxSampleIntervalMs} ms), ` +
      `inbound.db ${sizes.inbound} B, outbound.db ${sizes.outbound} B, rows left ${
        JSON.stringify(counts)
      }`,
  );

  assert.deepEqual(errors, [], `${errors.length} errors (${busy} busy)`);
  assert.equal(busy, 0);
  assert.deepEqual(mismatches, []);
  assert.ok(results > 0, "nothing completed");
  assert.ok(remote.every((s) => s.results > 0), "a client process completed nothing");
  assert.equal(requests, distinct, "tool-use ids were not unique");
  assert.equal(results, requests, "a request got no result");
  assert.equal(unreadable, 0, "the heartbeat was unreadable");
  assert.ok(beats.beats > 0, "no heartbeat seen during the load");
  assert.ok(maxGapMs < MAX_HEARTBEAT_GAP_MS, `heartbeat gap ${maxGapMs} ms`);
  assert.deepEqual(integrity, { inbound: "ok", outbound: "ok" });
  assert.deepEqual(counts, { requests: 0, cancels: 0, acks: 0, states: 0, chunks: 0, results: 0 });
  assert.ok(
    sizes.inbound < MAX_FILE_BYTES && sizes.outbound < MAX_FILE_BYTES,
    JSON.stringify(sizes),
  );
}

Deno.test("concurrent queue load: one runner, 8 in-process hosts and 2 host processes", async () => {
  await concurrentLoad(undefined);
});

Deno.test("concurrent queue load with --concurrency 4", async () => {
  await concurrentLoad(4);
});

Deno.test("a reader holding outbound.db past busy_timeout delays results but loses none", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const running = await queue.submit({ shell: "echo a >> ran.log; sleep 0.5; echo out-a" });
  const queued = await queue.submit({ shell: "echo b >> ran.log; echo out-b" });
  await waitFor(
    () => queue.state(running).state === "started" && queue.state(queued).state === "accepted",
    { what: "start" },
  );
  // From here the runner's next writes (the first result, the next start) hit the lock.
  const reader = openDatabase(queuePaths(q.queueDir).outbound, { role: "reader" });
  reader.exec("BEGIN");
  reader.prepare("SELECT count(*) AS n FROM states").get();
  await delay(BUSY_TIMEOUT_MS + 2000); // every runner write in this window times out
  reader.exec("COMMIT");
  reader.close();
  // A dropped write would leave the request "started" under a live runner: waits
  // would hang, so they are bounded (generously) to fail instead.
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(new Error("result never arrived")), 60_000);
  const [a, b] = await Promise.all([
    queue.collect(running, { signal: abort.signal }),
    queue.collect(queued, { signal: abort.signal }),
  ]).finally(() => clearTimeout(timer));
  assert.deepEqual([a.result.exitCode, text(a.stdout)], [0, "out-a\n"]);
  assert.deepEqual([b.result.exitCode, text(b.stdout)], [0, "out-b\n"], JSON.stringify(b.result));
  assert.equal(await Deno.readTextFile(join(q.workspace, "ran.log")), "a\nb\n");
  queue.close();
});
