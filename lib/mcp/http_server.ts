/**
 * `waffle mcp serve`'s HTTP side: one configured MCP server over MCP's
 * Streamable HTTP transport (POST, GET and DELETE on `/mcp`), one
 * {@linkcode HttpSession} (and so one sandbox session) per MCP session.
 *
 * Every request passes the same gate before anything else: a `Host` that is
 * loopback (unless the server listens beyond it), an `Origin`, when there is
 * one, that is loopback (a page elsewhere is refused: DNS rebinding), and
 * `Authorization: Bearer <token>` (401 without). A POST body is read up to
 * the limit (413 beyond, before it is parsed); an `initialize` without a
 * session starts a session. With `maxSessions` open, the one with nothing
 * open (no request in progress, no stream) that was active least recently
 * ends to make room; when every one is busy, the answer is 503. A session
 * ends on DELETE, when idle for `idleTimeoutMs`, when its server ends, and
 * on {@linkcode McpHttpServer.close}. The listener is `lib/http`'s: its
 * connection caps and deadlines apply before any of this. A refused request
 * (401, 403) closes its connection, so a client without the token cannot
 * keep one open. Needs net permission for the address.
 *
 * @module
 */
import { oneLineOf } from "../errors.ts";
import { type HttpLimits, type HttpServer, serveHttp } from "../http/mod.ts";
import { bearerMatches } from "./bearer_token.ts";
import type { ServerConnection } from "./connection.ts";
import { errorResponse, HttpSession } from "./http_session.ts";
import { isLoopbackHostHeader, isLoopbackOrigin } from "./loopback.ts";
import type { RelayOptions, RelayResult } from "./relay.ts";

/** The one path MCP is served on. */
export const MCP_PATH = "/mcp";
/** Sessions open at once when nothing says otherwise. */
export const DEFAULT_MAX_SESSIONS = 16;
/** A session idle this long ends: the sandbox session's own idle limit. */
export const DEFAULT_IDLE_TIMEOUT_MS = 30 * 60 * 1000;
/** How long closing waits for the HTTP server to finish its last responses. */
const SHUTDOWN_WAIT_MS = 2000;

/** Options of {@linkcode serveMcpHttp}. */
export interface McpHttpServerOptions {
  /** The address to listen on. */
  hostname: string;
  /** The port; 0 picks a free one. */
  port: number;
  /** The bearer token every request must carry. */
  token: string;
  /** Accept any `Host` header (the server listens beyond loopback); the token still applies. */
  allowRemote?: boolean | undefined;
  /** Sessions open at once (default {@linkcode DEFAULT_MAX_SESSIONS}). */
  maxSessions?: number | undefined;
  /** A session with no traffic this long ends (default {@linkcode DEFAULT_IDLE_TIMEOUT_MS}). */
  idleTimeoutMs?: number | undefined;
  /** The largest request body (the server's largest message); larger ones get 413. */
  maxBodyBytes: number;
  /** Starts the server for a new session. */
  open: () => Promise<ServerConnection>;
  /** The relay's options of every session (its signal is the session's own). */
  relay: Omit<RelayOptions, "signal">;
  /** The listener's connection caps and deadlines (each absent: `lib/http`'s default). */
  limits?: Partial<HttpLimits> | undefined;
  /** One line per session started and ended, and the listener's notices, for stderr. */
  onEvent?: ((line: string) => void) | undefined;
}

/** A running server. */
export interface McpHttpServer {
  /** Where clients connect: `http://HOST:PORT/mcp`. */
  readonly url: string;
  /** The address it listens on. */
  readonly addr: Deno.NetAddr;
  /** The connection caps and deadlines it applies. */
  readonly limits: HttpLimits;
  /** Sessions open now. */
  sessionCount(): number;
  /**
   * Ends every session (each server closed, its audit lines written), then
   * stops listening. Idempotent.
   *
   * @returns How each session's relay ended.
   */
  close(): Promise<RelayResult[]>;
}

interface State {
  readonly options: McpHttpServerOptions;
  readonly sessions: Map<string, HttpSession>;
  opening: number;
  closing: boolean;
}

/**
 * Starts listening and serving.
 *
 * @example
 * ```ts ignore
 * const server = await serveMcpHttp({
 *   hostname: "127.0.0.1", port: 0, token, maxBodyBytes: 64 << 20,
 *   open: () => openSandboxServer(planned, sandboxOptions),
 *   relay: { name: "everything", tools: "all", context, stderr },
 * });
 * console.error(server.url);
 * await server.close();
 * ```
 *
 * @param options Address, token, limits, how to start a server and the relay's options.
 * @returns The server.
 * @throws {WaffleError} When it cannot listen on the address.
 */
export async function serveMcpHttp(options: McpHttpServerOptions): Promise<McpHttpServer> {
  const state: State = { options, sessions: new Map(), opening: 0, closing: false };
  const server: HttpServer = await serveHttp((request) => handle(request, state), {
    hostname: options.hostname,
    port: options.port,
    limits: options.limits,
    onEvent: options.onEvent,
    onError: (error) => errorResponse(500, `Internal error: ${oneLineOf(error)}`),
  });
  const idleTimeoutMs = options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
  const sweep = setInterval(
    () => sweepIdle(state, idleTimeoutMs),
    Math.max(50, Math.min(idleTimeoutMs / 4, 15_000)),
  );
  let closing: Promise<RelayResult[]> | undefined;
  const host = server.addr.hostname.includes(":")
    ? `[${server.addr.hostname}]`
    : server.addr.hostname;
  return {
    url: `http://${host}:${server.addr.port}${MCP_PATH}`,
    addr: server.addr,
    limits: server.limits,
    sessionCount: () => state.sessions.size,
    close: () => {
      closing ??= (async () => {
        state.closing = true;
        clearInterval(sweep);
        const results = await Promise.all(
          [...state.sessions.values()].map((session) =>
            session.end("waffle is shutting down", "abort")
          ),
        );
        await server.shutdown({ graceMs: SHUTDOWN_WAIT_MS });
        return results;
      })();
      return closing;
    },
  };
}

async function handle(request: Request, state: State): Promise<Response> {
  const refused = guard(request, state.options);
  if (refused !== undefined) return refused;
  const sessionId = request.headers.get("mcp-session-id");
  let body: unknown;
  if (request.method === "POST") {
    const read = await readBody(request, state.options.maxBodyBytes);
    if (read instanceof Response) return read;
    try {
      body = JSON.parse(new TextDecoder().decode(read));
    } catch {
      return errorResponse(400, "Parse error: Invalid JSON", { code: -32700 });
    }
  }
  if (sessionId === null) {
    if (request.method === "POST" && hasInitialize(body)) {
      return await startSession(request, body, state);
    }
    return errorResponse(400, "Bad Request: Mcp-Session-Id header is required");
  }
  const session = state.sessions.get(sessionId);
  if (session === undefined || session.closed) {
    return errorResponse(404, "Session not found", { code: -32001 });
  }
  return await session.handle(request, body);
}

/**
 * The checks every request passes first; a response when it is refused.
 * A refusal ends its connection: without the token, no connection is kept.
 */
function guard(request: Request, options: McpHttpServerOptions): Response | undefined {
  const close = { Connection: "close" };
  const host = request.headers.get("host");
  if (!options.allowRemote && (host === null || !isLoopbackHostHeader(host))) {
    return errorResponse(403, `Forbidden: Host '${host ?? ""}' is not a loopback address`, {
      headers: close,
    });
  }
  const origin = request.headers.get("origin");
  if (origin !== null && !isLoopbackOrigin(origin)) {
    return errorResponse(403, `Forbidden: Origin '${origin}' is not a loopback origin`, {
      headers: close,
    });
  }
  if (!bearerMatches(request.headers.get("authorization"), options.token)) {
    return errorResponse(401, "Unauthorized: a valid 'Authorization: Bearer' token is required", {
      headers: { ...close, "WWW-Authenticate": 'Bearer realm="waffle"' },
    });
  }
  if (new URL(request.url).pathname !== MCP_PATH) {
    return errorResponse(404, `Not Found: MCP is served on '${MCP_PATH}'`);
  }
  return undefined;
}

async function startSession(request: Request, body: unknown, state: State): Promise<Response> {
  const { options, sessions } = state;
  const maxSessions = options.maxSessions ?? DEFAULT_MAX_SESSIONS;
  if (state.closing) return errorResponse(503, "Service Unavailable: waffle is shutting down");
  let reclaimed: Promise<unknown> | undefined;
  if (liveSessions(sessions) + state.opening >= maxSessions) {
    const quietest = leastRecentlyActive(sessions);
    if (quietest === undefined) {
      return errorResponse(
        503,
        `Service Unavailable: ${maxSessions} sessions are open and busy, the most allowed; end one (DELETE) first`,
        { headers: { "Retry-After": "5" } },
      );
    }
    // Clients rarely DELETE: a session with nothing open makes room, and its
    // client, should it come back, gets 404 and starts a new one.
    options.onEvent?.(`session ${short(quietest.id)} ends to make room (nothing open in it)`);
    reclaimed = quietest.end("a new session needed its place (nothing was open in it)", "abort");
  }
  const requestId = isRecord(body) && (typeof body.id === "string" || typeof body.id === "number")
    ? body.id
    : null;
  state.opening++;
  let session: HttpSession;
  let connection: ServerConnection | undefined;
  try {
    await reclaimed;
    connection = await options.open();
    session = await HttpSession.open({
      id: crypto.randomUUID(),
      connection,
      relay: options.relay,
      maxQueuedBytes: options.maxBodyBytes,
      onEnd: (_result, reason) => {
        sessions.delete(session.id);
        options.onEvent?.(`session ${short(session.id)} ended: ${reason}`);
      },
    });
  } catch (error) {
    await connection?.close().catch(() => {});
    options.onEvent?.(`cannot start a session: ${oneLineOf(error)}`);
    return errorResponse(502, `Cannot start server '${options.relay.name}': ${oneLineOf(error)}`, {
      code: -32603,
      id: requestId,
    });
  } finally {
    state.opening--;
  }
  sessions.set(session.id, session);
  options.onEvent?.(`session ${short(session.id)} started (${sessions.size} open)`);
  if (state.closing) {
    void session.end("waffle is shutting down", "abort");
    return errorResponse(503, "Service Unavailable: waffle is shutting down");
  }
  const response = await session.handle(request, body);
  // A refused initialize (e.g. a wrong Accept header) leaves no session to use.
  if (!session.initialized) void session.end("the client's initialize was refused", "abort");
  return response;
}

function liveSessions(sessions: Map<string, HttpSession>): number {
  let live = 0;
  for (const session of sessions.values()) if (!session.closed) live++;
  return live;
}

/** The live session with nothing open that was active least recently, if any. */
function leastRecentlyActive(sessions: Map<string, HttpSession>): HttpSession | undefined {
  const now = Date.now();
  let found: HttpSession | undefined;
  for (const session of sessions.values()) {
    if (session.closed || !session.quiet) continue;
    if (found === undefined || session.idleMs(now) > found.idleMs(now)) found = session;
  }
  return found;
}

function sweepIdle(state: State, idleTimeoutMs: number): void {
  const now = Date.now();
  for (const session of state.sessions.values()) {
    if (!session.closed && session.idleMs(now) >= idleTimeoutMs) {
      void session.end(`idle for ${Math.round(idleTimeoutMs / 1000)} s`, "abort");
    }
  }
}

/** The body, read up to `limit` bytes; a 413 response beyond (declared or seen). */
async function readBody(request: Request, limit: number): Promise<Uint8Array | Response> {
  const tooLarge = (): Response =>
    errorResponse(413, `Payload Too Large: a request body is at most ${limit} bytes`);
  const declared = Number(request.headers.get("content-length") ?? "0");
  if (declared > limit) {
    await request.body?.cancel().catch(() => {});
    return tooLarge();
  }
  if (request.body === null) return new Uint8Array();
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = request.body.getReader();
  try {
    for (let next = await reader.read(); !next.done; next = await reader.read()) {
      size += next.value.byteLength;
      if (size > limit) {
        await reader.cancel().catch(() => {});
        return tooLarge();
      }
      chunks.push(next.value);
    }
  } finally {
    reader.releaseLock();
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.byteLength;
  }
  return bytes;
}

function hasInitialize(body: unknown): boolean {
  const messages = Array.isArray(body) ? body : [body];
  return messages.some((message) => isRecord(message) && message.method === "initialize");
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function short(id: string): string {
  return id.slice(0, 8);
}
