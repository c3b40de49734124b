/**
 * The schemas of the egress keys of `waffle.toml`: the `egress`,
 * `egress_addresses` and `secrets` keys of `[sandbox]`, `[users.<user>]`,
 * `[groups.<name>]`, `[cron.<name>]` and restricted `[mcp.<name>]` servers,
 * the `[users.<user>]` and `[secrets.<name>]` tables and the `[egress]`
 * table; the check of their names, and how their tables are built. The
 * checks that span several keys are `egress_checks.ts`'s, the composition of
 * one identity's policy `egress_compose.ts`'s.
 *
 * @module
 */
import * as z from "../schema.ts";
import { envNameSchema, isEnvName } from "../env_name.ts";
import { UsageError } from "../errors.ts";
import { absolutePathSchema } from "./absolute_path.ts";
import { sandboxKey } from "./sandbox_key.ts";
import type { ConfigProblem } from "./toml.ts";
import {
  canonicalIp,
  checkCidr,
  checkEntry,
  formatCidr,
  formatEntry,
  mergeEntries,
  parseCidr,
  parseEntry,
} from "./egress_entries.ts";
import type { EgressEntry, EgressSettings, SecretConfig, UserEgress } from "./egress_types.ts";

/** `[egress] max_connections` when unset. */
export const DEFAULT_MAX_CONNECTIONS = 64;
/** The largest `[egress] max_connections`. */
export const MAX_MAX_CONNECTIONS = 4096;
/** The most entries of one `egress` or `egress_addresses` list. */
export const MAX_EGRESS_ENTRIES = 1024;

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
