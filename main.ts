/**
 * waffle's entry point: `waffle <command> …`.
 *
 * @module
 */
if (import.meta.main) {
  const { processIo, runCli } = await import("./lib/cli/mod.ts");
  const { mark } = await import("./lib/trace.ts");
  mark("main loaded");
  Deno.exit(await runCli(Deno.args, processIo()));
}
