/**
 * `waffle mcp run` with a host-executed server, end to end and without
 * Docker: the official SDK client spawns `waffle mcp run`, which runs
 * server-everything from the package cache with waffle's own Deno. Real
 * processes only.
 *
 * The package cache is `$WAFFLE_MCP_CACHE` or `.tools/mcp-cache`, which
 * `scripts/setup.sh` fills; when the package is missing there, the first
 * test fetches it (network).
 */
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { type HandlerCalls, samplingClient } from "./_mcp_client.ts";

const REPO = dirname(dirname(fileURLToPath(import.meta.url)));
const MAIN = join(REPO, "main.ts");
const CACHE = Deno.env.get("WAFFLE_MCP_CACHE") || join(REPO, ".tools", "mcp-cache");
const EVERYTHING = "npm:@modelcontextprotocol/server-everything@2026.8.31";

const HOST_CONFIG = `[sandbox]
mode = "host"

[mcp.everything]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "host"
authority = "host"
env = ["GREETING"]
tools = ["echo", "get-env"]

[groups.main]
mode = "docker"

[groups.ops]
mode = "host"

[cron.nightly]
group = "ops"
mcp = ["everything"]
network = "none"
`;

interface Home {
  dir: string;
  config: string;
  [Symbol.asyncDispose](): Promise<void>;
}

async function tempHome(config: string): Promise<Home> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-mcp-relay-" });
  const path = join(dir, "waffle.toml");
  await Deno.writeTextFile(path, config);
  return {
    dir,
    config: path,
    async [Symbol.asyncDispose](): Promise<void> {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
}

function waffleEnv(home: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
    HOME: Deno.env.get("HOME") ?? "/root",
    WAFFLE_HOME: home,
    WAFFLE_MCP_CACHE: CACHE,
    DENO_NO_UPDATE_CHECK: "1",
    NO_COLOR: "1",
    ...extra,
  };
}

/** Processes whose working directory is in `dir` (a host server runs in its state directory under the waffle home). */
function processesIn(dir: string): number[] {
  const pids: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const cwd = Deno.readLinkSync(`/proc/${entry.name}/cwd`);
      if (cwd === dir || cwd.startsWith(`${dir}/`)) pids.push(Number(entry.name));
    } catch {
      // Gone, or not ours to read.
    }
  }
  return pids;
}

function alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch {
    return false;
  }
}

async function until(check: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (check()) return true;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return check();
}

async function runWaffle(
  args: string[],
  options: { env: Record<string, string>; stdin?: string; keepOpen?: boolean },
): Promise<{ code: number; stdout: string; stderr: string }> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", MAIN, ...args],
    env: options.env,
    clearEnv: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(options.stdin ?? "")).catch(() => {});
  // keepOpen: the client stays connected, so only the server can end the session.
  if (!options.keepOpen) await writer.close().catch(() => {});
  const out = await child.output();
  await writer.close().catch(() => {});
  return {
    code: out.code,
    stdout: new TextDecoder().decode(out.stdout),
    stderr: new TextDecoder().decode(out.stderr),
  };
}

function textOf(result: unknown): string {
  const content = (result as { content?: { type: string; text?: string }[] }).content ?? [];
  return content.filter((c) => c.type === "text").map((c) => c.text ?? "").join("");
}

Deno.test({
  name: "mcp run relays a host server through the SDK client under the tools and env policy",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn(): Promise<void> {
    await using home = await tempHome(HOST_CONFIG);
    const transport = new StdioClientTransport({
      command: Deno.execPath(),
      args: ["run", "--allow-all", MAIN, "mcp", "run", "everything", "--config", home.config],
      env: waffleEnv(home.dir, { GREETING: "hello-from-host", SECRET_TOKEN: "do-not-pass" }),
      stderr: "pipe",
    });
    let stderr = "";
    transport.stderr?.on("data", (chunk: Uint8Array) => stderr += new TextDecoder().decode(chunk));
    const client = new Client({ name: "waffle-relay-test", version: "1.0.0" });
    let listChanged = 0;
    client.setNotificationHandler("notifications/tools/list_changed", () => {
      listChanged++;
    });
    await client.connect(transport);
    const waffle = transport.pid!;
    try {
      const tools = await client.listTools();
      assert.deepEqual(tools.tools.map((t) => t.name).sort(), ["echo", "get-env"]);

      const echo = await client.callTool({
        name: "echo",
        arguments: { message: "secret-value-42" },
      });
      assert.equal(textOf(echo), "Echo: secret-value-42");

      const env = JSON.parse(textOf(await client.callTool({ name: "get-env", arguments: {} })));
      assert.equal(env.GREETING, "hello-from-host");
      assert.equal(env.SECRET_TOKEN, undefined, "a host variable outside the allowlist leaked");
      assert.equal(env.WAFFLE_HOME, undefined);
      assert.equal(env.PATH, "/usr/local/bin:/usr/bin:/bin");

      await assert.rejects(
        client.callTool({ name: "get-sum", arguments: { a: 1, b: 2 } }),
        /Tool 'get-sum' is not allowed by waffle policy/,
      );
      // server-everything announces its tools at start: the notification got through.
      assert.ok(await until(() => listChanged > 0, 2000), "tools/list_changed was not relayed");
      assert.ok(
        processesIn(home.dir).length > 0,
        "the server does not run in its state directory in the waffle home",
      );
    } finally {
      const started = Date.now();
      await client.close();
      assert.ok(
        await until(() => processesIn(home.dir).length === 0 && !alive(waffle), 5000),
        `left behind after close: ${processesIn(home.dir).join(", ")}; stderr: ${stderr}`,
      );
      assert.ok(Date.now() - started < 5000);
    }

    const audit = (await Deno.readTextFile(join(home.dir, "audit.jsonl"))).trim().split("\n")
      .map((line) => JSON.parse(line));
    const byTool = (tool: string): Record<string, unknown> => audit.find((r) => r.tool === tool);
    assert.equal(audit.length, 3);
    assert.deepEqual(byTool("echo").arguments, ["message"]);
    assert.equal(byTool("echo").outcome, "ok");
    assert.equal(byTool("echo").server, "everything");
    assert.equal(byTool("echo").group, "default");
    assert.equal(byTool("echo").cron, null);
    assert.equal(typeof byTool("echo").durationMs, "number");
    assert.ok(!Number.isNaN(Date.parse(byTool("echo").time as string)));
    assert.deepEqual(byTool("get-sum").arguments, ["a", "b"]);
    assert.equal(byTool("get-sum").outcome, "denied");
    const text = await Deno.readTextFile(join(home.dir, "audit.jsonl"));
    assert.ok(!text.includes("secret-value-42"), "an argument value reached the audit log");
    assert.equal((await Deno.stat(join(home.dir, "audit.jsonl"))).mode! & 0o777, 0o600);
  },
});

Deno.test("mcp run refuses a denied server with 125 before starting anything", async () => {
  await using home = await tempHome(HOST_CONFIG);
  const env = waffleEnv(home.dir);
  for (const subject of [["--cron", "nightly"], ["--group", "main"]]) {
    const { code, stdout, stderr } = await runWaffle(
      ["mcp", "run", "everything", "--config", home.config, ...subject],
      { env },
    );
    assert.equal(code, 125, stderr);
    assert.equal(stdout, "");
    assert.equal(stderr.trim().split("\n").length, 1, stderr);
    assert.match(
      stderr,
      /^waffle: Server 'everything' is denied for (cron 'nightly'|group 'main'): /,
    );
    assert.deepEqual(processesIn(home.dir), []);
    // Nothing ran: not even the audit log was opened.
    await assert.rejects(Deno.stat(join(home.dir, "audit.jsonl")), Deno.errors.NotFound);
  }
});

Deno.test("mcp run names the configured servers when NAME is unknown", async () => {
  await using home = await tempHome(HOST_CONFIG);
  const { code, stdout, stderr } = await runWaffle(
    ["mcp", "run", "nope", "--config", home.config],
    { env: waffleEnv(home.dir) },
  );
  assert.equal(code, 125);
  assert.equal(stdout, "");
  assert.match(stderr, /Unknown MCP server 'nope'.*configured: 'everything'/);
});

/** A host `command` server: waffle's Deno evaluating `code`. */
function scriptConfig(code: string): string {
  return `[sandbox]
mode = "host"

[mcp.script]
command = ${JSON.stringify(Deno.execPath())}
args = ["eval", ${JSON.stringify(code)}]
execution = "host"
authority = "host"
`;
}

const PING = '{"jsonrpc":"2.0","id":1,"method":"ping"}\n';

// A host script server answering each request line; `answer` is the body of
// `async (m) => {...}` given each parsed message, `out(text)` writes a line.
function answeringServer(answer: string, options: { exitAfter: number }): string {
  return `
    const enc = new TextEncoder();
    const writer = Deno.stdout.writable.getWriter();
    const out = (s) => writer.write(enc.encode(s + "\\n"));
    const dec = new TextDecoder();
    let buf = "";
    let seen = 0;
    const handle = async (m) => { ${answer} };
    for await (const chunk of Deno.stdin.readable) {
      buf += dec.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf("\\n")) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        await handle(JSON.parse(line));
        if (++seen === ${options.exitAfter}) {
          await new Promise((r) => setTimeout(r, 300));
          Deno.exit(0);
        }
      }
    }
  `;
}

function scriptConfigWith(code: string, extra: string): string {
  return `${scriptConfig(code)}${extra}\n`;
}

function byId(stdout: string): Map<unknown, Record<string, unknown>> {
  const lines = stdout.trim().split("\n").map((line) => JSON.parse(line));
  return new Map(lines.map((message) => [message.id, message]));
}

const CAP = 1024 * 1024;

Deno.test("mcp run answers a message over max_message_bytes with an error naming the cap, and the session goes on", async () => {
  // Request 1's answer is over the cap, with its top-level id after a
  // nested "id" (the scan must not take that one); a notification over the
  // cap is dropped; every other request is answered.
  const code = answeringServer(
    `
    const big = "x".repeat(${2 * CAP});
    if (m.id === 1) await out('{"jsonrpc":"2.0","result":{"id":99,"content":[{"type":"text","text":"' + big + '"}]},"id":1}');
    else if (m.id !== undefined) await out(JSON.stringify({ jsonrpc: "2.0", id: m.id, result: { content: [] } }));
    if (m.id === 2) await out('{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"' + big + '"}}');
  `,
    { exitAfter: 3 },
  );
  await using home = await tempHome(scriptConfigWith(code, `max_message_bytes = ${CAP}`));
  const call = (id: number, args: unknown) =>
    JSON.stringify({
      jsonrpc: "2.0",
      id,
      method: "tools/call",
      params: { name: "echo", arguments: args },
    }) + "\n";
  const stdin = call(1, {}) + call(2, {}) + call(3, { message: "z".repeat(2 * CAP) }) +
    call(4, {});
  const result = await runWaffle(["mcp", "run", "script", "--config", home.config], {
    env: waffleEnv(home.dir),
    stdin,
    keepOpen: true,
  });
  // The server ended by itself after three requests (request 3 never reached it).
  assert.match(result.stderr, /Server 'script' ended: exited with status 0/);
  const answers = byId(result.stdout);
  assert.deepEqual([...answers.keys()].sort(), [1, 2, 3, 4]);
  const tooLarge = (id: number) => answers.get(id)!.error as Record<string, unknown>;
  assert.equal(tooLarge(1).code, -32603);
  assert.match(
    String(tooLarge(1).message),
    new RegExp(
      `^Server 'script' sent a message of \\d+ bytes, over max_message_bytes \\(${CAP}\\) of server 'script'; raise \\[mcp\\.script\\] max_message_bytes$`,
    ),
  );
  assert.deepEqual(
    (tooLarge(1).data as Record<string, unknown>).key,
    "mcp.script.max_message_bytes",
  );
  assert.match(
    String(tooLarge(3).message),
    /^The client sent a message of \d+ bytes, over max_message_bytes/,
  );
  assert.deepEqual(answers.get(2)!.result, { content: [] });
  assert.deepEqual(answers.get(4)!.result, { content: [] });
  // The notification over the cap was dropped with a note, never forwarded.
  assert.ok(![...answers.values()].some((m) => m.method !== undefined));
  assert.match(
    result.stderr,
    /Server 'script' sent a message of \d+ bytes, over max_message_bytes/,
  );
  const outcomes = auditLines(home).map((line) => line.outcome);
  assert.deepEqual(outcomes.toSorted(), ["ok", "ok", "too_large", "too_large"]);
});

Deno.test("mcp run answers a line that is not JSON with -32700 and an invalid request with -32600 and its id", async () => {
  const code = answeringServer(
    `if (m.id !== undefined) await out(JSON.stringify({ jsonrpc: "2.0", id: m.id, result: {} }));`,
    { exitAfter: 1 },
  );
  await using home = await tempHome(scriptConfig(code));
  const result = await runWaffle(["mcp", "run", "script", "--config", home.config], {
    env: waffleEnv(home.dir),
    stdin: 'not json\n{"jsonrpc":"2.0","id":7,"method":5}\n[1,2]\n' + PING,
    keepOpen: true,
  });
  const lines = result.stdout.trim().split("\n").map((line) => JSON.parse(line));
  assert.equal(lines.length, 4, result.stdout);
  assert.equal(lines[0].id, null);
  assert.equal(lines[0].error.code, -32700);
  assert.match(lines[0].error.message, /^Parse error: not JSON/);
  assert.equal(lines[1].id, 7);
  assert.equal(lines[1].error.code, -32600);
  assert.match(lines[1].error.message, /^Invalid request: /);
  assert.equal(lines[2].id, null);
  assert.equal(lines[2].error.code, -32600);
  assert.deepEqual(lines[3], { jsonrpc: "2.0", id: 1, result: {} });
});

Deno.test("mcp run relays a cancellation and audits the call as cancelled, in order, dropping its late answer", async () => {
  // Call 1 is held; after the cancellation and call 2, the server answers
  // call 2, then (late) call 1.
  const code = answeringServer(
    `
    if (m.method === "notifications/cancelled") globalThis.cancelled = m.params.requestId;
    if (m.id === 2) {
      await out(JSON.stringify({ jsonrpc: "2.0", id: 2, result: { content: [], cancelled: globalThis.cancelled } }));
      await out(JSON.stringify({ jsonrpc: "2.0", id: 1, result: { content: [] } }));
    }
  `,
    { exitAfter: 3 },
  );
  await using home = await tempHome(scriptConfig(code));
  const call = (id: number, tool: string) =>
    JSON.stringify({ jsonrpc: "2.0", id, method: "tools/call", params: { name: tool } }) + "\n";
  const cancel = JSON.stringify({
    jsonrpc: "2.0",
    method: "notifications/cancelled",
    params: { requestId: 1, reason: "user" },
  }) + "\n";
  const result = await runWaffle(["mcp", "run", "script", "--config", home.config], {
    env: waffleEnv(home.dir),
    // The cancelled id used again before its late answer: refused, so that
    // answer can never stand for the new request.
    stdin: call(1, "slow") + cancel + call(1, "reused") + call(2, "fast"),
    keepOpen: true,
  });
  // Only call 2's answer reaches the client; the cancellation reached the server.
  assert.deepEqual(
    result.stdout.trim().split("\n").map((line) => JSON.parse(line)),
    [
      { jsonrpc: "2.0", id: 1, error: { code: -32600, message: "Request id is already pending" } },
      { jsonrpc: "2.0", id: 2, result: { content: [], cancelled: 1 } },
    ],
  );
  assert.doesNotMatch(result.stderr, /to no pending request/);
  const audit = auditLines(home);
  assert.deepEqual(audit.map((line) => [line.tool, line.outcome]), [
    ["slow", "cancelled"],
    ["fast", "ok"],
  ]);
});

Deno.test("mcp run exits 1 with a one-line reason when the server dies", async () => {
  const code = `
    const reader = Deno.stdin.readable.getReader();
    await reader.read();
    console.error("bye \\x1b[31mred");
    Deno.exit(3);
  `;
  await using home = await tempHome(scriptConfig(code));
  const { code: status, stdout, stderr } = await runWaffle(
    ["mcp", "run", "script", "--config", home.config],
    { env: waffleEnv(home.dir), stdin: PING, keepOpen: true },
  );
  assert.equal(status, 1, stderr);
  assert.equal(stdout, "");
  assert.match(stderr, /^waffle: Server 'script' ended: exited with status 3$/m);
  // The server's stderr is forwarded, its escape sequence escaped (never sent).
  assert.match(stderr, /bye \\x1b\[31mred/);
  assert.ok(!stderr.includes("\x1b"), "an ESC reached stderr");
});

Deno.test("mcp run on SIGTERM kills a server that ignores end of input and exits 143", async () => {
  const code = `
    Deno.addSignalListener("SIGTERM", () => {});
    await new Promise((r) => setTimeout(r, 60000));
  `;
  await using home = await tempHome(scriptConfig(code));
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", MAIN, "mcp", "run", "script", "--config", home.config],
    env: waffleEnv(home.dir),
    clearEnv: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(PING));
  assert.ok(await until(() => processesIn(home.dir).length > 0, 10000), "the server never started");
  const started = Date.now();
  child.kill("SIGTERM");
  const out = await child.output();
  await writer.close().catch(() => {});
  assert.equal(out.code, 143, new TextDecoder().decode(out.stderr));
  assert.ok(await until(() => processesIn(home.dir).length === 0, 1000));
  assert.ok(Date.now() - started < 2000);
});

Deno.test("mcp run never forwards a request dressed as a notification, nor lets a pending id be reused", async () => {
  // A real server process that logs every line it receives and answers each
  // request after a pause, listing an allowed and a disallowed tool.
  const code = `
    const seen = [];
    let buffer = "";
    for await (const bytes of Deno.stdin.readable) {
      buffer += new TextDecoder().decode(bytes);
      let at;
      while ((at = buffer.indexOf("\\n")) >= 0) {
        const line = buffer.slice(0, at);
        buffer = buffer.slice(at + 1);
        Deno.writeTextFileSync(Deno.env.get("SEEN"), line + "\\n", { append: true });
        const message = JSON.parse(line);
        if (message.id === undefined) continue;
        await new Promise((r) => setTimeout(r, 300));
        const result = { tools: [{ name: "a", inputSchema: { type: "object" } }, { name: "secret", inputSchema: { type: "object" } }] };
        await Deno.stdout.write(new TextEncoder().encode(JSON.stringify({ jsonrpc: "2.0", id: message.id, result }) + "\\n"));
      }
    }
  `;
  await using home = await tempHome(`${scriptConfig(code)}env = ["SEEN"]\ntools = ["a"]\n`);
  const seen = `${home.dir}/seen.log`;
  const input = [
    '{"jsonrpc":"2.0","method":"tools/call","params":{"name":"secret","arguments":{"x":1}}}',
    '{"jsonrpc":"2.0","method":"notifications/initialized"}',
    '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
    '{"jsonrpc":"2.0","id":1,"method":"ping"}',
  ].join("\n") + "\n";
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", MAIN, "mcp", "run", "script", "--config", home.config],
    env: waffleEnv(home.dir, { SEEN: seen }),
    clearEnv: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(input));
  const reader = child.stdout.getReader();
  let out = "";
  while (out.split("\n").length < 3) {
    const { value, done } = await reader.read();
    if (done) break;
    out += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  await writer.close();
  const result = await child.output();
  const lines = out.trim().split("\n").map((line) => JSON.parse(line));
  // The reused id is refused by the relay; the list that answers id 1 is filtered.
  assert.equal(lines[0].id, 1);
  assert.match(lines[0].error.message, /already pending/);
  assert.deepEqual(lines[1].result.tools.map((tool: { name: string }) => tool.name), ["a"]);
  const received = Deno.readTextFileSync(seen);
  assert.doesNotMatch(received, /secret/, "the disguised tools/call never reached the server");
  assert.match(received, /notifications\/initialized/);
  assert.match(
    new TextDecoder().decode(result.stderr),
    /dropped a client notification 'tools\/call'/,
  );
});

Deno.test("the line reader holds a byte-at-a-time line in one buffer, not a piece per byte", async () => {
  const { readLines } = await import("../lib/mcp/jsonrpc.ts");
  const total = 1_000_000;
  let sent = 0;
  // Pulled one byte at a time, as a server writing single bytes arrives.
  const stream = new ReadableStream<Uint8Array>({
    pull(controller): void {
      if (sent < total) {
        controller.enqueue(new Uint8Array([0x61]));
        sent++;
      } else {
        controller.enqueue(new TextEncoder().encode("\n"));
        controller.close();
      }
    },
  }, { highWaterMark: 0 });
  const before = Deno.memoryUsage().rss;
  let length = 0;
  for await (const line of readLines(stream)) {
    length = line instanceof Uint8Array ? line.byteLength : -1;
  }
  const grownMiB = (Deno.memoryUsage().rss - before) / 1024 / 1024;
  assert.equal(length, total);
  // A piece per byte cost ~400 bytes each (384 MiB here before the fix).
  assert.ok(grownMiB < 64, `RSS grew ${grownMiB.toFixed(0)} MiB`);
});

Deno.test("the line reader reads through a line over the cap without holding it, and finds its top-level id and method", async () => {
  const { readLines, OversizedLine } = await import("../lib/mcp/jsonrpc.ts");
  const cap = 1024 * 1024;
  const piece = new TextEncoder().encode("y".repeat(1024 * 1024));
  const pieces = 256; // 256 MiB in all, in one line
  let sent = -1;
  const head = new TextEncoder().encode(
    '{"jsonrpc":"2.0","params":{"id":"nested","method":"inner","s":"a\\"}{"},"method":"tools/call","big":"',
  );
  const tail = new TextEncoder().encode(
    '","id":"top"}\n{"jsonrpc":"2.0","id":2,"method":"ping"}\n',
  );
  const stream = new ReadableStream<Uint8Array>({
    pull(controller): void {
      if (sent === -1) controller.enqueue(head);
      else if (sent < pieces) controller.enqueue(piece);
      else {
        controller.enqueue(tail);
        controller.close();
      }
      sent++;
    },
  }, { highWaterMark: 0 });
  const before = Deno.memoryUsage().rss;
  const lines = [];
  for await (const line of readLines(stream, { maxBytes: cap })) lines.push(line);
  const grownMiB = (Deno.memoryUsage().rss - before) / 1024 / 1024;
  const over = lines[0];
  assert.ok(over instanceof OversizedLine);
  assert.equal(over.bytes, head.byteLength + pieces * piece.byteLength + tail.indexOf(0x0a));
  assert.equal(over.id, "top");
  assert.equal(over.method, "tools/call");
  assert.equal(
    new TextDecoder().decode(lines[1] as Uint8Array),
    '{"jsonrpc":"2.0","id":2,"method":"ping"}',
  );
  assert.ok(grownMiB < 64, `RSS grew ${grownMiB.toFixed(0)} MiB`);
});

// ---------------------------------------------------------------------------
// Requests from the server to the client (client_requests).

/**
 * A host server that, on its first input line, asks the client for sampling,
 * elicitation, roots and a ping (in that order) and sends a notification;
 * every line it receives is appended to $SEEN.
 */
const ASKING_SERVER = `
  const seen = Deno.env.get("SEEN");
  const out = (m) => Deno.stdout.write(new TextEncoder().encode(JSON.stringify(m) + "\\n"));
  let buffer = "";
  let asked = false;
  for await (const bytes of Deno.stdin.readable) {
    buffer += new TextDecoder().decode(bytes);
    let at;
    while ((at = buffer.indexOf("\\n")) >= 0) {
      const line = buffer.slice(0, at);
      buffer = buffer.slice(at + 1);
      Deno.writeTextFileSync(seen, line + "\\n", { append: true });
      if (asked) continue;
      asked = true;
      await out({ jsonrpc: "2.0", id: "s1", method: "sampling/createMessage", params: { messages: [], maxTokens: 1 } });
      await out({ jsonrpc: "2.0", id: "e1", method: "elicitation/create", params: { message: "Your password?", requestedSchema: { type: "object", properties: {} } } });
      await out({ jsonrpc: "2.0", id: "r1", method: "roots/list" });
      await out({ jsonrpc: "2.0", id: "p1", method: "ping" });
      await out({ jsonrpc: "2.0", method: "notifications/message", params: { level: "info", data: "hello" } });
    }
  }
`;

/** Two host servers running `code`: `strict` with the default client_requests, `llm` with sampling and elicitation. */
function askingConfig(code: string): string {
  const server = (name: string, extra: string): string => `
[mcp.${name}]
command = ${JSON.stringify(Deno.execPath())}
args = ["eval", ${JSON.stringify(code)}]
execution = "host"
authority = "host"
env = ["SEEN"]
${extra}`;
  return `[sandbox]\nmode = "host"\n${server("strict", "")}${
    server("llm", `client_requests = ["sampling/createMessage", "elicitation/create"]\n`)
  }`;
}

/** A raw stdio client of `waffle mcp run NAME`: real pipes, one JSON message per line. */
function rawClient(home: Home, name: string, env: Record<string, string>): {
  send: (...messages: unknown[]) => Promise<void>;
  read: (count: number) => Promise<Record<string, unknown>[]>;
  finish: () => Promise<{ code: number; stdout: string; stderr: string }>;
} {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", MAIN, "mcp", "run", name, "--config", home.config],
    env: waffleEnv(home.dir, env),
    clearEnv: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  const reader = child.stdout.getReader();
  let pending = "";
  let rest = "";
  return {
    send: (...messages) =>
      writer.write(
        new TextEncoder().encode(messages.map((m) => `${JSON.stringify(m)}\n`).join("")),
      ),
    async read(count): Promise<Record<string, unknown>[]> {
      const lines: string[] = [];
      while (lines.length < count) {
        const at = pending.indexOf("\n");
        if (at >= 0) {
          lines.push(pending.slice(0, at));
          pending = pending.slice(at + 1);
          continue;
        }
        const { value, done } = await reader.read();
        if (done) break;
        pending += new TextDecoder().decode(value);
      }
      return lines.map((line) => JSON.parse(line));
    },
    async finish(): Promise<{ code: number; stdout: string; stderr: string }> {
      await writer.close().catch(() => {});
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        rest += new TextDecoder().decode(value);
      }
      const status = await child.status;
      const stderr = await new Response(child.stderr).text();
      return { code: status.code, stdout: pending + rest, stderr };
    },
  };
}

function seenLines(path: string): Record<string, unknown>[] {
  try {
    return Deno.readTextFileSync(path).trim().split("\n").filter((l) => l !== "").map((l) =>
      JSON.parse(l)
    );
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return [];
    throw error;
  }
}

function auditLines(home: Home): Record<string, unknown>[] {
  return Deno.readTextFileSync(join(home.dir, "audit.jsonl")).trim().split("\n").map((l) =>
    JSON.parse(l)
  );
}

Deno.test("mcp run refuses a server's sampling and elicitation by default, passes roots/list and ping, and drops client replies to refused ids", async () => {
  await using home = await tempHome(askingConfig(ASKING_SERVER));
  const seen = join(home.dir, "seen.log");
  const client = rawClient(home, "strict", { SEEN: seen });
  await client.send({ jsonrpc: "2.0", method: "notifications/initialized" });
  // The server asked in the order s1, e1, r1, p1: the relay handled the first
  // two before the client got r1, so nothing of them can come later.
  const shown = await client.read(3);
  assert.deepEqual(shown.map((m) => [m.id ?? null, m.method]), [
    ["r1", "roots/list"],
    ["p1", "ping"],
    [null, "notifications/message"],
  ]);
  // Replies to the refused ids (the client never saw them) must not reach the server.
  await client.send(
    { jsonrpc: "2.0", id: "s1", result: { forged: "sampling" } },
    { jsonrpc: "2.0", id: "e1", result: { forged: "elicitation" } },
    { jsonrpc: "2.0", id: "r1", result: { roots: [] } },
    { jsonrpc: "2.0", id: "p1", result: {} },
  );
  assert.ok(
    await until(() => seenLines(seen).some((m) => m.id === "p1"), 10_000),
    "the ping answer never reached the server",
  );
  const result = await client.finish();
  assert.equal(result.code, 0, result.stderr);
  assert.equal(result.stdout, "", "the client got nothing more");

  const received = seenLines(seen);
  const byId = (id: string): Record<string, unknown>[] => received.filter((m) => m.id === id);
  for (const [id, method] of [["s1", "sampling/createMessage"], ["e1", "elicitation/create"]]) {
    assert.equal(byId(id!).length, 1, `one answer to ${id}: ${JSON.stringify(byId(id!))}`);
    const error = byId(id!)[0]!.error as { code: number; message: string };
    assert.equal(error.code, -32601);
    assert.equal(
      error.message,
      `Request '${method}' from server 'strict' is not allowed by waffle policy; list it in mcp.strict.client_requests to allow it`,
    );
  }
  assert.deepEqual(byId("r1"), [{ jsonrpc: "2.0", id: "r1", result: { roots: [] } }]);
  assert.deepEqual(byId("p1"), [{ jsonrpc: "2.0", id: "p1", result: {} }]);
  assert.doesNotMatch(Deno.readTextFileSync(seen), /forged/);
  assert.match(result.stderr, /refused request 'sampling\/createMessage' from server 'strict'/);
  assert.match(result.stderr, /dropped a response from the client to no pending request/);

  const audit = auditLines(home);
  assert.deepEqual(
    audit.map((r) => [r.from, r.method, r.outcome, r.server]),
    [
      ["server", "sampling/createMessage", "refused", "strict"],
      ["server", "elicitation/create", "refused", "strict"],
      ["server", "roots/list", "ok", "strict"],
      ["server", "ping", "ok", "strict"],
    ],
  );
  for (const line of audit) {
    assert.equal(line.tool, undefined);
    assert.equal(line.group, "default");
    assert.equal(typeof line.durationMs, "number");
  }
  assert.doesNotMatch(JSON.stringify(audit), /password/, "a request's params are never logged");
});

Deno.test("mcp run forwards sampling and elicitation when listed, and the list replaces the default", async () => {
  await using home = await tempHome(askingConfig(ASKING_SERVER));
  const seen = join(home.dir, "seen.log");
  const client = rawClient(home, "llm", { SEEN: seen });
  await client.send({ jsonrpc: "2.0", method: "notifications/initialized" });
  const shown = await client.read(3);
  assert.deepEqual(shown.map((m) => [m.id ?? null, m.method]), [
    ["s1", "sampling/createMessage"],
    ["e1", "elicitation/create"],
    [null, "notifications/message"],
  ]);
  assert.deepEqual(shown[1]!.params, {
    message: "Your password?",
    requestedSchema: { type: "object", properties: {} },
  });
  await client.send(
    { jsonrpc: "2.0", id: "r1", result: { roots: [{ uri: "file:///forged" }] } },
    { jsonrpc: "2.0", id: "s1", result: { role: "assistant", model: "m", content: {} } },
    { jsonrpc: "2.0", id: "e1", error: { code: -1, message: "declined" } },
  );
  assert.ok(await until(() => seenLines(seen).some((m) => m.id === "e1" && m.error), 10_000));
  const result = await client.finish();
  assert.equal(result.code, 0, result.stderr);
  const received = seenLines(seen);
  const byId = (id: string): Record<string, unknown>[] => received.filter((m) => m.id === id);
  assert.deepEqual(byId("s1"), [{
    jsonrpc: "2.0",
    id: "s1",
    result: { role: "assistant", model: "m", content: {} },
  }]);
  assert.deepEqual(byId("e1"), [{
    jsonrpc: "2.0",
    id: "e1",
    error: { code: -1, message: "declined" },
  }]);
  // roots/list and ping are not in this server's list: refused, whatever the client says.
  for (const id of ["r1", "p1"]) {
    assert.equal(byId(id).length, 1);
    assert.match(
      (byId(id)[0]!.error as { message: string }).message,
      /not allowed by waffle policy; list it in mcp\.llm\.client_requests/,
    );
  }
  assert.doesNotMatch(Deno.readTextFileSync(seen), /forged/);
  assert.deepEqual(
    auditLines(home).map((r) => [r.method, r.outcome]),
    [
      ["roots/list", "refused"],
      ["ping", "refused"],
      ["sampling/createMessage", "ok"],
      ["elicitation/create", "error"],
    ],
  );
});

Deno.test("mcp run refuses a second server request under a pending id and audits the unanswered one", async () => {
  const code = `
    const seen = Deno.env.get("SEEN");
    const out = (m) => Deno.stdout.write(new TextEncoder().encode(JSON.stringify(m) + "\\n"));
    let asked = false;
    for await (const bytes of Deno.stdin.readable) {
      Deno.writeTextFileSync(seen, new TextDecoder().decode(bytes), { append: true });
      if (asked) continue;
      asked = true;
      await out({ jsonrpc: "2.0", id: 7, method: "ping" });
      await out({ jsonrpc: "2.0", id: 7, method: "roots/list" });
      await out({ jsonrpc: "2.0", method: "notifications/message", params: { data: "done" } });
    }
  `;
  await using home = await tempHome(askingConfig(code));
  const seen = join(home.dir, "seen.log");
  const client = rawClient(home, "strict", { SEEN: seen });
  await client.send({ jsonrpc: "2.0", method: "notifications/initialized" });
  const shown = await client.read(2);
  assert.deepEqual(shown.map((m) => [m.id ?? null, m.method]), [
    [7, "ping"],
    [null, "notifications/message"],
  ]);
  assert.ok(await until(() => seenLines(seen).some((m) => m.id === 7), 10_000));
  // The client never answers the ping: the session ends with it pending.
  const result = await client.finish();
  assert.equal(result.code, 0, result.stderr);
  const answer = seenLines(seen).filter((m) => m.id === 7);
  assert.equal(answer.length, 1);
  assert.equal((answer[0]!.error as { message: string }).message, "Request id is already pending");
  assert.deepEqual(auditLines(home).map((r) => [r.method, r.outcome]), [
    ["roots/list", "refused"],
    ["ping", "no_response"],
  ]);
});

Deno.test("mcp run ends the session of a server that floods refused requests, after a bounded number of answers", async () => {
  const code = `
    const seen = Deno.env.get("SEEN");
    const lines = [];
    for (let i = 0; i < 1500; i++) {
      lines.push(JSON.stringify({ jsonrpc: "2.0", id: i, method: "sampling/createMessage", params: {} }));
    }
    await Deno.stdout.write(new TextEncoder().encode(lines.join("\\n") + "\\n"));
    for await (const bytes of Deno.stdin.readable) {
      Deno.writeTextFileSync(seen, new TextDecoder().decode(bytes), { append: true });
    }
  `;
  await using home = await tempHome(askingConfig(code));
  const seen = join(home.dir, "seen.log");
  const result = await runWaffle(["mcp", "run", "strict", "--config", home.config], {
    env: waffleEnv(home.dir, { SEEN: seen }),
    keepOpen: true,
  });
  assert.equal(result.code, 125, result.stderr);
  assert.equal(result.stdout, "", "the client saw none of them");
  assert.match(result.stderr, /Server 'strict' sent more than 1024 requests that waffle refused/);
  const answers = seenLines(seen);
  assert.equal(answers.length, 1024);
  assert.ok(answers.every((m) => (m.error as { code: number }).code === -32601));
  const audit = auditLines(home);
  assert.equal(audit.length, 1024);
  assert.ok(audit.every((r) => r.outcome === "refused" && r.method === "sampling/createMessage"));
  // The relay's notes are capped too.
  assert.ok(result.stderr.split("\n").length < 110, `${result.stderr.split("\n").length} lines`);
});

Deno.test("mcp run writes at most 4096 audit lines of server requests per session, then one summary line", async () => {
  // The server pings the client 4100 times, one at a time.
  const code = `
    const reader = Deno.stdin.readable.getReader();
    const out = (m) => Deno.stdout.write(new TextEncoder().encode(JSON.stringify(m) + "\\n"));
    let buffer = "";
    const nextLine = async () => {
      for (;;) {
        const at = buffer.indexOf("\\n");
        if (at >= 0) { const line = buffer.slice(0, at); buffer = buffer.slice(at + 1); return line; }
        const { value, done } = await reader.read();
        if (done) return undefined;
        buffer += new TextDecoder().decode(value);
      }
    };
    await nextLine();
    for (let i = 0; i < 4100; i++) {
      await out({ jsonrpc: "2.0", id: i, method: "ping" });
      if (await nextLine() === undefined) break;
    }
    await out({ jsonrpc: "2.0", method: "notifications/message", params: { data: "done" } });
    await nextLine();
  `;
  await using home = await tempHome(askingConfig(code));
  const client = rawClient(home, "strict", { SEEN: join(home.dir, "seen.log") });
  await client.send({ jsonrpc: "2.0", method: "notifications/initialized" });
  for (let i = 0; i < 4100; i++) {
    const [ping] = await client.read(1);
    assert.equal(ping?.id, i);
    await client.send({ jsonrpc: "2.0", id: i, result: {} });
  }
  assert.equal((await client.read(1))[0]?.method, "notifications/message");
  const result = await client.finish();
  assert.equal(result.code, 0, result.stderr);
  const audit = auditLines(home);
  assert.equal(audit.length, 4097);
  assert.ok(audit.slice(0, 4096).every((r) => r.method === "ping" && r.outcome === "ok"));
  assert.deepEqual(
    { method: audit[4096]!.method, outcome: audit[4096]!.outcome, count: audit[4096]!.count },
    { method: "*", outcome: "unaudited", count: 4 },
  );
});

const SAMPLING_CONFIG = `[sandbox]
mode = "host"

[mcp.everything]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "host"
authority = "host"
tools = ["trigger-sampling-request", "trigger-elicitation-request"]

[mcp.everything-llm]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "host"
authority = "host"
tools = ["trigger-sampling-request", "trigger-elicitation-request"]
client_requests = ["sampling/createMessage", "elicitation/create"]
`;

/** An SDK client that can sample and elicit, counting each time its handlers run. */
async function connectedSamplingClient(
  home: Home,
  server: string,
): Promise<{ client: Client; calls: HandlerCalls }> {
  const transport = new StdioClientTransport({
    command: Deno.execPath(),
    args: ["run", "--allow-all", MAIN, "mcp", "run", server, "--config", home.config],
    env: waffleEnv(home.dir),
    stderr: "pipe",
  });
  const { client, calls } = samplingClient("waffle-sampling-test", "sampled on the host");
  await client.connect(transport);
  return { client, calls };
}

Deno.test({
  name:
    "mcp run: server-everything's sampling and elicitation never reach the SDK client's handlers unless listed",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn(): Promise<void> {
    await using home = await tempHome(SAMPLING_CONFIG);
    const strict = await connectedSamplingClient(home, "everything");
    try {
      const sampled = await strict.client.callTool({
        name: "trigger-sampling-request",
        arguments: { prompt: "spend the host's tokens" },
      });
      assert.equal(sampled.isError, true, textOf(sampled));
      assert.match(
        textOf(sampled),
        /Request 'sampling\/createMessage' from server 'everything' is not allowed by waffle policy; list it in mcp\.everything\.client_requests/,
      );
      const elicited = await strict.client.callTool({
        name: "trigger-elicitation-request",
        arguments: {},
      });
      assert.equal(elicited.isError, true, textOf(elicited));
      assert.match(textOf(elicited), /Request 'elicitation\/create' .* not allowed/);
      assert.deepEqual(strict.calls, { sampling: 0, elicitation: 0 });
    } finally {
      await strict.client.close();
    }

    const llm = await connectedSamplingClient(home, "everything-llm");
    try {
      const sampled = await llm.client.callTool({
        name: "trigger-sampling-request",
        arguments: { prompt: "hello" },
      });
      assert.notEqual(sampled.isError, true, textOf(sampled));
      assert.match(textOf(sampled), /sampled on the host/);
      const elicited = await llm.client.callTool({
        name: "trigger-elicitation-request",
        arguments: {},
      });
      assert.notEqual(elicited.isError, true, textOf(elicited));
      assert.match(textOf(elicited), /decline/i);
      assert.deepEqual(llm.calls, { sampling: 1, elicitation: 1 });
    } finally {
      await llm.client.close();
    }
    const lines = auditLines(home).filter((r) => r.from === "server");
    assert.deepEqual(lines.map((r) => [r.server, r.method, r.outcome]), [
      ["everything", "sampling/createMessage", "refused"],
      ["everything", "elicitation/create", "refused"],
      ["everything-llm", "sampling/createMessage", "ok"],
      ["everything-llm", "elicitation/create", "ok"],
    ]);
  },
});
