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
