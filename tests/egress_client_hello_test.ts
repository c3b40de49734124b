/**
 * parseClientHello() (lib/egress/client_hello.ts) on real ClientHellos,
 * captured from Deno's TLS client and from curl, and on hand-built,
 * truncated, garbage and non-TLS bytes.
 *
 * @module
 */
import assert from "node:assert/strict";
import { MAX_HELLO_BYTES, parseClientHello } from "../lib/egress/client_hello.ts";

const CURL = "/usr/bin/curl";
const CAPTURE_TIMEOUT_MS = 10_000;

// Listens on a loopback port, lets `client` connect to it, and returns the
// first TLS record it sent (then closes, which fails the client's handshake).
async function captureHello(client: (port: number) => Promise<unknown>): Promise<Uint8Array> {
  using listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr;
  const clientDone = client(port).catch(() => {});
  const conn = await listener.accept();
  const timer = setTimeout(() => conn.close(), CAPTURE_TIMEOUT_MS);
  let bytes: Uint8Array = new Uint8Array(0);
  try {
    const buffer = new Uint8Array(4096);
    while (bytes.length < 5 || bytes.length < 5 + ((bytes[3]! << 8) | bytes[4]!)) {
      const n = await conn.read(buffer);
      if (n === null) break;
      bytes = concat(bytes, buffer.subarray(0, n));
    }
  } finally {
    clearTimeout(timer);
    conn.close();
  }
  await clientDone;
  return bytes.subarray(0, 5 + ((bytes[3]! << 8) | bytes[4]!));
}

// A Deno TLS client naming `hostname` (sent as SNI unless it is an address).
function denoClient(hostname: string): (port: number) => Promise<unknown> {
  return async (port) => {
    const tcp = await Deno.connect({ hostname: "127.0.0.1", port });
    const tls = await Deno.startTls(tcp, { hostname });
    try {
      await tls.handshake();
    } finally {
      tls.close();
    }
  };
}

function curlClient(name: string): (port: number) => Promise<unknown> {
  return (port) =>
    new Deno.Command(CURL, {
      args: [
        "-sS",
        "--max-time",
        "10",
        "--connect-to",
        `${name}:443:127.0.0.1:${port}`,
        `https://${name}/`,
      ],
      stdout: "null",
      stderr: "null",
      signal: AbortSignal.timeout(CAPTURE_TIMEOUT_MS + 5000),
    }).output();
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

function u16(n: number): number[] {
  return [(n >> 8) & 0xff, n & 0xff];
}

function u24(n: number): number[] {
  return [(n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff];
}

// An extension: type, length, data.
function extension(type: number, data: number[]): number[] {
  return [...u16(type), ...u16(data.length), ...data];
}

// A server_name extension listing `names` (type 0 = host_name).
function serverNameExtension(names: { type?: number; name: string }[]): number[] {
  const list = names.flatMap(({ type, name }) => {
    const bytes = [...new TextEncoder().encode(name)];
    return [type ?? 0, ...u16(bytes.length), ...bytes];
  });
  return extension(0, [...u16(list.length), ...list]);
}

// A ClientHello record with these extensions (undefined: no extensions block at all).
function helloRecord(extensions: number[][] | undefined): Uint8Array {
  const body = [
    0x03,
    0x03, // legacy version
    ...new Array(32).fill(7), // random
    0, // session id
    ...u16(2),
    0x13,
    0x01, // one cipher suite
    1,
    0, // null compression
  ];
  if (extensions !== undefined) {
    const all = extensions.flat();
    body.push(...u16(all.length), ...all);
  }
  const handshake = [1, ...u24(body.length), ...body];
  return new Uint8Array([22, 3, 1, ...u16(handshake.length), ...handshake]);
}

Deno.test("parseClientHello() reads the SNI of Deno's TLS client", async () => {
  const bytes = await captureHello(denoClient("api.test"));
  assert.deepEqual(parseClientHello(bytes), { kind: "hello", sni: "api.test" });
});

Deno.test("parseClientHello() reads the SNI of curl (OpenSSL)", async () => {
  const bytes = await captureHello(curlClient("git.example.test"));
  assert.deepEqual(parseClientHello(bytes), { kind: "hello", sni: "git.example.test" });
});

Deno.test("parseClientHello() finds no SNI in a hello for an IP address", async () => {
  const bytes = await captureHello(denoClient("127.0.0.1"));
  assert.deepEqual(parseClientHello(bytes), { kind: "hello", sni: undefined });
});

Deno.test("parseClientHello() wants more bytes for every prefix of a real hello", async () => {
  const bytes = await captureHello(denoClient("api.test"));
  for (const length of [0, 1, 4, 5, 6, 50, bytes.length - 1]) {
    assert.deepEqual(
      parseClientHello(bytes.subarray(0, length)),
      { kind: "incomplete" },
      `${length}`,
    );
  }
  // Bytes after the record (the client's next one) do not change the verdict.
  const more = concat(bytes, new Uint8Array([23, 3, 3, 0, 1, 0]));
  assert.deepEqual(parseClientHello(more), { kind: "hello", sni: "api.test" });
});

Deno.test("parseClientHello() refuses what is not TLS", () => {
  const text = (s: string): Uint8Array => new TextEncoder().encode(s);
  for (
    const input of [
      "CONNECT evil.test:443 HTTP/1.1\r\n\r\n",
      "GET / HTTP/1.1\r\n\r\n",
      "SSH-2.0-OpenSSH\r\n",
    ]
  ) {
    assert.deepEqual(parseClientHello(text(input)), {
      kind: "not-tls",
      detail: "the tunnel does not start with TLS",
    });
  }
  // An application-data record first, and a record longer than TLS allows.
  assert.equal(parseClientHello(new Uint8Array([23, 3, 3, 0, 5, 1, 2, 3, 4, 5])).kind, "not-tls");
  assert.deepEqual(parseClientHello(new Uint8Array([22, 3, 1, 0x40, 0x01])), {
    kind: "not-tls",
    detail: "the first TLS record is too long",
  });
  // A handshake record that is not a ClientHello (a ServerHello, type 2).
  assert.deepEqual(parseClientHello(new Uint8Array([22, 3, 3, 0, 4, 2, 0, 0, 0])), {
    kind: "not-tls",
    detail: "the first TLS message is no ClientHello",
  });
  assert.ok(MAX_HELLO_BYTES >= 16384 + 5);
});

Deno.test("parseClientHello() refuses a malformed ClientHello", () => {
  const malformed = { kind: "not-tls", detail: "the ClientHello is malformed" };
  // Garbage after the handshake type.
  const garbage = new Uint8Array([22, 3, 1, 0, 6, 1, 0xff, 0xff, 0xff, 9, 9]);
  assert.deepEqual(parseClientHello(garbage), malformed);
  // Two server_name extensions, two host names, a name with bad characters, a non-ASCII name.
  for (
    const extensions of [
      [serverNameExtension([{ name: "a.test" }]), serverNameExtension([{ name: "b.test" }])],
      [serverNameExtension([{ name: "a.test" }, { name: "b.test" }])],
      [serverNameExtension([{ name: "a.test\0b.test" }])],
      [serverNameExtension([{ name: "évil.test" }])],
      [serverNameExtension([{ name: "api.test:443" }])],
    ]
  ) {
    assert.deepEqual(parseClientHello(helloRecord(extensions)), malformed);
  }
  // An extension longer than the block that holds it.
  const named = serverNameExtension([{ name: "a.test" }]);
  const record = helloRecord([named]);
  const lying = record.slice();
  lying[record.length - named.length + 2] = 0xff; // the server_name extension's length, high byte
  assert.deepEqual(parseClientHello(lying), malformed);
  // A handshake message longer than its record (split over records).
  const split = record.slice();
  split[6] = 0x01;
  assert.deepEqual(parseClientHello(split), malformed);
});

Deno.test("parseClientHello() reads hand-built hellos: lower-cased name, other types, no extensions", () => {
  assert.deepEqual(
    parseClientHello(
      helloRecord([
        extension(0x0010, [0, 3, 2, 0x68, 0x32]),
        serverNameExtension([{ name: "API.Test" }]),
      ]),
    ),
    { kind: "hello", sni: "api.test" },
  );
  // A name entry of another type is skipped.
  assert.deepEqual(
    parseClientHello(
      helloRecord([serverNameExtension([{ type: 1, name: "x" }, { name: "b.test" }])]),
    ),
    { kind: "hello", sni: "b.test" },
  );
  assert.deepEqual(parseClientHello(helloRecord([])), { kind: "hello", sni: undefined });
  assert.deepEqual(parseClientHello(helloRecord(undefined)), { kind: "hello", sni: undefined });
});
