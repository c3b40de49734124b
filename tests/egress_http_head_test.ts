/**
 * The egress proxy's request heads (lib/egress/http_head.ts): strict
 * parsing, header lookup, serialization, the head sent upstream, and
 * reading a head from a socket with its limits.
 *
 * @module
 */
import assert from "node:assert/strict";
import net from "node:net";
import { Buffer } from "node:buffer";
import {
  headerValues,
  MAX_HEAD_BYTES,
  parseHead,
  readHead,
  type RequestHead,
  serializeHead,
  upstreamHead,
} from "../lib/egress/http_head.ts";

function head(lines: string[]): string {
  return `${lines.join("\r\n")}\r\n\r\n`;
}

Deno.test("parseHead() reads a CONNECT and an absolute-form request", () => {
  assert.deepEqual(parseHead(head(["CONNECT api.test:443 HTTP/1.1", "Host: api.test:443"])), {
    method: "CONNECT",
    target: "api.test:443",
    version: "HTTP/1.1",
    headers: [["Host", "api.test:443"]],
  });
  const get = parseHead(
    head(["GET http://a.test/x?y=1 HTTP/1.0", "Host:a.test", "X-Empty:", "X-Pad:   v  "]),
  );
  assert.equal(get.target, "http://a.test/x?y=1");
  assert.equal(get.version, "HTTP/1.0");
  assert.deepEqual(get.headers, [["Host", "a.test"], ["X-Empty", ""], ["X-Pad", "v"]]);
  assert.deepEqual(parseHead(head(["GET / HTTP/1.1"])).headers, []);
});

Deno.test("parseHead() refuses malformed request lines", () => {
  for (
    const line of [
      "get / HTTP/1.1",
      "GET /  HTTP/1.1",
      "GET  / HTTP/1.1",
      "GET / HTTP/2.0",
      "GET / HTTP/1.1 ",
      "GET /",
      "GET / http/1.1",
      "",
      `GET /${"a".repeat(9000)} HTTP/1.1`,
      "GET\t/ HTTP/1.1",
    ]
  ) {
    assert.throws(() => parseHead(head([line])), /Malformed request line/, JSON.stringify(line));
  }
  // Bare LF line ends are no CRLF: the request line does not end where it should.
  assert.throws(() => parseHead("GET / HTTP/1.1\nHost: a\n\n"), /Malformed request line/);
});

Deno.test("parseHead() refuses malformed header lines: no colon, bad names, folding, NUL", () => {
  for (
    const line of [
      "NoColon",
      ": empty name",
      "Bad Name: x",
      "Bad\tName: x",
      " Folded: x",
      "\tcontinued",
      "X-Nul: a\0b",
      "Host : a.test",
      'Quo"te: x',
    ]
  ) {
    assert.throws(
      () => parseHead(head(["GET http://a.test/ HTTP/1.1", "Host: a.test", line])),
      /Malformed header line/,
      JSON.stringify(line),
    );
  }
  // A lone CR inside the head.
  assert.throws(() => parseHead("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n"), /Malformed header line/);
});

Deno.test("headerValues() matches names case-insensitively and keeps order", () => {
  const parsed = parseHead(head(["GET / HTTP/1.1", "Host: a", "X-A: 1", "x-a: 2", "X-B: 3"]));
  assert.deepEqual(headerValues(parsed, "x-A"), ["1", "2"]);
  assert.deepEqual(headerValues(parsed, "host"), ["a"]);
  assert.deepEqual(headerValues(parsed, "missing"), []);
});

Deno.test("serializeHead() writes a head parseHead() reads back", () => {
  const original: RequestHead = {
    method: "POST",
    target: "/upload?x=1",
    version: "HTTP/1.1",
    headers: [["Host", "a.test"], ["Content-Length", "3"], ["X-Latin", "caf\u00e9"]],
  };
  const bytes = serializeHead(original);
  assert.equal(
    bytes.toString("latin1"),
    "POST /upload?x=1 HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nX-Latin: caf\u00e9\r\n\r\n",
  );
  assert.equal(bytes.length, bytes.toString("latin1").length, "one byte per character");
  assert.deepEqual(parseHead(bytes.toString("latin1")), original);
});

Deno.test("upstreamHead() drops hop-by-hop and Proxy-* headers and adds Connection: close", () => {
  const parsed = parseHead(head([
    "GET http://a.test/p?q HTTP/1.1",
    "Host: a.test",
    "Connection: keep-alive, X-Hop",
    "Keep-Alive: timeout=5",
    "Proxy-Connection: keep-alive",
    "Proxy-Authorization: Basic c2VjcmV0",
    "Proxy-Authenticate: Basic",
    "Proxy-Foo: bar",
    "Proxy: http://evil.test",
    "TE: trailers",
    "Upgrade: websocket",
    "X-Hop: listed in Connection",
    "Authorization: Bearer kept",
    "X-Kept: 1",
    "Transfer-Encoding: chunked",
  ]));
  const sent = upstreamHead(parsed, "/p?q");
  assert.equal(sent.target, "/p?q");
  assert.equal(sent.method, "GET");
  assert.deepEqual(sent.headers, [
    ["Host", "a.test"],
    ["Authorization", "Bearer kept"],
    ["X-Kept", "1"],
    ["Transfer-Encoding", "chunked"],
    ["Connection", "close"],
  ]);
  // The client's head is left as it was.
  assert.equal(headerValues(parsed, "proxy-authorization").length, 1);
  // Names are matched whatever their case.
  const mixed = upstreamHead(
    parseHead(head(["GET / HTTP/1.1", "CONNECTION: close", "proxy-AUTHORIZATION: x"])),
    "/",
  );
  assert.deepEqual(mixed.headers, [["Connection", "close"]]);
});

// A connected pair of sockets over a loopback listener.
async function socketPair(): Promise<{ client: net.Socket; server: net.Socket } & AsyncDisposable> {
  const listener = net.createServer();
  await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
  const { port } = listener.address() as net.AddressInfo;
  const accepted = new Promise<net.Socket>((resolve) => listener.once("connection", resolve));
  const client = net.connect({ host: "127.0.0.1", port });
  await new Promise<void>((resolve) => client.once("connect", () => resolve()));
  const server = await accepted;
  return {
    client,
    server,
    async [Symbol.asyncDispose](): Promise<void> {
      const closed = (s: net.Socket): Promise<void> =>
        s.destroyed
          ? Promise.resolve()
          : new Promise((resolve) => s.once("close", () => resolve()));
      const both = Promise.all([closed(client), closed(server)]);
      client.destroy();
      server.destroy();
      await both;
      await new Promise<void>((resolve) => listener.close(() => resolve()));
    },
  };
}

Deno.test("readHead() returns the head and the bytes after it, sent in pieces", async () => {
  await using pair = await socketPair();
  const read = readHead(pair.server, { timeoutMs: 5000 });
  pair.client.write("CONNECT a.test:443 HTTP/1.1\r\nHo");
  await new Promise((resolve) => setTimeout(resolve, 20));
  pair.client.write("st: a.test:443\r\n\r\n\x16\x03\x01rest");
  const { head: parsed, rest } = await read;
  assert.equal(parsed.target, "a.test:443");
  assert.deepEqual(parsed.headers, [["Host", "a.test:443"]]);
  assert.equal(Buffer.from(rest).toString("latin1"), "\x16\x03\x01rest");
});

Deno.test("readHead() gives up on a head too large, too late or cut short", async () => {
  {
    await using pair = await socketPair();
    const read = readHead(pair.server, { timeoutMs: 5000 });
    pair.client.write(`GET / HTTP/1.1\r\nX: ${"a".repeat(MAX_HEAD_BYTES)}`);
    await assert.rejects(read, /More than 32768 bytes/);
  }
  {
    await using pair = await socketPair();
    const read = readHead(pair.server, { timeoutMs: 100 });
    pair.client.write("GET / HTTP/1.1\r\n");
    await assert.rejects(read, /Nothing complete within 100 ms/);
  }
  {
    await using pair = await socketPair();
    const read = readHead(pair.server, { timeoutMs: 5000 });
    pair.client.end("GET / HTTP/1.1\r\n");
    await assert.rejects(read, /closed the connection/);
  }
});
