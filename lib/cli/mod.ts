/**
 * The waffle CLI: subcommand dispatch and the one place errors become output
 * and exit codes.
 *
 * @module
 */
import { mark } from "../trace.ts";
import { UnpinnedPackageError, UsageError, WaffleError } from "../errors.ts";
import { EXIT_WAFFLE } from "../exit_codes.ts";
import { escapeControls } from "../terminal/control_text.ts";
import { WAFFLE_VERSION } from "../config/version.ts";
import type { CliIo } from "./io.ts";

export { type CliIo, processIo } from "./io.ts";

/** What a subcommand module provides once loaded. */
export interface LoadedSubcommand {
  /** The text `--help` prints. */
  help: string;
  /** Runs the subcommand on the arguments after its name and returns the exit status. */
  run: (args: string[], io: CliIo) => Promise<number>;
  /** It has subcommands of its own, which answer `--help` themselves. */
  nested?: boolean;
}

/** A subcommand: a one-line summary and a loader for the rest. */
export interface Subcommand {
  /** One line for `waffle --help`. */
  summary: string;
  /** Imports the subcommand's module. */
  load: () => Promise<LoadedSubcommand>;
}

// Loaded on use: `waffle runner` starts in every container, and must not pay
// for the Docker client and the rest of the CLI's module graph.
const commands = new Map<string, Subcommand>([
  ["exec", {
    summary: "run a command in a sandbox",
    load: lazy(() => import("./exec.ts"), (m) => ({ help: m.EXEC_HELP, run: m.execCommand })),
  }],
  ["shell", {
    summary: "open a terminal in a sandbox",
    load: lazy(() => import("./shell.ts"), (m) => ({ help: m.SHELL_HELP, run: m.shellCommand })),
  }],
  ["wait", {
    summary: "wait for a detached request",
    load: lazy(() => import("./exec.ts"), (m) => ({ help: m.WAIT_HELP, run: m.waitCommand })),
  }],
  ["doctor", {
    summary: "check the queue, Docker and the image",
    load: lazy(() => import("./doctor.ts"), (m) => ({ help: m.DOCTOR_HELP, run: m.doctorCommand })),
  }],
  ["ps", {
    summary: "list sandbox containers",
    load: lazy(() => import("./fleet.ts"), (m) => ({ help: m.PS_HELP, run: m.psCommand })),
  }],
  ["top", {
    summary: "what each sandbox costs: CPU, memory, tasks, disk, network (refreshing)",
    load: lazy(() => import("./top.ts"), (m) => ({ help: m.TOP_HELP, run: m.topCommand })),
  }],
  ["sweep", {
    summary: "stop idle, remove stale or incompatible sandboxes",
    load: lazy(() => import("./fleet.ts"), (m) => ({ help: m.SWEEP_HELP, run: m.sweepCommand })),
  }],
  ["stop", {
    summary: "stop a user's sandbox",
    load: lazy(() => import("./fleet.ts"), (m) => ({ help: m.STOP_HELP, run: m.stopCommand })),
  }],
  ["pause", {
    summary: "freeze every process of a user's sandbox",
    load: lazy(() => import("./fleet.ts"), (m) => ({ help: m.PAUSE_HELP, run: m.pauseCommand })),
  }],
  ["resume", {
    summary: "resume a paused sandbox where it was",
    load: lazy(() => import("./fleet.ts"), (m) => ({ help: m.RESUME_HELP, run: m.resumeCommand })),
  }],
  ["rm", {
    summary: "remove a user's sandbox (--purge: and its state)",
    load: lazy(() => import("./fleet.ts"), (m) => ({ help: m.RM_HELP, run: m.rmCommand })),
  }],
  ["snapshot", {
    summary: "save, restore, list and remove workspace snapshots",
    load: lazy(
      () => import("./snapshot.ts"),
      (m) => ({ help: m.SNAPSHOT_HELP, run: m.snapshotCommand, nested: true }),
    ),
  }],
  ["pool", {
    summary: "fill or drain the warm pools of ready sandboxes",
    load: lazy(() => import("./pool.ts"), (m) => ({ help: m.POOL_HELP, run: m.poolCommand })),
  }],
  ["fork", {
    summary: "copy a sandbox's workspace into new sandboxes, the source kept running",
    load: lazy(() => import("./fork.ts"), (m) => ({ help: m.FORK_HELP, run: m.forkCommand })),
  }],
  ["cp", {
    summary: "copy files and directories into or out of a sandbox",
    load: lazy(() => import("./cp.ts"), (m) => ({ help: m.CP_HELP, run: m.cpCommand })),
  }],
  ["files", {
    summary: "(internal) file transfer inside a sandbox",
    load: lazy(
      () => import("./files.ts"),
      (m) => ({ help: m.FILES_HELP, run: m.filesCommand }),
    ),
  }],
  ["mcp", {
    summary: "serve, plan, list and fetch MCP servers",
    load: lazy(
      () => import("./mcp.ts"),
      (m) => ({ help: m.MCP_HELP, run: m.mcpCommand, nested: true }),
    ),
  }],
  ["egress", {
    summary: "plan what a sandbox may reach through the egress proxy, and its secrets",
    load: lazy(
      () => import("./egress.ts"),
      (m) => ({ help: m.EGRESS_HELP, run: m.egressCommand, nested: true }),
    ),
  }],
  ["serve", {
    summary: "serve E2B's API on this home's sandboxes; 'serve key' manages API keys",
    load: lazy(
      () => import("./serve.ts"),
      (m) => ({ help: m.SERVE_HELP, run: m.serveCommand, nested: true }),
    ),
  }],
  ["k8s", {
    summary: "render waffle's objects for Kubernetes",
    load: lazy(
      () => import("./k8s.ts"),
      (m) => ({ help: m.K8S_HELP, run: m.k8sCommand, nested: true }),
    ),
  }],
  ["egress-proxy", {
    summary: "serve a home's egress proxy (runs in its own container)",
    load: lazy(
      () => import("./egress_proxy.ts"),
      (m) => ({ help: m.EGRESS_PROXY_HELP, run: m.egressProxyCommand }),
    ),
  }],
  ["certify-lock", {
    summary: "(internal) hold a queue file's lock for 'doctor --deep'",
    load: lazy(
      () => import("./certify_lock.ts"),
      (m) => ({ help: m.CERTIFY_LOCK_HELP, run: m.certifyLockCommand }),
    ),
  }],
  ["agent", {
    summary: "(internal) a sandbox's host side inside its Kubernetes pod",
    load: lazy(() => import("./agent.ts"), (m) => ({ help: m.AGENT_HELP, run: m.agentCommand })),
  }],
  ["runner", {
    summary: "serve a queue (runs inside the sandbox)",
    load: lazy(
      () => import("./runner.ts"),
      (m) => ({ help: m.RUNNER_HELP, run: (args) => m.runnerCommand(args) }),
    ),
  }],
]);

function lazy<M>(
  load: () => Promise<M>,
  pick: (module: M) => LoadedSubcommand,
): () => Promise<LoadedSubcommand> {
  return async () => pick(await load());
}

function usage(): string {
  const lines = [...commands].map(([name, command]) => `  ${name.padEnd(8)} ${command.summary}`);
  return `Usage: waffle <command> [options]\n\nCommands:\n${
    lines.join("\n")
  }\n\nRun 'waffle <command> --help' for its options, 'waffle --version' for the version.\n`;
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
    return name === undefined ? EXIT_WAFFLE : 0;
  }
  // Before any subcommand's module: the version costs nothing to load.
  if (name === "--version" || name === "-V") {
    await io.stdout(`waffle ${WAFFLE_VERSION}\n`);
    return 0;
  }
  const command = commands.get(name);
  try {
    if (command === undefined) {
      throw new UsageError(`Unknown command '${name}'; run 'waffle --help'`);
    }
    const loaded = await command.load();
    mark(`'${name}' loaded`);
    if (
      !loaded.nested && rest.includes("--help") &&
      !rest.slice(0, rest.indexOf("--help")).includes("--")
    ) {
      await io.stdout(loaded.help);
      return 0;
    }
    return await loaded.run(rest, io);
  } catch (error) {
    // A message may quote the sandbox (a file name, a runner's row): its controls are escaped.
    if (error instanceof WaffleError) {
      await io.stderr(`waffle: ${escapeControls(await messageFor(error))}\n`);
      return error.exitCode;
    }
    // Anything else is a bug: show the stack.
    const stack = error instanceof Error ? error.stack ?? error.message : String(error);
    await io.stderr(`waffle: internal error: ${escapeControls(stack, { keepNewlines: true })}\n`);
    return EXIT_WAFFLE;
  }
}

// An unpinned package's message says which version npm would pick: the one
// error whose message asks the network (the registry, within a few seconds).
async function messageFor(error: WaffleError): Promise<string> {
  if (!(error instanceof UnpinnedPackageError)) return error.message;
  const { unpinnedMessage } = await import("../mcp/npm_registry.ts");
  return await unpinnedMessage(error);
}
