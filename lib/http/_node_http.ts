/**
 * The HTTP/1.1 side of {@linkcode serveHttp}: `node:http`'s server, fed
 * the connections the accept loop admits, with its deadlines for headers,
 * whole requests and kept-alive connections, and each request handed to a
 * web handler (`Request` in, `Response` out) as `Deno.serve` would.
 *
 * `node:http` because it is the HTTP server Deno ships that takes
 * connections from outside (`Deno.serve` owns its accept loop, and dies
 * with it; `Deno.serveHttp` is gone) and has those deadlines. Its own
 * listener is not used: in Deno 2.9 it stops accepting for good after a
 * failed accept (EMFILE).
 *
 * Loaded only by {@linkcode serveHttp}: Node's modules cost every process
 * that imports them.
 *
 * @module
 */
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import tls from "node:tls";
import { oneLineOf } from "../errors.ts";
import { ConnSocket } from "./_conn_socket.ts";
import type { HttpLimits } from "./limits.ts";
import type { HttpHandler } from "./server.ts";

/** The certificate and key a TLS listener serves, made once (`node:tls`). */
export type SecureContext = tls.SecureContext;

/**
 * The TLS context of a certificate (chain) and key, PEM.
 *
 * @param pem The certificate and key.
 * @returns The context.
 * @throws {Error} When either is not valid PEM, or they do not match.
 */
export function secureContext(pem: { cert: string; key: string }): SecureContext {
  return tls.createSecureContext({ cert: pem.cert, key: pem.key });
}

/** The TCP socket under a TLS one that {@linkcode serveConnection} made. */
const connSockets = new WeakMap<Duplex, ConnSocket>();

/** The {@linkcode ConnSocket} a server socket is, or runs over (TLS); undefined for any other. */
function connSocketOf(socket: Duplex): ConnSocket | undefined {
  return socket instanceof ConnSocket ? socket : connSockets.get(socket);
}

/** Options of {@linkcode nodeHttpServer}. */
export interface NodeHttpOptions {
  /** The deadlines and the header size. */
  limits: HttpLimits;
  /** `http://HOST:PORT`: the origin of an origin-form request's URL. */
  origin: string;
  /** The response when the handler throws. */
  onError: (error: unknown) => Response;
}

/** The checks of the header and request deadlines run this often at most. */
const MAX_CHECK_INTERVAL_MS = 1000;

/**
 * A `node:http` server that serves each request with `handler`; connections
 * are given to it with {@linkcode serveConnection}.
 *
 * @param handler Answers each request.
 * @param options Limits, the origin of request URLs, and the response to a handler's error.
 * @returns The server (not listening anywhere itself).
 */
export function nodeHttpServer(handler: HttpHandler, options: NodeHttpOptions): http.Server {
  const { limits } = options;
  const server = http.createServer({
    headersTimeout: limits.headerTimeoutMs,
    requestTimeout: limits.requestTimeoutMs,
    keepAliveTimeout: limits.keepAliveTimeoutMs,
    maxHeaderSize: limits.maxHeaderBytes,
    // The deadlines are checked this often: a quarter of the shorter one.
    connectionsCheckingInterval: Math.max(
      10,
      Math.min(MAX_CHECK_INTERVAL_MS, Math.floor(limits.headerTimeoutMs / 4)),
    ),
  }, (req, res) => void respond(req, res, handler, options).catch(() => failed(res)));
  server.on("clientError", answerClientError);
  // `listening` keeps a connection open after its response and starts the
  // deadlines' checks; net.Server reads it from `_handle`. The connections
  // come from waffle's accept loop, so a stand-in handle says the server
  // listens (Deno's node:http does the same for its own address override).
  Object.assign(server, { _handle: { close(): void {}, ref(): void {}, unref(): void {} } });
  server.emit("listening");
  return server;
}

/**
 * Gives an admitted connection to the server; with `tls`, TLS runs over it
 * first (its handshake inside the header deadline: the server's deadlines
 * start with the connection).
 *
 * @param server From {@linkcode nodeHttpServer}.
 * @param conn The connection.
 * @param options The limits, the TLS context (absent: plain HTTP), and what
 *   to call once the connection is closed.
 */
export function serveConnection(
  server: http.Server,
  conn: Deno.Conn,
  options: { limits: HttpLimits; tls?: SecureContext | undefined; onClosed: () => void },
): void {
  const socket = new ConnSocket(conn, {
    idleMs: options.limits.keepAliveTimeoutMs,
    writeStallMs: options.limits.writeStallTimeoutMs,
    onClosed: options.onClosed,
  });
  if (options.tls === undefined) return void server.emit("connection", socket);
  const secure = new tls.TLSSocket(socket, {
    isServer: true,
    secureContext: options.tls,
    ALPNProtocols: ["http/1.1"],
  });
  connSockets.set(secure, socket);
  // Either side closed closes both: the file descriptor is the TCP socket's.
  secure.once("close", () => socket.destroy());
  socket.once("close", () => secure.destroy());
  socket.on("error", () => {});
  server.emit("connection", secure);
}

/** The answers to a request the server could not take, as Node gives them by default. */
const CLIENT_ERRORS: Record<string, string> = {
  HPE_HEADER_OVERFLOW: "431 Request Header Fields Too Large",
  ERR_HTTP_REQUEST_TIMEOUT: "408 Request Timeout",
};

/**
 * A malformed or too slow request: its answer, then the connection closes.
 * A slow one (408) closes at once; another (a 431 to headers too large)
 * after the client stops sending, so that it reads the answer rather than
 * a reset.
 */
function answerClientError(error: Error & { code?: string }, socket: Duplex): void {
  const response = (socket as { _httpMessage?: ServerResponse | null })._httpMessage;
  if (socket.writable && !response?.headersSent) {
    const status = CLIENT_ERRORS[error.code ?? ""] ?? "400 Bad Request";
    socket.write(`HTTP/1.1 ${status}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
  }
  const raw = connSocketOf(socket);
  if (error.code !== "ERR_HTTP_REQUEST_TIMEOUT" && raw !== undefined && raw === socket) {
    raw.destroySoon();
  } else {
    socket.destroy();
  }
}

async function respond(
  req: IncomingMessage,
  res: ServerResponse,
  handler: HttpHandler,
  options: NodeHttpOptions,
): Promise<void> {
  // A client gone mid-request or mid-response ends its streams ('close');
  // it is no error of the server's.
  req.on("error", () => {});
  res.on("error", () => {});
  const aborted = new AbortController();
  const socket = req.socket;
  const raw = connSocketOf(socket);
  raw?.requestStarted();
  res.once("close", () => {
    aborted.abort();
    raw?.requestEnded();
  });
  let response: Response;
  const request = toRequest(req, options.origin, aborted.signal);
  if (!(request instanceof Request)) {
    response = new Response(`Bad Request: ${request.reason}\n`, { status: 400 });
  } else {
    const remoteAddr: Deno.NetAddr = {
      transport: "tcp",
      hostname: raw?.remoteAddress ?? socket.remoteAddress ?? "",
      port: raw?.remotePort ?? socket.remotePort ?? 0,
    };
    try {
      response = await handler(request, { remoteAddr });
    } catch (error) {
      response = options.onError(error);
    }
  }
  await send(req, res, response);
}

/**
 * The web request of a Node one, or why there is none: a target that is
 * neither a path nor an http(s) URL, a method a `Request` cannot have
 * (`TRACE`), a header value it refuses.
 */
function toRequest(
  req: IncomingMessage,
  origin: string,
  signal: AbortSignal,
): Request | { reason: string } {
  const target = req.url ?? "";
  const method = req.method ?? "GET";
  try {
    const url = new URL(target.startsWith("/") ? `${origin}${target}` : target);
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new TypeError("Not http");
    const headers = new Headers();
    for (let i = 0; i + 1 < req.rawHeaders.length; i += 2) {
      headers.append(req.rawHeaders[i]!, req.rawHeaders[i + 1]!);
    }
    // An absolute-form target names the authority; its Host header is
    // ignored (RFC 9112 section 3.2.2), so the checks of Host see the target's.
    if (!target.startsWith("/")) headers.set("host", url.host);
    const body = method === "GET" || method === "HEAD" ? null : bodyOf(req);
    return new Request(url, { method, headers, body, signal });
  } catch (error) {
    const shown = `${method} ${target}`.slice(0, 200);
    return { reason: `cannot serve '${shown}': ${oneLineOf(error)}` };
  }
}

/** The response could not be sent (a header value Node refuses): a bare 500, or the end. */
function failed(res: ServerResponse): void {
  if (res.headersSent) return void res.destroy();
  try {
    for (const name of res.getHeaderNames()) res.removeHeader(name);
    res.writeHead(500, { "content-type": "text/plain", connection: "close" });
    res.end("Internal Server Error: the response could not be sent\n");
  } catch {
    res.destroy();
  }
}

/**
 * A request's body as a web stream, read as it is pulled. Cancelling it
 * drops the rest: `node:http` reads it through to reuse the connection
 * (within the keep-alive deadline, counted from the response's end).
 */
function bodyOf(req: IncomingMessage): ReadableStream<Uint8Array> {
  let settled = false;
  return new ReadableStream<Uint8Array>({
    start(controller): void {
      req.pause();
      req.on("data", (chunk: Uint8Array) => {
        if (settled) return;
        controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength));
        if ((controller.desiredSize ?? 0) <= 0) req.pause();
      });
      req.once("end", () => {
        if (settled) return;
        settled = true;
        controller.close();
      });
      req.once("close", () => {
        if (settled) return;
        settled = true;
        controller.error(new Error("The client closed the connection before its request ended"));
      });
    },
    pull(): void {
      req.resume();
    },
    cancel(): void {
      settled = true;
      req.resume();
    },
  }, { highWaterMark: 64 * 1024, size: (chunk) => chunk.byteLength });
}

/** Writes `response` to `res`, its body as it comes (a stream stays open while it does). */
async function send(req: IncomingMessage, res: ServerResponse, response: Response): Promise<void> {
  if (res.destroyed) {
    await response.body?.cancel().catch(() => {});
    return;
  }
  res.statusCode = response.status;
  if (response.statusText !== "") res.statusMessage = response.statusText;
  const headers = new Map<string, string[]>();
  for (const [name, value] of response.headers) {
    headers.set(name, [...headers.get(name) ?? [], value]);
  }
  for (const [name, values] of headers) {
    res.setHeader(name, values.length === 1 ? values[0]! : values);
  }
  if (response.body === null || req.method === "HEAD") {
    await response.body?.cancel().catch(() => {});
    res.end();
    return;
  }
  // The headers go at once: a stream's first event may be a long way off.
  res.flushHeaders();
  const reader = response.body.getReader();
  const cancel = (): void => void reader.cancel().catch(() => {});
  res.once("close", cancel);
  try {
    for (let next = await reader.read(); !next.done; next = await reader.read()) {
      if (!res.write(next.value)) await drained(res);
      if (res.destroyed) return;
    }
    res.end();
  } catch {
    res.destroy();
  } finally {
    res.off("close", cancel);
    reader.releaseLock();
  }
}

/** Resolves once `res` can take more, or is closed. */
function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.on("drain", done);
    res.on("close", done);
  });
}
