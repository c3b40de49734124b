/**
 * What a container attached to egress gets: its identity, its socket
 * directory and the CA bundle (mounted read-only), the proxy variables and
 * its secrets' placeholders. Two kinds of container attach. A sandbox's
 * identity is decided from the whole config when it is opened and recorded
 * in its host-only state directory (`<root>/egress.json`), where the
 * container spec reads it, so the warm path, a full ensure and `sweep`
 * compute the same posture (the attach decision, its socket and its
 * placeholders are part of it; the list of destinations is not: a change to
 * it applies without recycling). A restricted MCP server's session is an
 * identity of its own, decided when the session opens and handed to its
 * container's spec directly (the container lives as long as the session).
 * Light: no Node modules, so the warm path of `exec` pays nothing for it.
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { UsageError } from "../errors.ts";
import { join } from "../path.ts";
import * as z from "../schema.ts";
import type { WaffleConfig } from "../config/config.ts";
import type { HostConfigMount } from "../docker/mod.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";
import { bind } from "../lifecycle/posture.ts";
import {
  CA_VARIABLES,
  EGRESS_ENV_VARIABLE,
  EGRESS_SOCKET_VARIABLE,
  homeEgress,
  identityPaths,
  SANDBOX_CA_BUNDLE,
  SANDBOX_CA_DIR,
  SANDBOX_EGRESS_DIR,
  SANDBOX_PROXY_PORT,
} from "../config/egress_paths.ts";
import { resolveSubject } from "../config/subject.ts";
import { egressPolicy } from "../config/egress_compose.ts";
import type { EgressIdentity, EgressPolicy, EgressSettings } from "../config/egress_types.ts";

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

/**
 * The placeholder a sandbox sees for one secret: derived from a key only
 * the host holds, so it is stable (it is part of the container's posture)
 * and tells nothing of the value; another identity's is another.
 *
 * @param home The waffle home.
 * @param options The identity and the secret.
 * @returns `waffle_<name>_<32 hex>`.
 */
export function placeholderOf(home: string, options: { id: string; secret: string }): string {
  const paths = homeEgress(home);
  let key: string;
  try {
    key = Deno.readTextFileSync(paths.placeholderKey).trim();
  } catch {
    Deno.mkdirSync(join(paths.root, "ca"), { recursive: true, mode: 0o700 });
    const fresh = [...crypto.getRandomValues(new Uint8Array(32))]
      .map((b) => b.toString(16).padStart(2, "0")).join("");
    try {
      Deno.writeTextFileSync(paths.placeholderKey, fresh, { createNew: true, mode: 0o600 });
    } catch (error) {
      if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
    }
    key = Deno.readTextFileSync(paths.placeholderKey).trim();
  }
  const digest = sha256Hex(`${key}|${options.id}|${options.secret}`).slice(0, 32);
  return `waffle_${options.secret.replace(/[^A-Za-z0-9]/g, "_")}_${digest}`;
}

/**
 * The variables every command of an attached sandbox gets: the proxy (the
 * loopback port its runner bridges to the socket), the CA bundle for each
 * runtime that reads one, and each secret's placeholder.
 *
 * @param home The waffle home.
 * @param attachment The identity.
 * @returns Name to value.
 */
export function attachmentEnv(home: string, attachment: EgressAttachment): Record<string, string> {
  const proxy = `http://127.0.0.1:${SANDBOX_PROXY_PORT}`;
  const env: Record<string, string> = {
    HTTP_PROXY: proxy,
    HTTPS_PROXY: proxy,
    http_proxy: proxy,
    https_proxy: proxy,
    NO_PROXY: "localhost,127.0.0.1,::1",
    no_proxy: "localhost,127.0.0.1,::1",
  };
  for (const name of CA_VARIABLES) env[name] = SANDBOX_CA_BUNDLE;
  for (const secret of attachment.policy.secrets) {
    env[secret.env] = placeholderOf(home, { id: attachment.id, secret: secret.name });
  }
  return env;
}

/**
 * The container settings of an attached identity: its socket directory and
 * the CA bundle directory, read-only, and the runner's variables (the socket
 * to bridge, the commands' variables).
 *
 * @param home The waffle home.
 * @param attachment The identity.
 * @returns Mounts and `NAME=value` entries for the runner.
 */
export function attachmentLaunch(
  home: string,
  attachment: EgressAttachment,
): { mounts: HostConfigMount[]; env: string[] } {
  const paths = homeEgress(home);
  const own = identityPaths(paths, attachment.id);
  return {
    mounts: [
      bind(own.dir, SANDBOX_EGRESS_DIR, true),
      bind(join(paths.root, "public"), SANDBOX_CA_DIR, true),
    ],
    env: [
      `${EGRESS_SOCKET_VARIABLE}=${SANDBOX_EGRESS_DIR}/proxy.s`,
      `${EGRESS_ENV_VARIABLE}=${JSON.stringify(attachmentEnv(home, attachment))}`,
    ],
  };
}

const RECORD = "egress.json";

/** What a container (a sandbox's, or a restricted session's) gets from its attachment. */
export interface EgressLaunch {
  /** The identity's id. */
  id: string;
  /** Its mounts (socket directory, CA bundle). */
  mounts: HostConfigMount[];
  /** Its runner's variables. */
  env: string[];
}

const launchSchema = z.strictObject({
  id: z.string().check(z.regex(/^[a-z0-9-]{1,64}$/)),
  mounts: z.array(z.strictObject({
    Type: z.literal("bind"),
    Source: z.string(),
    Target: z.string(),
    ReadOnly: z.boolean(),
  })),
  env: z.array(z.string()),
});

/**
 * The egress identity of a user's sandbox, or undefined when its config
 * attaches none (`[sandbox] egress` absent).
 *
 * @param config The whole config.
 * @param key Whose sandbox.
 * @returns The attachment.
 */
export function sandboxAttachment(
  config: WaffleConfig,
  key: SandboxKey,
): EgressAttachment | undefined {
  const policy = egressPolicy(config, { tenant: key.tenant, user: key.user });
  if (policy === undefined) return undefined;
  return {
    id: `s-${key.hash.slice(0, 24)}`,
    identity: { tenant: key.tenant, user: key.user, group: null, cron: null, server: null },
    policy,
    settings: config.egress,
  };
}

/** Who a restricted MCP server's session is, for {@linkcode restrictedAttachment}. */
export interface RestrictedSubject {
  /** The user's tenant. */
  tenant: string;
  /** The user whose session it is. */
  user: string;
  /** The server (`[mcp.<name>]`, authority "restricted"). */
  server: string;
  /** The session's group; default "default" (a cron job's group when `cron` is given). */
  group?: string | undefined;
  /** The session's cron job. */
  cron?: string | undefined;
}

/**
 * The egress identity of a restricted MCP server's session, or undefined
 * when it gets none (no `egress` of its own, or a cron job with network
 * "none"): its policy is its own (`egressPolicy` with the server, group and
 * cron job), never its user's sandbox's. The id is derived from (tenant,
 * user, server, group, cron job), so concurrent sessions of one server for
 * one user and scope share one policy file and one socket directory, and
 * any other scope has its own.
 *
 * @example
 * ```ts ignore
 * const egress = restrictedAttachment(loadWaffleConfig(), { tenant: "default", user: "alice", server: "fetch", cron: "nightly" });
 * if (egress !== undefined) console.log(egress.id); // "r-" and 24 hex
 * ```
 *
 * @param config The whole config.
 * @param who The session's tenant, user, server and group or cron job.
 * @returns The attachment.
 * @throws {UsageError} On a bad id, an unknown server, group or cron job, both a group and a
 *   cron job, or a server whose authority is not "restricted".
 */
export function restrictedAttachment(
  config: WaffleConfig,
  who: RestrictedSubject,
): EgressAttachment | undefined {
  const policy = egressPolicy(config, who);
  const authority = config.policy.servers[who.server]!.authority;
  if (authority !== "restricted") {
    // A sandbox server's egress is its sandbox's identity, a host server's the host's network.
    throw new UsageError(
      `Server '${who.server}' has authority "${authority}": only a restricted server's session is an egress identity of its own`,
    );
  }
  if (policy === undefined) return undefined;
  // The scope as the policy resolved it: a cron job's group is the job's.
  const { group } = resolveSubject(config.policy, who);
  const cron = who.cron ?? null;
  const identity = { tenant: who.tenant, user: who.user, group, cron, server: who.server };
  const digest = sha256Hex(JSON.stringify([who.tenant, who.user, who.server, group, cron]));
  return { id: `r-${digest.slice(0, 24)}`, identity, policy, settings: config.egress };
}

/**
 * What a container gets from an attached identity: its id, and the mounts
 * and runner variables of {@linkcode attachmentLaunch}.
 *
 * @param home The waffle home.
 * @param attachment The identity.
 * @returns The launch, as `containerSpec` takes it.
 */
export function egressLaunch(home: string, attachment: EgressAttachment): EgressLaunch {
  return { id: attachment.id, ...attachmentLaunch(home, attachment) };
}

/**
 * Records what a sandbox's container gets from its attachment (or that it
 * has none), rewriting the record only when it changed.
 *
 * @param root The sandbox's state root.
 * @param options The home and the attachment (undefined: none).
 */
export function recordAttachment(
  root: string,
  options: { home: string; attachment: EgressAttachment | undefined },
): void {
  const path = join(root, RECORD);
  if (options.attachment === undefined) {
    try {
      Deno.removeSync(path);
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    }
    return;
  }
  const text = `${JSON.stringify(egressLaunch(options.home, options.attachment))}\n`;
  try {
    if (Deno.readTextFileSync(path) === text) return;
  } catch {
    // absent
  }
  const temp = `${path}.tmp`;
  Deno.writeTextFileSync(temp, text, { mode: 0o600 });
  Deno.renameSync(temp, path);
}

/**
 * What the last open recorded for a sandbox's container.
 *
 * @param root The sandbox's state root.
 * @returns The launch, or undefined when it has no egress.
 */
export function recordedLaunch(root: string): EgressLaunch | undefined {
  let text: string;
  try {
    text = Deno.readTextFileSync(join(root, RECORD));
  } catch {
    return undefined;
  }
  return launchSchema.parse(JSON.parse(text));
}
