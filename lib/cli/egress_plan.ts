/**
 * `waffle egress plan`: what the sandbox of (tenant, user), or a restricted
 * MCP server's session, may reach through the egress proxy. It shows
 * whether the proxy is attached (and which key attaches it), the allowed
 * destinations and the config keys they were composed from,
 * `egress_addresses`, each secret with its hosts, header, placeholder
 * variable and whether its source is set or readable on this host (never its
 * value), warnings, and the `[egress]` settings. Nothing is started.
 *
 * @module
 */
import { configSource, loadWaffleConfig, type WaffleConfig } from "../config/config.ts";
import { UsageError } from "../errors.ts";
import { allows, formatEntry } from "../config/egress_entries.ts";
import {
  type ComposedEgress,
  egressPolicy,
  type EgressSubject,
  sandboxEgress,
  serverEgress,
} from "../config/egress_compose.ts";
import type { EgressEntry, EgressSettings, SecretConfig } from "../config/egress_types.ts";
import { noPositionals, parse, stringFlag } from "./args.ts";
import { table } from "./report.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle egress plan`. */
export const EGRESS_PLAN_HELP =
  `Usage: waffle egress plan --user U [--tenant T] [--server S [--group G | --cron J]] [--json] [--config FILE]

Shows what the sandbox of (tenant, user) may reach through the egress
proxy, or with --server what a restricted MCP server's session may: whether
the proxy is attached (else which key would attach it), each allowed
destination and the keys it was composed from ([sandbox] egress narrowed by
[users.U] egress; a server's egress narrowed by its group's and cron job's),
egress_addresses, each secret (its hosts, header, format, the variable that
holds its placeholder, and whether its source is set or readable here; never
its value), warnings (a secret whose host the list does not allow, a source
that is not set here), and the [egress] settings. Nothing is started.

Options:
  --user U        the sandbox's user (required)
  --tenant T      the user's tenant (default: "default")
  --server S      a restricted [mcp.S] server's session instead of the sandbox
  --group G       the session's group (default: "default"; with --server)
  --cron J        the session's cron job (with --server)
  --config FILE   the config file
  --json          print one JSON object
`;

/** Whether a secret's source can be read here: a variable set (or empty, or not), a file readable. */
export type SecretStatus = "set" | "empty" | "unset" | "readable" | "missing" | "unreadable";

/** One secret as `waffle egress plan` shows it: everything but its value. */
export interface SecretReport {
  /** The `[secrets.<name>]` key. */
  name: string;
  /** The hosts its requests go to. */
  hosts: string[];
  /** The header it is written in. */
  header: string;
  /** How the header's value is written, `{}` standing for the secret. */
  format: string;
  /** The variable that holds its placeholder inside the sandbox. */
  env: string;
  /** Where the host reads it. */
  source: { env: string } | { file: string };
  /** Whether that source can be read here (never read: a file is opened, not read). */
  status: SecretStatus;
}

/** A finding of `waffle egress plan`: a config that would not do what it says. */
export type EgressPlanWarning =
  | { kind: "secret-host-not-allowed"; secret: string; host: string; message: string }
  | { kind: "secret-unavailable"; secret: string; message: string }
  | { kind: "empty-allow"; message: string }
  | { kind: "extra-ca-unreadable"; path: string; message: string };

/** What `waffle egress plan` reports; `--json` prints it with `config` and `searched`. */
export interface EgressPlanReport {
  /** Whose egress: the sandbox's (server null) or a restricted server's session. */
  subject: {
    tenant: string;
    user: string;
    server: string | null;
    group: string | null;
    cron: string | null;
  };
  /** Whether the egress proxy is attached. */
  attached: boolean;
  /** The key that attaches it: `sandbox.egress` or `mcp.<server>.egress`. */
  attachKey: string;
  /** Why it is not attached (what the identity reaches instead); null when attached. */
  detached: string | null;
  /** The keys intersected into `allow`, in order; empty when not attached. */
  keys: string[];
  /** The allowed destinations, each with its text as in `waffle.toml`. */
  allow: (EgressEntry & { text: string })[];
  /** `egress_addresses`: the non-public CIDRs listed names may resolve to. */
  addresses: string[];
  /** The secrets its requests may carry. */
  secrets: SecretReport[];
  /** The `[egress]` settings (proxy-wide). */
  settings: EgressSettings;
  /** Findings, one line each. */
  warnings: EgressPlanWarning[];
}

/**
 * Runs `waffle egress plan`.
 *
 * @example
 * ```ts ignore
 * await egressPlanCommand(["--user", "alice", "--json"], processIo());
 * ```
 *
 * @param args Arguments after `egress plan`.
 * @param io Process streams.
 * @returns 0.
 * @throws {UsageError} On bad flags, a bad user or tenant id, an unknown or
 *   non-restricted server, an unknown group or cron job, or a bad config.
 */
export async function egressPlanCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    user: { type: "string" },
    tenant: { type: "string" },
    server: { type: "string" },
    group: { type: "string" },
    cron: { type: "string" },
    json: { type: "boolean" },
    config: { type: "string" },
  });
  noPositionals(parsed.positionals);
  const who: EgressSubject = {
    tenant: stringFlag(parsed, "tenant") ?? "default",
    user: stringFlag(parsed, "user") ?? "",
    server: stringFlag(parsed, "server"),
    group: stringFlag(parsed, "group"),
    cron: stringFlag(parsed, "cron"),
  };
  if (stringFlag(parsed, "user") === undefined) {
    throw new UsageError("Missing --user U: egress is planned for one user's sandbox or session");
  }
  if (who.server === undefined && (who.group !== undefined || who.cron !== undefined)) {
    throw new UsageError("--group and --cron are for a server's session: give --server S too");
  }
  if (who.group !== undefined && who.cron !== undefined) {
    throw new UsageError("Give --group G or --cron J, not both");
  }
  const config = loadWaffleConfig({ configPath: stringFlag(parsed, "config") });
  if (who.server !== undefined) await refuseUnrestricted(config, who.server);
  const report = egressPlanReport(config, who);
  if (parsed.values.json) {
    const out = { config: config.path ?? null, searched: config.searched, ...report };
    await io.stdout(`${JSON.stringify(out)}\n`);
    return 0;
  }
  await io.stdout(reportText(report, config));
  for (const warning of report.warnings) await io.stdout(`warning: ${warning.message}\n`);
  return 0;
}

// Only a restricted server's session is an egress identity of its own.
async function refuseUnrestricted(config: WaffleConfig, name: string): Promise<void> {
  const { configuredServer } = await import("./mcp_launch.ts");
  const server = configuredServer(config, name);
  if (server.authority === "sandbox") {
    throw new UsageError(
      `Server '${name}' has authority "sandbox": it shares the user sandbox's egress (sandbox.egress); run 'waffle egress plan --user U' without --server`,
    );
  }
  if (server.authority === "host") {
    throw new UsageError(
      `Server '${name}' has authority "host": it has the host's network, and egress does not apply to it`,
    );
  }
}

/**
 * Builds the report of `waffle egress plan` (it reads whether each secret's
 * source is set or readable, never its value).
 *
 * @example
 * ```ts ignore
 * const report = egressPlanReport(loadWaffleConfig(), { tenant: "default", user: "alice" });
 * ```
 *
 * @param config The loaded configuration.
 * @param who The sandbox's tenant and user, or a restricted server's session.
 * @returns The report.
 * @throws {UsageError} On a bad id, an unknown server, group or cron job.
 */
export function egressPlanReport(config: WaffleConfig, who: EgressSubject): EgressPlanReport {
  const policy = egressPolicy(config, who);
  const composed: ComposedEgress | undefined = who.server === undefined
    ? sandboxEgress(config, who.user)
    : serverEgress(config, { server: who.server, group: who.group, cron: who.cron });
  const allow = policy?.allow ?? [];
  const secrets = (policy?.secrets ?? []).map(secretReport);
  const report: EgressPlanReport = {
    subject: {
      tenant: who.tenant,
      user: who.user,
      server: who.server ?? null,
      group: who.server === undefined ? null : (who.group ?? null),
      cron: who.cron ?? null,
    },
    attached: policy !== undefined,
    attachKey: who.server === undefined ? "sandbox.egress" : `mcp.${who.server}.egress`,
    detached: policy === undefined ? detachedReason(config, who) : null,
    keys: composed?.keys ?? [],
    allow: allow.map((entry) => ({ ...entry, text: formatEntry(entry) })),
    addresses: [...(policy?.addresses ?? [])],
    secrets,
    settings: config.egress,
    warnings: [],
  };
  report.warnings = planWarnings(report, allow);
  return report;
}

// What the identity reaches when the proxy is not attached, and the key that would attach it.
function detachedReason(config: WaffleConfig, who: EgressSubject): string {
  if (who.server === undefined) {
    const network = config.sandbox.network;
    return network === "bridge"
      ? `the sandbox has network "bridge" (sandbox.network) and reaches anything directly; [sandbox] egress, with network "none", would attach the egress proxy`
      : `the sandbox has network "none" and reaches nothing; [sandbox] egress would attach the egress proxy`;
  }
  const cron = who.cron === undefined ? undefined : config.policy.cron[who.cron];
  if (cron?.network === "none" && config.policy.servers[who.server]?.egress !== undefined) {
    return `cron '${cron.name}' requires network "none" (cron.${cron.name}.network), so server '${who.server}' reaches nothing`;
  }
  return `server '${who.server}' has no network and reaches nothing; [mcp.${who.server}] egress would attach the egress proxy`;
}

function secretReport(secret: SecretConfig): SecretReport {
  return {
    name: secret.name,
    hosts: [...secret.hosts],
    header: secret.header,
    format: secret.format,
    env: secret.env,
    source: { ...secret.source },
    status: "env" in secret.source ? envStatus(secret.source.env) : fileStatus(secret.source.file),
  };
}

function envStatus(name: string): SecretStatus {
  const value = Deno.env.get(name);
  return value === undefined ? "unset" : value === "" ? "empty" : "set";
}

// Opened and closed, never read: the plan must not hold a secret's value.
function fileStatus(path: string): SecretStatus {
  try {
    const info = Deno.statSync(path);
    if (!info.isFile) return "unreadable";
    Deno.openSync(path, { read: true }).close();
    return info.size === 0 ? "empty" : "readable";
  } catch (error) {
    return error instanceof Deno.errors.NotFound ? "missing" : "unreadable";
  }
}

function planWarnings(
  report: EgressPlanReport,
  allow: readonly EgressEntry[],
): EgressPlanWarning[] {
  const warnings: EgressPlanWarning[] = [];
  if (report.attached && allow.length === 0) {
    warnings.push({
      kind: "empty-allow",
      message: `the egress list is empty (${report.keys.join(", ")}): the proxy allows nothing`,
    });
  }
  for (const secret of report.secrets) {
    for (const host of secret.hosts) {
      // On any port of the list: the proxy injects wherever it terminates TLS for the host.
      if (allow.some((entry) => allows([entry], host, entry.ports[0]!))) continue;
      warnings.push({
        kind: "secret-host-not-allowed",
        secret: secret.name,
        host,
        message: `secret '${secret.name}' is for host '${host}', which the egress list (${
          report.keys.join(", ")
        }) does not allow: it would never be sent`,
      });
    }
    if (secret.status !== "set" && secret.status !== "readable") {
      const where = "env" in secret.source
        ? `host variable ${secret.source.env}`
        : `file '${secret.source.file}'`;
      warnings.push({
        kind: "secret-unavailable",
        secret: secret.name,
        message: `secret '${secret.name}' reads ${where}, which is ${secret.status} here`,
      });
    }
  }
  const ca = report.settings.extraCa;
  if (ca !== undefined && fileStatus(ca) !== "readable") {
    warnings.push({
      kind: "extra-ca-unreadable",
      path: ca,
      message: `egress.extra_ca '${ca}' is ${fileStatus(ca)} here`,
    });
  }
  return warnings;
}

function reportText(report: EgressPlanReport, config: WaffleConfig): string {
  const { subject, settings } = report;
  const whose = subject.server === null
    ? `user '${subject.user}' (tenant '${subject.tenant}')`
    : `server '${subject.server}' for user '${subject.user}' (tenant '${subject.tenant}'), ${
      subject.cron === null ? `group '${subject.group ?? "default"}'` : `cron '${subject.cron}'`
    }`;
  const rows: string[][] = [[
    "attached",
    report.attached ? `yes (${report.keys.join(", ")})` : `no: ${report.detached}`,
  ]];
  if (report.attached) {
    const allow = report.allow.length === 0 ? ["(nothing)"] : report.allow.map((e) => e.text);
    allow.forEach((text, i) => rows.push([i === 0 ? "allow" : "", text]));
    rows.push(["addresses", report.addresses.length === 0 ? "-" : report.addresses.join(", ")]);
  }
  const cap = settings.bytesPerSecond === 0 ? "0 (no cap)" : String(settings.bytesPerSecond);
  rows.push(["caps", `max_connections ${settings.maxConnections}, bytes_per_second ${cap}`]);
  rows.push(["extra_ca", settings.extraCa ?? "-"]);
  const hosts = Object.entries(settings.hosts).map(([name, ip]) => `${name} = ${ip}`);
  rows.push(["hosts", hosts.length === 0 ? "-" : hosts.join(", ")]);
  const lines = [`Egress of ${whose}, from ${configSource(config)}`];
  lines.push(...table(rows).trimEnd().split("\n").map((line) => `  ${line}`));
  if (report.secrets.length > 0) {
    const secretRows = [["SECRET", "HOSTS", "HEADER", "FORMAT", "ENV", "SOURCE"]];
    for (const s of report.secrets) {
      const source = "env" in s.source ? `env ${s.source.env}` : `file ${s.source.file}`;
      secretRows.push([
        s.name,
        s.hosts.join(","),
        s.header,
        s.format,
        s.env,
        `${source} (${s.status})`,
      ]);
    }
    lines.push("", ...table(secretRows).trimEnd().split("\n"));
  }
  return `${lines.join("\n")}\n`;
}
