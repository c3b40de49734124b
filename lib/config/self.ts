/**
 * How waffle starts itself as a runner: the same program, `runner` subcommand.
 *
 * @module
 */
import { fileURLToPath } from "node:url";

/** The program to execute and the arguments that precede `runner …`. */
export interface SelfCommand {
  /** Absolute path of the executable. */
  executable: string;
  /** Arguments before the subcommand. */
  prefix: string[];
  /** Project root when running from source (mounted into containers). */
  sourceRoot: string | undefined;
}

/**
 * The command line that runs this same waffle: the compiled binary itself,
 * or `deno run --allow-all <main.ts>` from source. The runner needs
 * `--allow-all`: it reads /proc (which Deno only allows with all
 * permissions), calls prctl through FFI, and runs arbitrary commands.
 *
 * @returns The executable and argument prefix.
 */
export function selfCommand(): SelfCommand {
  if (Deno.build.standalone) {
    return { executable: Deno.execPath(), prefix: [], sourceRoot: undefined };
  }
  const main = fileURLToPath(new URL("../../main.ts", import.meta.url));
  const sourceRoot = fileURLToPath(new URL("../../", import.meta.url)).replace(/\/$/, "");
  return {
    executable: Deno.execPath(),
    prefix: ["run", "--allow-all", "--quiet", "--no-prompt", main],
    sourceRoot,
  };
}

/** Flags of `waffle runner`, as {@linkcode runnerArgs} renders them. */
export interface RunnerFlags {
  /** Workspace root of the commands. */
  workspace: string;
  /** Idle exit in seconds (0 never); omitted: the runner's default. */
  idleExitSeconds?: number | undefined;
  /** Requests at once. */
  concurrency?: number | undefined;
  /** Fallback poll interval. */
  pollMs?: number | undefined;
  /** Diagnostics file instead of stderr. */
  log?: string | undefined;
}

/**
 * The full argument list (after the executable) that starts a runner on a
 * queue with this same waffle: one place, so the host backend, tests and
 * benchmarks start the runner identically.
 *
 * @param queueDir The queue directory.
 * @param flags The runner's flags.
 * @returns Arguments for {@linkcode selfCommand}'s executable.
 */
export function runnerArgs(queueDir: string, flags: RunnerFlags): string[] {
  const optional: [string, string | number | undefined][] = [
    ["--log", flags.log],
    ["--idle-exit", flags.idleExitSeconds],
    ["--concurrency", flags.concurrency],
    ["--poll-ms", flags.pollMs],
  ];
  return [
    ...selfCommand().prefix,
    "runner",
    "--queue",
    queueDir,
    "--workspace",
    flags.workspace,
    ...optional.flatMap(([flag, value]) => value === undefined ? [] : [flag, String(value)]),
  ];
}
