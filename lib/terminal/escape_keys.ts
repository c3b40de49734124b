/**
 * The keys that end a session from the user's side, as ssh's escape
 * character: at the start of a line (the session's start, or after Enter),
 * `~.` ends the session and `~~` sends one `~`. A `~` followed by anything
 * else is sent with it. A `~` at the start of a line is held until the next
 * key says which it is.
 *
 * @module
 */

const TILDE = 0x7e;
const DOT = 0x2e;
const CR = 0x0d;
const LF = 0x0a;

/** What a chunk of keys comes to. */
export interface EscapeKeysResult {
  /** The keys to send to the session. */
  forward: Uint8Array;
  /** `~.` was typed: end the session (nothing after it is forwarded). */
  disconnect: boolean;
}

/**
 * Reads the user's keys for the escape sequence.
 *
 * @example
 * ```ts
 * import { EscapeKeys } from "./escape_keys.ts";
 * const keys = new EscapeKeys();
 * keys.feed(new TextEncoder().encode("ls\r~~")).forward; // "ls\r~"
 * keys.feed(new TextEncoder().encode("\r~.")).disconnect; // true
 * ```
 */
export class EscapeKeys {
  #lineStart = true;
  #tilde = false;

  /**
   * Reads a chunk of keys.
   *
   * @param keys The bytes the terminal sent.
   * @returns What to forward, and whether `~.` was typed.
   */
  feed(keys: Uint8Array): EscapeKeysResult {
    const out: number[] = [];
    for (const key of keys) {
      if (this.#tilde) {
        this.#tilde = false;
        if (key === DOT) return { forward: new Uint8Array(out), disconnect: true };
        out.push(TILDE);
        if (key === TILDE) {
          this.#lineStart = false;
          continue;
        }
      } else if (this.#lineStart && key === TILDE) {
        this.#tilde = true;
        continue;
      }
      out.push(key);
      this.#lineStart = key === CR || key === LF;
    }
    return { forward: new Uint8Array(out), disconnect: false };
  }
}
