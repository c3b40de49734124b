/**
 * waffle's entry point: `waffle <command> …`. Started as the runner's
 * heartbeat worker (the bundled artefact is its own worker), it runs only
 * the heartbeat.
 *
 * @module
 */
import { HEARTBEAT_WORKER } from "./runner/worker_name.ts";

if ((globalThis as { name?: unknown }).name === HEARTBEAT_WORKER) {
  await import("./runner/heartbeat_worker.ts");
} else if (import.meta.main) {
  const { processIo, runCli } = await import("./lib/cli/mod.ts");
  const { mark } = await import("./lib/trace.ts");
  mark("main loaded");
  Deno.exit(await runCli(Deno.args, processIo()));
}
