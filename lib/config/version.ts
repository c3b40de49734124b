/**
 * waffle's version, from `deno.json` (the one place it is written). Its own
 * module, so `waffle --version` loads nothing else.
 *
 * @module
 */
import manifest from "../../deno.json" with { type: "json" };

/** waffle's version, as `deno.json` states it. */
export const WAFFLE_VERSION: string = manifest.version;
