/**
 * The one owner of "text from the sandbox, printed on a terminal": control
 * characters in it are shown as escapes, never sent to the terminal, so a
 * runner's error text, a file name from a sandbox or an MCP server's message
 * cannot move the cursor, set the clipboard, rename the window or forge a
 * line of waffle's own.
 *
 * On a terminal whose locale is not UTF-8 a character whose UTF-8 bytes
 * hold one in 0x80–0x9F (U+00DD is C3 9D, and 0x9D is OSC to a latin-1
 * terminal) is escaped too.
 *
 * @module
 */
import { terminalIsUtf8 } from "./locale.ts";

const encoder = new TextEncoder();

// C0 controls, DEL and C1 controls; and the format characters that reorder
// what a terminal shows (bidi embeddings, overrides and isolates, the marks).
// deno-lint-ignore no-control-regex
const CONTROLS = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

/** Options of {@linkcode escapeControls}. */
export interface EscapeControlsOptions {
  /** Keep line feeds as they are (multi-line text such as a stack); default: escaped. */
  keepNewlines?: boolean;
  /** The terminal reads UTF-8; default: from the locale ({@linkcode terminalIsUtf8}). */
  utf8?: boolean;
}

/**
 * Escapes control characters for printing on a terminal: `\t` stays, every
 * other C0 control, DEL, every C1 control and the bidi format characters
 * become `\xNN` / `\uNNNN` (a line feed too, unless kept). Backslashes are
 * left as they are: the text stays readable, and nothing escaped can act.
 * When the terminal does not read UTF-8, a character with a byte in
 * 0x80–0x9F in its UTF-8 form becomes `\uNNNN` (`\u{NNNNN}` beyond the BMP).
 *
 * @example
 * ```ts
 * import { escapeControls } from "./control_text.ts";
 * escapeControls("bad\x1b]52;c;Y3VybA==\x07"); // "bad\\x1b]52;c;Y3VybA==\\x07"
 * ```
 *
 * @param text Text from the sandbox (or anything quoting it).
 * @param options Whether line feeds stay, whether the terminal reads UTF-8.
 * @returns The text, safe to print.
 */
export function escapeControls(text: string, options: EscapeControlsOptions = {}): string {
  const escaped = text.replace(CONTROLS, (char) => {
    if (char === "\t" || (char === "\n" && options.keepNewlines === true)) return char;
    const code = char.charCodeAt(0);
    return code <= 0xff
      ? `\\x${code.toString(16).padStart(2, "0")}`
      : `\\u${code.toString(16).padStart(4, "0")}`;
  });
  if (options.utf8 ?? terminalIsUtf8()) return escaped;
  // deno-lint-ignore no-control-regex
  return escaped.replace(/[^\u0000-\u007f]/gu, (char) => {
    if (!encoder.encode(char).some((byte) => byte >= 0x80 && byte <= 0x9f)) return char;
    const code = char.codePointAt(0)!;
    return code > 0xffff ? `\\u{${code.toString(16)}}` : `\\u${code.toString(16).padStart(4, "0")}`;
  });
}
