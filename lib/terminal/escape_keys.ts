/**
 * The keys that end a session from the user's side, as ssh's escape
 * character: at the start of a line (the session's start, or after Enter),
 * `~.` ends the session and `~~` sends one `~`. A `~` followed by anything
 * else is sent with it. A `~` at the start of a line is held until the next
 * key says which it is.
 *
 * What the terminal sends on its own arrives on the same stdin as the keys:
 * the answers to the queries the session may ask (DSR, DA, DECRQM), mouse
 * and focus reports. A sandbox could make them land between Enter and `~`
 * and so keep `~.` from working; so every escape sequence that comes in
 * (CSI, SS3, an X10 mouse report's three raw bytes) is forwarded without
 * changing whether a line starts, and a held `~` stays held across one. A
 * function or arrow key is such a sequence too. Text between the bracketed
 * paste markers (`ESC [ 200 ~` … `ESC [ 201 ~`) is data: a `~.` in a paste
 * never ends the session.
 *
 * @module
 */

const TILDE = 0x7e;
const DOT = 0x2e;
const CR = 0x0d;
const LF = 0x0a;
const ESC = 0x1b;
/** Longer incoming sequences are taken as keys (no terminal sends one). */
const MAX_SEQUENCE_BYTES = 64;

/** What a chunk of keys comes to. */
export interface EscapeKeysResult {
  /** The keys to send to the session. */
  forward: Uint8Array;
  /** `~.` was typed: end the session (nothing after it is forwarded). */
  disconnect: boolean;
}

// Where an incoming escape sequence is: after ESC, in a CSI, after SS3's O,
// in an X10 mouse report's raw bytes.
type SequenceState = "none" | "esc" | "csi" | "ss3" | "mouse";

/**
 * Reads the user's keys for the escape sequence.
 *
 * @example
 * ```ts
 * import { EscapeKeys } from "./escape_keys.ts";
 * const keys = new EscapeKeys();
 * keys.feed(new TextEncoder().encode("ls\r~~")).forward; // "ls\r~"
 * keys.feed(new TextEncoder().encode("\r\x1b[0n~.")).disconnect; // true
 * ```
 */
export class EscapeKeys {
  #lineStart = true;
  #tilde = false;
  #paste = false;
  #state: SequenceState = "none";
  // The sequence's bytes not forwarded yet (held only while a `~` is held).
  #pending: number[] = [];
  // What came after `ESC [`, and how many bytes the sequence has.
  #body = "";
  #length = 0;
  #mouseLeft = 0;

  /**
   * Reads a chunk of keys.
   *
   * @param keys The bytes the terminal sent.
   * @returns What to forward, and whether `~.` was typed.
   */
  feed(keys: Uint8Array): EscapeKeysResult {
    const out: number[] = [];
    for (const key of keys) {
      if (this.#state !== "none" || key === ESC) {
        if (this.#sequenceByte(key, out)) continue;
      }
      if (this.#paste) {
        out.push(key);
        this.#lineStart = key === CR || key === LF;
        continue;
      }
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
    if (!this.#tilde) out.push(...this.#pending.splice(0));
    return { forward: new Uint8Array(out), disconnect: false };
  }

  // One byte of an incoming sequence (or the ESC that starts one); false
  // when the byte is not part of one and is read as a key.
  #sequenceByte(key: number, out: number[]): boolean {
    const state = this.#state;
    if (state === "none" || (key === ESC && state !== "mouse")) {
      // An ESC in a sequence cuts it short: what came is a key, a new one starts.
      if (state !== "none") this.#endSequence(out, { key: true });
      this.#state = "esc";
      this.#body = "";
      this.#length = 0;
      this.#add(key);
      return true;
    }
    if (state === "mouse") {
      this.#add(key);
      if (--this.#mouseLeft === 0) this.#endSequence(out, { key: false });
      return true;
    }
    if (state === "esc") {
      if (key === 0x5b || key === 0x4f) {
        this.#state = key === 0x5b ? "csi" : "ss3";
        this.#add(key);
        return true;
      }
      // ESC and a key: Alt and that key, typed.
      this.#add(key);
      this.#endSequence(out, { key: true });
      return true;
    }
    if (key < 0x20 || key > 0x7e || this.#length >= MAX_SEQUENCE_BYTES) {
      // Not a sequence after all: what came is keys, this byte is read on its own.
      this.#endSequence(out, { key: true });
      return false;
    }
    this.#add(key);
    this.#body += String.fromCharCode(key);
    if (state === "ss3") this.#endSequence(out, { key: false });
    else if (key >= 0x40) this.#csiFinal(out);
    return true;
  }

  // A CSI's final byte: an X10 mouse report goes on for three raw bytes; the paste markers switch paste.
  #csiFinal(out: number[]): void {
    const body = this.#body;
    if (body === "M") {
      this.#state = "mouse";
      this.#mouseLeft = 3;
      return;
    }
    if (body === "200~" && !this.#paste) {
      // A paste after a held `~`: the `~` was a key.
      if (this.#tilde) this.#releaseTilde(out);
      this.#paste = true;
    } else if (body === "201~") this.#paste = false;
    this.#endSequence(out, { key: false });
  }

  #add(key: number): void {
    this.#pending.push(key);
    this.#length++;
  }

  // The sequence is over: forwarded; a key typed (Alt and a key) releases a
  // held `~` before it, a report or a key's sequence leaves it held.
  #endSequence(out: number[], how: { key: boolean }): void {
    this.#state = "none";
    if (how.key && !this.#paste) {
      if (this.#tilde) this.#releaseTilde(out);
      this.#lineStart = false;
    }
    out.push(...this.#pending.splice(0));
  }

  #releaseTilde(out: number[]): void {
    this.#tilde = false;
    this.#lineStart = false;
    out.push(TILDE);
  }
}
