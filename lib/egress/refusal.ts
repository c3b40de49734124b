/**
 * How the egress proxy says no: a refusal by policy (audited `denied`) or a
 * failure that is no refusal (malformed, unreachable), each with the HTTP
 * status and the one-line reason the client gets.
 *
 * @module
 */

/** A refusal by policy: answered to the client (when it still can be) and audited `denied`. */
export class EgressRefused extends Error {
  /**
   * @param status The HTTP status the client gets (403, 429…).
   * @param message One line: capital letter, no trailing period, the client's value quoted.
   * @param options The underlying error, if any.
   */
  constructor(readonly status: number, message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "EgressRefused";
  }
}

/** A failure that is no refusal (malformed, unreachable): the decision stands. */
export class EgressFailed extends Error {
  /**
   * @param status The HTTP status the client gets (400, 502…).
   * @param message One line: capital letter, no trailing period, the client's value quoted.
   * @param options The underlying error, if any.
   */
  constructor(readonly status: number, message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "EgressFailed";
  }
}

/**
 * The HTTP answer to a refusal or failure: its status, its message as a
 * one-line body, and `Connection: close`.
 *
 * @example
 * ```ts
 * import { EgressRefused, refusalResponse } from "./refusal.ts";
 * refusalResponse(new EgressRefused(403, "'x.test:443' is not in this sandbox's egress list"));
 * // "HTTP/1.1 403 Refused by waffle egress\r\n…\r\n\r\n'x.test:443' is not in this sandbox's egress list\n"
 * ```
 *
 * @param error The refusal or failure.
 * @returns The response, head and body.
 */
export function refusalResponse(error: EgressRefused | EgressFailed): string {
  const body = `${error.message}\n`;
  const verdict = error instanceof EgressRefused ? "Refused" : "Failed";
  // The body may hold an ellipsis: its length in bytes, not characters.
  const length = new TextEncoder().encode(body).length;
  return `HTTP/1.1 ${error.status} ${verdict} by waffle egress\r\n` +
    `Content-Type: text/plain; charset=utf-8\r\nContent-Length: ${length}\r\n` +
    `Connection: close\r\n\r\n${body}`;
}
