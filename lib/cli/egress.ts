/**
 * `waffle egress`: what a sandbox or a restricted MCP server's session may
 * reach through the egress proxy, and with which secrets.
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import { EXIT_WAFFLE } from "../exit_codes.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle egress`. */
export const EGRESS_HELP = `Usage: waffle egress <command> [options]

Commands:
  plan       show what a sandbox (or a restricted server) may reach, and its secrets
  status     show this home's proxy, its CA and the identities it serves
  reload     write every identity's policy from today's config at once
  ca         make this home's CA if needed; print its file and fingerprint

Run 'waffle egress <command> --help' for its options.
`;

type Loaded = { help: string; run: (args: string[], io: CliIo) => Promise<number> };

const SUBCOMMANDS: Record<string, () => Promise<Loaded>> = {
  plan: async () => {
    const m = await import("./egress_plan.ts");
    return { help: m.EGRESS_PLAN_HELP, run: m.egressPlanCommand };
  },
  status: async () => {
    const m = await import("./egress_status.ts");
    return { help: m.EGRESS_STATUS_HELP, run: m.egressStatusCommand };
  },
  ca: async () => {
    const m = await import("./egress_status.ts");
    return { help: m.EGRESS_CA_HELP, run: m.egressCaCommand };
  },
  reload: async () => {
    const m = await import("./egress_status.ts");
    return { help: m.EGRESS_RELOAD_HELP, run: m.egressReloadCommand };
  },
};

/**
 * Runs `waffle egress <command>`.
 *
 * @example
 * ```ts ignore
 * await egressCommand(["plan", "--user", "alice"], processIo());
 * ```
 *
 * @param args The arguments after `egress`.
 * @param io Process streams.
 * @returns The exit status.
 * @throws {UsageError} On an unknown command (and whatever the command throws).
 */
export async function egressCommand(args: string[], io: CliIo): Promise<number> {
  const [name, ...rest] = args;
  if (name === undefined || name === "--help" || name === "-h") {
    await io.stdout(EGRESS_HELP);
    return name === undefined ? EXIT_WAFFLE : 0;
  }
  const load = Object.hasOwn(SUBCOMMANDS, name) ? SUBCOMMANDS[name] : undefined;
  if (load === undefined) {
    throw new UsageError(`Unknown command 'egress ${name}'; run 'waffle egress --help'`);
  }
  const loaded = await load();
  if (rest.includes("--help") && !rest.slice(0, rest.indexOf("--help")).includes("--")) {
    await io.stdout(loaded.help);
    return 0;
  }
  return await loaded.run(rest, io);
}
