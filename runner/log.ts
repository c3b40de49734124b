/**
 * The runner's diagnostics. They go to stderr (the container's log) unless
 * `--log FILE` redirects them, as a detached host runner has no stderr.
 *
 * @module
 */

const encoder = new TextEncoder();
let sink: (line: string) => void = (line) => void Deno.stderr.writeSync(encoder.encode(line));

/**
 * Sends diagnostics to a file (appending) instead of stderr.
 *
 * @param path The log file.
 */
export function logToFile(path: string): void {
  const file = Deno.openSync(path, { append: true, create: true });
  sink = (line) => void file.writeSync(encoder.encode(line));
}

/**
 * Writes one diagnostic line with a timestamp.
 *
 * @param message The line.
 */
export function logLine(message: string): void {
  sink(`${new Date().toISOString()} waffle runner: ${message}\n`);
}
