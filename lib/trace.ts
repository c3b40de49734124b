/**
 * Phase timings for `WAFFLE_TRACE=1`: one stderr line per mark, in
 * milliseconds since the process started, so each piece of a call (module
 * loading, config, lock, Docker, queue) can be measured where users run it.
 *
 * @module
 */

const enabled = (() => {
  try {
    return Deno.env.get("WAFFLE_TRACE") === "1";
  } catch {
    return false;
  }
})();

/**
 * Records that a phase ended (a no-op unless `WAFFLE_TRACE=1`).
 *
 * @param label What just finished.
 */
export function mark(label: string): void {
  if (!enabled) return;
  const ms = performance.now().toFixed(1).padStart(7);
  Deno.stderr.writeSync(new TextEncoder().encode(`trace ${ms} ms  ${label}\n`));
}
