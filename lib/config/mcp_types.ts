/**
 * The MCP policy of `waffle.toml` as data: the `[mcp.<name>]` servers, the
 * `[groups.<name>]` and the `[cron.<name>]` jobs (and the users and secrets
 * egress composes with them), and the constants their schema and their
 * consumers share. Pure data, no behaviour.
 *
 * @module
 */
import type { EgressEntry, SecretConfig, UserEgress } from "./egress_types.ts";

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
