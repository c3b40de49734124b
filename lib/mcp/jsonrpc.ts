/**
 * JSON-RPC 2.0 over newline-delimited stdio, as MCP's stdio transport speaks
 * it: a bounded line splitter and zod schemas for the three message kinds.
 * A server's output is untrusted: a line is never buffered beyond
 * {@linkcode MAX_MESSAGE_BYTES}, and every message is validated before the
 * relay looks at it. Unknown fields pass through untouched.
 *
 * @module
 */
import * as z from "../schema.ts";
import { ProtocolError } from "../errors.ts";

/** The longest line (one message, without its newline) either side may send: 4 MiB. */
export const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

/** A JSON-RPC id: a string or a number (null only in an error response to an unreadable request). */
export type JsonRpcId = string | number;

const idSchema = z.union([z.string().check(z.maxLength(4096)), z.number()]);
const paramsSchema = z.union([z.record(z.string(), z.unknown()), z.array(z.unknown())]);

/** A request: `{jsonrpc: "2.0", id, method, params?}`. */
export const requestSchema = z.looseObject({
  jsonrpc: z.literal("2.0"),
  id: idSchema,
  method: z.string().check(z.minLength(1), z.maxLength(4096)),
  params: z.optional(paramsSchema),
});

/** A notification: `{jsonrpc: "2.0", method, params?}`, without an id. */
export const notificationSchema = z.looseObject({
  jsonrpc: z.literal("2.0"),
  method: z.string().check(z.minLength(1), z.maxLength(4096)),
  params: z.optional(paramsSchema),
});

/** An error object of a response. */
export const errorObjectSchema = z.looseObject({
  code: z.int(),
  message: z.string(),
  data: z.optional(z.unknown()),
});

/** A response: `{jsonrpc: "2.0", id, result}` or `{jsonrpc: "2.0", id, error}`, exactly one of them. */
export const responseSchema = z.looseObject({
  jsonrpc: z.literal("2.0"),
  id: z.nullable(idSchema),
  result: z.optional(z.unknown()),
  error: z.optional(errorObjectSchema),
}).check(z.refine((m) => Object.hasOwn(m, "result") !== Object.hasOwn(m, "error"), {
  error: "a response has exactly one of 'result' and 'error'",
}));

/** A validated request. */
export type JsonRpcRequest = z.infer<typeof requestSchema>;
/** A validated notification. */
export type JsonRpcNotification = z.infer<typeof notificationSchema>;
/** A validated response. */
export type JsonRpcResponse = z.infer<typeof responseSchema>;

/** One validated message, tagged with its kind. */
export type JsonRpcMessage =
  | { kind: "request"; message: JsonRpcRequest }
  | { kind: "notification"; message: JsonRpcNotification }
  | { kind: "response"; message: JsonRpcResponse };

/** A line longer than {@linkcode MAX_MESSAGE_BYTES}: the session cannot continue. */
export class MessageTooLargeError extends ProtocolError {
  /**
   * Creates the error.
   *
   * @param limit The byte limit that was exceeded.
   */
  constructor(limit: number) {
    super(`Message longer than ${limit} bytes; the session cannot continue`);
    this.name = "MessageTooLargeError";
  }
}

/**
 * Splits a byte stream into lines (without `\n`, and without a `\r` before
 * it). Never holds more than `maxBytes` of one line: a longer line throws
 * {@linkcode MessageTooLargeError}. A last line without a newline is
 * yielded too. Empty lines are skipped.
 *
 * @example
 * ```ts
 * const stream = ReadableStream.from([new TextEncoder().encode('{"a":1}\n{"b"'), new TextEncoder().encode(':2}\n')]);
 * for await (const line of readLines(stream)) console.log(new TextDecoder().decode(line));
 * ```
 *
 * @param stream The bytes.
 * @param options The line limit (default {@linkcode MAX_MESSAGE_BYTES}), and a signal that
 *   stops reading (the stream is cancelled).
 * @returns The lines, as bytes.
 * @throws {MessageTooLargeError} When a line exceeds the limit.
 */
export async function* readLines(
  stream: ReadableStream<Uint8Array>,
  options: { maxBytes?: number; signal?: AbortSignal | undefined } = {},
): AsyncGenerator<Uint8Array, void, undefined> {
  const limit = options.maxBytes ?? MAX_MESSAGE_BYTES;
  const reader = stream.getReader();
  // A pending read ends (done) when the signal cancels the reader.
  const stop = (): void => void reader.cancel().catch(() => {});
  if (options.signal?.aborted) stop();
  options.signal?.addEventListener("abort", stop, { once: true });
  // One growing buffer, not a list of pieces: a server writing a byte at a
  // time must cost the limit in memory, not a few hundred bytes per byte.
  let buffer = new Uint8Array(0);
  let held = 0;
  const append = (piece: Uint8Array): void => {
    if (held + piece.byteLength > buffer.byteLength) {
      const grown = new Uint8Array(
        Math.min(limit, Math.max(held + piece.byteLength, buffer.byteLength * 2, 4096)),
      );
      grown.set(buffer.subarray(0, held));
      buffer = grown;
    }
    buffer.set(piece, held);
    held += piece.byteLength;
  };
  const take = (tail: Uint8Array): Uint8Array => {
    let line: Uint8Array;
    if (held === 0) {
      line = tail;
    } else {
      append(tail);
      line = buffer.slice(0, held);
    }
    held = 0;
    // Big buffers are not kept for the next, usually small, message.
    if (buffer.byteLength > 64 * 1024) buffer = new Uint8Array(0);
    return line.byteLength > 0 && line[line.byteLength - 1] === 0x0d ? line.subarray(0, -1) : line;
  };
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      let chunk = value;
      while (chunk.byteLength > 0) {
        const newline = chunk.indexOf(0x0a);
        if (newline < 0) {
          if (held + chunk.byteLength > limit) throw new MessageTooLargeError(limit);
          // Copied: the producer may reuse its buffer.
          append(chunk);
          break;
        }
        if (held + newline > limit) throw new MessageTooLargeError(limit);
        const line = take(chunk.subarray(0, newline));
        chunk = chunk.subarray(newline + 1);
        if (line.byteLength > 0) yield line.slice();
      }
    }
    if (held > 0) {
      const line = take(new Uint8Array(0));
      if (line.byteLength > 0) yield line;
    }
  } finally {
    options.signal?.removeEventListener("abort", stop);
    // Ends the source too when the consumer stops early.
    await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * Parses and validates one line as a JSON-RPC message. Batches (arrays) are
 * not part of MCP and are rejected.
 *
 * @example
 * ```ts
 * const parsed = parseMessage(new TextEncoder().encode('{"jsonrpc":"2.0","method":"x"}'));
 * if ("kind" in parsed) console.log(parsed.kind); // "notification"
 * ```
 *
 * @param line One line, without its newline.
 * @returns The tagged message, or a one-line reason it is invalid.
 */
export function parseMessage(line: Uint8Array): JsonRpcMessage | { invalid: string } {
  let value: unknown;
  try {
    value = JSON.parse(decoder.decode(line));
  } catch (error) {
    return {
      invalid: error instanceof TypeError ? "not UTF-8" : `not JSON (${firstLine(error)})`,
    };
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    return { invalid: "not a JSON-RPC object" };
  }
  const record = value as Record<string, unknown>;
  if (Object.hasOwn(record, "method")) {
    if (Object.hasOwn(record, "id")) {
      const request = requestSchema.safeParse(value);
      return request.success
        ? { kind: "request", message: request.data }
        : { invalid: `invalid request: ${issueText(request.error)}` };
    }
    const notification = notificationSchema.safeParse(value);
    return notification.success
      ? { kind: "notification", message: notification.data }
      : { invalid: `invalid notification: ${issueText(notification.error)}` };
  }
  const response = responseSchema.safeParse(value);
  return response.success
    ? { kind: "response", message: response.data }
    : { invalid: `invalid response: ${issueText(response.error)}` };
}

/**
 * A map key for a JSON-RPC id that keeps `1` and `"1"` apart.
 *
 * @example
 * ```ts
 * idKey(1) !== idKey("1"); // true
 * ```
 *
 * @param id The id.
 * @returns The key.
 */
export function idKey(id: JsonRpcId): string {
  return `${typeof id}:${id}`;
}

/**
 * One message as a line of bytes (JSON and a newline).
 *
 * @example
 * ```ts
 * const bytes = encodeMessage({ jsonrpc: "2.0", method: "notifications/initialized" });
 * ```
 *
 * @param message The message.
 * @returns Its line.
 */
export function encodeMessage(message: unknown): Uint8Array {
  return new TextEncoder().encode(`${JSON.stringify(message)}\n`);
}

function issueText(error: z.core.$ZodError): string {
  const issue = error.issues[0];
  if (issue === undefined) return "unknown problem";
  const path = issue.path.length === 0 ? "" : `'${issue.path.join(".")}' `;
  return `${path}${issue.message}`;
}

function firstLine(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split("\n")[0]!.slice(0, 200);
}
