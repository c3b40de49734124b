/**
 * What a sandbox is, resolved from the whole config once per call: whose it
 * is (its key, and so its container name), its settings (image, limits,
 * mounts' sources, variables, artefact), its egress identity (or none) and
 * the MCP policy. Lifecycle, egress and MCP consume this value and never
 * decide it themselves. A restricted MCP server's session is an egress
 * identity of its own, resolved when the session opens.
 *
 * A sandbox's identity is recorded in its host-only state directory (see
 * `lib/lifecycle/egress_record.ts`), where the container spec reads it, so
 * the warm path, a full ensure and `sweep` compute the same posture (the
 * attach decision, its socket and its placeholders are part of it; the list
 * of destinations is not: a change to it applies without recycling).
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { UsageError } from "../errors.ts";
import type { SandboxConfig, WaffleConfig } from "./config.ts";
import { egressPolicy } from "./egress_compose.ts";
import type { EgressAttachment } from "./egress_types.ts";
import type { McpPolicy } from "./mcp_types.ts";
import { type SandboxKey, sandboxKey } from "./sandbox_key.ts";
import { resolveSubject } from "./subject.ts";

/** A user's sandbox as the config decides it. */
export interface ResolvedSandbox {
  /** Whose sandbox, and its container name. */
  key: SandboxKey;
  /** Its settings, every layer applied. */
  config: SandboxConfig;
  /** Its egress identity; undefined when the config attaches none (and no egress code runs). */
  egress: EgressAttachment | undefined;
  /** The MCP policy its servers run under. */
  policy: McpPolicy;
}

/**
 * Resolves a user's sandbox from the whole config.
 *
 * @example
 * ```ts ignore
 * const resolved = resolveSandbox(loadWaffleConfig(), { tenant: "default", user: "alice" });
 * if (resolved.egress === undefined) console.log("no egress");
 * ```
 *
 * @param config The whole config.
 * @param who The tenant and user.
 * @returns The sandbox.
 * @throws {UsageError} On a bad tenant or user id.
 */
export function resolveSandbox(
  config: WaffleConfig,
  who: { tenant: string; user: string; pool?: string | undefined },
): ResolvedSandbox {
  const key = sandboxKey(who.tenant, who.user, { home: config.sandbox.home, pool: who.pool });
  return {
    key,
    config: config.sandbox,
    egress: sandboxAttachment(config, key),
    policy: config.policy,
  };
}

/**
 * The egress identity of a user's sandbox, or undefined when its config
 * attaches none (`[sandbox] egress` absent).
 *
 * @param config The whole config.
 * @param key Whose sandbox.
 * @returns The attachment.
 */
export function sandboxAttachment(
  config: WaffleConfig,
  key: SandboxKey,
): EgressAttachment | undefined {
  const policy = egressPolicy(config, { tenant: key.tenant, user: key.user });
  if (policy === undefined) return undefined;
  return {
    id: `s-${key.hash.slice(0, 24)}`,
    identity: { tenant: key.tenant, user: key.user, group: null, cron: null, server: null },
    policy,
    settings: config.egress,
  };
}

/** Who a restricted MCP server's session is, for {@linkcode restrictedAttachment}. */
export interface RestrictedSubject {
  /** The user's tenant. */
  tenant: string;
  /** The user whose session it is. */
  user: string;
  /** The server (`[mcp.<name>]`, authority "restricted"). */
  server: string;
  /** The session's group; default "default" (a cron job's group when `cron` is given). */
  group?: string | undefined;
  /** The session's cron job. */
  cron?: string | undefined;
}

/**
 * The egress identity of a restricted MCP server's session, or undefined
 * when it gets none (no `egress` of its own, or a cron job with network
 * "none"): its policy is its own (`egressPolicy` with the server, group and
 * cron job), never its user's sandbox's. The id is derived from (tenant,
 * user, server, group, cron job), so concurrent sessions of one server for
 * one user and scope share one policy file and one socket directory, and
 * any other scope has its own.
 *
 * @example
 * ```ts ignore
 * const egress = restrictedAttachment(loadWaffleConfig(), { tenant: "default", user: "alice", server: "fetch", cron: "nightly" });
 * if (egress !== undefined) console.log(egress.id); // "r-" and 24 hex
 * ```
 *
 * @param config The whole config.
 * @param who The session's tenant, user, server and group or cron job.
 * @returns The attachment.
 * @throws {UsageError} On a bad id, an unknown server, group or cron job, both a group and a
 *   cron job, or a server whose authority is not "restricted".
 */
export function restrictedAttachment(
  config: WaffleConfig,
  who: RestrictedSubject,
): EgressAttachment | undefined {
  const policy = egressPolicy(config, who);
  const authority = config.policy.servers[who.server]!.authority;
  if (authority !== "restricted") {
    // A sandbox server's egress is its sandbox's identity, a host server's the host's network.
    throw new UsageError(
      `Server '${who.server}' has authority "${authority}": only a restricted server's session is an egress identity of its own`,
    );
  }
  if (policy === undefined) return undefined;
  // The scope as the policy resolved it: a cron job's group is the job's.
  const { group } = resolveSubject(config.policy, who);
  const cron = who.cron ?? null;
  const identity = { tenant: who.tenant, user: who.user, group, cron, server: who.server };
  const digest = sha256Hex(JSON.stringify([who.tenant, who.user, who.server, group, cron]));
  return { id: `r-${digest.slice(0, 24)}`, identity, policy, settings: config.egress };
}
