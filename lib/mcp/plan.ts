/**
 * Launch planning: given the config and a group or cron job, where each MCP
 * server executes, with what network, workspace, tools, requests to the
 * client, environment names and state directories, or why it is denied.
 * Pure: no I/O, no environment reads (except {@linkcode resolveEnv} and
 * {@linkcode unsetHostEnv}, which read only the host variables named).
 *
 * Composition is by intersection: a server must be allowed by its own
 * `groups`, by the group's mode and by the cron job's `mcp`, `network` and
 * `env`, and its egress by the group's and cron job's `egress` (see
 * `planEgress`). A server with `execution = "sandbox"` is never planned on
 * the host.
 *
 * @module
 */
import { join } from "../path.ts";
import type { EgressEntry } from "../config/egress_types.ts";
import { planEgress, type PlannedEgress } from "../config/egress_compose.ts";
import {
  type ClientRequestMethod,
  CONTAINER_WORKSPACE,
  type EnvSource,
  type McpPolicy,
  type McpServerConfig,
} from "../config/mcp_types.ts";
import { type ServerState, serverState } from "./server_state.ts";
import { type ResolvedSubject, resolveSubject } from "../config/subject.ts";

export { CONTAINER_WORKSPACE } from "../config/mcp_types.ts";
export { DEFAULT_GROUP } from "../config/subject.ts";
export type { PlannedEgress } from "../config/egress_compose.ts";

/** Where a launched server executes: the host, the user's sandbox, or a restricted container. */
export type Where = "host" | "sandbox" | "restricted";

/** One server's launch decision. */
export interface PlannedServer {
  /** The server's name (`[mcp.<name>]`). */
  name: string;
  /** Whether it may be launched. */
  decision: "launch" | "denied";
  /** Why it is denied, one line each; empty when launched. */
  reasons: string[];
  /** Where it executes; set when launched. */
  where?: Where | undefined;
  /** What runs: an npm package (run by waffle's Deno) or a program, and its arguments. */
  program: { package?: string; command?: string; args: string[] };
  /**
   * Working directory. In a container: `/workspace/<cwd>` (the server's own
   * `cwd`), else `/workspace/<cron workdir>`, else `/workspace`. On the host:
   * the server's absolute `cwd`, or one relative to its state root, else the
   * state root itself.
   */
  cwd: string;
  /**
   * Its writable state: the root and the variables naming it (`HOME`,
   * `XDG_*_HOME`, `TMPDIR`; see `server_state.ts`). On the host under the
   * waffle home (`config.sandbox.home`, shown as `$WAFFLE_HOME` when the
   * plan was made without one).
   */
  state: ServerState;
  /** Network: restricted always "none"; sandbox the user sandbox's; host "host". */
  network: "none" | "bridge" | "host";
  /**
   * What it reaches beyond its container: "none"; "any" (host: the host's
   * network; sandbox: a sandbox with network "bridge"); or the entries its
   * egress proxy allows, formatted as in `waffle.toml` (sandbox: the user
   * sandbox's `[sandbox] egress`, narrowed by `[users.<user>] egress` when the
   * plan names the user; restricted: its own `egress` narrowed by its group's
   * and cron job's). See `planEgress`.
   */
  egress: PlannedEgress;
  /** The workspace: sandbox "rw", restricted "ro", host "none". */
  workspace: "rw" | "ro" | "none";
  /** The tools it lists and accepts. */
  tools: string[] | "all";
  /** The requests it may send to the client (`client_requests`); the relay refuses others. */
  clientRequests: ClientRequestMethod[];
  /** The names of the config's `env` variables it gets, sorted (cron `env` narrows them). */
  env: string[];
  /**
   * Where each of those comes from, in the order of `env`: a host variable
   * (its value is read at launch and never shown) or a literal of the config.
   */
  envSources: EnvSource[];
  /** The largest JSON-RPC message the relay accepts for this server (`max_message_bytes`). */
  maxMessageBytes: number;
}

/** The plan of a group or cron job. */
export interface LaunchPlan {
  /** What the plan was made for. */
  subject: { kind: "group" | "cron"; name: string };
  /** The group whose policy applies (a cron job's group). */
  group: string;
  /** Every configured server, denied ones included, in config order. */
  servers: PlannedServer[];
}

/** What planning needs of the configuration. */
export interface PlanConfig {
  /**
   * The sandbox settings that matter: its mode, network and egress list, and
   * the home (host servers' cwd).
   */
  sandbox: {
    mode: "docker" | "host";
    network: "none" | "bridge";
    home?: string | undefined;
    egress?: EgressEntry[] | undefined;
  };
  /** The MCP policy. */
  policy: McpPolicy;
}

/**
 * Plans the launch of every configured server for a group or a cron job.
 *
 * @example
 * ```ts ignore
 * const plan = planLaunch(loadWaffleConfig(), { cron: "nightly" });
 * for (const server of launchable(plan)) console.log(server.name, server.where);
 * ```
 *
 * @param config The sandbox mode, network and egress, and the policy.
 * @param subject A group (declared, or "default") or a cron job; neither means group "default".
 *   `user` names the user whose sandbox a sandbox server shares (its `[users.<user>] egress`
 *   then narrows the sandbox's list); absent, the home's `[sandbox] egress` is planned.
 * @returns The plan, denied servers included.
 * @throws {UsageError} When both are given, or the group or cron job is not configured.
 */
export function planLaunch(
  config: PlanConfig,
  subject: { group?: string | undefined; cron?: string | undefined; user?: string | undefined } =
    {},
): LaunchPlan {
  const { policy } = config;
  const scope = resolveSubject(policy, subject);
  const { group, cron } = scope;
  const servers = Object.values(policy.servers).map((server) =>
    planServer(server, { config, scope, user: subject.user })
  );
  return {
    subject: cron === undefined
      ? { kind: "group", name: group }
      : { kind: "cron", name: cron.name },
    group,
    servers,
  };
}

/**
 * The servers of a plan that may be launched; denied ones are filtered out.
 *
 * @example
 * ```ts ignore
 * const names = launchable(planLaunch(config, { group: "main" })).map((s) => s.name);
 * ```
 *
 * @param plan A launch plan.
 * @returns Its servers whose decision is "launch".
 */
export function launchable(plan: LaunchPlan): PlannedServer[] {
  return plan.servers.filter((server) => server.decision === "launch");
}

/**
 * Resolves a server's environment at launch: a literal is its value, a host
 * variable is read (only the variables named are read). A host variable that
 * is not set is omitted ({@linkcode unsetHostEnv} says which).
 *
 * @example
 * ```ts ignore
 * const env = resolveEnv(planned.envSources); // { GREETING: "hi", MEMORY_FILE_PATH: "/workspace/m.jsonl" }
 * ```
 *
 * @param from A plan's `envSources`.
 * @param source Reads one host variable; default the process environment (needs `--allow-env`).
 * @returns The variables that have a value.
 */
export function resolveEnv(
  from: readonly EnvSource[],
  source: (name: string) => string | undefined = (name) => Deno.env.get(name),
): Record<string, string> {
  const entries: [string, string][] = [];
  const seen = new Set<string>();
  for (const entry of from) {
    if (seen.has(entry.name)) continue;
    seen.add(entry.name);
    const value = "value" in entry ? entry.value : source(entry.host);
    if (value !== undefined) entries.push([entry.name, value]);
  }
  // fromEntries defines own properties, so a name like `__proto__` stays data.
  return Object.fromEntries(entries);
}

/**
 * The host variables a server's `env` names that are not set: the server
 * would start without them.
 *
 * @example
 * ```ts ignore
 * for (const { name, host } of unsetHostEnv(planned.envSources)) console.error(name, host);
 * ```
 *
 * @param from A plan's `envSources`.
 * @param source Reads one host variable; default the process environment.
 * @returns The sources, in order, whose host variable is unset.
 */
export function unsetHostEnv(
  from: readonly EnvSource[],
  source: (name: string) => string | undefined = (name) => Deno.env.get(name),
): { name: string; host: string }[] {
  return from.flatMap((entry) =>
    "host" in entry && source(entry.host) === undefined ? [entry] : []
  );
}

function planServer(
  server: McpServerConfig,
  context: { config: PlanConfig; scope: ResolvedSubject; user: string | undefined },
): PlannedServer {
  const { config, scope } = context;
  const { group, cron } = scope;
  const reasons: string[] = [];
  const where: Where = server.authority;
  if (server.groups !== undefined && !server.groups.includes(group)) {
    reasons.push(
      `group '${group}' is not in mcp.${server.name}.groups ${JSON.stringify(server.groups)}`,
    );
  }
  if (cron?.mcp !== undefined && !cron.mcp.includes(server.name)) {
    reasons.push(
      `cron '${cron.name}' allows only mcp ${JSON.stringify(cron.mcp)} (cron.${cron.name}.mcp)`,
    );
  }
  const declared = config.policy.groups[group];
  const groupMode = declared?.mode ?? config.sandbox.mode;
  if (server.execution === "host" && groupMode === "docker") {
    reasons.push(
      declared === undefined
        ? `group '${group}' requires docker (sandbox.mode is "docker"); execution "host" is not allowed`
        : `group '${group}' requires docker (groups.${group}.mode); execution "host" is not allowed`,
    );
  }
  if (server.execution === "sandbox" && config.sandbox.mode === "host") {
    reasons.push(
      `sandbox.mode is "host": there is no sandbox for execution "sandbox", and it is never started on the host`,
    );
  }
  if (cron?.network === "none") {
    if (where === "host") {
      reasons.push(
        `cron '${cron.name}' requires network "none" (cron.${cron.name}.network); authority "host" has the host's network`,
      );
    } else if (where === "sandbox" && config.sandbox.network !== "none") {
      reasons.push(
        `cron '${cron.name}' requires network "none" (cron.${cron.name}.network) but the user sandbox has network "${config.sandbox.network}" (sandbox.network)`,
      );
    }
  }
  const state = serverState(
    { name: server.name, where, package: server.package },
    { home: config.sandbox.home },
  );
  // A server's own cwd wins over its cron job's workdir.
  const cwd = where === "host"
    ? (server.cwd?.startsWith("/") ? server.cwd : join(state.root, server.cwd ?? "."))
    : join(CONTAINER_WORKSPACE, server.cwd ?? cron?.workdir ?? ".");
  if (
    where !== "host" && cwd !== CONTAINER_WORKSPACE && !cwd.startsWith(`${CONTAINER_WORKSPACE}/`)
  ) {
    reasons.push(
      `cron '${cron?.name}' workdir ${
        JSON.stringify(cron?.workdir)
      } is outside /workspace (cron.${cron?.name}.workdir)`,
    );
  }
  const egress = planEgress(config, { server, scope, user: context.user });
  reasons.push(...egress.reasons);
  const envSources = server.envSources
    .filter((entry) => cron?.env === undefined || cron.env.includes(entry.name))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const denied = reasons.length > 0;
  return {
    name: server.name,
    decision: denied ? "denied" : "launch",
    reasons,
    ...(denied ? {} : { where }),
    program: {
      ...(server.package === undefined ? {} : { package: server.package }),
      ...(server.command === undefined ? {} : { command: server.command }),
      args: [...server.args],
    },
    cwd: cwd.length > 1 ? cwd.replace(/\/+$/, "") : cwd,
    state,
    network: where === "host" ? "host" : where === "restricted" ? "none" : config.sandbox.network,
    egress: egress.egress,
    workspace: where === "host" ? "none" : where === "restricted" ? "ro" : "rw",
    tools: server.tools === undefined ? "all" : [...server.tools],
    clientRequests: [...server.clientRequests],
    env: envSources.map((entry) => entry.name),
    envSources: envSources.map((entry) => ({ ...entry })),
    maxMessageBytes: server.maxMessageBytes,
  };
}
