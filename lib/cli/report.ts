/**
 * Turns a request's result into the CLI's exit status (by the map in
 * `lib/exit_codes.ts`), stderr notes and `--json` object.
 *
 * @module
 */
import { EXIT_CANCELLED, EXIT_TIMEOUT, EXIT_WAFFLE } from "../exit_codes.ts";
import type { ExecResult } from "../queue/protocol.ts";
import { escapeControls } from "../terminal/control_text.ts";

/**
 * The exit status `waffle exec` returns for a result.
 *
 * @param result The request's result.
 * @returns The exit status.
 */
export function exitStatusOf(result: ExecResult): number {
  if (result.timedOut) return EXIT_TIMEOUT;
  if (result.cancelled) return EXIT_CANCELLED;
  if (result.interrupted || result.exitCode === null) return EXIT_WAFFLE;
  return result.exitCode;
}

/**
 * The line printed on stderr for a result that needs explaining, if any.
 * The runner's error text is the sandbox's: its control characters are
 * escaped.
 *
 * @param id The request id.
 * @param result The request's result.
 * @returns A line without newline, or undefined.
 */
export function noteOf(id: string, result: ExecResult): string | undefined {
  if (result.timedOut) {
    return `waffle: command timed out after ${
      (result.durationMs / 1000).toFixed(1)
    } s (request '${id}')`;
  }
  if (result.cancelled) return `waffle: request '${id}' was cancelled`;
  if (result.interrupted) {
    return `waffle: request '${id}' was interrupted: ${
      escapeControls(result.error ?? "the runner stopped")
    }`;
  }
  if (result.error !== null) return `waffle: ${escapeControls(result.error)}`;
  return undefined;
}

/**
 * The lines printed on stderr, after the command's own output, for each
 * stream the runner cut at the output cap: a truncated output must never
 * pass for the whole of it.
 *
 * @param result The request's result.
 * @param caps The cap each stream was cut at, in bytes.
 * @returns One line (without newline) per truncated stream, stdout first.
 *
 * @example
 * ```ts ignore
 * for (const line of truncationNotesOf(result, { stdout: cap, stderr: cap })) {
 *   await io.stderr(`${line}\n`);
 * }
 * ```
 */
export function truncationNotesOf(
  result: ExecResult,
  caps: Record<"stdout" | "stderr", number>,
): string[] {
  const notes: string[] = [];
  for (const stream of ["stdout", "stderr"] as const) {
    const truncated = stream === "stdout" ? result.stdoutTruncated : result.stderrTruncated;
    const wrote = stream === "stdout" ? result.stdoutBytes : result.stderrBytes;
    if (truncated) {
      const cut = `waffle: ${stream} truncated at ${caps[stream]} bytes`;
      notes.push(`${cut} (the command wrote ${wrote} bytes); raise --output-cap`);
    }
  }
  return notes;
}

/** The `--json` object of `waffle exec` / `waffle wait`. */
export interface ExecJson {
  id: string;
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  interrupted: boolean;
  cancelled: boolean;
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  durationMs: number;
  error: string | null;
}

/**
 * Builds the `--json` object.
 *
 * @param id The request id.
 * @param collected The result and its output.
 * @returns The JSON-ready object.
 */
export function jsonOf(
  id: string,
  collected: { result: ExecResult; stdout: Uint8Array; stderr: Uint8Array },
): ExecJson {
  const { result } = collected;
  const decoder = new TextDecoder();
  return {
    id,
    exitCode: result.exitCode,
    signal: result.signal,
    timedOut: result.timedOut,
    interrupted: result.interrupted,
    cancelled: result.cancelled,
    stdout: decoder.decode(collected.stdout),
    stderr: decoder.decode(collected.stderr),
    stdoutTruncated: result.stdoutTruncated,
    stderrTruncated: result.stderrTruncated,
    durationMs: result.durationMs,
    error: result.error,
  };
}

/**
 * Renders rows (the first one the header) as columns padded to their widest
 * cell, each cell's control characters escaped.
 *
 * @param rows The cells, one array per line.
 * @returns The text, one line per row, ending in a newline.
 */
export function table(cells: string[][]): string {
  const rows = cells.map((row) => row.map((cell) => escapeControls(cell)));
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((row) => row[i]!.length)));
  return rows.map((row) => row.map((cell, i) => cell.padEnd(widths[i]!)).join("  ").trimEnd())
    .join("\n") + "\n";
}
