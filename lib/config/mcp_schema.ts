/**
 * The schemas of the MCP tables of `waffle.toml` (`[mcp.<name>]`,
 * `[groups.<name>]`, `[cron.<name>]`) and the check of their names, which
 * runs on the parsed document before the schema. Their egress keys use
 * `egress_schema.ts`'s schemas.
 *
 * @module
 */
import * as z from "../schema.ts";
import { envNameSchema } from "../env_name.ts";
import {
  egressAddressesSchema,
  egressListSchema,
  type EgressTables,
  secretNamesSchema,
} from "./egress_schema.ts";
import {
  CLIENT_REQUEST_METHODS,
  DEFAULT_MAX_MESSAGE_BYTES,
  MAX_ENV_VALUE_CHARS,
  MAX_MAX_MESSAGE_BYTES,
  MIN_MAX_MESSAGE_BYTES,
  NAME_PATTERN,
  PACKAGE_PATTERN,
  TOOL_NAME_PATTERN,
} from "./mcp_types.ts";
import type { ConfigProblem } from "./toml.ts";

const NAME_RULE = "must be 1-64 letters, digits, '_' or '-', starting with a letter or digit";

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

/** An `env` of `[mcp.<name>]` as the schema reads it: an array of names, or a table. */
export type EnvTable = z.infer<typeof envSchema>;

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
