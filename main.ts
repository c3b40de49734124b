/**
 * waffle's entry point: `waffle <command> …`.
 *
 * @module
 */
import { processIo, runCli } from "./lib/cli/mod.ts";

if (import.meta.main) {
  Deno.exit(await runCli(Deno.args, processIo()));
}
