/**
 * waffle as a library for other projects: `sandbox.run` and `sandbox.spawn`
 * against a real sandbox, the README's example (`examples/library.ts`) run
 * from a directory outside the checkout (importing the checkout's
 * `lib/mod.ts`, and the installed `…/lib/waffle/mod.js`), input validation,
 * and `deno publish --dry-run`.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { UsageError } from "../lib/errors.ts";
import type { Backend } from "../lib/queue/backend.ts";
import { runIn, spawnIn } from "../lib/lifecycle/run.ts";
import { liveTest } from "./_docker_gate.ts";
import { tempHome, uniqueUser } from "./_sandbox_helpers.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const EXAMPLE = `${REPO}/examples/library.ts`;
/** The import line the README documents for an installed waffle. */
const INSTALLED_LINE = 'from "/usr/local/lib/waffle/mod.js"';
const encoder = new TextEncoder();
const decoder = new TextDecoder();

async function sh(
  argv: string[],
  options: { cwd?: string; env?: Record<string, string>; clearEnv?: boolean } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(argv[0]!, {
    args: argv.slice(1),
    ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
    ...(options.env === undefined ? {} : { env: options.env }),
    ...(options.clearEnv ? { clearEnv: true } : {}),
    stdin: "null",
  }).output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

async function readAll(stream: ReadableStream<Uint8Array>): Promise<string> {
  let text = "";
  for await (const chunk of stream) text += decoder.decode(chunk, { stream: true });
  return text + decoder.decode();
}

// Copies the example into a fresh directory outside the checkout, its import line pointed at `from`.
async function exampleOutside(from: string): Promise<{ dir: string; file: string }> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-outside-" });
  assert.ok(!dir.startsWith(`${REPO}/`));
  const source = await Deno.readTextFile(EXAMPLE);
  assert.ok(source.includes(INSTALLED_LINE), "the example imports waffle by the documented line");
  await Deno.writeTextFile(`${dir}/library.ts`, source.replace(INSTALLED_LINE, `from "${from}"`));
  return { dir, file: `${dir}/library.ts` };
}

function checkExampleOutput(stdout: string, user: string): void {
  assert.equal(
    stdout,
    [
      JSON.stringify({ exitCode: 3, stdout: "hello from /workspace\n", stderr: "oops\n" }),
      "wc: 4",
      "cat: streamed",
      "cat exited 0",
      "",
    ].join("\n"),
    `example as ${user}`,
  );
}

// A backend whose queue must never be reached: validation happens first.
const unreachable = {
  get queue(): never {
    throw new Error("queue reached");
  },
  ensure: () => Promise.reject(new Error("ensure reached")),
  submit: () => Promise.reject(new Error("submit reached")),
  close: () => {},
} as unknown as Backend;

Deno.test("library: run() and spawn() refuse bad arguments with one-line usage errors", async () => {
  const cases: [() => Promise<unknown>, RegExp][] = [
    [
      () => runIn(unreachable, "echo hi" as unknown as string[]),
      /^Argv must be an array, not a string \(no implicit shell: use \["sh", "-c", "echo hi"\]\), got 'echo hi'$/,
    ],
    [() => runIn(unreachable, []), /^Argv of run\(\) must be a non-empty array, got '\[\]'$/],
    [() => runIn(unreachable, ["a", 1 as unknown as string]), /^Argv items .* got '1'$/],
    [
      () => runIn(unreachable, ["true"], { timeout: 5 } as never),
      /^Unknown run\(\) option 'timeout' \(known: /,
    ],
    [
      () => runIn(unreachable, ["true"], { timeoutMs: -1 }),
      /^Option timeoutMs must be an integer from 1 to \d+, got '-1'$/,
    ],
    [
      () => runIn(unreachable, ["true"], { env: { "A=B": "x" } }),
      /^Env name 'A=B' is not a valid variable name$/,
    ],
    [() => runIn(unreachable, ["true"], { cwd: "" }), /^Cwd must be a non-empty path/],
    [
      () => runIn(unreachable, ["true"], { encoding: "utf16" as "text" }),
      /^Encoding must be "text" or "bytes", got 'utf16'$/,
    ],
    [
      () => runIn(unreachable, ["true"], { stdin: new Uint8Array(16 * 1024 * 1024 + 1) }),
      /^Stdin of 16777217 bytes exceeds the 16777216-byte limit: use spawn\(\) to stream it$/,
    ],
    [() => spawnIn(unreachable, ["cat"], { stdin: "x" } as never), /^Unknown spawn\(\) option/],
    [() => spawnIn(unreachable, ["cat"], { leaseMs: 10 }), /^Option leaseMs must be/],
    [
      () => spawnIn(unreachable, ["sh"], { tty: { rows: 0, cols: 80 } }),
      /^Option tty must be \{ rows, cols \} of integers from 1 to 4096, got '\{"rows":0,"cols":80\}'$/,
    ],
  ];
  for (const [call, message] of cases) {
    await assert.rejects(call, (error: unknown) => {
      assert.ok(error instanceof UsageError, String(error));
      assert.match(error.message, message);
      assert.ok(!error.message.includes("\n") && !error.message.endsWith("."), error.message);
      return true;
    });
  }
});

liveTest(
  "library: sandbox.run gives exit code, signal, output, stdin, cwd, env and timeout",
  async (docker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("run"));

    const ran = await sandbox.run(["sh", "-c", "echo out; echo err >&2; exit 7"]);
    assert.equal(ran.exitCode, 7);
    assert.equal(ran.signal, null);
    assert.equal(ran.success, false);
    assert.equal(ran.stdout, "out\n");
    assert.equal(ran.stderr, "err\n");
    assert.equal(ran.stdoutBytes, 4);
    assert.deepEqual(
      [ran.timedOut, ran.truncated, ran.cancelled, ran.interrupted],
      [false, false, false, false],
    );

    const ok = await sandbox.run(["true"]);
    assert.equal(ok.exitCode, 0);
    assert.equal(ok.success, true);

    const killed = await sandbox.run(["sh", "-c", "kill -9 $$"]);
    assert.equal(killed.signal, "SIGKILL");
    assert.equal(killed.exitCode, 137);

    const bytes = await sandbox.run(["printf", "\\377\\000a"], { encoding: "bytes" });
    assert.ok(bytes.stdout instanceof Uint8Array);
    assert.deepEqual([...bytes.stdout], [0xff, 0x00, 0x61]);

    const piped = await sandbox.run(["wc", "-c"], { stdin: "hello" });
    assert.equal(piped.stdout.trim(), "5");
    const binary = await sandbox.run(["od", "-An", "-tx1"], { stdin: new Uint8Array([1, 254]) });
    assert.equal(binary.stdout.trim(), "01 fe");

    await sandbox.run(["mkdir", "-p", "sub/dir"]);
    const cwd = await sandbox.run(["pwd"], { cwd: "sub/dir" });
    assert.equal(cwd.stdout, "/workspace/sub/dir\n");

    const env = await sandbox.run(["sh", "-c", 'printf %s "$GREETING"'], {
      env: { GREETING: "hi there" },
    });
    assert.equal(env.stdout, "hi there");

    const slow = await sandbox.run(["sleep", "30"], { timeoutMs: 500 });
    assert.equal(slow.timedOut, true);
    assert.equal(slow.success, false);

    const capped = await sandbox.run(["sh", "-c", "head -c 5000 /dev/zero"], { outputCap: 1000 });
    assert.equal(capped.truncated, true);
    assert.equal(capped.stdout.length, 1000);
    assert.equal(capped.stdoutBytes, 5000);

    const controller = new AbortController();
    const aborted = sandbox.run(["sleep", "30"], { signal: controller.signal });
    setTimeout(() => controller.abort(), 500);
    assert.equal((await aborted).cancelled, true);
  },
);

liveTest(
  "library: sandbox.spawn streams stdin to output while running, kill and status",
  async (docker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("spawn"));

    // cat echoes each line while it runs: the reply arrives before stdin ends.
    const cat = await sandbox.spawn(["cat"]);
    const writer = cat.stdin.getWriter();
    const reader = cat.stdout.getReader();
    for (const line of ["one\n", "two\n"]) {
      await writer.write(encoder.encode(line));
      let got = "";
      while (got.length < line.length) {
        const { value, done } = await reader.read();
        assert.ok(!done && value !== undefined, "output while the command runs");
        got += decoder.decode(value);
      }
      assert.equal(got, line);
    }
    await writer.close();
    const rest = await reader.read();
    assert.equal(rest.done, true);
    const catStatus = await cat.status;
    assert.equal(catStatus.exitCode, 0);
    assert.equal(catStatus.success, true);

    // Both streams, with cwd, env and an exit code.
    const both = await sandbox.spawn(["sh", "-c", 'echo "$X"; pwd >&2; exit 4'], {
      env: { X: "ex" },
      cwd: "/workspace",
    });
    await both.stdin.close();
    const [out, err] = await Promise.all([readAll(both.stdout), readAll(both.stderr)]);
    assert.deepEqual([out, err], ["ex\n", "/workspace\n"]);
    assert.equal((await both.status).exitCode, 4);

    // It runs on after its stdin ends (endGraceMs: 0), until killed.
    const sleeper = await sandbox.spawn(["sleep", "60"]);
    await sleeper.stdin.close();
    await new Promise((resolve) => setTimeout(resolve, 2500));
    await sleeper.kill();
    const killed = await sleeper.status;
    assert.equal(killed.cancelled, true);
    assert.equal(killed.success, false);

    const timed = await sandbox.spawn(["sleep", "60"], { timeoutMs: 500 });
    await timed.stdin.close();
    assert.equal((await timed.status).timedOut, true);

    // More output than a stream buffers, read to the end.
    const big = await sandbox.spawn(["sh", "-c", "head -c 3000000 /dev/zero"]);
    await big.stdin.close();
    let total = 0;
    for await (const chunk of big.stdout) total += chunk.byteLength;
    await big.stderr.cancel();
    assert.equal(total, 3_000_000);
    assert.equal((await big.status).stdoutBytes, 3_000_000);
  },
);

liveTest(
  "library: a resize sent right after spawn with a tty is applied before the input after it, over a socket and over rows (detached)",
  async (docker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("ttyr"));
    for (let i = 0; i < 8; i++) {
      const shell = await sandbox.spawn(["sh", "-c", "read x; stty size"], {
        tty: { rows: 24, cols: 80 },
        detached: i % 2 === 1,
      });
      await shell.resize({ rows: 40, cols: 100 + i });
      // The line is sent after the resize, so the runner has seen the size
      // before the shell reads it.
      const writer = shell.stdin.getWriter();
      await writer.write(encoder.encode("go\n"));
      await writer.close();
      const out = await readAll(shell.stdout);
      await shell.stderr.cancel();
      await shell.status;
      assert.match(
        out,
        new RegExp(`^go\r\n40 ${100 + i}\r\n$`),
        `run ${i}: ${JSON.stringify(out)}`,
      );
    }
  },
);

liveTest(
  "library: sandbox.spawn with a tty runs on a terminal of that size, and resize() changes it",
  async (docker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("tty"));
    // Each line read prints the terminal's size: the first one is the size asked for.
    const shell = await sandbox.spawn([
      "sh",
      "-c",
      "tty; stty size; while read x; do stty size; done",
    ], {
      tty: { rows: 12, cols: 34 },
    });
    const writer = shell.stdin.getWriter();
    const reader = shell.stdout.getReader();
    let seen = "";
    // A read still pending after a wait is kept for the next one: no chunk is lost.
    let pending: Promise<ReadableStreamReadResult<Uint8Array>> | undefined;
    const readUntil = async (pattern: RegExp): Promise<boolean> => {
      for (let i = 0; i < 20 && !pattern.test(seen); i++) {
        pending ??= reader.read();
        let timer: ReturnType<typeof setTimeout> | undefined;
        const next = await Promise.race([
          pending,
          new Promise<"waited">((resolve) => timer = setTimeout(() => resolve("waited"), 500)),
        ]).finally(() => clearTimeout(timer));
        if (next === "waited") return pattern.test(seen);
        pending = undefined;
        assert.ok(!next.done, `output ended early: ${JSON.stringify(seen)}`);
        seen += decoder.decode(next.value);
      }
      return pattern.test(seen);
    };
    assert.ok(await readUntil(/^\/dev\/pts\/\d+\r\n12 34\r\n/), JSON.stringify(seen));
    await shell.resize({ rows: 20, cols: 50 });
    // The runner applies a size on its next look at the queue: ask until it shows.
    let resized = false;
    for (let i = 0; i < 20 && !resized; i++) {
      await writer.write(encoder.encode("\n"));
      resized = await readUntil(/20 50\r\n/);
    }
    assert.ok(resized, JSON.stringify(seen));
    await assert.rejects(shell.resize({ rows: 5000, cols: 1 }), UsageError);
    await writer.close();
    await shell.kill();
    await reader.cancel();
    await shell.stderr.cancel();
    await shell.status;

    const plain = await sandbox.spawn(["true"]);
    await assert.rejects(
      plain.resize({ rows: 10, cols: 10 }),
      /^UsageError: Cannot resize a process without a terminal: spawn it with 'tty'$/,
    );
    await plain.stdin.close();
    await plain.stdout.cancel();
    await plain.stderr.cancel();
    await plain.status;
  },
);

liveTest(
  "library: the example runs from outside the checkout, importing lib/mod.ts",
  async (docker) => {
    await using home = await tempHome(docker);
    const { dir, file } = await exampleOutside(`${REPO}/lib/mod.ts`);
    try {
      const user = uniqueUser("example");
      const ran = await sh([Deno.execPath(), "run", "--allow-all", "--quiet", file, user], {
        cwd: dir,
        env: { WAFFLE_HOME: home.home, DENO_NO_UPDATE_CHECK: "1" },
      });
      assert.equal(ran.code, 0, ran.stderr);
      checkExampleOutput(ran.stdout, user);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

liveTest(
  "library: the example runs from outside the checkout, importing the installed mod.js",
  async (docker) => {
    await using home = await tempHome(docker);
    const prefix = await Deno.makeTempDir({ prefix: "waffle-prefix-" });
    const { dir, file } = await exampleOutside(`${prefix}/lib/waffle/mod.js`);
    try {
      const installed = await sh(
        ["bash", `${REPO}/scripts/install.sh`, "--prefix", prefix, "--no-docker"],
        { env: { WAFFLE_INSTALL_BUNDLE: "1" } },
      );
      assert.equal(installed.code, 0, installed.stderr);
      assert.ok((await Deno.stat(`${prefix}/lib/waffle/mod.js`)).isFile);
      const user = uniqueUser("installed");
      // No deno.json, no node_modules, no checkout: only the installed files.
      const ran = await sh(
        [`${prefix}/lib/waffle/deno`, "run", "--allow-all", "--quiet", "--no-config", file, user],
        {
          cwd: dir,
          clearEnv: true,
          env: { WAFFLE_HOME: home.home, DENO_NO_UPDATE_CHECK: "1", PATH: "/usr/bin:/bin" },
        },
      );
      assert.equal(ran.code, 0, ran.stderr);
      checkExampleOutput(ran.stdout, user);
      // The sandbox runs the installed CLI artefact, not the library bundle or the source tree.
      const [container] = await home.containers();
      const inspected = await docker.inspectContainer(container!.Id);
      assert.ok(
        inspected?.Config.Cmd.includes("/opt/waffle/app/waffle.js"),
        inspected?.Config.Cmd.join(" "),
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
      await Deno.remove(prefix, { recursive: true }).catch(() => {});
    }
  },
);

Deno.test("library: deno publish --dry-run is clean (offline)", async () => {
  const ran = await sh(
    [Deno.execPath(), "publish", "--dry-run", "--allow-dirty"],
    { cwd: REPO, env: { DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" } },
  );
  assert.equal(ran.code, 0, ran.stderr);
  const output = ran.stdout + ran.stderr;
  assert.match(output, /Success Dry run complete/);
  // Diagnostics look like `warning[rule]` (a file may be named mcp_warnings.ts).
  assert.doesNotMatch(output, /warning\[|error\[/i, output);
  assert.doesNotMatch(
    output,
    /file:\/\/\/.*\/(tests|examples|bench)\//,
    "only the package's files",
  );
});
