/**
 * The few libc calls the runner needs that Deno does not expose, loaded once
 * through FFI. Linux only; callers treat `undefined` as "not available".
 *
 * @module
 */

const SYMBOLS = {
  prctl: { parameters: ["i32", "u64", "u64", "u64", "u64"], result: "i32" },
  waitpid: { parameters: ["i32", "buffer", "i32"], result: "i32" },
  open: { parameters: ["buffer", "i32", "i32"], result: "i32" },
  flock: { parameters: ["i32", "i32"], result: "i32" },
} as const;

/** The loaded libc symbols. */
export type Libc = Deno.DynamicLibrary<typeof SYMBOLS>["symbols"];

let loaded: Libc | null | undefined;

/**
 * Loads libc once.
 *
 * @returns The symbols, or undefined off Linux or when FFI is not permitted.
 */
export function libc(): Libc | undefined {
  if (loaded === undefined) {
    try {
      loaded = Deno.build.os === "linux" ? Deno.dlopen("libc.so.6", SYMBOLS).symbols : null;
    } catch {
      loaded = null;
    }
  }
  return loaded ?? undefined;
}
