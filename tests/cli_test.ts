/**
 * The `waffle exec` / `wait` / `doctor` contract, driven as a real process
 * with the host backend (a real runner child process on the host filesystem).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { selfCommand } from "../lib/config/self.ts";
import { DEFAULT_OUTPUT_CAP, MAX_OUTPUT_CAP, MAX_STDIN_BYTES } from "../lib/queue/protocol.ts";
import {
  EXIT_CANCELLED,
  EXIT_CANNOT_EXECUTE,
  EXIT_NOT_FOUND,
  EXIT_TIMEOUT,
  EXIT_WAFFLE,
  exitCodeOfSignal,
} from "../lib/exit_codes.ts";
import { queuePaths } from "../lib/queue/schema.ts";
import { alive, runCliProcess, startRunner, tempQueue, text, waitFor } from "./_helpers.ts";

Deno.test("waffle exec exits with the command's status, 124 on timeout, 126, 127, 128+n", async () => {
  await using q = await tempQueue();
  const host = ["exec", "--backend", "host", "--queue", q.queueDir];
  const cases: [string[], number, RegExp | null][] = [
    [["true"], 0, null],
    [["sh", "-c", "exit 23"], 23, null],
    // A command's own 124 passes through as its status.
    [["sh", "-c", "exit 124"], 124, null],
    [["--timeout", "0.3", "--", "sleep", "30"], EXIT_TIMEOUT, /timed out after/],
    [["/etc/passwd"], EXIT_CANNOT_EXECUTE, /Cannot execute/],
    [["no-such-command-xyz"], EXIT_NOT_FOUND, /not found/],
    [["sh", "-c", "kill -KILL $$"], exitCodeOfSignal(9), null],
  ];
  for (const [args, code, stderr] of cases) {
    const out = await runCliProcess([
      ...host,
      ...(args[0] === "--timeout" ? args : ["--", ...args]),
    ]);
    assert.equal(out.code, code, `${args.join(" ")}: ${out.stderr}`);
    if (stderr !== null) assert.match(out.stderr, stderr);
  }
});

Deno.test("waffle exec -i streams output and passes stdin through", async () => {
  await using q = await tempQueue();
  const host = ["exec", "--backend", "host", "--queue", q.queueDir];
  const out = await runCliProcess(
    [...host, "-i", "--", "sh", "-c", "cat; echo err >&2"],
    { stdin: new TextEncoder().encode("from stdin\n") },
  );
  assert.equal(out.code, 0);
  assert.equal(out.stdout, "from stdin\n");
  assert.equal(out.stderr, "err\n");
  // `printf abc | waffle exec -i -- cat`, and the long form of the flag.
  for (const flag of ["-i", "--interactive"]) {
    const cat = await runCliProcess([...host, flag, "--", "cat"], {
      stdin: new TextEncoder().encode("abc"),
    });
    assert.equal(cat.code, 0, cat.stderr);
    assert.equal(cat.stdout, "abc");
    assert.equal(cat.stderr, "");
  }
});

// Spawns the CLI with a stdin pipe the test holds open; bounded by a timeout
// so a CLI that waits for the pipe to close fails the test instead of hanging it.
async function withOpenStdin(
  args: string[],
  written: string,
  timeoutMs: number,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const self = selfCommand();
  const child = new Deno.Command(self.executable, {
    args: [...self.prefix, ...args],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    if (written !== "") await writer.write(new TextEncoder().encode(written));
    const out = await Promise.race([
      child.output(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          child.kill("SIGKILL");
          reject(new Error(`waffle ${args.join(" ")} hung on a stdin that never closes`));
        }, timeoutMs);
      }),
    ]);
    return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
  } finally {
    clearTimeout(timer);
    await child.status;
    await writer.close().catch(() => {}); // only now: the pipe stayed open throughout
  }
}

Deno.test("waffle exec without -i never reads stdin, even a pipe that never closes", async () => {
  await using q = await tempQueue();
  const host = ["exec", "--backend", "host", "--queue", q.queueDir];
  // A CI script's stdin: an open pipe nobody writes to or closes.
  const started = performance.now();
  const quiet = await withOpenStdin([...host, "--", "true"], "", 30_000);
  assert.equal(quiet.code, 0, quiet.stderr);
  assert.equal(quiet.stdout, "");
  assert.equal(quiet.stderr, "");
  // With bytes waiting in the pipe, the command still sees a closed, empty stdin.
  const cat = await withOpenStdin(
    [...host, "--", "sh", "-c", 'cat; echo "cat read $? after EOF"'],
    "not for the command\n",
    30_000,
  );
  assert.equal(cat.code, 0, cat.stderr);
  assert.equal(cat.stdout, "cat read 0 after EOF\n");
  assert.equal(cat.stderr, "");
  // deno-lint-ignore no-console -- the figure the test bounds, for the log
  console.log(
    `exec with an open stdin pipe: both returned in ${(performance.now() - started).toFixed(0)} ms`,
  );
});

Deno.test("waffle exec -i streams more stdin than one request may carry, while the command runs", async () => {
  await using q = await tempQueue();
  const self = selfCommand();
  const child = new Deno.Command(self.executable, {
    args: [
      ...self.prefix,
      "exec",
      "--backend",
      "host",
      "--queue",
      q.queueDir,
      "-i",
      "--",
      "wc",
      "-c",
    ],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  const writing = writer.write(new Uint8Array(MAX_STDIN_BYTES + 1).fill(0x61))
    .then(() => writer.close());
  const out = await child.output();
  await writing;
  assert.equal(out.code, 0, text(out.stderr));
  assert.equal(text(out.stdout).trim(), String(MAX_STDIN_BYTES + 1));
});

Deno.test("waffle exec -i refuses --detach and --output-cap with one line, before submitting", async () => {
  await using q = await tempQueue();
  for (const flag of [["--detach"], ["--output-cap", "10"]]) {
    const out = await runCliProcess(
      ["exec", "--backend", "host", "--queue", q.queueDir, "-i", ...flag, "--", "touch", "ran"],
      { stdin: new Uint8Array() },
    );
    assert.equal(out.code, EXIT_WAFFLE);
    assert.equal(out.stderr.trim().split("\n").length, 1, out.stderr);
    assert.match(out.stderr, new RegExp(`^waffle: '-i' streams .* takes no '${flag[0]}'`));
  }
  await assert.rejects(() => Deno.stat(join(q.workspace, "ran")), Deno.errors.NotFound);
});

Deno.test("waffle exec names each truncated stream on stderr after the output, never in --json", async () => {
  await using q = await tempQueue();
  const flags = ["--backend", "host", "--queue", q.queueDir];
  const script = "head -c 3000 /dev/zero | tr '\\0' a; head -c 1500 /dev/zero | tr '\\0' b >&2; " +
    "exit 4";
  const notices = "waffle: stdout truncated at 1000 bytes (the command wrote 3000 bytes); " +
    "raise --output-cap\n" +
    "waffle: stderr truncated at 1000 bytes (the command wrote 1500 bytes); raise --output-cap\n";
  const out = await runCliProcess([
    "exec",
    ...flags,
    "--output-cap",
    "1000",
    "--",
    "sh",
    "-c",
    script,
  ]);
  assert.equal(out.code, 4, out.stderr);
  assert.equal(out.stdout, "a".repeat(1000));
  // The stream was cut mid-line: the notices start a line of their own.
  assert.equal(out.stderr, `${"b".repeat(1000)}\n${notices}`);

  // `waffle wait` says the same of a detached request.
  const id = (await runCliProcess([
    "exec",
    ...flags,
    "--detach",
    "--output-cap",
    "1000",
    "--",
    "sh",
    "-c",
    script,
  ])).stdout.trim();
  const waited = await runCliProcess(["wait", id, ...flags]);
  assert.equal(waited.code, 4, waited.stderr);
  assert.equal(waited.stdout, "a".repeat(1000));
  assert.equal(waited.stderr, `${"b".repeat(1000)}\n${notices}`);

  // Only stdout over the default cap: one notice naming the default.
  const big = await runCliProcess([
    "exec",
    ...flags,
    "--",
    "sh",
    "-c",
    `head -c ${DEFAULT_OUTPUT_CAP + 5} /dev/zero; echo done >&2`,
  ]);
  assert.equal(big.code, 0, big.stderr);
  assert.equal(big.stdout.length, DEFAULT_OUTPUT_CAP);
  assert.equal(
    big.stderr,
    `done\nwaffle: stdout truncated at ${DEFAULT_OUTPUT_CAP} bytes (the command wrote ${
      DEFAULT_OUTPUT_CAP + 5
    } bytes); raise --output-cap\n`,
  );

  // --json carries the flags and prints no notice.
  const json = await runCliProcess([
    "exec",
    ...flags,
    "--json",
    "--output-cap",
    "1000",
    "--",
    "sh",
    "-c",
    script,
  ]);
  assert.equal(json.code, 4, json.stderr);
  assert.equal(json.stderr, "");
  const parsed = JSON.parse(json.stdout);
  assert.equal(parsed.stdoutTruncated, true);
  assert.equal(parsed.stderrTruncated, true);
  assert.equal(parsed.stdout, "a".repeat(1000));

  // Output under the cap: no notice.
  const small = await runCliProcess(["exec", ...flags, "--output-cap", "1000", "--", "echo", "hi"]);
  assert.equal(small.code, 0);
  assert.equal(small.stdout, "hi\n");
  assert.equal(small.stderr, "");
});

Deno.test("waffle exec --json prints one object with the documented fields", async () => {
  await using q = await tempQueue();
  const out = await runCliProcess([
    "exec",
    "--backend",
    "host",
    "--queue",
    q.queueDir,
    "--json",
    "--env",
    "A=b c",
    "--",
    "sh",
    "-c",
    'printf %s "$A"; echo oops >&2; exit 3',
  ]);
  assert.equal(out.code, 3);
  const json = JSON.parse(out.stdout);
  for (
    const key of [
      "id",
      "exitCode",
      "signal",
      "timedOut",
      "interrupted",
      "stdout",
      "stderr",
      "stdoutTruncated",
      "stderrTruncated",
      "durationMs",
    ]
  ) assert.ok(key in json, key);
  assert.equal(json.exitCode, 3);
  assert.equal(json.stdout, "b c");
  assert.equal(json.stderr, "oops\n");
  assert.equal(json.timedOut, false);
});

Deno.test("waffle exec --detach prints an id that waffle wait collects", async () => {
  await using q = await tempQueue();
  const flags = ["--backend", "host", "--queue", q.queueDir];
  const detached = await runCliProcess([
    "exec",
    ...flags,
    "--detach",
    "--",
    "sh",
    "-c",
    "sleep 0.2; echo later; exit 5",
  ]);
  assert.equal(detached.code, 0);
  const id = detached.stdout.trim();
  assert.match(id, /^[0-9a-f-]{36}$/);
  const waited = await runCliProcess(["wait", id, ...flags]);
  assert.equal(waited.code, 5);
  assert.equal(waited.stdout, "later\n");
  // Waiting again never hangs: the result while the runner still keeps it,
  // then a clear error once it was collected.
  const again = await runCliProcess(["wait", id, ...flags]);
  if (again.code === 5) assert.equal(again.stdout, "later\n");
  else {
    assert.equal(again.code, EXIT_WAFFLE);
    assert.match(again.stderr, /already collected|No request/);
  }
  const second = (await runCliProcess(["exec", ...flags, "--detach", "--", "sh", "-c", "exit 6"]))
    .stdout.trim();
  const json = await runCliProcess(["wait", second, ...flags, "--json"]);
  assert.equal(json.code, 6);
  assert.equal(JSON.parse(json.stdout).exitCode, 6);
});

Deno.test("waffle wait rides out a runner mid-commit (outbound.db locked) instead of failing", async () => {
  await using q = await tempQueue();
  const flags = ["--backend", "host", "--queue", q.queueDir];
  const id = (await runCliProcess([
    "exec",
    ...flags,
    "--detach",
    "--",
    "sh",
    "-c",
    "sleep 0.5; echo done; exit 4",
  ])).stdout.trim();
  assert.match(id, /^[0-9a-f-]{36}$/);
  // The runner's side of a commit, held: SQLite's write lock on outbound.db.
  const outbound = new DatabaseSync(join(q.queueDir, "outbound", "outbound.db"), {
    timeout: 5000, // the runner may be mid-commit itself
  });
  outbound.exec("BEGIN EXCLUSIVE");
  const waiting = runCliProcess(["wait", id, ...flags]);
  await new Promise((resolve) => setTimeout(resolve, 1500));
  outbound.exec("ROLLBACK");
  outbound.close();
  const waited = await waiting;
  assert.equal(waited.code, 4, waited.stderr);
  assert.equal(waited.stdout, "done\n");
});

Deno.test("waffle's own errors exit 125 with one line naming the bad value", async () => {
  await using q = await tempQueue();
  const cases: [string[], RegExp][] = [
    [
      ["exec", "--backend", "host", "--queue", q.queueDir, "--timeout", "soon", "--", "true"],
      /--timeout 'soon'/,
    ],
    [
      ["exec", "--backend", "host", "--queue", q.queueDir, "--env", "NOEQUALS", "--", "true"],
      /--env 'NOEQUALS'/,
    ],
    ...["0", "1.5", "lots", String(MAX_OUTPUT_CAP + 1)].map((cap): [string[], RegExp] => [
      ["exec", "--backend", "host", "--queue", q.queueDir, "--output-cap", cap, "--", "true"],
      new RegExp(`--output-cap '${cap.replace(".", "\\.")}': expected a whole number > 0`),
    ]),
    [["exec", "--backend", "nowhere", "--", "true"], /--backend 'nowhere'/],
    [["exec", "--backend", "host", "--", "true"], /--queue/],
    [["exec", "--backend", "host", "--queue", q.queueDir], /Missing command/],
    [["exec", "--bogus", "--", "true"], /bogus/],
    [["wait", "not-an-id", "--backend", "host", "--queue", q.queueDir], /No request 'not-an-id'/],
    [["frobnicate"], /Unknown command 'frobnicate'/],
    [
      ["exec", "--backend", "host", "--queue", q.queueDir, "--cwd", "../..", "--", "true"],
      /outside the workspace/,
    ],
  ];
  for (const [args, pattern] of cases) {
    const out = await runCliProcess(args);
    assert.equal(out.code, EXIT_WAFFLE, `${args.join(" ")}: ${out.stderr}`);
    assert.match(out.stderr, pattern);
    assert.equal(out.stderr.trim().split("\n").length, 1, out.stderr);
    assert.doesNotMatch(out.stderr, /\.\n$/);
  }
});

Deno.test("Ctrl-C on waffle exec cancels the request and kills its tree", async () => {
  await using q = await tempQueue();
  const pidFile = join(q.root, "workspace", "sleeper.pid");
  const self = selfCommand();
  const child = new Deno.Command(self.executable, {
    args: [
      ...self.prefix,
      "exec",
      "--backend",
      "host",
      "--queue",
      q.queueDir,
      "--",
      "sh",
      "-c",
      `echo $$ > ${pidFile}; exec sleep 1000`,
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  await waitFor(async () => (await Deno.readTextFile(pidFile).catch(() => "")).trim().length > 0, {
    what: "pid file",
    timeoutMs: 20_000,
  });
  const sleeper = Number(await Deno.readTextFile(pidFile));
  child.kill("SIGINT");
  const out = await child.output();
  assert.equal(out.code, EXIT_CANCELLED);
  assert.match(text(out.stderr), /cancelled/);
  await waitFor(() => {
    try {
      Deno.statSync(`/proc/${sleeper}`);
      return false;
    } catch {
      return true;
    }
  }, { what: "sleeper to die" });
});

Deno.test("a second Ctrl-C stops the wait at once and exits through runCli's error path", async () => {
  await using q = await tempQueue();
  // Our own runner, frozen once the command runs: the first Ctrl-C's cancel
  // is then never served, so only the second Ctrl-C can end the wait.
  await using runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const pidFile = join(q.workspace, "sleeper.pid");
  const self = selfCommand();
  const child = new Deno.Command(self.executable, {
    args: [
      ...self.prefix,
      ...["exec", "--backend", "host", "--queue", q.queueDir, "--"],
      ...["sh", "-c", `echo $$ > ${pidFile}; exec sleep 1000`],
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let sleeper = 0;
  let ended = false;
  try {
    await waitFor(async () => (await Deno.readTextFile(pidFile).catch(() => "")).trim() !== "", {
      what: "pid file",
      timeoutMs: 20_000,
    });
    sleeper = Number(await Deno.readTextFile(pidFile));
    Deno.kill(runner.pid, "SIGSTOP");
    child.kill("SIGINT");
    // The first Ctrl-C was handled once its cancel is in the host's inbound.db.
    const inbound = new DatabaseSync(queuePaths(q.queueDir).inbound, { readOnly: true });
    try {
      await waitFor(() => inbound.prepare("SELECT count(*) AS n FROM cancels").get()?.n === 1, {
        what: "the first Ctrl-C's cancel",
      });
    } finally {
      inbound.close();
    }
    child.kill("SIGINT");
    const out = await child.output();
    ended = true;
    const stderr = text(out.stderr);
    assert.equal(out.code, EXIT_CANCELLED, stderr);
    assert.match(
      stderr,
      /^waffle: Stopped waiting for request '[^']+' at a second Ctrl-C \(the first asked for its cancel\)\n$/,
    );
  } finally {
    if (!ended) {
      child.kill("SIGKILL");
      await child.output();
    }
    Deno.kill(runner.pid, "SIGCONT");
    if (sleeper > 0 && alive(sleeper)) Deno.kill(sleeper, "SIGKILL");
  }
});

Deno.test("waffle doctor reports the host queue round trip", async () => {
  const out = await runCliProcess(["doctor", "--json", "--no-docker"]);
  const report = JSON.parse(out.stdout);
  const row = report.checks.find((check: { name: string }) =>
    check.name.startsWith("queue round trip")
  );
  assert.ok(row, out.stdout);
  assert.equal(row.ok, true, row.detail);
  assert.ok(row.ms > 0);
});

Deno.test("waffle doctor reports the host's fs.protected_* sysctls and relies on none", async () => {
  const values = [
    "protected_symlinks",
    "protected_hardlinks",
    "protected_fifos",
    "protected_regular",
  ]
    .map((name) => {
      let value = "?";
      try {
        value = Deno.readTextFileSync(`/proc/sys/fs/${name}`).trim();
      } catch {
        // Doctor shows '?' for a value it cannot read.
      }
      return `${name}=${value}`;
    });
  const expected = `relies on none; ${values.join(" ")}`;
  const json = await runCliProcess(["doctor", "--json", "--no-docker"]);
  const report = JSON.parse(json.stdout);
  const row = report.checks.find((check: { name: string }) => check.name === "host sysctls");
  assert.ok(row, json.stdout);
  assert.equal(row.ok, true);
  assert.equal(row.detail, expected);
  const textOut = await runCliProcess(["doctor", "--no-docker"]);
  const line = textOut.stdout.split("\n").find((l) => l.includes("host sysctls"));
  assert.ok(line, textOut.stdout);
  assert.match(line, /^ok {4}host sysctls /);
  assert.ok(line.endsWith(`ms  ${expected}`), line);
});

Deno.test("waffle --version prints the version deno.json states, before any subcommand", async () => {
  const { version } = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));
  for (const flag of ["--version", "-V"]) {
    const out = await runCliProcess([flag]);
    assert.equal(out.code, 0, out.stderr);
    assert.equal(out.stdout, `waffle ${version}\n`);
    assert.equal(out.stderr, "");
  }
  // Traced, it loads no subcommand's module.
  const traced = await runCliProcess(["--version"], { env: { WAFFLE_TRACE: "1" } });
  assert.doesNotMatch(traced.stderr, /' loaded/);
});

Deno.test("waffle --help lists the commands; exec --help shows the exit codes", async () => {
  const top = await runCliProcess(["--help"]);
  assert.equal(top.code, 0);
  assert.match(top.stdout, /exec/);
  const exec = await runCliProcess(["exec", "--help"]);
  assert.equal(exec.code, 0);
  assert.match(exec.stdout, /124 timeout/);
  assert.match(exec.stdout, /NOT a sandbox/);
  assert.match(exec.stdout, /-i, --interactive/);
  assert.match(exec.stdout, /--output-cap BYTES/);
});
