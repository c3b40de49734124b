/**
 * The `waffle exec` / `wait` / `doctor` contract, driven as a real process
 * with the host backend (a real runner child process on the host filesystem).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { selfCommand } from "../lib/config/self.ts";
import { runCliProcess, tempQueue, text, waitFor } from "./_helpers.ts";

Deno.test("waffle exec exits with the command's status, 124 on timeout, 126, 127, 128+n", async () => {
  await using q = await tempQueue();
  const host = ["exec", "--backend", "host", "--queue", q.queueDir];
  const cases: [string[], number, RegExp | null][] = [
    [["true"], 0, null],
    [["sh", "-c", "exit 23"], 23, null],
    [["sh", "-c", "exit 124"], 124, null],
    [["--timeout", "0.3", "--", "sleep", "30"], 124, /timed out after/],
    [["/etc/passwd"], 126, /Cannot execute/],
    [["no-such-command-xyz"], 127, /not found/],
    [["sh", "-c", "kill -KILL $$"], 137, null],
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

Deno.test("waffle exec streams output and passes stdin through", async () => {
  await using q = await tempQueue();
  const out = await runCliProcess(
    ["exec", "--backend", "host", "--queue", q.queueDir, "--", "sh", "-c", "cat; echo err >&2"],
    { stdin: new TextEncoder().encode("from stdin\n") },
  );
  assert.equal(out.code, 0);
  assert.equal(out.stdout, "from stdin\n");
  assert.equal(out.stderr, "err\n");
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
    assert.equal(again.code, 125);
    assert.match(again.stderr, /already collected|No request/);
  }
  const second = (await runCliProcess(["exec", ...flags, "--detach", "--", "sh", "-c", "exit 6"]))
    .stdout.trim();
  const json = await runCliProcess(["wait", second, ...flags, "--json"]);
  assert.equal(json.code, 6);
  assert.equal(JSON.parse(json.stdout).exitCode, 6);
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
    assert.equal(out.code, 125, `${args.join(" ")}: ${out.stderr}`);
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
  assert.equal(out.code, 130);
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

Deno.test("waffle --help lists the commands; exec --help shows the exit codes", async () => {
  const top = await runCliProcess(["--help"]);
  assert.equal(top.code, 0);
  assert.match(top.stdout, /exec/);
  const exec = await runCliProcess(["exec", "--help"]);
  assert.equal(exec.code, 0);
  assert.match(exec.stdout, /124 timeout/);
  assert.match(exec.stdout, /NOT a sandbox/);
});
