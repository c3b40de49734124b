/**
 * The MCP policy of `waffle.toml`: the `[mcp.<name>]` servers, the
 * `[groups.<name>]` and the `[cron.<name>]` jobs. This module owns their
 * types, their schemas and the checks that span several keys (a
 * contradiction is a config error naming its key).
 *
 * @module
 */
import { normalize } from "../path.ts";
import * as z from "../schema.ts";
import { envNameSchema } from "../env_name.ts";

/** Where a server's process executes. */
export type Execution = "host" | "sandbox";
/** What a server may reach: the host, the user's sandbox, or a restricted container. */
export type Authority = "host" | "sandbox" | "restricted";

/** One `[mcp.<name>]` table. */
export interface McpServerConfig {
  /** The table key in `[mcp.<name>]`. */
  name: string;
  /** `npm:<pkg>@<version>`, run by waffle's own Deno. Exactly one of package/command. */
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
  /** Host variable names passed to this server (default none). */
  env: string[];
  /** Only these tools are listed and callable; absent = all tools. */
  tools?: string[] | undefined;
  /**
   * The requests this server may send to the client (`client_requests`,
   * default {@linkcode DEFAULT_CLIENT_REQUESTS}); the relay refuses any other.
   */
  clientRequests: ClientRequestMethod[];
}

/** One `[groups.<name>]` table. */
export interface GroupConfig {
  /** The table key. */
  name: string;
  /** "docker" (default): a host-executed server is denied to the group. */
  mode: "docker" | "host";
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
}

/** The whole MCP policy of a config. */
export interface McpPolicy {
  /** Servers by name, in config order. */
  servers: Record<string, McpServerConfig>;
  /** Declared groups by name. */
  groups: Record<string, GroupConfig>;
  /** Cron jobs by name. */
  cron: Record<string, CronConfig>;
}

/** A config problem at one key: `'<key>' <detail>` once the file is named. */
export interface ConfigProblem {
  /** Dotted key path, e.g. `mcp.everything.execution`. */
  key: string;
  /** What was expected and what was found, e.g. `must be "host", found "sandbox"`. */
  detail: string;
}

/** The policy of a config without any `[mcp]`, `[groups]` or `[cron]` table. */
export const EMPTY_POLICY: McpPolicy = Object.freeze({
  servers: Object.freeze({}),
  groups: Object.freeze({}),
  cron: Object.freeze({}),
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
/** An npm package with a pinned version: `npm:[@scope/]name@version`. */
export const PACKAGE_PATTERN: RegExp = /^npm:(@[a-z0-9][\w.-]*\/)?[a-z0-9][\w.-]*@[\w.+-]+$/i;
/** MCP tool names (the MCP specification's alphabet). */
export const TOOL_NAME_PATTERN: RegExp = /^[A-Za-z0-9_./-]{1,128}$/;

const NAME_RULE = "must be 1-64 letters, digits, '_' or '-', starting with a letter or digit";

const noNul = (value: string): boolean => !value.includes("\0");

const nameSchema = z.string().check(z.regex(NAME_PATTERN, { error: NAME_RULE }));

const serverSchema = z.strictObject({
  package: z.optional(
    z.string().check(z.regex(PACKAGE_PATTERN, {
      error: 'must be "npm:<name>@<version>" with a pinned version',
    })),
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
  env: z._default(z.array(envNameSchema).check(z.maxLength(256)), []),
  tools: z.optional(
    z.array(
      z.string().check(z.regex(TOOL_NAME_PATTERN, {
        error: "must be a tool name (1-128 letters, digits, '_', '-', '.' or '/')",
      })),
    ).check(z.maxLength(4096)),
  ),
  client_requests: z.optional(z.array(z.enum(CLIENT_REQUEST_METHODS)).check(z.maxLength(64))),
});

const groupSchema = z.strictObject({ mode: z._default(z.enum(["docker", "host"]), "docker") });

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

/** The parsed policy tables, before the cross-key checks. */
export type PolicyTables = {
  mcp?: Record<string, z.infer<typeof serverSchema>> | undefined;
  groups?: Record<string, z.infer<typeof groupSchema>> | undefined;
  cron?: Record<string, z.infer<typeof cronSchema>> | undefined;
};

/**
 * Builds the policy from its parsed tables and checks what spans several
 * keys: names, authority against execution, package or command, declared
 * groups and servers of cron jobs.
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
    servers[name] = {
      name,
      ...(raw.package === undefined ? {} : { package: raw.package }),
      ...(raw.command === undefined ? {} : { command: raw.command }),
      args: [...raw.args],
      execution: raw.execution,
      authority: raw.authority,
      ...(raw.groups === undefined ? {} : { groups: unique(raw.groups) }),
      env: unique(raw.env),
      ...(raw.tools === undefined ? {} : { tools: unique(raw.tools) }),
      clientRequests: unique(raw.client_requests ?? [...DEFAULT_CLIENT_REQUESTS]),
    };
  }
  for (const [name, raw] of Object.entries(tables.groups ?? {})) {
    groups[name] = { name, mode: raw.mode };
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
    };
  }
  return { policy: { servers, groups, cron } };
}

/**
 * Checks the names of the `[mcp.<name>]`, `[groups.<name>]` and
 * `[cron.<name>]` tables. Run it on the parsed document before the schema,
 * so that no name (`__proto__` included) reaches an object as a key unchecked.
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
  for (const section of ["mcp", "groups", "cron"]) {
    const table = Object.hasOwn(root, section) ? root[section] : undefined;
    if (table === null || typeof table !== "object" || Array.isArray(table)) continue;
    for (const name of Object.keys(table)) {
      if (!NAME_PATTERN.test(name)) {
        return {
          key: `${section}.${name}`,
          detail: `name ${NAME_RULE}, found ${JSON.stringify(name)}`,
        };
      }
    }
  }
  return undefined;
}

function unique<T>(values: T[]): T[] {
  return [...new Set(values)];
}
