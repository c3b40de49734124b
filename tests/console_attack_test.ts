// deno-lint-ignore-file no-explicit-any
/**
 * The console's API attacked, on a real `waffle serve` with the real E2B
 * SDK and Docker: another tenant's key finds nothing of a sandbox it does
 * not own (every `/waffle/v1` route and every E2B route), nor its audit
 * entries; a sandbox (a command, and a broken-into runner via `docker exec
 * -u 0`) and hostile audit lines (huge, invalid, NUL bytes, another
 * tenant's) cannot make the routes fail, leak, or answer past their caps;
 * a foreign Host or Origin is refused (DNS rebinding); the key is taken
 * only from `X-API-Key` (a scrape's `Authorization: Bearer` on `/metrics`),
 * never from a query string or a cookie.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import { join } from "../lib/path.ts";
import { sandboxKey } from "../lib/config/sandbox_key.ts";
import { rawGet, sdk, sdkTest, type Served } from "./_serve_helpers.ts";
import { runProcess } from "./_helpers.ts";

async function call(
  served: Served,
  key: string | undefined,
  path: string,
  init: RequestInit = {},
): Promise<{ status: number; text: string; body: any }> {
  const response = await fetch(`${served.url}${path}`, {
    ...init,
    headers: {
      ...(key === undefined ? {} : { "x-api-key": key }),
      "content-type": "application/json",
      ...init.headers,
    },
  });
  const text = await response.text();
  let body: unknown = null;
  try {
    body = JSON.parse(text);
  } catch {
    body = null;
  }
  return { status: response.status, text, body };
}

// The audit lines' user: a sandbox of tenant a in the server's store (a tenant sees only its sandboxes' lines).
let owned = "sbx";

/** An egress audit line. */
function egressLine(over: Record<string, unknown>): string {
  return JSON.stringify({
    time: new Date().toISOString(),
    tenant: "a",
    user: owned,
    group: null,
    cron: null,
    server: null,
    method: "CONNECT",
    destination: "example.com",
    port: 443,
    address: null,
    decision: "denied",
    secrets: [],
    bytesUp: 0,
    bytesDown: 0,
    durationMs: 1,
    ...over,
  });
}

sdkTest(
  "attack: another tenant's key gets 404 or nothing for every console and E2B route of a sandbox it does not own",
  async (served) => {
    const victim = await Sandbox.create("base", sdk(served, served.keys.a));
    const id = victim.sandboxId;
    await victim.commands.run("echo secret");
    await Deno.writeTextFile(
      join(served.home, "egress.jsonl"),
      egressLine({ user: id, destination: "secret.example" }) + "\n",
    );
    await Deno.writeTextFile(
      join(served.home, "audit.jsonl"),
      JSON.stringify({
        time: new Date().toISOString(),
        user: id,
        tenant: "a",
        group: "default",
        cron: null,
        server: "fs",
        from: "client",
        method: "tools/call",
        tool: "secret_tool",
        arguments: [],
        durationMs: 1,
        outcome: "ok",
      }) + "\n",
    );
    const thief = served.keys.b;
    const routes: [string, string, string?][] = [
      ["GET", `/waffle/v1/sandboxes/${id}/commands`],
      ["POST", `/waffle/v1/sandboxes/${id}/stop`],
      ["GET", `/sandboxes/${id}`],
      ["DELETE", `/sandboxes/${id}`],
      ["POST", `/sandboxes/${id}/timeout`, JSON.stringify({ timeout: 1 })],
      ["POST", `/sandboxes/${id}/connect`, "{}"],
      ["POST", `/v2/sandboxes/${id}/connect`, "{}"],
      ["POST", `/sandboxes/${id}/pause`],
      ["GET", `/sandboxes/${id}/metrics`],
      ["POST", `/sandboxes/${id}/fork`, JSON.stringify({ count: 1 })],
      ["POST", `/sandboxes/${id}/snapshots`, "{}"],
    ];
    for (const [method, path, body] of routes) {
      const answer = await call(served, thief, path, { method, ...(body ? { body } : {}) });
      assert.equal(answer.status, 404, `${method} ${path}: ${answer.text}`);
      assert.ok(!answer.text.includes("secret"), `${method} ${path}`);
    }
    const listed = await call(served, thief, "/waffle/v1/sandboxes");
    assert.deepEqual(listed.body.sandboxes, []);
    assert.deepEqual((await call(served, thief, "/sandboxes")).body, []);
    assert.deepEqual((await call(served, thief, `/snapshots?sandboxID=${id}`)).body, []);
    for (
      const path of [
        `/waffle/v1/egress?sandbox=${id}`,
        "/waffle/v1/egress",
        `/waffle/v1/mcp?sandbox=${id}`,
      ]
    ) {
      const answer = await call(served, thief, path);
      assert.equal(answer.status, 200);
      assert.deepEqual(answer.body.entries, [], path);
      assert.ok(!answer.text.includes("secret"), path);
    }
    // The victim's own key still sees all of it, and its sandbox is unharmed.
    assert.equal(
      (await call(served, served.keys.a, `/waffle/v1/egress?sandbox=${id}`)).body.entries.length,
      1,
    );
    assert.equal(
      (await call(served, served.keys.a, "/waffle/v1/mcp")).body.entries[0].tool,
      "secret_tool",
    );
    assert.equal((await victim.commands.run("echo alive")).stdout, "alive\n");
    assert.equal(
      (await call(served, served.keys.a, "/waffle/v1/sandboxes")).body.sandboxes[0].state,
      "running",
    );
  },
);

sdkTest(
  "attack: hostile output and a broken-into runner cannot fail the console's routes nor pass their caps",
  async (served) => {
    const key = served.keys.a;
    const sandbox = await Sandbox.create("base", sdk(served, key));
    const id = sandbox.sandboxId;
    // A command (uid 10001): 100 MiB of output, NUL bytes, invalid UTF-8 and markup.
    await sandbox.commands.run(
      "head -c 104857600 /dev/zero; printf '\\000\\377\\376<script>alert(1)</script>'",
      {
        onStdout: () => {},
        timeoutMs: 120_000,
      },
    );
    const commands = await call(served, key, `/waffle/v1/sandboxes/${id}/commands`);
    assert.equal(commands.status, 200);
    const [flood] = commands.body.commands;
    assert.equal(flood.truncated, true);
    assert.ok(new TextEncoder().encode(flood.stdoutTail).byteLength <= 4096 * 3);
    assert.ok(flood.stdoutTail.endsWith("<script>alert(1)</script>"));
    assert.ok(commands.text.length < 64 * 1024, `${commands.text.length} bytes`);
    const head = await fetch(`${served.url}/waffle/v1/sandboxes/${id}/commands`, {
      headers: { "x-api-key": key },
    });
    await head.body?.cancel();
    assert.match(head.headers.get("content-type") ?? "", /^application\/json/);
    assert.equal(head.headers.get("x-content-type-options"), "nosniff");
    assert.equal(head.headers.get("cache-control"), "no-store");

    // A broken-into runner (uid 0 in the container): its queue file garbage, its processes killed.
    const container = sandboxKey("a", id, { home: served.home }).containerName;
    const root = await runProcess("docker", [
      "exec",
      "-u",
      "0",
      container,
      "/bin/sh",
      "-c",
      "head -c 65536 /dev/urandom > /queue/outbound/outbound.db; pkill -9 -u 10001 || true; echo done",
    ]);
    assert.equal(root.stdout.trim(), "done", root.stderr);
    for (
      const path of [
        "/waffle/v1/sandboxes",
        `/waffle/v1/sandboxes/${id}/commands?limit=200`,
        "/waffle/v1/whoami",
      ]
    ) {
      const answer = await call(served, key, path);
      assert.equal(answer.status, 200, `${path}: ${answer.text}`);
    }
    const row = (await call(served, key, "/waffle/v1/sandboxes")).body.sandboxes[0];
    assert.equal(row.sandboxID, id);
  },
);

sdkTest(
  "attack: hostile audit lines (huge, invalid, NUL, another tenant's, floods) are skipped and capped",
  async (served) => {
    const key = served.keys.a;
    owned = (await Sandbox.create("base", sdk(served, key))).sandboxId;
    const lines: string[] = [];
    // 3000 lines to 300 destinations: entries capped at 1000, destinations at 100.
    for (let i = 0; i < 3000; i++) lines.push(egressLine({ destination: `d${i % 300}.example` }));
    lines.push("\u0000\u0000{not json");
    lines.push(egressLine({ destination: "nul\u0000byte.example" }));
    lines.push(egressLine({ tenant: "b", destination: "b-only.example" }));
    lines.push(JSON.stringify({ ...JSON.parse(egressLine({})), decision: "<img src=x>" }));
    lines.push(`${egressLine({}).slice(0, -1)},"destination":"${"y".repeat(200_000)}"}`);
    const path = join(served.home, "egress.jsonl");
    await Deno.writeTextFile(path, lines.join("\n") + "\n");
    const answer = await call(served, key, "/waffle/v1/egress?limit=100000");
    assert.equal(answer.status, 200);
    assert.equal(answer.body.entries.length, 1000);
    assert.equal(answer.body.destinations.length, 100);
    assert.ok(answer.body.entries.every((e: { tenant: string }) => e.tenant === "a"));
    assert.equal(answer.body.entries[0].destination, "nul\u0000byte.example");
    assert.ok(!answer.text.includes("b-only") && !answer.text.includes("<img"));
    assert.equal(
      answer.body.series.reduce((n: number, m: { denied: number }) => n + m.denied, 0),
      3001,
    );

    // A 100 MiB file whose last 20 MiB are one line: only the last 8 MiB is read, and nothing
    // of it parses; the answer is empty, not an error.
    const file = await Deno.open(path, { write: true, truncate: true });
    const block = new TextEncoder().encode(egressLine({}) + "\n").subarray(0);
    const mib = new Uint8Array(1 << 20);
    for (let at = 0; at + block.length <= mib.length; at += block.length) mib.set(block, at);
    for (let i = 0; i < 80; i++) await file.write(mib);
    const z = new Uint8Array(1 << 20).fill(0x7a);
    for (let i = 0; i < 20; i++) await file.write(z);
    file.close();
    const huge = await call(served, key, "/waffle/v1/egress");
    assert.equal(huge.status, 200);
    assert.deepEqual(huge.body.entries, []);

    // MCP: bad lines skipped, another tenant's never shown, a missing file is empty.
    await Deno.writeTextFile(join(served.home, "audit.jsonl"), '\u0000garbage\n{"tenant":"a"}\n');
    assert.deepEqual((await call(served, key, "/waffle/v1/mcp")).body.entries, []);
    await Deno.remove(join(served.home, "audit.jsonl"));
    assert.deepEqual((await call(served, key, "/waffle/v1/mcp")).body.entries, []);
    // The audit a FIFO: not opened (it would block), answered empty.
    await Deno.remove(path);
    await runProcess("mkfifo", [path]);
    assert.deepEqual((await call(served, key, "/waffle/v1/egress")).body.entries, []);
  },
);

sdkTest(
  "attack: /ui and /waffle/v1 refuse a foreign Host or Origin (DNS rebinding)",
  async (served) => {
    const { port } = new URL(served.url);
    for (const path of ["/ui", "/ui/", "/ui/app.js", "/waffle/v1/whoami", "/waffle/v1/sandboxes"]) {
      const host = await rawGet(served.url, path, {
        host: `evil.example:${port}`,
        "x-api-key": served.keys.a,
      });
      assert.match(host, /^HTTP\/1\.1 403 /, `${path}: ${host.slice(0, 80)}`);
      const origin = await rawGet(served.url, path, {
        host: `127.0.0.1:${port}`,
        origin: "http://evil.example",
        "x-api-key": served.keys.a,
      });
      assert.match(origin, /^HTTP\/1\.1 403 /, `${path}: ${origin.slice(0, 80)}`);
      // Another port of this host is another origin too.
      const other = await rawGet(served.url, path, {
        host: `127.0.0.1:1`,
        "x-api-key": served.keys.a,
      });
      assert.match(other, /^HTTP\/1\.1 403 /, path);
    }
    const own = await rawGet(served.url, "/waffle/v1/whoami", {
      host: `127.0.0.1:${port}`,
      origin: `http://127.0.0.1:${port}`,
      "x-api-key": served.keys.a,
    });
    assert.match(own, /^HTTP\/1\.1 200 /);
  },
);

sdkTest("attack: a key in a query string or a cookie is never taken", async (served) => {
  const key = served.keys.a;
  const paths = [
    "/waffle/v1/whoami",
    "/waffle/v1/sandboxes",
    "/waffle/v1/egress",
    "/sandboxes",
    "/metrics",
  ];
  for (const path of paths) {
    for (
      const query of [
        `key=${key}`,
        `api_key=${key}`,
        `apiKey=${key}`,
        `x-api-key=${key}`,
        `X-API-KEY=${key}`,
      ]
    ) {
      const answer = await call(served, undefined, `${path}?${query}`);
      assert.equal(answer.status, 401, `${path}?${query.split("=")[0]}`);
    }
    for (
      const cookie of [`x-api-key=${key}`, `key=${key}`, `waffle.key=${key}`, `X-API-Key=${key}`]
    ) {
      const answer = await call(served, undefined, path, { headers: { cookie } });
      assert.equal(answer.status, 401, `${path} cookie ${cookie.split("=")[0]}`);
    }
    assert.equal((await call(served, key, path)).status, 200, path);
  }
  // Bearer only on /metrics (a Prometheus scrape).
  const bearer = await call(served, undefined, "/waffle/v1/whoami", {
    headers: { authorization: `Bearer ${key}` },
  });
  assert.equal(bearer.status, 401);
});
