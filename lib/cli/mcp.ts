/**
 * `waffle mcp`: MCP servers run where the config says, under its policy.
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import { EXIT_WAFFLE } from "../exit_codes.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle mcp`. */
export const MCP_HELP = `Usage: waffle mcp <command> [options]

Commands:
  run NAME   serve MCP server NAME on stdio, executed where the config says
  serve NAME serve MCP server NAME over Streamable HTTP (a URL, a bearer token)
  plan       show the launch plan of a group or cron job
  ls         list the configured servers and their policy
  fetch NAME fetch and cache an npm server package on the host

Run 'waffle mcp <command> --help' for its options.
`;

type Loaded = { help: string; run: (args: string[], io: CliIo) => Promise<number> };

const SUBCOMMANDS: Record<string, () => Promise<Loaded>> = {
  run: async () => {
    const m = await import("./mcp_run.ts");
    return { help: m.MCP_RUN_HELP, run: m.mcpRunCommand };
  },
  serve: async () => {
    const m = await import("./mcp_serve.ts");
    return { help: m.MCP_SERVE_HELP, run: m.mcpServeCommand };
  },
  fetch: async () => {
    const m = await import("./mcp_run.ts");
    return { help: m.MCP_FETCH_HELP, run: m.mcpFetchCommand };
  },
  plan: async () => {
    const m = await import("./mcp_plan.ts");
    return { help: m.MCP_PLAN_HELP, run: m.mcpPlanCommand };
  },
  ls: async () => {
    const m = await import("./mcp_plan.ts");
    return { help: m.MCP_LS_HELP, run: m.mcpLsCommand };
  },
};

/**
 * Runs `waffle mcp <command>`.
 *
 * @param args The arguments after `mcp`.
 * @param io Process streams.
 * @returns The exit status.
 */
export async function mcpCommand(args: string[], io: CliIo): Promise<number> {
  const [name, ...rest] = args;
  if (name === undefined || name === "--help" || name === "-h") {
    await io.stdout(MCP_HELP);
    return name === undefined ? EXIT_WAFFLE : 0;
  }
  const load = Object.hasOwn(SUBCOMMANDS, name) ? SUBCOMMANDS[name] : undefined;
  if (load === undefined) {
    throw new UsageError(`Unknown command 'mcp ${name}'; run 'waffle mcp --help'`);
  }
  const loaded = await load();
  if (rest.includes("--help") && !rest.slice(0, rest.indexOf("--help")).includes("--")) {
    await io.stdout(loaded.help);
    return 0;
  }
  return await loaded.run(rest, io);
}
