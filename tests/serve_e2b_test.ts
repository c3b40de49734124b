/**
 * `waffle serve` driven by the unmodified E2B SDK (`npm:e2b@2.51.0`), as its
 * users call it: the three variables `E2B_API_KEY`, `E2B_API_URL` and
 * `E2B_SANDBOX_URL`, against a real `waffle serve` process (the CLI from
 * source) on loopback, with real sandboxes of the `base` image. Live tests
 * are registered ignored with the reason where Docker or the image is
 * missing; with `WAFFLE_REQUIRE_DOCKER=1` (CI) they fail instead.
 *
 * @module
 */
import assert from "node:assert/strict";
import { CommandExitError, NotFoundError, Sandbox, SandboxError, TimeoutError } from "e2b";
import { delay } from "./_helpers.ts";
import { sandboxKey } from "../lib/config/sandbox_key.ts";
import { statePaths } from "../lib/lifecycle/identity.ts";
import { STALE_AFTER_MS } from "../lib/queue/liveness.ts";
import { rawGet, rssOf, sdk, sdkTest, type Served } from "./_serve_helpers.ts";

sdkTest(
  "the E2B SDK creates a sandbox, runs commands with output and exit codes, moves files and kills it",
  async (served) => {
    const sandbox = await Sandbox.create("base", {
      ...sdk(served, served.keys.a),
      timeoutMs: 120_000,
    });
    assert.match(sandbox.sandboxId, /^[a-z0-9]+$/);

    const chunks: string[] = [];
    const ran = await sandbox.commands.run("echo out; echo err >&2; whoami; echo $X", {
      envs: { X: "from-envs" },
      onStdout: (data) => void chunks.push(data),
    });
    assert.equal(ran.exitCode, 0);
    assert.equal(ran.stdout, "out\nuser\nfrom-envs\n");
    assert.equal(ran.stderr, "err\n");
    assert.equal(chunks.join(""), ran.stdout);

    // A failing command: the SDK's own error, with the exact exit code.
    await assert.rejects(
      sandbox.commands.run("exit 7"),
      (error: unknown) => error instanceof CommandExitError && error.exitCode === 7,
    );

    // Files: text in the home, read back by a command; 8 MiB of binary both ways.
    await sandbox.files.write("/home/user/hello.txt", "hello from the SDK");
    assert.equal((await sandbox.commands.run("cat hello.txt")).stdout, "hello from the SDK");
    assert.equal(await sandbox.files.read("hello.txt"), "hello from the SDK");
    const big = new Uint8Array(8 * 1024 * 1024);
    for (let at = 0; at < big.byteLength; at += 65536) {
      crypto.getRandomValues(big.subarray(at, at + 65536));
    }
    await sandbox.files.write("big.bin", big.buffer);
    const back = await sandbox.files.read("big.bin", { format: "bytes" });
    assert.equal(back.byteLength, big.byteLength);
    assert.deepEqual(back, big);
    assert.equal(
      (await sandbox.commands.run("stat -c %s /workspace/big.bin")).stdout.trim(),
      String(big.byteLength),
    );
    await assert.rejects(sandbox.files.read("no-such-file"), NotFoundError);

    assert.equal(await sandbox.isRunning(), true);
    assert.equal(await sandbox.kill(), true);
    assert.equal(await sandbox.isRunning(), false);
    await assert.rejects(sandbox.commands.run("true"));
  },
);

sdkTest(
  "a key sees only its tenant's sandboxes; a wrong key, token or Host is refused",
  async (served) => {
    const mine = await Sandbox.create("base", sdk(served, served.keys.a));
    try {
      // Tenant b: not found, for connect, getInfo and kill alike.
      await assert.rejects(
        Sandbox.connect(mine.sandboxId, sdk(served, served.keys.b)),
        (error: unknown) => error instanceof SandboxError,
      );
      await assert.rejects(Sandbox.getInfo(mine.sandboxId, sdk(served, served.keys.b)));
      assert.equal(await Sandbox.kill(mine.sandboxId, sdk(served, served.keys.b)), false);
      assert.deepEqual(
        (await Sandbox.list(sdk(served, served.keys.b)).nextItems()).map((s) => s.sandboxId),
        [],
      );
      // A key that is not one.
      await assert.rejects(
        Sandbox.create("base", sdk(served, "e2b_" + "0".repeat(40))),
        (error: unknown) => error instanceof Error && /401|key/i.test(error.message),
      );
      // envd without the sandbox's token, and with another Host (DNS rebinding).
      const start = `${served.url}/process.Process/Start`;
      const headers = {
        "content-type": "application/connect+json",
        "e2b-sandbox-id": mine.sandboxId,
      };
      const noToken = await fetch(start, { method: "POST", headers, body: "" });
      assert.equal(noToken.status, 401);
      await noToken.body?.cancel();
      // fetch() will not send another Host: write the request by hand, as a
      // browser tricked by a rebound name would send it.
      assert.match(
        await rawGet(served.url, "/sandboxes", {
          host: "evil.example",
          "x-api-key": served.keys.a,
        }),
        /^HTTP\/1\.1 403 /,
      );
      assert.match(
        await rawGet(served.url, "/sandboxes", {
          host: new URL(served.url).host,
          origin: "http://evil.example",
          "x-api-key": served.keys.a,
        }),
        /^HTTP\/1\.1 403 /,
      );
      assert.match(
        await rawGet(served.url, "/sandboxes", {
          host: new URL(served.url).host,
          "x-api-key": served.keys.a,
        }),
        /^HTTP\/1\.1 200 /,
      );
      // The owner still works.
      assert.equal((await mine.commands.run("echo still")).stdout, "still\n");
    } finally {
      await mine.kill();
    }
  },
);

sdkTest(
  "metadata lists, setTimeout shortens, and the reaper removes an expired sandbox",
  async (served) => {
    const options = sdk(served, served.keys.a);
    const tagged = await Sandbox.create("base", { ...options, metadata: { job: "j1" } });
    const other = await Sandbox.create("base", { ...options, metadata: { job: "j2" } });
    try {
      const found = await Sandbox.list({ ...options, query: { metadata: { job: "j1" } } })
        .nextItems();
      assert.deepEqual(found.map((s) => s.sandboxId), [tagged.sandboxId]);
      assert.deepEqual(found[0]!.metadata, { job: "j1" });
      const info = await tagged.getInfo();
      assert.equal(info.sandboxId, tagged.sandboxId);
      assert.equal(info.state, "running");
      await other.setTimeout(1000);
      // Bounded: the reaper looks every second.
      for (let i = 0; i < 40 && await other.isRunning().catch(() => false); i++) await delay(250);
      assert.equal(await other.isRunning(), false);
      await assert.rejects(Sandbox.getInfo(other.sandboxId, options));
    } finally {
      await tagged.kill();
      await other.kill().catch(() => {});
    }
  },
);

/** A sandbox made through the REST API by hand: its id and envd token, for raw Connect calls. */
async function rawSandbox(served: Served): Promise<{ id: string; token: string }> {
  const made = await fetch(`${served.url}/v2/sandboxes`, {
    method: "POST",
    headers: { "x-api-key": served.keys.a, "content-type": "application/json" },
    body: JSON.stringify({ templateID: "base", timeout: 120 }),
  });
  assert.equal(made.status, 201);
  const body = await made.json();
  return { id: body.sandboxID, token: body.envdAccessToken };
}

/** A process event as Connect's JSON gives it (`{"event":{"data":{"stdout":"…"}}}`). */
type RawEvent = { event: Record<string, Record<string, unknown>> };

/**
 * Starts a server stream of envd's `process.Process` by hand (one enveloped
 * JSON request) and returns its response, unread.
 */
async function rawStream(
  served: Served,
  box: { id: string; token: string },
  call: { method: "Start" | "Connect"; message: unknown; headers?: Record<string, string> },
  signal?: AbortSignal,
): Promise<Response> {
  const json = new TextEncoder().encode(JSON.stringify(call.message));
  const envelope = new Uint8Array(5 + json.byteLength);
  new DataView(envelope.buffer).setUint32(1, json.byteLength);
  envelope.set(json, 5);
  const response = await fetch(`${served.url}/process.Process/${call.method}`, {
    method: "POST",
    headers: {
      "content-type": "application/connect+json",
      "connect-protocol-version": "1",
      "e2b-sandbox-id": box.id,
      "x-access-token": box.token,
      ...call.headers,
    },
    body: envelope,
    ...(signal === undefined ? {} : { signal }),
  });
  assert.equal(response.status, 200);
  return response;
}

/** The events of a Connect stream's body, read as the caller iterates (nothing read ahead). */
async function* rawEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<RawEvent> {
  const reader = body.getReader();
  let buffer = new Uint8Array(0);
  try {
    while (true) {
      while (buffer.byteLength >= 5) {
        const length = new DataView(buffer.buffer, buffer.byteOffset).getUint32(1);
        if (buffer.byteLength < 5 + length) break;
        const flags = buffer[0]!;
        const message = JSON.parse(new TextDecoder().decode(buffer.subarray(5, 5 + length)));
        buffer = buffer.slice(5 + length);
        if ((flags & 0x02) !== 0) {
          if (message.error !== undefined) throw new Error(JSON.stringify(message.error));
          return;
        }
        yield message;
      }
      const next = await reader.read();
      if (next.done) throw new Error("The stream ended without its end envelope");
      const joined = new Uint8Array(buffer.byteLength + next.value.byteLength);
      joined.set(buffer);
      joined.set(next.value, buffer.byteLength);
      buffer = joined;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** The bytes of a `data` event's stdout (base64 in Connect's JSON). */
function stdoutBytes(event: RawEvent): number {
  const data = event.event.data?.stdout;
  return typeof data === "string" ? atob(data).length : 0;
}

sdkTest(
  "the E2B SDK runs background commands: list, re-attach from another SDK object, stdin, kill",
  async (served) => {
    const sandbox = await Sandbox.create("base", {
      ...sdk(served, served.keys.a),
      timeoutMs: 120_000,
    });
    try {
      // Ticks until a file appears: the test decides when it ends, not a clock.
      const seen: string[] = [];
      const ticker = await sandbox.commands.run(
        "i=0; until [ -e /tmp/stop ]; do i=$((i+1)); echo tick $i; sleep 0.2; done; echo stopped",
        { background: true, onStdout: (data) => void seen.push(data) },
      );
      for (let i = 0; i < 50 && !seen.join("").includes("tick 2\n"); i++) await delay(100);
      assert.match(seen.join(""), /^tick 1\ntick 2\n/, "output streams while it runs");

      const listed = await sandbox.commands.list();
      const entry = listed.find((process) => process.pid === ticker.pid);
      assert.ok(entry !== undefined, JSON.stringify(listed));
      assert.equal(entry.cmd, "/bin/bash");
      assert.deepEqual(entry.args.slice(0, 2), ["-l", "-c"]);
      assert.match(entry.args[2]!, /^i=0; until/);

      // Another SDK object for the same sandbox re-attaches by pid and sees the rest.
      const again = await Sandbox.connect(sandbox.sandboxId, sdk(served, served.keys.a));
      const later: string[] = [];
      const attached = await again.commands.connect(ticker.pid, {
        onStdout: (data) => void later.push(data),
      });
      await sandbox.commands.run("touch /tmp/stop");
      const result = await attached.wait();
      assert.equal(result.exitCode, 0);
      assert.match(later.join(""), /stopped\n$/);
      const first = await ticker.wait();
      assert.equal(first.exitCode, 0);
      // Every tick once, in order, then the end: the command ran once.
      const ticks = first.stdout.trimEnd().split("\n");
      assert.equal(ticks.at(-1), "stopped");
      assert.deepEqual(ticks.slice(0, -1), ticks.slice(0, -1).map((_, i) => `tick ${i + 1}`));
      assert.equal(
        (await sandbox.commands.list()).some((process) => process.pid === ticker.pid),
        false,
      );

      // stdin: sent, closed, echoed; the exit code of cat.
      const cat = await sandbox.commands.run("cat", { background: true, stdin: true });
      await sandbox.commands.sendStdin(cat.pid, "x");
      await sandbox.commands.closeStdin(cat.pid);
      const catted = await cat.wait();
      assert.equal(catted.stdout, "x");
      assert.equal(catted.exitCode, 0);

      // kill: true for a running one (its handle ends with an error), false for an unknown pid.
      const sleeper = await sandbox.commands.run("sleep 60", { background: true });
      assert.equal(await sandbox.commands.kill(sleeper.pid), true);
      await assert.rejects(sleeper.wait(), CommandExitError);
      assert.equal(await sandbox.commands.kill(sleeper.pid), false);
      assert.equal(await sandbox.commands.kill(999_999), false);
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "a broken Start stream never runs its command again: it runs on and is re-attached by pid",
  async (served) => {
    const box = await rawSandbox(served);
    const sandbox = await Sandbox.connect(box.id, sdk(served, served.keys.a));
    try {
      const abort = new AbortController();
      const response = await rawStream(served, box, {
        method: "Start",
        message: {
          process: {
            cmd: "/bin/sh",
            args: [
              "-c",
              "echo run >> /workspace/runs; until [ -e /tmp/go ]; do sleep 0.1; done; echo end",
            ],
          },
        },
      }, abort.signal);
      const events = rawEvents(response.body!);
      const start = (await events.next()).value as RawEvent;
      const pid = start.event.start?.pid as number;
      assert.equal(typeof pid, "number");
      abort.abort();
      await events.return(undefined).catch(() => {});
      const attached = await sandbox.commands.connect(pid);
      await sandbox.commands.run("touch /tmp/go");
      assert.equal((await attached.wait()).stdout, "end\n");
      assert.equal((await sandbox.commands.run("cat /workspace/runs")).stdout, "run\n");
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "the E2B SDK's timeoutMs ends a command and kills its tree; root is refused, 'user' is uid 10001",
  async (served) => {
    const sandbox = await Sandbox.create("base", {
      ...sdk(served, served.keys.a),
      timeoutMs: 120_000,
    });
    try {
      await assert.rejects(
        sandbox.commands.run("sleep 30 & sleep 31; wait", { timeoutMs: 1500 }),
        TimeoutError,
      );
      // The lifetime is the server's too: the tree is gone, not only the stream.
      let left = "";
      for (let i = 0; i < 40; i++) {
        left = (await sandbox.commands.run("ps -eo args | grep '^sleep 3[01]' || true")).stdout;
        if (left === "") break;
        await delay(250);
      }
      assert.equal(left, "");

      await assert.rejects(
        sandbox.commands.run("whoami", { user: "root" }),
        (error: unknown) =>
          error instanceof SandboxError && /permission_denied/.test(error.message),
      );
      const user = await sandbox.commands.run("whoami; id -u", { user: "user" });
      assert.equal(user.stdout, "user\n10001\n");
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "the E2B SDK's PTY runs an interactive bash on a terminal, takes keys, resizes and is killed",
  async (served) => {
    const sandbox = await Sandbox.create("base", {
      ...sdk(served, served.keys.a),
      timeoutMs: 120_000,
    });
    try {
      const decoder = new TextDecoder();
      let screen = "";
      const terminal = await sandbox.pty.create({
        cols: 80,
        rows: 24,
        onData: (data) => void (screen += decoder.decode(data, { stream: true })),
      });
      const type = (line: string): Promise<void> =>
        sandbox.pty.sendInput(terminal.pid, new TextEncoder().encode(`${line}\n`));
      const shows = async (pattern: RegExp): Promise<boolean> => {
        for (let i = 0; i < 40 && !pattern.test(screen); i++) await delay(100);
        return pattern.test(screen);
      };
      await type('echo "term=$TERM tty=$(tty) $0 $-"; stty size');
      assert.ok(
        await shows(/term=xterm-256color tty=\/dev\/pts\/\d+ \S*bash \S*i\S*\r\n24 80\r\n/),
        screen,
      );
      await sandbox.pty.resize(terminal.pid, { cols: 100, rows: 30 });
      // The runner applies a size on its next look at the queue: ask until it shows.
      let resized = false;
      for (let i = 0; i < 10 && !resized; i++) {
        await type("stty size");
        resized = await shows(/[^\d]30 100\r\n/);
      }
      assert.ok(resized, screen);
      assert.equal(await sandbox.pty.kill(terminal.pid), true);
      await assert.rejects(terminal.wait(), CommandExitError);
      assert.equal(await sandbox.pty.kill(terminal.pid), false);
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "large output arrives whole, a slow reader holds the process back (memory bounded), idle streams get keepalives",
  async (served) => {
    const box = await rawSandbox(served);
    const sandbox = await Sandbox.connect(box.id, sdk(served, served.keys.a));
    try {
      // 20 MB of random bytes as base64, through the SDK, checked by hash.
      await sandbox.commands.run("head -c 20000000 /dev/urandom > /tmp/big");
      const big = await sandbox.commands.run("base64 /tmp/big", { timeoutMs: 120_000 });
      const digest = new Uint8Array(
        await crypto.subtle.digest("SHA-256", new TextEncoder().encode(big.stdout)),
      );
      const hex = [...digest].map((byte) => byte.toString(16).padStart(2, "0")).join("");
      assert.equal(
        (await sandbox.commands.run("base64 /tmp/big | sha256sum")).stdout,
        `${hex}  -\n`,
      );

      // 200 MB to a client that stops reading: the server holds a bounded part of it.
      const total = 200_000_000;
      const before = await rssOf(served.pid);
      const response = await rawStream(served, box, {
        method: "Start",
        message: {
          process: {
            cmd: "/bin/sh",
            args: ["-c", `head -c ${total} /dev/zero; echo -n > /tmp/done`],
          },
        },
        headers: { "connect-timeout-ms": "120000" },
      });
      const events = rawEvents(response.body!);
      let received = 0;
      let peak = before;
      let first = await events.next();
      assert.ok(first.value?.event.start !== undefined);
      first = await events.next();
      received += stdoutBytes(first.value as RawEvent);
      for (let i = 0; i < 20; i++) {
        await delay(100);
        peak = Math.max(peak, await rssOf(served.pid));
      }
      // Held back: the command has not written it all while nobody reads,
      // and the server holds a few MiB of it (without backpressure: most of
      // the 200 MB, in these two seconds).
      assert.equal(
        (await sandbox.commands.run("test -e /tmp/done && echo done || echo waiting")).stdout,
        "waiting\n",
      );
      assert.ok(
        peak - before < 64 * 1024 * 1024,
        `server memory grew by ${Math.round((peak - before) / 1048576)} MiB while nobody read`,
      );
      let count = 0;
      for await (const event of events) {
        received += stdoutBytes(event);
        if (++count % 200 === 0) peak = Math.max(peak, await rssOf(served.pid));
        if (event.event.end !== undefined) assert.equal(event.event.end.exited, true);
      }
      assert.equal(received, total);
      // While it streams, the 267 MB of JSON it becomes pass through the
      // heap as garbage not yet collected: bounded still, far below it all.
      assert.ok(
        peak - before < 160 * 1024 * 1024,
        `server memory grew by ${Math.round((peak - before) / 1048576)} MiB while read`,
      );

      // Keepalives on a silent stream, at the interval the client asks for.
      const silent = await rawStream(served, box, {
        method: "Start",
        message: { process: { cmd: "/bin/sleep", args: ["3"] } },
        headers: { "keepalive-ping-interval": "1" },
      });
      const kinds: string[] = [];
      for await (const event of rawEvents(silent.body!)) kinds.push(Object.keys(event.event)[0]!);
      assert.equal(kinds[0], "start");
      assert.equal(kinds.at(-1), "end");
      assert.ok(kinds.includes("keepalive"), kinds.join(","));
      assert.deepEqual(new Set(kinds.slice(1, -1)), new Set(["keepalive"]));
    } finally {
      await sandbox.kill();
    }
  },
);

const COUNTER = "i=0; while true; do echo $((i+=1)) > /home/user/c; sleep 0.2; done";
// Counts the counter's processes (this command's own line does not match the pattern).
const COUNT_COUNTERS =
  "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'i[+]=1'";

sdkTest(
  "e2b SDK: pause freezes a background counter, calls fail while paused, connect resumes it where it was",
  async (served) => {
    const opts = sdk(served, served.keys.a);
    const sandbox = await Sandbox.create(opts);
    try {
      const home = served.home;
      // The counter as the host sees it (the workspace is a bind mount).
      const workspace = statePaths(home, sandboxKey("a", sandbox.sandboxId, { home })).workspace;
      const count = (): number => {
        try {
          return Number(Deno.readTextFileSync(`${workspace}/c`).trim() || "0");
        } catch {
          return 0;
        }
      };
      const counter = await sandbox.commands.run(COUNTER, { background: true, timeoutMs: 0 });
      for (let i = 0; i < 200 && count() < 3; i++) await delay(50);
      assert.ok(count() >= 3, "the counter counts");

      assert.equal(await sandbox.pause(), true);
      const frozen = count();
      await delay(1500);
      assert.equal(count(), frozen, "the counter stopped while paused");
      assert.equal((await sandbox.getInfo()).state, "paused");
      assert.equal(await Sandbox.pause(sandbox.sandboxId, opts), false, "already paused: 409");
      await assert.rejects(
        Sandbox.pause(sandbox.sandboxId, sdk(served, served.keys.b)),
        NotFoundError,
      );
      const paused = new RegExp(`Sandbox '${sandbox.sandboxId}' is paused`);
      await assert.rejects(sandbox.commands.run("touch /home/user/late"), paused);
      await assert.rejects(sandbox.files.read("/home/user/c"), paused);
      assert.equal(await sandbox.isRunning(), false);
      // Past the time a silent runner is judged dead: the server's wait on
      // the counter must not recycle the sandbox or end the counter.
      await delay(STALE_AFTER_MS + 1000);
      assert.equal(count(), frozen);

      // connect resumes it (201), and the same counter goes on (not restarted at 1).
      const connect = (): Promise<Response> =>
        fetch(`${served.url}/sandboxes/${sandbox.sandboxId}/connect`, {
          method: "POST",
          headers: { "x-api-key": served.keys.a, "content-type": "application/json" },
          body: JSON.stringify({ timeout: 300 }),
        });
      const resumed = await connect();
      await resumed.body?.cancel();
      assert.equal(resumed.status, 201);
      const running = await connect();
      await running.body?.cancel();
      assert.equal(running.status, 200);
      const same = await Sandbox.connect(sandbox.sandboxId, opts);
      assert.equal((await same.getInfo()).state, "running");
      for (let i = 0; i < 200 && count() === frozen; i++) await delay(50);
      assert.ok(count() > frozen, `went on from ${frozen}, not from 1 (now ${count()})`);
      assert.equal((await same.commands.run(COUNT_COUNTERS)).stdout.trim(), "1");
      assert.ok((await same.commands.list()).some((p) => p.pid === counter.pid), "still listed");
      assert.equal(
        (await same.commands.run("test -e /home/user/late || echo never")).stdout,
        "never\n",
      );

      // Sandbox.connect resumes a paused sandbox too.
      assert.equal(await Sandbox.pause(sandbox.sandboxId, opts), true);
      const again = await Sandbox.connect(sandbox.sandboxId, opts);
      assert.equal((await again.commands.run("echo back")).stdout, "back\n");
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest("e2b SDK: a paused sandbox is removed at its end time", async (served) => {
  const opts = sdk(served, served.keys.a);
  const sandbox = await Sandbox.create({ ...opts, timeoutMs: 60_000 });
  assert.equal(await sandbox.pause(), true);
  await sandbox.setTimeout(1000);
  let gone = false;
  for (let i = 0; i < 100 && !gone; i++) {
    await delay(100);
    gone = !(await Sandbox.list(opts).nextItems()).some((s) => s.sandboxId === sandbox.sandboxId);
  }
  assert.ok(gone, "the reaper removed the paused sandbox");
  assert.deepEqual(await served.leftovers(), []);
});

sdkTest(
  "a shell's pwd names the home as E2B's does; a sandbox killed mid-command ends the stream as gone",
  async (served) => {
    const sandbox = await Sandbox.create("base", {
      ...sdk(served, served.keys.a),
      timeoutMs: 120_000,
    });
    assert.equal((await sandbox.commands.run("pwd")).stdout, "/home/user\n");
    await sandbox.commands.run("mkdir -p sub");
    assert.equal(
      (await sandbox.commands.run("pwd", { cwd: "/home/user/sub/" })).stdout,
      "/home/user/sub\n",
    );
    assert.equal((await sandbox.commands.run("pwd", { cwd: "/tmp" })).stdout, "/tmp\n");

    // The stream is cut, not ended, and /health then says the sandbox is gone.
    const sleeping = await sandbox.commands.run("sleep 60", { background: true });
    await sandbox.kill();
    const failure = await sleeping.wait().then(() => undefined, (cause: unknown) => cause);
    assert.ok(failure instanceof TimeoutError, `${failure}`);
    assert.match(failure.message, /sandbox was killed or reached its end of life/);
  },
);
