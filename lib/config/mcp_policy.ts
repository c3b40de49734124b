/**
 * The MCP policy of `waffle.toml`, built: the `[mcp.<name>]` servers, the
 * `[groups.<name>]` and the `[cron.<name>]` jobs from their schema-valid
 * tables, and the checks that span several of their keys (a contradiction
 * is a config error naming its key). The egress keys and the
 * `[users.<user>]` and `[secrets.<name>]` tables the policy also holds are
 * `egress_schema.ts`'s; the egress checks that span the whole config are
 * `egress_checks.ts`'s.
 *
 * @module
 */
import { normalize } from "../path.ts";
import { buildSecrets, buildUsers } from "./egress_schema.ts";
import { type EnvTable, type PolicyTables, tableNameProblem } from "./mcp_schema.ts";
import {
  CONTAINER_WORKSPACE,
  type CronConfig,
  DEFAULT_CLIENT_REQUESTS,
  type EnvSource,
  type Execution,
  type GroupConfig,
  type McpPolicy,
  type McpServerConfig,
  PACKAGE_PATTERN,
} from "./mcp_types.ts";
import { isExactVersion } from "./package_pin.ts";
import type { ConfigProblem } from "./toml.ts";

const EXACT_RULE = 'must pin an exact version ("npm:<name>@<major.minor.patch>")';

/**
 * Builds the policy from its parsed tables and checks what spans several
 * keys: names, authority against execution, package or command, declared
 * groups and servers of cron jobs. The egress checks that span the whole
 * config are `egressConfigProblem`'s, once every layer is applied.
 *
 * @example
 * ```ts ignore
 * const result = buildPolicy({ mcp: {}, groups: { main: { mode: "docker" } } });
 * if ("problem" in result) throw new Error(result.problem.detail);
 * ```
 *
 * @param tables The schema-valid `mcp`, `groups` and `cron` tables.
 * @returns The policy, or the first problem with its key.
 */
export function buildPolicy(
  tables: PolicyTables,
): { policy: McpPolicy } | { problem: ConfigProblem } {
  const servers: Record<string, McpServerConfig> = {};
  const groups: Record<string, GroupConfig> = {};
  const cron: Record<string, CronConfig> = {};
  const badName = tableNameProblem(tables as Record<string, unknown>);
  if (badName !== undefined) return { problem: badName };
  for (const [name, raw] of Object.entries(tables.mcp ?? {})) {
    const key = `mcp.${name}`;
    if (raw.package !== undefined && raw.command !== undefined) {
      return {
        problem: {
          key: `${key}.command`,
          detail:
            `must be absent when '${key}.package' is set (exactly one of package or command), found ${
              JSON.stringify(raw.command)
            }`,
        },
      };
    }
    if (raw.package === undefined && raw.command === undefined) {
      return {
        problem: {
          key: `${key}.package`,
          detail: `or '${key}.command' must be set, found neither`,
        },
      };
    }
    const needed: Execution = raw.authority === "host" ? "host" : "sandbox";
    if (raw.execution !== needed) {
      return {
        problem: {
          key: `${key}.execution`,
          detail:
            `must be "${needed}" when authority is "${raw.authority}", found "${raw.execution}"`,
        },
      };
    }
    if (raw.package !== undefined) {
      const [, packageName = "", requested = ""] = PACKAGE_PATTERN.exec(raw.package) ?? [];
      if (!isExactVersion(requested)) {
        return {
          problem: {
            key: `${key}.package`,
            detail: `${EXACT_RULE}, found ${JSON.stringify(raw.package)}`,
            unpinned: { packageName, requested },
          },
        };
      }
    }
    const cwd = raw.cwd === undefined ? undefined : serverCwd(raw.cwd, raw.execution);
    if (cwd !== undefined && "problem" in cwd) {
      return { problem: { key: `${key}.cwd`, detail: cwd.problem } };
    }
    const envSources = sourcesOf(raw.env);
    servers[name] = {
      name,
      ...(raw.package === undefined ? {} : { package: raw.package }),
      ...(raw.command === undefined ? {} : { command: raw.command }),
      args: [...raw.args],
      execution: raw.execution,
      authority: raw.authority,
      ...(raw.groups === undefined ? {} : { groups: unique(raw.groups) }),
      env: envSources.map((source) => source.name),
      envSources,
      ...(cwd?.path === undefined ? {} : { cwd: cwd.path }),
      maxMessageBytes: raw.max_message_bytes,
      ...(raw.tools === undefined ? {} : { tools: unique(raw.tools) }),
      clientRequests: unique(raw.client_requests ?? [...DEFAULT_CLIENT_REQUESTS]),
      ...(raw.egress === undefined ? {} : { egress: raw.egress }),
      ...(raw.egress_addresses === undefined ? {} : { egressAddresses: raw.egress_addresses }),
      ...(raw.egress_allow_host_loopback === undefined
        ? {}
        : { egressAllowHostLoopback: raw.egress_allow_host_loopback }),
      ...(raw.secrets === undefined ? {} : { secrets: raw.secrets }),
    };
  }
  for (const [name, raw] of Object.entries(tables.groups ?? {})) {
    groups[name] = {
      name,
      mode: raw.mode,
      ...(raw.egress === undefined ? {} : { egress: raw.egress }),
    };
  }
  for (const [name, raw] of Object.entries(tables.cron ?? {})) {
    const key = `cron.${name}`;
    if (!Object.hasOwn(groups, raw.group)) {
      return {
        problem: {
          key: `${key}.group`,
          detail: `must name a declared [groups.<name>] table, found ${JSON.stringify(raw.group)}`,
        },
      };
    }
    const stray = (raw.mcp ?? []).findIndex((server) => !Object.hasOwn(servers, server));
    if (stray >= 0) {
      return {
        problem: {
          key: `${key}.mcp[${stray}]`,
          detail: `must name a configured [mcp.<name>] server, found ${
            JSON.stringify(raw.mcp![stray])
          }`,
        },
      };
    }
    let workdir = raw.workdir === undefined
      ? undefined
      : normalize(raw.workdir).replace(/\/+$/, "");
    if (workdir === ".") workdir = undefined;
    cron[name] = {
      name,
      group: raw.group,
      ...(raw.mcp === undefined ? {} : { mcp: unique(raw.mcp) }),
      ...(raw.network === undefined ? {} : { network: raw.network }),
      ...(workdir === undefined ? {} : { workdir }),
      ...(raw.env === undefined ? {} : { env: unique(raw.env) }),
      ...(raw.egress === undefined ? {} : { egress: raw.egress }),
    };
  }
  const secrets = buildSecrets(tables.secrets);
  if ("problem" in secrets) return secrets;
  return {
    policy: { servers, groups, cron, secrets: secrets.secrets, users: buildUsers(tables.users) },
  };
}

function unique<T>(values: T[]): T[] {
  return [...new Set(values)];
}

// The array form names host variables; the table form mixes literals and
// `{ host = "NAME" }`. A name given twice in the array counts once.
function sourcesOf(env: EnvTable): EnvSource[] {
  if (Array.isArray(env)) return unique(env).map((name) => ({ name, host: name }));
  return Object.entries(env).map(([name, from]) =>
    typeof from === "string" ? { name, value: from } : { name, host: from.host }
  );
}

// In a container: under /workspace, relative to it or absolute, never out of
// it. On the host: absolute, or relative to the server's state directory.
function serverCwd(
  raw: string,
  execution: Execution,
): { path: string | undefined } | { problem: string } {
  const found = `found ${JSON.stringify(raw)}`;
  if (execution === "host") {
    if (raw.split("/").includes("..")) {
      return { problem: `must not contain '..' on the host, ${found}` };
    }
    const path = normalize(raw).replace(/(.)\/+$/, "$1");
    return { path: path === "." ? undefined : path };
  }
  let relative = raw;
  if (raw.startsWith("/")) {
    const absolute = normalize(raw).replace(/(.)\/+$/, "$1");
    if (absolute === CONTAINER_WORKSPACE) return { path: undefined };
    if (!absolute.startsWith(`${CONTAINER_WORKSPACE}/`)) {
      return {
        problem: `must be under /workspace (relative to it, or absolute under it), ${found}`,
      };
    }
    relative = absolute.slice(CONTAINER_WORKSPACE.length + 1);
  }
  const path = normalize(relative).replace(/\/+$/, "");
  if (path === ".." || path.startsWith("../")) {
    return { problem: `must stay under /workspace ('..' leads out of it), ${found}` };
  }
  return { path: path === "." || path === "" ? undefined : path };
}
