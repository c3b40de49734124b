/**
 * Tests of the runner's command execution with real processes: exit codes,
 * spawn failures, output streaming and caps, stdin, timeouts, cancellation,
 * and killing whole process trees including `setsid`/double-fork escapees.
 *
 * Run with `deno test --allow-all tests/runner_exec_test.ts` (reading
 * `/proc/<pid>/environ` and FFI need it).
 *
 * @module
 */
import assert from "node:assert/strict";
import { MAX_CHUNK_BYTES, type StreamName } from "../lib/queue/protocol.ts";
import { UsageError } from "../lib/errors.ts";
import { EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, exitCodeOfSignal } from "../lib/exit_codes.ts";
import { type ExecOutcome, runCommand, spawnedPids } from "../runner/exec.ts";
import { findTree, parseProcStat, readProcStat } from "../runner/process_tree.ts";
import { enableSubreaper, reapOrphans } from "../runner/subreaper.ts";
import { planSpawn, setSpawnWrappers, spawnHelperProblem, spawnWrappers } from "../runner/spawn.ts";
import { buildEnv, resolveCwd } from "../runner/workspace.ts";

const PATH = "/usr/local/bin:/usr/bin:/bin";
/** A safety net so a broken kill path fails the test instead of hanging it. */
const SAFETY_TIMEOUT_MS = 60_000;

// Orphans of the commands must come back to this process to be killed and reaped.
const subreaper = enableSubreaper();

interface RunArgs {
  cwd?: string;
  stdin?: Uint8Array | null;
  timeoutMs?: number;
  outputCap?: number;
  env?: Record<string, string>;
  signal?: AbortSignal;
  claimOrphans?: boolean;
  killGraceMs?: number;
  onText?: (stream: StreamName, text: string) => void;
}

interface Run {
  outcome: ExecOutcome;
  stdout: string;
  stderr: string;
  stdoutBytes: Uint8Array;
  events: [StreamName, string][];
  pieceSizes: number[];
}

async function run(argv: string[], args: RunArgs = {}): Promise<Run> {
  const requestId = crypto.randomUUID();
  const chunks: Record<StreamName, Uint8Array[]> = { stdout: [], stderr: [] };
  const events: [StreamName, string][] = [];
  const pieceSizes: number[] = [];
  const decoder = new TextDecoder();
  const outcome = await runCommand({
    requestId,
    argv,
    cwd: args.cwd ?? Deno.cwd(),
    env: buildEnv({ PATH }, { extra: args.env, requestId }),
    stdin: args.stdin ?? null,
    timeoutMs: args.timeoutMs ?? SAFETY_TIMEOUT_MS,
    outputCap: args.outputCap ?? 1024 * 1024,
  }, {
    onOutput(stream, data): void {
      chunks[stream].push(data.slice());
      pieceSizes.push(data.byteLength);
      const text = decoder.decode(data);
      events.push([stream, text]);
      args.onText?.(stream, text);
    },
    signal: args.signal,
    claimOrphans: args.claimOrphans ?? true,
    killGraceMs: args.killGraceMs,
  });
  const stdoutBytes = concat(chunks.stdout);
  return {
    outcome,
    stdout: decoder.decode(stdoutBytes),
    stderr: decoder.decode(concat(chunks.stderr)),
    stdoutBytes,
    events,
    pieceSizes,
  };
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((sum, part) => sum + part.byteLength, 0));
  let offset = 0;
  for (const part of parts) {
    out.set(part, offset);
    offset += part.byteLength;
  }
  return out;
}

async function withTempDir(fn: (dir: string) => Promise<void> | void): Promise<void> {
  const dir = Deno.realPathSync(Deno.makeTempDirSync({ prefix: "waffle_exec_test_" }));
  try {
    await fn(dir);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
}

function writeScript(dir: string, name: string, body: string): string {
  const path = `${dir}/${name}`;
  Deno.writeTextFileSync(path, body);
  return path;
}

// A process that no longer exists at all: not alive, and not a zombie either.
function assertGone(pid: number, what: string): void {
  const stat = readProcStat(pid);
  assert.equal(stat, null, `${what} (pid ${pid}) survived as ${JSON.stringify(stat)}`);
}

// Written by a detached escapee: `echo $$ > pid.tmp && mv pid.tmp pid` makes it atomic.
const ESCAPEE_BODY = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 1000';

function readPid(path: string): number {
  const pid = Number(Deno.readTextFileSync(path).trim());
  assert.ok(Number.isSafeInteger(pid) && pid > 1, `bad pidfile '${path}'`);
  return pid;
}

function baseOutcome(run: Run): Pick<ExecOutcome, "timedOut" | "cancelled" | "interrupted"> {
  const { timedOut, cancelled, interrupted } = run.outcome;
  return { timedOut, cancelled, interrupted };
}

const NOT_STOPPED = { timedOut: false, cancelled: false, interrupted: false };

Deno.test("enableSubreaper() makes the test process a child subreaper", () => {
  assert.equal(subreaper, true);
  assert.equal(enableSubreaper(), true);
});

for (const code of [0, 1, 23]) {
  Deno.test(`runCommand() reports exit ${code} exactly`, async () => {
    const result = await run(["sh", "-c", `exit ${code}`]);
    assert.equal(result.outcome.exitCode, code);
    assert.equal(result.outcome.signal, null);
    assert.equal(result.outcome.error, null);
    assert.deepEqual(baseOutcome(result), NOT_STOPPED);
  });
}

Deno.test("runCommand() treats a command's own exit 124 as an ordinary exit", async () => {
  const result = await run(["sh", "-c", "exit 124"]);
  assert.equal(result.outcome.exitCode, 124);
  assert.equal(result.outcome.timedOut, false);
  assert.equal(result.outcome.error, null);
});

Deno.test("runCommand() reports a missing command as 127", async () => {
  const result = await run(["waffle-no-such-command-xyz", "arg"]);
  assert.equal(result.outcome.exitCode, EXIT_NOT_FOUND);
  assert.equal(result.outcome.signal, null);
  assert.equal(result.outcome.error, "Command not found: 'waffle-no-such-command-xyz'");
  assert.equal(spawnedPids().size, 0);
});

Deno.test("runCommand() reports a non-executable file as 126", async () => {
  await withTempDir(async (dir) => {
    const path = writeScript(dir, "script.sh", "#!/bin/sh\necho nope\n");
    Deno.chmodSync(path, 0o644);
    const result = await run([path]);
    assert.equal(result.outcome.exitCode, EXIT_CANNOT_EXECUTE);
    assert.equal(result.outcome.error, `Cannot execute '${path}': Permission denied`);
    assert.equal(result.stdout, "");
  });
});

Deno.test("runCommand() reports a directory as 126", async () => {
  await withTempDir(async (dir) => {
    const result = await run([dir]);
    assert.equal(result.outcome.exitCode, EXIT_CANNOT_EXECUTE);
    assert.equal(result.outcome.error, `Cannot execute '${dir}': Is a directory`);
  });
});

Deno.test("runCommand() reports death by SIGKILL as 137", async () => {
  const result = await run(["sh", "-c", "kill -KILL $$"]);
  assert.equal(result.outcome.exitCode, exitCodeOfSignal(9));
  assert.equal(result.outcome.signal, "SIGKILL");
  assert.deepEqual(baseOutcome(result), NOT_STOPPED);
});

Deno.test("runCommand() reports death by a real-time signal as 128+n", async () => {
  // Deno has no name for real-time signals and rejects `status`; runCommand recovers.
  const result = await run(["sh", "-c", "kill -34 $$"]);
  assert.equal(result.outcome.exitCode, 162);
  assert.equal(result.outcome.signal, "SIGRT34");
  assert.equal(result.outcome.error, null);
});

Deno.test("runCommand() reports a script with a missing interpreter as 126", async () => {
  await withTempDir(async (dir) => {
    writeScript(dir, "bad.sh", "#!/waffle/no/such/interpreter\n");
    Deno.chmodSync(`${dir}/bad.sh`, 0o755);
    const result = await run(["./bad.sh"], { cwd: dir });
    assert.equal(result.outcome.exitCode, EXIT_CANNOT_EXECUTE);
    assert.equal(
      result.outcome.error,
      "Cannot execute './bad.sh': Its interpreter or loader was not found",
    );
  });
});

Deno.test("runCommand() passes exactly the given environment plus WAFFLE_REQUEST_ID", async () => {
  const requestId = crypto.randomUUID();
  const lines: string[] = [];
  const outcome = await runCommand({
    requestId,
    argv: ["env"],
    cwd: Deno.cwd(),
    env: buildEnv({ PATH }, { extra: { FOO: "bar baz", ["__proto__"]: "x" }, requestId }),
    stdin: null,
    outputCap: 65536,
  }, {
    onOutput(_stream, data): void {
      lines.push(...new TextDecoder().decode(data).split("\n").filter((line) => line !== ""));
    },
  });
  assert.equal(outcome.exitCode, 0);
  assert.deepEqual(lines.sort(), [
    "FOO=bar baz",
    `PATH=${PATH}`,
    `WAFFLE_REQUEST_ID=${requestId}`,
    "__proto__=x",
  ]);
});

Deno.test("runCommand() runs in the given working directory", async () => {
  await withTempDir(async (dir) => {
    Deno.mkdirSync(`${dir}/sub dir`);
    const result = await run(["pwd"], { cwd: `${dir}/sub dir` });
    assert.equal(result.stdout, `${dir}/sub dir\n`);
  });
});

Deno.test("runCommand() keeps stdout and stderr apart and streams them in order", async () => {
  await withTempDir(async (dir) => {
    // Each line waits for the test to have received the previous one, so
    // the order proves output is forwarded while the command still runs.
    const script = writeScript(
      dir,
      "stream.sh",
      [
        "echo one",
        "while [ ! -e flag1 ]; do sleep 0.01; done",
        "echo two >&2",
        "while [ ! -e flag2 ]; do sleep 0.01; done",
        "echo three",
      ].join("\n"),
    );
    const result = await run(["sh", script], {
      cwd: dir,
      onText(_stream, text): void {
        if (text.includes("one")) Deno.writeTextFileSync(`${dir}/flag1`, "");
        if (text.includes("two")) Deno.writeTextFileSync(`${dir}/flag2`, "");
      },
    });
    assert.equal(result.outcome.exitCode, 0);
    assert.deepEqual(result.events, [["stdout", "one\n"], ["stderr", "two\n"], [
      "stdout",
      "three\n",
    ]]);
    assert.equal(result.outcome.stdoutBytes, 10);
    assert.equal(result.outcome.stderrBytes, 4);
  });
});

Deno.test("runCommand() caps output, flags truncation and counts every byte", async () => {
  const result = await run(
    ["sh", "-c", "head -c 300000 /dev/zero; head -c 5000 /dev/zero >&2; echo tail"],
    { outputCap: 70_000 },
  );
  const { outcome } = result;
  assert.equal(outcome.exitCode, 0);
  assert.equal(outcome.stdoutBytes, 300_005);
  assert.equal(outcome.stderrBytes, 5000);
  assert.equal(outcome.stdoutTruncated, true);
  assert.equal(outcome.stderrTruncated, false);
  assert.equal(result.stdoutBytes.byteLength, 70_000);
  assert.ok(result.stdoutBytes.every((byte) => byte === 0));
  assert.ok(result.pieceSizes.every((size) => size > 0 && size <= MAX_CHUNK_BYTES));
});

Deno.test("runCommand() caps stderr separately from stdout", async () => {
  const result = await run(["sh", "-c", "echo out; head -c 5000 /dev/zero >&2"], {
    outputCap: 1000,
  });
  assert.equal(result.stdout, "out\n");
  assert.equal(result.outcome.stdoutTruncated, false);
  assert.equal(result.outcome.stderrTruncated, true);
  assert.equal(result.outcome.stderrBytes, 5000);
  assert.equal(result.stderr.length, 1000);
});

Deno.test("runCommand() does not flag output that exactly fills the cap", async () => {
  const result = await run(["head", "-c", "1000", "/dev/zero"], { outputCap: 1000 });
  assert.equal(result.outcome.stdoutBytes, 1000);
  assert.equal(result.stdoutBytes.byteLength, 1000);
  assert.equal(result.outcome.stdoutTruncated, false);
});

Deno.test("runCommand() writes stdin bytes and then closes stdin", async () => {
  const input = new Uint8Array(1024).map((_, index) => index % 256);
  const result = await run(["cat"], { stdin: input });
  assert.equal(result.outcome.exitCode, 0);
  assert.deepEqual(result.stdoutBytes, input);
});

Deno.test("runCommand() streams a large stdin while output flows back", async () => {
  // 4 MiB both ways: more than any pipe buffer, so writing all of stdin
  // before reading stdout would deadlock.
  const input = new Uint8Array(4 * 1024 * 1024).map((_, index) => (index * 7) % 251);
  const result = await run(["cat"], { stdin: input, outputCap: 8 * 1024 * 1024 });
  assert.equal(result.outcome.exitCode, 0);
  assert.equal(result.outcome.stdoutBytes, input.byteLength);
  assert.deepEqual(result.stdoutBytes, input);
});

Deno.test("runCommand() gives a closed stdin when stdin is null", async () => {
  const result = await run(["wc", "-c"], { stdin: null });
  assert.equal(result.outcome.exitCode, 0);
  assert.equal(result.stdout.trim(), "0");
});

Deno.test("runCommand() does not fail when the command ignores its stdin", async () => {
  const result = await run(["true"], { stdin: new Uint8Array(1024 * 1024) });
  assert.equal(result.outcome.exitCode, 0);
  assert.equal(result.outcome.error, null);
});

Deno.test("runCommand() times out and kills a setsid escapee", async () => {
  await withTempDir(async (dir) => {
    const escapee = writeScript(dir, "escapee.sh", ESCAPEE_BODY);
    const script = writeScript(
      dir,
      "main.sh",
      [
        `setsid sh ${escapee} ${dir}/pid </dev/null >/dev/null 2>&1 &`,
        `while [ ! -e ${dir}/pid ]; do sleep 0.01; done`,
        "echo started",
        "sleep 1000",
      ].join("\n"),
    );
    const result = await run(["sh", script], { timeoutMs: 1500 });
    const { outcome } = result;
    assert.equal(result.stdout, "started\n");
    assert.equal(outcome.timedOut, true);
    assert.equal(outcome.signal, "SIGTERM");
    assert.equal(outcome.exitCode, exitCodeOfSignal(15));
    assert.equal(outcome.error, "Command timed out after 1500 ms");
    assertGone(readPid(`${dir}/pid`), "setsid escapee");
  });
});

Deno.test("runCommand() escalates to SIGKILL when SIGTERM is ignored", async () => {
  const result = await run(["sh", "-c", "trap '' TERM; sleep 1000"], {
    timeoutMs: 200,
    killGraceMs: 100,
  });
  assert.equal(result.outcome.timedOut, true);
  assert.equal(result.outcome.signal, "SIGKILL");
  assert.equal(result.outcome.exitCode, exitCodeOfSignal(9));
});

Deno.test("runCommand() returns when the foreground exits although a background child holds stdout", async () => {
  const result = await run(["sh", "-c", "sleep 30 & echo $!; echo hi"]);
  const [pidLine, hi] = result.stdout.split("\n");
  assert.equal(hi, "hi");
  assert.equal(result.outcome.exitCode, 0);
  assert.deepEqual(baseOutcome(result), NOT_STOPPED);
  assert.equal(result.outcome.error, null);
  // Returned before the 30 s sleep would have ended: the sleep is dead, not finished.
  assertGone(Number(pidLine), "background sleep");
});

Deno.test("runCommand() kills a double-fork setsid escapee after a normal exit (environment marker)", async () => {
  await withTempDir(async (dir) => {
    const escapee = writeScript(dir, "escapee.sh", ESCAPEE_BODY);
    const script = writeScript(
      dir,
      "main.sh",
      [
        `(setsid sh ${escapee} ${dir}/pid </dev/null >/dev/null 2>&1 &)`,
        `while [ ! -e ${dir}/pid ]; do sleep 0.01; done`,
        "echo done",
      ].join("\n"),
    );
    // Without orphan claiming, only the WAFFLE_REQUEST_ID marker attributes it.
    const result = await run(["sh", script], { claimOrphans: false });
    assert.equal(result.outcome.exitCode, 0);
    assert.equal(result.stdout, "done\n");
    assertGone(readPid(`${dir}/pid`), "double-fork escapee");
  });
});

Deno.test("runCommand() with claimOrphans kills an escapee that dropped the marker", async () => {
  await withTempDir(async (dir) => {
    const escapee = writeScript(dir, "escapee.sh", ESCAPEE_BODY);
    const script = writeScript(
      dir,
      "main.sh",
      [
        // env -i: no WAFFLE_REQUEST_ID, new session, reparented to the runner.
        `(env -i "$(command -v setsid)" "$(command -v sh)" ${escapee} ${dir}/pid </dev/null >/dev/null 2>&1 &)`,
        `while [ ! -e ${dir}/pid ]; do sleep 0.01; done`,
        "echo done",
      ].join("\n"),
    );
    const result = await run(["sh", script], { claimOrphans: true });
    assert.equal(result.outcome.exitCode, 0);
    const pid = readPid(`${dir}/pid`);
    assertGone(pid, "unmarked escapee");
  });
});

for (const reason of ["cancel", "interrupt"] as const) {
  Deno.test(`runCommand() kills the tree when aborted with reason '${reason}'`, async () => {
    await withTempDir(async (dir) => {
      const escapee = writeScript(dir, "escapee.sh", ESCAPEE_BODY);
      const script = writeScript(
        dir,
        "main.sh",
        [
          `setsid sh ${escapee} ${dir}/pid </dev/null >/dev/null 2>&1 &`,
          `while [ ! -e ${dir}/pid ]; do sleep 0.01; done`,
          "echo ready",
          "sleep 1000",
        ].join("\n"),
      );
      const controller = new AbortController();
      const result = await run(["sh", script], {
        signal: controller.signal,
        onText(_stream, text): void {
          if (text.includes("ready")) controller.abort(reason);
        },
      });
      const { outcome } = result;
      assert.deepEqual(baseOutcome(result), {
        timedOut: false,
        cancelled: reason === "cancel",
        interrupted: reason === "interrupt",
      });
      assert.equal(outcome.signal, "SIGTERM");
      assert.equal(outcome.exitCode, exitCodeOfSignal(15));
      assert.ok(
        outcome.error !== null && /^Command was (cancelled|interrupted)/.test(outcome.error),
      );
      assertGone(readPid(`${dir}/pid`), "escapee");
    });
  });
}

Deno.test("runCommand() SIGKILLs processes forked during the grace period", async () => {
  await withTempDir(async (dir) => {
    const escapee = writeScript(dir, "escapee.sh", ESCAPEE_BODY);
    // On SIGTERM the root starts a new-session escapee and keeps running.
    const script = writeScript(
      dir,
      "main.sh",
      [
        `trap 'setsid sh ${escapee} ${dir}/pid </dev/null >/dev/null 2>&1 &' TERM`,
        "echo ready",
        "while :; do sleep 0.05; done",
      ].join("\n"),
    );
    const controller = new AbortController();
    const result = await run(["sh", script], {
      signal: controller.signal,
      killGraceMs: 1500,
      onText(_stream, text): void {
        if (text.includes("ready")) controller.abort("cancel");
      },
    });
    assert.equal(result.outcome.cancelled, true);
    assert.equal(result.outcome.signal, "SIGKILL");
    assertGone(readPid(`${dir}/pid`), "escapee forked during the grace period");
  });
});

Deno.test("runCommand() stops waiting for a pipe held by a process it cannot attribute", async () => {
  await withTempDir(async (dir) => {
    const escapee = writeScript(dir, "escapee.sh", ESCAPEE_BODY);
    // No marker, own session, and (without claimOrphans) nothing ties it to the
    // request, yet it holds stdout open.
    const script = writeScript(
      dir,
      "main.sh",
      [
        `(env -i "$(command -v setsid)" "$(command -v sh)" ${escapee} ${dir}/pid </dev/null &)`,
        `while [ ! -e ${dir}/pid ]; do sleep 0.01; done`,
        "echo done",
      ].join("\n"),
    );
    const result = await run(["sh", script], { claimOrphans: false });
    const pid = readPid(`${dir}/pid`);
    try {
      assert.equal(result.outcome.exitCode, 0);
      assert.equal(result.stdout, "done\n");
      // Returned although the holder is still alive: the drain is bounded.
      assert.equal(readProcStat(pid)?.state, "S");
    } finally {
      Deno.kill(pid, "SIGKILL");
      for (let i = 0; i < 500 && readProcStat(pid)?.state !== "Z"; i++) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      reapOrphans(spawnedPids());
    }
    assertGone(pid, "holder");
  });
});

Deno.test("runCommand() kills the tree and reports an output handler failure", async () => {
  await withTempDir(async (dir) => {
    const requestId = crypto.randomUUID();
    const outcome = await runCommand({
      requestId,
      argv: ["sh", "-c", `echo $$ > ${dir}/pid; echo ready; sleep 1000`],
      cwd: dir,
      env: buildEnv({ PATH }, { requestId }),
      stdin: null,
      timeoutMs: SAFETY_TIMEOUT_MS,
      outputCap: 1024,
    }, {
      onOutput(): void {
        throw new Error("Disk full");
      },
    });
    assert.equal(outcome.error, "Output handler failed: Disk full");
    assert.equal(outcome.signal, "SIGTERM");
    assert.deepEqual({ ...outcome, ...NOT_STOPPED }, outcome);
    assertGone(readPid(`${dir}/pid`), "root");
  });
});

Deno.test("runCommand() does not start a command whose signal is already aborted", async () => {
  await withTempDir(async (dir) => {
    const result = await run(["sh", "-c", `touch ${dir}/ran`], {
      signal: AbortSignal.abort("cancel"),
    });
    assert.equal(result.outcome.exitCode, null);
    assert.equal(result.outcome.cancelled, true);
    assert.equal(result.outcome.error, "Command was cancelled");
    assert.throws(() => Deno.statSync(`${dir}/ran`), Deno.errors.NotFound);
  });
});

Deno.test("findTree() finds descendants and marked escapees but never the runner", async () => {
  await withTempDir(async (dir) => {
    const escapee = writeScript(dir, "escapee.sh", ESCAPEE_BODY);
    const script = writeScript(
      dir,
      "main.sh",
      [
        `setsid sh ${escapee} ${dir}/pid </dev/null >/dev/null 2>&1 &`,
        `while [ ! -e ${dir}/pid ]; do sleep 0.01; done`,
        "sleep 1000 &",
        "echo ready",
        "wait",
      ].join("\n"),
    );
    const requestId = crypto.randomUUID();
    const controller = new AbortController();
    let rootPid = 0;
    let seen: { pids: number[]; pgids: number[] } | undefined;
    const outcome = await runCommand({
      requestId,
      argv: ["sh", script],
      cwd: dir,
      env: buildEnv({ PATH }, { requestId }),
      stdin: null,
      timeoutMs: SAFETY_TIMEOUT_MS,
      outputCap: 1024,
    }, {
      onSpawn(pid): void {
        rootPid = pid;
      },
      onOutput(): void {
        seen = findTree(rootPid, { known: spawnedPids(), requestId });
        controller.abort("cancel");
      },
      signal: controller.signal,
    });
    assert.equal(outcome.cancelled, true);
    const escapeePid = readPid(`${dir}/pid`);
    assert.ok(seen !== undefined);
    assert.ok(seen.pids.includes(rootPid), "root missing");
    assert.ok(seen.pids.includes(escapeePid), "escapee missing");
    assert.ok(seen.pids.length >= 3, "background sleep missing");
    assert.ok(!seen.pids.includes(Deno.pid), "runner included");
    assert.deepEqual([...seen.pgids].sort(), [rootPid, escapeePid].sort());
    assertGone(escapeePid, "escapee");
  });
});

Deno.test("reapOrphans() reaps adopted zombies but never Deno's own children", async () => {
  // An orphan that exits after its parent: reparented to us, then a zombie.
  const parent = new Deno.Command("sh", {
    args: ["-c", "sleep 0.2 & echo $!"],
    stdout: "piped",
  }).spawn();
  const orphan = Number(new TextDecoder().decode((await parent.output()).stdout).trim());
  // Deno's own child, caught as a zombie: Deno reaps on the event loop,
  // which this synchronous wait blocks.
  const own = new Deno.Command("sh", { args: ["-c", "exit 7"] }).spawn();
  const known = new Set([own.pid]);
  while (readProcStat(own.pid)?.state !== "Z") {
    // Busy-wait on purpose (see above).
  }
  for (let i = 0; i < 500 && readProcStat(orphan)?.state !== "Z"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  assert.equal(readProcStat(orphan)?.ppid, Deno.pid);
  const reaped = reapOrphans(known);
  assert.ok(reaped.includes(orphan), `orphan ${orphan} not reaped: ${reaped}`);
  assert.ok(!reaped.includes(own.pid));
  assertGone(orphan, "reaped orphan");
  assert.equal((await own.status).code, 7);
});

Deno.test("parseProcStat() reads fields after the last parenthesis", () => {
  const rest = Array.from({ length: 40 }, (_, index) => String(index + 100));
  rest.splice(0, 4, "S", "1", "42", "43");
  rest[19] = "987654";
  const stat = parseProcStat(`4242 (a) b (c)) ${rest.join(" ")}\n`);
  assert.deepEqual(stat, {
    pid: 4242,
    comm: "a) b (c)",
    state: "S",
    ppid: 1,
    pgid: 42,
    sid: 43,
    starttime: 987654,
  });
  assert.equal(parseProcStat("garbage"), null);
  assert.equal(readProcStat(Deno.pid)?.pid, Deno.pid);
});

Deno.test("resolveCwd() accepts directories inside the workspace", async () => {
  await withTempDir((root) => {
    Deno.mkdirSync(`${root}/a/b`, { recursive: true });
    Deno.symlinkSync(`${root}/a/b`, `${root}/inner-link`);
    assert.equal(resolveCwd(root, undefined), root);
    assert.equal(resolveCwd(root, "a/b"), `${root}/a/b`);
    assert.equal(resolveCwd(root, `${root}/a`), `${root}/a`);
    assert.equal(resolveCwd(root, "a/../a/b/"), `${root}/a/b`);
    assert.equal(resolveCwd(root, "inner-link"), `${root}/a/b`);
  });
});

Deno.test("resolveCwd() rejects directories outside the workspace, missing ones and NUL", async () => {
  await withTempDir((dir) => {
    const root = `${dir}/ws`;
    Deno.mkdirSync(root);
    Deno.mkdirSync(`${dir}/outside`);
    Deno.symlinkSync(`${dir}/outside`, `${root}/escape`);
    Deno.writeTextFileSync(`${root}/file`, "");
    const cases: [string, string][] = [
      ["../x", `Working directory '../x' is outside the workspace '${root}'`],
      ["/etc", `Working directory '/etc' is outside the workspace '${root}'`],
      ["a/../../outside", `Working directory 'a/../../outside' is outside the workspace '${root}'`],
      ["escape", `Working directory 'escape' resolves outside the workspace '${root}'`],
      ["missing", "Working directory 'missing' does not exist"],
      ["file", "Working directory 'file' is not a directory"],
      ["file/sub", "Working directory 'file/sub' is not a directory"],
      ["a\0b", "Working directory 'a\\0b' contains a NUL byte"],
    ];
    for (const [cwd, message] of cases) {
      assert.throws(() => resolveCwd(root, cwd), (error: unknown) => {
        assert.ok(error instanceof UsageError, `not a UsageError for ${JSON.stringify(cwd)}`);
        assert.equal(error.message, message);
        return true;
      });
    }
  });
});

Deno.test("buildEnv() adds the request marker and rejects bad variables", () => {
  const env = buildEnv({ PATH, HOME: "/w" }, {
    extra: { HOME: "/x", _A1: "" },
    requestId: "req-1",
  });
  assert.deepEqual({ ...env }, {
    PATH,
    HOME: "/x",
    _A1: "",
    WAFFLE_REQUEST_ID: "req-1",
  });
  const cases: [Record<string, string>, string][] = [
    [{ "1A": "x" }, "Environment variable name '1A' is invalid"],
    [{ "A-B": "x" }, "Environment variable name 'A-B' is invalid"],
    [{ "": "x" }, "Environment variable name '' is invalid"],
    [{ "A=B": "x" }, "Environment variable name 'A=B' is invalid"],
    [{ FOO: "a\0b" }, "Environment variable 'FOO' contains a NUL byte"],
    [
      { WAFFLE_REQUEST_ID: "other" },
      "Environment variable 'WAFFLE_REQUEST_ID' is reserved by waffle",
    ],
  ];
  for (const [extra, message] of cases) {
    assert.throws(() => buildEnv({ PATH }, { extra, requestId: "req-1" }), (error: unknown) => {
      assert.ok(error instanceof UsageError);
      assert.equal(error.message, message);
      return true;
    });
  }
});

// --- Spawning through the spawn helper or exec-in-place wrappers (runner/spawn.ts) ---

const SANDBOX_USER = { uid: 10001, gid: 10001 };
const IS_ROOT = Deno.uid() === 0;

/** Built from image/spawn_helper.c with gcc, into a temporary directory removed at exit. */
interface Built {
  /** The static helper, or null with `reason`. */
  helper: string | null;
  /** A shared library whose constructor logs its process's uid (LD_PRELOAD tests). */
  preload: string | null;
  /** The helper linked dynamically (must be refused), or null. */
  dynamicHelper: string | null;
  /** Why the helper could not be built. */
  reason: string;
}

const BUILT = await buildWithGcc();

async function buildWithGcc(): Promise<Built> {
  const none = (reason: string): Built => ({
    helper: null,
    preload: null,
    dynamicHelper: null,
    reason,
  });
  const source = new URL("../image/spawn_helper.c", import.meta.url).pathname;
  const dir = Deno.realPathSync(Deno.makeTempDirSync({ prefix: "waffle_spawn_helper_" }));
  globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
  // Readable by the sandbox uid: it loads preload.so.
  Deno.chmodSync(dir, 0o755);
  const gcc = async (args: string[]): Promise<string | null> => {
    try {
      const out = await new Deno.Command("gcc", { args, stdout: "null", stderr: "piped" }).output();
      if (out.success) return null;
      const text = new TextDecoder().decode(out.stderr).trim().split("\n");
      return `gcc ${args.join(" ")} failed: ${text.slice(-2).join(" / ")}`;
    } catch (error) {
      return error instanceof Deno.errors.NotFound
        ? "gcc not found (apt-get install -y gcc libc6-dev)"
        : `gcc: ${error instanceof Error ? error.message : String(error)}`;
    }
  };
  const flags = ["-Os", "-Wall", "-Wextra", "-Werror"];
  const failed = await gcc(["-static", ...flags, "-o", `${dir}/spawn`, source]);
  if (failed !== null) return none(failed);
  Deno.writeTextFileSync(
    `${dir}/preload.c`,
    `#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void logged(void) {
  const char *log = getenv("WAFFLE_PRELOAD_LOG");
  char exe[512] = "", line[600];
  if (log == NULL) return;
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) exe[n] = 0;
  int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0666);
  if (fd < 0) return;
  int length = snprintf(line, sizeof line, "uid=%d exe=%s\\n", (int)getuid(), exe);
  if (write(fd, line, (size_t)length) < 0) {}
  close(fd);
}
`,
  );
  const preloadFailed = await gcc([
    "-shared",
    "-fPIC",
    "-o",
    `${dir}/preload.so`,
    `${dir}/preload.c`,
  ]);
  const dynamicFailed = await gcc([...flags, "-o", `${dir}/spawn-dynamic`, source]);
  return {
    helper: `${dir}/spawn`,
    preload: preloadFailed === null ? `${dir}/preload.so` : null,
    dynamicHelper: dynamicFailed === null ? `${dir}/spawn-dynamic` : null,
    reason: preloadFailed ?? dynamicFailed ?? "",
  };
}

type TestDefinition = { name: string; ignore?: boolean; fn: () => Promise<void> | void };

/** Registers a test that needs the helper built: ignored with the reason, or failing with WAFFLE_REQUIRE_DOCKER=1. */
function helperTest(definition: TestDefinition): void {
  if (BUILT.helper !== null) {
    Deno.test(definition);
  } else if (Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1") {
    Deno.test({
      name: definition.name,
      fn: () => {
        throw new Error(`The spawn helper is required (WAFFLE_REQUIRE_DOCKER=1): ${BUILT.reason}`);
      },
    });
  } else {
    Deno.test({
      name: `${definition.name} [ignored: ${BUILT.reason}]`,
      ignore: true,
      fn: () => {},
    });
  }
}

/**
 * The ways of spawning: waffle's static helper (built here), the wrappers
 * found on this host, and Deno's own options.
 */
const SPAWN_MODES = ["helper", "wrappers", "Deno options"] as const;
type SpawnMode = (typeof SPAWN_MODES)[number];

/** A test per spawn mode; the helper's needs the helper built (see {@linkcode helperTest}). */
function modeTest(
  mode: SpawnMode,
  definition: TestDefinition | string,
  fn: () => Promise<void> = () => Promise.resolve(),
): void {
  const test = typeof definition === "string" ? { name: definition, fn } : definition;
  if (mode === "helper") helperTest(test);
  else Deno.test(test);
}

async function inSpawnMode<T>(mode: SpawnMode, fn: () => Promise<T>): Promise<T> {
  const none = { helper: null, setsid: null, setpriv: null, env: null };
  setSpawnWrappers(undefined);
  const found = spawnWrappers();
  setSpawnWrappers(
    mode === "helper"
      // The helper alone: no wrapper to fall back on.
      ? { ...none, helper: BUILT.helper }
      : mode === "wrappers"
      ? { ...found, helper: null }
      : none,
  );
  // The mode is in effect: the plan starts what it should.
  const planned = planSpawn("/bin/true", [], {}, undefined).program;
  const expected = mode === "helper"
    ? BUILT.helper
    : mode === "wrappers" && found.setsid !== null
    ? found.setsid
    : "/bin/true";
  try {
    assert.equal(planned, expected, `spawn mode '${mode}'`);
    return await fn();
  } finally {
    setSpawnWrappers(undefined);
  }
}

interface AsRun {
  outcome: ExecOutcome;
  stdout: string;
  stderr: string;
  pid: number | undefined;
  requestId: string;
}

async function runAs(
  argv: string[],
  args: {
    user?: { uid: number; gid: number } | undefined;
    cwd?: string;
    env?: Record<string, string>;
    signal?: AbortSignal;
    onSpawn?: (pid: number) => void;
  } = {},
): Promise<AsRun> {
  const requestId = crypto.randomUUID();
  const decoder = new TextDecoder();
  const out = { stdout: "", stderr: "" };
  let pid: number | undefined;
  const outcome = await runCommand({
    requestId,
    argv,
    cwd: args.cwd ?? "/",
    env: buildEnv({ PATH }, { extra: args.env, requestId }),
    stdin: null,
    timeoutMs: SAFETY_TIMEOUT_MS,
    outputCap: 1024 * 1024,
    user: args.user,
  }, {
    onOutput(stream, data): void {
      out[stream] += decoder.decode(data);
    },
    onSpawn(spawnedPid): void {
      pid = spawnedPid;
      args.onSpawn?.(spawnedPid);
    },
    signal: args.signal,
    claimOrphans: true,
  });
  return { outcome, ...out, pid, requestId };
}

// Prints the shell's pid, its /proc stat line and its credentials.
const IDENTITY_SCRIPT =
  'echo $$; cat /proc/$$/stat; grep -E "^(Uid|Gid|Groups|CapPrm|CapEff):" /proc/$$/status';

function parseIdentity(
  stdout: string,
): { pid: number; pgid: number; sid: number; status: Map<string, string> } {
  const [pidLine, statLine, ...statusLines] = stdout.split("\n");
  const stat = parseProcStat(statLine ?? "");
  assert.ok(stat !== null, `no stat line in ${JSON.stringify(stdout)}`);
  const status = new Map<string, string>();
  for (const line of statusLines) {
    const colon = line.indexOf(":");
    if (colon > 0) status.set(line.slice(0, colon), line.slice(colon + 1).trim());
  }
  return { pid: Number(pidLine), pgid: stat.pgid, sid: stat.sid, status };
}

Deno.test("spawnWrappers() finds absolute wrappers, never busybox's setpriv", () => {
  const found = spawnWrappers();
  // Absent wrappers are allowed: the runner then uses Deno's options (tested below too).
  for (const [name, path] of Object.entries(found)) {
    assert.ok(path === null || path.startsWith("/"), `${name}: ${path}`);
  }
  if (found.setpriv !== null) {
    assert.doesNotMatch(Deno.realPathSync(found.setpriv), /busybox/);
  }
  if (found.helper !== null) assert.equal(spawnHelperProblem(found.helper), null);
});

Deno.test("planSpawn() runs setsid first and drops the uid before the command's environment applies", () => {
  const wrappers = { helper: null, setsid: "/w/setsid", setpriv: "/w/setpriv", env: "/w/env" };
  setSpawnWrappers(wrappers);
  try {
    const env = { PATH, LD_PRELOAD: "/x.so", EMPTY: "" };
    const own = planSpawn("/bin/prog", ["-a", "b c"], env, undefined);
    assert.deepEqual(own, {
      program: "/w/setsid",
      args: ["--", "/bin/prog", "-a", "b c"],
      env,
      detached: false,
      sessionPending: true,
    });
    const dropped = planSpawn("/bin/prog", ["-a"], env, SANDBOX_USER);
    assert.equal(dropped.program, "/w/setsid");
    assert.deepEqual(dropped.args, [
      "--",
      "/w/setpriv",
      "--reuid=10001",
      "--regid=10001",
      "--clear-groups",
      "--",
      "/w/env",
      "-i",
      "--",
      `PATH=${PATH}`,
      "LD_PRELOAD=/x.so",
      "EMPTY=",
      "/bin/prog",
      "-a",
    ]);
    // The stages that run as root see no environment of the request's.
    assert.deepEqual(dropped.env, {});
    assert.equal(dropped.detached, false);
    assert.equal(dropped.user, undefined);
    if (IS_ROOT) {
      // A program path env would take for an assignment: Deno's own options.
      const odd = planSpawn("/w/a=b", [], env, SANDBOX_USER);
      assert.deepEqual([odd.program, odd.detached, odd.user], ["/w/a=b", true, SANDBOX_USER]);
    }
    setSpawnWrappers({ helper: null, setsid: null, setpriv: "/w/setpriv", env: "/w/env" });
    const legacy = planSpawn("/bin/prog", [], env, SANDBOX_USER);
    assert.deepEqual(legacy, {
      program: "/bin/prog",
      args: [],
      env,
      detached: true,
      user: SANDBOX_USER,
      sessionPending: false,
    });
  } finally {
    setSpawnWrappers(undefined);
  }
});

Deno.test("planSpawn() prefers the spawn helper and gives it the command's environment", () => {
  setSpawnWrappers({
    helper: "/w/spawn",
    setsid: "/w/setsid",
    setpriv: "/w/setpriv",
    env: "/w/env",
  });
  try {
    const env = { PATH, LD_PRELOAD: "/x.so" };
    assert.deepEqual(planSpawn("/bin/prog", ["-a", "b c"], env, undefined), {
      program: "/w/spawn",
      args: ["-", "/bin/prog", "-a", "b c"],
      env,
      detached: false,
      sessionPending: true,
    });
    const dropped = planSpawn("/w/a=b", ["-a"], env, { uid: 1234, gid: 5678 });
    if (IS_ROOT) {
      // Static, so the request's environment loads nothing into it.
      assert.deepEqual(dropped, {
        program: "/w/spawn",
        args: ["1234", "5678", "/w/a=b", "-a"],
        env,
        detached: false,
        sessionPending: true,
      });
    } else {
      // It could not drop: Deno's own options, as for the wrappers.
      assert.deepEqual([dropped.program, dropped.detached, dropped.user], [
        "/w/a=b",
        true,
        { uid: 1234, gid: 5678 },
      ]);
    }
  } finally {
    setSpawnWrappers(undefined);
  }
});

// The helper directly, started the way the runner starts it (posix_spawn, no group leader).
async function runHelper(
  args: string[],
  options: { env?: Record<string, string>; user?: { uid: number; gid: number } } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  assert.ok(BUILT.helper !== null);
  const out = await new Deno.Command(BUILT.helper, {
    args,
    env: options.env ?? { PATH },
    clearEnv: true,
    stdout: "piped",
    stderr: "piped",
    ...(options.user ?? {}),
  }).output();
  const decoder = new TextDecoder();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

helperTest({
  name: "spawn helper: rejects bad arguments with 126 and runs nothing",
  fn: async () => {
    const usage =
      "usage: spawn [--tty /dev/pts/N] UID GID PROGRAM [ARGS...] | spawn [--tty ...] -" +
      " PROGRAM [ARGS...]";
    const echo = ["/bin/echo", "ran"];
    const cases: [string[], string][] = [
      [[], usage],
      [["-"], usage],
      [["/bin/echo"], usage],
      [["1", "/bin/echo"], usage],
      [["", "1", ...echo], "invalid UID"],
      [["-1", "1", ...echo], "invalid UID"],
      [["+1", "1", ...echo], "invalid UID"],
      [[" 1", "1", ...echo], "invalid UID"],
      [["1x", "1", ...echo], "invalid UID"],
      [["0x10", "1", ...echo], "invalid UID"],
      [["4294967295", "1", ...echo], "invalid UID"],
      [["12345678901", "1", ...echo], "invalid UID"],
      [["1", "4294967295", ...echo], "invalid GID"],
      [["1", "", ...echo], "invalid GID"],
      [["1", "-", ...echo], "invalid GID"],
      // Only a pty slave of the container's devpts can become the terminal.
      [["--tty", "/etc/passwd", "-", ...echo], "invalid --tty path"],
      [["--tty", "/dev/pts/../tty", "-", ...echo], "invalid --tty path"],
      [["--tty", "/dev/pts/", "-", ...echo], "invalid --tty path"],
      [["--tty", "/dev/pts/1x", "-", ...echo], "invalid --tty path"],
      [["--tty", "/dev/pts/0"], usage],
    ];
    for (const [args, message] of cases) {
      const result = await runHelper(args);
      const what = JSON.stringify(args);
      assert.equal(result.code, EXIT_CANNOT_EXECUTE, what);
      assert.equal(result.stderr, `waffle-spawn: ${message}\n`, what);
      assert.equal(result.stdout, "", what);
    }
  },
});

helperTest({
  name: "spawn helper: a failed exec says why, with 127 for not found and 126 otherwise",
  fn: async () => {
    await withTempDir(async (dir) => {
      writeScript(dir, "data.txt", "echo nope\n");
      const cases: [string, number, string][] = [
        [`${dir}/missing`, EXIT_NOT_FOUND, "No such file or directory"],
        [`${dir}/data.txt/x`, EXIT_NOT_FOUND, "Not a directory"],
        [`${dir}/data.txt`, EXIT_CANNOT_EXECUTE, "Permission denied"],
        [dir, EXIT_CANNOT_EXECUTE, "Permission denied"],
      ];
      for (const [program, code, reason] of cases) {
        const result = await runHelper(["-", program, "arg"]);
        assert.equal(result.code, code, program);
        assert.equal(result.stderr, `waffle-spawn: '${program}': ${reason}\n`, program);
      }
      // PROGRAM is used as given, never searched for in PATH.
      const bare = await runHelper(["-", "true"], { env: { PATH } });
      assert.equal(bare.code, EXIT_NOT_FOUND);
      assert.equal(bare.stderr, "waffle-spawn: 'true': No such file or directory\n");
    });
  },
});

helperTest({
  name: "spawn helper: runs the program in place in a new session with the given environment",
  fn: async () => {
    const env = { PATH, LD_PRELOAD: "/waffle/no/such/preload.so", A: "b c" };
    const result = await runHelper(["-", "/bin/sh", "-c", IDENTITY_SCRIPT], { env });
    assert.equal(result.code, 0, result.stderr);
    const identity = parseIdentity(result.stdout);
    assert.equal(identity.pgid, identity.pid);
    assert.equal(identity.sid, identity.pid);
    const printed = await runHelper(["-", "/bin/sh", "-c", 'echo "$A|$LD_PRELOAD"; exit 7'], {
      env,
    });
    assert.equal(printed.code, 7);
    assert.equal(printed.stdout, "b c|/waffle/no/such/preload.so\n");
  },
});

helperTest({
  name: "spawn helper: drops to the given uid and gid, not swapped, with no groups",
  ignore: !IS_ROOT,
  fn: async () => {
    const result = await runHelper(["1234", "5678", "/bin/sh", "-c", IDENTITY_SCRIPT]);
    assert.equal(result.code, 0, result.stderr);
    const identity = parseIdentity(result.stdout);
    assert.equal(identity.sid, identity.pid);
    assert.equal(identity.status.get("Uid"), "1234\t1234\t1234\t1234");
    assert.equal(identity.status.get("Gid"), "5678\t5678\t5678\t5678");
    assert.equal(identity.status.get("Groups"), "");
    assert.equal(identity.status.get("CapEff"), "0000000000000000");
    assert.equal(identity.status.get("CapPrm"), "0000000000000000");
  },
});

helperTest({
  name: "spawn helper: fails with 126 and runs nothing when it cannot drop",
  ignore: !IS_ROOT,
  fn: async () => {
    const result = await runHelper(["10002", "10002", "/bin/echo", "ran"], { user: SANDBOX_USER });
    assert.equal(result.code, EXIT_CANNOT_EXECUTE);
    assert.equal(result.stderr, "waffle-spawn: setgroups: Operation not permitted\n");
    assert.equal(result.stdout, "");
  },
});

helperTest({
  name: "spawnHelperProblem() accepts only a static, root-owned, unwritable executable",
  fn: async () => {
    assert.ok(BUILT.helper !== null);
    assert.equal(spawnHelperProblem(BUILT.helper), null);
    await withTempDir((dir) => {
      const copy = (name: string, from: string, mode: number): string => {
        Deno.copyFileSync(from, `${dir}/${name}`);
        Deno.chmodSync(`${dir}/${name}`, mode);
        return `${dir}/${name}`;
      };
      assert.equal(spawnHelperProblem(copy("ok", BUILT.helper!, 0o755)), null);
      assert.equal(
        spawnHelperProblem(copy("group-writable", BUILT.helper!, 0o775)),
        "writable by group or others",
      );
      assert.equal(
        spawnHelperProblem(copy("world-writable", BUILT.helper!, 0o757)),
        "writable by group or others",
      );
      assert.equal(spawnHelperProblem(copy("plain", BUILT.helper!, 0o644)), "not executable");
      writeScript(dir, "script", '#!/bin/sh\nexec "$@"\n');
      Deno.chmodSync(`${dir}/script`, 0o755);
      assert.equal(spawnHelperProblem(`${dir}/script`), "not an ELF executable");
      assert.equal(spawnHelperProblem(dir), "not a regular file");
      assert.notEqual(spawnHelperProblem(`${dir}/missing`), null);
      if (IS_ROOT) {
        const foreign = copy("foreign", BUILT.helper!, 0o755);
        Deno.chownSync(foreign, SANDBOX_USER.uid, SANDBOX_USER.gid);
        assert.equal(spawnHelperProblem(foreign), `owned by uid ${SANDBOX_USER.uid}`);
      }
      if (BUILT.dynamicHelper !== null) {
        assert.equal(
          spawnHelperProblem(BUILT.dynamicHelper),
          "dynamically linked (the request's environment could load code into it)",
        );
      }
    });
  },
});

for (const mode of SPAWN_MODES) {
  modeTest(
    mode,
    `runCommand() (${mode}) runs the command as the spawned pid, in its own session and process group`,
    async () => {
      await inSpawnMode(mode, async () => {
        const result = await runAs(["sh", "-c", IDENTITY_SCRIPT]);
        assert.equal(result.outcome.exitCode, 0, result.stderr);
        const identity = parseIdentity(result.stdout);
        assert.equal(identity.pid, result.pid);
        assert.equal(identity.pgid, identity.pid);
        assert.equal(identity.sid, identity.pid);
        assert.equal(spawnedPids().size, 0);
      });
    },
  );

  modeTest(mode, {
    name: `runCommand() (${mode}) drops to the given uid and gid with no supplementary groups`,
    ignore: !IS_ROOT,
    fn: async () => {
      await inSpawnMode(mode, async () => {
        const result = await runAs(["sh", "-c", IDENTITY_SCRIPT], { user: SANDBOX_USER });
        assert.equal(result.outcome.exitCode, 0, result.stderr);
        const identity = parseIdentity(result.stdout);
        assert.equal(identity.pid, result.pid);
        assert.equal(identity.pgid, identity.pid);
        assert.equal(identity.sid, identity.pid);
        // Real, effective, saved and filesystem ids.
        assert.equal(identity.status.get("Uid"), "10001\t10001\t10001\t10001");
        assert.equal(identity.status.get("Gid"), "10001\t10001\t10001\t10001");
        assert.equal(identity.status.get("Groups"), "");
        assert.equal(identity.status.get("CapPrm"), "0000000000000000");
        assert.equal(identity.status.get("CapEff"), "0000000000000000");
      });
    },
  });

  modeTest(mode, {
    name: `runCommand() (${mode}) gives the request's environment to the command only`,
    ignore: !IS_ROOT,
    fn: async () => {
      await inSpawnMode(mode, async () => {
        const env = { FOO: "a b=c", EMPTY: "", ["__proto__"]: "x" };
        const result = await runAs(["env"], { user: SANDBOX_USER, env });
        assert.equal(result.outcome.exitCode, 0, result.stderr);
        assert.deepEqual(result.stdout.split("\n").filter((line) => line !== "").sort(), [
          "EMPTY=",
          "FOO=a b=c",
          `PATH=${PATH}`,
          `WAFFLE_REQUEST_ID=${result.requestId}`,
          "__proto__=x",
        ]);

        // The loader complains once per dynamically linked process that gets
        // this LD_PRELOAD: the command's own count, no more (no root wrapper
        // before it may see the request's environment).
        const preload = "/waffle/no/such/preload.so";
        const own = await new Deno.Command("true", {
          env: { PATH, LD_PRELOAD: preload },
          clearEnv: true,
          stderr: "piped",
        }).output();
        const count = (text: string): number => text.split(preload).length - 1;
        const expected = count(new TextDecoder().decode(own.stderr));
        const loaded = await runAs(["true"], { user: SANDBOX_USER, env: { LD_PRELOAD: preload } });
        assert.equal(loaded.outcome.exitCode, 0, loaded.stderr);
        assert.equal(count(loaded.stderr), expected, loaded.stderr);
      });
    },
  });

  modeTest(mode, {
    name:
      `runCommand() (${mode}) loads a request's LD_PRELOAD library into the command only, never as root${
        BUILT.preload === null && mode !== "helper" ? ` [ignored: ${BUILT.reason}]` : ""
      }`,
    ignore: !IS_ROOT || BUILT.preload === null,
    fn: async () => {
      const preload = BUILT.preload;
      assert.ok(preload !== null);
      await withTempDir(async (dir) => {
        Deno.chmodSync(dir, 0o777);
        const log = `${dir}/loads.log`;
        const env = { LD_PRELOAD: preload, WAFFLE_PRELOAD_LOG: log };
        const loads = (): string[] => {
          const text = Deno.readTextFileSync(log);
          Deno.removeSync(log);
          return text.split("\n").filter((line) => line !== "");
        };
        // The library works: a dynamically linked root process given it logs uid 0.
        const control = await new Deno.Command("/bin/true", {
          env: { PATH, ...env },
          clearEnv: true,
        }).output();
        assert.equal(control.code, 0);
        assert.deepEqual(loads().map((line) => line.split(" ")[0]), ["uid=0"]);

        await inSpawnMode(mode, async () => {
          const result = await runAs(["true"], { user: SANDBOX_USER, env });
          assert.equal(result.outcome.exitCode, 0, result.stderr);
          // Exactly one load: the command's own, as the sandbox uid.
          const lines = loads();
          assert.equal(lines.length, 1, lines.join("\n"));
          assert.match(lines[0] ?? "", /^uid=10001 exe=\/\S*\/true$/);
        });
      });
    },
  });
}

for (const mode of SPAWN_MODES) {
  for (const user of IS_ROOT ? [undefined, SANDBOX_USER] : [undefined]) {
    const as = user === undefined ? "" : " as another uid";
    modeTest(mode, `runCommand() (${mode}) reports 126/127 before spawning${as}`, async () => {
      await withTempDir(async (dir) => {
        Deno.chmodSync(dir, 0o755);
        Deno.mkdirSync(`${dir}/sub`);
        Deno.mkdirSync(`${dir}/bin`);
        writeScript(dir, "run.sh", '#!/bin/sh\necho "ran $0 $1"\n');
        Deno.chmodSync(`${dir}/run.sh`, 0o755);
        writeScript(dir, "data.txt", "echo nope\n");
        writeScript(dir, "bin/plain", "#!/bin/sh\necho nope\n");
        writeScript(dir, "bad.sh", "#!/waffle/no/such/interpreter\n");
        Deno.chmodSync(`${dir}/bad.sh`, 0o755);
        const cases: [string[], number | null, string | null, string][] = [
          [
            ["waffle-no-such-command-xyz"],
            EXIT_NOT_FOUND,
            "Command not found: 'waffle-no-such-command-xyz'",
            "",
          ],
          [["./waffle-nope"], EXIT_NOT_FOUND, "Command not found: './waffle-nope'", ""],
          [["sub/../waffle-nope"], EXIT_NOT_FOUND, "Command not found: 'sub/../waffle-nope'", ""],
          [[`${dir}/waffle-nope`], EXIT_NOT_FOUND, `Command not found: '${dir}/waffle-nope'`, ""],
          [["./sub"], EXIT_CANNOT_EXECUTE, "Cannot execute './sub': Is a directory", ""],
          [[dir], EXIT_CANNOT_EXECUTE, `Cannot execute '${dir}': Is a directory`, ""],
          [
            ["./data.txt"],
            EXIT_CANNOT_EXECUTE,
            "Cannot execute './data.txt': Permission denied",
            "",
          ],
          [
            [`${dir}/data.txt`],
            EXIT_CANNOT_EXECUTE,
            `Cannot execute '${dir}/data.txt': Permission denied`,
            "",
          ],
          [["data.txt/x"], EXIT_CANNOT_EXECUTE, "Cannot execute 'data.txt/x': Not a directory", ""],
          [
            ["./bad.sh"],
            EXIT_CANNOT_EXECUTE,
            "Cannot execute './bad.sh': Its interpreter or loader was not found",
            "",
          ],
          [["/dev/null"], EXIT_CANNOT_EXECUTE, "Cannot execute '/dev/null': Permission denied", ""],
          // As Deno looks names up: a PATH entry that is not executable is no match.
          [["plain"], EXIT_NOT_FOUND, "Command not found: 'plain'", ""],
          // A command given as a path runs as that normalized absolute path (argv[0], as with Deno).
          [["sub/../run.sh", "x"], 0, null, `ran ${dir}/run.sh x\n`],
          [["./run.sh"], 0, null, `ran ${dir}/run.sh \n`],
        ];
        await inSpawnMode(mode, async () => {
          for (const [argv, code, error, stdout] of cases) {
            const result = await runAs(argv, {
              cwd: dir,
              user,
              env: { PATH: `${dir}/bin:${PATH}` },
            });
            const what = JSON.stringify(argv);
            assert.equal(result.outcome.exitCode, code, `${what}: ${result.stderr}`);
            assert.equal(result.outcome.error, error, what);
            assert.equal(result.stdout, stdout, what);
            assert.equal(result.stderr, "", what);
            if (code === EXIT_CANNOT_EXECUTE || code === EXIT_NOT_FOUND) {
              assert.equal(result.pid, undefined, `${what} spawned`);
            }
          }
          assert.equal(spawnedPids().size, 0);
        });
      });
    });
  }

  modeTest(mode, {
    name: `runCommand() (${mode}) reports what the dropped uid may not execute as 126`,
    ignore: !IS_ROOT,
    fn: async () => {
      await withTempDir(async (dir) => {
        Deno.chmodSync(dir, 0o755);
        writeScript(dir, "root-only.sh", "#!/bin/sh\necho nope\n");
        Deno.chmodSync(`${dir}/root-only.sh`, 0o700);
        writeScript(dir, "group.sh", "#!/bin/sh\necho group\n");
        Deno.chownSync(`${dir}/group.sh`, 0, SANDBOX_USER.gid);
        Deno.chmodSync(`${dir}/group.sh`, 0o750);
        Deno.mkdirSync(`${dir}/private`, { mode: 0o700 });
        Deno.chmodSync(`${dir}/private`, 0o700);
        Deno.mkdirSync(`${dir}/private/open`);
        Deno.chmodSync(`${dir}/private/open`, 0o755);
        await inSpawnMode(mode, async () => {
          const denied = await runAs(["./root-only.sh"], { cwd: dir, user: SANDBOX_USER });
          assert.equal(denied.outcome.exitCode, EXIT_CANNOT_EXECUTE);
          assert.equal(denied.outcome.error, "Cannot execute './root-only.sh': Permission denied");
          // Root itself may.
          const asRoot = await runAs(["./root-only.sh"], { cwd: dir });
          assert.equal(asRoot.outcome.exitCode, 0);
          const group = await runAs(["./group.sh"], { cwd: dir, user: SANDBOX_USER });
          assert.equal(group.stdout, "group\n");
          // A working directory the uid cannot enter.
          for (const cwd of [`${dir}/private`, `${dir}/private/open`]) {
            const shut = await runAs(["pwd"], { cwd, user: SANDBOX_USER });
            assert.equal(shut.outcome.exitCode, EXIT_CANNOT_EXECUTE, cwd);
            assert.equal(shut.outcome.error, "Cannot execute 'pwd': Permission denied", cwd);
          }
        });
      });
    },
  });

  modeTest(mode, `runCommand() (${mode}) kills a command aborted right at spawn`, async () => {
    // With wrappers the process is still the setsid wrapper, in the runner's
    // own group (which killTree() skips), for a moment after spawning.
    for (const user of IS_ROOT ? [undefined, SANDBOX_USER] : [undefined]) {
      await inSpawnMode(mode, async () => {
        for (let i = 0; i < 10; i++) {
          const controller = new AbortController();
          let deadline: ReturnType<typeof setTimeout> | undefined;
          // A root the kill missed would run its sleep: fail instead of hanging.
          const result = await Promise.race([
            runAs(["sh", "-c", "sleep 1000"], {
              user,
              signal: controller.signal,
              onSpawn: () => controller.abort("cancel"),
            }),
            new Promise<never>((_, reject) => {
              deadline = setTimeout(
                () => reject(new Error("the aborted command kept running")),
                10_000,
              );
            }),
          ]).finally(() => clearTimeout(deadline));
          assert.equal(result.outcome.cancelled, true);
          assert.ok(
            result.outcome.signal === "SIGKILL" || result.outcome.signal === "SIGTERM",
            JSON.stringify(result.outcome),
          );
          assert.ok(result.pid !== undefined);
          assertGone(result.pid, "aborted root");
        }
      });
    }
    assert.equal(spawnedPids().size, 0);
  });
}
