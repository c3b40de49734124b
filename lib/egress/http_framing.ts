/**
 * Where a request's body ends, as the egress proxy judges it: framing that
 * two parsers could read two ways (`Transfer-Encoding` beside
 * `Content-Length`, two lengths, a coding after `chunked`, a `Connection`
 * header that would make the proxy drop `Host` or the framing itself) is
 * refused, and a tracker finds the end of the one message forwarded, so
 * that bytes after it (a pipelined second request no check has seen) never
 * reach the upstream.
 *
 * @module
 */
import type { Buffer } from "node:buffer";
import { headerValues, type RequestHead } from "./http_head.ts";

/** How a request's body is delimited. */
export type BodyFraming =
  | { kind: "length"; length: number }
  | { kind: "chunked" };

/** Headers a `Connection` header must not name: dropping them would change the request. */
const KEPT_HEADERS = new Set(["host", "content-length", "transfer-encoding"]);

/**
 * The framing of a request's body (none: `{ kind: "length", length: 0 }`).
 *
 * @param head The request head.
 * @returns How its body is delimited.
 * @throws {Error} When the framing is ambiguous, naming why.
 */
export function bodyFraming(head: RequestHead): BodyFraming {
  for (const value of headerValues(head, "connection")) {
    for (const name of value.split(",").map((part) => part.trim().toLowerCase())) {
      if (KEPT_HEADERS.has(name)) {
        throw new Error(`Refused 'Connection: ${value.slice(0, 200)}': it names '${name}'`);
      }
    }
  }
  const lengths = headerValues(head, "content-length");
  const codings = headerValues(head, "transfer-encoding").flatMap((value) =>
    value.split(",").map((part) => part.trim().toLowerCase())
  );
  if (codings.length > 0) {
    if (lengths.length > 0) {
      throw new Error("Refused a request with both Transfer-Encoding and Content-Length");
    }
    if (codings.at(-1) !== "chunked" || codings.indexOf("chunked") !== codings.length - 1) {
      throw new Error(
        `Refused 'Transfer-Encoding: ${
          codings.join(", ").slice(0, 200)
        }': 'chunked' must be last, once`,
      );
    }
    return { kind: "chunked" };
  }
  if (lengths.length > 1) {
    throw new Error(`Refused a request with ${lengths.length} Content-Length headers`);
  }
  const length = lengths[0];
  if (length === undefined) return { kind: "length", length: 0 };
  if (!/^\d{1,15}$/.test(length)) {
    throw new Error(`Refused 'Content-Length: ${length.slice(0, 200)}': not a decimal length`);
  }
  return { kind: "length", length: Number(length) };
}

/** Finds the end of one message's body in the bytes that follow its head. */
export interface BodyTracker {
  /**
   * Takes the next bytes.
   *
   * @returns How many of them belong to the message; fewer than given once it ended.
   * @throws {Error} When a chunked body is malformed.
   */
  take(bytes: Buffer): number;
  /** Whether the message has ended. */
  ended(): boolean;
}

/** The longest chunk-size or trailer line taken. */
const MAX_LINE = 8192;

/**
 * A tracker of one body delimited by `framing`.
 *
 * @param framing From {@linkcode bodyFraming}.
 * @returns The tracker.
 */
export function bodyTracker(framing: BodyFraming): BodyTracker {
  if (framing.kind === "length") {
    let left = framing.length;
    return {
      take: (bytes) => {
        const taken = Math.min(left, bytes.length);
        left -= taken;
        return taken;
      },
      ended: () => left === 0,
    };
  }
  // Chunked: size line, data, CRLF, ... then the last chunk's trailers up to a blank line.
  let state: "size" | "data" | "data-end" | "trailer" | "done" = "size";
  let line = "";
  let left = 0;
  const onLine = (): void => {
    if (state === "size") {
      const size = /^([0-9a-fA-F]{1,15})(?:[ \t]*;.*)?$/.exec(line)?.[1];
      if (size === undefined) throw new Error(`Malformed chunk size '${line.slice(0, 200)}'`);
      left = parseInt(size, 16);
      state = left === 0 ? "trailer" : "data";
    } else if (state === "data-end") {
      if (line !== "") throw new Error("Malformed chunk: no CRLF after its data");
      state = "size";
    } else if (line === "") state = "done";
    line = "";
  };
  return {
    take: (bytes) => {
      let at = 0;
      while (at < bytes.length && state !== "done") {
        if (state === "data") {
          const taken = Math.min(left, bytes.length - at);
          at += taken;
          left -= taken;
          if (left === 0) state = "data-end";
          continue;
        }
        const byte = bytes[at++]!;
        if (byte === 0x0a) {
          if (!line.endsWith("\r")) throw new Error("Malformed chunked body: a bare LF");
          line = line.slice(0, -1);
          onLine();
        } else if ((line += String.fromCharCode(byte)).length > MAX_LINE) {
          throw new Error(`Malformed chunked body: a line over ${MAX_LINE} bytes`);
        }
      }
      return at;
    },
    ended: () => state === "done",
  };
}
