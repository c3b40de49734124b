/**
 * The checks that span the egress keys of `waffle.toml`, once every layer
 * of the config is applied (each a config error naming its key).
 *
 * @module
 */
import { type ConfigProblem, describeFound } from "./toml.ts";
import { listed } from "./subject.ts";
import { formatEntry, hostLoopbackIn } from "./egress_entries.ts";
import type { EgressEntry, SecretConfig } from "./egress_types.ts";
import type { McpPolicy } from "./mcp_types.ts";

/** What egress checks and composition need of the sandbox settings. */
export interface EgressSandbox {
  /** The container's network: egress needs "none". */
  network: "none" | "bridge";
  /** `[sandbox] egress`; undefined = egress not attached. */
  egress?: EgressEntry[] | undefined;
  /** `[sandbox] egress_addresses`, canonical CIDRs. */
  egressAddresses?: readonly string[] | undefined;
  /** `[sandbox] egress_allow_host_loopback`: `egress_addresses` may cover the host's loopback. */
  egressAllowHostLoopback?: boolean | undefined;
  /** `[sandbox] secrets`: names of `[secrets.<name>]` tables. */
  secrets?: readonly string[] | undefined;
  /** `[sandbox] env`: host variables passed into every sandbox. */
  envAllowlist?: readonly string[] | undefined;
}

/** What egress checks and composition need of the configuration. */
export interface EgressConfig {
  /** The sandbox settings, every layer applied. */
  sandbox: EgressSandbox;
  /** The policy: servers, groups, cron jobs, users and secrets. */
  policy: McpPolicy;
}

/**
 * Checks what spans the egress keys once every layer of the config is
 * applied: `[sandbox] egress` needs network "none"; `egress_addresses` and
 * `secrets` need an `egress` list beside them; `egress_addresses` covers
 * no host loopback address unless `egress_allow_host_loopback = true`
 * stands beside it (the proxy has the host's network); every secret named is
 * declared, and no two of one identity share a placeholder variable; a
 * user narrows only a sandbox list and only to its secrets; only a
 * restricted server has egress keys; and no secret's host variable, nor its
 * placeholder's name, is passed in as a plain variable.
 *
 * @example
 * ```ts ignore
 * const problem = egressConfigProblem({ sandbox, policy });
 * if (problem !== undefined) throw new UsageError(`'${problem.key}' ${problem.detail}`);
 * ```
 *
 * @param config The layered sandbox settings and the built policy.
 * @returns The first problem with its key, or undefined.
 */
export function egressConfigProblem(config: EgressConfig): ConfigProblem | undefined {
  return sandboxProblem(config) ?? usersProblem(config) ?? serversProblem(config.policy);
}

function sandboxProblem({ sandbox, policy }: EgressConfig): ConfigProblem | undefined {
  const { egress, egressAddresses = [], secrets = [] } = sandbox;
  if (egress !== undefined && sandbox.network !== "none") {
    return {
      key: "sandbox.egress",
      detail:
        `must be absent when sandbox.network is "${sandbox.network}" (egress needs network "none": the container reaches only the egress proxy), found ${
          describeFound(egress.map(formatEntry))
        }`,
    };
  }
  const stray = strayKey("sandbox", egress, { egressAddresses, secrets }) ??
    loopbackProblem("sandbox", egressAddresses, {
      allowed: sandbox.egressAllowHostLoopback === true,
      who: "every sandbox",
    });
  if (stray !== undefined) return stray;
  const refs = secretRefsProblem("sandbox.secrets", secrets, policy.secrets);
  if (refs !== undefined) return refs;
  const passed = sandbox.envAllowlist ?? [];
  return envLeakProblem("sandbox.env", {
    names: passed,
    hostSources: passed,
    sources: Object.values(policy.secrets),
    placeholders: secrets.map((name) => policy.secrets[name]!),
  });
}

// `egress_addresses` or `secrets` without an `egress` list beside them.
function strayKey(
  at: string,
  egress: EgressEntry[] | undefined,
  keys: { egressAddresses: readonly string[]; secrets: readonly string[] },
): ConfigProblem | undefined {
  if (egress !== undefined) return undefined;
  const [name, value] = keys.egressAddresses.length > 0
    ? ["egress_addresses", keys.egressAddresses]
    : keys.secrets.length > 0
    ? ["secrets", keys.secrets]
    : [undefined, undefined];
  if (name === undefined) return undefined;
  return {
    key: `${at}.${name}`,
    detail: `needs '${at}.egress' beside it (only the egress proxy uses it), found ${
      describeFound(value)
    }`,
  };
}

// An `egress_addresses` entry that covers the host's loopback, unless the
// table says explicitly that it may: the proxy runs with the host's network.
function loopbackProblem(
  at: string,
  addresses: readonly string[],
  options: { allowed: boolean; who: string },
): ConfigProblem | undefined {
  if (options.allowed) return undefined;
  for (const cidr of addresses) {
    const covered = hostLoopbackIn(cidr);
    if (covered === undefined) continue;
    return {
      key: `${at}.egress_addresses`,
      detail: `holds ${
        JSON.stringify(cidr)
      }, which covers the host's loopback (${covered}): the egress proxy has the host's network, so every service listening on the host's loopback (waffle mcp serve included) would be open to ${options.who}; set '${at}.egress_allow_host_loopback = true' to allow that, found ${
        describeFound(addresses)
      }`,
    };
  }
  return undefined;
}

function secretRefsProblem(
  key: string,
  names: readonly string[],
  declared: Readonly<Record<string, SecretConfig>>,
): ConfigProblem | undefined {
  const byEnv = new Map<string, string>();
  for (const [i, name] of names.entries()) {
    if (!Object.hasOwn(declared, name)) {
      return {
        key: `${key}[${i}]`,
        detail: `must name a declared [secrets.<name>] table (${
          listed(Object.keys(declared))
        }), found ${JSON.stringify(name)}`,
      };
    }
    const env = declared[name]!.env;
    const other = byEnv.get(env);
    if (other !== undefined) {
      return {
        key: `${key}[${i}]`,
        detail:
          `puts its placeholder in ${env}, as secret '${other}' does (set secrets.${name}.env), found ${
            JSON.stringify(name)
          }`,
      };
    }
    byEnv.set(env, name);
  }
  return undefined;
}

// A secret's value must not reach the container as a plain variable, nor
// may a plain variable take its placeholder's name.
function envLeakProblem(
  key: string,
  env: {
    names: readonly string[];
    hostSources: readonly string[];
    sources: readonly SecretConfig[];
    placeholders: readonly SecretConfig[];
  },
): ConfigProblem | undefined {
  for (const secret of env.sources) {
    if ("env" in secret.source && env.hostSources.includes(secret.source.env)) {
      return {
        key,
        detail:
          `must not take host variable ${secret.source.env}: it holds secret '${secret.name}' (secrets.${secret.name}.from_env), whose value would enter the container, found ${
            describeFound(env.names)
          }`,
      };
    }
  }
  for (const secret of env.placeholders) {
    if (env.names.includes(secret.env)) {
      return {
        key,
        detail:
          `must not set ${secret.env}: it holds the placeholder of secret '${secret.name}' (secrets.${secret.name}.env), found ${
            describeFound(env.names)
          }`,
      };
    }
  }
  return undefined;
}

function usersProblem({ sandbox, policy }: EgressConfig): ConfigProblem | undefined {
  const allowed = sandbox.secrets ?? [];
  for (const user of Object.values(policy.users)) {
    const key = `users.${user.name}`;
    if (user.egress !== undefined && sandbox.egress === undefined) {
      return {
        key: `${key}.egress`,
        detail: `narrows 'sandbox.egress', which is not set (nothing to narrow), found ${
          describeFound(user.egress.map(formatEntry))
        }`,
      };
    }
    const stray = (user.secrets ?? []).findIndex((name) => !allowed.includes(name));
    if (stray >= 0) {
      return {
        key: `${key}.secrets[${stray}]`,
        detail: `must be one of sandbox.secrets ${JSON.stringify(allowed)}, found ${
          JSON.stringify(user.secrets![stray])
        }`,
      };
    }
  }
  return undefined;
}

function serversProblem(policy: McpPolicy): ConfigProblem | undefined {
  for (const server of Object.values(policy.servers)) {
    const key = `mcp.${server.name}`;
    if (server.authority !== "restricted") {
      const [name, value] = server.egress !== undefined
        ? ["egress", server.egress.map(formatEntry)]
        : server.egressAddresses !== undefined
        ? ["egress_addresses", server.egressAddresses]
        : server.egressAllowHostLoopback !== undefined
        ? ["egress_allow_host_loopback", server.egressAllowHostLoopback]
        : server.secrets !== undefined
        ? ["secrets", server.secrets]
        : [undefined, undefined];
      if (name === undefined) continue;
      const why = server.authority === "sandbox"
        ? "a sandbox server shares its sandbox's egress: set [sandbox] egress"
        : "a host server has the host's network";
      return {
        key: `${key}.${name}`,
        detail: `is only for authority "restricted" (${why}), found ${describeFound(value)}`,
      };
    }
    const secrets = server.secrets ?? [];
    const problem = strayKey(key, server.egress, {
      egressAddresses: server.egressAddresses ?? [],
      secrets,
    }) ??
      loopbackProblem(key, server.egressAddresses ?? [], {
        allowed: server.egressAllowHostLoopback === true,
        who: "the server",
      }) ??
      secretRefsProblem(`${key}.secrets`, secrets, policy.secrets) ??
      envLeakProblem(`${key}.env`, {
        names: server.env,
        hostSources: server.envSources.flatMap((source) => "host" in source ? [source.host] : []),
        sources: secrets.map((name) => policy.secrets[name]!),
        placeholders: secrets.map((name) => policy.secrets[name]!),
      });
    if (problem !== undefined) return problem;
  }
  return undefined;
}
