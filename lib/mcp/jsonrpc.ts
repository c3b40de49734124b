/**
 * JSON-RPC 2.0 over newline-delimited stdio, as MCP's stdio transport speaks
 * it: a bounded line splitter and zod schemas for the three message kinds.
 * A server's output is untrusted: a line is never buffered beyond the
 * server's `max_message_bytes` (a longer one is skipped, and what it was
 * reported, see {@linkcode OversizedLine}), and every message is validated
 * before the relay looks at it. Unknown fields pass through untouched.
 *
 * @module
 */
import * as z from "../schema.ts";
import { DEFAULT_MAX_MESSAGE_BYTES } from "../config/mcp_types.ts";

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

/** A line that is no valid message: why, the JSON-RPC code to answer with, and the id to answer. */
export interface InvalidMessage {
  /** One line: why. */
  invalid: string;
  /** {@linkcode PARSE_ERROR} (not JSON) or {@linkcode INVALID_REQUEST}. */
  code: number;
  /** The message's own id when it had a valid one, else null. */
  id: JsonRpcId | null;
}

/** One validated message, tagged with its kind. */
export type JsonRpcMessage =
  | { kind: "request"; message: JsonRpcRequest }
  | { kind: "notification"; message: JsonRpcNotification }
  | { kind: "response"; message: JsonRpcResponse };

/** JSON-RPC's code for a line that is not JSON. */
export const PARSE_ERROR = -32700;
/** JSON-RPC's code for JSON that is not a valid request. */
export const INVALID_REQUEST = -32600;

/**
 * A line over the limit, skipped without being held: its size, and the
 * top-level `id` and `method` found on the way (enough to answer the
 * request it is, or the request it answers).
 */
export class OversizedLine {
  /** The line's length in bytes. */
  readonly bytes: number;
  /** Its top-level `id`, when it had a string or number one. */
  readonly id: JsonRpcId | undefined;
  /** Its top-level `method`, when it had one. */
  readonly method: string | undefined;

  /**
   * Records a skipped line.
   *
   * @param bytes Its length.
   * @param found Its top-level id and method.
   */
  constructor(bytes: number, found: { id?: JsonRpcId | undefined; method?: string | undefined }) {
    this.bytes = bytes;
    this.id = found.id;
    this.method = found.method;
  }
}

/**
 * Splits a byte stream into lines (without `\n`, and without a `\r` before
 * it). Never holds more than `maxBytes` of one line: a longer one is read
 * through to its end and yielded as an {@linkcode OversizedLine}. A last
 * line without a newline is yielded too. Empty lines are skipped.
 *
 * @example
 * ```ts
 * const stream = ReadableStream.from([new TextEncoder().encode('{"a":1}\n{"b"'), new TextEncoder().encode(':2}\n')]);
 * for await (const line of readLines(stream)) console.log(line);
 * ```
 *
 * @param stream The bytes.
 * @param options The line limit (default {@linkcode DEFAULT_MAX_MESSAGE_BYTES}), and a signal that
 *   stops reading (the stream is cancelled).
 * @returns The lines, as bytes, or what an oversized one was.
 */
export async function* readLines(
  stream: ReadableStream<Uint8Array>,
  options: { maxBytes?: number; signal?: AbortSignal | undefined } = {},
): AsyncGenerator<Uint8Array | OversizedLine, void, undefined> {
  const limit = options.maxBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const reader = stream.getReader();
  // A pending read ends (done) when the signal cancels the reader.
  const stop = (): void => void reader.cancel().catch(() => {});
  if (options.signal?.aborted) stop();
  options.signal?.addEventListener("abort", stop, { once: true });
  const line = new LineBuffer(limit);
  // The oversized line being read through, if any.
  let skipping: { scanner: TopLevelScanner; bytes: number } | undefined;
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      let chunk = value;
      while (chunk.byteLength > 0) {
        const newline = chunk.indexOf(0x0a);
        const piece = newline < 0 ? chunk : chunk.subarray(0, newline);
        if (skipping === undefined && line.held + piece.byteLength > limit) {
          skipping = { scanner: new TopLevelScanner(), bytes: line.held };
          skipping.scanner.feed(line.drop());
        }
        if (skipping !== undefined) {
          skipping.scanner.feed(piece);
          skipping.bytes += piece.byteLength;
        } else {
          // Copied: the producer may reuse its buffer.
          line.append(piece);
        }
        if (newline < 0) break;
        chunk = chunk.subarray(newline + 1);
        if (skipping !== undefined) {
          yield new OversizedLine(skipping.bytes, skipping.scanner.found);
          skipping = undefined;
        } else {
          const taken = line.take();
          if (taken.byteLength > 0) yield taken;
        }
      }
    }
    if (skipping !== undefined) yield new OversizedLine(skipping.bytes, skipping.scanner.found);
    const last = line.take();
    if (last.byteLength > 0) yield last;
  } finally {
    options.signal?.removeEventListener("abort", stop);
    // Ends the source too when the consumer stops early.
    await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

// One growing buffer, not a list of pieces: a server writing a byte at a
// time must cost the limit in memory, not a few hundred bytes per byte.
class LineBuffer {
  held = 0;
  #buffer = new Uint8Array(0);
  #limit: number;

  constructor(limit: number) {
    this.#limit = limit;
  }

  append(piece: Uint8Array): void {
    if (this.held + piece.byteLength > this.#buffer.byteLength) {
      const grown = new Uint8Array(
        Math.min(
          this.#limit,
          Math.max(this.held + piece.byteLength, this.#buffer.byteLength * 2, 4096),
        ),
      );
      grown.set(this.#buffer.subarray(0, this.held));
      this.#buffer = grown;
    }
    this.#buffer.set(piece, this.held);
    this.held += piece.byteLength;
  }

  // The line so far (a copy), without a trailing \r; the buffer starts again.
  take(): Uint8Array {
    let line = this.#buffer.slice(0, this.held);
    this.held = 0;
    // Big buffers are not kept for the next, usually small, message.
    if (this.#buffer.byteLength > 64 * 1024) this.#buffer = new Uint8Array(0);
    if (line.byteLength > 0 && line[line.byteLength - 1] === 0x0d) line = line.subarray(0, -1);
    return line;
  }

  // What is held, given up (the line is too long to keep).
  drop(): Uint8Array {
    const held = this.#buffer.subarray(0, this.held);
    this.#buffer = new Uint8Array(0);
    this.held = 0;
    return held;
  }
}

/** The longest top-level `id` or `method` value an oversized line's scan keeps. */
const MAX_SCANNED_VALUE = 4096;

/**
 * Finds an object's top-level `"id"` and `"method"` in JSON streamed through
 * it, byte by byte, holding nothing but those values: nested keys of the
 * same names (in `params`, `result`) are not taken for them.
 */
class TopLevelScanner {
  #depth = 0;
  #inString = false;
  #escape = false;
  // At depth 1: whether the next string is a key, and the key being read.
  #expectKey = false;
  #key: number[] | undefined;
  #lastKey = "";
  // The value of "id" or "method" being read (raw JSON text).
  #value: number[] | undefined;
  #valueIsString = false;
  #notObject = false;
  #raw: { id?: string; method?: string } = {};

  feed(bytes: Uint8Array): void {
    for (let i = 0; i < bytes.byteLength && !this.#notObject; i++) this.#byte(bytes[i]!);
  }

  get found(): { id?: JsonRpcId | undefined; method?: string | undefined } {
    const parse = (raw: string | undefined): unknown => {
      try {
        return raw === undefined ? undefined : JSON.parse(raw);
      } catch {
        return undefined;
      }
    };
    const id = parse(this.#raw.id);
    const method = parse(this.#raw.method);
    return {
      id: typeof id === "string" || typeof id === "number" ? id : undefined,
      method: typeof method === "string" ? method : undefined,
    };
  }

  #byte(b: number): void {
    if (this.#inString) {
      this.#keep(b);
      if (this.#escape) this.#escape = false;
      else if (b === 0x5c) this.#escape = true;
      else if (b === 0x22) this.#endString();
      return;
    }
    if (this.#value !== undefined && !this.#valueIsString) {
      // A number (or literal) ends at the first byte that cannot be in one.
      if (/[-+.0-9a-zA-Z]/.test(String.fromCharCode(b))) return void this.#keep(b);
      this.#endValue();
    }
    switch (b) {
      case 0x7b: // {
      case 0x5b: // [
        if (this.#depth === 0 && b !== 0x7b) this.#notObject = true;
        this.#depth++;
        this.#expectKey = this.#depth === 1;
        return;
      case 0x7d: // }
      case 0x5d: // ]
        this.#depth--;
        return;
      case 0x2c: // ,
        if (this.#depth === 1) this.#expectKey = true;
        return;
      case 0x22: // "
        this.#inString = true;
        if (this.#depth === 1 && this.#expectKey) this.#key = [];
        else if (this.#depth === 1 && this.#wanted()) this.#startValue(true, b);
        return;
      case 0x3a: // :
        return;
      default:
        if (this.#depth === 0 && b > 0x20) this.#notObject = true;
        else if (this.#depth === 1 && b > 0x20 && this.#wanted()) this.#startValue(false, b);
    }
  }

  #wanted(): boolean {
    return (this.#lastKey === "id" || this.#lastKey === "method") &&
      this.#raw[this.#lastKey] === undefined && this.#value === undefined;
  }

  #startValue(isString: boolean, first: number): void {
    this.#value = [first];
    this.#valueIsString = isString;
  }

  #keep(b: number): void {
    if (this.#key !== undefined && this.#key.length < 16) this.#key.push(b);
    if (this.#value !== undefined && this.#value.length < MAX_SCANNED_VALUE) this.#value.push(b);
  }

  #endString(): void {
    this.#inString = false;
    if (this.#key !== undefined) {
      // Without its closing quote.
      this.#lastKey = String.fromCharCode(...this.#key.slice(0, -1));
      this.#key = undefined;
      this.#expectKey = false;
    } else if (this.#value !== undefined) {
      this.#endValue();
    }
  }

  #endValue(): void {
    const key = this.#lastKey as "id" | "method";
    this.#raw[key] = new TextDecoder().decode(new Uint8Array(this.#value!));
    this.#value = undefined;
    this.#lastKey = "";
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
 * @returns The tagged message, or why it is invalid.
 */
export function parseMessage(line: Uint8Array): JsonRpcMessage | InvalidMessage {
  let value: unknown;
  try {
    value = JSON.parse(decoder.decode(line));
  } catch (error) {
    return {
      invalid: error instanceof TypeError ? "not UTF-8" : `not JSON (${firstLine(error)})`,
      code: PARSE_ERROR,
      id: null,
    };
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    return { invalid: "not a JSON-RPC object", code: INVALID_REQUEST, id: null };
  }
  const record = value as Record<string, unknown>;
  // An invalid request is answered with its own id when it has a usable one.
  const id = idSchema.safeParse(record.id);
  const invalid = (what: string, error: z.core.$ZodError): InvalidMessage => ({
    invalid: `invalid ${what}: ${issueText(error)}`,
    code: INVALID_REQUEST,
    id: id.success ? id.data : null,
  });
  if (Object.hasOwn(record, "method")) {
    if (Object.hasOwn(record, "id")) {
      const request = requestSchema.safeParse(value);
      return request.success
        ? { kind: "request", message: request.data }
        : invalid("request", request.error);
    }
    const notification = notificationSchema.safeParse(value);
    return notification.success
      ? { kind: "notification", message: notification.data }
      : invalid("notification", notification.error);
  }
  const response = responseSchema.safeParse(value);
  return response.success
    ? { kind: "response", message: response.data }
    : invalid("response", response.error);
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
