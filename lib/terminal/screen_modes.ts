/**
 * What a session changed in the terminal's modes, from the sequences that
 * reached it, and the trailer that undoes it when the session ends: the
 * terminal goes back to the user's shell as it came, whether the program
 * exited, crashed, was killed or the user left with `~.`.
 *
 * @module
 */
import type { Token } from "./sequence_reader.ts";

/** Private modes that are on in a terminal's initial state (autowrap, cursor shown). */
const ON_BY_DEFAULT: ReadonlySet<number> = new Set([7, 25]);
/** The alternate screens: left by the trailer with the mode that entered them. */
const ALTERNATE_SCREENS: ReadonlySet<number> = new Set([47, 1047, 1049]);
/** ANSI modes that are on initially: SRM (no local echo). */
const ANSI_ON_BY_DEFAULT: ReadonlySet<number> = new Set([12]);

/**
 * Private modes every trailer resets, changed or not (resetting them does
 * nothing else): mouse tracking and its encodings, focus reports, bracketed
 * paste, synchronized output; and the cursor shown.
 */
const ALWAYS_OFF = [9, 1000, 1002, 1003, 1004, 1005, 1006, 1015, 1016, 2004, 2026];
/**
 * The end of every trailer: {@linkcode ALWAYS_OFF}, the cursor shown, the
 * numeric keypad (DECKPNM: `ESC =` is not tracked), SGR reset, G0 US ASCII
 * invoked (SI).
 */
const ALWAYS = `\x1b[?${ALWAYS_OFF.join(";")}l\x1b[?25h\x1b>\x1b[0m\x1b(B\x0f`;
/** Not reset one by one: those above, and 1048 (its reset restores a saved cursor). */
const NOT_ONE_BY_ONE: ReadonlySet<number> = new Set([...ALWAYS_OFF, 25, 1048]);

/** The title stack: pushed when a session starts, popped by its trailer (terminals without one ignore both). */
export const TITLE_PUSH = "\x1b[22;0t";
const TITLE_POP = "\x1b[23;0t";

/**
 * The modes a session changed.
 *
 * @example
 * ```ts
 * import { ScreenModes } from "./screen_modes.ts";
 * const modes = new ScreenModes();
 * modes.observe({ kind: "csi", prefix: "?", params: "1049", intermediates: "", final: "h" });
 * modes.trailer({ open: false }).startsWith("\x1b[?1049l"); // true
 * ```
 */
export class ScreenModes {
  #private = new Map<number, boolean>();
  #ansi = new Map<number, boolean>();
  #alternate: number | null = null;
  #margins = false;
  #tabs = false;
  #cursorStyle = false;
  #modifyKeys = new Set<string>();
  // kitty's keyboard protocol on the main screen: pushes not popped, a set without a push.
  #kitty = { pushes: 0, set: false };

  /**
   * Notes a token that reached the terminal.
   *
   * @param token What was written.
   */
  observe(token: Token): void {
    if (token.kind === "esc") {
      if (token.intermediates === "" && token.final === "c") this.#reset();
      if (token.intermediates === "" && token.final === "H") this.#tabs = true;
      return;
    }
    if (token.kind !== "csi") return;
    const { prefix, params, intermediates, final } = token;
    if (intermediates === "") {
      if (final === "h" || final === "l") return this.#modes(prefix, params, final === "h");
      if (prefix === "" && final === "r") this.#margins = params !== "" && params !== ";";
      if (prefix === "" && final === "g") this.#tabs = true;
      if (prefix === ">" && final === "m") this.#modifyKey(params);
      if (final === "u" && prefix !== "" && prefix !== "?") this.#keyboard(prefix, params);
      return;
    }
    if (intermediates === " " && final === "q" && prefix === "") {
      this.#cursorStyle = params !== "" && params !== "0";
    }
    if (intermediates === "!" && final === "p" && prefix === "") this.#softReset();
  }

  /**
   * The bytes that undo what the session changed, in an order that works:
   * first back to the main screen, then its modes.
   *
   * @param state Whether the output ended inside a sequence (only `--raw` lets one through).
   * @returns The trailer, as text.
   */
  trailer(state: { open: boolean }): string {
    let out = state.open ? "\x18" : "";
    if (this.#alternate !== null) out += `\x1b[?${this.#alternate}l`;
    for (const [mode, on] of this.#private) {
      if (ALTERNATE_SCREENS.has(mode) || NOT_ONE_BY_ONE.has(mode)) continue;
      if (on === ON_BY_DEFAULT.has(mode)) continue;
      out += `\x1b[?${mode}${ON_BY_DEFAULT.has(mode) ? "h" : "l"}`;
    }
    for (const [mode, on] of this.#ansi) {
      if (on !== ANSI_ON_BY_DEFAULT.has(mode)) {
        out += `\x1b[${mode}${ANSI_ON_BY_DEFAULT.has(mode) ? "h" : "l"}`;
      }
    }
    // DECSTBM homes the cursor: keep it where the session left it.
    if (this.#margins) out += "\x1b7\x1b[r\x1b8";
    if (this.#tabs) out += "\x1b[?5W";
    if (this.#cursorStyle) out += "\x1b[0 q";
    for (const resource of this.#modifyKeys) out += `\x1b[>${resource}m`;
    if (this.#kitty.pushes > 0) out += `\x1b[<${this.#kitty.pushes}u`;
    else if (this.#kitty.set) out += "\x1b[=0;1u";
    return out + ALWAYS + TITLE_POP;
  }

  #modes(prefix: string, params: string, on: boolean): void {
    const table = prefix === "?" ? this.#private : prefix === "" ? this.#ansi : undefined;
    if (table === undefined) return;
    for (const field of params.split(";")) {
      if (!/^\d{1,5}$/.test(field)) continue;
      const mode = Number(field);
      table.set(mode, on);
      if (prefix !== "?" || !ALTERNATE_SCREENS.has(mode)) continue;
      if (on) this.#alternate ??= mode;
      else this.#alternate = null;
    }
  }

  // XTMODKEYS: `CSI > Pp ; Pv m` sets a resource, `CSI > Pp m` resets it, `CSI > m` all.
  #modifyKey(params: string): void {
    const [resource = "", value] = params.split(";");
    if (resource === "") this.#modifyKeys.clear();
    else if (value === undefined || value === "") this.#modifyKeys.delete(resource);
    else this.#modifyKeys.add(resource);
  }

  // kitty's keyboard protocol: `CSI > f u` pushes, `CSI < n u` pops, `CSI = f ; m u` sets.
  #keyboard(prefix: string, params: string): void {
    // The alternate screen has a stack of its own, gone with it.
    if (this.#alternate !== null) return;
    if (prefix === ">") this.#kitty.pushes++;
    if (prefix === "<") {
      const popped = /^\d{1,4}$/.test(params) ? Number(params) : 1;
      this.#kitty.pushes = Math.max(0, this.#kitty.pushes - popped);
    }
    if (prefix === "=" && this.#kitty.pushes === 0) this.#kitty.set = true;
  }

  // DECSTR: cursor shown, replace mode, absolute origin, no autowrap, normal keys, no margins.
  #softReset(): void {
    for (
      const [mode, on] of [[25, true], [6, false], [7, false], [1, false], [66, false]] as const
    ) {
      this.#private.set(mode, on);
    }
    this.#ansi.set(4, false);
    this.#margins = false;
  }

  // RIS: the terminal is back in its initial state.
  #reset(): void {
    this.#private.clear();
    this.#ansi.clear();
    this.#alternate = null;
    this.#margins = false;
    this.#tabs = false;
    this.#cursorStyle = false;
    this.#modifyKeys.clear();
    this.#kitty = { pushes: 0, set: false };
  }
}
