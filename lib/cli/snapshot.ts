/**
 * `waffle snapshot save|restore|ls|rm`: snapshots of a user's workspace.
 *
 * @module
 */
import { absoluteConfigPath } from "../config/config.ts";
import { UsageError } from "../errors.ts";
import { EXIT_WAFFLE } from "../exit_codes.ts";
import { openSandbox, type Sandbox } from "../sandbox/open.ts";
import type { SnapshotInfo } from "../lifecycle/snapshot_store.ts";
import { noPositionals, numberFlag, parse, type Parsed, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";
import { table } from "./report.ts";

/** Help of `waffle snapshot`. */
export const SNAPSHOT_HELP = `Usage: waffle snapshot <command> --user U [--tenant T] [options]

Commands:
  save NAME     save the user's workspace as snapshot NAME
  restore NAME  bring the workspace back to snapshot NAME
  ls            list the user's snapshots
  rm NAME       remove snapshot NAME

A snapshot holds the workspace only: the queue is never rolled back.
Snapshots count against [sandbox] max_snapshots (and snapshot_bytes).
Run 'waffle snapshot <command> --help' for its options.
`;

const COMMON = `  --user U           sandbox owner
  --tenant T         tenant of the user (default: "default")
  --config FILE      the config file (default: $WAFFLE_HOME/waffle.toml)
  --json             print one JSON object`;

const WAIT = `  --wait             wait for running commands instead of refusing (up to 10 min)
  --wait-seconds S   wait up to S seconds`;

/** Help of `waffle snapshot save`. */
export const SAVE_HELP = `Usage: waffle snapshot save --user U [--tenant T] [--force] [--wait] NAME

Saves the user's workspace as snapshot NAME (1-64 of A-Z a-z 0-9 . _ -,
starting with a letter or digit). The volume is frozen while its image is
copied (sparse, reflinked where the host's filesystem can), so nothing a
command left running writes meanwhile. Refused while a command runs.

Options:
${COMMON}
  --force            replace a snapshot of the same name
${WAIT}
`;

/** Help of `waffle snapshot restore`. */
export const RESTORE_HELP = `Usage: waffle snapshot restore --user U [--tenant T] [--wait] NAME

Replaces the user's workspace with snapshot NAME, atomically: the container
is stopped (ending anything a command left running), the snapshot's
workspace is copied next to the current one and swapped in with one rename,
and the container (the same one, with the same queue) is started again if it
was running. Refused while a command runs.

Options:
${COMMON}
${WAIT}
`;

/** Help of `waffle snapshot ls`. */
export const LS_HELP = `Usage: waffle snapshot ls --user U [--tenant T] [--json]

Lists the user's snapshots: name, when taken, host disk taken, volume size,
and how long the save took.

Options:
${COMMON}
`;

/** Help of `waffle snapshot rm`. */
export const RM_HELP = `Usage: waffle snapshot rm --user U [--tenant T] [--json] NAME

Removes snapshot NAME.

Options:
${COMMON}
`;

/** How long `--wait` waits without `--wait-seconds`. */
const DEFAULT_WAIT_SECONDS = 600;

type Run = (args: string[], io: CliIo) => Promise<number>;

const SUBCOMMANDS: Record<string, { help: string; run: Run }> = {
  save: { help: SAVE_HELP, run: (args, io) => snapshotAction("save", args, io) },
  restore: { help: RESTORE_HELP, run: (args, io) => snapshotAction("restore", args, io) },
  ls: { help: LS_HELP, run: lsCommand },
  rm: { help: RM_HELP, run: (args, io) => snapshotAction("rm", args, io) },
};

/**
 * Runs `waffle snapshot <command>`.
 *
 * @param args The arguments after `snapshot`.
 * @param io Process streams.
 * @returns The exit status.
 */
export async function snapshotCommand(args: string[], io: CliIo): Promise<number> {
  const [name, ...rest] = args;
  if (name === undefined || name === "--help" || name === "-h") {
    await io.stdout(SNAPSHOT_HELP);
    return name === undefined ? EXIT_WAFFLE : 0;
  }
  const sub = Object.hasOwn(SUBCOMMANDS, name) ? SUBCOMMANDS[name] : undefined;
  if (sub === undefined) {
    throw new UsageError(`Unknown command 'snapshot ${name}'; run 'waffle snapshot --help'`);
  }
  if (rest.includes("--help")) {
    await io.stdout(sub.help);
    return 0;
  }
  return await sub.run(rest, io);
}

const OPTIONS = {
  user: { type: "string" },
  tenant: { type: "string" },
  config: { type: "string" },
  json: { type: "boolean" },
} as const;

function openFor(parsed: Parsed): Sandbox {
  const user = stringFlag(parsed, "user");
  if (user === undefined) throw new UsageError("Missing --user U");
  const configPath = stringFlag(parsed, "config");
  return openSandbox(user, {
    tenant: stringFlag(parsed, "tenant") ?? "default",
    config: configPath === undefined ? {} : { configPath: absoluteConfigPath(configPath) },
    // Snapshots are of a sandbox that exists: none is taken from a pool for them.
    fromPool: false,
  });
}

function oneName(parsed: Parsed, action: string): string {
  const [name, ...extra] = parsed.positionals;
  if (name === undefined) {
    throw new UsageError(`Missing snapshot name: use 'snapshot ${action} NAME'`);
  }
  noPositionals(extra);
  return name;
}

function waitMsOf(parsed: Parsed): number {
  const seconds = numberFlag(parsed, "wait-seconds", { allowZero: true });
  if (seconds !== undefined) return Math.round(seconds * 1000);
  return parsed.values.wait === true ? DEFAULT_WAIT_SECONDS * 1000 : 0;
}

// save, restore and rm: one snapshot by name.
async function snapshotAction(
  action: "save" | "restore" | "rm",
  args: string[],
  io: CliIo,
): Promise<number> {
  const parsed = parse(args, {
    ...OPTIONS,
    ...(action === "rm" ? {} : { wait: { type: "boolean" }, "wait-seconds": { type: "string" } }),
    ...(action === "save" ? { force: { type: "boolean" } } : {}),
  });
  const name = oneName(parsed, action);
  const waitMs = action === "rm" ? 0 : waitMsOf(parsed);
  const sandbox = openFor(parsed);
  const lib = await import("../lifecycle/snapshot.ts");
  try {
    if (action === "save") {
      const snapshot = await lib.saveSnapshot(sandbox, name, {
        force: parsed.values.force === true,
        waitMs,
      });
      return await report(io, parsed, { action: "saved", snapshot }, describe("saved", snapshot));
    }
    if (action === "rm") {
      const snapshot = await lib.removeSnapshot(sandbox, name);
      return await report(io, parsed, { action: "removed", snapshot }, `removed '${name}'`);
    }
    const restored = await lib.restoreSnapshot(sandbox, name, { waitMs });
    const line = `restored '${name}' in ${seconds(restored.restoreMs)}${
      restored.restarted ? `; container ${restored.containerId?.slice(0, 12)} started again` : ""
    }`;
    return await report(io, parsed, { action: "restored", ...restored }, line);
  } finally {
    sandbox.close();
  }
}

async function lsCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, OPTIONS);
  noPositionals(parsed.positionals);
  const sandbox = openFor(parsed);
  try {
    const { listSnapshots } = await import("../lifecycle/snapshot.ts");
    const snapshots = await listSnapshots(sandbox);
    const { maxSnapshots, snapshotBytes } = sandbox.config;
    if (parsed.values.json) {
      await io.stdout(`${JSON.stringify({ snapshots, maxSnapshots, snapshotBytes })}\n`);
      return 0;
    }
    if (snapshots.length === 0) {
      await io.stdout(`no snapshots (at most ${maxSnapshots})\n`);
      return 0;
    }
    const rows = [["NAME", "CREATED", "SIZE", "VOLUME", "SAVE"]];
    for (const s of snapshots) {
      rows.push([s.name, s.createdAt, mib(s.bytes), mib(s.volumeBytes), seconds(s.saveMs)]);
    }
    await io.stdout(table(rows));
    return 0;
  } finally {
    sandbox.close();
  }
}

async function report(io: CliIo, parsed: Parsed, json: unknown, line: string): Promise<number> {
  await io.stdout(parsed.values.json ? `${JSON.stringify(json)}\n` : `${line}\n`);
  return 0;
}

function describe(verb: string, s: SnapshotInfo): string {
  return `${verb} '${s.name}': ${mib(s.bytes)} on the host, taken in ${seconds(s.saveMs)}`;
}

function mib(bytes: number): string {
  return `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(2)} s`;
}
