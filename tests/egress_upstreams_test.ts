/**
 * Self-test of the egress tests' upstream servers (tests/_egress_upstreams.ts)
 * with the host's curl and git and with Deno's fetch. No Docker.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  GIT_README,
  type RecordedRequest,
  startGitServer,
  startUpstream,
  testCa,
  writeCaFile,
} from "./_egress_upstreams.ts";

import { runProcess } from "./_helpers.ts";

const CURL = "/usr/bin/curl";

// Every program run here is bounded by a minute.
function run(
  command: string,
  args: string[],
  options: { env?: Record<string, string>; stdin?: Uint8Array } = {},
): ReturnType<typeof runProcess> {
  return runProcess(command, args, { ...options, timeoutMs: 60_000 });
}

async function tempDir(): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ prefix: "waffle-upstream-test-" });
  return {
    path,
    [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }).catch(() => {}),
  };
}

function only(requests: RecordedRequest[], index: number): RecordedRequest {
  const request = requests[index];
  assert.ok(request !== undefined, `no request #${index}: ${requests.length} recorded`);
  return request;
}

Deno.test("testCa() mints one CA per process and writeCaFile() writes its PEM", async () => {
  const ca = await testCa();
  assert.equal(await testCa(), ca);
  assert.match(ca.cert, /^-----BEGIN CERTIFICATE-----/);
  await using dir = await tempDir();
  const file = await writeCaFile(ca, dir.path);
  assert.deepEqual(file, join(dir.path, "ca.pem"));
  assert.deepEqual(await Deno.readTextFile(file), ca.cert);
});

Deno.test("startUpstream() answers curl by name over TLS, recording SNI and headers", async () => {
  const ca = await testCa();
  await using dir = await tempDir();
  const caFile = await writeCaFile(ca, dir.path);
  await using upstream = await startUpstream({ name: "api.test", ca });
  assert.deepEqual(upstream.connections, 0);
  assert.deepEqual(upstream.url, `https://api.test:${upstream.port}`);
  // Two URLs in one curl: one kept-alive connection, two requests.
  const out = await run(CURL, [
    "-sS",
    "--resolve",
    `api.test:${upstream.port}:127.0.0.1`,
    "--cacert",
    caFile,
    "-H",
    "X-Probe: one",
    `${upstream.url}/first?q=1`,
    `${upstream.url}/second`,
  ]);
  assert.deepEqual(out.code, 0, out.stderr);
  const answers = out.stdout.replaceAll("}{", "}\n{").split("\n").map((line) => JSON.parse(line));
  assert.deepEqual(answers.map((a) => [a.upstream, a.method, a.path]), [
    ["api.test", "GET", "/first?q=1"],
    ["api.test", "GET", "/second"],
  ]);
  assert.deepEqual(answers[0].headers["x-probe"], "one");
  assert.deepEqual(upstream.connections, 1);
  assert.deepEqual(upstream.requests.length, 2);
  const first = only(upstream.requests, 0);
  assert.deepEqual(first.sni, "api.test");
  assert.deepEqual(first.connection, 1);
  assert.deepEqual(first.headers["host"], `api.test:${upstream.port}`);
  assert.deepEqual(first.headers["x-probe"], "one");
  assert.deepEqual(only(upstream.requests, 1).connection, 1);
});

Deno.test("startUpstream() counts a TCP connection that sends nothing, and none before it", async () => {
  await using upstream = await startUpstream({ name: "quiet.test", ca: await testCa() });
  assert.deepEqual(upstream.connections, 0);
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: upstream.port });
  conn.close();
  const deadline = Date.now() + 5_000;
  while (upstream.connections === 0 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  assert.deepEqual(upstream.connections, 1);
  assert.deepEqual(upstream.requests, []);
});

Deno.test("startUpstream() serves Deno fetch to 127.0.0.1: keep-alive, POST bodies, /bytes, Connection: close", async () => {
  const ca = await testCa();
  await using upstream = await startUpstream({ name: "127.0.0.1", ca });
  using client = Deno.createHttpClient({ caCerts: [ca.cert] });
  const first = await fetch(`${upstream.url}/hello`, { client, headers: { "X-Probe": "fetch" } });
  assert.deepEqual(first.status, 200);
  assert.deepEqual(first.headers.get("content-type"), "application/json");
  const json = await first.json();
  assert.deepEqual(json.upstream, "127.0.0.1");
  assert.deepEqual(json.path, "/hello");
  assert.deepEqual(json.headers["x-probe"], "fetch");

  const posted = await fetch(`${upstream.url}/submit`, { client, method: "POST", body: "a=1&b=2" });
  assert.deepEqual((await posted.json()).method, "POST");

  const n = 3 * 1024 * 1024 + 17;
  const bytes = new Uint8Array(
    await (await fetch(`${upstream.url}/bytes/${n}`, { client })).arrayBuffer(),
  );
  assert.deepEqual(bytes.length, n);
  assert.deepEqual([bytes[0], bytes[255], bytes[256], bytes[n - 1]], [0, 255, 0, (n - 1) % 256]);
  assert.deepEqual(upstream.connections, 1, "fetch reuses one connection");

  const closing = await fetch(`${upstream.url}/last`, { client, headers: { connection: "close" } });
  assert.deepEqual(closing.headers.get("connection"), "close");
  await closing.body?.cancel();
  await (await fetch(`${upstream.url}/after`, { client })).body?.cancel();
  assert.deepEqual(upstream.connections, 2, "a new connection after Connection: close");

  assert.deepEqual(upstream.requests.map((r) => [r.method, r.path, r.connection]), [
    ["GET", "/hello", 1],
    ["POST", "/submit", 1],
    ["GET", `/bytes/${n}`, 1],
    ["GET", "/last", 1],
    ["GET", "/after", 2],
  ]);
  assert.deepEqual(only(upstream.requests, 1).body, "a=1&b=2");
  assert.deepEqual(only(upstream.requests, 0).sni, null, "no SNI for an IP literal");
});

Deno.test("startUpstream() /slow/<ms> waits before answering", async () => {
  const ca = await testCa();
  await using upstream = await startUpstream({ name: "127.0.0.1", ca });
  using client = Deno.createHttpClient({ caCerts: [ca.cert] });
  const started = performance.now();
  const response = await fetch(`${upstream.url}/slow/300`, { client });
  assert.deepEqual((await response.json()).path, "/slow/300");
  assert.ok(performance.now() - started >= 290, "answered too soon");
});

Deno.test("startUpstream() without TLS on 127.0.0.2: chunked bodies, HTTP/1.0, 100-continue", async () => {
  await using upstream = await startUpstream({
    name: "plain.test",
    ca: await testCa(),
    hostname: "127.0.0.2",
    tls: false,
  });
  assert.deepEqual(upstream.url, `http://plain.test:${upstream.port}`);
  const resolve = ["--resolve", `plain.test:${upstream.port}:127.0.0.2`];
  const chunked = await run(CURL, [
    "-sS",
    ...resolve,
    "-H",
    "Transfer-Encoding: chunked",
    "-H",
    "Expect: 100-continue",
    "--data-binary",
    "@-",
    `${upstream.url}/chunked`,
  ], { stdin: new TextEncoder().encode("x".repeat(200_000)) });
  assert.deepEqual(chunked.code, 0, chunked.stderr);
  assert.deepEqual(JSON.parse(chunked.stdout).method, "POST");
  const old = await run(CURL, ["-sS", "--http1.0", ...resolve, `${upstream.url}/old`]);
  assert.deepEqual(old.code, 0, old.stderr);
  assert.deepEqual(JSON.parse(old.stdout).path, "/old");
  assert.deepEqual(upstream.connections, 2);
  const [post, get] = upstream.requests;
  assert.deepEqual(post?.headers["transfer-encoding"], "chunked");
  assert.deepEqual(post?.body, "x".repeat(200_000));
  assert.deepEqual(post?.sni, null);
  assert.deepEqual(get?.method, "GET");
});

Deno.test("startGitServer() answers a smart-HTTP ref advertisement to curl by name", async () => {
  const ca = await testCa();
  await using dir = await tempDir();
  const caFile = await writeCaFile(ca, dir.path);
  await using git = await startGitServer({ name: "git.test", ca });
  assert.deepEqual(git.url, `https://git.test:${git.port}/repo.git`);
  const out = await run(CURL, [
    "-sS",
    "--fail",
    "--resolve",
    `git.test:${git.port}:127.0.0.1`,
    "--cacert",
    caFile,
    "-w",
    "\n%{content_type}",
    `${git.url}/info/refs?service=git-upload-pack`,
  ]);
  assert.deepEqual(out.code, 0, out.stderr);
  assert.ok(out.stdout.startsWith("001e# service=git-upload-pack\n"), out.stdout);
  assert.ok(out.stdout.includes(`${git.commit} HEAD`), out.stdout);
  assert.ok(out.stdout.endsWith("\napplication/x-git-upload-pack-advertisement"), out.stdout);
  assert.deepEqual(git.connections, 1);
  assert.deepEqual(only(git.requests, 0).sni, "git.test");
  assert.deepEqual(only(git.requests, 0).path, "/repo.git/info/refs?service=git-upload-pack");
});

Deno.test("startGitServer() takes gzip'd and chunked upload-pack requests", async () => {
  const ca = await testCa();
  await using dir = await tempDir();
  const caFile = await writeCaFile(ca, dir.path);
  await using git = await startGitServer({ name: "127.0.0.1", ca });
  const request = new TextEncoder().encode(`0032want ${git.commit}\n00000009done\n`);
  const gzipped = new Uint8Array(
    await new Response(new Blob([request]).stream().pipeThrough(new CompressionStream("gzip")))
      .arrayBuffer(),
  );
  const post = (extra: string[], body: Uint8Array): ReturnType<typeof runProcess> =>
    run(CURL, [
      "-sS",
      "--fail",
      "--cacert",
      caFile,
      "-H",
      "Content-Type: application/x-git-upload-pack-request",
      ...extra,
      "--data-binary",
      "@-",
      `${git.url}/git-upload-pack`,
    ], { stdin: body });
  const zipped = await post(["-H", "Content-Encoding: gzip"], gzipped);
  assert.deepEqual(zipped.code, 0, zipped.stderr);
  assert.ok(zipped.stdout.includes("PACK"), zipped.stdout);
  const chunked = await post(["-H", "Transfer-Encoding: chunked"], request);
  assert.deepEqual(chunked.code, 0, chunked.stderr);
  assert.ok(chunked.stdout.includes("PACK"), chunked.stdout);
  assert.deepEqual(git.requests.map((r) => r.headers["content-encoding"] ?? null), ["gzip", null]);
});

for (const version of ["0", "2"]) {
  Deno.test(`startGitServer() is cloned by the host's git over HTTPS (protocol v${version})`, async () => {
    const ca = await testCa();
    await using dir = await tempDir();
    const caFile = await writeCaFile(ca, dir.path);
    await using git = await startGitServer({ name: "127.0.0.1", ca });
    const clone = join(dir.path, "clone");
    const out = await run("git", [
      "-c",
      "http.sslVerify=true",
      "-c",
      `protocol.version=${version}`,
      "clone",
      "--quiet",
      git.url,
      clone,
    ], {
      env: { GIT_SSL_CAINFO: caFile, GIT_CONFIG_NOSYSTEM: "1", HOME: dir.path },
    });
    assert.deepEqual(out.code, 0, out.stderr);
    assert.deepEqual(await Deno.readTextFile(join(clone, "README")), GIT_README);
    const head = await run("git", ["-C", clone, "rev-parse", "HEAD"]);
    assert.deepEqual(head.stdout.trim(), git.commit);
    assert.ok(git.connections >= 1);
    const paths = git.requests.map((r) => `${r.method} ${r.path.replace(/\?.*/, "")}`);
    assert.deepEqual(paths[0], "GET /repo.git/info/refs");
    assert.ok(paths.includes("POST /repo.git/git-upload-pack"), paths.join(", "));
    const protocol = only(git.requests, 0).headers["git-protocol"];
    assert.deepEqual(protocol, version === "2" ? "version=2" : undefined);
  });
}
