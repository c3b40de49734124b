/**
 * The one owner of waffle's HTTP listeners (`waffle mcp serve`, and any
 * server after it): a web handler (`Request` in, `Response` out) served
 * over HTTP/1.1 behind the accept loop's caps and the deadlines of
 * {@linkcode HttpLimits}.
 *
 * What it guarantees: no more than `maxConnections` connections open, and
 * `maxConnectionsPerPeer` from one peer, a new one past either closed as
 * soon as it is accepted; a request whose headers, or whole request, take
 * longer than their deadline gets 408 and its connection closes, and so
 * does a kept-alive connection idle past its own; a failed accept (the
 * process out of file descriptors) is retried, never the end of the
 * server; the connections already open are served meanwhile, a streaming
 * response for as long as it streams. With `tls`, the same holds for HTTPS:
 * the listener accepts TCP and runs TLS (`node:tls`) over each connection
 * it admits, inside the header deadline, so a handshake that never
 * completes holds its place and its file descriptor only until then.
 * (`Deno.listenTls` is not used: in Deno 2.9 a connection closed before its
 * handshake ends keeps its socket open until the peer goes, refused ones
 * included, so a silent peer could take every file descriptor.)
 *
 * @module
 */
import { oneLineOf, WaffleError } from "../errors.ts";
import { acceptConnections } from "./accept_loop.ts";
import { type HttpLimits, resolveHttpLimits } from "./limits.ts";
import type { SecureContext } from "./_node_http.ts";

/** A web handler, as `Deno.serve` takes one. */
export type HttpHandler = (
  request: Request,
  info: HttpRequestInfo,
) => Response | Promise<Response>;

/** What a handler is told besides the request. */
export interface HttpRequestInfo {
  /** The client's address. */
  remoteAddr: Deno.NetAddr;
}

/** How long {@linkcode HttpServer.shutdown} waits for responses in progress by default. */
const DEFAULT_GRACE_MS = 2000;

/** Options of {@linkcode serveHttp}. */
export interface ServeHttpOptions {
  /** The address to listen on. */
  hostname: string;
  /** The port; 0 picks a free one. */
  port: number;
  /** A certificate (chain) and its key, PEM: the listener speaks HTTPS (HTTP/1.1 over TLS). */
  tls?: { cert: string; key: string } | undefined;
  /** The limits (each one absent: its default, see {@linkcode resolveHttpLimits}). */
  limits?: Partial<HttpLimits> | undefined;
  /** One line when accepting fails or connections are refused at a cap (at most one a minute of each). */
  onEvent?: ((line: string) => void) | undefined;
  /** The response when the handler throws (default: 500 with the error's first line). */
  onError?: ((error: unknown) => Response) | undefined;
}

/** A running HTTP server. */
export interface HttpServer {
  /** The address it listens on. */
  readonly addr: Deno.NetAddr;
  /** The limits it applies. */
  readonly limits: HttpLimits;
  /** Connections open now. */
  connectionCount(): number;
  /**
   * Stops accepting, closes the idle connections, waits up to `graceMs`
   * (default 2 s) for the responses in progress, then closes every
   * connection. Idempotent.
   */
  shutdown(options?: { graceMs?: number }): Promise<void>;
}

/**
 * Listens on `hostname:port` and serves each request with `handler`.
 * Needs net permission for the address (and read permission for
 * `/proc/self/limits`, to size the default connection cap). With
 * `options.tls`, it serves HTTPS.
 *
 * @example
 * ```ts ignore
 * const server = await serveHttp(() => new Response("hello\n"), {
 *   hostname: "127.0.0.1",
 *   port: 0,
 *   limits: { headerTimeoutMs: 5000 },
 * });
 * await server.shutdown();
 * ```
 *
 * @param handler Answers each request.
 * @param options Address, limits, and where the one-line notices go.
 * @returns The server, listening.
 * @throws {WaffleError} When it cannot listen on the address (or the
 *   certificate or key is not valid PEM).
 * @throws {RangeError} When a limit is out of range.
 */
export async function serveHttp(
  handler: HttpHandler,
  options: ServeHttpOptions,
): Promise<HttpServer> {
  const limits = resolveHttpLimits(options.limits);
  // Node's HTTP modules load only for a command that serves.
  const { nodeHttpServer, secureContext, serveConnection } = await import("./_node_http.ts");
  let listener: Deno.TcpListener;
  try {
    listener = Deno.listen({ hostname: options.hostname, port: options.port, transport: "tcp" });
  } catch (cause) {
    const address = `${options.hostname}:${options.port}`;
    throw new WaffleError(`Cannot listen on '${address}': ${oneLineOf(cause)}`, { cause });
  }
  let tls: SecureContext | undefined;
  try {
    tls = options.tls === undefined ? undefined : secureContext(options.tls);
  } catch (cause) {
    listener.close();
    throw new WaffleError(`Cannot serve HTTPS: ${oneLineOf(cause)}`, { cause });
  }
  const addr = listener.addr;
  const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
  const server = nodeHttpServer(handler, {
    limits,
    origin: `${options.tls === undefined ? "http" : "https"}://${host}:${addr.port}`,
    onError: options.onError ??
      ((error) => new Response(`Internal Server Error: ${oneLineOf(error)}\n`, { status: 500 })),
  });
  const loop = acceptConnections(listener, {
    limits,
    onConnection: (conn, release) =>
      serveConnection(server, conn, { limits, tls, onClosed: release }),
    onEvent: options.onEvent,
  });
  let stopping: Promise<void> | undefined;
  return {
    addr,
    limits,
    connectionCount: () => loop.openCount(),
    shutdown: ({ graceMs = DEFAULT_GRACE_MS } = {}) => {
      stopping ??= (async () => {
        loop.stop();
        // Closes the idle connections, and each busy one after its response.
        server.close();
        await loop.done;
        if (!await loop.drained(graceMs)) server.closeAllConnections();
        await loop.drained(Infinity);
      })();
      return stopping;
    },
  };
}
