/**
 * HTTP/1.1 request heads as the egress proxy reads them: from a socket with
 * a size cap and a deadline, parsed strictly (one request line, token
 * header names, no obsolete line folding), and written back.
 *
 * @module
 */
import type { Socket } from "node:net";
import { Buffer } from "node:buffer";

/** The largest request head the proxy reads. */
export const MAX_HEAD_BYTES = 32 * 1024;

/** A parsed request head. */
export interface RequestHead {
  /** The method, e.g. `CONNECT` or `GET`. */
  method: string;
  /** The request target as sent: `host:port` for CONNECT, an absolute URL or a path otherwise. */
  target: string;
  /** `HTTP/1.1` or `HTTP/1.0`. */
  version: string;
  /** Header lines in order, names as sent. */
  headers: [string, string][];
}

const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * Collects bytes from a socket until `enough` says how many of them it
 * takes, then pauses the socket and returns them with what came after.
 *
 * @param socket The socket (flowing or paused).
 * @param options `enough(buffer)` returns the length taken, `undefined` for more, or throws;
 *   `maxBytes` and `timeoutMs` bound the wait.
 * @returns The bytes taken and the rest already read.
 * @throws {Error} On close, timeout or too many bytes.
 */
export function collect(
  socket: Socket,
  options: { enough: (bytes: Buffer) => number | undefined; maxBytes: number; timeoutMs: number },
): Promise<{ taken: Buffer; rest: Buffer }> {
  return new Promise((resolve, reject) => {
    let buffer = Buffer.alloc(0);
    const done = (error?: Error, length?: number): void => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("end", onEnd);
      socket.off("error", onEnd);
      socket.pause();
      if (error !== undefined) reject(error);
      else resolve({ taken: buffer.subarray(0, length), rest: buffer.subarray(length) });
    };
    const onData = (chunk: Buffer): void => {
      buffer = Buffer.concat([buffer, chunk]);
      let length: number | undefined;
      try {
        length = options.enough(buffer);
      } catch (error) {
        return done(error as Error);
      }
      if (length !== undefined) return done(undefined, length);
      if (buffer.length > options.maxBytes) done(new Error(`More than ${options.maxBytes} bytes`));
    };
    const onEnd = (): void => done(new Error("The client closed the connection"));
    const timer = setTimeout(
      () => done(new Error(`Nothing complete within ${options.timeoutMs} ms`)),
      options.timeoutMs,
    );
    socket.on("data", onData);
    socket.once("end", onEnd);
    socket.once("error", onEnd);
    socket.resume();
  });
}

/**
 * Reads one request head (up to and with the blank line).
 *
 * @param socket The client's socket.
 * @param options `timeoutMs`: how long the client has to send it.
 * @returns The head and the bytes after it (the start of a body, or of TLS).
 * @throws {Error} When it is malformed, too large, late or the client left.
 */
export async function readHead(
  socket: Socket,
  options: { timeoutMs: number },
): Promise<{ head: RequestHead; rest: Buffer }> {
  const { taken, rest } = await collect(socket, {
    enough: (bytes) => {
      const end = bytes.indexOf("\r\n\r\n");
      return end < 0 ? undefined : end + 4;
    },
    maxBytes: MAX_HEAD_BYTES,
    timeoutMs: options.timeoutMs,
  });
  return { head: parseHead(taken.toString("latin1")), rest };
}

/**
 * Parses a request head strictly.
 *
 * @param text The head, `\r\n`-separated, ending in a blank line.
 * @returns The head.
 * @throws {Error} Naming what is malformed.
 */
export function parseHead(text: string): RequestHead {
  const lines = text.replace(/\r\n\r\n$/, "").split("\r\n");
  const requestLine = lines.shift() ?? "";
  const match = /^([A-Z]{1,16}) (\S{1,8192}) (HTTP\/1\.[01])$/.exec(requestLine);
  if (match === null) throw new Error(`Malformed request line '${requestLine.slice(0, 200)}'`);
  const headers: [string, string][] = [];
  for (const line of lines) {
    const colon = line.indexOf(":");
    const name = line.slice(0, colon);
    if (colon <= 0 || !TOKEN.test(name) || /[\0\r\n]/.test(line)) {
      throw new Error(`Malformed header line '${line.slice(0, 200)}'`);
    }
    headers.push([name, line.slice(colon + 1).trim()]);
  }
  return { method: match[1]!, target: match[2]!, version: match[3]!, headers };
}

/**
 * The values of one header, by case-insensitive name.
 *
 * @param head The head.
 * @param name The header.
 * @returns Its values in order.
 */
export function headerValues(head: RequestHead, name: string): string[] {
  const lower = name.toLowerCase();
  return head.headers.filter(([n]) => n.toLowerCase() === lower).map(([, v]) => v);
}

/**
 * Writes a head back as bytes.
 *
 * @param head The head.
 * @returns `request line CRLF (header CRLF)* CRLF`.
 */
export function serializeHead(head: RequestHead): Buffer {
  const lines = [`${head.method} ${head.target} ${head.version}`];
  for (const [name, value] of head.headers) lines.push(`${name}: ${value}`);
  return Buffer.from(`${lines.join("\r\n")}\r\n\r\n`, "latin1");
}

/**
 * A head to send upstream: hop-by-hop and proxy headers removed, and
 * `Connection: close`, so every request is checked on a connection of its own.
 *
 * @param head The client's head.
 * @param target The request target to send (origin form).
 * @returns The new head.
 */
export function upstreamHead(head: RequestHead, target: string): RequestHead {
  const hop = new Set([
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "upgrade",
  ]);
  // Names listed in Connection are hop-by-hop as well.
  for (const value of headerValues(head, "connection")) {
    for (const name of value.split(",")) hop.add(name.trim().toLowerCase());
  }
  // Every Proxy-* header is addressed to a proxy, never the origin; and a
  // bare `Proxy` becomes a CGI origin's HTTP_PROXY ("httpoxy").
  const dropped = (name: string): boolean =>
    hop.has(name) || name === "proxy" || name.startsWith("proxy-");
  return {
    ...head,
    target,
    headers: [
      ...head.headers.filter(([name]) => !dropped(name.toLowerCase())),
      ["Connection", "close"],
    ],
  };
}
