/**
 * The runner: what serves a queue inside the sandbox.
 *
 * @module
 */
export { type RunnerOptions, runRunner } from "./runner.ts";
export { type ExecOutcome, type ExecSpec, runCommand, type RunOptions } from "./exec.ts";
export { enableSubreaper, reapOrphans } from "./subreaper.ts";
