/**
 * The waffle CLI: subcommand dispatch and the one place errors become output
 * and exit codes.
 *
 * @module
 */
import { UsageError, WaffleError } from "../errors.ts";
import { DOCTOR_HELP, doctorCommand } from "./doctor.ts";
import { EXEC_HELP, execCommand, WAIT_HELP, waitCommand } from "./exec.ts";
import type { CliIo } from "./io.ts";
import { RUNNER_HELP, runnerCommand } from "./runner.ts";
import {
  PS_HELP,
  psCommand,
  RM_HELP,
  rmCommand,
  STOP_HELP,
  stopCommand,
  SWEEP_HELP,
  sweepCommand,
} from "./fleet.ts";

export { type CliIo, processIo } from "./io.ts";

/** A subcommand: its help and its implementation. */
export interface Subcommand {
  help: string;
  summary: string;
  run: (args: string[], io: CliIo) => Promise<number>;
}

const commands = new Map<string, Subcommand>([
  ["exec", { help: EXEC_HELP, summary: "run a command in a sandbox", run: execCommand }],
  ["wait", { help: WAIT_HELP, summary: "wait for a detached request", run: waitCommand }],
  ["doctor", {
    help: DOCTOR_HELP,
    summary: "check the queue, Docker and the image",
    run: doctorCommand,
  }],
  ["ps", { help: PS_HELP, summary: "list sandbox containers", run: psCommand }],
  ["sweep", {
    help: SWEEP_HELP,
    summary: "stop idle, remove stale or incompatible sandboxes",
    run: sweepCommand,
  }],
  ["stop", { help: STOP_HELP, summary: "stop a user's sandbox", run: stopCommand }],
  ["rm", {
    help: RM_HELP,
    summary: "remove a user's sandbox (--purge: and its state)",
    run: rmCommand,
  }],
  ["runner", {
    help: RUNNER_HELP,
    summary: "serve a queue (runs inside the sandbox)",
    run: (args) => runnerCommand(args),
  }],
]);

/**
 * Adds subcommands (the Docker ones are registered by `main.ts`).
 *
 * @param name The subcommand.
 * @param command Its help and implementation.
 */
export function registerCommand(name: string, command: Subcommand): void {
  commands.set(name, command);
}

function usage(): string {
  const lines = [...commands].map(([name, command]) => `  ${name.padEnd(8)} ${command.summary}`);
  return `Usage: waffle <command> [options]\n\nCommands:\n${
    lines.join("\n")
  }\n\nRun 'waffle <command> --help' for its options.\n`;
}

/**
 * Runs the CLI and returns its exit status instead of exiting, so tests can
 * drive it in process.
 *
 * @param args The command line after the program name.
 * @param io Process streams.
 * @returns The exit status.
 */
export async function runCli(args: string[], io: CliIo): Promise<number> {
  const [name, ...rest] = args;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    await io.stdout(usage());
    return name === undefined ? 125 : 0;
  }
  const command = commands.get(name);
  try {
    if (command === undefined) {
      throw new UsageError(`Unknown command '${name}'; run 'waffle --help'`);
    }
    if (rest.includes("--help") && !rest.slice(0, rest.indexOf("--help")).includes("--")) {
      await io.stdout(command.help);
      return 0;
    }
    return await command.run(rest, io);
  } catch (error) {
    if (error instanceof WaffleError) {
      await io.stderr(`waffle: ${error.message}\n`);
      return error.exitCode;
    }
    // Anything else is a bug: show the stack.
    await io.stderr(
      `waffle: internal error: ${error instanceof Error ? error.stack : String(error)}\n`,
    );
    return 125;
  }
}
