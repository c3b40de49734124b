// deno-lint-ignore-file no-console
/**
 * Integrity after kill: real runner and host processes SIGKILLed while they
 * write the queue files, half the time at a random moment and half the time
 * aimed inside a commit (once SQLite's rollback journal is hot). Afterwards
 * both files pass `PRAGMA integrity_check`, nothing durable is lost, no
 * request runs twice, and every request ends with exactly one result.
 *
 * `WAFFLE_KILL_LOOPS` sets the runner kill iterations (default 20),
 * `WAFFLE_HOST_KILL_LOOPS` the host writer kill iterations (default 20).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { openDatabase } from "../lib/queue/connection.ts";
import { SandboxFileError } from "../lib/errors.ts";
import { type ExecResult, HEARTBEAT_INTERVAL_MS } from "../lib/queue/protocol.ts";
import { type Collected, Queue } from "../lib/queue/queue.ts";
import { queuePaths } from "../lib/queue/schema.ts";
import { delay, startRunner, tempQueue, text, waitFor } from "./_helpers.ts";
import {
  envNumber,
  hotJournal,
  integrityOfQueue,
  killInsideCommit,
  queueCounts,
  queueFileSizes,
  spawnClient,
} from "./_stress_client.ts";

const OK = { inbound: "ok", outbound: "ok" };

/** How many times each tool-use id appears in a command log. */
async function runCounts(log: string): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  const content = await Deno.readTextFile(log).catch(() => "");
  for (const line of content.split("\n")) {
    if (line !== "") counts.set(line, (counts.get(line) ?? 0) + 1);
  }
  return counts;
}

interface Sent {
  id: string;
  toolUseId: string;
  lines: number;
}

// Logs the tool-use id first (so a second run would show), then writes up to
// ~400 KB (several chunk commits), pauses (a timer flush), then stderr and a last line.
function command(toolUseId: string, lines: number): string {
  return `echo ${toolUseId} >> ran.log; yes ${toolUseId} | head -n ${lines}; sleep 0.02; ` +
    `echo "${toolUseId} err" >&2; echo "${toolUseId} end"`;
}

// A request's result from the host's view, or undefined while the host has
// no copy of the file to read yet (the file is locked or half-written).
function readAround(queue: Queue, id: string): ExecResult | undefined {
  try {
    return queue.state(id).result;
  } catch (error) {
    if (error instanceof SandboxFileError && error.problem === "busy") return undefined;
    throw error;
  }
}

function expectedStdout(sent: Sent): string {
  return `${sent.toolUseId}\n`.repeat(sent.lines) + `${sent.toolUseId} end\n`;
}

Deno.test("integrity after kill: a runner SIGKILLed mid-write loses nothing and runs nothing twice", async () => {
  const loops = envNumber("WAFFLE_KILL_LOOPS", 20);
  await using q = await tempQueue();
  const paths = queuePaths(q.queueDir);
  const queue = Queue.open(q.queueDir);
  const sent: Sent[] = [];
  const seen = new Map<string, ExecResult>(); // results read before some kill
  const startedAtDeath = new Set<string>();
  let aimedKills = 0; // sent once the journal was hot
  let hotKills = 0; // landed inside a commit: the journal was still hot after death

  for (let loop = 0; loop < loops; loop++) {
    await using runner = await startRunner(q.queueDir, {
      workspace: q.workspace,
      concurrency: loop % 4 < 2 ? 1 : 3,
    });
    const burst = Array.from({ length: 4 + Math.floor(Math.random() * 5) }, (_, i) => ({
      toolUseId: `k${loop}-${i}`,
      lines: 1 + Math.floor(Math.random() * 60_000),
    }));
    const ids = await Promise.all(
      burst.map((b) =>
        queue.submit({ argv: ["sh", "-c", command(b.toolUseId, b.lines)], toolUseId: b.toolUseId })
      ),
    );
    burst.forEach((b, i) => sent.push({ ...b, id: ids[i]! }));
    await delay(Math.random() * 100);
    for (const { id } of sent) {
      const { result } = queue.state(id);
      if (result !== undefined && !seen.has(id)) seen.set(id, result);
    }
    const kill = (): void => runner.child.kill("SIGKILL");
    // Every other kill aims inside a commit; from half way, every kill does while none has
    // landed there, waiting long enough to meet a heartbeat's commit should the runner be idle.
    const mustLand = hotKills === 0 && loop >= Math.floor(loops / 2);
    if (loop % 2 === 1 || mustLand) {
      const withinMs = mustLand ? 2 * HEARTBEAT_INTERVAL_MS : 50 + Math.random() * 100;
      if (killInsideCommit(paths.outbound, kill, withinMs)) aimedKills++;
    } else kill();
    await runner.stop("SIGKILL");
    const journal = `${paths.outbound}-journal`;
    const hot = hotJournal(paths.outbound) ? Deno.readFileSync(journal) : undefined;
    if (hot !== undefined) hotKills++;

    // The host reads around a hot journal (its last consistent copy) and
    // never opens, rolls back or deletes it: only the file's owner does.
    for (const [id, result] of seen) {
      assert.deepEqual(readAround(queue, id) ?? result, result, `result of ${id} changed`);
    }
    if (hot !== undefined) {
      assert.deepEqual(Deno.readFileSync(journal), hot, "the host touched the hot journal");
    }
    // What the next runner does first, as the owner: roll back, then recover.
    const owner = openDatabase(paths.outbound, { role: "owner" });
    for (
      const row of owner.prepare(
        "SELECT request_id FROM states s WHERE state = 'started' AND NOT EXISTS (SELECT 1 FROM results r WHERE r.request_id = s.request_id)",
      ).all() as { request_id: string }[]
    ) startedAtDeath.add(row.request_id);
    owner.close();
    assert.equal(hotJournal(paths.outbound), false, "the owner did not roll back the hot journal");
    assert.deepEqual(integrityOfQueue(q.queueDir), OK, `after kill ${loop}`);
  }

  await using last = await startRunner(q.queueDir, { workspace: q.workspace });
  const collected = new Map<string, Collected>();
  for (const { id } of sent) collected.set(id, await queue.collect(id));
  const runs = await runCounts(join(q.workspace, "ran.log"));
  let interrupted = 0;
  for (const s of sent) {
    const { result, stdout, stderr } = collected.get(s.id)!;
    assert.equal(result.requestId, s.id);
    const ran = runs.get(s.toolUseId) ?? 0;
    assert.ok(ran <= 1, `${s.toolUseId} ran ${ran} times`);
    if (result.interrupted) {
      interrupted++;
      assert.ok(startedAtDeath.has(s.id), `${s.toolUseId} interrupted but not started at a kill`);
      assert.equal(result.exitCode, null);
    } else {
      assert.ok(!startedAtDeath.has(s.id), `${s.toolUseId} was started at a kill yet completed`);
      assert.equal(ran, 1, `${s.toolUseId} completed but its command did not run exactly once`);
      assert.equal(result.exitCode, 0, `${s.toolUseId}: ${JSON.stringify(result)}`);
      assert.equal(text(stdout), expectedStdout(s));
      assert.equal(text(stderr), `${s.toolUseId} err\n`);
    }
    const before = seen.get(s.id);
    if (before !== undefined) assert.deepEqual(result, before, `result of ${s.toolUseId} changed`);
  }
  assert.equal(interrupted, startedAtDeath.size);
  const known = new Set(sent.map((s) => s.toolUseId));
  for (const toolUseId of runs.keys()) assert.ok(known.has(toolUseId), `unknown run ${toolUseId}`);
  const counts = queueCounts(q.queueDir);
  assert.equal(counts.requests, sent.length);
  assert.equal(counts.results, sent.length, "not exactly one result per request");
  queue.close();
  assert.equal((await last.stop("SIGTERM")).code, 0);
  assert.deepEqual(integrityOfQueue(q.queueDir), OK);
  console.log(
    `runner kill loop: ${loops} SIGKILLs (${aimedKills} aimed at a hot journal, ` +
      `${hotKills} inside a commit: hot outbound journal after death), ` +
      `${sent.length} requests, ${
        sent.length - interrupted
      } completed, ${interrupted} interrupted, ` +
      `${runs.size} commands ran, ${seen.size} results re-read after kills, ` +
      `sizes ${JSON.stringify(queueFileSizes(q.queueDir))}`,
  );
  assert.ok(hotKills > 0, `none of ${loops} kills (${aimedKills} aimed) landed inside a commit`);
});

Deno.test("integrity after kill: a host SIGKILLed mid-submit leaves intact files and loses no durable request", async () => {
  const loops = envNumber("WAFFLE_HOST_KILL_LOOPS", 20);
  await using q = await tempQueue();
  const paths = queuePaths(q.queueDir);
  // The runner serves the queue throughout: it reads inbound.db while hosts die mid-commit.
  await using runner = await startRunner(q.queueDir, { workspace: q.workspace, concurrency: 4 });
  const reported = new Map<string, string>(); // tool-use id -> request id, printed once durable
  let aimedKills = 0; // sent once the journal was hot
  let hotKills = 0; // landed inside a commit: the journal was still hot after death

  for (let loop = 0; loop < loops; loop++) {
    const child = spawnClient(["writer", q.queueDir, `h${loop}`, "4"]);
    let output = "";
    let exited = false;
    const pump = (async (): Promise<void> => {
      for await (const piece of child.stdout.pipeThrough(new TextDecoderStream())) output += piece;
    })();
    const status = child.status.then((s) => {
      exited = true;
      return s;
    });
    await waitFor(() => output.startsWith("ready\n") || exited, {
      timeoutMs: 30_000,
      what: "writer to start",
    });
    assert.ok(!exited, "writer exited before it was killed");
    const kill = (): void => child.kill("SIGKILL");
    // Every other kill aims inside a commit; from half way, every kill does while none has
    // landed there.
    if (loop % 2 === 1 || (hotKills === 0 && loop >= Math.floor(loops / 2))) {
      if (killInsideCommit(paths.inbound, kill, 100)) aimedKills++;
    } else {
      await delay(Math.random() * 50);
      kill();
    }
    assert.equal((await status).signal, "SIGKILL");
    await pump;
    // Only complete lines: the last one may have been cut by the kill.
    for (const line of output.split("\n").slice(1, -1)) {
      const [toolUseId, id] = line.split(" ");
      reported.set(toolUseId!, id!);
    }
    if (hotJournal(paths.inbound)) {
      hotKills++;
      // The runner reads inbound.db read-only: it never rolls back the host's
      // journal (it waits); the next host to open the queue does.
      await delay(300);
      assert.equal(hotJournal(paths.inbound), true, "the runner touched the host's journal");
    }
    Queue.open(q.queueDir).close();
    assert.equal(hotJournal(paths.inbound), false, "the next host did not roll back its journal");
    assert.deepEqual(integrityOfQueue(q.queueDir), OK, `after kill ${loop}`);
  }

  const queue = Queue.open(q.queueDir);
  const inbound = openDatabase(paths.inbound, { role: "reader" });
  const requests = inbound.prepare("SELECT id, tool_use_id FROM requests ORDER BY seq").all() as {
    id: string;
    tool_use_id: string;
  }[];
  inbound.close();
  const stored = new Map(requests.map((row) => [row.tool_use_id, row.id]));
  for (const [toolUseId, id] of reported) {
    assert.equal(stored.get(toolUseId), id, `lost ${toolUseId}`);
  }
  // Durable requests of a killed host, reported or not, are all served exactly once.
  for (const { id, tool_use_id: toolUseId } of requests) {
    const { result, stdout } = await queue.collect(id);
    assert.equal(result.exitCode, 0, `${toolUseId}: ${JSON.stringify(result)}`);
    assert.equal(text(stdout), `${toolUseId}\n`);
  }
  const runs = await runCounts(join(q.workspace, "ran.log"));
  for (const { tool_use_id: toolUseId } of requests) {
    assert.equal(runs.get(toolUseId), 1, `${toolUseId} runs`);
  }
  assert.equal(runs.size, requests.length, "a command ran that has no request");
  assert.equal(queueCounts(q.queueDir).results, requests.length);
  queue.close();
  assert.equal((await runner.stop("SIGTERM")).code, 0);
  assert.deepEqual(integrityOfQueue(q.queueDir), OK);
  console.log(
    `host kill loop: ${loops} SIGKILLs (${aimedKills} aimed at a hot journal, ` +
      `${hotKills} inside a commit: hot inbound journal after death), ` +
      `${requests.length} requests in inbound.db, ${reported.size} reported durable, ` +
      `${requests.length - reported.size} durable but unreported, ` +
      `sizes ${JSON.stringify(queueFileSizes(q.queueDir))}`,
  );
  assert.ok(hotKills > 0, `none of ${loops} kills (${aimedKills} aimed) landed inside a commit`);
});
