/**
 * The MCP relay between a stdio client and a server connection, wherever the
 * server runs. Every message passes both ways, notifications included; the
 * relay only steps in for the `tools` allowlist (it filters `tools/list`
 * results and answers a `tools/call` of another tool itself) and for the
 * `client_requests` allowlist (a server's request of another method is
 * answered with an error by {@linkcode ServerRequestGate} and never reaches
 * the client), and writes one audit line per `tools/call` and per server
 * request.
 *
 * The server side is untrusted: each line is capped at the server's
 * `max_message_bytes` (a longer one is read through without being held,
 * and the request it answers, or the request it is, gets a JSON-RPC error
 * naming the cap: the session goes on), validated (an invalid one is
 * dropped with a note), and re-serialized, so only well-formed JSON-RPC
 * ever reaches the client. The client's lines get the same cap, and
 * JSON-RPC's answers: -32700 for a line that is not JSON, -32600 for one
 * that is no valid message. A `notifications/cancelled` either way is
 * passed on and ends the audit of the request it names at once. Its stderr is forwarded with
 * terminal control characters escaped (`escapeControls`), at most {@linkcode STDERR_BYTES_PER_SECOND}
 * on average (bursts up to {@linkcode STDERR_BURST_BYTES}); the excess is
 * dropped and counted, so a noisy server never blocks on its stderr.
 *
 * @module
 */
import { escapeControls } from "../terminal/control_text.ts";
import { argumentNames, type AuditLog, type AuditOutcome, type AuditRecord } from "./audit.ts";
import type { ServerConnection } from "./connection.ts";
import {
  encodeMessage,
  idKey,
  INVALID_REQUEST,
  type JsonRpcId,
  type JsonRpcNotification,
  type JsonRpcRequest,
  type JsonRpcResponse,
  OversizedLine,
  parseMessage,
  readLines,
} from "./jsonrpc.ts";
import { oneLineOf } from "../errors.ts";
import { DEFAULT_CLIENT_REQUESTS, DEFAULT_MAX_MESSAGE_BYTES } from "../config/mcp_types.ts";
import { ServerRequestGate } from "./server_request_gate.ts";

/** The client side: the CLI's stdin and stdout. */
export interface RelayClient {
  /** Messages from the client. */
  input: ReadableStream<Uint8Array>;
  /**
   * Messages to the client: nothing but JSON-RPC lines is ever written here.
   * `{ messages }` takes each validated message as an object instead, in
   * order (a transport that serializes them itself: no line to parse again).
   */
  output:
    | WritableStream<Uint8Array>
    | ((bytes: Uint8Array) => Promise<void>)
    | { messages: (message: Record<string, unknown>) => Promise<void> };
}

/** Who is calling, for the audit log. */
export interface RelayContext {
  /** The sandbox user, or null (a host server run without `--user`). */
  user: string | null;
  /** The user's tenant. */
  tenant: string;
  /** The group whose policy applies. */
  group: string;
  /** The cron job, or null. */
  cron: string | null;
}

/** Options of {@linkcode relay}. */
export interface RelayOptions {
  /** The server's name (`[mcp.<name>]`), for messages and the audit log. */
  name: string;
  /** The tools the client may list and call. */
  tools: string[] | "all";
  /** The request methods the server may send to the client (default `roots/list` and `ping`). */
  clientRequests?: readonly string[] | undefined;
  /** Who is calling. */
  context: RelayContext;
  /** Where each `tools/call` and server request is recorded; none: not recorded. */
  audit?: AuditLog | undefined;
  /** The CLI's stderr: the server's stderr and the relay's notes. */
  stderr: (data: Uint8Array | string) => Promise<void>;
  /** Ends the session at once (the CLI got a signal). */
  signal?: AbortSignal | undefined;
  /** How long `server.close()` may take before the relay gives up on it (default 5000). */
  closeTimeoutMs?: number | undefined;
  /** The longest message either side may send (`max_message_bytes`, default 64 MiB). */
  maxMessageBytes?: number | undefined;
}

/** How a relay ended. */
export interface RelayResult {
  /**
   * `client`: the client closed its input (or stopped reading); `server`: the
   * server ended first; `aborted`: the signal fired; `error`: a
   * server that sent too many requests the relay refused, or too many
   * messages over the size limit.
   */
  ended: "client" | "server" | "aborted" | "error";
  /** One line: why. */
  reason: string;
}

/** Requests either side may have pending at once; more are refused (memory stays bounded). */
const MAX_PENDING = 1024;
/** Messages over the size limit a session answers; one more ends it (each costs host writes). */
const MAX_OVERSIZED = 1024;
/** Cancelled request ids remembered, so the server's late answer is dropped quietly. */
const MAX_CANCELLED = 1024;
/** The JSON-RPC error code of a request whose answer was over the size limit (internal error). */
export const TOO_LARGE_ERROR_CODE = -32603;

/** The JSON-RPC error code of a denied `tools/call` (invalid params). */
export const POLICY_ERROR_CODE = -32602;
/** Average rate of server stderr forwarded. */
export const STDERR_BYTES_PER_SECOND = 64 * 1024;
/** Largest burst of server stderr forwarded at once. */
export const STDERR_BURST_BYTES = 256 * 1024;
/** The relay's own notes on stderr, at most this many per session. */
const MAX_NOTES = 100;
/** After the server's end, how long its last output may take to drain. */
const DRAIN_MS = 500;

interface PendingCall {
  method: string;
  tool?: string | undefined;
  arguments: string[];
  startedAt: number;
  time: string;
}

/**
 * Relays one MCP session until the client or the server ends it, then closes
 * the server (within `closeTimeoutMs`).
 *
 * @example
 * ```ts ignore
 * const result = await relay(
 *   { input: Deno.stdin.readable, output: Deno.stdout.writable },
 *   await openHostServer(planned, { env, cacheDir }),
 *   { name: "everything", tools: ["echo"], context, stderr: io.stderr },
 * );
 * ```
 *
 * @param client The client's streams.
 * @param server The server's connection.
 * @param options Policy, audit, context and stderr.
 * @returns How it ended.
 */
export async function relay(
  client: RelayClient,
  server: ServerConnection,
  options: RelayOptions,
): Promise<RelayResult> {
  const { name } = options;
  const maxBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const allowed = options.tools === "all" ? undefined : new Set(options.tools);
  const pendingCalls = new Map<string, PendingCall>();
  const audits: Promise<void>[] = [];
  const stop = new AbortController();
  const stderr = stderrLimiter(options.stderr);

  let result: RelayResult | undefined;
  let settle!: (value: RelayResult) => void;
  const done = new Promise<RelayResult>((resolve) => settle = resolve);
  const finish = (value: RelayResult): void => {
    if (result !== undefined) return;
    result = value;
    settle(value);
  };

  const toClient = clientWriter(client.output);
  const send = async (message: Record<string, unknown>): Promise<void> => {
    try {
      await toClient.write(message);
    } catch {
      finish({ ended: "client", reason: "the client stopped reading" });
    }
  };
  const serverInput = server.stdin.getWriter();
  const toServer = async (message: unknown): Promise<void> => {
    // A failed write means the server is gone; its end is reported by the server side.
    await serverInput.write(encodeMessage(message)).catch(() => {});
  };

  const audit = (entry: Omit<AuditRecord, keyof RelayContext | "server">): void => {
    if (options.audit === undefined) return;
    audits.push(options.audit.append({ ...options.context, server: name, ...entry }));
  };
  const record = (call: PendingCall, outcome: AuditOutcome): void => {
    if (call.tool === undefined) return;
    audit({
      time: call.time,
      from: "client",
      method: call.method,
      tool: call.tool,
      arguments: call.arguments,
      durationMs: Date.now() - call.startedAt,
      outcome,
    });
  };
  const gate = new ServerRequestGate({
    name,
    allowed: options.clientRequests ?? DEFAULT_CLIENT_REQUESTS,
    maxPending: MAX_PENDING,
    record: (entry) => audit({ ...entry, from: "server" }),
  });

  const onServerRequest = async (request: JsonRpcRequest): Promise<void> => {
    const admission = gate.admit(request);
    if (admission.action === "forward") {
      await send(request);
    } else if (admission.action === "refuse") {
      stderr.note(admission.note);
      await toServer(admission.response);
    } else {
      finish({ ended: "error", reason: admission.reason });
    }
  };

  // Ids the client cancelled whose answer has not come (see onClientCancel).
  const cancelled = new Set<string>();
  const onClientRequest = async (request: JsonRpcRequest): Promise<void> => {
    // An id still pending would let this response stand in for that one (a
    // tools/list answered as a ping, unfiltered): refused.
    // A cancelled id too, until the set forgets it: the server may still
    // answer the old request, and that answer must not stand for this one.
    if (pendingCalls.has(idKey(request.id)) || cancelled.has(idKey(request.id))) {
      await send({
        jsonrpc: "2.0",
        id: request.id,
        error: { code: -32600, message: "Request id is already pending" },
      });
      return;
    }
    if (pendingCalls.size >= MAX_PENDING) {
      await send({
        jsonrpc: "2.0",
        id: request.id,
        error: { code: -32600, message: `More than ${MAX_PENDING} requests pending` },
      });
      return;
    }
    const call: PendingCall = {
      method: request.method,
      arguments: [],
      startedAt: Date.now(),
      time: new Date().toISOString(),
    };
    if (request.method === "tools/call") {
      const params = isRecord(request.params) ? request.params : {};
      const tool = typeof params.name === "string" ? params.name : "";
      call.tool = tool;
      call.arguments = argumentNames(params.arguments);
      if (allowed !== undefined && !allowed.has(tool)) {
        record(call, "denied");
        await send({
          jsonrpc: "2.0",
          id: request.id,
          error: {
            code: POLICY_ERROR_CODE,
            message: `Tool '${tool}' is not allowed by waffle policy`,
          },
        });
        return;
      }
    }
    pendingCalls.set(idKey(request.id), call);
    await toServer(request);
  };

  const onServerResponse = async (response: JsonRpcResponse): Promise<void> => {
    const key = response.id === null ? undefined : idKey(response.id);
    const call = key === undefined ? undefined : pendingCalls.get(key);
    if (key === undefined || call === undefined) {
      // An answer to a cancelled request is expected now and then, and dropped quietly.
      if (key === undefined || !cancelled.delete(key)) {
        stderr.note(`waffle: dropped a response from server '${name}' to no pending request`);
      }
      return;
    }
    pendingCalls.delete(key);
    let message: JsonRpcResponse = response;
    if (call.method === "tools/list" && allowed !== undefined && isRecord(response.result)) {
      message = { ...response, result: filterTools(response.result, allowed) };
    }
    if (call.method === "tools/call") {
      const isError = isRecord(response.result) && response.result.isError === true;
      record(call, Object.hasOwn(response, "error") ? "error" : isError ? "tool_error" : "ok");
    }
    await send(message);
  };

  // Over the cap either way: the request it is, or the one it answers, is
  // answered with an error naming the key to raise; the session goes on.
  let oversized = 0;
  const limitText = (from: string, bytes: number): string =>
    `${from} sent a message of ${bytes} bytes, over max_message_bytes (${maxBytes}) of server '${name}'; raise [mcp.${name}] max_message_bytes`;
  const tooLarge = (text: string, bytes: number) => ({
    code: TOO_LARGE_ERROR_CODE,
    message: text,
    data: { maxMessageBytes: maxBytes, messageBytes: bytes, key: `mcp.${name}.max_message_bytes` },
  });
  const overLimit = (): boolean => {
    if (++oversized <= MAX_OVERSIZED) return false;
    finish({
      ended: "error",
      reason: `More than ${MAX_OVERSIZED} messages over max_message_bytes`,
    });
    return true;
  };

  const onServerOversized = async (line: OversizedLine): Promise<void> => {
    if (overLimit()) return;
    const text = limitText(`Server '${name}'`, line.bytes);
    stderr.note(`waffle: ${text}`);
    if (line.id === undefined) return;
    if (line.method !== undefined) {
      // A request of the server's: refused to the server, never shown.
      audit({
        time: new Date().toISOString(),
        from: "server",
        method: line.method.slice(0, 128),
        durationMs: 0,
        outcome: "too_large",
      });
      await toServer({ jsonrpc: "2.0", id: line.id, error: tooLarge(text, line.bytes) });
      return;
    }
    const call = pendingCalls.get(idKey(line.id));
    if (call === undefined) return;
    pendingCalls.delete(idKey(line.id));
    record(call, "too_large");
    await send({ jsonrpc: "2.0", id: line.id, error: tooLarge(text, line.bytes) });
  };

  const onClientOversized = async (line: OversizedLine): Promise<void> => {
    if (overLimit()) return;
    const text = limitText("The client", line.bytes);
    stderr.note(`waffle: ${text}`);
    if (line.id === undefined) return;
    if (line.method !== undefined) {
      const call: PendingCall = {
        method: line.method,
        arguments: [],
        startedAt: Date.now(),
        time: new Date().toISOString(),
      };
      // Its tool is inside the part not read: audited by method.
      if (line.method === "tools/call") call.tool = "";
      record(call, "too_large");
      await send({ jsonrpc: "2.0", id: line.id, error: tooLarge(text, line.bytes) });
      return;
    }
    // The client's answer to a server request: the server hears why.
    if (gate.end(line.id, "too_large")) {
      await toServer({ jsonrpc: "2.0", id: line.id, error: tooLarge(text, line.bytes) });
    }
  };

  // The call's audit line is written now, with its own duration; the
  // server's late answer, if any, goes nowhere (the client forgot the id).
  const cancelledId = (message: JsonRpcNotification): JsonRpcId | undefined => {
    const params = isRecord(message.params) ? message.params : {};
    const id = params.requestId;
    return typeof id === "string" || typeof id === "number" ? id : undefined;
  };
  const onClientCancel = (message: JsonRpcNotification): void => {
    const id = cancelledId(message);
    if (id === undefined) return;
    const call = pendingCalls.get(idKey(id));
    if (call === undefined) return;
    pendingCalls.delete(idKey(id));
    record(call, "cancelled");
    if (cancelled.size >= MAX_CANCELLED) cancelled.clear();
    cancelled.add(idKey(id));
  };

  const clientSide = (async () => {
    try {
      for await (
        const line of readLines(client.input, { signal: stop.signal, maxBytes })
      ) {
        if (result !== undefined) break;
        if (line instanceof OversizedLine) {
          await onClientOversized(line);
          continue;
        }
        const parsed = parseMessage(line);
        if ("invalid" in parsed) {
          stderr.note(`waffle: rejected a message from the client: ${parsed.invalid}`);
          await send({
            jsonrpc: "2.0",
            id: parsed.id,
            error: {
              code: parsed.code,
              message: `${
                parsed.code === INVALID_REQUEST ? "Invalid request" : "Parse error"
              }: ${parsed.invalid}`,
            },
          });
        } else if (parsed.kind === "request") {
          await onClientRequest(parsed.message);
        } else if (parsed.kind === "response") {
          // Only an answer to a request the client was shown goes back: a
          // refused request's id pairs with nothing.
          if (gate.settle(parsed.message)) {
            await toServer(parsed.message);
          } else {
            stderr.note(`waffle: dropped a response from the client to no pending request`);
          }
        } else if (parsed.message.method.startsWith("notifications/")) {
          if (parsed.message.method === "notifications/cancelled") onClientCancel(parsed.message);
          await toServer(parsed.message);
        } else {
          // A request without an id (e.g. a tools/call) would reach the
          // server unchecked and unaudited: only notifications pass.
          stderr.note(
            `waffle: dropped a client notification '${parsed.message.method.slice(0, 64)}'`,
          );
        }
      }
      finish({ ended: "client", reason: "the client closed its input" });
    } catch (error) {
      finish({ ended: "client", reason: `Cannot read the client: ${oneLineOf(error)}` });
    }
  })();

  let serverOutputEnded = false;
  const serverSide = (async () => {
    try {
      for await (const line of readLines(server.stdout, { signal: stop.signal, maxBytes })) {
        if (line instanceof OversizedLine) {
          await onServerOversized(line);
          continue;
        }
        const parsed = parseMessage(line);
        if ("invalid" in parsed) {
          stderr.note(`waffle: dropped a message from server '${name}': ${parsed.invalid}`);
        } else if (parsed.kind === "response") {
          await onServerResponse(parsed.message);
        } else if (parsed.kind === "request") {
          await onServerRequest(parsed.message);
        } else {
          if (parsed.message.method === "notifications/cancelled") {
            const id = cancelledId(parsed.message);
            if (id !== undefined) gate.end(id, "cancelled");
          }
          await send(parsed.message);
        }
      }
      serverOutputEnded = true;
      const reason = await within(server.closed, DRAIN_MS);
      finish({ ended: "server", reason: reason ?? "its output ended" });
    } catch (error) {
      finish({ ended: "server", reason: `Cannot read server '${name}': ${oneLineOf(error)}` });
    }
  })();

  const stderrSide = (async () => {
    try {
      for await (const chunk of server.stderr) stderr.forward(chunk);
    } catch {
      // The server's stderr failing is not a reason to end the session.
    }
  })();

  // The process can end with a grandchild still holding stdout: its end is
  // the server's end, after a short drain.
  void server.closed.then(async (reason) => {
    if (!serverOutputEnded) await within(serverSide, DRAIN_MS);
    finish({ ended: "server", reason });
  }, (error) => finish({ ended: "server", reason: oneLineOf(error) }));

  const onAbort = (): void => finish({ ended: "aborted", reason: "waffle was interrupted" });
  if (options.signal?.aborted) onAbort();
  options.signal?.addEventListener("abort", onAbort, { once: true });

  const ending = await done;
  options.signal?.removeEventListener("abort", onAbort);
  // The client loop stops reading; the server loop keeps forwarding what the
  // server still says until close() has ended it.
  if (ending.ended !== "client") stop.abort();
  const closeTimeoutMs = options.closeTimeoutMs ?? 5000;
  const closed = await within(server.close().then(() => true, () => true), closeTimeoutMs);
  if (closed === undefined) {
    stderr.note(`waffle: server '${name}' did not end within ${closeTimeoutMs} ms`);
  }
  stop.abort();
  await within(Promise.all([clientSide, serverSide, stderrSide]), DRAIN_MS);
  for (const call of pendingCalls.values()) record(call, "no_response");
  pendingCalls.clear();
  gate.close();
  try {
    serverInput.releaseLock();
  } catch {
    // A write still pending on a dead server.
  }
  await Promise.all(audits);
  await toClient.close();
  await stderr.flush();
  return ending;
}

function filterTools(
  result: Record<string, unknown>,
  allowed: Set<string>,
): Record<string, unknown> {
  const tools = Array.isArray(result.tools) ? result.tools : [];
  return {
    ...result,
    tools: tools.filter((tool) =>
      isRecord(tool) && typeof tool.name === "string" && allowed.has(tool.name)
    ),
  };
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** Writes to the client one message at a time, in order. */
function clientWriter(
  output: RelayClient["output"],
): { write: (message: Record<string, unknown>) => Promise<void>; close: () => Promise<void> } {
  let chain = Promise.resolve();
  if (typeof output === "function" || "messages" in output) {
    const deliver = typeof output === "function"
      ? (message: Record<string, unknown>) => output(encodeMessage(message))
      : output.messages;
    return {
      write: (message) => chain = chain.then(() => deliver(message)),
      close: () => chain.catch(() => {}),
    };
  }
  const writer = output.getWriter();
  return {
    write: (message) => chain = chain.then(() => writer.write(encodeMessage(message))),
    close: async () => {
      await chain.catch(() => {});
      writer.releaseLock();
    },
  };
}

/**
 * The server's stderr and the relay's notes, rate-capped; writes never block
 * the reading of the server's stderr (at most one write is in flight, what
 * comes meanwhile beyond the bucket is dropped and counted).
 */
function stderrLimiter(write: (data: Uint8Array | string) => Promise<void>): {
  forward: (chunk: Uint8Array) => void;
  note: (line: string) => void;
  flush: () => Promise<void>;
} {
  const decoder = new TextDecoder();
  let tokens = STDERR_BURST_BYTES;
  let refilledAt = Date.now();
  let dropped = 0;
  let notes = 0;
  let inFlight: Promise<void> | null = null;
  let queued = "";
  const pump = (): void => {
    if (inFlight !== null || queued === "") return;
    const text = queued;
    queued = "";
    inFlight = write(text).catch(() => {}).finally(() => {
      inFlight = null;
      pump();
    });
  };
  const note = (line: string): void => {
    notes++;
    if (notes > MAX_NOTES) return;
    // A note may quote the server (an invalid message, a method name).
    queued += notes === MAX_NOTES
      ? "waffle: further notes of this session are not shown\n"
      : `${escapeControls(line)}\n`;
    pump();
  };
  return {
    forward(chunk: Uint8Array): void {
      const now = Date.now();
      tokens = Math.min(
        STDERR_BURST_BYTES,
        tokens + ((now - refilledAt) / 1000) * STDERR_BYTES_PER_SECOND,
      );
      refilledAt = now;
      // Queued text counts against the burst too: an unread stderr cannot grow it.
      if (chunk.byteLength > tokens || queued.length > STDERR_BURST_BYTES) {
        if (dropped === 0) note("waffle: server stderr over 64 KiB/s; dropping the excess");
        dropped += chunk.byteLength;
        return;
      }
      tokens -= chunk.byteLength;
      if (dropped > 0) {
        queued += `\nwaffle: dropped ${dropped} bytes of server stderr\n`;
        dropped = 0;
      }
      queued += escapeControls(decoder.decode(chunk, { stream: true }), { keepNewlines: true });
      pump();
    },
    note,
    async flush(): Promise<void> {
      if (dropped > 0) queued += `\nwaffle: dropped ${dropped} bytes of server stderr\n`;
      dropped = 0;
      pump();
      const deadline = Date.now() + DRAIN_MS;
      while (inFlight !== null && Date.now() < deadline) await within(inFlight, DRAIN_MS);
    },
  };
}

async function within<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), ms);
  });
  try {
    return await Promise.race([promise, expired]);
  } finally {
    clearTimeout(timer);
  }
}
