/**
 * The composition of one proxy identity's egress policy from `waffle.toml`,
 * by intersection. A sandbox is allowed `[sandbox] egress`, narrowed by
 * `[users.<user>] egress`; a restricted server is its own identity, allowed
 * its own `egress` narrowed by its group's and its cron job's. A sandbox
 * server shares its sandbox's egress, so a group or cron job whose list does
 * not cover the sandbox's denies it (see {@linkcode planEgress}); a host
 * server has the host's network.
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import { checkId } from "./sandbox_key.ts";
import { listed, type ResolvedSubject, resolveSubject } from "./subject.ts";
import { beyond, formatEntry, intersect, mergeEntries } from "./egress_entries.ts";
import type { EgressEntry, EgressPolicy, SecretConfig } from "./egress_types.ts";
import type { McpPolicy, McpServerConfig } from "./mcp_types.ts";
import type { EgressConfig } from "./egress_checks.ts";

/** An identity's allowed destinations and the config keys they were composed from. */
export interface ComposedEgress {
  /** The allowed destinations, intersected. */
  allow: EgressEntry[];
  /** The keys intersected, in order: `["sandbox.egress", "users.alice.egress"]`. */
  keys: string[];
}

/** Who a proxy identity is, for {@linkcode egressPolicy}. */
export interface EgressSubject {
  /** The tenant of the user. */
  tenant: string;
  /** The user. */
  user: string;
  /** An MCP server: a restricted server's session is an identity of its own. */
  server?: string | undefined;
  /** The group of the server's session (default "default"). */
  group?: string | undefined;
  /** The cron job of the server's session (its group is then the job's). */
  cron?: string | undefined;
}

/**
 * What a planned MCP server reaches beyond its container: `"none"`, `"any"`
 * (the host's network, or a sandbox with network "bridge"), or the entries
 * the egress proxy allows it, formatted (`[]`: the proxy allows nothing).
 */
export type PlannedEgress = "none" | "any" | string[];

/**
 * The policy of one proxy identity. For a sandbox (no `server`): undefined
 * when `[sandbox] egress` is absent (or the network is not "none"); else
 * `[sandbox] egress` narrowed by `[users.<user>] egress`, the sandbox's
 * `egress_addresses`, and the secrets of `[users.<user>] secrets`, else of
 * `[sandbox] secrets`. For a restricted server: undefined unless it has
 * `egress` (or its cron job has network "none"); else its `egress` narrowed
 * by its group's and cron job's, its own `egress_addresses` and `secrets`.
 * A sandbox server's is its sandbox's; a host server has none (it has the
 * host's network).
 *
 * @example
 * ```ts ignore
 * const policy = egressPolicy(loadWaffleConfig(), { tenant: "default", user: "alice" });
 * if (policy !== undefined) console.log(policy.allow.map(formatEntry));
 * ```
 *
 * @param config The loaded configuration.
 * @param who The tenant and user, and for a server's session the server, its group or cron job.
 * @returns The policy, or undefined when egress is not attached.
 * @throws {UsageError} On a bad tenant or user id, an unknown server, group or cron job,
 *   both a group and a cron job, or a group or cron job without a server.
 */
export function egressPolicy(config: EgressConfig, who: EgressSubject): EgressPolicy | undefined {
  checkId("tenant id", who.tenant);
  checkId("user id", who.user);
  const { policy } = config;
  if (who.server === undefined) {
    if (who.group !== undefined || who.cron !== undefined) {
      throw new UsageError(
        `A group or cron job applies only to an MCP server's session: group '${
          who.group ?? "-"
        }', cron '${who.cron ?? "-"}'`,
      );
    }
    const composed = sandboxEgress(config, who.user);
    if (composed === undefined) return undefined;
    const user = Object.hasOwn(policy.users, who.user) ? policy.users[who.user] : undefined;
    const names = user?.secrets ?? config.sandbox.secrets ?? [];
    return {
      allow: composed.allow,
      addresses: [...(config.sandbox.egressAddresses ?? [])],
      allowHost: config.sandbox.egressAllowHostLoopback === true,
      secrets: secretsNamed(policy, names),
    };
  }
  const server = serverNamed(policy, who.server);
  const scope = resolveSubject(policy, who);
  if (server.authority === "host") return undefined;
  if (server.authority === "sandbox") {
    return egressPolicy(config, { ...who, server: undefined, group: undefined, cron: undefined });
  }
  const composed = composeServer(policy, server, scope);
  if (composed === undefined) return undefined;
  return {
    allow: composed.allow,
    addresses: [...(server.egressAddresses ?? [])],
    allowHost: server.egressAllowHostLoopback === true,
    secrets: secretsNamed(policy, server.secrets ?? []),
  };
}

function serverNamed(policy: McpPolicy, name: string): McpServerConfig {
  if (!Object.hasOwn(policy.servers, name)) {
    throw new UsageError(
      `Unknown MCP server '${name}'; configured: ${listed(Object.keys(policy.servers))}`,
    );
  }
  return policy.servers[name]!;
}

function secretsNamed(policy: McpPolicy, names: readonly string[]): SecretConfig[] {
  return names.flatMap((name) =>
    Object.hasOwn(policy.secrets, name) ? [policy.secrets[name]!] : []
  );
}

/**
 * A sandbox's allowed destinations: `[sandbox] egress`, narrowed by
 * `[users.<user>] egress` when the user has one.
 *
 * @example
 * ```ts ignore
 * sandboxEgress(config, "alice"); // { allow: [...], keys: ["sandbox.egress", "users.alice.egress"] }
 * ```
 *
 * @param config The loaded configuration.
 * @param user The user; absent = the home's list, which every user's is within.
 * @returns The list and its keys, or undefined when egress is not attached.
 */
export function sandboxEgress(config: EgressConfig, user?: string): ComposedEgress | undefined {
  const list = config.sandbox.egress;
  if (list === undefined || config.sandbox.network !== "none") return undefined;
  const narrowing = user !== undefined && Object.hasOwn(config.policy.users, user)
    ? config.policy.users[user]!.egress
    : undefined;
  if (narrowing === undefined) return { allow: mergeEntries(list), keys: ["sandbox.egress"] };
  return { allow: intersect(list, narrowing), keys: ["sandbox.egress", `users.${user}.egress`] };
}

/**
 * A restricted server's allowed destinations: its `egress`, narrowed by its
 * group's and its cron job's `egress`.
 *
 * @example
 * ```ts ignore
 * serverEgress(config, { server: "fetch", cron: "nightly" }); // { allow: [...], keys: ["mcp.fetch.egress", "cron.nightly.egress"] }
 * ```
 *
 * @param config The loaded configuration.
 * @param who The server and its group or cron job.
 * @returns The list and its keys, or undefined when egress is not attached
 *   (no `egress` of its own, not restricted, or a cron job with network "none").
 * @throws {UsageError} On an unknown server, group or cron job, or both a group and a cron job.
 */
export function serverEgress(
  config: EgressConfig,
  who: { server: string; group?: string | undefined; cron?: string | undefined },
): ComposedEgress | undefined {
  const server = serverNamed(config.policy, who.server);
  const scope = resolveSubject(config.policy, who);
  return server.authority === "restricted"
    ? composeServer(config.policy, server, scope)
    : undefined;
}

function composeServer(
  policy: McpPolicy,
  server: McpServerConfig,
  scope: ResolvedSubject,
): ComposedEgress | undefined {
  if (server.egress === undefined || scope.cron?.network === "none") return undefined;
  let allow = mergeEntries(server.egress);
  const keys = [`mcp.${server.name}.egress`];
  for (const limit of egressLimits(policy, scope)) {
    allow = intersect(allow, limit.list);
    keys.push(limit.key);
  }
  return { allow, keys };
}

// The group's and the cron job's lists, where declared.
function egressLimits(
  policy: McpPolicy,
  scope: ResolvedSubject,
): { what: string; key: string; list: EgressEntry[] }[] {
  const limits: { what: string; key: string; list: EgressEntry[] }[] = [];
  const group = Object.hasOwn(policy.groups, scope.group) ? policy.groups[scope.group] : undefined;
  if (group?.egress !== undefined) {
    limits.push({
      what: `group '${group.name}'`,
      key: `groups.${group.name}.egress`,
      list: group.egress,
    });
  }
  const cron = scope.cron;
  if (cron?.egress !== undefined) {
    limits.push({
      what: `cron '${cron.name}'`,
      key: `cron.${cron.name}.egress`,
      list: cron.egress,
    });
  }
  return limits;
}

/**
 * A planned server's egress and the reasons it denies the server. A
 * restricted server gets {@linkcode serverEgress}'s list and is never denied
 * for it. A sandbox server shares its sandbox's egress, which a group or
 * cron job cannot narrow: it is denied when their `egress` does not cover
 * the sandbox's list, when the sandbox has network "bridge" (it reaches
 * anything), or when a cron job with network "none" meets a sandbox that
 * reaches something through the proxy. A host server is denied when a group
 * or cron job declares `egress` (it has the host's network).
 *
 * @example
 * ```ts ignore
 * const { egress, reasons } = planEgress(config, { server, scope: resolveSubject(config.policy, { cron: "nightly" }) });
 * ```
 *
 * @param config The sandbox settings and the policy.
 * @param context The server, its group or cron job, and the user (absent: the home's list).
 * @returns What it reaches, and the denials (empty when none).
 */
export function planEgress(
  config: EgressConfig,
  context: { server: McpServerConfig; scope: ResolvedSubject; user?: string | undefined },
): { egress: PlannedEgress; reasons: string[] } {
  const { server, scope } = context;
  if (server.authority === "restricted") {
    const composed = composeServer(config.policy, server, scope);
    return {
      egress: composed === undefined ? "none" : composed.allow.map(formatEntry),
      reasons: [],
    };
  }
  const limits = egressLimits(config.policy, scope);
  const only = (limit: { what: string; key: string; list: EgressEntry[] }): string =>
    `${limit.what} ${
      limit.list.length === 0 ? "allows no egress" : `allows egress only to ${shown(limit.list)}`
    } (${limit.key})`;
  if (server.authority === "host") {
    return {
      egress: "any",
      reasons: limits.map((l) => `${only(l)}; authority "host" has the host's network`),
    };
  }
  const network = config.sandbox.network;
  if (network !== "none") {
    return {
      egress: "any",
      reasons: limits.map((l) =>
        `${
          only(l)
        } but the user sandbox has network "${network}" (sandbox.network), which reaches anything`
      ),
    };
  }
  const sandbox = sandboxEgress(config, context.user);
  if (sandbox === undefined) return { egress: "none", reasons: [] };
  const keys = sandbox.keys.join(", ");
  const reasons = limits.flatMap((l) => {
    const extra = beyond(sandbox.allow, l.list);
    return extra.length === 0
      ? []
      : [`${only(l)} but the user sandbox also allows ${shown(extra)} (${keys})`];
  });
  if (scope.cron?.network === "none" && sandbox.allow.length > 0) {
    reasons.push(
      `cron '${scope.cron.name}' requires network "none" (cron.${scope.cron.name}.network) but the user sandbox reaches ${
        shown(sandbox.allow)
      } through the egress proxy (${keys})`,
    );
  }
  return { egress: sandbox.allow.map(formatEntry), reasons };
}

function shown(list: readonly EgressEntry[]): string {
  return `[${list.map(formatEntry).join(", ")}]`;
}
