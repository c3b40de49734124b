/**
 * The egress proxy's request heads (lib/egress/http_head.ts): strict
 * parsing, header lookup, serialization, the head sent upstream, and
 * reading a head from a socket with its limits; and the authority a head
 * names and the origin form it goes upstream in (lib/egress/request_target.ts).
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
import {
  type Authority,
  connectAuthority,
  effectiveAuthority,
  formatAuthority,
  forwardedRequest,
  tunnelRequest,
} from "../lib/egress/request_target.ts";
import { EgressFailed, EgressRefused } from "../lib/egress/refusal.ts";
import { bodyFraming, bodyTracker } from "../lib/egress/http_framing.ts";

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

// A GET with the given target and Host header lines.
function request(target: string, ...hosts: string[]): RequestHead {
  return parseHead(head([`GET ${target} HTTP/1.1`, ...hosts.map((h) => `Host: ${h}`), "X-A: 1"]));
}

// Asserts `fn` throws an EgressRefused with this status whose message matches.
function refuses(fn: () => unknown, status: number, message: RegExp): void {
  assert.throws(fn, (error: unknown) => {
    assert.ok(error instanceof EgressRefused, String(error));
    assert.equal(error.status, status);
    assert.match(error.message, message);
    assert.ok(!error.message.includes("\n"), error.message);
    return true;
  });
}

const TUNNEL: Authority = { host: "secret.test", port: 18443 };

Deno.test("tunnelRequest() refuses a target naming another authority, by host, port or scheme, before anything is sent", () => {
  const foreign = /^Request target '.*' names '.*', not this tunnel's 'secret\.test:18443'$/;
  for (
    const target of [
      "http://attacker.example/steal?x=1",
      "https://attacker.example:18443/steal",
      "https://secret.test.attacker.example:18443/",
      "https://secret.test/steal", // 443
      "https://secret.test:443/steal",
      "https://secret.test:8443/steal",
      "http://secret.test/steal", // 80
      "https://127.0.0.2:18443/",
      "https://[::1]:18443/",
      "https://secret.test..:18443/",
    ]
  ) {
    refuses(() => tunnelRequest(request(target, "secret.test:18443"), TUNNEL), 403, foreign);
  }
  refuses(
    () => tunnelRequest(request("http://attacker.example/steal?x=1", "secret.test:18443"), TUNNEL),
    403,
    /^Request target 'http:\/\/attacker\.example\/steal\?x=1' names 'attacker\.example:80', not this tunnel's 'secret\.test:18443'$/,
  );
  // The right host and port by http:// in a TLS tunnel.
  refuses(
    () => tunnelRequest(request("http://secret.test:18443/", "secret.test:18443"), TUNNEL),
    403,
    /is an http:\/\/ URL in a TLS tunnel, not https:\/\//,
  );
});

Deno.test("tunnelRequest() refuses asterisk- and authority-form, userinfo, '//' paths and characters no target may hold", () => {
  const cases: [RequestHead, RegExp][] = [
    [
      request("*", "secret.test:18443"),
      /'\*' is neither origin-form \('\/path'\) nor an absolute https:\/\/ URL/,
    ],
    [
      parseHead(head(["OPTIONS * HTTP/1.1", "Host: secret.test:18443"])),
      /'\*' is neither origin-form/,
    ],
    [
      parseHead(head(["CONNECT secret.test:18443 HTTP/1.1", "Host: secret.test:18443"])),
      /'secret\.test:18443' is neither origin-form/,
    ],
    [
      parseHead(head(["CONNECT / HTTP/1.1", "Host: secret.test:18443"])),
      /'\/' comes with CONNECT/,
    ],
    [request("https://x@secret.test:18443/", "secret.test:18443"), /carries userinfo/],
    [request("https://x:y@secret.test:18443/", "secret.test:18443"), /carries userinfo/],
    [request("//attacker.example/steal", "secret.test:18443"), /path starting with '\/\/'/],
    [request("https://secret.test:18443//attacker.example/", "secret.test:18443"), /'\/\/'/],
    [request("/\\attacker.example/steal", "secret.test:18443"), /a backslash/],
    [request("https://secret.test:18443\\@attacker.example/", "secret.test:18443"), /a backslash/],
    [request("/x#frag", "secret.test:18443"), /'#'/],
    [request("/caf\u00e9", "secret.test:18443"), /non-ASCII/],
    [request("/x\x7f", "secret.test:18443"), /control/],
    [request("steal", "secret.test:18443"), /neither origin-form/],
    [request("?x=1", "secret.test:18443"), /neither origin-form/],
    [request("https://secret.test:99999/", "secret.test:18443"), /names no valid host and port/],
    [request("https://secret.test:0/", "secret.test:18443"), /names no valid host and port/],
    [request("https://sec%72et.test:18443/", "secret.test:18443"), /names no valid host and port/],
    [request("https://[127.0.0.1]:18443/", "secret.test:18443"), /names no valid host and port/],
    [
      request("https://[fe80::1%25eth0]:18443/", "secret.test:18443"),
      /names no valid host and port/,
    ],
    [request("ftp://secret.test:18443/", "secret.test:18443"), /is a ftp: URL, not https:\/\//],
  ];
  for (const [parsed, message] of cases) {
    refuses(() => tunnelRequest(parsed, TUNNEL), 403, message);
  }
});

Deno.test("tunnelRequest() needs one Host naming the tunnel's host and port, whatever the target", () => {
  const mismatch =
    /^Request Host header '.*' does not match 'secret\.test' port 18443, this tunnel's$/;
  for (
    const hosts of [
      ["attacker.example"],
      ["secret.test"], // 443
      ["secret.test:443"],
      ["secret.test:18444"],
      ["x@secret.test:18443"],
      ["secret.test:18443", "secret.test:18443"],
      ["[secret.test]:18443"],
      [],
    ]
  ) {
    refuses(() => tunnelRequest(request("/steal", ...hosts), TUNNEL), 403, mismatch);
    refuses(
      () => tunnelRequest(request("https://secret.test:18443/steal", ...hosts), TUNNEL),
      403,
      mismatch,
    );
  }
});

Deno.test("tunnelRequest() sends an origin form as it is and a matching absolute form in origin form, under the Host it checked", () => {
  const cases: [string, string, string][] = [
    ["/x?y=1", "secret.test:18443", "/x?y=1"],
    ["/", "Secret.TEST.:18443", "/"],
    ["/a/b;c=d?e=f&g=%2F%2F/h", "secret.test:18443", "/a/b;c=d?e=f&g=%2F%2F/h"],
    ["https://secret.test:18443/ok?x=1", "secret.test:18443", "/ok?x=1"],
    ["HTTPS://SECRET.TEST.:18443/case", "secret.test:18443", "/case"],
    ["https://secret.test:18443", "secret.test:18443", "/"],
    ["https://secret.test:18443?q", "secret.test:18443", "/?q"],
  ];
  for (const [target, host, origin] of cases) {
    const routed = tunnelRequest(request(target, host), TUNNEL);
    assert.deepEqual(routed.authority, TUNNEL);
    assert.equal(routed.head.target, origin, target);
    assert.deepEqual(routed.head.headers, [["Host", "secret.test:18443"], ["X-A", "1"]], target);
  }
  // The default port is left out of the Host it writes; an IPv6 host is bracketed.
  const onDefault = tunnelRequest(request("https://secret.test/", "secret.test:443"), {
    host: "secret.test",
    port: 443,
  });
  assert.deepEqual(onDefault.head.headers[0], ["Host", "secret.test"]);
  const v6 = tunnelRequest(request("https://[FD00::0001]:8443/", "[fd00::1]:8443"), {
    host: "fd00::1",
    port: 8443,
  });
  assert.equal(v6.head.target, "/");
  assert.deepEqual(v6.head.headers[0], ["Host", "[fd00::1]:8443"]);
});

Deno.test("forwardedRequest() forwards http:// in origin form under the Host it checked, by the same rule", () => {
  const routed = forwardedRequest(request("http://Plain.Test.:8080/p?q=1", "plain.test:8080"));
  assert.deepEqual(routed.authority, { host: "plain.test", port: 8080 });
  assert.equal(routed.head.target, "/p?q=1");
  assert.deepEqual(routed.head.headers, [["Host", "plain.test:8080"], ["X-A", "1"]]);
  const port80 = forwardedRequest(request("http://plain.test", "plain.test:80"));
  assert.deepEqual(port80.authority, { host: "plain.test", port: 80 });
  assert.equal(port80.head.target, "/");
  assert.deepEqual(port80.head.headers[0], ["Host", "plain.test"]);

  // Not a proxy request, or not http://: malformed (400).
  for (
    const [target, message] of [
      ["/relative", /no absolute URL/],
      ["*", /no absolute URL/],
      ["plain.test:80", /no absolute URL/],
      ["https://plain.test/", /^Only http:\/\/ is forwarded \('https:'\); use CONNECT for https$/],
    ] as [string, RegExp][]
  ) {
    assert.throws(() => forwardedRequest(request(target, "plain.test")), (error: unknown) => {
      assert.ok(error instanceof EgressFailed, String(error));
      assert.equal(error.status, 400);
      assert.match(error.message, message);
      return true;
    });
  }
  // Refused (403): userinfo, '//' paths, odd characters, a Host naming another port or host.
  refuses(() => forwardedRequest(request("http://u@plain.test/", "plain.test")), 403, /userinfo/);
  refuses(
    () => forwardedRequest(request("http://plain.test//evil.test/", "plain.test")),
    403,
    /'\/\/'/,
  );
  refuses(
    () => forwardedRequest(request("http://plain.test/a\\b", "plain.test")),
    403,
    /backslash/,
  );
  const mismatch =
    /^Request Host header '.*' does not match 'plain\.test' port 8080, the request target's$/;
  for (const hosts of [["plain.test"], ["plain.test:80"], ["evil.test:8080"], []]) {
    refuses(() => forwardedRequest(request("http://plain.test:8080/", ...hosts)), 403, mismatch);
  }
});

Deno.test("effectiveAuthority() reads RFC 9112's: the absolute form's authority over Host, else the one Host", () => {
  assert.deepEqual(effectiveAuthority(request("https://b.test/", "a.test"), "https"), {
    host: "b.test",
    port: 443,
  });
  assert.deepEqual(effectiveAuthority(request("/", "A.Test.:8443"), "https"), {
    host: "a.test",
    port: 8443,
  });
  assert.deepEqual(effectiveAuthority(request("/", "a.test"), "http"), {
    host: "a.test",
    port: 80,
  });
  assert.deepEqual(effectiveAuthority(request("/", "[::1]"), "https"), { host: "::1", port: 443 });
  for (
    const parsed of [
      request("http://b.test/", "a.test"), // http:// read by an https server
      request("/", "a.test", "b.test"),
      request("/"),
      request("*", "a.test"),
      request("//b.test/", "a.test"),
      request("https://u@b.test/", "a.test"),
      parseHead(head(["CONNECT a.test:443 HTTP/1.1", "Host: a.test:443"])),
    ]
  ) {
    assert.equal(effectiveAuthority(parsed, "https"), undefined, parsed.target);
  }
});

Deno.test("connectAuthority() reads host:port canonically and formatAuthority() writes it back", () => {
  assert.deepEqual(connectAuthority("API.Test.:443"), { host: "api.test", port: 443 });
  assert.deepEqual(connectAuthority("[FD00::1]:8443"), { host: "fd00::1", port: 8443 });
  assert.deepEqual(connectAuthority("[::ffff:127.0.0.1]:80"), { host: "127.0.0.1", port: 80 });
  for (
    const [target, message] of [
      ["api.test", /^Malformed CONNECT target 'api\.test'$/],
      ["api.test:99999", /^Invalid port '99999'$/],
      ["[1.2.3.4]:443", /^Malformed host '\[1\.2\.3\.4\]'$/],
      ["u@api.test:443", /^Malformed host 'u@api\.test'$/],
    ] as [string, RegExp][]
  ) {
    assert.throws(() => connectAuthority(target), (error: unknown) => {
      assert.ok(error instanceof EgressFailed, String(error));
      assert.match(error.message, message);
      return true;
    });
  }
  assert.equal(formatAuthority({ host: "fd00::1", port: 443 }), "[fd00::1]:443");
  assert.equal(formatAuthority({ host: "fd00::1", port: 443 }, "https"), "[fd00::1]");
  assert.equal(formatAuthority({ host: "a.test", port: 80 }, "https"), "a.test:80");
  assert.equal(formatAuthority({ host: "a.test", port: 80 }, "http"), "a.test");
});

Deno.test("bodyFraming() reads one unambiguous framing and refuses every ambiguous one", () => {
  const framing = (...headers: string[]) =>
    bodyFraming(parseHead(head(["POST / HTTP/1.1", "Host: a", ...headers])));
  assert.deepEqual(framing(), { kind: "length", length: 0 });
  assert.deepEqual(framing("Content-Length: 12"), { kind: "length", length: 12 });
  assert.deepEqual(framing("Transfer-Encoding: gzip, Chunked"), { kind: "chunked" });
  assert.deepEqual(framing("Connection: keep-alive, x-other"), { kind: "length", length: 0 });
  const refused: [string[], RegExp][] = [
    [
      ["Transfer-Encoding: chunked", "Content-Length: 3"],
      /both Transfer-Encoding and Content-Length/,
    ],
    [["Content-Length: 3", "Content-Length: 3"], /2 Content-Length headers/],
    [["Content-Length: 3,3"], /not a decimal length/],
    [["Content-Length: -1"], /not a decimal length/],
    [["Transfer-Encoding: chunked, gzip"], /'chunked' must be last, once/],
    [["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], /'chunked' must be last, once/],
    [["Transfer-Encoding: identity"], /'chunked' must be last/],
    [["Connection: Content-Length"], /it names 'content-length'/],
    [["Connection: close, transfer-encoding"], /it names 'transfer-encoding'/],
    [["Connection: HOST"], /it names 'host'/],
  ];
  for (const [headers, reason] of refused) {
    assert.throws(() => framing(...headers), reason, headers.join(" / "));
  }
});

Deno.test("bodyTracker() finds the end of a length or chunked body, whatever the chunks it comes in", () => {
  const length = bodyTracker({ kind: "length", length: 5 });
  assert.equal(length.take(Buffer.from("hel")), 3);
  assert.equal(length.ended(), false);
  assert.equal(length.take(Buffer.from("loGET /")), 2);
  assert.equal(length.ended(), true);
  assert.equal(bodyTracker({ kind: "length", length: 0 }).ended(), true);

  const body = '5;ext="x"\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n';
  const after = "GET /second HTTP/1.1\r\n\r\n";
  for (let split = 0; split <= body.length; split++) {
    const chunked = bodyTracker({ kind: "chunked" });
    const bytes = Buffer.from(body + after, "latin1");
    const first = chunked.take(bytes.subarray(0, split));
    assert.equal(first, split);
    assert.equal(chunked.ended(), split === body.length, `ended after ${split} bytes`);
    const second = chunked.take(bytes.subarray(split));
    assert.equal(first + second, body.length, `split at ${split}`);
    assert.equal(chunked.ended(), true);
  }
  for (const bad of ["zz\r\n", "5\r\nhelloX\r\n", "5\nhello"]) {
    assert.throws(() => bodyTracker({ kind: "chunked" }).take(Buffer.from(bad)), /Malformed/, bad);
  }
});
