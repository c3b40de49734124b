/**
 * A streaming reader of what a program writes to a terminal: text, control
 * characters and ECMA-48 sequences (ESC, CSI, OSC, and the DCS, SOS, PM and
 * APC strings), in the states of the VT500 parser terminals use
 * (vt100.net/emu/dec_ansi_parser), fed decoded text in any pieces. A
 * sequence split across pieces is held until it ends; what it holds is
 * bounded ({@linkcode MAX_SEQUENCE_CHARS}): past it the sequence is read to
 * its end and reported as over the cap, its content dropped. The C1 controls
 * (U+0080 to U+009F) act as their ESC forms, as terminals treat them.
 *
 * @module
 */

/** Most characters of one CSI sequence or OSC string held; a longer one is reported without its content. */
export const MAX_SEQUENCE_CHARS = 1024;
/** Most intermediate characters of an ESC sequence (terminals define none longer than 2). */
const MAX_ESC_INTERMEDIATES = 4;

/** One thing a program wrote to its terminal. */
export type Token =
  /** Printable text. */
  | { kind: "text"; text: string }
  /** A C0 control or DEL (executed even inside a sequence, as terminals do). */
  | { kind: "control"; char: string }
  /** `ESC intermediates final` (or a single C1 control). */
  | { kind: "esc"; intermediates: string; final: string }
  /** `CSI prefix params intermediates final`; prefix is one of `<=>?` or empty. */
  | { kind: "csi"; prefix: string; params: string; intermediates: string; final: string }
  /** An OSC string; `data` null when it went over the cap. */
  | { kind: "osc"; data: string | null }
  /** A DCS, SOS, PM or APC string (its content is never kept), by its ESC letter. */
  | { kind: "string"; introducer: "P" | "X" | "^" | "_" }
  /** A sequence a terminal ignores: malformed, over the cap, or cancelled by CAN or SUB. */
  | { kind: "ignored" };

type State =
  | "ground"
  | "escape"
  | "escapeIntermediate"
  | "csi"
  | "csiIgnore"
  | "osc"
  | "oscEscape"
  | "string"
  | "stringEscape";

const ESC = "\x1b";
const CAN = "\x18";
const SUB = "\x1a";
const BEL = "\x07";

/**
 * The reader. `feed` returns the tokens the text completes; a sequence still
 * open stays inside until a later `feed` ends it.
 *
 * @example
 * ```ts
 * import { SequenceReader } from "./sequence_reader.ts";
 * const reader = new SequenceReader();
 * reader.feed("a\x1b[3"); // [{ kind: "text", text: "a" }]
 * reader.feed("1mb"); // the CSI token (final "m"), then the text "b"
 * ```
 */
export class SequenceReader {
  #state: State = "ground";
  #prefix = "";
  #params = "";
  #intermediates = "";
  #data = "";
  #over = false;
  #introducer: "P" | "X" | "^" | "_" = "P";

  /** Whether a sequence is open (begun and not ended). */
  get inSequence(): boolean {
    return this.#state !== "ground";
  }

  /**
   * Reads more text.
   *
   * @param text Decoded text, any piece of the stream.
   * @returns The tokens it completes, in order.
   */
  feed(text: string): Token[] {
    const tokens: Token[] = [];
    let i = 0;
    while (i < text.length) {
      if (this.#state === "ground") {
        const end = textEnd(text, i);
        if (end > i) {
          tokens.push({ kind: "text", text: text.slice(i, end) });
          i = end;
          continue;
        }
      }
      this.#step(text[i]!, tokens);
      i++;
    }
    return tokens;
  }

  #step(char: string, tokens: Token[]): void {
    const code = char.charCodeAt(0);
    if (code >= 0x80 && code <= 0x9f) return this.#c1(code, tokens);
    if (char === CAN || char === SUB) {
      if (this.#state !== "ground") tokens.push({ kind: "ignored" });
      this.#state = "ground";
      return;
    }
    switch (this.#state) {
      case "ground":
        return this.#ground(char, tokens);
      case "escape":
      case "escapeIntermediate":
        return this.#escape(char, tokens);
      case "csi":
      case "csiIgnore":
        return this.#csi(char, tokens);
      case "osc":
      case "oscEscape":
        return this.#osc(char, tokens);
      case "string":
      case "stringEscape":
        return this.#string(char, tokens);
    }
  }

  // A C1 control ends whatever is open (an OSC or a string ends, ST or not)
  // and acts as its ESC form.
  #c1(code: number, tokens: Token[]): void {
    this.#closeString(tokens);
    this.#state = "escape";
    this.#intermediates = "";
    if (code === 0x9c) {
      // ST: it ended the string above, if one was open.
      this.#state = "ground";
      return;
    }
    this.#escape(String.fromCharCode(code - 0x40), tokens);
  }

  // An OSC or string open when something else ends it.
  #closeString(tokens: Token[]): void {
    if (this.#state === "osc" || this.#state === "oscEscape") {
      tokens.push({ kind: "osc", data: this.#over ? null : this.#data });
    } else if (this.#state === "string" || this.#state === "stringEscape") {
      tokens.push({ kind: "string", introducer: this.#introducer });
    } else if (this.#state !== "ground") {
      tokens.push({ kind: "ignored" });
    }
  }

  #ground(char: string, tokens: Token[]): void {
    if (char === ESC) {
      this.#state = "escape";
      this.#intermediates = "";
      return;
    }
    tokens.push({ kind: "control", char });
  }

  #escape(char: string, tokens: Token[]): void {
    const code = char.charCodeAt(0);
    if (char === ESC) {
      tokens.push({ kind: "ignored" });
      this.#intermediates = "";
      this.#state = "escape";
      return;
    }
    if (code < 0x20) return void tokens.push({ kind: "control", char });
    if (code === 0x7f) return;
    if (code <= 0x2f) {
      this.#intermediates += char;
      this.#state = "escapeIntermediate";
      if (this.#intermediates.length > MAX_ESC_INTERMEDIATES) {
        this.#intermediates = "";
        this.#open("csiIgnore");
      }
      return;
    }
    if (this.#state === "escape") {
      if (char === "[") return this.#open("csi");
      if (char === "]") return this.#open("osc");
      if (char === "P" || char === "X" || char === "^" || char === "_") {
        this.#introducer = char;
        return this.#open("string");
      }
    }
    tokens.push({ kind: "esc", intermediates: this.#intermediates, final: char });
    this.#state = "ground";
  }

  #open(state: State): void {
    this.#state = state;
    this.#prefix = "";
    this.#params = "";
    this.#intermediates = "";
    this.#data = "";
    this.#over = false;
  }

  #csi(char: string, tokens: Token[]): void {
    const code = char.charCodeAt(0);
    if (char === ESC) {
      tokens.push({ kind: "ignored" });
      this.#state = "escape";
      this.#intermediates = "";
      return;
    }
    if (code < 0x20) return void tokens.push({ kind: "control", char });
    if (code === 0x7f) return;
    if (code >= 0x40) {
      if (this.#state === "csi") {
        tokens.push({
          kind: "csi",
          prefix: this.#prefix,
          params: this.#params,
          intermediates: this.#intermediates,
          final: char,
        });
      } else tokens.push({ kind: "ignored" });
      this.#state = "ground";
      return;
    }
    if (this.#state === "csiIgnore") return;
    const length = this.#prefix.length + this.#params.length + this.#intermediates.length;
    if (length >= MAX_SEQUENCE_CHARS) return void (this.#state = "csiIgnore");
    if (code <= 0x2f) {
      this.#intermediates += char;
    } else if (this.#intermediates !== "") {
      // A parameter after an intermediate: malformed.
      this.#state = "csiIgnore";
    } else if (code >= 0x3c) {
      // A private marker is only valid first.
      if (this.#prefix !== "" || this.#params !== "") this.#state = "csiIgnore";
      else this.#prefix = char;
    } else {
      this.#params += char;
    }
  }

  #osc(char: string, tokens: Token[]): void {
    if (this.#state === "oscEscape") {
      tokens.push({ kind: "osc", data: this.#over ? null : this.#data });
      this.#state = "escape";
      this.#intermediates = "";
      // ESC \ is ST; any other ESC sequence starts after the string it ended.
      if (char !== "\\") this.#escape(char, tokens);
      else this.#state = "ground";
      return;
    }
    if (char === BEL) {
      tokens.push({ kind: "osc", data: this.#over ? null : this.#data });
      this.#state = "ground";
      return;
    }
    if (char === ESC) return void (this.#state = "oscEscape");
    // Other controls inside an OSC string are ignored.
    if (char.charCodeAt(0) < 0x20 || this.#over) return;
    if (this.#data.length >= MAX_SEQUENCE_CHARS) {
      this.#over = true;
      this.#data = "";
      return;
    }
    this.#data += char;
  }

  #string(char: string, tokens: Token[]): void {
    if (this.#state === "stringEscape") {
      tokens.push({ kind: "string", introducer: this.#introducer });
      this.#state = "escape";
      this.#intermediates = "";
      if (char !== "\\") this.#escape(char, tokens);
      else this.#state = "ground";
      return;
    }
    if (char === ESC) this.#state = "stringEscape";
  }
}

// Where the run of printable text starting at `from` ends.
function textEnd(text: string, from: number): number {
  let i = from;
  while (i < text.length) {
    const code = text.charCodeAt(i);
    if (code < 0x20 || (code >= 0x7f && code <= 0x9f)) break;
    i++;
  }
  return i;
}
