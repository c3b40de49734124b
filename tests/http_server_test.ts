/**
 * `lib/http`, the owner of waffle's HTTP listeners, against real TCP
 * clients on loopback (127.0.0.2, 127.0.0.3, ... are peers of their own):
 * its connection caps (per peer and in all), the deadlines of headers,
 * whole requests and kept-alive connections, a streaming response that
 * outlives all of them, and an accept loop that survives running out of
 * file descriptors (a server process of its own with `ulimit -n 64`).
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { type HttpLimits, peerOf, resolveHttpLimits, serveHttp } from "../lib/http/mod.ts";
import { mintCa, mintLeaf } from "../lib/egress/ca.ts";
import { delay, waitFor } from "./_helpers.ts";
import { loopbackPeers, type RawClient, rawClient, slowloris } from "./_slow_clients.ts";

const FIXTURE = fileURLToPath(new URL("./fixtures/http_server.ts", import.meta.url));

/** A `lib/http` server in this process. */
async function serving(
  limits: Partial<HttpLimits>,
  handler: (request: Request) => Response | Promise<Response> = () => new Response("ok\n"),
): Promise<{
  port: number;
  hostname: string;
  notices: string[];
  connectionCount(): number;
  [Symbol.asyncDispose](): Promise<void>;
}> {
  const notices: string[] = [];
  const server = await serveHttp(handler, {
    hostname: "127.0.0.1",
    port: 0,
    limits,
    onEvent: (line) => void notices.push(line),
  });
  return {
    hostname: "127.0.0.1",
    port: server.addr.port,
    notices,
    connectionCount: () => server.connectionCount(),
    [Symbol.asyncDispose]: () => server.shutdown({ graceMs: 0 }),
  };
}

/** Sends a whole request on a new connection (from `from`) and waits for the server to close it. */
async function request(
  target: { hostname: string; port: number },
  from: string,
  head = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
): Promise<string> {
  const client = await rawClient(target, from);
  client.write(head);
  await waitFor(() => client.closed(), { what: `the answer to ${JSON.stringify(head)}` });
  return client.received();
}

/** Opens `count` connections from `from`, each with a request line and a header not yet ended. */
async function halfRequests(
  target: { hostname: string; port: number },
  peers: string[],
): Promise<RawClient[]> {
  const clients = await Promise.all(peers.map((from) => rawClient(target, from)));
  for (const client of clients) client.write("GET / HTTP/1.1\r\nHost: x\r\n");
  return clients;
}

function status(received: string): number {
  return Number(/^HTTP\/1\.1 (\d{3})/.exec(received)?.[1] ?? 0);
}

Deno.test("resolveHttpLimits() caps the default connections at half the open-file limit, and refuses a header deadline past the request deadline", () => {
  const small = resolveHttpLimits({}, { openFileLimit: 256 });
  assert.equal(small.maxConnections, 128);
  assert.equal(small.maxConnectionsPerPeer, 64);
  assert.equal(resolveHttpLimits({}, { openFileLimit: 10 }).maxConnectionsPerPeer, 5);
  assert.equal(resolveHttpLimits({}, { openFileLimit: 1 << 20 }).maxConnections, 512);
  // Given values are kept: the caller asked for them.
  assert.equal(
    resolveHttpLimits({ maxConnections: 4096 }, { openFileLimit: 256 }).maxConnections,
    4096,
  );
  assert.equal(resolveHttpLimits({ headerTimeoutMs: 90_000 }).requestTimeoutMs, 90_000);
  assert.throws(
    () => resolveHttpLimits({ headerTimeoutMs: 5000, requestTimeoutMs: 1000 }),
    /'headerTimeoutMs' must not exceed 'requestTimeoutMs' \(1000\): current value is 5000/,
  );
  assert.throws(() => resolveHttpLimits({ maxConnections: 0 }), /current value is 0/);
});

Deno.test("peerOf() counts an IPv4 address as itself, an IPv4-mapped address as its IPv4 one, and IPv6 by its /64", () => {
  assert.equal(peerOf("127.0.0.2"), "127.0.0.2");
  assert.equal(peerOf("::ffff:10.0.0.7"), "10.0.0.7");
  assert.equal(peerOf("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
  assert.equal(peerOf("2001:db8:1:2:bbbb:cccc:dddd:eeee"), "2001:db8:1:2::/64");
  assert.equal(peerOf("2001:0db8:0001:0002::9"), "2001:db8:1:2::/64");
  assert.equal(peerOf("::1"), "0:0:0:0::/64");
  assert.equal(peerOf("fe80::1%eth0"), "fe80:0:0:0::/64");
});

Deno.test("serveHttp() closes a connection past the per-peer cap as soon as it is accepted, and serves other peers meanwhile", async () => {
  // The header deadline is far off: only the cap can close a connection here.
  await using server = await serving({
    maxConnections: 16,
    maxConnectionsPerPeer: 3,
    headerTimeoutMs: 60_000,
  });
  const held = await halfRequests(server, Array(5).fill("127.0.0.2"));
  await waitFor(() => held.filter((client) => client.closed()).length === 2, {
    what: "the 2 connections past the cap to be closed",
  });
  const refused = held.filter((client) => client.closed());
  assert.deepEqual(refused.map((client) => client.received()), ["", ""], "closed unanswered");
  assert.match(server.notices.join("\n"), /from 127\.0\.0\.2: 3 are open from it/);
  // Another peer is served while 127.0.0.2 is at its cap.
  assert.equal(status(await request(server, "127.0.0.3")), 200);
  // The 3 under the cap were kept: each gets its answer once its header ends.
  const kept = held.filter((client) => !client.closed());
  for (const client of kept) client.write("Connection: close\r\n\r\n");
  await waitFor(() => kept.every((client) => client.closed()), { what: "the 3 answers" });
  assert.deepEqual(kept.map((client) => status(client.received())), [200, 200, 200]);
  // Their places are free again.
  assert.equal(status(await request(server, "127.0.0.2")), 200);
});

Deno.test("serveHttp() closes a new connection past the total cap, whatever its peer, and serves the open ones", async () => {
  await using server = await serving({
    maxConnections: 4,
    maxConnectionsPerPeer: 4,
    headerTimeoutMs: 60_000,
  });
  const held = await halfRequests(server, loopbackPeers(4));
  const late = await rawClient(server, "127.0.1.1");
  await waitFor(() => late.closed(), { what: "the connection past the total cap to be closed" });
  assert.equal(late.received(), "", "closed unanswered");
  assert.match(server.notices.join("\n"), /from 127\.0\.1\.1: 4 are open, the most allowed/);
  for (const client of held) client.write("Connection: close\r\n\r\n");
  await waitFor(() => held.every((client) => client.closed()), { what: "the 4 answers" });
  assert.deepEqual(held.map((client) => status(client.received())), [200, 200, 200, 200]);
  assert.equal(status(await request(server, "127.0.1.1")), 200);
});

Deno.test("serveHttp() answers 408 and closes a connection whose headers, or whose body, come too slowly, or that sends nothing", async () => {
  await using server = await serving(
    { headerTimeoutMs: 500, requestTimeoutMs: 1000 },
    async (request) => {
      await request.text();
      return new Response("ok\n");
    },
  );
  await using flood = await slowloris(server, {
    connections: 4,
    peers: ["127.0.0.2"],
    everyMs: 100,
    head: "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ",
  });
  const body = await rawClient(server, "127.0.0.3");
  body.write("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab");
  const trickle = setInterval(() => body.write("c"), 100);
  const silent = await rawClient(server, "127.0.0.4");
  try {
    await flood.allClosed(30_000);
    await waitFor(() => body.closed() && silent.closed(), { timeoutMs: 30_000 });
  } finally {
    clearInterval(trickle);
  }
  assert.equal(flood.timedOut(), 4, flood.clients.map((client) => client.received()).join("|"));
  assert.equal(status(body.received()), 408, body.received());
  assert.equal(status(silent.received()), 408, silent.received());
});

Deno.test("serveHttp() closes a kept-alive connection idle past its deadline (blank lines are no request), and never cuts a response that streams longer than every deadline", async () => {
  const gap = 1600; // past every deadline below (Node adds 1 s to the keep-alive one)
  await using server = await serving(
    { headerTimeoutMs: 300, requestTimeoutMs: 300, keepAliveTimeoutMs: 300 },
    async (request) => {
      if (request.method === "POST") await request.text();
      let sent = 0;
      return new Response(
        new ReadableStream<Uint8Array>({
          async pull(controller): Promise<void> {
            if (sent > 0) await delay(gap);
            if (sent++ === 4) return controller.close();
            controller.enqueue(new TextEncoder().encode(`data: ${sent}\n\n`));
          },
        }),
        { headers: { "content-type": "text/event-stream" } },
      );
    },
  );
  const url = `http://127.0.0.1:${server.port}/`;
  const streams = [
    fetch(url).then((response) => response.text()),
    fetch(url, { method: "POST", body: "{}" }).then((response) => response.text()),
  ];
  const idle = await rawClient(server, "127.0.0.2");
  idle.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  const blanks = setInterval(() => idle.write("\r\n"), 100);
  try {
    await waitFor(() => idle.closed(), { timeoutMs: 30_000, what: "the idle connection to close" });
  } finally {
    clearInterval(blanks);
  }
  assert.match(idle.received(), /^HTTP\/1\.1 200 OK\r\n[^]*Connection: keep-alive/);
  assert.match(idle.received(), /data: 4\n\n/, "its response was whole before the idle deadline");
  for (const text of await Promise.all(streams)) {
    assert.equal(text, "data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  }
});

Deno.test("serveHttp() closes a connection whose client stops reading a large response, and never one whose client reads it slowly but steadily", async () => {
  const stallMs = 1000;
  const chunk = new Uint8Array(1024 * 1024).fill(0x61);
  const total = 256 * chunk.byteLength; // far more than loopback's socket buffers hold unread
  await using server = await serving({ writeStallTimeoutMs: stallMs }, () => {
    let sent = 0;
    return new Response(
      new ReadableStream<Uint8Array>({
        pull(controller): void {
          if (sent++ === total / chunk.byteLength) return controller.close();
          controller.enqueue(chunk);
        },
      }),
      { headers: { "content-length": String(total) } },
    );
  });
  const head = new TextEncoder().encode("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const stopped = await Deno.connect({ hostname: server.hostname, port: server.port });
  const steady = await Deno.connect({ hostname: server.hostname, port: server.port });
  await stopped.write(head);
  await steady.write(head);
  const buffer = new Uint8Array(chunk.byteLength);
  let received = 0;
  // Reads what has arrived (up to 1 MiB) five times per stall deadline, for
  // four of them: the response's writes keep making progress (the sender
  // wakes only once a good part of its socket buffer is free).
  for (let round = 0; round < 20; round++) {
    await delay(stallMs / 5);
    const read = await steady.read(buffer);
    assert.ok(read !== null, `the steady reader's connection is open in round ${round}`);
    received += read;
  }
  await waitFor(() => server.connectionCount() === 1, {
    what: "the connection whose client stopped reading to close",
  });
  let unread = 0;
  try {
    for (let read = await stopped.read(buffer); read !== null; read = await stopped.read(buffer)) {
      unread += read;
    }
  } catch {
    // A reset: the server closed with bytes unsent.
  } finally {
    stopped.close();
  }
  assert.ok(unread < total, `the stalled response was cut (${unread} of ${total} bytes)`);
  for (let read = await steady.read(buffer); read !== null; read = await steady.read(buffer)) {
    received += read;
  }
  steady.close();
  const headBytes = received - total;
  assert.ok(headBytes > 0 && headBytes < 1024, `the steady reader got all ${total} body bytes`);
});

Deno.test("serveHttp() refuses headers over the limit with 431, serves an absolute-form target under its own authority, and turns a handler's error into a 500", async () => {
  await using server = await serving({ maxHeaderBytes: 8192 }, (request) => {
    if (new URL(request.url).pathname === "/throw") throw new Error("first line\nsecond line");
    return new Response(
      `host=${request.headers.get("host")} path=${new URL(request.url).pathname}`,
    );
  });
  const big = await request(
    server,
    "127.0.0.2",
    `GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${"a".repeat(16_384)}\r\n\r\n`,
  );
  assert.equal(status(big), 431, big);
  const absolute = await request(
    server,
    "127.0.0.2",
    "GET http://elsewhere.example:81/p HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
  );
  assert.match(absolute, /host=elsewhere\.example:81 path=\/p/);
  const failed = await request(
    server,
    "127.0.0.2",
    "GET /throw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  );
  assert.equal(status(failed), 500);
  assert.match(failed, /Internal Server Error: first line\r?\n/);
  assert.doesNotMatch(failed, /second line/);
});

Deno.test({
  name:
    "serveHttp() keeps accepting after the process runs out of file descriptors, and says so in one line",
  sanitizeResources: false,
  fn: async () => {
    // Caps past the file limit: accepting itself fails (EMFILE).
    const limits = { maxConnections: 4096, maxConnectionsPerPeer: 4096, headerTimeoutMs: 2000 };
    const child = new Deno.Command("sh", {
      args: [
        "-c",
        'ulimit -n 64 && exec "$0" run -A --quiet "$1" "$2"',
        Deno.execPath(),
        FIXTURE,
        JSON.stringify(limits),
      ],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    let stderr = "";
    const stderrDone = (async () => {
      for await (const text of child.stderr.pipeThrough(new TextDecoderStream())) stderr += text;
    })();
    try {
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      const first = await reader.read();
      reader.releaseLock();
      const target = {
        hostname: "127.0.0.1",
        port: JSON.parse(first.value ?? "{}").port as number,
      };
      {
        await using flood = await slowloris(target, {
          connections: 96,
          peers: loopbackPeers(8),
          everyMs: 200,
          head: "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ",
        });
        await flood.allClosed(60_000);
        assert.equal(flood.refused(), 0, "nothing was refused at a cap");
        assert.equal(flood.timedOut(), 96, "every one was accepted in the end, and timed out");
      }
      assert.equal(status(await request(target, "127.0.0.2")), 200, stderr);
      const notices = stderr.split("\n").filter((line) => line.includes("cannot accept"));
      assert.equal(notices.length, 1, stderr);
      assert.match(notices[0]!, /Too many open files/);
      assert.doesNotMatch(stderr, /Uncaught|error:/);
    } finally {
      child.kill("SIGTERM");
      await child.status;
      await stderrDone;
    }
  },
});

Deno.test("serveHttp() answers a request no web handler can take (TRACE, a garbled target) with 400, a response Node cannot send with 500, and lives on", async () => {
  await using server = await serving(
    {},
    (request) =>
      new URL(request.url).pathname === "/odd"
        ? new Response("odd", { headers: { "x-odd": "a\x01b" } })
        : new Response("ok\n"),
  );
  const trace = await request(
    server,
    "127.0.0.2",
    "TRACE / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  );
  assert.equal(status(trace), 400, trace);
  assert.match(trace, /Bad Request: cannot serve 'TRACE \/': Method is forbidden/);
  const garbled = await request(
    server,
    "127.0.0.2",
    "GET http://[x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  );
  assert.equal(status(garbled), 400, garbled);
  const odd = await request(
    server,
    "127.0.0.2",
    "GET /odd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  );
  assert.equal(status(odd), 500, odd);
  assert.equal(status(await request(server, "127.0.0.2")), 200);
});

Deno.test("serveHttp() with tls serves HTTPS, and a TLS handshake that never completes counts against the caps and is closed at the header deadline", async () => {
  const ca = await mintCa({ commonName: "waffle test CA" });
  const leaf = await mintLeaf(ca, "127.0.0.1");
  const server = await serveHttp(
    (request) => new Response(`${new URL(request.url).protocol} ${request.method}\n`),
    {
      hostname: "127.0.0.1",
      port: 0,
      tls: leaf,
      limits: { maxConnections: 8, maxConnectionsPerPeer: 2, headerTimeoutMs: 500 },
    },
  );
  const target = { hostname: "127.0.0.1", port: server.addr.port };
  try {
    using client = Deno.createHttpClient({ caCerts: [ca.cert] });
    const answer = await fetch(`https://127.0.0.1:${target.port}/`, { client });
    assert.equal(await answer.text(), "https: GET\n");
    // Two peers' worth of handshakes that never end: a silent one, and half a ClientHello.
    const silent = await rawClient(target, "127.0.0.2");
    const half = await rawClient(target, "127.0.0.2");
    half.write("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03");
    // The peer is at its cap while both wait: a third is closed at once, unanswered.
    const third = await rawClient(target, "127.0.0.2");
    await waitFor(() => third.closed(), { what: "the connection past the per-peer cap to close" });
    assert.equal(third.received(), "");
    assert.ok(
      !silent.closed() || !half.closed(),
      "the third was closed by the cap, not a deadline",
    );
    // The header deadline closes both (no HTTP bytes ever arrived).
    await waitFor(() => silent.closed() && half.closed(), {
      timeoutMs: 30_000,
      what: "the stuck handshakes to be closed at the header deadline",
    });
    // Their places are free again (the fetch client's kept-alive connection stays).
    await waitFor(() => server.connectionCount() === 1, { what: "their places to be free" });
    const again = await fetch(`https://127.0.0.1:${target.port}/`, { client, method: "POST" });
    assert.equal(await again.text(), "https: POST\n");
  } finally {
    await server.shutdown({ graceMs: 0 });
  }
});
