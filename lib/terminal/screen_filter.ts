/**
 * The stream between a sandbox's terminal and the user's: a state machine
 * over the bytes in any chunks (a sequence split across chunks is held until
 * it ends, in bounded memory) that lets through what {@linkcode screenToken}
 * keeps, notes the modes the session changes, and ends with the trailer that
 * restores them. With `raw`, every byte passes unchanged and the modes are
 * still noted and restored.
 *
 * Text is read as UTF-8: a byte that is not part of a well-formed character
 * becomes U+FFFD, so a lone 8-bit C1 byte (0x9B is CSI to a terminal that is
 * not in UTF-8 mode) never reaches the terminal. On a terminal whose locale
 * is not UTF-8 (`utf8: false`), every non-ASCII character is written as `?`:
 * to a latin-1 terminal the bytes of a valid character such as U+00DD (C3
 * 9D) hold a C1 control (0x9D is OSC).
 *
 * The queries the policy keeps are rationed ({@linkcode QueryLimit}).
 *
 * @module
 */
import { SequenceReader, type Token } from "./sequence_reader.ts";
import { screenToken } from "./screen_policy.ts";
import { ScreenModes, TITLE_PUSH } from "./screen_modes.ts";
import { QueryLimit } from "./query_limit.ts";

const encoder = new TextEncoder();

/** Options of a {@linkcode ScreenFilter}. */
export interface ScreenFilterOptions {
  /** Pass every byte unchanged (modes are still restored at the end). */
  raw?: boolean;
  /** The terminal reads UTF-8 (default); false: non-ASCII text is written as `?` (see `localeIsUtf8`). */
  utf8?: boolean;
  /** The clock the query budget counts with, in milliseconds (default `performance.now`). */
  now?: () => number;
}

/**
 * One session's output filter.
 *
 * @example
 * ```ts
 * import { ScreenFilter } from "./screen_filter.ts";
 * const filter = new ScreenFilter();
 * const bytes = new TextEncoder().encode("hi \x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07there");
 * new TextDecoder().decode(filter.push(bytes)); // "hi there"
 * ```
 */
export class ScreenFilter {
  readonly #raw: boolean;
  readonly #decoder = new TextDecoder();
  readonly #reader = new SequenceReader();
  readonly #modes = new ScreenModes();
  readonly #utf8: boolean;
  readonly #queries: QueryLimit;
  #ended = false;

  /**
   * @param options Whether to pass every byte unchanged, whether the terminal reads UTF-8, the clock.
   */
  constructor(options: ScreenFilterOptions = {}) {
    this.#raw = options.raw === true;
    this.#utf8 = options.utf8 !== false;
    this.#queries = new QueryLimit(options.now);
  }

  /**
   * What to write before the session's first output: the window title is
   * pushed on the terminal's title stack (the trailer pops it).
   *
   * @returns The bytes.
   */
  start(): Uint8Array {
    return encoder.encode(TITLE_PUSH);
  }

  /**
   * Filters a chunk of the session's output.
   *
   * @param chunk The bytes, as the session wrote them.
   * @returns What reaches the terminal (possibly empty).
   */
  push(chunk: Uint8Array): Uint8Array {
    if (this.#ended) return new Uint8Array();
    const out = this.#filter(this.#decoder.decode(chunk, { stream: true }));
    return this.#raw ? chunk : encoder.encode(out);
  }

  /**
   * Ends the output: what is left of it (a sequence never ended is
   * dropped), then the trailer that restores the terminal's modes. Later
   * calls return nothing.
   *
   * @returns The bytes.
   */
  end(): Uint8Array {
    if (this.#ended) return new Uint8Array();
    const rest = this.#filter(this.#decoder.decode());
    this.#ended = true;
    const open = this.#raw && this.#reader.inSequence;
    return encoder.encode((this.#raw ? "" : rest) + this.#modes.trailer({ open }));
  }

  // The text that reaches the terminal (in raw mode: the modes noted, nothing returned).
  #filter(text: string): string {
    let out = "";
    for (const token of this.#reader.feed(text)) {
      const kept = this.#raw ? token : screenToken(token);
      if (kept === null) continue;
      if (!this.#raw && !this.#queries.allows(kept)) continue;
      this.#modes.observe(kept);
      if (!this.#raw) out += serialize(kept);
    }
    // deno-lint-ignore no-control-regex
    return this.#utf8 ? out : out.replace(/[^\u0000-\u007f]/gu, "?");
  }
}

function serialize(token: Token): string {
  switch (token.kind) {
    case "text":
      return token.text;
    case "control":
      return token.char;
    case "esc":
      return `\x1b${token.intermediates}${token.final}`;
    case "csi":
      return `\x1b[${token.prefix}${token.params}${token.intermediates}${token.final}`;
    case "osc":
      return token.data === null ? "" : `\x1b]${token.data}\x07`;
    case "string":
    case "ignored":
      return "";
  }
}
