/**
 * `waffle mcp serve`, live: real `waffle mcp serve` processes serving
 * `@modelcontextprotocol/server-everything` over Streamable HTTP on
 * loopback, from the user's sandbox (Docker) or from the host, talked to by
 * the official SDK client, by raw HTTP requests, and by the official
 * conformance suite, whose results through waffle are held to the results of
 * server-everything's own Streamable HTTP server. Nothing is mocked.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { bearerProxy } from "./_bearer_proxy.ts";
import { samplingClient } from "./_mcp_client.ts";
import {
  conformanceMissing,
  resultTable,
  runConformance,
  scenarioPassed,
  type ScenarioResult,
  serverScenarios,
} from "./_conformance.ts";
import { dockerGate, liveTest, type LiveTestFn } from "./_docker_gate.ts";
import { alive, delay } from "./_helpers.ts";
import { run, tempHome, type TestHome, uniqueUser } from "./_sandbox_helpers.ts";
import { loopbackPeers, type Slowloris, slowloris } from "./_slow_clients.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const MAIN = `${REPO}/main.ts`;
const CACHE = Deno.env.get("WAFFLE_MCP_CACHE") || `${REPO}/.tools/mcp-cache`;
const EVERYTHING = "npm:@modelcontextprotocol/server-everything@2026.8.31";
const IMAGE = Deno.env.get("WAFFLE_IMAGE") || "waffle-runner:latest";
/** The default `max_message_bytes`: request bodies beyond it get 413. */
const BODY_LIMIT = 64 * 1024 * 1024;

const FLOODER = `
const out = Deno.stdout.writable.getWriter();
const enc = new TextEncoder();
const reader = Deno.stdin.readable.pipeThrough(new TextDecoderStream()).getReader();
let text = "";
while (!text.includes("\\n")) text += (await reader.read()).value ?? "";
const init = JSON.parse(text.split("\\n")[0]);
await out.write(enc.encode(JSON.stringify({ jsonrpc: "2.0", id: init.id, result: {
  protocolVersion: init.params.protocolVersion, capabilities: { logging: {} },
  serverInfo: { name: "flooder", version: "1" } } }) + "\\n"));
await new Promise((r) => setTimeout(r, 500));
const line = enc.encode(JSON.stringify({ jsonrpc: "2.0", method: "notifications/message",
  params: { level: "info", data: "x".repeat(64 * 1024) } }) + "\\n");
for (let i = 0; i < 8192; i++) await out.write(line);
// Then answers every request with an empty result until its input ends.
text = text.slice(text.indexOf("\\n") + 1);
while (true) {
  let newline;
  while ((newline = text.indexOf("\\n")) >= 0) {
    const message = JSON.parse(text.slice(0, newline));
    text = text.slice(newline + 1);
    if (message.id !== undefined && message.method !== undefined) {
      await out.write(enc.encode(JSON.stringify({ jsonrpc: "2.0", id: message.id, result: {} }) + "\\n"));
    }
  }
  const next = await reader.read();
  if (next.done) break;
  text += next.value;
}
`;

const CONFIG = `
[sandbox]
image = "${IMAGE}"
mcp_cache = "${CACHE}"

[mcp.everything]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "sandbox"
authority = "sandbox"

[mcp.limited]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "sandbox"
authority = "sandbox"
tools = ["echo", "trigger-long-running-operation"]

[mcp.on-host]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "host"
authority = "host"

[mcp.sampler]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "host"
authority = "host"
client_requests = ["sampling/createMessage", "roots/list", "ping"]

# Answers initialize, then floods notifications (64 KiB each, 512 MiB at most).
[mcp.flooder]
command = ${JSON.stringify(Deno.execPath())}
args = ["eval", ${JSON.stringify(FLOODER)}]
execution = "host"
authority = "host"
max_message_bytes = 1048576

[groups.local]
mode = "host"
`;

// The SDK's HTTP client transport leaves its fetches and timers to settle
// after close(): the sanitizers would blame the test for them.
const SDK_CLIENT = { sanitizeOps: false, sanitizeResources: false };

const INITIALIZE = {
  jsonrpc: "2.0",
  id: 1,
  method: "initialize",
  params: {
    protocolVersion: "2025-06-18",
    capabilities: {},
    clientInfo: { name: "waffle-test", version: "1.0.0" },
  },
};

/** A running `waffle mcp serve`. */
interface Serving {
  url: string;
  /** The printed token; null when it came from --token-file. */
  token: string;
  child: Deno.ChildProcess;
  /** Its stderr so far. */
  stderr(): string;
  /** Sends a signal and waits for the exit. */
  stop(signal?: Deno.Signal): Promise<Deno.CommandStatus>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** A temporary waffle home with {@linkcode CONFIG}, for tests that start no container. */
async function serveHome(): Promise<{ home: string; [Symbol.asyncDispose](): Promise<void> }> {
  const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-serve-" }));
  await Deno.writeTextFile(`${home}/waffle.toml`, CONFIG);
  return {
    home,
    [Symbol.asyncDispose]: () => Deno.remove(home, { recursive: true }).catch(() => {}),
  };
}

function serveEnv(home: string): Record<string, string> {
  return {
    PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
    HOME: home,
    WAFFLE_HOME: home,
    WAFFLE_MCP_CACHE: CACHE,
    NO_COLOR: "1",
  };
}

/**
 * Starts `waffle mcp serve ARGS --json` and waits for its start line; with
 * `openFiles`, under that open-file limit (`ulimit -n`, soft and hard: Deno
 * raises its soft limit to the hard one).
 */
async function startServe(
  home: string,
  args: string[],
  options: { openFiles?: number } = {},
): Promise<Serving> {
  const argv = ["run", "--allow-all", "--quiet", MAIN, "mcp", "serve", ...args, "--json"];
  const limited = options.openFiles === undefined ? undefined : [
    "-c",
    `ulimit -n ${options.openFiles} && exec "$0" "$@"`,
    Deno.execPath(),
    ...argv,
  ];
  const child = new Deno.Command(limited === undefined ? Deno.execPath() : "sh", {
    args: limited ?? argv,
    env: serveEnv(home),
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let stderr = "";
  const stderrDone = (async () => {
    for await (const text of child.stderr.pipeThrough(new TextDecoderStream())) stderr += text;
  })();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let stdout = "";
  while (!stdout.includes("\n")) {
    const next = await reader.read();
    if (next.done) {
      await child.status;
      await stderrDone;
      throw new Error(`mcp serve exited before it started: ${stderr}`);
    }
    stdout += next.value;
  }
  reader.cancel().catch(() => {});
  const started = JSON.parse(stdout.split("\n")[0]!) as { url: string; token: string };
  let status: Promise<Deno.CommandStatus> | undefined;
  const stop = (signal: Deno.Signal = "SIGTERM"): Promise<Deno.CommandStatus> => {
    status ??= (async () => {
      try {
        child.kill(signal);
      } catch {
        // Already exited.
      }
      const ended = await child.status;
      await stderrDone;
      return ended;
    })();
    return status;
  };
  return {
    url: started.url,
    token: started.token,
    child,
    stderr: () => stderr,
    stop,
    [Symbol.asyncDispose]: async () => void await stop(),
  };
}

/** Runs `waffle mcp serve ARGS` expecting it to refuse at once. */
async function serveRefused(
  home: string,
  args: string[],
): Promise<{ code: number; stderr: string }> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", "--quiet", MAIN, "mcp", "serve", ...args],
    env: serveEnv(home),
    clearEnv: true,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).output();
  return { code: output.code, stderr: new TextDecoder().decode(output.stderr) };
}

/** A POST to the endpoint; its body read to the end (an SSE response ends with its answer). */
async function post(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; sessionId: string | null; text: string }> {
  const bytes = body instanceof Uint8Array ? body as Uint8Array<ArrayBuffer> : undefined;
  const response = await fetch(url, {
    method: "POST",
    headers: {
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      ...headers,
    },
    body: bytes ?? (typeof body === "string" ? body : JSON.stringify(body)),
  });
  return {
    status: response.status,
    sessionId: response.headers.get("mcp-session-id"),
    text: await response.text(),
  };
}

/** The status of an `initialize` POST sent by hand, with the given Host header. */
async function rawPostStatus(url: string, host: string, token: string): Promise<number> {
  const { hostname, port, pathname } = new URL(url);
  const body = JSON.stringify(INITIALIZE);
  const connection = await Deno.connect({ hostname, port: Number(port) });
  try {
    await connection.write(new TextEncoder().encode(
      [
        `POST ${pathname} HTTP/1.1`,
        `Host: ${host}`,
        `Authorization: Bearer ${token}`,
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        `Content-Length: ${new TextEncoder().encode(body).byteLength}`,
        "Connection: close",
        "",
        body,
      ].join("\r\n"),
    ));
    const buffer = new Uint8Array(4096);
    let head = "";
    while (!head.includes("\r\n")) {
      const read = await connection.read(buffer);
      if (read === null) break;
      head += new TextDecoder().decode(buffer.subarray(0, read));
    }
    return Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0);
  } finally {
    connection.close();
  }
}

/** The JSON-RPC messages of an SSE response body, as they come. */
async function* sseMessages(response: Response): AsyncGenerator<Record<string, unknown>> {
  let buffer = "";
  for await (const text of response.body!.pipeThrough(new TextDecoderStream())) {
    buffer += text;
    let end: number;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trim()).join("");
      if (data !== "") yield JSON.parse(data);
    }
  }
}

function bearer(token: string): Record<string, string> {
  return { Authorization: `Bearer ${token}` };
}

async function connect(serving: Serving): Promise<
  { client: Client; transport: StreamableHTTPClientTransport }
> {
  const transport = new StreamableHTTPClientTransport(new URL(serving.url), {
    requestInit: { headers: bearer(serving.token) },
  });
  const client = new Client({ name: "waffle-test", version: "1.0.0" });
  await client.connect(transport);
  return { client, transport };
}

function textOf(result: unknown): string {
  const content = (result as { content?: { type: string; text?: string }[] }).content ?? [];
  return content.map((part) => part.text ?? "").join("");
}

/** server-everything processes in the user's container. */
async function serversIn(home: TestHome, user: string): Promise<number> {
  const counted = await run(
    home.open(user),
    "grep -l [s]erver-everything /proc/[0-9]*/cmdline 2>/dev/null | wc -l",
  );
  return Number(counted.stdout.trim());
}

/** Waits, within a generous bound, until `check` holds. */
async function eventually(what: string, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!await check()) {
    assert.ok(Date.now() < deadline, `never: ${what}`);
    await delay(200);
  }
}

async function auditLines(home: string): Promise<Record<string, unknown>[]> {
  const text = await Deno.readTextFile(`${home}/audit.jsonl`).catch(() => "");
  return text.trim().split("\n").filter((line) => line !== "").map((line) => JSON.parse(line));
}

/**
 * server-everything's own Streamable HTTP server, bound to 127.0.0.1 (it
 * listens on every interface by itself: a preloaded wrapper narrows it).
 */
async function everythingHttp(): Promise<{ url: string; [Symbol.asyncDispose](): Promise<void> }> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-everything-" });
  await Deno.writeTextFile(
    `${dir}/loopback.mjs`,
    `import http from "node:http";
const listen = http.Server.prototype.listen;
http.Server.prototype.listen = function (...args) {
  const port = typeof args[0] === "number" || /^\\d+$/.test(String(args[0]));
  if (port && typeof args[1] !== "string") args.splice(1, 0, "127.0.0.1");
  return listen.apply(this, args);
};
await import("${EVERYTHING}/dist/index.js");
`,
  );
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = probe.addr.port;
  probe.close();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--cached-only",
      "--no-config",
      "--quiet",
      `${dir}/loopback.mjs`,
      "streamableHttp",
    ],
    env: { DENO_DIR: CACHE, PORT: String(port), DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" },
    cwd: dir,
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  const dispose = async (): Promise<void> => {
    child.kill("SIGKILL");
    await child.status;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      (await Deno.connect({ hostname: "127.0.0.1", port })).close();
      break;
    } catch {
      if (Date.now() > deadline) {
        await dispose();
        throw new Error("server-everything's HTTP server never listened");
      }
      await delay(100);
    }
  }
  return { url: `http://127.0.0.1:${port}/mcp`, [Symbol.asyncDispose]: dispose };
}

/** A live test that also needs the conformance suite: ignored (or failing under CI) without it. */
function conformanceTest(name: string, fn: LiveTestFn): void {
  const missing = conformanceMissing();
  if (missing === null) {
    liveTest(name, fn, SDK_CLIENT);
  } else if (Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1") {
    Deno.test(name, () => {
      throw new Error(`The conformance suite is required (WAFFLE_REQUIRE_DOCKER=1): ${missing}`);
    });
  } else {
    Deno.test({ name: `${name} [ignored: ${missing}]`, ignore: true, fn: () => {} });
  }
}

// Touch the gate so its summary line is printed once for this file.
await dockerGate();

conformanceTest(
  "mcp serve: every conformance scenario server-everything passes over its own HTTP passes through waffle in a sandbox",
  async (docker, t) => {
    const scenarios = await serverScenarios();
    assert.ok(scenarios.length >= 20, `only ${scenarios.length} scenarios listed`);
    let direct: ScenarioResult[] = [];
    let through: ScenarioResult[] = [];
    await t.step("server-everything's own Streamable HTTP server", async () => {
      await using everything = await everythingHttp();
      direct = await runConformance(everything.url, scenarios);
    });
    await using home = await tempHome(docker);
    await Deno.writeTextFile(`${home.home}/waffle.toml`, CONFIG);
    const user = uniqueUser("conformance");
    await t.step("waffle mcp serve everything --user U", async () => {
      // A scenario whose client fails leaves its session open until its
      // process exits; at most 4 at once, the quiet ones make room.
      await using serving = await startServe(home.home, [
        "everything",
        "--user",
        user,
        "--max-sessions",
        "4",
      ]);
      await using proxy = bearerProxy(serving.url, serving.token);
      through = await runConformance(proxy.url, scenarios);
    });
    // deno-lint-ignore no-console -- the two result tables are what this test reports
    console.log(
      resultTable("MCP conformance 0.1.16, server scenarios (checks passed/run):", [
        { name: "direct", results: direct },
        { name: "through waffle", results: through },
      ]),
    );
    const passedDirectly = direct.filter(scenarioPassed).map((r) => r.scenario);
    assert.ok(
      passedDirectly.includes("server-initialize"),
      "server-everything fails to initialize",
    );
    const lost = passedDirectly.filter((scenario) => {
      const result = through.find((r) => r.scenario === scenario);
      return result === undefined || !scenarioPassed(result);
    });
    const why = lost.map((scenario) =>
      `${scenario}: ${through.find((r) => r.scenario === scenario)?.failures.join("; ")}`
    );
    assert.deepEqual(lost, [], `passed directly, failed through waffle:\n${why.join("\n")}`);
  },
);

Deno.test("mcp serve: a non-loopback --listen is refused unless --allow-remote is given, before anything listens", async () => {
  await using home = await serveHome();
  for (const listen of ["0.0.0.0:8808", "[::]:8808", "192.168.1.1:8808", "example.com:80"]) {
    const refused = await serveRefused(home.home, [
      "everything",
      "--user",
      "u",
      "--listen",
      listen,
    ]);
    assert.equal(refused.code, 125, refused.stderr);
    assert.match(
      refused.stderr,
      new RegExp(`'${listen.replace(/[[\]]/g, "\\$&")}' is not a loopback address`),
    );
    assert.match(refused.stderr, /--allow-remote/);
  }
  const malformed = await serveRefused(home.home, [
    "everything",
    "--user",
    "u",
    "--listen",
    "8808",
  ]);
  assert.equal(malformed.code, 125);
  assert.match(malformed.stderr, /Invalid --listen '8808': expected HOST:PORT/);
  await Deno.writeTextFile(`${home.home}/open-token`, `${"b".repeat(40)}\n`, { mode: 0o644 });
  await Deno.chmod(`${home.home}/open-token`, 0o644);
  const open = await serveRefused(home.home, [
    "everything",
    "--user",
    "u",
    "--token-file",
    `${home.home}/open-token`,
  ]);
  assert.equal(open.code, 125);
  assert.match(
    open.stderr,
    /Token file '.*open-token' is readable by others \(mode '644'\): make it 0600/,
  );
  await Deno.writeTextFile(`${home.home}/short-token`, "too-short\n", { mode: 0o600 });
  await Deno.chmod(`${home.home}/short-token`, 0o600);
  const short = await serveRefused(home.home, [
    "everything",
    "--user",
    "u",
    "--token-file",
    `${home.home}/short-token`,
  ]);
  assert.equal(short.code, 125);
  assert.match(short.stderr, /Token file '.*short-token' holds no token of 32/);
  // A port in use is a one-line error, not a stack.
  using taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const busy = await serveRefused(home.home, [
    "everything",
    "--user",
    "u",
    "--listen",
    `127.0.0.1:${taken.addr.port}`,
  ]);
  assert.equal(busy.code, 125, busy.stderr);
  assert.match(busy.stderr, new RegExp(`Cannot listen on '127\\.0\\.0\\.1:${taken.addr.port}'`));
  // The plan decides before anything listens, as for mcp run.
  const noUser = await serveRefused(home.home, ["everything"]);
  assert.equal(noUser.code, 125);
  assert.match(noUser.stderr, /Missing --user U: server 'everything' runs in a sandbox container/);
});

Deno.test("mcp serve: every request needs the token, a loopback Host and Origin, the /mcp path, and a body within the limit", async () => {
  await using home = await serveHome();
  const token = "a".repeat(16) + crypto.randomUUID().replaceAll("-", "");
  await Deno.writeTextFile(`${home.home}/token`, `${token}\n`, { mode: 0o600 });
  await Deno.chmod(`${home.home}/token`, 0o600);
  // A sandboxed server: none of these requests may get as far as starting it.
  await using serving = await startServe(home.home, [
    "everything",
    "--user",
    uniqueUser("guard"),
    "--token-file",
    `${home.home}/token`,
  ]);
  assert.equal(serving.token, null, "a token from a file is not printed");
  assert.match(serving.url, /^http:\/\/127\.0\.0\.1:\d+\/mcp$/);
  const auth = bearer(token);

  const none = await post(serving.url, INITIALIZE);
  assert.equal(none.status, 401, none.text);
  const wrong = await post(serving.url, INITIALIZE, bearer(`${token.slice(1)}b`));
  assert.equal(wrong.status, 401, wrong.text);
  const basic = await post(serving.url, INITIALIZE, {
    Authorization: `Basic ${btoa(`x:${token}`)}`,
  });
  assert.equal(basic.status, 401);

  const origin = await post(serving.url, INITIALIZE, {
    ...auth,
    Origin: "http://evil.example.com",
  });
  assert.equal(origin.status, 403, origin.text);
  assert.match(origin.text, /Origin 'http:\/\/evil\.example\.com' is not a loopback origin/);
  const nullOrigin = await post(serving.url, INITIALIZE, { ...auth, Origin: "null" });
  assert.equal(nullOrigin.status, 403);
  // fetch() sets Host itself: a request of our own carries another.
  assert.equal(await rawPostStatus(serving.url, "evil.example.com", token), 403);
  assert.equal(await rawPostStatus(serving.url, "evil.example.com:80", token), 403);

  const elsewhere = await post(serving.url.replace(/\/mcp$/, "/other"), INITIALIZE, auth);
  assert.equal(elsewhere.status, 404);
  const noSession = await post(serving.url, { jsonrpc: "2.0", id: 2, method: "ping" }, auth);
  assert.equal(noSession.status, 400, noSession.text);
  assert.match(noSession.text, /Mcp-Session-Id header is required/);
  const unknown = await post(serving.url, { jsonrpc: "2.0", id: 2, method: "ping" }, {
    ...auth,
    "Mcp-Session-Id": crypto.randomUUID(),
  });
  assert.equal(unknown.status, 404, unknown.text);
  const garbage = await post(serving.url, "{not json", auth);
  assert.equal(garbage.status, 400);

  // Over the limit: declared by Content-Length, and streamed without one.
  const declared = await post(serving.url, new Uint8Array(BODY_LIMIT + 1).fill(32), auth);
  assert.equal(declared.status, 413, declared.text);
  assert.match(declared.text, /at most 67108864 bytes/);
  let sent = 0;
  const chunk = new Uint8Array(1024 * 1024).fill(32);
  const streamed = await fetch(serving.url, {
    method: "POST",
    headers: {
      ...auth,
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
    },
    body: new ReadableStream<Uint8Array>({
      pull(controller): void {
        if (sent > BODY_LIMIT) return controller.close();
        sent += chunk.byteLength;
        controller.enqueue(chunk);
      },
    }),
  });
  assert.equal(streamed.status, 413);
  await streamed.body?.cancel();
  assert.doesNotMatch(serving.stderr(), /session .* started/, "no session was started");
});

liveTest(
  "mcp serve: the SDK client lists and calls tools and gets progress from a sandbox session; SIGTERM ends it and the audit is written",
  async (docker) => {
    await using home = await tempHome(docker);
    await Deno.writeTextFile(`${home.home}/waffle.toml`, CONFIG);
    const user = uniqueUser("serve");
    await using serving = await startServe(home.home, ["limited", "--user", user]);
    const { client } = await connect(serving);
    const listed = await client.listTools();
    assert.deepEqual(
      listed.tools.map((tool) => tool.name).sort(),
      ["echo", "trigger-long-running-operation"],
      "the tools allowlist applies over HTTP",
    );
    assert.match(
      textOf(await client.callTool({ name: "echo", arguments: { message: "over http" } })),
      /over http/,
    );
    const progress: number[] = [];
    const done = await client.callTool(
      { name: "trigger-long-running-operation", arguments: { duration: 0.3, steps: 3 } },
      { onprogress: (update) => void progress.push(update.progress) },
    );
    assert.match(textOf(done), /Long running operation completed/);
    assert.deepEqual(progress, [1, 2, 3], "each progress notification reached its request");
    await assert.rejects(
      client.callTool({ name: "get-sum", arguments: { a: 1, b: 2 } }),
      /not allowed/,
    );
    assert.equal(await serversIn(home, user), 1, "the server runs in the user's sandbox");

    // The client is still connected: a signal must end its session cleanly.
    const status = await serving.stop("SIGTERM");
    assert.equal(status.code, 143, serving.stderr());
    assert.match(serving.stderr(), /ended 1 session\(s\)/);
    await eventually("the server left the sandbox", async () => await serversIn(home, user) === 0);
    const calls = (await auditLines(home.home)).map((entry) => `${entry.tool}:${entry.outcome}`);
    assert.ok(calls.includes("echo:ok"), calls.join(","));
    assert.ok(calls.includes("trigger-long-running-operation:ok"), calls.join(","));
    assert.ok(calls.includes("get-sum:denied"), calls.join(","));
    const echo = (await auditLines(home.home)).find((entry) => entry.tool === "echo")!;
    assert.equal(echo.user, user);
    assert.equal(echo.server, "limited");
    assert.doesNotMatch(JSON.stringify(await auditLines(home.home)), /over http/);
    await client.close();
  },
  SDK_CLIENT,
);

liveTest(
  "mcp serve: two concurrent sessions get separate sandbox sessions, and DELETE ends one while the other goes on",
  async (docker) => {
    await using home = await tempHome(docker);
    await Deno.writeTextFile(`${home.home}/waffle.toml`, CONFIG);
    const user = uniqueUser("sessions");
    await using serving = await startServe(home.home, ["everything", "--user", user]);
    const first = await connect(serving);
    const second = await connect(serving);
    const firstId = first.transport.sessionId!;
    assert.notEqual(firstId, second.transport.sessionId);
    await Promise.all([first.client.listTools(), second.client.listTools()]);
    assert.equal(await serversIn(home, user), 2, "one server process per MCP session");

    await first.transport.terminateSession();
    // The DELETE is answered once the sandbox session has ended.
    assert.equal(await serversIn(home, user), 1, serving.stderr());
    const gone = await post(serving.url, { jsonrpc: "2.0", id: 9, method: "ping" }, {
      ...bearer(serving.token),
      "Mcp-Session-Id": firstId,
      "MCP-Protocol-Version": "2025-06-18",
    });
    assert.equal(gone.status, 404, gone.text);

    // A body over the limit is refused; the session it named goes on.
    const huge = await post(serving.url, new Uint8Array(BODY_LIMIT + 1).fill(32), {
      ...bearer(serving.token),
      "Mcp-Session-Id": second.transport.sessionId!,
    });
    assert.equal(huge.status, 413, huge.text);
    const echoed = await second.client.callTool({
      name: "echo",
      arguments: { message: "still here" },
    });
    assert.match(textOf(echoed), /still here/);
    await first.client.close();
    await second.client.close();
  },
  SDK_CLIENT,
);

Deno.test({
  name:
    "mcp serve: at --max-sessions a quiet session makes room for a new one, and a busy one gets 503",
  ...SDK_CLIENT,
  fn: async () => {
    await using home = await serveHome();
    await using serving = await startServe(home.home, [
      "on-host",
      "--group",
      "local",
      "--max-sessions",
      "1",
    ]);
    const auth = bearer(serving.token);
    const quiet = await post(serving.url, INITIALIZE, auth);
    assert.equal(quiet.status, 200, quiet.text);
    // Nothing is open in the first session: the second takes its place.
    const next = await post(serving.url, INITIALIZE, auth);
    assert.equal(next.status, 200, next.text);
    const ping = (sessionId: string | null) =>
      post(serving.url, { jsonrpc: "2.0", id: 2, method: "ping" }, {
        ...auth,
        "Mcp-Session-Id": sessionId ?? "",
      });
    assert.equal((await ping(quiet.sessionId)).status, 404);
    assert.equal((await ping(next.sessionId)).status, 200);

    // A session with a call in progress is busy: a new one is refused.
    const { client } = await connect(serving);
    let progressed!: () => void;
    const firstProgress = new Promise<void>((resolve) => progressed = resolve);
    const call = client.callTool(
      { name: "trigger-long-running-operation", arguments: { duration: 30, steps: 30 } },
      { onprogress: () => progressed() },
    ).catch(() => undefined);
    await firstProgress;
    const refused = await post(serving.url, INITIALIZE, auth);
    assert.equal(refused.status, 503, refused.text);
    assert.match(refused.text, /1 sessions are open and busy/);
    await client.close();
    await call;
  },
});

Deno.test({
  name:
    "mcp serve: a client that opens its GET stream and never reads it gets the flood of notifications dropped, the session still answers, the host's memory stays bounded",
  ...SDK_CLIENT,
  fn: async () => {
    await using home = await serveHome();
    await using serving = await startServe(home.home, ["flooder", "--group", "local"]);
    const auth = bearer(serving.token);
    const started = await post(serving.url, INITIALIZE, auth);
    assert.equal(started.status, 200, started.text);
    const session = { ...auth, "Mcp-Session-Id": started.sessionId! };
    const initialized = await post(
      serving.url,
      { jsonrpc: "2.0", method: "notifications/initialized" },
      session,
    );
    assert.equal(initialized.status, 202, initialized.text);
    // The stream is opened, and its body never read.
    const get = await fetch(serving.url, {
      method: "GET",
      headers: { Accept: "text/event-stream", ...session },
    });
    assert.equal(get.status, 200);
    await eventually(
      "notifications to be dropped",
      () => Promise.resolve(/dropping notifications/.test(serving.stderr())),
    );
    // The session still answers (the flood was dropped, not queued).
    const ping = await post(serving.url, { jsonrpc: "2.0", id: 2, method: "ping" }, session);
    assert.equal(ping.status, 200, ping.text);
    assert.match(ping.text, /"id":2,"result":\{\}/);
    const status = Deno.readTextFileSync(`/proc/${serving.child.pid}/status`);
    const peakMiB = Number(/VmHWM:\s+(\d+)/.exec(status)![1]) / 1024;
    // The flood is 512 MiB (a queue holding it would pass that); what is held
    // is at most twice the server's 1 MiB max_message_bytes, the rest is the
    // garbage of parsing the flood.
    assert.ok(peakMiB < 400, `mcp serve peaked at ${peakMiB.toFixed(0)} MiB`);
    await get.body?.cancel();
  },
});

Deno.test({
  name:
    "mcp serve: a session with nothing open for --idle-timeout ends, and its id is then unknown",
  ...SDK_CLIENT,
  fn: async () => {
    await using home = await serveHome();
    await using serving = await startServe(home.home, [
      "on-host",
      "--group",
      "local",
      "--idle-timeout",
      "1",
    ]);
    const auth = bearer(serving.token);
    const started = await post(serving.url, INITIALIZE, auth);
    assert.equal(started.status, 200, started.text);
    // Watched on stderr: a request would itself be activity.
    await eventually(
      "the idle session ended",
      () => Promise.resolve(/ended: idle/.test(serving.stderr())),
    );
    assert.match(
      serving.stderr(),
      new RegExp(`session ${started.sessionId!.slice(0, 8)} ended: idle for 1 s`),
    );
    const ping = await post(serving.url, { jsonrpc: "2.0", id: 2, method: "ping" }, {
      ...auth,
      "Mcp-Session-Id": started.sessionId!,
    });
    assert.equal(ping.status, 404, ping.text);
  },
});

Deno.test({
  name:
    "mcp serve: a server's sampling request reaches the HTTP client only when client_requests lists it",
  ...SDK_CLIENT,
  fn: async () => {
    await using home = await serveHome();
    for (const [server, allowed] of [["sampler", true], ["on-host", false]] as const) {
      await using serving = await startServe(home.home, [server, "--group", "local"]);
      const { client, calls } = samplingClient("waffle-test", "the host's model answers");
      await client.connect(
        new StreamableHTTPClientTransport(new URL(serving.url), {
          requestInit: { headers: bearer(serving.token) },
        }),
      );
      // server-everything offers the tool once it has seen the client's capabilities.
      await eventually(
        "trigger-sampling-request is listed",
        async () =>
          (await client.listTools()).tools.some((tool) => tool.name === "trigger-sampling-request"),
      );
      const result = await client.callTool({
        name: "trigger-sampling-request",
        arguments: { prompt: "hello" },
      });
      if (allowed) {
        assert.match(JSON.stringify(result), /the host's model answers/);
        assert.equal(calls.sampling, 1);
      } else {
        assert.match(JSON.stringify(result), /client_requests/);
        assert.equal(calls.sampling, 0, "a refused request never reaches the client");
      }
      await client.close();
    }
  },
});

Deno.test({
  name:
    "mcp serve: without a GET stream, a server request comes on the pending POST's stream and its answer is posted back",
  ...SDK_CLIENT,
  fn: async () => {
    await using home = await serveHome();
    await using serving = await startServe(home.home, ["sampler", "--group", "local"]);
    const headers = (sessionId?: string): Record<string, string> => ({
      ...bearer(serving.token),
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      ...(sessionId === undefined ? {} : { "Mcp-Session-Id": sessionId }),
    });
    const init = await post(serving.url, {
      ...INITIALIZE,
      params: { ...INITIALIZE.params, capabilities: { sampling: {} } },
    }, bearer(serving.token));
    const sessionId = init.sessionId!;
    const initialized = await fetch(serving.url, {
      method: "POST",
      headers: headers(sessionId),
      body: JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }),
    });
    assert.equal(initialized.status, 202);
    await initialized.body?.cancel();
    await eventually("trigger-sampling-request is listed", async () => {
      const listed = await post(serving.url, { jsonrpc: "2.0", id: 2, method: "tools/list" }, {
        ...bearer(serving.token),
        "Mcp-Session-Id": sessionId,
      });
      return listed.text.includes("trigger-sampling-request");
    });
    const call = await fetch(serving.url, {
      method: "POST",
      headers: headers(sessionId),
      body: JSON.stringify({
        jsonrpc: "2.0",
        id: 3,
        method: "tools/call",
        params: { name: "trigger-sampling-request", arguments: { prompt: "hello" } },
      }),
    });
    assert.equal(call.status, 200);
    let answered = false;
    let result: Record<string, unknown> | undefined;
    for await (const message of sseMessages(call)) {
      if (message.method === "sampling/createMessage") {
        const back = await fetch(serving.url, {
          method: "POST",
          headers: headers(sessionId),
          body: JSON.stringify({
            jsonrpc: "2.0",
            id: message.id,
            result: {
              model: "raw",
              role: "assistant",
              content: { type: "text", text: "answered by hand" },
            },
          }),
        });
        assert.equal(back.status, 202);
        await back.body?.cancel();
        answered = true;
      } else if (message.id === 3) {
        result = message;
        break;
      }
    }
    assert.ok(answered, "the sampling request came on the tools/call stream");
    assert.match(JSON.stringify(result), /answered by hand/);
  },
});

/** The flood's attack: half a request header, one byte at a time; no token, no end. */
const SLOW_HEAD =
  "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Slow: ";
/** The open-file limit the flooded server runs under; the flood is twice as many connections. */
const FLOOD_FILE_LIMIT = 256;
/** A short header deadline (the flood's end), kept-alive client connections for the whole test. */
const FLOOD_DEADLINES = ["--header-timeout", "2", "--keep-alive-timeout", "600"];

/** Starts a slowloris flood of `2 × FLOOD_FILE_LIMIT` connections from 64 loopback peers. */
function flood(serving: Serving): Promise<Slowloris> {
  const { hostname, port } = new URL(serving.url);
  return slowloris({ hostname, port: Number(port) }, {
    connections: 2 * FLOOD_FILE_LIMIT,
    peers: loopbackPeers(64),
    everyMs: 500,
    head: SLOW_HEAD,
  });
}

/** A tools/call round trip of an established session. */
async function echoes(client: Client, message: string): Promise<void> {
  assert.match(
    textOf(await client.callTool({ name: "echo", arguments: { message } })),
    new RegExp(message),
  );
}

Deno.test({
  name:
    "mcp serve: a slowloris flood without the token, twice its open-file limit from 64 peers, is closed at the connection cap and by the header deadline; the established session keeps working and the server lives",
  ...SDK_CLIENT,
  fn: async () => {
    await using home = await serveHome();
    await using serving = await startServe(home.home, [
      "on-host",
      "--group",
      "local",
      ...FLOOD_DEADLINES,
    ], {
      openFiles: FLOOD_FILE_LIMIT,
    });
    // The default cap: half the open-file limit.
    const cap = FLOOD_FILE_LIMIT / 2;
    const session = await connect(serving);
    await echoes(session.client, "before the flood");
    await using slow = await flood(serving);
    assert.ok(alive(serving.child.pid), `mcp serve died: ${serving.stderr()}`);
    assert.equal(slow.unreachable(), 0, `mcp serve stopped listening: ${serving.stderr()}`);
    assert.match(serving.stderr(), new RegExp(`${cap} are open, the most allowed`));
    // The session's connections were open before the flood: they are served.
    await echoes(session.client, "during the flood");
    await slow.allClosed(60_000);
    const answered = slow.clients.filter((client) => client.received() !== "");
    assert.equal(
      answered.length,
      slow.timedOut(),
      `every answer is a 408: ${answered.map((client) => client.received()).join("|")}`,
    );
    assert.ok(slow.timedOut() > 0 && slow.timedOut() <= cap, `${slow.timedOut()} timed out`);
    assert.equal(slow.refused(), slow.clients.length - slow.timedOut());
    await echoes(session.client, "after the flood");
    const next = await connect(serving);
    await echoes(next.client, "a new session");
    assert.doesNotMatch(serving.stderr(), /Uncaught|Too many open files/);
    await session.client.close();
    await next.client.close();
  },
});

Deno.test({
  name:
    "mcp serve: with connection caps past its open-file limit, a slowloris flood makes accepting fail (EMFILE); the server says so in one line, keeps serving the established session, and accepts again",
  ...SDK_CLIENT,
  fn: async () => {
    await using home = await serveHome();
    await using serving = await startServe(home.home, [
      "on-host",
      "--group",
      "local",
      ...FLOOD_DEADLINES,
      "--max-connections",
      "4096",
      "--max-connections-per-peer",
      "4096",
    ], { openFiles: FLOOD_FILE_LIMIT });
    const session = await connect(serving);
    await echoes(session.client, "before the flood");
    const flooding = flood(serving);
    try {
      await eventually(
        "accepting to fail",
        () => Promise.resolve(/cannot accept/.test(serving.stderr())),
      );
      // Out of file descriptors: the session's open connections are served.
      await echoes(session.client, "while accepting fails");
    } finally {
      await using slow = await flooding;
      assert.equal(slow.unreachable(), 0, `mcp serve stopped listening: ${serving.stderr()}`);
      await slow.allClosed(120_000);
      assert.equal(slow.refused(), 0, "no cap was reached");
      assert.equal(
        slow.timedOut(),
        slow.clients.length,
        "each was accepted in the end, and timed out",
      );
    }
    assert.ok(alive(serving.child.pid), `mcp serve died: ${serving.stderr()}`);
    await echoes(session.client, "after the flood");
    const next = await connect(serving);
    await echoes(next.client, "a new session");
    const notices = serving.stderr().split("\n").filter((line) => /cannot accept/.test(line));
    assert.equal(notices.length, 1, serving.stderr());
    assert.match(notices[0]!, /Too many open files/);
    assert.doesNotMatch(serving.stderr(), /Uncaught/);
    await session.client.close();
    await next.client.close();
  },
});
