/**
 * What the egress of one home looks like now, for `waffle egress status` and
 * `doctor`: the proxy's container and whether it answers, the CA, each
 * identity the proxy serves (never a secret's value), and the audit file;
 * and `reloadPolicies`, which writes every identity's policy from today's
 * config at once (`waffle egress reload`), so an edited list governs the
 * next connection of a command already running.
 *
 * @module
 */
import type { DockerClient } from "../docker/mod.ts";
import { lexists } from "../fs.ts";
import type { WaffleConfig } from "../config/config.ts";
import { checkId } from "../config/sandbox_key.ts";
import { formatEntry } from "../config/egress_entries.ts";
import type { EgressAttachment } from "../config/egress_types.ts";
import { homeEgress, identityPaths } from "../config/egress_paths.ts";
import { MAX_POLICY_FILE_BYTES, parsePolicyFile, type PolicyFile } from "./policy_file.ts";
import { controlCall, writePolicy } from "./policy_writer.ts";
import { egressPolicy } from "../config/egress_compose.ts";
import { egressAuditFile, proxyContainerName } from "./proxy_container.ts";
import type { EgressCounts } from "./counts.ts";

/** One identity the proxy serves, as status shows it. */
export interface IdentityStatus {
  /** Its id. */
  id: string;
  /** Who it is. */
  identity: PolicyFile["identity"];
  /** Its allowed destinations, formatted. */
  allow: string[];
  /** The names of its secrets whose values the proxy holds. */
  secrets: string[];
  /** Whether its socket exists. */
  socket: boolean;
}

/** The egress of a home. */
export interface EgressStatus {
  /** The proxy's container: its name and state, or null when there is none. */
  proxy: { name: string; state: string; startedAt: string; restarts: number } | null;
  /** Whether its control socket answered, and in how many ms. */
  answering: { ok: boolean; ms: number; detail: string };
  /** The CA certificate file and its SHA-256 fingerprint; null before the first use. */
  ca: { path: string; fingerprint: string } | null;
  /** The identities with a policy file. */
  identities: IdentityStatus[];
  /** The audit file and its size. */
  audit: { path: string; bytes: number };
}

/**
 * Looks at a home's egress.
 *
 * @param docker The Docker client.
 * @param home The waffle home.
 * @returns Its status.
 */
export async function egressStatus(docker: DockerClient, home: string): Promise<EgressStatus> {
  const paths = homeEgress(home);
  const container = await docker.inspectContainer(proxyContainerName(home));
  const started = performance.now();
  let answering: EgressStatus["answering"];
  try {
    await controlCall(paths, "ping");
    answering = { ok: true, ms: performance.now() - started, detail: "answers" };
  } catch (error) {
    answering = { ok: false, ms: performance.now() - started, detail: (error as Error).message };
  }
  let ca: EgressStatus["ca"] = null;
  try {
    const { fingerprint } = await import("./ca.ts");
    ca = {
      path: paths.caCert,
      fingerprint: await fingerprint(Deno.readTextFileSync(paths.caCert)),
    };
  } catch {
    ca = null;
  }
  return {
    proxy: container === null ? null : {
      name: proxyContainerName(home),
      state: container.State.Status,
      startedAt: container.State.StartedAt,
      restarts: container.RestartCount,
    },
    answering,
    ca,
    identities: policyFiles(home).map(({ id, file }) => ({
      id,
      identity: file.identity,
      allow: file.allow.map(formatEntry),
      secrets: file.secrets.map((secret) => secret.name),
      socket: lexists(identityPaths(paths, id).socket),
    })),
    audit: { path: egressAuditFile(home), bytes: sizeOf(egressAuditFile(home)) },
  };
}

/**
 * Writes every identity's policy anew from `config` (secrets read now, or
 * kept when this process cannot read them). An identity whose config no
 * longer attaches it gets an empty list: it fails closed until its next
 * call recycles it.
 *
 * @param config The whole config of the home.
 * @returns The identities written.
 */
export function reloadPolicies(config: WaffleConfig): { id: string; allow: number }[] {
  const home = config.sandbox.home;
  return policyFiles(home).map(({ id, file }) => {
    const who = file.identity;
    checkId("tenant id", who.tenant);
    checkId("user id", who.user);
    const policy = egressPolicy(config, {
      tenant: who.tenant,
      user: who.user,
      ...(who.server === null ? {} : { server: who.server }),
      ...(who.server === null || who.group === null ? {} : { group: who.group }),
      ...(who.server === null || who.cron === null ? {} : { cron: who.cron }),
    }) ?? { allow: [], addresses: [], allowHost: false, secrets: [] };
    const attachment: EgressAttachment = { id, identity: who, policy, settings: config.egress };
    writePolicy(home, attachment);
    return { id, allow: policy.allow.length };
  });
}

function policyFiles(home: string): { id: string; file: PolicyFile }[] {
  const paths = homeEgress(home);
  let names: string[];
  try {
    names = [...Deno.readDirSync(paths.policies)].map((entry) => entry.name);
  } catch {
    return [];
  }
  return names.filter((name) => /^[a-z0-9-]{1,64}\.json$/.test(name)).sort().flatMap((name) => {
    const path = `${paths.policies}/${name}`;
    try {
      if (Deno.statSync(path).size > MAX_POLICY_FILE_BYTES) return [];
      return [{ id: name.slice(0, -5), file: parsePolicyFile(Deno.readTextFileSync(path)) }];
    } catch {
      return [];
    }
  });
}

function sizeOf(path: string): number {
  try {
    return Deno.statSync(path).size;
  } catch {
    return 0;
  }
}

/**
 * Asks a home's egress proxy what it counted.
 *
 * @param home The waffle home.
 * @param id An identity's id; without it, the proxy's totals.
 * @returns The counts; undefined when the proxy does not answer, knows no
 * such identity, or is older than these counts.
 *
 * @example
 * ```ts ignore
 * const counts = await egressCounts(config.home, attachment.id);
 * ```
 */
export async function egressCounts(home: string, id?: string): Promise<EgressCounts | undefined> {
  if (id !== undefined && !/^[a-z0-9-]{1,64}$/.test(id)) return undefined;
  let answer: string;
  try {
    answer = await controlCall(homeEgress(home), id === undefined ? "stats" : `stats ${id}`);
  } catch {
    return undefined;
  }
  try {
    const parsed = JSON.parse(answer) as Record<string, unknown>;
    const out: Partial<EgressCounts> = {};
    for (const key of ["allowed", "denied", "bytesUp", "bytesDown"] as const) {
      const value = parsed[key];
      if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) return undefined;
      out[key] = value;
    }
    return out as EgressCounts;
  } catch {
    return undefined;
  }
}
