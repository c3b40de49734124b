/**
 * What of a sandbox's terminal output `waffle shell` lets through: what acts
 * on the sandbox's own screen (text, the layout controls, SGR, cursor and
 * erase sequences, scrolling, the alternate screen, bracketed paste, mouse
 * reports, the window title), and none of what acts beyond it or makes the
 * terminal answer with what it knows. Dropped:
 *
 * - every DCS, SOS, PM and APC string (DECRQSS, XTGETTCAP, DECUDK key
 *   programming, tmux passthrough, sixel and kitty images);
 * - every OSC but a title set (0, 1, 2): OSC 52 clipboard writes and reads,
 *   OSC 8 hyperlinks (a link's target is not the text it shows, and a click
 *   hands the target to the desktop), colour sets and queries, notifications,
 *   iTerm2's file transfers, the working-directory report;
 * - window operations and reports (`CSI … t`: move, resize, iconify, the
 *   title report that types an attacker's title back, the title stack),
 *   DECRQCRA and every other `CSI … y`, media copy (`CSI … i`), the
 *   locator, DECSCL and S8C1T (they switch the terminal's replies to 8-bit),
 *   DA3, XTVERSION, the modes that lock the keyboard or turn on local echo,
 *   kitty's keyboard protocol and xterm's modifyOtherKeys (`CSI > 4 ; 2 m`:
 *   keys, `~` among them with some layouts and terminals, would come as
 *   `CSI 27 ; m ; k ~`, and `~.` must come as plain bytes; vim does without);
 * - C0 controls other than BEL BS HT LF VT FF CR SO SI (ENQ makes a
 *   terminal send its answerback), and DEL.
 *
 * Kept queries: DA1 and DA2 (`CSI c`, `CSI > c`), the status and cursor
 * position reports (`CSI 5 n`, `CSI 6 n`, `CSI ? 6 n`) and DECRQM (`CSI ? n
 * $ p`). Their answers are numbers in a fixed shape that neither the sandbox
 * nor a secret of the user's can shape; full-screen programs (vim, less,
 * fish, prompt_toolkit, readline) ask them and some wait for the answer.
 * `query_limit.ts` rations them, so a loop cannot flood the user's input.
 *
 * @module
 */
import type { Token } from "./sequence_reader.ts";

/** C0 controls a program may use to lay out its text. */
const LAYOUT_CONTROLS = new Set(["\x07", "\b", "\t", "\n", "\v", "\f", "\r", "\x0e", "\x0f"]);

/** ESC sequences kept, by intermediates + final: cursor save/restore, keypad, index, tab set, reset, charsets. */
const KEPT_ESC = new Set([
  "7",
  "8",
  "=",
  ">",
  "D",
  "E",
  "H",
  "M",
  "N",
  "O",
  "c",
  "#3",
  "#4",
  "#5",
  "#6",
  "#8",
  ...["(", ")", "*", "+"].flatMap((g) => ["0", "A", "B"].map((set) => g + set)),
]);

/** CSI finals kept with no prefix and no intermediates: cursor, erase, insert/delete, scroll, SGR. */
const KEPT_CSI_FINALS = new Set("@ABCDEFGHIJKLMPSTXZ`abdefgm" + "Irs");

/**
 * DEC private modes kept (`CSI ? n h/l`): cursor keys, reverse video, origin,
 * autowrap, cursor blink and visibility, X10 mouse, the alternate screens
 * and cursor save, keypad, left/right margins, mouse tracking and its
 * encodings, focus reports, bracketed paste, synchronized output. The
 * trailer of `screen_modes.ts` resets each one the session changed (1048
 * saves and restores the cursor: an action, not a state).
 */
export const KEPT_PRIVATE_MODES: ReadonlySet<number> = new Set([
  1,
  5,
  6,
  7,
  9,
  12,
  25,
  47,
  66,
  69,
  1000,
  1002,
  1003,
  1004,
  1005,
  1006,
  1015,
  1016,
  1047,
  1048,
  1049,
  2004,
  2026,
]);

/** ANSI modes kept (`CSI n h/l`): insert (IRM) and new-line (LNM); not KAM (locks the keyboard) nor SRM (local echo). */
export const KEPT_ANSI_MODES: ReadonlySet<number> = new Set([4, 20]);

/**
 * What reaches the terminal for a token: the token, a narrowed copy (a mode
 * sequence without the modes it may not set), or null (dropped).
 *
 * @example
 * ```ts
 * import { screenToken } from "./screen_policy.ts";
 * screenToken({ kind: "osc", data: "52;c;Y3VybCBldmlsIHwgc2g=" }); // null
 * ```
 *
 * @param token A token of the sandbox's output.
 * @returns What to write, or null.
 */
export function screenToken(token: Token): Token | null {
  switch (token.kind) {
    case "text":
      return token;
    case "control":
      return LAYOUT_CONTROLS.has(token.char) ? token : null;
    case "esc":
      return KEPT_ESC.has(token.intermediates + token.final) ? token : null;
    case "csi":
      return csiToken(token);
    case "osc":
      return titleToken(token.data);
    case "string":
    case "ignored":
      return null;
  }
}

type Csi = Extract<Token, { kind: "csi" }>;

function csiToken(token: Csi): Csi | null {
  const { prefix, params, intermediates, final } = token;
  if (intermediates !== "") {
    // DECSCUSR (cursor style), DECSTR (soft reset), DECRQM (mode report).
    const kept = (intermediates === " " && final === "q" && prefix === "") ||
      (intermediates === "!" && final === "p" && prefix === "" && params === "") ||
      (intermediates === "$" && final === "p" && (prefix === "" || prefix === "?"));
    return kept ? token : null;
  }
  if (final === "h" || final === "l") return modesToken(token);
  if (prefix === "") {
    if (KEPT_CSI_FINALS.has(final)) return token;
    if (final === "u") return params === "" ? token : null;
    if (final === "n") return params === "5" || params === "6" ? token : null;
    if (final === "c") return params === "" || params === "0" ? token : null;
    return null;
  }
  if (prefix === "?") {
    if (final === "J" || final === "K") return token;
    return final === "n" && params === "6" ? token : null;
  }
  if (prefix === ">" && final === "c") return params === "" || params === "0" ? token : null;
  return null;
}

// A mode set or reset, narrowed to the modes kept.
function modesToken(token: Csi): Csi | null {
  const kept = token.prefix === "?"
    ? KEPT_PRIVATE_MODES
    : token.prefix === ""
    ? KEPT_ANSI_MODES
    : undefined;
  if (kept === undefined) return null;
  const modes = token.params.split(";").filter((mode) => /^\d{1,5}$/.test(mode))
    .filter((mode) => kept.has(Number(mode)));
  return modes.length === 0 ? null : { ...token, params: modes.join(";") };
}

// A title or icon name set, kept; every other OSC dropped.
function titleToken(data: string | null): Token | null {
  if (data === null) return null;
  const match = /^([012]);(.*)$/s.exec(data);
  return match === null ? null : { kind: "osc", data: `${match[1]};${match[2]}` };
}
