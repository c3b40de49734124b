/**
 * doctor's MCP rows: `mcp config` (the file read and the places looked at;
 * a warning when it shadows another), one `mcp <name> authority` row per
 * configured server (always), an `mcp <name> env` row for a server whose
 * `env` names host variables (a warning for each one unset), and with
 * Docker an `initialize` + `tools/list` probe of each server that executes
 * in a sandbox, in a throwaway home (a warning for each allowlisted tool the
 * server does not offer).
 *
 * @module
 */
import {
  configCandidates,
  configSource,
  loadWaffleConfig,
  type WaffleConfig,
} from "../config/config.ts";
import { exists } from "../fs.ts";
import { unsetHostEnv } from "../mcp/plan.ts";
import type { McpServerConfig } from "../config/mcp_types.ts";
import { probeConfiguredServer } from "./mcp_probe.ts";
import { notOfferedWarning, unsetEnvWarning } from "./mcp_warnings.ts";
import type { CheckOutcome, DoctorCheck } from "./doctor.ts";

/**
 * The MCP checks for the configured servers.
 *
 * @example
 * ```ts ignore
 * const checks = mcpChecks({ docker: true });
 * ```
 *
 * @param options `docker`: also probe the sandboxed servers; `configPath`: the config file.
 * @returns The checks, in config order.
 * @throws {UsageError} When the config cannot be loaded (doctor shows it as the group's row).
 */
export function mcpChecks(
  options: { docker: boolean; configPath?: string | undefined },
): DoctorCheck[] {
  const config = loadWaffleConfig({ configPath: options.configPath });
  const servers = Object.values(config.policy.servers);
  const rows: DoctorCheck[] = [{ name: "mcp config", run: () => Promise.resolve(source(config)) }];
  for (const server of servers) {
    rows.push({
      name: `mcp ${server.name} authority`,
      run: () => Promise.resolve(describe(server)),
    });
    if (server.envSources.some((entry) => "host" in entry)) {
      rows.push({ name: `mcp ${server.name} env`, run: () => Promise.resolve(hostEnv(server)) });
    }
  }
  if (!options.docker) return rows;
  for (const server of servers.filter((s) => s.execution === "sandbox")) {
    rows.push({ name: `mcp ${server.name} probe`, run: () => probe(config, server) });
  }
  return rows;
}

// The file read, and a warning when a later place also has one (it is not read).
function source(config: WaffleConfig): CheckOutcome {
  const found = configSource(config);
  const later = shadowed(config);
  if (later.length === 0) return found;
  return {
    detail: `${found}; also present and not read: ${later.map((p) => `'${p}'`).join(", ")}`,
    warning: true,
  };
}

// Only a file found by the search (not --config, WAFFLE_CONFIG or
// WAFFLE_HOME's) hides the places after it.
function shadowed(config: WaffleConfig): string[] {
  if (config.path === undefined) return [];
  const places = configCandidates();
  const at = places.indexOf(config.path);
  const searched = at >= 0 && config.searched.length === at + 1 &&
    config.searched.every((path, i) => path === places[i]);
  return searched ? places.slice(at + 1).filter((path) => exists(path)) : [];
}

function describe(server: McpServerConfig): string {
  return [
    `execution=${server.execution}`,
    `authority=${server.authority}`,
    `groups=${server.groups?.join(",") ?? "all"}`,
    `env=${server.env.length === 0 ? "none" : server.env.join(",")}`,
    `tools=${server.tools?.join(",") ?? "all"}`,
  ].join(" ");
}

function hostEnv(server: McpServerConfig): CheckOutcome {
  const hosts = server.envSources.flatMap((entry) => "host" in entry ? [entry] : []);
  const unset = unsetHostEnv(hosts);
  if (unset.length === 0) {
    return `host variables set: ${hosts.map((entry) => entry.host).join(",")}`;
  }
  return {
    detail: unset.map((entry) => unsetEnvWarning(server.name, entry)).join("; "),
    warning: true,
  };
}

// Probes with the plan of the server's first group (or "default"), as a
// throwaway user "doctor" in a throwaway home.
async function probe(config: WaffleConfig, server: McpServerConfig): Promise<CheckOutcome> {
  const group = server.groups?.[0];
  const subject = group === undefined ? {} : { group };
  const found = await probeConfiguredServer(config, server.name, { subject, user: "doctor" });
  const allowed = found.allowed === "all" ? "all allowed" : `${found.allowed} allowed`;
  const detail = `${found.where}: ${found.tools.length} tools (${allowed}), initialize ${
    found.initializeMs.toFixed(0)
  } ms, tools/list ${found.listMs.toFixed(1)} ms, ${
    found.totalMs.toFixed(0)
  } ms with the container start`;
  if (found.notOffered.length === 0) return detail;
  return {
    detail: `${detail}; ${notOfferedWarning(server.name, found.notOffered)}`,
    warning: true,
  };
}
