/**
 * Every exit status a waffle process returns, in one place. `waffle exec`
 * and `waffle wait` pass the command's own status through and add the
 * shell's conventions (124 timeout, 126 cannot execute, 127 not found,
 * 128+n killed by signal n) plus waffle's own 125; the help texts and
 * README.md describe this map, and the code imports it rather than
 * repeating a number.
 *
 * @module
 */

/** A check failed (`waffle doctor`) or a served MCP server ended first (`waffle mcp run`). */
export const EXIT_FAILURE = 1;
/**
 * The runner stopped because it could not record what it ran (a write kept
 * failing); sysexits' EX_SOFTWARE.
 */
export const EXIT_RUNNER_FAILED = 70;
/** Another runner already serves the queue; sysexits' EX_TEMPFAIL. */
export const EXIT_LOCKED = 75;
/** The command hit its timeout. */
export const EXIT_TIMEOUT = 124;
/** waffle's own failures: bad input, queue or daemon unavailable, request interrupted. */
export const EXIT_WAFFLE = 125;
/** The command exists but cannot be executed. */
export const EXIT_CANNOT_EXECUTE = 126;
/** The command was not found. */
export const EXIT_NOT_FOUND = 127;

/**
 * `waffle shell` ended from the user's terminal with its escape sequence
 * (`~.`), the command's tree killed: ssh's status for its own `~.`.
 */
export const EXIT_DISCONNECTED = 255;

/** Death by signal n exits with this plus n, as shells report it. */
export const EXIT_SIGNAL_BASE = 128;
/** SIGINT's number (Ctrl-C), the same on every Linux architecture. */
const SIGINT_NUMBER = 2;

/**
 * The exit status of a process killed by a signal.
 *
 * @param signal The signal's number, e.g. 15 for SIGTERM.
 * @returns 128 plus the number.
 *
 * @example
 * ```ts
 * import { exitCodeOfSignal } from "./exit_codes.ts";
 * exitCodeOfSignal(9); // 137
 * ```
 */
export function exitCodeOfSignal(signal: number): number {
  return EXIT_SIGNAL_BASE + signal;
}

/** The request was cancelled by Ctrl-C: as if killed by SIGINT. */
export const EXIT_CANCELLED: number = exitCodeOfSignal(SIGINT_NUMBER);
