/**
 * The file the host writes for each proxy identity and the proxy reads on
 * every new connection (a change applies to the next one): who it is, what
 * it may reach, its secrets with their values, and the caps. Only the host
 * and the proxy can read it (mode 0600, in a directory no sandbox mounts).
 *
 * @module
 */
import * as z from "../schema.ts";
import type { EgressEntry, EgressIdentity } from "../config/egress_types.ts";
import type { HeldSecret } from "./inject.ts";

/** The largest policy file the proxy reads. */
export const MAX_POLICY_FILE_BYTES = 1024 * 1024;

/** One identity's policy, as written for the proxy. */
export interface PolicyFile {
  /** Format version. */
  version: 1;
  /** The identity's id (its socket directory's name). */
  id: string;
  /** Who it is, for audit lines. */
  identity: EgressIdentity;
  /** The allowed destinations. */
  allow: EgressEntry[];
  /** Non-public CIDRs listed names may resolve to. */
  addresses: string[];
  /**
   * Whether `addresses` may reach the host itself: else an address of one of
   * the host's interfaces is refused (absent: false).
   */
  allowHost?: boolean | undefined;
  /** Its secrets, with placeholders and values. */
  secrets: HeldSecret[];
  /** Most connections at once. */
  maxConnections: number;
  /** Bytes per second each way; 0 = no cap. */
  bytesPerSecond: number;
  /** Names resolved by the proxy before DNS. */
  hosts: Record<string, string>;
}

const name = z.string().check(z.minLength(1), z.maxLength(253));
const noControl = z.string().check(
  z.maxLength(65536),
  z.refine((v) => !/[\0\r\n]/.test(v), { error: "must not contain CR, LF or NUL" }),
);

/** The schema of a {@linkcode PolicyFile}. */
export const policyFileSchema: z.ZodMiniType<PolicyFile> = z.strictObject({
  version: z.literal(1),
  id: z.string().check(z.regex(/^[a-z0-9-]{1,64}$/)),
  identity: z.strictObject({
    tenant: z.string(),
    user: z.string(),
    group: z.nullable(z.string()),
    cron: z.nullable(z.string()),
    server: z.nullable(z.string()),
  }),
  allow: z.array(z.strictObject({
    kind: z.enum(["name", "suffix", "ip"]),
    host: name,
    ports: z.array(z.int().check(z.minimum(1), z.maximum(65535))).check(z.maxLength(65535)),
  })).check(z.maxLength(4096)),
  addresses: z.array(z.string().check(z.maxLength(64))).check(z.maxLength(1024)),
  allowHost: z.optional(z.boolean()),
  secrets: z.array(z.strictObject({
    name: z.string().check(z.minLength(1), z.maxLength(64)),
    hosts: z.array(name).check(z.maxLength(256)),
    header: z.string().check(z.regex(/^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$/)),
    format: noControl,
    placeholder: z.string().check(z.regex(/^[A-Za-z0-9_-]{16,128}$/)),
    value: noControl,
  })).check(z.maxLength(256)),
  maxConnections: z.int().check(z.minimum(1), z.maximum(4096)),
  bytesPerSecond: z.int().check(z.minimum(0)),
  hosts: z.record(name, z.string().check(z.maxLength(64))),
});

/**
 * Parses a policy file's text.
 *
 * @param text The file's content (already capped at {@linkcode MAX_POLICY_FILE_BYTES}).
 * @returns The policy.
 * @throws {Error} When it is not valid JSON of the right shape.
 */
export function parsePolicyFile(text: string): PolicyFile {
  return policyFileSchema.parse(JSON.parse(text));
}
