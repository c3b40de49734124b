/**
 * An egress proxy for tests, in process: a temp egress directory with a
 * fresh waffle CA (and the test upstream CA as `extra.pem`), `runProxy`
 * running on it, policy files written the way the host writes them (temp
 * file, then rename), `sync` on the control socket, one loopback bridge
 * per identity (what a sandbox's `HTTP(S)_PROXY` points at), and the audit
 * lines read back as JSON. Disposing it stops all of that and removes the
 * directory.
 *
 * Needs `--allow-net`, `--allow-read`, `--allow-write` and `--allow-env`.
 *
 * @module
 */
import { join } from "node:path";
import { type CertifiedKey, mintCa } from "../lib/egress/ca.ts";
import { runProxy } from "../lib/egress/proxy.ts";
import { type EgressPaths, egressPaths, identityPaths } from "../lib/config/egress_paths.ts";
import type { PolicyFile } from "../lib/egress/policy_file.ts";
import type { EgressAuditLine } from "../lib/egress/audit.ts";
import type { HeldSecret } from "../lib/egress/inject.ts";
import { controlCall } from "../lib/egress/policy_writer.ts";
import { startEgressBridge } from "../runner/egress_bridge.ts";
import { settlesWithin } from "../lib/async.ts";
import { testCa } from "./_egress_upstreams.ts";

/** The placeholder of {@linkcode TEST_SECRET}. */
export const TEST_PLACEHOLDER = "waffle_gh_0123456789abcdef01234567";

/** A secret for `secret.test`, written into `Authorization` as `Bearer {}`. */
export const TEST_SECRET: HeldSecret = Object.freeze({
  name: "gh",
  hosts: ["secret.test"],
  header: "Authorization",
  format: "Bearer {}",
  placeholder: TEST_PLACEHOLDER,
  value: "s3cret-value",
});

/** How long {@linkcode EgressProxy.waitForAudit} waits by default. */
export const AUDIT_WAIT_MS = 10_000;
/** How long the proxy has to answer its control socket after start. */
const START_MS = 10_000;
/** How long stopping the proxy may take. */
const STOP_MS = 5_000;
/** How long the audit must stay unchanged before the proxy is stopped, and the most to wait. */
const QUIET_MS = 150;
const QUIET_MAX_MS = 2_000;

/** What {@linkcode EgressProxy.writePolicy} takes: any part of a policy; the rest defaults. */
export type PolicyPatch = Partial<Omit<PolicyFile, "id" | "version">>;

/** A running in-process egress proxy, from {@linkcode startEgressProxy}. */
export interface EgressProxy {
  /** The egress directory. */
  dir: string;
  /** Its paths. */
  paths: EgressPaths;
  /** The waffle CA the proxy signs its leaves with (for hosts it injects secrets into). */
  ca: CertifiedKey;
  /** A file holding the waffle CA's certificate alone. */
  caFile: string;
  /** A file holding the test upstream CA's certificate alone. */
  upstreamCaFile: string;
  /** The audit file. */
  auditFile: string;
  /** Aborted when the proxy is told to stop. */
  signal: AbortSignal;
  /**
   * Writes (or rewrites) `policies/<id>.json`: the patch over the defaults
   * (identity tenant `default`, user `alice`; nothing allowed; 64
   * connections; no bandwidth cap). Does not sync.
   */
  writePolicy(id: string, patch?: PolicyPatch): Promise<PolicyFile>;
  /** Writes raw text as `policies/<id>.json` (an invalid policy). */
  writePolicyText(id: string, text: string): Promise<void>;
  /** Removes `policies/<id>.json`. Does not sync. */
  removePolicy(id: string): Promise<void>;
  /** Sends `sync` to the control socket; returns the answer after `ok`. */
  sync(): Promise<string>;
  /** The identity's socket path. */
  socket(id: string): string;
  /** Starts (once) a loopback bridge to the identity's socket and returns its proxy URL. */
  bridge(id: string): Promise<string>;
  /** The audit lines written so far. */
  audit(): Promise<EgressAuditLine[]>;
  /** Waits (bounded) until the audit holds a line `match` accepts, and returns it. */
  waitForAudit(
    match: (line: EgressAuditLine) => boolean,
    timeoutMs?: number,
  ): Promise<EgressAuditLine>;
  /** Stops the proxy (the bridges stay, to show they fail closed). */
  stop(): Promise<void>;
  /** Stops the proxy and the bridges and removes the directory. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** Options of {@linkcode startEgressProxy}. */
export interface StartEgressProxyOptions {
  /** Whether `ca/extra.pem` holds the test upstream CA; default true. */
  extraCa?: boolean;
}

let cachedCa: Promise<CertifiedKey> | undefined;

// The waffle CA: minted once per process (the proxy never changes it).
function waffleCa(): Promise<CertifiedKey> {
  cachedCa ??= mintCa({ commonName: "waffle egress CA (tests)" }).catch((error) => {
    cachedCa = undefined;
    throw error;
  });
  return cachedCa;
}

/**
 * Makes an egress directory and runs the proxy on it until disposed.
 *
 * @example
 * ```ts ignore
 * await using proxy = await startEgressProxy();
 * await proxy.writePolicy("s-a", { allow: [{ kind: "name", host: "api.test", ports: [443] }] });
 * await proxy.sync();
 * const url = await proxy.bridge("s-a"); // http://127.0.0.1:PORT
 * ```
 *
 * @param options Whether the proxy trusts the test upstream CA.
 * @returns The running proxy.
 * @throws {Error} When the proxy does not answer `ping` in time.
 */
export async function startEgressProxy(
  options: StartEgressProxyOptions = {},
): Promise<EgressProxy> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-egress-test-" });
  const paths = egressPaths(dir);
  const ca = await waffleCa();
  const upstreamCa = await testCa();
  for (const sub of ["ca", "policies", "sockets", "ctl"]) {
    await Deno.mkdir(join(dir, sub), { recursive: true });
  }
  await Deno.writeTextFile(paths.caCert, ca.cert);
  await Deno.writeTextFile(paths.caKey, ca.key, { mode: 0o600 });
  if (options.extraCa ?? true) await Deno.writeTextFile(paths.extraCa, upstreamCa.cert);
  const caFile = join(dir, "waffle-ca.pem");
  const upstreamCaFile = join(dir, "upstream-ca.pem");
  await Deno.writeTextFile(caFile, ca.cert);
  await Deno.writeTextFile(upstreamCaFile, upstreamCa.cert);
  const auditFile = join(dir, "audit.jsonl");

  const stopping = new AbortController();
  const bridging = new AbortController();
  const running = runProxy({ dir, audit: auditFile, signal: stopping.signal });
  running.catch(() => {}); // awaited in stop()
  const bridges = new Map<string, string>();
  const stop = async (): Promise<void> => {
    stopping.abort();
    await settlesWithin(running, STOP_MS);
  };
  try {
    await untilPing(paths, running);
  } catch (error) {
    await stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    throw error;
  }

  const audit = async (): Promise<EgressAuditLine[]> => {
    let text: string;
    try {
      text = await Deno.readTextFile(auditFile);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return [];
      throw error;
    }
    return text.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line));
  };
  return {
    dir,
    paths,
    ca,
    caFile,
    upstreamCaFile,
    auditFile,
    signal: stopping.signal,
    async writePolicy(id: string, patch: PolicyPatch = {}): Promise<PolicyFile> {
      const policy: PolicyFile = {
        version: 1,
        id,
        identity: { tenant: "default", user: "alice", group: null, cron: null, server: null },
        allow: [],
        addresses: [],
        secrets: [],
        maxConnections: 64,
        bytesPerSecond: 0,
        hosts: {},
        ...patch,
      };
      await writeAtomically(identityPaths(paths, id).policy, `${JSON.stringify(policy)}\n`);
      return policy;
    },
    async writePolicyText(id: string, text: string): Promise<void> {
      await writeAtomically(identityPaths(paths, id).policy, text);
    },
    async removePolicy(id: string): Promise<void> {
      await Deno.remove(identityPaths(paths, id).policy, { recursive: true });
    },
    sync: () => controlCall(paths, "sync"),
    socket: (id: string) => identityPaths(paths, id).socket,
    bridge(id: string): Promise<string> {
      const known = bridges.get(id);
      if (known !== undefined) return Promise.resolve(known);
      const port = listenOnFreePort((port) =>
        startEgressBridge(identityPaths(paths, id).socket, { signal: bridging.signal, port })
      );
      const url = `http://127.0.0.1:${port}`;
      bridges.set(id, url);
      return Promise.resolve(url);
    },
    audit,
    async waitForAudit(
      match: (line: EgressAuditLine) => boolean,
      timeoutMs = AUDIT_WAIT_MS,
    ): Promise<EgressAuditLine> {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const found = (await audit()).find(match);
        if (found !== undefined) return found;
        if (Date.now() > deadline) {
          throw new Error(
            `No matching audit line within ${timeoutMs} ms; the audit holds:\n` +
              (await audit()).map((line) => JSON.stringify(line)).join("\n"),
          );
        }
        await delay(25);
      }
    },
    stop,
    async [Symbol.asyncDispose](): Promise<void> {
      // A connection's line is written once both its sides closed, which
      // may be just after the client returned: let those land first.
      await untilQuiet(auditFile);
      bridging.abort();
      await stop();
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
}

/**
 * A policy entry for one exact name and its ports.
 *
 * @param host The name.
 * @param ports Its ports.
 * @returns The entry.
 */
export function nameEntry(host: string, ...ports: number[]): PolicyFile["allow"][number] {
  return { kind: "name", host, ports };
}

// Waits for the control socket to answer `ping` (the proxy listens on it
// after its first sync), or for the proxy to fail.
async function untilPing(paths: EgressPaths, running: Promise<void>): Promise<void> {
  let failed: unknown;
  running.catch((error) => (failed = error));
  const deadline = Date.now() + START_MS;
  for (;;) {
    if (failed !== undefined) throw failed;
    try {
      await controlCall(paths, "ping");
      return;
    } catch (error) {
      if (Date.now() > deadline) {
        throw new Error(`The egress proxy did not answer 'ping' within ${START_MS} ms`, {
          cause: error,
        });
      }
    }
    await delay(20);
  }
}

// Waits (bounded) until the file has not grown for a moment.
async function untilQuiet(path: string): Promise<void> {
  const size = (): Promise<number> => Deno.stat(path).then((s) => s.size, () => 0);
  let last = await size();
  for (let waited = 0; waited < QUIET_MAX_MS; waited += QUIET_MS) {
    await delay(QUIET_MS);
    const now = await size();
    if (now === last) return;
    last = now;
  }
}

// Picks a free loopback port and starts `start` on it, again with another
// port when it was taken in between.
function listenOnFreePort(start: (port: number) => void): number {
  for (let attempt = 0;; attempt++) {
    const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = (probe.addr as Deno.NetAddr).port;
    probe.close();
    try {
      start(port);
      return port;
    } catch (error) {
      if (!(error instanceof Deno.errors.AddrInUse) || attempt >= 20) throw error;
    }
  }
}

// As the host writes policy files: a temp file, then rename.
async function writeAtomically(path: string, text: string): Promise<void> {
  const temp = `${path}.${crypto.randomUUID()}.tmp`;
  await Deno.writeTextFile(temp, text, { mode: 0o600 });
  await Deno.rename(temp, path);
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
