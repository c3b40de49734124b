/**
 * The `[serve]`, `[serve.tenants.<tenant>]` and `[templates.<name>]` tables
 * of `waffle.toml` (`waffle serve`, E2B's API on waffle): their schema, the
 * check of their names, and the {@linkcode ServeSettings} they resolve to,
 * once, at load.
 *
 * @module
 */
import * as z from "../schema.ts";
import { DEFAULT_HEADER_TIMEOUT_MS } from "../http/limits.ts";
import { checkEntry } from "./egress_entries.ts";
import { imageRefSchema } from "./image_ref.ts";
import { NAME_PATTERN } from "./mcp_types.ts";
import { ID_RULE, isId } from "./sandbox_key.ts";
import type { ConfigProblem } from "./toml.ts";

/** Where `waffle serve` listens: a host name or address and a port. */
export interface ListenAddress {
  /** A name or an address, as `Deno.serve` takes it (an IPv6 address without brackets). */
  hostname: string;
  /** The TCP port; 0 asks for any free one. */
  port: number;
}

/** What one tenant may have of `waffle serve`. */
export interface TenantLimitSettings {
  /** Sandboxes it may have at once. */
  maxSandboxes: number;
  /** Sandboxes it may create in any minute. */
  createsPerMinute: number;
}

/** `waffle serve`'s settings, defaults filled in. */
export interface ServeSettings {
  /** `[serve] listen`: default 127.0.0.1:3000. */
  listen: ListenAddress;
  /**
   * `[serve] domain`: when set, a sandbox's envd is also routed by the host
   * name `49983-<id>.<domain>` (lower case, no trailing dot).
   */
  domain: string | undefined;
  /** `[serve] default_timeout`: a sandbox's lifetime when a create names none, in seconds. */
  defaultTimeoutSeconds: number;
  /** `[serve] max_timeout`: the longest lifetime a create or `setTimeout` may ask, in seconds. */
  maxTimeoutSeconds: number;
  /** `[serve] max_body_bytes`: the largest request body. */
  maxBodyBytes: number;
  /** `[serve] max_streams_per_key`: streams (commands, watches) one key may hold open at once. */
  maxStreamsPerKey: number;
  /**
   * `[serve] max_connections`: connections open at once (past it, a new one
   * is closed at once); absent: `lib/http`'s default (512, at most half the
   * open-file limit).
   */
  maxConnections: number | undefined;
  /**
   * `[serve] max_connections_per_peer`: connections open at once from one
   * address (IPv6: its /64); absent: `lib/http`'s default (64, at most
   * `maxConnections`).
   */
  maxConnectionsPerPeer: number | undefined;
  /** `[serve] header_timeout`: a request's headers (and TLS handshake) must arrive within this, in seconds. */
  headerTimeoutSeconds: number;
  /** `[serve] request_timeout`: a whole request, body included (a `/files` upload), must arrive within this, in seconds. */
  requestTimeoutSeconds: number;
  /** `[serve.tenants.<tenant>]` by tenant; a tenant not listed has {@linkcode DEFAULT_TENANT_LIMITS}. */
  tenants: ReadonlyMap<string, TenantLimitSettings>;
  /** `[templates.<name>] image` by template name; `base` is always there. */
  templates: ReadonlyMap<string, string>;
  /**
   * `[templates.<name>] warm` by template name, for templates that keep a
   * warm pool (`warm` > 0): the ready sandboxes to keep (see `lib/lifecycle/pool.ts`).
   */
  warm: ReadonlyMap<string, number>;
  /**
   * `[serve] keys_file`: the API keys from this file (`waffle serve key
   * export`), shared by several servers, instead of the home's `serve.db`.
   */
  keysFile: string | undefined;
  /** `[backend]`: where the server's sandboxes run (default: this host's Docker). */
  backend: BackendSettings;
}

/** `[backend] kind = "kubernetes"`: each sandbox an agent-sandbox `Sandbox` (see `lib/k8s`). */
export interface KubernetesBackendSettings {
  /** The kind. */
  kind: "kubernetes";
  /** `namespace_prefix`: a tenant's namespace is this and its DNS-1123 name (default `waffle-`). */
  namespacePrefix: string;
  /** `kubeconfig`: the kubeconfig file; absent: the pod's in-cluster credentials. */
  kubeconfig: string | undefined;
  /** `context`: the kubeconfig's context; absent: its current one. */
  context: string | undefined;
  /** `storage_class`: the workspace claims' class; absent: the cluster's default. */
  storageClass: string | undefined;
  /** `runtime_class`: the pods' `runtimeClassName` (gVisor, Kata); absent: the node's default. */
  runtimeClass: string | undefined;
  /** `waffle_image`: the image holding waffle's artefact (`waffle k8s image`). */
  waffleImage: string;
  /** `ready_timeout`: how long a create or resume waits for the pod, in seconds (default 120). */
  readyTimeoutSeconds: number;
}

/** `[backend]`: Docker on this host (the default), or a Kubernetes cluster. */
export type BackendSettings = { kind: "docker" } | KubernetesBackendSettings;

/** The limits of a tenant `[serve.tenants]` does not list, and of what a listed one leaves out. */
export const DEFAULT_TENANT_LIMITS: Readonly<TenantLimitSettings> = Object.freeze({
  maxSandboxes: 20,
  createsPerMinute: 60,
});

/** The image of template `base` unless `[templates.base]` names another. */
export const BASE_TEMPLATE_IMAGE = "waffle-base:bookworm";

/** The longest sandbox lifetime any setting may allow: 30 days, in seconds. */
const MAX_LIFETIME_SECONDS = 30 * 24 * 3600;

const LISTEN_RULE =
  'must be "host:port" (an address or a name, "[v6]:port" for IPv6, port 0-65535)';

/**
 * Parses a listen address, `host:port` or `[v6]:port` (the `[serve] listen`
 * key and `waffle serve --listen`). The host is an IP address or a DNS name
 * (no wildcard); port 0 asks for any free port.
 *
 * @example
 * ```ts
 * import { parseListen } from "./serve_schema.ts";
 * parseListen("[::1]:3000"); // { address: { hostname: "::1", port: 3000 } }
 * ```
 *
 * @param text The address.
 * @returns The address, or what is wrong with it (a phrase, the value not quoted).
 */
export function parseListen(text: string): { address: ListenAddress } | { problem: string } {
  const colon = text.lastIndexOf(":");
  const host = text.slice(0, Math.max(colon, 0));
  const port = text.slice(colon + 1);
  if (colon < 0 || !/^(0|[1-9][0-9]{0,4})$/.test(port) || Number(port) > 65535) {
    return { problem: LISTEN_RULE };
  }
  // A bare IPv6 address ("::1:3000") is ambiguous: it needs its brackets.
  if (host.includes(":") && !host.startsWith("[")) return { problem: LISTEN_RULE };
  const checked = checkEntry(host);
  if ("problem" in checked) return { problem: `${LISTEN_RULE}: ${checked.problem}` };
  if (checked.entry.kind === "suffix") return { problem: `${LISTEN_RULE}: not a wildcard` };
  return { address: { hostname: checked.entry.host, port: Number(port) } };
}

// The domain is the tail of a host name: a DNS name, as egress judges one.
function domainProblem(text: string): string | undefined {
  const checked = checkEntry(text);
  if ("problem" in checked) return `must be a DNS name (${checked.problem})`;
  if (checked.entry.kind !== "name" || text.includes(":")) {
    return "must be a DNS name (no wildcard, IP address or port)";
  }
  return undefined;
}

const seconds = z.int().check(z.minimum(1), z.maximum(MAX_LIFETIME_SECONDS));
const count = z.int().check(z.minimum(1), z.maximum(1_000_000));

const tenantSchema = z.strictObject({
  max_sandboxes: z.optional(count),
  creates_per_minute: z.optional(count),
});

const serveSchema = z.strictObject({
  listen: z.optional(
    z.string().check(
      z.refine((v) => !("problem" in parseListen(v)), { error: LISTEN_RULE }),
    ),
  ),
  domain: z.optional(
    z.string().check(
      z.refine((v) => domainProblem(v) === undefined, {
        error: "must be a DNS name (no wildcard, IP address or port)",
      }),
    ),
  ),
  default_timeout: z.optional(seconds),
  max_timeout: z.optional(seconds),
  max_body_bytes: z.optional(z.int().check(z.minimum(1024), z.maximum(2 ** 40))),
  max_streams_per_key: z.optional(z.int().check(z.minimum(1), z.maximum(65536))),
  max_connections: z.optional(z.int().check(z.minimum(1), z.maximum(65536))),
  max_connections_per_peer: z.optional(z.int().check(z.minimum(1), z.maximum(65536))),
  header_timeout: z.optional(z.int().check(z.minimum(1), z.maximum(3600))),
  request_timeout: z.optional(z.int().check(z.minimum(1), z.maximum(24 * 3600))),
  tenants: z.optional(z.record(z.string(), tenantSchema)),
  keys_file: z.optional(z.string().check(z.regex(/^\//, { error: "must be an absolute path" }))),
});

const backendSchema = z.strictObject({
  kind: z.enum(["docker", "kubernetes"]),
  namespace_prefix: z.optional(
    z.string().check(z.regex(/^[a-z][a-z0-9-]{0,19}$/, {
      error: "must be 1-20 lower-case letters, digits or '-', starting with a letter",
    })),
  ),
  kubeconfig: z.optional(z.string().check(z.minLength(1))),
  context: z.optional(z.string().check(z.minLength(1))),
  storage_class: z.optional(
    z.string().check(z.regex(/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/, {
      error: "must be a DNS-1123 name",
    })),
  ),
  runtime_class: z.optional(
    z.string().check(z.regex(/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/, {
      error: "must be a DNS-1123 name",
    })),
  ),
  waffle_image: z.optional(imageRefSchema),
  ready_timeout: z.optional(z.int().check(z.minimum(1), z.maximum(3600))),
});

/** The most ready sandboxes one template's pool may keep. */
export const MAX_WARM_PER_TEMPLATE = 64;
/** The most ready sandboxes every pool of a home may keep together. */
export const MAX_WARM_TOTAL = 256;

const templateSchema = z.strictObject({
  image: imageRefSchema,
  warm: z.optional(z.int().check(z.minimum(0), z.maximum(MAX_WARM_PER_TEMPLATE))),
});

/** The `[serve]` and `[templates.*]` tables of `waffle.toml`, as zod shapes. */
export const serveShape = {
  serve: z.optional(serveSchema),
  templates: z.optional(z.record(z.string(), templateSchema)),
  backend: z.optional(backendSchema),
};

/** The parsed `[serve]` and `[templates.*]` tables. */
export type ServeTables = {
  serve?: z.infer<typeof serveSchema> | undefined;
  templates?: Record<string, z.infer<typeof templateSchema>> | undefined;
  backend?: z.infer<typeof backendSchema> | undefined;
};

/**
 * The keys a table of `waffle serve`'s may have, by its path (for the
 * unknown-key message), or undefined when the path is none of them.
 *
 * @param path The table's key path (`["serve"]`, `["serve", "tenants", "acme"]`, `["templates", "x"]`).
 * @returns Its keys.
 */
export function serveTableKeys(path: readonly PropertyKey[]): string[] | undefined {
  if (path[0] === "serve" && path.length === 1) return Object.keys(serveSchema.shape);
  if (path[0] === "serve" && path[1] === "tenants" && path.length === 3) {
    return Object.keys(tenantSchema.shape);
  }
  if (path[0] === "templates" && path.length === 2) return Object.keys(templateSchema.shape);
  if (path[0] === "backend" && path.length === 1) return Object.keys(backendSchema.shape);
  return undefined;
}

/**
 * Checks the names of the `[serve.tenants.<tenant>]` tables (tenant ids,
 * the rule of `--tenant`) and of the `[templates.<name>]` tables. Run it on
 * the parsed document before the schema, so that no name reaches an object
 * as a key unchecked.
 *
 * @example
 * ```ts ignore
 * serveNameProblem({ templates: { "a b": {} } }); // { key: "templates.a b", ... }
 * ```
 *
 * @param root The parsed document.
 * @returns The first bad name as a problem, or undefined.
 */
export function serveNameProblem(root: Record<string, unknown>): ConfigProblem | undefined {
  for (const name of Object.keys(tableAt(tableAt(root, "serve"), "tenants"))) {
    if (!isId(name)) {
      return {
        key: `serve.tenants.${name}`,
        detail: `name is not a tenant id (${ID_RULE}), found ${JSON.stringify(name)}`,
      };
    }
  }
  for (const name of Object.keys(tableAt(root, "templates"))) {
    if (!NAME_PATTERN.test(name)) {
      return {
        key: `templates.${name}`,
        detail:
          `name must be 1-64 letters, digits, '_' or '-', starting with a letter or digit, found ${
            JSON.stringify(name)
          }`,
      };
    }
  }
  return undefined;
}

function tableAt(root: Record<string, unknown>, key: string): Record<string, unknown> {
  const table = Object.hasOwn(root, key) ? root[key] : undefined;
  if (table === null || typeof table !== "object" || Array.isArray(table)) return {};
  return table as Record<string, unknown>;
}

/**
 * Resolves the `[serve]` and `[templates.*]` tables (schema-valid, names
 * checked) to the settings `waffle serve` runs with, defaults filled in.
 *
 * @example
 * ```ts ignore
 * serveSettings({}).listen; // { hostname: "127.0.0.1", port: 3000 }
 * ```
 *
 * @param tables The parsed tables.
 * @returns The settings, or the problem of a value that contradicts another.
 */
export function serveSettings(tables: ServeTables): { settings: ServeSettings } | {
  problem: ConfigProblem;
} {
  const serve = tables.serve ?? {};
  const maxTimeoutSeconds = serve.max_timeout ?? 86400;
  const defaultTimeoutSeconds = serve.default_timeout ?? Math.min(300, maxTimeoutSeconds);
  if (defaultTimeoutSeconds > maxTimeoutSeconds) {
    return {
      problem: {
        key: "serve.default_timeout",
        detail:
          `must be <= serve.max_timeout (${maxTimeoutSeconds}), found ${defaultTimeoutSeconds}`,
      },
    };
  }
  const headerTimeoutSeconds = serve.header_timeout ?? DEFAULT_HEADER_TIMEOUT_MS / 1000;
  const requestTimeoutSeconds = serve.request_timeout ?? Math.max(3600, headerTimeoutSeconds);
  if (headerTimeoutSeconds > requestTimeoutSeconds) {
    return {
      problem: {
        key: "serve.header_timeout",
        detail:
          `must be <= serve.request_timeout (${requestTimeoutSeconds}), found ${headerTimeoutSeconds}`,
      },
    };
  }
  const listen = serve.listen === undefined ? undefined : parseListen(serve.listen);
  const tenants = new Map<string, TenantLimitSettings>();
  for (const [tenant, limits] of Object.entries(serve.tenants ?? {})) {
    tenants.set(tenant, {
      maxSandboxes: limits.max_sandboxes ?? DEFAULT_TENANT_LIMITS.maxSandboxes,
      createsPerMinute: limits.creates_per_minute ?? DEFAULT_TENANT_LIMITS.createsPerMinute,
    });
  }
  const templates = new Map<string, string>([["base", BASE_TEMPLATE_IMAGE]]);
  const warm = new Map<string, number>();
  for (const [name, template] of Object.entries(tables.templates ?? {})) {
    templates.set(name, template.image);
    if ((template.warm ?? 0) > 0) warm.set(name, template.warm!);
  }
  const totalWarm = [...warm.values()].reduce((sum, n) => sum + n, 0);
  if (totalWarm > MAX_WARM_TOTAL) {
    return {
      problem: {
        key: "templates",
        detail: `the warm pools together must keep <= ${MAX_WARM_TOTAL}, found ${totalWarm}`,
      },
    };
  }
  const domain = serve.domain === undefined ? undefined : checkEntry(serve.domain);
  const backend = backendSettings(tables.backend);
  if ("problem" in backend) return backend;
  return {
    settings: {
      // The schema has refused a listen that does not parse.
      listen: listen !== undefined && "address" in listen
        ? listen.address
        : { hostname: "127.0.0.1", port: 3000 },
      domain: domain !== undefined && "entry" in domain ? domain.entry.host : undefined,
      defaultTimeoutSeconds,
      maxTimeoutSeconds,
      maxBodyBytes: serve.max_body_bytes ?? 64 * 1024 * 1024,
      maxStreamsPerKey: serve.max_streams_per_key ?? 64,
      maxConnections: serve.max_connections,
      maxConnectionsPerPeer: serve.max_connections_per_peer,
      headerTimeoutSeconds,
      requestTimeoutSeconds,
      tenants,
      templates,
      warm,
      backend: backend.backend,
      keysFile: serve.keys_file,
    },
  };
}

// `[backend]`: Kubernetes needs the image that carries waffle into each pod,
// and takes no warm pools (agent-sandbox's own `SandboxWarmPool` is theirs).
function backendSettings(
  table: ServeTables["backend"],
): { backend: BackendSettings } | { problem: ConfigProblem } {
  if (table === undefined || table.kind === "docker") {
    const docker = Object.keys(table ?? {}).find((key) => key !== "kind");
    if (docker !== undefined) {
      return {
        problem: { key: `backend.${docker}`, detail: 'is for kind = "kubernetes" only' },
      };
    }
    return { backend: { kind: "docker" } };
  }
  if (table.waffle_image === undefined) {
    return {
      problem: {
        key: "backend.waffle_image",
        detail: "is required with kind = \"kubernetes\" (build one with 'waffle k8s image')",
      },
    };
  }
  return {
    backend: {
      kind: "kubernetes",
      namespacePrefix: table.namespace_prefix ?? "waffle-",
      kubeconfig: table.kubeconfig,
      context: table.context,
      storageClass: table.storage_class,
      runtimeClass: table.runtime_class,
      waffleImage: table.waffle_image,
      readyTimeoutSeconds: table.ready_timeout ?? 120,
    },
  };
}

/**
 * The limits of one tenant: its `[serve.tenants.<tenant>]` table, else
 * {@linkcode DEFAULT_TENANT_LIMITS}.
 *
 * @example
 * ```ts ignore
 * tenantLimitsOf(config.serve, "acme"); // { maxSandboxes: 20, createsPerMinute: 60 }
 * ```
 *
 * @param settings `waffle serve`'s settings.
 * @param tenant The tenant id.
 * @returns Its limits.
 */
export function tenantLimitsOf(settings: ServeSettings, tenant: string): TenantLimitSettings {
  return settings.tenants.get(tenant) ?? { ...DEFAULT_TENANT_LIMITS };
}
