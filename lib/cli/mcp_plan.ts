/**
 * `waffle mcp plan` and `waffle mcp ls`: the configured MCP servers, their
 * policy, and the launch plan of a group or cron job. Nothing is started.
 *
 * @module
 */
import { loadWaffleConfig } from "../config/config.ts";
import { UsageError } from "../errors.ts";
import { type LaunchPlan, planLaunch } from "../mcp/plan.ts";
import { noPositionals, parse, stringFlag } from "./args.ts";
import { table } from "./report.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle mcp plan`. */
export const MCP_PLAN_HELP = `Usage: waffle mcp plan [--group G | --cron J] [--json] [--config FILE]

Shows, for a group (default: 'default') or a cron job, each configured MCP
server's decision (launch, or denied with its reasons), where it executes
(host, sandbox or restricted), its working directory, network, workspace
access, tools, environment variable names and the requests it may send to
the client (client_requests). Values are never shown. Nothing is started.
`;

/** Help of `waffle mcp ls`. */
export const MCP_LS_HELP = `Usage: waffle mcp ls [--json] [--config FILE]

Lists the configured MCP servers: execution, authority, groups, environment
variable names, tools, the requests each may send to the client
(client_requests) and program.
`;

/**
 * Runs `waffle mcp plan`.
 *
 * @param args Arguments after `mcp plan`.
 * @param io Process streams.
 * @returns 0.
 * @throws {UsageError} On bad flags, an unknown group or cron job, or a bad config.
 */
export async function mcpPlanCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    group: { type: "string" },
    cron: { type: "string" },
    json: { type: "boolean" },
    config: { type: "string" },
  });
  noPositionals(parsed.positionals);
  const group = stringFlag(parsed, "group");
  const cron = stringFlag(parsed, "cron");
  if (group !== undefined && cron !== undefined) {
    throw new UsageError("Give --group G or --cron J, not both");
  }
  const config = loadWaffleConfig({ configPath: stringFlag(parsed, "config") });
  const plan = planLaunch(config, { group, cron });
  if (parsed.values.json) {
    await io.stdout(`${JSON.stringify(plan)}\n`);
    return 0;
  }
  await io.stdout(planText(plan, config.path));
  return 0;
}

/**
 * Runs `waffle mcp ls`.
 *
 * @param args Arguments after `mcp ls`.
 * @param io Process streams.
 * @returns 0.
 * @throws {UsageError} On bad flags or a bad config.
 */
export async function mcpLsCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { json: { type: "boolean" }, config: { type: "string" } });
  noPositionals(parsed.positionals);
  const config = loadWaffleConfig({ configPath: stringFlag(parsed, "config") });
  const servers = Object.values(config.policy.servers).map((server) => ({
    name: server.name,
    execution: server.execution,
    authority: server.authority,
    groups: server.groups ?? ("all" as const),
    env: server.env,
    tools: server.tools ?? ("all" as const),
    clientRequests: server.clientRequests,
    program: {
      ...(server.package === undefined ? {} : { package: server.package }),
      ...(server.command === undefined ? {} : { command: server.command }),
      args: server.args,
    },
  }));
  if (parsed.values.json) {
    await io.stdout(`${JSON.stringify({ config: config.path ?? null, servers })}\n`);
    return 0;
  }
  if (servers.length === 0) {
    await io.stdout(`No MCP servers configured (${source(config.path)})\n`);
    return 0;
  }
  const rows = [[
    "SERVER",
    "EXECUTION",
    "AUTHORITY",
    "GROUPS",
    "ENV",
    "TOOLS",
    "CLIENT REQUESTS",
    "PROGRAM",
  ]];
  for (const s of servers) {
    rows.push([
      s.name,
      s.execution,
      s.authority,
      list(s.groups),
      list(s.env),
      list(s.tools),
      list(s.clientRequests),
      [s.program.package ?? s.program.command ?? "", ...s.program.args].join(" "),
    ]);
  }
  await io.stdout(table(rows));
  return 0;
}

function planText(plan: LaunchPlan, path: string | undefined): string {
  const title = plan.subject.kind === "cron"
    ? `Plan for cron '${plan.subject.name}' (group '${plan.group}')`
    : `Plan for group '${plan.group}'`;
  if (plan.servers.length === 0) return `${title}: no MCP servers configured (${source(path)})\n`;
  const rows = [[
    "SERVER",
    "DECISION",
    "WHERE",
    "CWD",
    "NETWORK",
    "WORKSPACE",
    "TOOLS",
    "ENV",
    "CLIENT REQUESTS",
  ]];
  const reasons = new Map<number, string[]>();
  for (const s of plan.servers) {
    rows.push([
      s.name,
      s.decision,
      s.where ?? "-",
      s.cwd,
      s.network,
      s.workspace,
      list(s.tools),
      list(s.env),
      list(s.clientRequests),
    ]);
    if (s.reasons.length > 0) reasons.set(rows.length - 1, s.reasons);
  }
  const lines = table(rows).trimEnd().split("\n");
  const out = [`${title}, from ${source(path)}`];
  lines.forEach((line, i) => {
    out.push(line);
    for (const reason of reasons.get(i) ?? []) out.push(`    denied: ${reason}`);
  });
  return `${out.join("\n")}\n`;
}

function source(path: string | undefined): string {
  return path === undefined ? "no config file" : `'${path}'`;
}

function list(values: string[] | "all"): string {
  if (values === "all") return "all";
  return values.length === 0 ? "-" : values.join(",");
}
