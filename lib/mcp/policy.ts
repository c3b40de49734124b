/**
 * The MCP policy of `waffle.toml`: the `[mcp.<name>]` servers, the
 * `[groups.<name>]` and the `[cron.<name>]` jobs. This module owns their
 * types, their schemas and the checks that span several keys (a
 * contradiction is a config error naming its key). Their egress keys, and
 * the `[users.<user>]` and `[secrets.<name>]` tables the policy also holds,
 * are `lib/egress/policy.ts`'s.
 *
 * @module
 */
import { normalize } from "../path.ts";
import * as z from "../schema.ts";
import { envNameSchema } from "../env_name.ts";
import {
  buildSecrets,
  buildUsers,
  egressAddressesSchema,
  egressListSchema,
  type EgressTables,
  secretNamesSchema,
  type UserEgress,
} from "../egress/policy.ts";
import type { EgressEntry, SecretConfig } from "../config/egress_types.ts";
import { isExactVersion } from "../config/package_pin.ts";
import type { ConfigProblem } from "../config/toml.ts";

/** Where a server's process executes. */
export type Execution = "host" | "sandbox";
/** What a server may reach: the host, the user's sandbox, or a restricted container. */
export type Authority = "host" | "sandbox" | "restricted";

/**
 * Where one variable of a server's environment comes from: the host's
 * variable `host` (read at launch, never shown), or a literal `value` written
 * in the config.
 */
export type EnvSource = { name: string; host: string } | { name: string; value: string };

/** One `[mcp.<name>]` table. */
export interface McpServerConfig {
  /** The table key in `[mcp.<name>]`. */
  name: string;
  /** `npm:<pkg>@<exact version>`, run by waffle's own Deno. Exactly one of package/command. */
  package?: string | undefined;
  /** Absolute path of a program: on the host for execution "host", in the image for "sandbox". */
  command?: string | undefined;
  /** Arguments of the server (default none). */
  args: string[];
  /** Where it executes. */
  execution: Execution;
  /** What it may reach. */
  authority: Authority;
  /** Groups that may use it; absent = every group. */
  groups?: string[] | undefined;
  /** The names of the variables this server gets from `env` (default none), in config order. */
  env: string[];
  /** Where each of them comes from, in the order of `env`. */
  envSources: EnvSource[];
  /**
   * `cwd`, normalized: in a container a path relative to `/workspace` (absent
   * = the workspace itself); on the host an absolute path, or one relative to
   * the server's state directory (absent = that directory).
   */
  cwd?: string | undefined;
  /** The largest JSON-RPC message the relay accepts from or for this server, in bytes. */
  maxMessageBytes: number;
  /** Only these tools are listed and callable; absent = all tools. */
  tools?: string[] | undefined;
  /**
   * The requests this server may send to the client (`client_requests`,
   * default {@linkcode DEFAULT_CLIENT_REQUESTS}); the relay refuses any other.
   */
  clientRequests: ClientRequestMethod[];
  /**
   * `egress` (authority "restricted" only): what its session's egress proxy
   * allows, before its group's and cron job's narrow it; absent = no egress.
   */
  egress?: EgressEntry[] | undefined;
  /** `egress_addresses`: non-public CIDRs (`ip/bits`) its listed names may resolve to; absent = none. */
  egressAddresses?: string[] | undefined;
  /** `egress_allow_host_loopback`: `egress_addresses` may cover the host's loopback; absent = false. */
  egressAllowHostLoopback?: boolean | undefined;
  /** `secrets`: the `[secrets.<name>]` its session's requests may carry; absent = none. */
  secrets?: string[] | undefined;
}

/** One `[groups.<name>]` table. */
export interface GroupConfig {
  /** The table key. */
  name: string;
  /** "docker" (default): a host-executed server is denied to the group. */
  mode: "docker" | "host";
  /** Narrows the egress of the group's servers; absent = no narrowing. */
  egress?: EgressEntry[] | undefined;
}

/** One `[cron.<name>]` job. */
export interface CronConfig {
  /** The table key. */
  name: string;
  /** The group whose policy is the base of this job (a declared `[groups.<name>]`). */
  group: string;
  /** The servers this job may use; absent = its group's. */
  mcp?: string[] | undefined;
  /** The network the job allows; absent = no narrowing. */
  network?: "none" | "bridge" | undefined;
  /** Working directory relative to `/workspace`. */
  workdir?: string | undefined;
  /** Narrows each server's env allowlist further; absent = no narrowing. */
  env?: string[] | undefined;
  /** Narrows the egress of the job's servers; absent = no narrowing. */
  egress?: EgressEntry[] | undefined;
}

/** The whole MCP policy of a config, with the users and secrets egress composes with it. */
export interface McpPolicy {
  /** Servers by name, in config order. */
  servers: Record<string, McpServerConfig>;
  /** Declared groups by name. */
  groups: Record<string, GroupConfig>;
  /** Cron jobs by name. */
  cron: Record<string, CronConfig>;
  /** `[secrets.<name>]` tables by name. */
  secrets: Record<string, SecretConfig>;
  /** `[users.<user>]` tables by user id. */
  users: Record<string, UserEgress>;
}

/** The policy of a config without any `[mcp]`, `[groups]` or `[cron]` table. */
export const EMPTY_POLICY: McpPolicy = Object.freeze({
  servers: Object.freeze({}),
  groups: Object.freeze({}),
  cron: Object.freeze({}),
  secrets: Object.freeze({}),
  users: Object.freeze({}),
});

/**
 * The requests an MCP server may send to its client (the MCP specification's
 * server-to-client requests). Sampling drives the host's model and
 * elicitation prompts its user: neither is allowed unless listed.
 */
export const CLIENT_REQUEST_METHODS = [
  "ping",
  "roots/list",
  "sampling/createMessage",
  "elicitation/create",
] as const;

/** A request method a server may be allowed to send to the client. */
export type ClientRequestMethod = typeof CLIENT_REQUEST_METHODS[number];

/** What a server may send to the client when `client_requests` is absent. */
export const DEFAULT_CLIENT_REQUESTS: readonly ClientRequestMethod[] = Object.freeze([
  "roots/list",
  "ping",
]);

/** Server, group and cron job names. */
export const NAME_PATTERN: RegExp = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;
/**
 * An npm package spec as the schema reads it: `npm:[@scope/]name[@what]`;
 * {@linkcode buildPolicy} then requires `what` to be one exact version.
 */
export const PACKAGE_PATTERN: RegExp = /^npm:((?:@[a-z0-9][\w.-]*\/)?[a-z0-9][\w.-]*)(?:@(.*))?$/i;
/** MCP tool names (the MCP specification's alphabet). */
export const TOOL_NAME_PATTERN: RegExp = /^[A-Za-z0-9_./-]{1,128}$/;

/** A server's `max_message_bytes` when it sets none: 64 MiB. */
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** The smallest `max_message_bytes`: 1 MiB. */
export const MIN_MAX_MESSAGE_BYTES = 1024 * 1024;
/** The largest `max_message_bytes`: 1 GiB. */
export const MAX_MAX_MESSAGE_BYTES = 1024 * 1024 * 1024;
/** The longest literal `env` value, in characters. */
export const MAX_ENV_VALUE_CHARS = 32 * 1024;
/** Where the workspace is mounted in every container. */
export const CONTAINER_WORKSPACE = "/workspace";

const NAME_RULE = "must be 1-64 letters, digits, '_' or '-', starting with a letter or digit";
const EXACT_RULE = 'must pin an exact version ("npm:<name>@<major.minor.patch>")';

const noNul = (value: string): boolean => !value.includes("\0");

const nameSchema = z.string().check(z.regex(NAME_PATTERN, { error: NAME_RULE }));

const envValueSchema = z.string().check(
  z.maxLength(MAX_ENV_VALUE_CHARS),
  z.refine(noNul, { error: "must not contain NUL" }),
);

// `env = ["A", "B"]` (host variables of the same names) or a table:
// `env = { A = "literal", B = { host = "HOST_NAME" } }`.
const envSchema = z.union([
  z.array(envNameSchema).check(z.maxLength(256)),
  z.record(envNameSchema, z.union([envValueSchema, z.strictObject({ host: envNameSchema })]))
    .check(z.refine((table) => Object.keys(table).length <= 256, {
      error: "must have <= 256 entries",
    })),
]);

const serverSchema = z.strictObject({
  package: z.optional(
    z.string().check(
      z.maxLength(1024),
      z.regex(PACKAGE_PATTERN, {
        error: 'must be "npm:<name>@<version>" with an exact version',
      }),
    ),
  ),
  command: z.optional(
    z.string().check(z.refine((v) => v.startsWith("/") && noNul(v), {
      error: "must be an absolute path",
    })),
  ),
  args: z._default(
    z.array(
      z.string().check(z.maxLength(65536), z.refine(noNul, { error: "must not contain NUL" })),
    ).check(z.maxLength(1024)),
    [],
  ),
  execution: z.enum(["host", "sandbox"]),
  authority: z.enum(["host", "sandbox", "restricted"]),
  groups: z.optional(z.array(nameSchema).check(z.maxLength(256))),
  env: z._default(envSchema, []),
  cwd: z.optional(
    z.string().check(
      z.minLength(1),
      z.maxLength(4096),
      z.refine(noNul, { error: "must not contain NUL" }),
    ),
  ),
  max_message_bytes: z._default(
    z.int().check(z.minimum(MIN_MAX_MESSAGE_BYTES), z.maximum(MAX_MAX_MESSAGE_BYTES)),
    DEFAULT_MAX_MESSAGE_BYTES,
  ),
  tools: z.optional(
    z.array(
      z.string().check(z.regex(TOOL_NAME_PATTERN, {
        error: "must be a tool name (1-128 letters, digits, '_', '-', '.' or '/')",
      })),
    ).check(z.maxLength(4096)),
  ),
  client_requests: z.optional(z.array(z.enum(CLIENT_REQUEST_METHODS)).check(z.maxLength(64))),
  egress: z.optional(egressListSchema),
  egress_addresses: z.optional(egressAddressesSchema),
  egress_allow_host_loopback: z.optional(z.boolean()),
  secrets: z.optional(secretNamesSchema),
});

const groupSchema = z.strictObject({
  mode: z._default(z.enum(["docker", "host"]), "docker"),
  egress: z.optional(egressListSchema),
});

const cronSchema = z.strictObject({
  group: nameSchema,
  mcp: z.optional(z.array(nameSchema).check(z.maxLength(256))),
  network: z.optional(z.enum(["none", "bridge"])),
  workdir: z.optional(
    z.string().check(
      z.minLength(1),
      z.maxLength(4096),
      z.refine(
        (v) => noNul(v) && !v.startsWith("/") && !v.split("/").includes(".."),
        { error: "must be a relative path under /workspace without '..'" },
      ),
    ),
  ),
  env: z.optional(z.array(envNameSchema).check(z.maxLength(256))),
  egress: z.optional(egressListSchema),
});

/** The keys each `[mcp.<name>]`, `[groups.<name>]` and `[cron.<name>]` table may have. */
export const POLICY_TABLE_KEYS: Readonly<Record<"mcp" | "groups" | "cron", readonly string[]>> =
  Object.freeze({
    mcp: Object.keys(serverSchema.shape),
    groups: Object.keys(groupSchema.shape),
    cron: Object.keys(cronSchema.shape),
  });

/** The `[mcp.*]`, `[groups.*]` and `[cron.*]` tables of `waffle.toml`, as zod shapes. */
export const policyShape = {
  mcp: z.optional(z.record(z.string(), serverSchema)),
  groups: z.optional(z.record(z.string(), groupSchema)),
  cron: z.optional(z.record(z.string(), cronSchema)),
};

/** The parsed policy tables (and the egress ones it holds), before the cross-key checks. */
export type PolicyTables = {
  mcp?: Record<string, z.infer<typeof serverSchema>> | undefined;
  groups?: Record<string, z.infer<typeof groupSchema>> | undefined;
  cron?: Record<string, z.infer<typeof cronSchema>> | undefined;
} & Pick<EgressTables, "users" | "secrets">;

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

/**
 * Checks the names of the `[mcp.<name>]`, `[groups.<name>]`,
 * `[cron.<name>]` and `[secrets.<name>]` tables, and of the variables of an
 * `env` table (`[users.<user>]` names are `egressNameProblem`'s). Run it on
 * the parsed document before the schema, so that no name (`__proto__`
 * included) reaches an object as a key unchecked.
 *
 * @example
 * ```ts ignore
 * tableNameProblem({ mcp: { "bad name": {} } }); // { key: "mcp.bad name", ... }
 * ```
 *
 * @param root The parsed document (or the policy tables).
 * @returns The first bad name as a problem, or undefined.
 */
export function tableNameProblem(root: Record<string, unknown>): ConfigProblem | undefined {
  for (const section of ["mcp", "groups", "cron", "secrets"]) {
    const table = Object.hasOwn(root, section) ? root[section] : undefined;
    if (table === null || typeof table !== "object" || Array.isArray(table)) continue;
    for (const name of Object.keys(table)) {
      if (!NAME_PATTERN.test(name)) {
        return {
          key: `${section}.${name}`,
          detail: `name ${NAME_RULE}, found ${JSON.stringify(name)}`,
        };
      }
      // A record would drop this key without a word.
      const env = section === "mcp" ? (table as Record<string, { env?: unknown }>)[name]?.env : {};
      if (env !== null && typeof env === "object" && Object.hasOwn(env, "__proto__")) {
        return {
          key: `mcp.${name}.env.__proto__`,
          detail: `name is not allowed in a table (list it in an array instead), found "__proto__"`,
        };
      }
    }
  }
  return undefined;
}

function unique<T>(values: T[]): T[] {
  return [...new Set(values)];
}

// The array form names host variables; the table form mixes literals and
// `{ host = "NAME" }`. A name given twice in the array counts once.
function sourcesOf(env: z.infer<typeof envSchema>): EnvSource[] {
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
