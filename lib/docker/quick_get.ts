/**
 * Requests to the Docker daemon's unix socket without docker-modem: loading
 * it costs tens of milliseconds per process and `fetch`'s first request
 * about 20, this about 4. HTTP/1.0, so the daemon sends the body unchunked
 * and closes the connection after it; the reply is read to its end within a
 * size cap and a deadline. {@linkcode quickRequest} says what became of a
 * request (so a caller knows whether it may be sent again another way);
 * {@linkcode quickGet} is `undefined` on anything unexpected.
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
 * What became of one request: `reply` (the status and JSON body), or why
 * there is none: `unsent` (nothing reached the daemon: no connection, or
 * the deadline passed while connecting), `unreadable` (a reply over the
 * size cap, not HTTP, or a body that is not JSON), `lost` (the connection
 * failed after the request was sent) or `late` (the deadline passed after
 * it was sent).
 */
export type QuickOutcome =
  | { kind: "reply"; reply: QuickReply }
  | { kind: "unsent" | "unreadable" | "lost" | "late" };

/** A request for {@linkcode quickRequest}. */
export interface QuickRequest {
  /** The method. */
  method: "GET" | "POST" | "DELETE";
  /** The API path with its query, such as `/containers/abc/start`. */
  path: string;
  /** A JSON body (POST). */
  body?: string;
}

/**
 * One request to the Docker daemon's unix socket, over HTTP/1.0 (the
 * daemon answers unchunked and closes the connection), read to its end
 * within a size cap and a deadline.
 *
 * @param endpoint The daemon (only `unix` endpoints are asked).
 * @param request Method, path and body.
 * @param options Size cap and deadline.
 * @returns The reply, or why there is none (see {@linkcode QuickOutcome}).
 */
export async function quickRequest(
  endpoint: DockerEndpoint,
  request: QuickRequest,
  options: QuickGetOptions = {},
): Promise<QuickOutcome> {
  if (endpoint.kind !== "unix") return { kind: "unsent" };
  const maxBytes = options.maxBytes ?? 256 * 1024;
  let conn: Deno.UnixConn | undefined;
  let late = false;
  let sent = false;
  const timer = setTimeout(() => {
    late = true;
    conn?.close();
  }, options.timeoutMs ?? 2000);
  try {
    conn = await Deno.connect({ transport: "unix", path: endpoint.socketPath });
    // The deadline passed while connecting: it closed nothing, so stop here.
    if (late) return { kind: "unsent" };
    const body = new TextEncoder().encode(request.body ?? "");
    const head = `${request.method} ${request.path} HTTP/1.0\r\nHost: docker\r\n` +
      (request.body === undefined
        ? "\r\n"
        : `Content-Type: application/json\r\nContent-Length: ${body.byteLength}\r\n\r\n`);
    sent = true;
    await writeAll(conn, concat([new TextEncoder().encode(head), body]));
    const parts: Uint8Array[] = [];
    let size = 0;
    for (const buffer = new Uint8Array(64 * 1024);;) {
      const n = await conn.read(buffer);
      if (n === null) break;
      size += n;
      if (size > maxBytes) return { kind: "unreadable" };
      parts.push(buffer.slice(0, n));
    }
    return parseReply(new TextDecoder().decode(concat(parts)));
  } catch {
    return { kind: late ? (sent ? "late" : "unsent") : sent ? "lost" : "unsent" };
  } finally {
    clearTimeout(timer);
    try {
      conn?.close();
    } catch {
      // closed by the deadline
    }
  }
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
  const outcome = await quickRequest(endpoint, { method: "GET", path }, options);
  return outcome.kind === "reply" ? outcome.reply : undefined;
}

// The status line and the JSON body of a whole HTTP/1.0 reply.
function parseReply(text: string): QuickOutcome {
  const status = /^HTTP\/1\.[01] (\d{3}) /.exec(text);
  const split = text.indexOf("\r\n\r\n");
  if (status === null || split < 0) return { kind: "unreadable" };
  const body = text.slice(split + 4);
  try {
    return {
      kind: "reply",
      reply: { status: Number(status[1]), body: body === "" ? null : JSON.parse(body) },
    };
  } catch {
    return { kind: "unreadable" };
  }
}

async function writeAll(conn: Deno.UnixConn, bytes: Uint8Array): Promise<void> {
  for (let at = 0; at < bytes.byteLength;) at += await conn.write(bytes.subarray(at));
}
