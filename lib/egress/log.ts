/**
 * The egress proxy's diagnostics: one timestamped line on stderr (its
 * container's log, which `doctor` shows).
 *
 * @module
 */

const encoder = new TextEncoder();

/**
 * Writes one diagnostic line.
 *
 * @param message The line.
 */
export function egressLog(message: string): void {
  Deno.stderr.writeSync(encoder.encode(`${new Date().toISOString()} waffle egress: ${message}\n`));
}
