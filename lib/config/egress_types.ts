/**
 * The egress types of `waffle.toml`, shared by the config's side (what it
 * allows: `egress_schema.ts`, `egress_compose.ts`) and egress's proxy side
 * (`lib/egress/proxy.ts`: what one connection may do). Pure data, no
 * behaviour.
 *
 * @module
 */

/**
 * One allowed destination of an egress list: an exact name
 * (`api.github.com`), a wildcard (`*.pypi.org`: any name ending in
 * `.pypi.org`, not `pypi.org` itself) or an IP literal (`10.1.2.3`,
 * `[fd00::1]`), with the ports it covers (default 443 and 80).
 */
export interface EgressEntry {
  /** `name`: exact; `suffix`: `*.<host>`; `ip`: an IPv4 or IPv6 literal. */
  kind: "name" | "suffix" | "ip";
  /** Lower case, no trailing dot; for `suffix` the part after `*.`; for `ip` the canonical address without brackets. */
  host: string;
  /** Ports, ascending, without duplicates. */
  ports: number[];
}

/** One `[secrets.<name>]` table: a credential the sandbox sees only as a placeholder. */
export interface SecretConfig {
  /** The table key. */
  name: string;
  /** Where the host reads the value: a host variable or a file (absolute path). */
  source: { env: string } | { file: string };
  /** The destinations (exact names) whose requests get the value; TLS is terminated for them. */
  hosts: string[];
  /** The request header the placeholder is replaced in, e.g. `Authorization`. */
  header: string;
  /** How the header's value is written when the sandbox sends the bare placeholder, `{}` standing for the secret; default `"{}"`. */
  format: string;
  /** The variable that holds the placeholder inside the sandbox; default the source variable's name, else the secret's name upper-cased. */
  env: string;
}

/** The `[egress]` table: proxy-wide settings. */
export interface EgressSettings {
  /** Most connections open at once per proxy identity (sandbox or restricted server); default 64. */
  maxConnections: number;
  /** Bandwidth cap per identity and direction, in bytes per second; 0 = none (default). */
  bytesPerSecond: number;
  /** Extra trusted roots (PEM file, absolute): the proxy trusts them upstream and sandboxes get them in their bundle. */
  extraCa?: string | undefined;
  /** Names the proxy resolves itself before DNS (`[egress.hosts] "git.internal" = "10.0.0.5"`). */
  hosts: Record<string, string>;
}

/**
 * What one proxy identity may reach, composed from the config (intersection
 * of the sandbox's, the user's, and for a restricted MCP server its own,
 * its group's and its cron job's lists).
 */
export interface EgressPolicy {
  /** The allowed destinations, already intersected. */
  allow: EgressEntry[];
  /**
   * CIDRs (`127.0.0.1/32`, `10.0.0.0/8`, `fd00::/8`) that a listed name may
   * resolve to although they are loopback, private, link-local or the
   * metadata address (`egress_addresses`); everything else of that kind is refused.
   */
  addresses: string[];
  /**
   * `egress_allow_host_loopback`: `addresses` may reach the host itself (its
   * loopback, and the addresses of its own interfaces, which the proxy
   * otherwise refuses).
   */
  allowHost: boolean;
  /** The secrets this identity's requests may carry. */
  secrets: SecretConfig[];
}

/** Who a proxy identity is, for its audit lines. */
export interface EgressIdentity {
  tenant: string;
  user: string;
  /** The group, for a restricted MCP server's session; else null. */
  group: string | null;
  /** The cron job, for a restricted MCP server's session; else null. */
  cron: string | null;
  /** The MCP server, for a restricted server's session; else null. */
  server: string | null;
}

/** One `[users.<user>]` table: how one user's sandbox is narrowed. */
export interface UserEgress {
  /** The table key: a user id as `waffle exec --user` takes it. */
  name: string;
  /** Intersected with `[sandbox] egress`; absent = no narrowing. */
  egress?: EgressEntry[] | undefined;
  /** The secrets this user's sandbox gets instead of `[sandbox] secrets` (a subset); absent = those. */
  secrets?: string[] | undefined;
}

/** One proxy identity the host attaches: a sandbox, or a restricted server's session. */
export interface EgressAttachment {
  /** Its id: the name of its socket directory and policy file. */
  id: string;
  /** Who it is. */
  identity: EgressIdentity;
  /** What it may reach. */
  policy: EgressPolicy;
  /** The proxy-wide settings. */
  settings: EgressSettings;
}
