/**
 * The first TLS record of a tunnel: whether it is a ClientHello and the
 * server name (SNI) it asks for, so the proxy can hold a CONNECT to its
 * host before anything reaches the upstream.
 *
 * @module
 */

/** The largest first record the proxy waits for (a TLS record's own limit plus its header). */
export const MAX_HELLO_BYTES = 16384 + 5;

/** What a tunnel's first bytes say. */
export type HelloVerdict =
  | { kind: "hello"; sni: string | undefined }
  | { kind: "incomplete" }
  | { kind: "not-tls"; detail: string };

/**
 * Reads a ClientHello from the first bytes of a tunnel.
 *
 * @example
 * ```ts ignore
 * parseClientHello(bytes); // { kind: "hello", sni: "api.github.com" }
 * ```
 *
 * @param bytes What the client sent so far.
 * @returns The server name, `incomplete` when more bytes are needed, or why it is no ClientHello.
 */
export function parseClientHello(bytes: Uint8Array): HelloVerdict {
  if (bytes.length < 5) return { kind: "incomplete" };
  if (bytes[0] !== 22) return { kind: "not-tls", detail: "the tunnel does not start with TLS" };
  const recordLength = (bytes[3]! << 8) | bytes[4]!;
  if (recordLength > 16384) return { kind: "not-tls", detail: "the first TLS record is too long" };
  if (bytes.length < 5 + recordLength) return { kind: "incomplete" };
  const body = bytes.subarray(5, 5 + recordLength);
  if (body[0] !== 1) return { kind: "not-tls", detail: "the first TLS message is no ClientHello" };
  try {
    return { kind: "hello", sni: serverName(body) };
  } catch {
    return { kind: "not-tls", detail: "the ClientHello is malformed" };
  }
}

// Walks the ClientHello to its server_name extension. A handshake message
// split over several records is refused by the bounds checks (clients send
// a ClientHello in one record).
function serverName(body: Uint8Array): string | undefined {
  const reader = new Reader(body);
  reader.skip(1); // handshake type
  const length = reader.u24();
  const end = Math.min(body.length, 4 + length);
  if (4 + length > body.length) throw new Error("split hello");
  reader.skip(2 + 32); // version, random
  reader.skip(reader.u8()); // session id
  reader.skip(reader.u16()); // cipher suites
  reader.skip(reader.u8()); // compression methods
  if (reader.offset >= end) return undefined;
  const extensionsEnd = reader.offset + 2 + reader.u16();
  if (extensionsEnd > end) throw new Error("bad extensions");
  let name: string | undefined;
  while (reader.offset < extensionsEnd) {
    const type = reader.u16();
    const size = reader.u16();
    const next = reader.offset + size;
    if (next > extensionsEnd) throw new Error("bad extension");
    if (type === 0) {
      if (name !== undefined) throw new Error("two server_name extensions");
      name = hostName(body.subarray(reader.offset, next));
    }
    reader.offset = next;
  }
  return name;
}

function hostName(extension: Uint8Array): string | undefined {
  const reader = new Reader(extension);
  const listEnd = 2 + reader.u16();
  let name: string | undefined;
  while (reader.offset < listEnd) {
    const type = reader.u8();
    const size = reader.u16();
    const bytes = reader.take(size);
    if (type !== 0) continue;
    if (name !== undefined) throw new Error("two host names");
    name = new TextDecoder("ascii", { fatal: true }).decode(bytes);
  }
  if (name !== undefined && !/^[A-Za-z0-9.-]{1,253}$/.test(name)) throw new Error("bad name");
  return name?.toLowerCase();
}

class Reader {
  offset = 0;
  constructor(readonly bytes: Uint8Array) {}
  #need(n: number): void {
    if (this.offset + n > this.bytes.length) throw new Error("truncated");
  }
  u8(): number {
    this.#need(1);
    return this.bytes[this.offset++]!;
  }
  u16(): number {
    return (this.u8() << 8) | this.u8();
  }
  u24(): number {
    return (this.u8() << 16) | this.u16();
  }
  skip(n: number): void {
    this.#need(n);
    this.offset += n;
  }
  take(n: number): Uint8Array {
    this.#need(n);
    this.offset += n;
    return this.bytes.subarray(this.offset - n, this.offset);
  }
}
