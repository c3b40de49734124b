/**
 * Where egress keeps its files, under a waffle home's `egress/` directory
 * (the proxy's container mounts it at {@linkcode PROXY_EGRESS_DIR}):
 *
 * - `ca/ca.pem`, `ca/ca.key`: the waffle CA (the key readable by the proxy alone),
 *   `ca/extra.pem`: the config's `extra_ca`, `ca/placeholder.key`: what placeholders derive from;
 * - `policies/<id>.json`: each identity's policy and secrets (host and proxy only);
 * - `sockets/<id>/proxy.s`: the identity's socket, `sockets/<id>/ca.pem`: the
 *   bundle its sandbox trusts; the directory is what the sandbox mounts, read-only;
 * - `ctl/ctl.s`: the host's control socket to the proxy;
 * - `audit/egress.jsonl` (and `.1`): the audit, written and rotated by the
 *   proxy; `$WAFFLE_HOME/egress.jsonl` is a link to it.
 *
 * @module
 */
import { join } from "../path.ts";
import { PROXY_EGRESS_DIR } from "./sandbox_paths.ts";

export { PROXY_EGRESS_DIR };
/** Where the proxy's container writes the audit (`$WAFFLE_HOME/egress.jsonl` links to it). */
export const PROXY_AUDIT_FILE = `${PROXY_EGRESS_DIR}/audit/egress.jsonl`;
/** Where a sandbox sees its identity's socket directory. */
export const SANDBOX_EGRESS_DIR = "/opt/waffle/egress";
/** The loopback port inside a sandbox that bridges to its socket (`HTTP(S)_PROXY`). */
export const SANDBOX_PROXY_PORT = 3128;
/** The variable that tells the runner to bridge that port (its value is the socket). */
export const EGRESS_SOCKET_VARIABLE = "WAFFLE_EGRESS_SOCKET";
/** The variable carrying the egress variables every command gets (JSON object). */
export const EGRESS_ENV_VARIABLE = "WAFFLE_EGRESS_ENV";

/** The paths of one egress directory. */
export interface EgressPaths {
  /** The `egress/` directory itself. */
  root: string;
  /** CA certificate. */
  caCert: string;
  /** CA private key. */
  caKey: string;
  /** Extra trusted roots (a copy of `extra_ca`). */
  extraCa: string;
  /** The key placeholders derive from. */
  placeholderKey: string;
  /** Directory of policy files. */
  policies: string;
  /** Directory of socket directories. */
  sockets: string;
  /** The control socket. */
  control: string;
  /** The audit file. */
  audit: string;
}

/**
 * The paths under an `egress/` directory.
 *
 * @param root The directory (`<home>/egress` on the host, {@linkcode PROXY_EGRESS_DIR} in the proxy).
 * @returns Its paths.
 */
export function egressPaths(root: string): EgressPaths {
  return {
    root,
    caCert: join(root, "ca", "ca.pem"),
    caKey: join(root, "ca", "ca.key"),
    extraCa: join(root, "ca", "extra.pem"),
    placeholderKey: join(root, "ca", "placeholder.key"),
    policies: join(root, "policies"),
    sockets: join(root, "sockets"),
    control: join(root, "ctl", "ctl.s"),
    audit: join(root, "audit", "egress.jsonl"),
  };
}

/**
 * One identity's files.
 *
 * @param paths The egress directory's paths.
 * @param id The identity's id.
 * @returns Its policy file, socket directory, socket and CA bundle.
 */
export function identityPaths(
  paths: EgressPaths,
  id: string,
): { policy: string; dir: string; socket: string; bundle: string } {
  const dir = join(paths.sockets, id);
  return {
    policy: join(paths.policies, `${id}.json`),
    dir,
    socket: join(dir, "proxy.s"),
    bundle: join(dir, "ca.pem"),
  };
}

/** Where a sandbox finds the CA bundle directory (`bundle.pem`). */
export const SANDBOX_CA_DIR = "/opt/waffle/ca";
/** The bundle every client in a sandbox is pointed at. */
export const SANDBOX_CA_BUNDLE = `${SANDBOX_CA_DIR}/bundle.pem`;
/** The variables that point clients at the bundle (the README's trust table). */
export const CA_VARIABLES = [
  "SSL_CERT_FILE",
  "CURL_CA_BUNDLE",
  "REQUESTS_CA_BUNDLE",
  "GIT_SSL_CAINFO",
  "NODE_EXTRA_CA_CERTS",
  "DENO_CERT",
  "PIP_CERT",
  "NPM_CONFIG_CAFILE",
] as const;

/**
 * The egress directory of a home.
 *
 * @param home The waffle home.
 * @returns Its paths.
 */
export function homeEgress(home: string): EgressPaths {
  return egressPaths(join(home, "egress"));
}
