/**
 * One GET to the Docker daemon's unix socket, for the hot path of a warm
 * `exec`: loading docker-modem costs tens of milliseconds per process and
 * `fetch`'s first request about 20, this about 4. HTTP/1.0, so the daemon
 * sends the body unchunked and closes the connection after it; the reply is
 * read to its end within a size cap and a deadline. Anything unexpected is
 * `undefined`: callers then take the full path through the Docker client,
 * which reports errors properly.
 *
 * @module
 */
import { concat } from "../bytes.ts";
import type { DockerEndpoint } from "./endpoint.ts";

/** A reply's status and JSON body. */
export interface QuickReply {
  /** The HTTP status. */
  status: number;
  /** The parsed body (unknown: validate it). */
  body: unknown;
}

/** Options for {@linkcode quickGet}. */
export interface QuickGetOptions {
  /** Largest reply read (default 256 KiB). */
  maxBytes?: number;
  /** Deadline for the whole exchange (default 2 s). */
  timeoutMs?: number;
}

/**
 * GETs an API path over a unix-socket endpoint.
 *
 * @param endpoint The daemon (only `unix` endpoints are asked).
 * @param path The API path, such as `/images/waffle-runner:latest/json`.
 * @param options Size cap and deadline.
 * @returns The status and body, or undefined on any failure.
 */
export async function quickGet(
  endpoint: DockerEndpoint,
  path: string,
  options: QuickGetOptions = {},
): Promise<QuickReply | undefined> {
  if (endpoint.kind !== "unix") return undefined;
  const maxBytes = options.maxBytes ?? 256 * 1024;
  let conn: Deno.UnixConn | undefined;
  let late = false;
  const timer = setTimeout(() => {
    late = true;
    conn?.close();
  }, options.timeoutMs ?? 2000);
  try {
    conn = await Deno.connect({ transport: "unix", path: endpoint.socketPath });
    // The deadline passed while connecting: it closed nothing, so stop here.
    if (late) return undefined;
    await conn.write(new TextEncoder().encode(`GET ${path} HTTP/1.0\r\nHost: docker\r\n\r\n`));
    const parts: Uint8Array[] = [];
    let size = 0;
    for (const buffer = new Uint8Array(64 * 1024);;) {
      const n = await conn.read(buffer);
      if (n === null) break;
      size += n;
      if (size > maxBytes) return undefined;
      parts.push(buffer.slice(0, n));
    }
    const text = new TextDecoder().decode(concat(parts));
    const status = /^HTTP\/1\.[01] (\d{3}) /.exec(text);
    const split = text.indexOf("\r\n\r\n");
    if (status === null || split < 0) return undefined;
    const body = text.slice(split + 4);
    return { status: Number(status[1]), body: body === "" ? null : JSON.parse(body) };
  } catch {
    return undefined;
  } finally {
    clearTimeout(timer);
    try {
      conn?.close();
    } catch {
      // closed by the deadline
    }
  }
}
