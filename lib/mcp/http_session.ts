/**
 * One MCP session of `waffle mcp serve`: the official SDK's Streamable HTTP
 * server transport on the client's side, {@linkcode relay} and one server
 * connection (a sandbox session, or a host process) on the other, so the
 * allowlists and the audit log apply exactly as they do for `mcp run`.
 *
 * The relay speaks newline-delimited JSON: what the HTTP client posts is fed
 * to it as lines, and what it emits is routed back: a response to the HTTP
 * request that carried its id; a `notifications/progress` to the request
 * whose `_meta.progressToken` it names; any other notification, and the
 * server's own requests (sampling, elicitation, roots), to the client's GET
 * stream when one is open, else to the stream of its latest pending
 * request. A server request with no stream to go to is answered with an
 * error at once (the server would otherwise wait for ever); a notification
 * with none is dropped, as a stdio client that is not reading would lose it.
 *
 * @module
 */
import type {
  JSONRPCMessage,
  WebStandardStreamableHTTPServerTransport,
} from "@modelcontextprotocol/server";
import type { ServerConnection } from "./connection.ts";
import { relay, type RelayOptions, type RelayResult } from "./relay.ts";
import { DEFAULT_MAX_MESSAGE_BYTES } from "../config/mcp_types.ts";

/** A JSON-RPC id. */
type Id = string | number;
/** A message as the relay emits it (already validated by it). */
type Message = Record<string, unknown>;

/** Options of {@linkcode HttpSession.open}. */
export interface HttpSessionOptions {
  /** The session's id (`Mcp-Session-Id`): unguessable. */
  id: string;
  /** The server, already started. */
  connection: ServerConnection;
  /** The relay's options (everything but the signal, which the session owns). */
  relay: Omit<RelayOptions, "signal">;
  /** Client messages queued for the relay beyond this many bytes: new requests get 503. */
  maxQueuedBytes: number;
  /**
   * Called once, after the server has ended and the transport is closed,
   * with how the relay ended and why the session did (one line).
   */
  onEnd?: ((result: RelayResult, reason: string) => void) | undefined;
}

/** The JSON-RPC code of waffle's own errors to a pending request (implementation-defined). */
const SESSION_ERROR_CODE = -32000;

let sdk: Promise<typeof import("@modelcontextprotocol/server")> | undefined;

/** The SDK is loaded on first use: importing the library costs nothing for it. */
function loadSdk(): Promise<typeof import("@modelcontextprotocol/server")> {
  sdk ??= import("@modelcontextprotocol/server");
  return sdk;
}

/** A session of the Streamable HTTP transport, bridged to a relay. */
export class HttpSession {
  /** The session's id (`Mcp-Session-Id`). */
  readonly id: string;
  /** Resolves once the relay has ended, the server is closed and the transport too. */
  readonly ended: Promise<RelayResult>;
  readonly #transport: WebStandardStreamableHTTPServerTransport;
  readonly #options: HttpSessionOptions;
  readonly #abort = new AbortController();
  readonly #encoder = new TextEncoder();
  #input!: ReadableStreamDefaultController<Uint8Array>;
  #inputClosed = false;
  #closed = false;
  #endReason: string | undefined;
  /** Client requests not yet answered, oldest first: id key → id and its progress token key. */
  readonly #pending = new Map<string, { id: Id; token: string | undefined }>();
  /** Progress token key → the request that named it. */
  readonly #progress = new Map<string, Id>();
  #getStreams = 0;
  // Bytes handed to the transport and not yet read by the client: the
  // transport's streams queue without a bound, so this is the bound.
  #unread = 0;
  #dropped = 0;
  #active = 0;
  #lastActivity = Date.now();

  /**
   * Opens a session over a started server connection.
   *
   * @example
   * ```ts ignore
   * const session = await HttpSession.open({ id, connection, relay, maxQueuedBytes });
   * const response = await session.handle(request, body);
   * ```
   *
   * @param options The id, the connection, the relay's options and bounds.
   * @returns The session, its relay running.
   */
  static async open(options: HttpSessionOptions): Promise<HttpSession> {
    return new HttpSession(await loadSdk(), options);
  }

  private constructor(
    sdk: typeof import("@modelcontextprotocol/server"),
    options: HttpSessionOptions,
  ) {
    const transport = new sdk.WebStandardStreamableHTTPServerTransport({
      sessionIdGenerator: () => options.id,
      // DELETE: answered once the server's session has ended.
      onsessionclosed: async () => void await this.end("the client ended the session"),
    });
    this.id = options.id;
    this.#transport = transport;
    this.#options = options;
    transport.onmessage = (message) => this.#fromClient(message as unknown as Message);
    const input = new ReadableStream<Uint8Array>(
      { start: (controller) => void (this.#input = controller) },
      new ByteLengthQueuingStrategy({ highWaterMark: 0 }),
    );
    this.ended = relay(
      // Messages, not lines: each is validated once by the relay and
      // serialized once by the transport.
      { input, output: { messages: (message) => this.#route(message) } },
      options.connection,
      { ...options.relay, signal: this.#abort.signal },
    ).then(async (result) => {
      await this.#afterEnd(result);
      return result;
    });
  }

  /** Whether the client's `initialize` was accepted (the transport knows the session). */
  get initialized(): boolean {
    return this.#transport.sessionId !== undefined;
  }

  /** Whether the session has ended or is ending: its requests get 404. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * How long the session has been idle: nothing open (no request or stream
   * in progress) and no request begun or finished since.
   *
   * @param now The current time (ms).
   * @returns Milliseconds idle; 0 while anything is open.
   */
  idleMs(now: number): number {
    return this.#active > 0 ? 0 : Math.max(0, now - this.#lastActivity);
  }

  /** Whether nothing is open: no request in progress, no stream to the client. */
  get quiet(): boolean {
    return this.#active === 0;
  }

  /**
   * Handles one HTTP request of this session (POST, GET or DELETE).
   *
   * @param request The request.
   * @param body Its parsed JSON body (POST), already read within the size limit.
   * @returns The response; an SSE body ends when its request is answered.
   */
  async handle(request: Request, body?: unknown): Promise<Response> {
    if (
      request.method === "POST" && (this.#input.desiredSize ?? 0) < -this.#options.maxQueuedBytes
    ) {
      return errorResponse(503, "Too many messages queued for the server; retry later");
    }
    this.#active++;
    this.#lastActivity = Date.now();
    let response: Response;
    try {
      response = await this.#transport.handleRequest(
        request,
        body === undefined ? undefined : { parsedBody: body },
      );
    } catch (error) {
      this.#settled();
      throw error;
    }
    const type = response.headers.get("content-type") ?? "";
    if (response.body === null || !type.startsWith("text/event-stream")) {
      this.#settled();
      return response;
    }
    const isGet = request.method === "GET";
    if (isGet) this.#getStreams++;
    const streamed = observed(response.body, {
      onRead: (bytes) => void (this.#unread = Math.max(0, this.#unread - bytes)),
      onDone: () => {
        if (isGet) this.#getStreams--;
        // What it still held is gone with it.
        if (this.#getStreams === 0 && this.#active <= 1) this.#unread = 0;
        this.#settled();
      },
    });
    return new Response(streamed, { status: response.status, headers: response.headers });
  }

  /**
   * Ends the session: the relay closes the server (a sandbox session ends,
   * its audit lines are written), pending requests get an error, and the
   * transport closes every stream. Idempotent.
   *
   * @param reason Why, one line (for the pending requests' errors).
   * @param how `close`: the client's input ends, the server drains first;
   *   `abort`: the relay stops at once (a signal, an idle timeout).
   * @returns How the relay ended.
   */
  end(reason: string, how: "close" | "abort" = "close"): Promise<RelayResult> {
    this.#closed = true;
    this.#endReason ??= reason;
    if (how === "abort") this.#abort.abort();
    else this.#closeInput();
    return this.ended;
  }

  #settled(): void {
    this.#active--;
    this.#lastActivity = Date.now();
  }

  #closeInput(): void {
    if (this.#inputClosed) return;
    this.#inputClosed = true;
    try {
      this.#input.close();
    } catch {
      // Already errored or cancelled by the relay.
    }
  }

  #toRelay(message: unknown): void {
    if (this.#inputClosed) return;
    try {
      this.#input.enqueue(this.#encoder.encode(`${JSON.stringify(message)}\n`));
    } catch {
      // The relay stopped reading: the session is ending.
    }
  }

  #fromClient(message: Message): void {
    this.#lastActivity = Date.now();
    if (typeof message.method === "string" && Object.hasOwn(message, "id")) {
      const id = message.id as Id;
      const key = idKey(id);
      if (this.#pending.has(key)) {
        // Its answer would stand in for the pending one's: refused, as the relay does.
        void this.#send(errorMessage(id, -32600, "Request id is already pending"));
        return;
      }
      const token = progressToken(message.params);
      this.#pending.set(key, { id, token });
      if (token !== undefined) this.#progress.set(token, id);
    } else if (message.method === "notifications/cancelled") {
      const id = isRecord(message.params) ? message.params.requestId : undefined;
      if (typeof id === "string" || typeof id === "number") this.#forget(idKey(id));
    }
    this.#toRelay(message);
  }

  async #route(message: Message): Promise<void> {
    if (typeof message.method !== "string") {
      const id = message.id;
      const key = typeof id === "string" || typeof id === "number" ? idKey(id) : undefined;
      if (key === undefined || !this.#pending.has(key)) return; // no request to answer
      this.#forget(key);
      await this.#send(message);
      return;
    }
    const isRequest = Object.hasOwn(message, "id");
    const token = message.method === "notifications/progress" && isRecord(message.params)
      ? tokenKey(message.params.progressToken)
      : undefined;
    const progressOf = token === undefined ? undefined : this.#progress.get(token);
    if (progressOf !== undefined) return await this.#send(message, progressOf);
    if (this.#getStreams > 0) return await this.#send(message);
    const latest = [...this.#pending.values()].at(-1);
    if (latest !== undefined) return await this.#send(message, latest.id);
    if (isRequest) {
      this.#toRelay(
        errorMessage(message.id as Id, -32603, "No stream to the client is open for this request"),
      );
    }
  }

  async #send(message: Message, relatedRequestId?: Id): Promise<void> {
    // UTF-8 bytes and SSE framing, as the client reads them.
    const size = this.#encoder.encode(JSON.stringify(message)).byteLength + SSE_FRAMING_BYTES;
    const limit = unreadLimit(this.#options.relay.maxMessageBytes);
    if (this.#unread + size > limit) {
      // A client that opened a stream and does not read it, or a server
      // flooding one: a notification is dropped (and counted); an answer or
      // a request cannot be, so the session ends. The host's memory never grows.
      if (typeof message.method === "string" && !Object.hasOwn(message, "id")) {
        if (this.#dropped++ === 0) {
          void this.#options.relay.stderr(
            `waffle: the client reads its streams slower than server '${this.#options.relay.name}' notifies; dropping notifications\n`,
          );
        }
        return;
      }
      void this.end(
        `The client left more than ${limit} bytes of its streams unread`,
        "abort",
      );
      return;
    }
    this.#unread += size;
    try {
      await this.#transport.send(
        message as unknown as JSONRPCMessage,
        relatedRequestId === undefined ? undefined : { relatedRequestId },
      );
    } catch {
      // Its stream is gone (the client disconnected): as a closed stdout would lose it.
    }
  }

  #forget(key: string): void {
    const entry = this.#pending.get(key);
    if (entry === undefined) return;
    this.#pending.delete(key);
    if (entry.token !== undefined) this.#progress.delete(entry.token);
  }

  async #afterEnd(result: RelayResult): Promise<void> {
    this.#closed = true;
    this.#closeInput();
    const reason = this.#endReason ??
      `server '${this.#options.relay.name}' ended: ${result.reason}`;
    for (const { id } of [...this.#pending.values()]) {
      await this.#send(errorMessage(id, SESSION_ERROR_CODE, `Session ended: ${reason}`));
    }
    this.#pending.clear();
    this.#progress.clear();
    await this.#transport.close().catch(() => {});
    this.#options.onEnd?.(result, reason);
  }
}

/**
 * A JSON-RPC error response with HTTP status, as the SDK's transport answers.
 *
 * @param status The HTTP status.
 * @param message One line.
 * @param options The JSON-RPC code (default -32000), the id, and extra headers.
 * @returns The response.
 */
export function errorResponse(
  status: number,
  message: string,
  options: { code?: number; id?: string | number | null; headers?: Record<string, string> } = {},
): Response {
  return Response.json(
    { jsonrpc: "2.0", id: options.id ?? null, error: { code: options.code ?? -32000, message } },
    { status, headers: options.headers ?? {} },
  );
}

function errorMessage(id: Id, code: number, message: string): Message {
  return { jsonrpc: "2.0", id, error: { code, message } };
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function idKey(id: Id): string {
  return `${typeof id}:${id}`;
}

function tokenKey(token: unknown): string | undefined {
  return typeof token === "string" || typeof token === "number" ? idKey(token) : undefined;
}

function progressToken(params: unknown): string | undefined {
  const meta = isRecord(params) ? params._meta : undefined;
  return isRecord(meta) ? tokenKey(meta.progressToken) : undefined;
}

/** The same bytes, pulled on demand, with `onDone` called once when they end or are cancelled. */
/** Over-estimate of SSE's framing of one message (`event:`, `id:`, `data:` lines). */
const SSE_FRAMING_BYTES = 128;

// Past one message of the largest size, with room for what is in flight.
function unreadLimit(maxMessageBytes: number | undefined): number {
  return 2 * (maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES);
}

function observed(
  body: ReadableStream<Uint8Array>,
  on: { onRead: (bytes: number) => void; onDone: () => void },
): ReadableStream<Uint8Array> {
  const { onRead, onDone } = on;
  const reader = body.getReader();
  let done = false;
  const finish = (): void => {
    if (done) return;
    done = true;
    onDone();
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller): Promise<void> {
      try {
        const next = await reader.read();
        if (next.done) {
          finish();
          controller.close();
        } else {
          onRead(next.value.byteLength);
          controller.enqueue(next.value);
        }
      } catch (error) {
        finish();
        controller.error(error);
      }
    },
    cancel(reason): Promise<void> {
      finish();
      return reader.cancel(reason);
    },
  }, { highWaterMark: 0 });
}
