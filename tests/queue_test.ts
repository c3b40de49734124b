/**
 * The queue protocol: pragmas, schema versions, the one-writer rule, group
 * commit, validation, exactly-once submission, GC and hostile outbound rows.
 * Real SQLite files and a real runner process; nothing is mocked.
 */
import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { openDatabase } from "../lib/queue/connection.ts";
import { Queue } from "../lib/queue/queue.ts";
import { RunnerQueue } from "../lib/queue/runner_queue.ts";
import { notRunResult, resultSchema, SCHEMA_VERSION } from "../lib/queue/protocol.ts";
import { initQueue, OUTBOUND_SCHEMA, queuePaths } from "../lib/queue/schema.ts";
import { SandboxFile, SMALL_FILE_BYTES } from "../lib/queue/sandbox_file.ts";
import {
  ProtocolError,
  QueueError,
  RunnerError,
  SandboxFileError,
  UsageError,
} from "../lib/errors.ts";
import { EXIT_NOT_FOUND, EXIT_RUNNER_FAILED } from "../lib/exit_codes.ts";
import { delay, startRunner, tempQueue, text, waitFor } from "./_helpers.ts";
import { spawnClient } from "./_stress_client.ts";

// The SQLite file change counter (header bytes 24..27) moves on every write
// transaction in rollback-journal mode: it proves who wrote a file.
function changeCounter(path: string): number {
  const header = Deno.readFileSync(path).subarray(24, 28);
  return new DataView(header.buffer, header.byteOffset, 4).getUint32(0);
}

Deno.test("openDatabase() sets TRUNCATE, FULL and busy_timeout 5000 and checks them", async () => {
  await using q = await tempQueue();
  const db = openDatabase(queuePaths(q.queueDir).inbound, { role: "owner" });
  const one = (sql: string): unknown => Object.values(db.prepare(sql).get() as object)[0];
  assert.equal(one("PRAGMA journal_mode"), "truncate");
  assert.equal(one("PRAGMA synchronous"), 2);
  assert.equal(one("PRAGMA busy_timeout"), 5000);
  db.close();
});

Deno.test("openDatabase() rejects another schema version, naming both", async () => {
  await using q = await tempQueue();
  const path = queuePaths(q.queueDir).outbound;
  const raw = new DatabaseSync(path);
  raw.exec("PRAGMA user_version = 7");
  raw.close();
  assert.throws(
    () => openDatabase(path, { role: "reader" }),
    (error: unknown) =>
      error instanceof QueueError && /schema version 7/.test(error.message) &&
      new RegExp(`speaks ${SCHEMA_VERSION}`).test(error.message),
  );
});

Deno.test("the host's copy of outbound.db fails the same schema-version check", async () => {
  await using q = await tempQueue();
  const path = queuePaths(q.queueDir).outbound;
  const raw = new DatabaseSync(path);
  raw.exec("PRAGMA user_version = 7");
  raw.close();
  let opened = "";
  assert.throws(() => openDatabase(path, { role: "reader" }), (error: unknown) => {
    opened = error instanceof QueueError ? error.message : "";
    return opened !== "";
  });
  const file = new SandboxFile(path, {
    schema: OUTBOUND_SCHEMA,
    maxValueBytes: 1024 * 1024,
    maxFileBytes: SMALL_FILE_BYTES,
  });
  try {
    assert.throws(
      () => file.read(() => 0),
      (error: unknown) =>
        error instanceof SandboxFileError && error.problem === "damaged" &&
        error.message === opened,
    );
  } finally {
    file.close();
  }
  assert.equal(
    opened,
    `Queue file '${path}' has schema version 7, this waffle speaks ${SCHEMA_VERSION}`,
  );
});

Deno.test("a read that fails leaves no stale deferral or lock behind for the wait to trust", async () => {
  await using q = await tempQueue();
  RunnerQueue.open(q.queueDir).close();
  const path = queuePaths(q.queueDir).outbound;
  const raw = new DatabaseSync(path);
  const insert = raw.prepare(
    "INSERT INTO chunks (request_id, stream, seq, data) VALUES ('r', 'stdout', ?, ?)",
  );
  let seq = 0;
  const grow = (mib: number): void => {
    raw.exec("BEGIN");
    for (let i = 0; i < mib * 16; i++) insert.run(seq++, new Uint8Array(64 * 1024));
    raw.exec("COMMIT");
  };
  grow(3);
  const file = new SandboxFile(path, {
    schema: OUTBOUND_SCHEMA,
    maxValueBytes: 1024 * 1024,
    maxFileBytes: 4 * 1024 * 1024,
  });
  try {
    file.read(() => 0);
    // A change right after a copy of 3 MiB: the next copy is not due yet.
    raw.exec("DELETE FROM chunks WHERE seq = 0");
    file.read(() => 0);
    assert.ok(file.deferredUntil !== undefined, "the second read served the older copy");
    // What a wait judges by: the copy served differs from the file, and the
    // next copy is due later (whatever another read of the file did since).
    const served = file.servedVersion;
    assert.ok(served !== undefined && served !== file.version());
    assert.ok(file.nextCopyAt > Date.now() - 1000);
    file.read(() => 0);
    assert.equal(file.servedVersion, served, "a read before the copy is due keeps serving it");
    grow(2);
    assert.throws(
      () => file.read(() => 0),
      (error: unknown) => error instanceof SandboxFileError && error.problem === "damaged",
    );
    // Else a wait sleeps "until the next copy" and reads again, forever,
    // never judging (and reviving) the runner.
    assert.equal(file.deferredUntil, undefined);
    assert.equal(file.busySince, undefined);
  } finally {
    file.close();
    raw.close();
  }
});

Deno.test("notRunResult() builds a valid result that ran nothing", () => {
  const lost = notRunResult("r1", { interrupted: true, endedAt: 5, error: "Lost" });
  assert.deepEqual(lost, {
    requestId: "r1",
    exitCode: null,
    signal: null,
    timedOut: false,
    interrupted: true,
    cancelled: false,
    stdoutTruncated: false,
    stderrTruncated: false,
    stdoutBytes: 0,
    stderrBytes: 0,
    startedAt: null,
    endedAt: 5,
    durationMs: 0,
    error: "Lost",
  });
  const rejected = notRunResult("r2", { exitCode: EXIT_NOT_FOUND, startedAt: 10, endedAt: 12 });
  assert.equal(rejected.durationMs, 2);
  for (const result of [lost, rejected, notRunResult("r3", { cancelled: true })]) {
    assert.deepEqual(resultSchema.parse(result), result, "the host accepts what the runner writes");
  }
});

Deno.test("initQueue() upgrades a version 2 inbound.db in place, keeping its requests", async () => {
  await using q = await tempQueue();
  const path = queuePaths(q.queueDir).inbound;
  const raw = new DatabaseSync(path);
  raw.exec("DROP TABLE input; DROP TABLE sessions; DROP TABLE tty; PRAGMA user_version = 2");
  raw.exec(
    "INSERT INTO requests (id, tool_use_id, kind, payload, created_at) VALUES ('r1', 'r1', 'exec', '{}', 0)",
  );
  raw.close();
  initQueue(q.queueDir);
  const db = new DatabaseSync(path);
  const version = db.prepare("PRAGMA user_version").get() as { user_version: number };
  assert.equal(version.user_version, SCHEMA_VERSION);
  assert.equal((db.prepare("SELECT count(*) AS n FROM requests").get() as { n: number }).n, 1);
  assert.equal((db.prepare("SELECT count(*) AS n FROM sessions").get() as { n: number }).n, 0);
  db.close();
});

Deno.test("openDatabase() refuses a symlinked queue file", async () => {
  await using q = await tempQueue();
  const paths = queuePaths(q.queueDir);
  await Deno.rename(paths.outbound, `${paths.outbound}.real`);
  await Deno.symlink(`${paths.outbound}.real`, paths.outbound);
  assert.throws(() => openDatabase(paths.outbound, { role: "reader" }), /is not a regular file/);
});

Deno.test("Queue.open() without create names the missing directory", () => {
  assert.throws(
    () => Queue.open("/nonexistent/waffle-q"),
    /Queue directory '\/nonexistent\/waffle-q'/,
  );
});

Deno.test("the host never writes outbound.db and the runner never writes inbound.db", async () => {
  await using q = await tempQueue();
  const paths = queuePaths(q.queueDir);
  const outboundBefore = changeCounter(paths.outbound);
  const queue = Queue.open(q.queueDir);
  const id = await queue.submit({ argv: ["true"] });
  await queue.cancel(id);
  queue.state(id);
  await queue.ack(id);
  await queue.gc();
  queue.close();
  assert.equal(
    changeCounter(paths.outbound),
    outboundBefore,
    "host operations changed outbound.db",
  );

  const inboundBefore = changeCounter(paths.inbound);
  const runner = RunnerQueue.open(q.queueDir);
  runner.recover();
  runner.newRequests();
  await runner.accept(["x"], "boot");
  await runner.start("x", "boot", 1);
  await runner.appendChunks("x", [{ stream: "stdout", seq: 0, data: new Uint8Array([1]) }]);
  await runner.collectAcked();
  runner.close();
  assert.equal(changeCounter(paths.inbound), inboundBefore, "runner operations changed inbound.db");
  assert.notEqual(
    changeCounter(paths.outbound),
    outboundBefore,
    "runner writes must reach outbound.db",
  );
});

Deno.test("the side that does not own a file opens it read-only", async () => {
  await using q = await tempQueue();
  const reader = openDatabase(queuePaths(q.queueDir).inbound, { role: "reader" });
  assert.throws(
    () => reader.exec("INSERT INTO acks (request_id, created_at) VALUES ('x', 0)"),
    /readonly/,
  );
  reader.close();
});

Deno.test("only the owner rolls back a hot journal left by a writer killed mid-commit", async () => {
  await using q = await tempQueue();
  const paths = queuePaths(q.queueDir);
  const seed = openDatabase(paths.outbound, { role: "owner" });
  seed.exec("BEGIN IMMEDIATE");
  for (let i = 0; i < 500; i++) {
    seed.prepare("INSERT INTO chunks VALUES (?, 'stdout', 0, randomblob(2000))").run(`r${i}`);
  }
  seed.exec("COMMIT");
  seed.close();
  // A child process rewrites every row with a tiny page cache (so pages spill
  // into the file before commit) and is SIGKILLed mid-transaction.
  const script = `
    import { DatabaseSync } from "node:sqlite";
    const db = new DatabaseSync(${JSON.stringify(paths.outbound)});
    db.exec("PRAGMA journal_mode=TRUNCATE; PRAGMA synchronous=FULL; PRAGMA cache_size=1; BEGIN IMMEDIATE");
    db.exec("UPDATE chunks SET data = randomblob(2000)");
    console.log("dirty");
    await new Promise(() => setInterval(() => {}, 1000));`;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.getReader();
  const first = await reader.read();
  assert.match(text(first.value ?? new Uint8Array()), /dirty/);
  child.kill("SIGKILL");
  await child.status;
  reader.releaseLock();
  await child.stdout.cancel();
  const hot = Deno.readFileSync(`${paths.outbound}-journal`);
  assert.ok(hot.byteLength > 0, "expected a hot journal");
  // The host reads through a descriptor: it never sees, rolls back or
  // deletes the journal (whose super-journal name the sandbox could craft).
  const queue = Queue.open(q.queueDir);
  queue.liveness();
  queue.close();
  assert.deepEqual(Deno.readFileSync(`${paths.outbound}-journal`), hot);
  const host = openDatabase(paths.outbound, { role: "owner" });
  assert.equal(
    (host.prepare("PRAGMA integrity_check").get() as { integrity_check: string }).integrity_check,
    "ok",
  );
  assert.equal((host.prepare("SELECT count(*) AS n FROM chunks").get() as { n: number }).n, 500);
  host.close();
});

Deno.test("Queue.submit() shares one transaction among concurrent submissions", async () => {
  await using q = await tempQueue();
  const queue = Queue.open(q.queueDir);
  await queue.syncGeneration(); // the first contact records the runner's generation
  const before = queue.commits;
  const ids = await Promise.all(Array.from({ length: 50 }, () => queue.submit({ argv: ["true"] })));
  assert.equal(new Set(ids).size, 50);
  assert.equal(queue.commits - before, 1, "50 concurrent submits should be one group commit");
  queue.close();
});

Deno.test("Queue.submit() with a known tool-use id returns the same request", async () => {
  await using q = await tempQueue();
  const queue = Queue.open(q.queueDir);
  const a = await queue.submit({ argv: ["echo", "x"], toolUseId: "toolu_1" });
  const b = await queue.submit({ argv: ["echo", "x"], toolUseId: "toolu_1" });
  assert.equal(a, b);
  await assert.rejects(
    queue.submit({ argv: ["echo", "y"], toolUseId: "toolu_1" }),
    (error: unknown) => error instanceof UsageError && /toolu_1/.test(error.message),
  );
  queue.close();
});

Deno.test("Queue.submit() rejects bad input with one line naming it, writing nothing", async () => {
  await using q = await tempQueue();
  const queue = Queue.open(q.queueDir);
  const counter = changeCounter(queuePaths(q.queueDir).inbound);
  const cases: [Parameters<Queue["submit"]>[0], RegExp][] = [
    [{ argv: [] }, /argv/],
    [{ argv: ["a\0b"] }, /argv/],
    [{ argv: ["true"], env: { "BAD-NAME": "x" } }, /env/],
    [{ argv: ["true"], timeoutMs: -5 }, /timeoutMs/],
    [{ argv: ["true"], outputCap: 1e12 }, /outputCap/],
    [{ argv: ["true"], shell: "true" }, /exactly one/],
    [{ argv: ["true"], toolUseId: "has space" }, /has space/],
    [{ argv: ["true"], stdin: new Uint8Array(17 * 1024 * 1024) }, /Stdin/],
  ];
  for (const [options, pattern] of cases) {
    await assert.rejects(
      Promise.resolve().then(() => queue.submit(options)),
      (error: unknown) =>
        error instanceof UsageError && pattern.test(error.message) && !error.message.includes("\n"),
      `expected ${pattern}`,
    );
  }
  queue.close();
  assert.equal(changeCounter(queuePaths(q.queueDir).inbound), counter);
});

Deno.test("Queue.state() rejects an unknown request id", async () => {
  await using q = await tempQueue();
  const queue = Queue.open(q.queueDir);
  assert.throws(() => queue.state("3f1e-none"), /No request '3f1e-none'/);
  queue.close();
});

Deno.test("acknowledged requests are garbage-collected from both files", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const ids = await Promise.all(
    Array.from({ length: 20 }, (_, i) => queue.submit({ argv: ["echo", `${i}`] })),
  );
  for (const id of ids) {
    const { stdout } = await queue.collect(id);
    assert.ok(text(stdout).length > 0);
    await queue.ack(id);
  }
  let forgotten = 0;
  for (let i = 0; i < 200 && forgotten < ids.length; i++) {
    forgotten += await queue.gc();
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  assert.equal(forgotten, ids.length);
  const count = (path: string, table: string): number => {
    const db = new DatabaseSync(path, { readOnly: true });
    const n = (db.prepare(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n;
    db.close();
    return n;
  };
  const paths = queuePaths(q.queueDir);
  for (const table of ["requests", "acks"]) assert.equal(count(paths.inbound, table), 0, table);
  for (const table of ["states", "chunks", "results"]) {
    assert.equal(count(paths.outbound, table), 0, table);
  }
  queue.close();
});

Deno.test("hostile outbound rows fail their own request and the host keeps serving", async () => {
  await using q = await tempQueue();
  const queue = Queue.open(q.queueDir);
  const paths = queuePaths(q.queueDir);
  const ids = await Promise.all(Array.from({ length: 6 }, () => queue.submit({ argv: ["true"] })));
  const [wrongType, hugeBlob, badJson, otherId, outOfOrder, overCap] = ids as [
    string,
    string,
    string,
    string,
    string,
    string,
  ];
  // Plays the part of a compromised runner writing straight into outbound.db.
  const hostile = new DatabaseSync(paths.outbound);
  hostile.exec("PRAGMA journal_mode=TRUNCATE; PRAGMA busy_timeout=5000");
  const good = (id: string): string =>
    JSON.stringify({
      requestId: id,
      exitCode: 0,
      signal: null,
      timedOut: false,
      interrupted: false,
      cancelled: false,
      stdoutTruncated: false,
      stderrTruncated: false,
      stdoutBytes: 0,
      stderrBytes: 0,
      startedAt: 1,
      endedAt: 2,
      durationMs: 1,
      error: null,
    });
  const insert = hostile.prepare(
    "INSERT INTO results (request_id, body, created_at) VALUES (?, ?, 0)",
  );
  insert.run(wrongType, good(wrongType).replace('"exitCode":0', '"exitCode":"zero"'));
  insert.run(hugeBlob, "x".repeat(8 * 1024 * 1024));
  insert.run(badJson, "{not json");
  insert.run(otherId, good(wrongType));
  const chunk = hostile.prepare(
    "INSERT INTO chunks (request_id, stream, seq, data) VALUES (?, ?, ?, ?)",
  );
  chunk.run(outOfOrder, "stdout", 5, new Uint8Array(3));
  insert.run(outOfOrder, good(outOfOrder));
  for (let i = 0; i < 20; i++) chunk.run(overCap, "stdout", i, new Uint8Array(60 * 1024));
  insert.run(overCap, good(overCap));

  const expectations: [string, RegExp][] = [
    [wrongType, /malformed/],
    [hugeBlob, /at most 16384 bytes/],
    [badJson, /not valid JSON/],
    [otherId, /names request/],
  ];
  for (const [id, pattern] of expectations) {
    await assert.rejects(
      queue.wait(id),
      (e: unknown) => e instanceof ProtocolError && pattern.test(e.message),
      id,
    );
  }
  await assert.rejects(queue.collect(outOfOrder), /out of order/);
  await assert.rejects(queue.collect(overCap), /exceeds its 1048576-byte stdout cap/);

  // A rebuilt table is not waffle's schema: the whole file is refused, and
  // no SQL of its schema runs in the host.
  hostile.exec(
    "ALTER TABLE results RENAME TO results_old; CREATE TABLE results (request_id, body, created_at); INSERT INTO results SELECT * FROM results_old;",
  );
  hostile.close();
  // Copies are rate-limited: the next one (and its verdict) comes within ms.
  await waitFor(() => queue.liveness().state === "damaged", { what: "the damage to be seen" });
  await assert.rejects(
    queue.wait(wrongType),
    (e: unknown) => e instanceof RunnerError && /not waffle's/.test(e.message),
  );

  // A runner sets the damaged file aside and starts a new generation: the
  // host marks the old generation's unfinished requests lost (interrupted,
  // never re-run) and is served again.
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  await queue.syncGeneration();
  const lost = await queue.wait(wrongType);
  assert.equal(lost.interrupted, true);
  assert.equal(lost.exitCode, null);
  const fresh = await queue.submit({ argv: ["echo", "still serving"] });
  const { result, stdout } = await queue.collect(fresh);
  assert.equal(result.exitCode, 0);
  assert.equal(text(stdout), "still serving\n");
  queue.close();
});

Deno.test("initQueue() is idempotent and keeps existing rows", async () => {
  await using q = await tempQueue();
  const queue = Queue.open(q.queueDir);
  const id = await queue.submit({ argv: ["true"] });
  queue.close();
  initQueue(q.queueDir);
  const again = Queue.open(q.queueDir, { create: true });
  assert.equal(again.state(id).state, "queued");
  again.close();
});

Deno.test("RunnerQueue.recover() never skips a request committed while it reads", async () => {
  await using q = await tempQueue();
  // Another process submits as fast as it can while this one recovers again and again.
  const writer = spawnClient(["writer", q.queueDir, "race", "1"]);
  const seen = new Set<string>();
  let horizon = 0; // every request up to here was committed before a finished read
  try {
    const deadline = Date.now() + 2000;
    while (Date.now() < deadline) {
      let runner: RunnerQueue;
      try {
        runner = RunnerQueue.open(q.queueDir);
      } catch (error) {
        // The writer commits without pause: a read-only open can meet its
        // journal mid-commit and give up (a real host pauses; the runner's
        // boot retries). Not what this test is about: try again.
        if (error instanceof QueueError) continue;
        throw error;
      }
      const recovery = runner.recover();
      // Whatever recover() did not report must come after its cursor.
      for (const request of [...recovery.pending, ...runner.newRequests()]) {
        seen.add(request.id);
        horizon = Math.max(horizon, request.seq);
      }
      runner.close();
      await delay(5);
    }
  } finally {
    writer.kill("SIGKILL");
    await writer.status;
    await writer.stdout.cancel();
  }
  // Killed mid-commit, the writer may leave a hot journal that only a
  // read-write open rolls back: the host's next open, as after a host crash.
  Queue.open(q.queueDir).close();
  const runner = RunnerQueue.open(q.queueDir);
  const recovery = runner.recover();
  runner.close();
  const all = recovery.pending.filter((request) => request.seq <= horizon);
  assert.ok(all.length > 10, `the writer committed only ${all.length} requests`);
  // Every request of the final recovery up to the horizon was seen by an
  // earlier recover() or the newRequests() right after it: none fell
  // between a read and the cursor.
  const missed = all.filter((request) => !seen.has(request.id));
  assert.deepEqual(missed.map((request) => request.seq), [], `of ${all.length} requests`);
});

Deno.test("Queue.ack() collects the inbound rows by itself (library users never call gc)", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const paths = queuePaths(q.queueDir);
  for (let i = 0; i < 5; i++) {
    const id = await queue.submit({ argv: ["true"] });
    await queue.collect(id);
    await queue.ack(id);
  }
  const count = (): number => {
    const db = new DatabaseSync(paths.inbound, { readOnly: true });
    try {
      return (db.prepare("SELECT count(*) AS n FROM requests").get() as { n: number }).n;
    } finally {
      db.close();
    }
  };
  await waitFor(() => count() === 0, { timeoutMs: 10_000, what: "inbound rows to be collected" });
  queue.close();
});

Deno.test("a runner that cannot write its results stops, and the host's wait ends", async () => {
  await using q = await tempQueue();
  // The runner's directory on a tiny filesystem the test then fills.
  const outbound = queuePaths(q.queueDir).outboundDir;
  await Deno.remove(outbound, { recursive: true });
  await Deno.mkdir(outbound);
  const mount = await new Deno.Command("mount", {
    args: ["-t", "tmpfs", "-o", "size=1m", "tmpfs", outbound],
  }).output();
  if (mount.code !== 0) throw new Error(`mount failed: ${text(mount.stderr)}`);
  try {
    await using runner = await startRunner(q.queueDir, { workspace: q.workspace });
    const queue = Queue.open(q.queueDir);
    const id = await queue.submit({ argv: ["sh", "-c", "head -c 2000000 /dev/zero"] });
    // Fill what is left, so neither output nor the result fits.
    await new Deno.Command("sh", {
      args: ["-c", `head -c 2000000 /dev/zero > '${outbound}/filler'`],
    }).output();
    const started = Date.now();
    await assert.rejects(
      queue.wait(id),
      (e: unknown) => e instanceof RunnerError && /exited|stopped beating/.test(e.message),
    );
    assert.ok(Date.now() - started < 30_000, "the wait must be bounded");
    const status = await runner.child.status;
    assert.equal(status.code, EXIT_RUNNER_FAILED, "the runner stops when it cannot write");
    queue.close();
  } finally {
    await new Deno.Command("umount", { args: ["-l", outbound] }).output();
  }
});

Deno.test("Queue.close() under a submission still on its way rejects it and throws nothing uncaught", async () => {
  await using q = await tempQueue();
  const queue = Queue.open(q.queueDir);
  // The submission reaches its group commit after close(): the scheduled
  // flush then meets a closed connection.
  const pending = queue.submit({ argv: ["true"] });
  queue.close();
  await assert.rejects(pending);
  await delay(50);
});
