/**
 * The egress policy of `waffle.toml`: the `egress`, `egress_addresses` and
 * `secrets` keys of `[sandbox]`, `[users.<user>]`, `[groups.<name>]`,
 * `[cron.<name>]` and restricted `[mcp.<name>]` servers, the
 * `[secrets.<name>]` tables and the `[egress]` table. This module owns their
 * schemas, the checks that span several keys (each a config error naming its
 * key), and the composition of one proxy identity's policy from them.
 *
 * Composition is by intersection. A sandbox is allowed `[sandbox] egress`,
 * narrowed by `[users.<user>] egress`; a restricted server is its own
 * identity, allowed its own `egress` narrowed by its group's and its cron
 * job's. A sandbox server shares its sandbox's egress, so a group or cron job
 * whose list does not cover the sandbox's denies it (see
 * {@linkcode planEgress}); a host server has the host's network.
 *
 * @module
 */
import * as z from "../schema.ts";
import { envNameSchema, isEnvName } from "../env_name.ts";
import { UsageError } from "../errors.ts";
import { absolutePathSchema } from "../config/absolute_path.ts";
import { sandboxKey } from "../config/sandbox_key.ts";
import type { McpPolicy, McpServerConfig } from "../mcp/policy.ts";
import { type ConfigProblem, describeFound } from "../config/toml.ts";
import { listed, type ResolvedSubject, resolveSubject } from "../config/subject.ts";
import {
  beyond,
  canonicalIp,
  checkCidr,
  checkEntry,
  formatCidr,
  formatEntry,
  hostLoopbackIn,
  intersect,
  mergeEntries,
  parseCidr,
  parseEntry,
} from "../config/egress_entries.ts";
import type {
  EgressEntry,
  EgressPolicy,
  EgressSettings,
  SecretConfig,
} from "../config/egress_types.ts";

/** `[egress] max_connections` when unset. */
export const DEFAULT_MAX_CONNECTIONS = 64;
/** The largest `[egress] max_connections`. */
export const MAX_MAX_CONNECTIONS = 4096;
/** The most entries of one `egress` or `egress_addresses` list. */
export const MAX_EGRESS_ENTRIES = 1024;

/** One `[users.<user>]` table: how one user's sandbox is narrowed. */
export interface UserEgress {
  /** The table key: a user id as `waffle exec --user` takes it. */
  name: string;
  /** Intersected with `[sandbox] egress`; absent = no narrowing. */
  egress?: EgressEntry[] | undefined;
  /** The secrets this user's sandbox gets instead of `[sandbox] secrets` (a subset); absent = those. */
  secrets?: string[] | undefined;
}

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

const unique = <T>(values: readonly T[]): T[] => [...new Set(values)];

// A string schema whose message says what is wrong with this value.
function ruled(problem: (value: string) => string | undefined): z.ZodMiniString<string> {
  return z.string().check(z.superRefine((value: string, ctx) => {
    const found = problem(value);
    if (found !== undefined) ctx.addIssue({ code: "custom", message: found, input: value });
  }));
}

const entryText = ruled((value) => {
  const checked = checkEntry(value);
  return "problem" in checked ? `is not a valid egress entry (${checked.problem})` : undefined;
});

const cidrText = ruled((value) => {
  const checked = checkCidr(value);
  return "problem" in checked ? `is not a CIDR or IP address (${checked.problem})` : undefined;
});

// An exact host name: what a secret is sent to, or an `[egress.hosts]` key.
function exactNameProblem(value: string): string | undefined {
  const checked = checkEntry(value);
  if ("problem" in checked) return `is not a valid host name (${checked.problem})`;
  if (checked.entry.kind !== "name" || value.includes(":")) {
    return "must be an exact host name (no wildcard, IP address or port)";
  }
  return undefined;
}

const HEADER_TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$/;
// The proxy frames the request itself: a secret never goes into these.
const PROXY_HEADERS = new Set([
  "host",
  "content-length",
  "transfer-encoding",
  "connection",
  "keep-alive",
  "te",
  "trailer",
  "upgrade",
]);

function headerProblem(value: string): string | undefined {
  if (!HEADER_TOKEN.test(value)) {
    return "must be an HTTP header name (1-128 letters, digits and !#$%&'*+-.^_`|~)";
  }
  const lower = value.toLowerCase();
  if (PROXY_HEADERS.has(lower) || lower.startsWith("proxy-")) {
    return "must not be Host, Content-Length, Transfer-Encoding, Connection, a hop-by-hop or a Proxy-* header (the proxy writes those)";
  }
  return undefined;
}

function formatProblem(value: string): string | undefined {
  if (value.split("{}").length !== 2) return "must contain '{}' (the secret) exactly once";
  if ([...value].some((c) => c.charCodeAt(0) < 0x20 || c.charCodeAt(0) === 0x7f)) {
    return "must not contain CR, LF, NUL or other control characters";
  }
  return value.length > 4096 ? "must have <= 4096 characters" : undefined;
}

/**
 * Schema of an egress list (`egress = [...]`): each entry checked (see
 * `checkEntry`), the list parsed and entries of one host merged.
 *
 * @ignore
 */
export const egressListSchema = z.pipe(
  z.array(entryText).check(z.maxLength(MAX_EGRESS_ENTRIES)),
  z.transform((list: string[]): EgressEntry[] => mergeEntries(list.map(parseEntry))),
);

/**
 * Schema of `egress_addresses`: CIDRs or bare addresses, canonicalized to `ip/bits`.
 *
 * @ignore
 */
export const egressAddressesSchema = z.pipe(
  z.array(cidrText).check(z.maxLength(MAX_EGRESS_ENTRIES)),
  z.transform((list: string[]): string[] => unique(list.map((v) => formatCidr(parseCidr(v))))),
);

/**
 * Schema of a `secrets = [...]` list: names of `[secrets.<name>]` tables
 * (checked against them once the whole config is read).
 *
 * @ignore
 */
export const secretNamesSchema = z.pipe(
  z.array(z.string().check(z.minLength(1), z.maxLength(64))).check(z.maxLength(256)),
  z.transform((names: string[]): string[] => unique(names)),
);

/**
 * Schema of an {@linkcode EgressEntry} given as an object (a library
 * caller's override): it must be canonical, as `parseEntry` returns it.
 *
 * @ignore
 */
export const egressEntrySchema = z.strictObject({
  kind: z.enum(["name", "suffix", "ip"]),
  host: z.string().check(z.maxLength(300)),
  ports: z.array(z.int()).check(z.minLength(1), z.maxLength(65535)),
}).check(z.superRefine((entry, ctx) => {
  const back = checkEntry(formatEntry(entry));
  const same = !("problem" in back) && back.entry.kind === entry.kind &&
    back.entry.host === entry.host && back.entry.ports.join() === entry.ports.join();
  if (!same) {
    ctx.addIssue({
      code: "custom",
      message: "must be a canonical egress entry (as parseEntry returns it)",
      input: entry,
    });
  }
}));

const secretSchema = z.strictObject({
  from_env: z.optional(envNameSchema),
  from_file: z.optional(absolutePathSchema),
  hosts: z.pipe(
    z.array(ruled(exactNameProblem)).check(z.minLength(1), z.maxLength(256)),
    z.transform((hosts: string[]): string[] => unique(hosts.map((h) => parseEntry(h).host))),
  ),
  header: ruled(headerProblem),
  format: z._default(ruled(formatProblem), "{}"),
  env: z.optional(envNameSchema),
});

const userSchema = z.strictObject({
  egress: z.optional(egressListSchema),
  secrets: z.optional(secretNamesSchema),
});

const ipText = ruled((value) =>
  canonicalIp(value) === undefined
    ? "must be an IP address (IPv4 in dotted decimal, or IPv6)"
    : undefined
);

const egressTableSchema = z.strictObject({
  max_connections: z._default(
    z.int().check(z.minimum(1), z.maximum(MAX_MAX_CONNECTIONS)),
    DEFAULT_MAX_CONNECTIONS,
  ),
  bytes_per_second: z._default(z.int().check(z.minimum(0)), 0),
  extra_ca: z.optional(absolutePathSchema),
  hosts: z._default(
    z.record(z.string(), z.pipe(ipText, z.transform((v: string): string => canonicalIp(v)!))),
    {},
  ),
});

/** The `[users.*]`, `[secrets.*]` and `[egress]` tables of `waffle.toml`, as zod shapes. */
export const egressShape = {
  users: z.optional(z.record(z.string(), userSchema)),
  secrets: z.optional(z.record(z.string(), secretSchema)),
  egress: z.optional(egressTableSchema),
};

/** The parsed `[users.*]`, `[secrets.*]` and `[egress]` tables, before the cross-key checks. */
export type EgressTables = {
  users?: Record<string, z.infer<typeof userSchema>> | undefined;
  secrets?: Record<string, z.infer<typeof secretSchema>> | undefined;
  egress?: z.infer<typeof egressTableSchema> | undefined;
};

/** The keys each `[users.<user>]` and `[secrets.<name>]` table and the `[egress]` table may have. */
export const EGRESS_TABLE_KEYS: Readonly<
  Record<"users" | "secrets" | "egress", readonly string[]>
> = Object.freeze({
  users: Object.keys(userSchema.shape),
  secrets: Object.keys(secretSchema.shape),
  egress: Object.keys(egressTableSchema.shape),
});

/**
 * Checks the names of the `[users.<user>]` tables (user ids, by the rule of
 * `sandboxKey`) and the `[egress.hosts]` keys (exact host names). Run it on
 * the parsed document before the schema, so that no name (`__proto__`
 * included) reaches an object as a key unchecked.
 *
 * @example
 * ```ts ignore
 * egressNameProblem({ users: { "a b": {} } }); // { key: "users.a b", ... }
 * ```
 *
 * @param root The parsed document.
 * @returns The first bad name as a problem, or undefined.
 */
export function egressNameProblem(root: Record<string, unknown>): ConfigProblem | undefined {
  for (const name of Object.keys(tableAt(root, "users"))) {
    const rule = userIdProblem(name);
    if (rule !== undefined) {
      return {
        key: `users.${name}`,
        detail: `name is not a user id (${rule}), found ${JSON.stringify(name)}`,
      };
    }
  }
  for (const name of Object.keys(tableAt(tableAt(root, "egress"), "hosts"))) {
    const rule = exactNameProblem(name);
    if (rule !== undefined) {
      return { key: `egress.hosts.${name}`, detail: `name ${rule}, found ${JSON.stringify(name)}` };
    }
  }
  return undefined;
}

function tableAt(root: Record<string, unknown>, key: string): Record<string, unknown> {
  const table = Object.hasOwn(root, key) ? root[key] : undefined;
  if (table === null || typeof table !== "object" || Array.isArray(table)) return {};
  return table as Record<string, unknown>;
}

// The user id rule is sandboxKey's: a user the config names is one `--user` can give.
function userIdProblem(name: string): string | undefined {
  try {
    sandboxKey("default", name, { home: "/" });
    return undefined;
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    return error.message.slice(error.message.lastIndexOf("': ") + 3);
  }
}

/**
 * Builds the `[secrets.<name>]` tables and checks what spans their keys:
 * exactly one of `from_env` and `from_file`, and a default `env` that is a
 * variable name.
 *
 * @example
 * ```ts ignore
 * const built = buildSecrets({ github: { from_env: "GITHUB_TOKEN", hosts: ["api.github.com"], header: "Authorization", format: "Bearer {}" } });
 * ```
 *
 * @param tables The schema-valid `secrets` tables.
 * @returns The secrets by name, or the first problem with its key.
 */
export function buildSecrets(
  tables: EgressTables["secrets"],
): { secrets: Record<string, SecretConfig> } | { problem: ConfigProblem } {
  const secrets: Record<string, SecretConfig> = {};
  for (const [name, raw] of Object.entries(tables ?? {})) {
    const key = `secrets.${name}`;
    if (raw.from_env !== undefined && raw.from_file !== undefined) {
      return {
        problem: {
          key: `${key}.from_file`,
          detail:
            `must be absent when '${key}.from_env' is set (exactly one of from_env or from_file), found ${
              JSON.stringify(raw.from_file)
            }`,
        },
      };
    }
    if (raw.from_env === undefined && raw.from_file === undefined) {
      return {
        problem: {
          key: `${key}.from_env`,
          detail:
            `or '${key}.from_file' must be set (where the host reads the secret), found neither`,
        },
      };
    }
    const env = raw.env ?? raw.from_env ?? name.toUpperCase().replace(/[^A-Z0-9]/g, "_");
    if (!isEnvName(env)) {
      return {
        problem: {
          key: `${key}.env`,
          detail: `must be set: the default from the table name, ${
            JSON.stringify(env)
          }, is not a variable name`,
        },
      };
    }
    secrets[name] = {
      name,
      source: raw.from_env !== undefined ? { env: raw.from_env } : { file: raw.from_file! },
      hosts: [...raw.hosts],
      header: raw.header,
      format: raw.format,
      env,
    };
  }
  return { secrets };
}

/**
 * Builds the `[users.<user>]` tables (their names already checked by
 * {@linkcode egressNameProblem}).
 *
 * @example
 * ```ts ignore
 * buildUsers({ alice: { secrets: [] } }); // { alice: { name: "alice", secrets: [] } }
 * ```
 *
 * @param tables The schema-valid `users` tables.
 * @returns The users by name.
 */
export function buildUsers(tables: EgressTables["users"]): Record<string, UserEgress> {
  return Object.fromEntries(
    Object.entries(tables ?? {}).map(([name, raw]) => [name, {
      name,
      ...(raw.egress === undefined ? {} : { egress: raw.egress }),
      ...(raw.secrets === undefined ? {} : { secrets: raw.secrets }),
    }]),
  );
}

/**
 * The `[egress]` settings, defaults filled in; `[egress.hosts]` names in
 * canonical form (lower case, no trailing dot).
 *
 * @example
 * ```ts ignore
 * egressSettings(undefined); // { maxConnections: 64, bytesPerSecond: 0, hosts: {} }
 * ```
 *
 * @param table The schema-valid `[egress]` table, or undefined when absent.
 * @returns The settings.
 */
export function egressSettings(table: EgressTables["egress"]): EgressSettings {
  const hosts = Object.entries(table?.hosts ?? {}).map(([name, ip]) => [parseEntry(name).host, ip]);
  return {
    maxConnections: table?.max_connections ?? DEFAULT_MAX_CONNECTIONS,
    bytesPerSecond: table?.bytes_per_second ?? 0,
    ...(table?.extra_ca === undefined ? {} : { extraCa: table.extra_ca }),
    hosts: Object.fromEntries(hosts),
  };
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
  sandboxKey(who.tenant, who.user, { home: "/" });
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
