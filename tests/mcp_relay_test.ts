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
import { MAX_MESSAGE_BYTES } from "../lib/mcp/jsonrpc.ts";

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

/** Processes whose working directory is `dir` (a host server runs in the waffle home). */
function processesIn(dir: string): number[] {
  const pids: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      if (Deno.readLinkSync(`/proc/${entry.name}/cwd`) === dir) pids.push(Number(entry.name));
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
      assert.ok(processesIn(home.dir).length > 0, "the server does not run in the waffle home");
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

Deno.test("mcp run drops invalid server lines and ends the session on an oversize one", async () => {
  const code = `
    const out = (s) => Deno.stdout.write(new TextEncoder().encode(s));
    const reader = Deno.stdin.readable.getReader();
    await reader.read();
    await out("not json\\n");
    await out('{"jsonrpc":"2.0","id":1,"result":{}}\\n');
    await out("x".repeat(${MAX_MESSAGE_BYTES + 10}) + "\\n");
    await new Promise((r) => setTimeout(r, 60000));
  `;
  await using home = await tempHome(scriptConfig(code));
  const started = Date.now();
  const result = await runWaffle(["mcp", "run", "script", "--config", home.config], {
    env: waffleEnv(home.dir),
    stdin: PING,
    keepOpen: true,
  });
  assert.equal(result.code, 125, result.stderr);
  assert.equal(result.stdout, '{"jsonrpc":"2.0","id":1,"result":{}}\n');
  assert.match(result.stderr, /dropped a message from server 'script': not JSON/);
  assert.match(result.stderr, new RegExp(`longer than ${MAX_MESSAGE_BYTES} bytes`));
  assert.ok(Date.now() - started < 15000);
  assert.deepEqual(processesIn(home.dir), []);
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
  // The server's stderr is forwarded, without its escape sequence.
  assert.match(stderr, /bye \uFFFD\[31mred/);
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
  for await (const line of readLines(stream)) length = line.byteLength;
  const grownMiB = (Deno.memoryUsage().rss - before) / 1024 / 1024;
  assert.equal(length, total);
  // A piece per byte cost ~400 bytes each (384 MiB here before the fix).
  assert.ok(grownMiB < 64, `RSS grew ${grownMiB.toFixed(0)} MiB`);
});
