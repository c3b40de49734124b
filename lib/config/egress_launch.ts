/**
 * What a container attached to egress gets from its identity: its socket
 * directory and the CA bundle (mounted read-only), the proxy variables and
 * its secrets' placeholders. Plain data: the container spec
 * (`lib/lifecycle/`) checks the mounts and records a sandbox's launch.
 * Light: no Node modules, so the warm path of `exec` pays nothing for it.
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { join } from "../path.ts";
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
} from "./egress_paths.ts";
import type { EgressAttachment } from "./egress_types.ts";

/** A bind mount a container gets from its egress identity, before the container spec checks it. */
export interface EgressMount {
  /** The host path. */
  source: string;
  /** Where the container sees it. */
  target: string;
  /** Whether it is mounted read-only. */
  readOnly: boolean;
}

/** What a container (a sandbox's, or a restricted session's) gets from its attachment. */
export interface EgressLaunch {
  /** The identity's id. */
  id: string;
  /** Its mounts (socket directory, CA bundle). */
  mounts: EgressMount[];
  /** Its runner's variables. */
  env: string[];
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
 * What a container gets from an attached identity: its id, its socket
 * directory and the CA bundle directory (read-only), and the runner's
 * variables (the socket to bridge, the commands' variables).
 *
 * @example
 * ```ts ignore
 * const launch = egressLaunch(config.sandbox.home, attachment); // { id: "s-…", mounts: [...], env: [...] }
 * ```
 *
 * @param home The waffle home.
 * @param attachment The identity.
 * @returns The launch: the id, the mounts and `NAME=value` entries for the runner.
 */
export function egressLaunch(home: string, attachment: EgressAttachment): EgressLaunch {
  const paths = homeEgress(home);
  const own = identityPaths(paths, attachment.id);
  return {
    id: attachment.id,
    mounts: [
      { source: own.dir, target: SANDBOX_EGRESS_DIR, readOnly: true },
      { source: join(paths.root, "public"), target: SANDBOX_CA_DIR, readOnly: true },
    ],
    env: [
      `${EGRESS_SOCKET_VARIABLE}=${SANDBOX_EGRESS_DIR}/proxy.s`,
      `${EGRESS_ENV_VARIABLE}=${JSON.stringify(attachmentEnv(home, attachment))}`,
    ],
  };
}
