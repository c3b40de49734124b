/**
 * The runner through the queue: a real `waffle runner` process, real
 * commands, signals and SIGKILLs.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Queue } from "../lib/queue/queue.ts";
import { STALE_AFTER_MS } from "../lib/queue/liveness.ts";
import { RunnerError } from "../lib/errors.ts";
import { EXIT_LOCKED } from "../lib/exit_codes.ts";
import { alive, delay, startRunner, tempQueue, text, waitFor } from "./_helpers.ts";

Deno.test("runner reports the exit code matrix exactly", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  await Deno.writeTextFile(join(q.workspace, "noexec.sh"), "#!/bin/sh\necho hi\n");
  const queue = Queue.open(q.queueDir);
  const cases: [string[], number | null, string | null][] = [
    [["true"], 0, null],
    [["false"], 1, null],
    [["sh", "-c", "exit 23"], 23, null],
    [["sh", "-c", "exit 124"], 124, null],
    [["./noexec.sh"], 126, null],
    [["definitely-not-a-command-xyz"], 127, null],
    [["sh", "-c", "kill -KILL $$"], 137, "SIGKILL"],
    [["sh", "-c", "kill -TERM $$"], 143, "SIGTERM"],
  ];
  for (const [argv, exitCode, signal] of cases) {
    const id = await queue.submit({ argv });
    const result = await queue.wait(id);
    assert.equal(result.exitCode, exitCode, argv.join(" "));
    assert.equal(result.signal, signal, argv.join(" "));
    assert.equal(result.timedOut, false, argv.join(" "));
  }
  queue.close();
});

Deno.test("runner streams stdout and stderr apart, in order, while the command runs", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const marker = join(q.root, "go");
  const id = await queue.submit({
    argv: [
      "sh",
      "-c",
      `echo one; echo e1 >&2; while [ ! -e ${marker} ]; do sleep 0.02; done; echo two`,
    ],
  });
  const stream = queue.output(id);
  const first = await stream.next();
  assert.equal(first.done, false);
  // Output arrived before the command could finish: it is still waiting for the marker.
  assert.equal(queue.state(id).state, "started");
  await Deno.writeTextFile(marker, "");
  const seen: Record<string, string> = { stdout: "", stderr: "" };
  if (!first.done) seen[first.value.stream] += text(first.value.data);
  for await (const chunk of { [Symbol.asyncIterator]: () => stream }) {
    seen[chunk.stream] += text(chunk.data);
  }
  assert.equal(seen.stdout, "one\ntwo\n");
  assert.equal(seen.stderr, "e1\n");
  queue.close();
});

Deno.test("runner enforces the output cap and flags truncation", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const id = await queue.submit({
    argv: ["sh", "-c", "head -c 300000 /dev/zero; head -c 10 /dev/zero >&2"],
    outputCap: 100_000,
  });
  const { result, stdout, stderr } = await queue.collect(id);
  assert.equal(stdout.byteLength, 100_000);
  assert.equal(result.stdoutTruncated, true);
  assert.equal(result.stdoutBytes, 300_000);
  assert.equal(stderr.byteLength, 10);
  assert.equal(result.stderrTruncated, false);
  queue.close();
});

Deno.test("runner passes stdin bytes, or a closed stdin", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const bytes = new Uint8Array(200_000).map((_, i) => i % 251);
  const piped = await queue.collect(await queue.submit({ argv: ["cat"], stdin: bytes }));
  assert.deepEqual(piped.stdout, bytes);
  const closed = await queue.collect(await queue.submit({ argv: ["cat"] }));
  assert.equal(closed.result.exitCode, 0);
  assert.equal(closed.stdout.byteLength, 0);
  queue.close();
});

Deno.test("runner timeout kills a setsid escapee; exit 124 of its own is ordinary", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const pidFile = join(q.workspace, "escapee.pid");
  const id = await queue.submit({
    argv: ["sh", "-c", `setsid sh -c 'echo $$ > ${pidFile}; exec sleep 1000' & sleep 1000`],
    timeoutMs: 500,
  });
  const result = await queue.wait(id);
  assert.equal(result.timedOut, true);
  const escapee = Number(await Deno.readTextFile(pidFile));
  assert.ok(escapee > 0);
  await waitFor(() => !alive(escapee), { what: `escapee ${escapee} to die` });
  const ordinary = await queue.wait(
    await queue.submit({ argv: ["sh", "-c", "exit 124"], timeoutMs: 30_000 }),
  );
  assert.equal(ordinary.exitCode, 124);
  assert.equal(ordinary.timedOut, false);
  queue.close();
});

Deno.test("runner returns when the foreground exits even if a background child holds stdout", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const pidFile = join(q.workspace, "bg.pid");
  const id = await queue.submit({
    argv: ["sh", "-c", `sleep 1000 & echo $! > ${pidFile}; echo done`],
  });
  const { result, stdout } = await queue.collect(id);
  assert.equal(result.exitCode, 0);
  assert.equal(text(stdout), "done\n");
  const child = Number(await Deno.readTextFile(pidFile));
  await waitFor(() => !alive(child), { what: "background child to die" });
  queue.close();
});

Deno.test("cancel kills a running request's tree and skips a queued one", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  // Closed however the test ends: a queue left open keeps an inotify watch
  // that later tests of this process count as theirs.
  try {
    const running = await queue.submit({ argv: ["sleep", "1000"] });
    const queued = await queue.submit({ argv: ["echo", "never"] });
    await waitFor(() => queue.state(running).state === "started", { what: "start" });
    await queue.cancel(queued);
    await queue.cancel(running);
    const a = await queue.wait(running);
    assert.equal(a.cancelled, true);
    assert.equal(a.signal, "SIGTERM");
    const b = await queue.collect(queued);
    assert.equal(b.result.cancelled, true);
    assert.equal(b.result.exitCode, null);
    assert.equal(b.stdout.byteLength, 0);
  } finally {
    queue.close();
  }
});

Deno.test("runner rejects a cwd outside the workspace and bad env, running nothing", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  await Deno.symlink("/etc", join(q.workspace, "link"));
  const queue = Queue.open(q.queueDir);
  const marker = join(q.root, "ran");
  for (const cwd of ["..", "/etc", "link", "missing-dir"]) {
    const { result } = await queue.collect(await queue.submit({ argv: ["touch", marker], cwd }));
    assert.equal(result.exitCode, null, cwd);
    assert.match(result.error ?? "", /Working directory|workspace/, cwd);
  }
  const env = await queue.collect(
    await queue.submit({ argv: ["touch", marker], env: { WAFFLE_REQUEST_ID: "x" } }),
  );
  assert.equal(env.result.exitCode, null);
  assert.match(env.result.error ?? "", /WAFFLE_REQUEST_ID/);
  await assert.rejects(Deno.stat(marker), Deno.errors.NotFound);
  const inside = await queue.collect(await queue.submit({ argv: ["pwd"], cwd: "." }));
  assert.equal(text(inside.stdout).trim(), await Deno.realPath(q.workspace));
  queue.close();
});

Deno.test("runner passes only the requested environment, never its own", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const { stdout } = await queue.collect(
    await queue.submit({ argv: ["env"], env: { ONLY_THIS: "1" } }),
  );
  const names = text(stdout).trim().split("\n").map((line) => line.split("=")[0]).sort();
  assert.deepEqual(names, ["HOME", "LANG", "ONLY_THIS", "PATH", "TMPDIR", "WAFFLE_REQUEST_ID"]);
  queue.close();
});

Deno.test("requests of one queue run one at a time in submission order", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const log = join(q.workspace, "log");
  const ids = await Promise.all(
    Array.from(
      { length: 6 },
      (_, i) =>
        queue.submit({
          argv: ["sh", "-c", `echo start ${i} >> ${log}; sleep 0.05; echo end ${i} >> ${log}`],
        }),
    ),
  );
  for (const id of ids) await queue.wait(id);
  const lines = (await Deno.readTextFile(log)).trim().split("\n");
  assert.deepEqual(lines, Array.from({ length: 6 }, (_, i) => [`start ${i}`, `end ${i}`]).flat());
  queue.close();
});

Deno.test("a host restart re-attaches by id and gets the result and output", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const first = Queue.open(q.queueDir);
  const id = await first.submit({ argv: ["sh", "-c", "echo early; sleep 0.3; echo late"] });
  first.close(); // the host goes away
  const second = Queue.open(q.queueDir);
  const { result, stdout } = await second.collect(id);
  assert.equal(result.exitCode, 0);
  assert.equal(text(stdout), "early\nlate\n");
  second.close();
});

Deno.test("a runner SIGKILLed mid-command leaves it interrupted, never re-run", async () => {
  await using q = await tempQueue();
  const queue = Queue.open(q.queueDir);
  const counter = join(q.workspace, "runs");
  const unique = `${1000 + Math.floor(Math.random() * 1e6)}`;
  const id = await queue.submit({
    argv: ["sh", "-c", `echo run >> ${counter}; exec sleep ${unique}`],
  });
  const runner = await startRunner(q.queueDir, { workspace: q.workspace });
  await waitFor(() => queue.state(id).state === "started", { what: "start" });
  await waitFor(async () => (await Deno.readTextFile(counter).catch(() => "")).length > 0);
  await runner.stop("SIGKILL");
  // The dead runner's orphan tree is the subreaper's no longer; kill it for hygiene.
  await new Deno.Command("pkill", { args: ["-f", `sleep ${unique}`] }).output();
  await using _again = await startRunner(q.queueDir, { workspace: q.workspace });
  const result = await queue.wait(id);
  assert.equal(result.interrupted, true);
  assert.equal(result.exitCode, null);
  await delay(200);
  assert.equal(await Deno.readTextFile(counter), "run\n", "the request ran twice");
  queue.close();
});

Deno.test("SIGTERM to the runner kills running trees, records them interrupted and exits 0", async () => {
  await using q = await tempQueue();
  const runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const id = await queue.submit({ argv: ["sleep", "1000"] });
  await waitFor(() => queue.state(id).state === "started", { what: "start" });
  const status = await runner.stop("SIGTERM");
  assert.equal(status.code, 0);
  const result = await queue.wait(id).catch((e) => e);
  assert.ok(!(result instanceof Error), String(result));
  assert.equal(result.interrupted, true);
  assert.equal(queue.heartbeat()?.state, "exited");
  queue.close();
});

Deno.test("runner idle exit stops after the idle time; 0 means never", async () => {
  await using q = await tempQueue();
  const idle = await startRunner(q.queueDir, { workspace: q.workspace, idleExitSeconds: 0.5 });
  const status = await idle.child.status;
  assert.equal(status.code, 0);
  const queue = Queue.open(q.queueDir);
  assert.equal(queue.heartbeat()?.state, "exited");
  await using never = await startRunner(q.queueDir, { workspace: q.workspace, idleExitSeconds: 0 });
  await delay(1500);
  assert.equal(queue.heartbeat()?.state, "running");
  assert.ok(alive(never.pid));
  queue.close();
});

Deno.test("a second runner on the same queue is refused", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const second = await startRunner(q.queueDir, { workspace: q.workspace, waitReady: false });
  const status = await second.child.status;
  assert.equal(status.code, EXIT_LOCKED);
});

Deno.test("wait without a runner fails with a clear error within the staleness limit", async () => {
  await using q = await tempQueue();
  const queue = Queue.open(q.queueDir);
  const id = await queue.submit({ argv: ["true"] });
  const started = Date.now();
  await assert.rejects(
    queue.wait(id),
    (error: unknown) =>
      error instanceof RunnerError && /No runner has served queue/.test(error.message),
  );
  assert.ok(Date.now() - started < STALE_AFTER_MS + 2000, "the wait must be bounded");
  queue.close();
});
