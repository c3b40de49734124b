/**
 * `waffle mcp plan` and `waffle mcp ls`: the configured MCP servers, their
 * policy, and the launch plan of a group or cron job, with a warning for
 * each host variable an `env` names that is not set and (with `--probe`)
 * each allowlisted tool a server does not offer. Nothing is started unless
 * `--probe` asks.
 *
 * @module
 */
import { escapeControls } from "../terminal/control_text.ts";
import { configSource, loadWaffleConfig, type WaffleConfig } from "../config/config.ts";
import { UsageError } from "../errors.ts";
import { launchable, type LaunchPlan, planLaunch, unsetHostEnv } from "../mcp/plan.ts";
import { noPositionals, parse, stringFlag } from "./args.ts";
import { table } from "./report.ts";
import type { CliIo } from "./io.ts";
import { notOfferedWarning, unsetEnvWarning } from "./mcp_warnings.ts";

/** Help of `waffle mcp plan`. */
export const MCP_PLAN_HELP =
  `Usage: waffle mcp plan [--group G | --cron J] [--user U] [--probe] [--json] [--config FILE]

Shows, for a group (default: 'default') or a cron job, each configured MCP
server's decision (launch, or denied with its reasons), where it executes
(host, sandbox or restricted), its working directory, state directory (its
HOME), network, egress (none; any: the host's network or a bridge sandbox;
or what its egress proxy allows), workspace access, tools, environment
variable names and the requests it may send to the client
(client_requests). Host values are never shown (--json shows the config's
literal values). With --user U a sandbox server's egress is that user's
sandbox's ([users.U] egress narrows [sandbox] egress); without, the home's.

A warning line names each host variable a server's env takes that is not
set here. With --probe each server that may launch is started once, as a
throwaway user in a throwaway home (a container start each; Docker needed
for sandboxed ones, a host process for host ones), to list its tools: a
warning names each allowlisted tool it does not offer. Without --probe
nothing is started. --json carries the warnings as fields.
`;

/** A finding of `waffle mcp plan`: a config that would fail silently. */
export type PlanWarning =
  | { server: string; kind: "env-unset"; variable: string; host: string; message: string }
  | { server: string; kind: "tool-not-offered"; tools: string[]; message: string }
  | { server: string; kind: "probe-failed"; message: string };

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
    user: { type: "string" },
    probe: { type: "boolean" },
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
  const plan = planLaunch(config, { group, cron, user: stringFlag(parsed, "user") });
  const warnings = envWarnings(plan);
  const probes: { server: string; tools: string[] }[] = [];
  if (parsed.values.probe) {
    const found = await probeAll(config, plan, { group, cron });
    warnings.push(...found.warnings);
    probes.push(...found.probes);
  }
  if (parsed.values.json) {
    const out = {
      ...plan,
      config: config.path ?? null,
      searched: config.searched,
      warnings,
      ...(parsed.values.probe ? { probes } : {}),
    };
    await io.stdout(`${JSON.stringify(out)}\n`);
    return 0;
  }
  await io.stdout(planText(plan, config));
  for (const warning of warnings) {
    await io.stdout(`warning: ${escapeControls(warning.message)}\n`);
  }
  return 0;
}

// Every launchable server's host variables that are not set.
function envWarnings(plan: LaunchPlan): PlanWarning[] {
  return launchable(plan).flatMap((server) =>
    unsetHostEnv(server.envSources).map((entry): PlanWarning => ({
      server: server.name,
      kind: "env-unset",
      variable: entry.name,
      host: entry.host,
      message: unsetEnvWarning(server.name, entry),
    }))
  );
}

// Starts each launchable server once, one after another (each may start a
// container), and compares what it offers with its allowlist.
async function probeAll(
  config: WaffleConfig,
  plan: LaunchPlan,
  subject: { group?: string | undefined; cron?: string | undefined },
): Promise<{ warnings: PlanWarning[]; probes: { server: string; tools: string[] }[] }> {
  const { probeConfiguredServer } = await import("./mcp_probe.ts");
  const warnings: PlanWarning[] = [];
  const probes: { server: string; tools: string[] }[] = [];
  for (const server of launchable(plan)) {
    try {
      const found = await probeConfiguredServer(config, server.name, { subject });
      probes.push({ server: server.name, tools: found.tools });
      if (found.notOffered.length > 0) {
        warnings.push({
          server: server.name,
          kind: "tool-not-offered",
          tools: found.notOffered,
          message: notOfferedWarning(server.name, found.notOffered),
        });
      }
    } catch (error) {
      warnings.push({
        server: server.name,
        kind: "probe-failed",
        message: `server '${server.name}' could not be probed: ${
          error instanceof Error ? error.message : String(error)
        }`,
      });
    }
  }
  return { warnings, probes };
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
    envSources: server.envSources,
    ...(server.cwd === undefined ? {} : { cwd: server.cwd }),
    maxMessageBytes: server.maxMessageBytes,
    tools: server.tools ?? ("all" as const),
    clientRequests: server.clientRequests,
    program: {
      ...(server.package === undefined ? {} : { package: server.package }),
      ...(server.command === undefined ? {} : { command: server.command }),
      args: server.args,
    },
  }));
  if (parsed.values.json) {
    await io.stdout(
      `${JSON.stringify({ config: config.path ?? null, searched: config.searched, servers })}\n`,
    );
    return 0;
  }
  if (servers.length === 0) {
    await io.stdout(`No MCP servers configured (${configSource(config)})\n`);
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

function planText(plan: LaunchPlan, config: WaffleConfig): string {
  const title = plan.subject.kind === "cron"
    ? `Plan for cron '${plan.subject.name}' (group '${plan.group}')`
    : `Plan for group '${plan.group}'`;
  if (plan.servers.length === 0) {
    return `${title}: no MCP servers configured (${configSource(config)})\n`;
  }
  const rows = [[
    "SERVER",
    "DECISION",
    "WHERE",
    "CWD",
    "STATE",
    "NETWORK",
    "EGRESS",
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
      s.state.root,
      s.network,
      typeof s.egress === "string"
        ? s.egress
        : s.egress.length === 0
        ? "(empty)"
        : s.egress.join(","),
      s.workspace,
      list(s.tools),
      list(s.env),
      list(s.clientRequests),
    ]);
    if (s.reasons.length > 0) reasons.set(rows.length - 1, s.reasons);
  }
  const lines = table(rows).trimEnd().split("\n");
  const out = [`${title}, from ${configSource(config)}`];
  lines.forEach((line, i) => {
    out.push(line);
    for (const reason of reasons.get(i) ?? []) out.push(`    denied: ${reason}`);
  });
  return `${out.join("\n")}\n`;
}

function list(values: string[] | "all"): string {
  if (values === "all") return "all";
  return values.length === 0 ? "-" : values.join(",");
}
