/**
 * The egress proxy process (`waffle egress-proxy`, in a container of its
 * own): one Unix socket per identity (a sandbox, or a restricted MCP
 * server's session), whose policy file it reads afresh for every new
 * connection, and a control socket the host tells to pick up new
 * identities. The socket a connection arrived on is its identity: a
 * sandbox cannot name another.
 *
 * @module
 */
import { egressLog } from "./log.ts";
import net, { type Server, type Socket } from "node:net";
import tls from "node:tls";
import { chmodSync, existsSync, mkdirSync, readdirSync, rmSync, statSync } from "node:fs";
import { EgressAudit } from "./audit.ts";
import { addCounts, type EgressCounts, statsAnswer, zeroCounts } from "./counts.ts";
import { type ConnectionContext, endSoon, serveConnection } from "./connection.ts";
import { type EgressPaths, egressPaths, identityPaths } from "../config/egress_paths.ts";
import { MAX_POLICY_FILE_BYTES, parsePolicyFile, type PolicyFile } from "./policy_file.ts";
import { ByteBucket } from "./throttle.ts";
import type { CertifiedKey } from "./ca.ts";

/** Most connections the whole proxy keeps open, over every identity. */
const MAX_TOTAL_CONNECTIONS = 8192;

/** Options of {@linkcode runProxy}. */
export interface ProxyOptions {
  /** The egress directory ({@linkcode egressPaths}). */
  dir: string;
  /** The audit file. */
  audit: string;
  /** Stops the proxy. */
  signal?: AbortSignal;
}

interface Identity {
  id: string;
  server: Server | undefined;
  file: string;
  policy: PolicyFile | undefined;
  problem: string | undefined;
  /** The file's mtime, inode and size when last read ("" for none). */
  stamp: string;
  active: number;
  buckets: { up: ByteBucket; down: ByteBucket };
  counts: EgressCounts;
}

/**
 * Runs the proxy until its signal aborts (or forever).
 *
 * @param options Its directory, audit file and stop signal.
 */
export async function runProxy(options: ProxyOptions): Promise<void> {
  const paths = egressPaths(options.dir);
  const audit = new EgressAudit(options.audit);
  const ca: CertifiedKey = {
    cert: Deno.readTextFileSync(paths.caCert),
    key: Deno.readTextFileSync(paths.caKey),
  };
  const roots = [
    ...tls.rootCertificates,
    ...(existsSync(paths.extraCa) ? [Deno.readTextFileSync(paths.extraCa)] : []),
  ];
  // Loaded now, not at the first TLS connection: in the bundled artefact it
  // is a chunk of the build this proxy started from, which a later install
  // may remove while the proxy runs.
  const minting = import("./ca.ts");
  minting.catch(() => {}); // reported by the first leaf that needs it
  const leaves = new Map<string, Promise<tls.SecureContext>>();
  const leafFor = (host: string): Promise<tls.SecureContext> => {
    let leaf = leaves.get(host);
    if (leaf === undefined) {
      leaf = minting.then(async ({ mintLeaf }) => {
        const minted = await mintLeaf(ca, host);
        return tls.createSecureContext({ cert: minted.cert, key: minted.key });
      });
      leaves.set(host, leaf);
    }
    return leaf;
  };
  const identities = new Map<string, Identity>();
  // Since this proxy started; an identity's own go with it when its policy file goes.
  const totals = zeroCounts();
  let total = 0;
  const accept = (identity: Identity, client: Socket): void => {
    // First: a client gone before a refusal is written (EPIPE) would
    // otherwise throw out of the process, ending every identity's proxy.
    client.on("error", () => {});
    const policy = currentPolicy(identity);
    const time = new Date().toISOString();
    const who = policy?.identity ?? { tenant: "", user: "", group: null, cron: null, server: null };
    const refuse = (reason: string): void => {
      endSoon(client, `HTTP/1.1 429 Refused by waffle egress\r\nConnection: close\r\n\r\n`);
      const line = deniedLine({ time, who, reason });
      addCounts([identity.counts, totals], line);
      audit.writeFor(identity.id, line);
    };
    if (policy === undefined) return refuse(identity.problem ?? "No policy");
    if (identity.active >= policy.maxConnections || total >= MAX_TOTAL_CONNECTIONS) {
      return refuse(`Over max_connections (${policy.maxConnections}) of this sandbox`);
    }
    identity.active++;
    total++;
    // The slot is the client socket's: it is given back when that socket
    // closes, whatever step of the connection was waiting then.
    let held = true;
    const release = (): void => {
      if (!held) return;
      held = false;
      identity.active--;
      total--;
    };
    client.once("close", release);
    const context: ConnectionContext = { policy, buckets: identity.buckets, leafFor, roots };
    void serveConnection(client, context).then((line) => {
      release();
      addCounts([identity.counts, totals], line);
      audit.writeFor(identity.id, { time, ...who, ...line });
    });
  };
  const sync = (): Promise<number> => syncIdentities(paths, { identities, accept });
  await sync();
  const control = await listen(paths.control, (socket) => {
    socket.on("error", () => {});
    socket.setTimeout(5000, () => socket.destroy());
    socket.once("data", (data) => {
      const command = String(data).trim();
      if (command === "sync") void sync().then((n) => socket.end(`ok ${n}\n`));
      else if (command === "ping") socket.end("ok\n");
      else if (command === "stats" || command.startsWith("stats ")) {
        socket.end(statsAnswer(command, { totals, of: (id) => identities.get(id)?.counts }));
      } else socket.end("error unknown command\n");
    });
  }, 0o600);
  egressLog(`Serving ${identities.size} identities`);
  await new Promise<void>((resolve) => {
    if (options.signal === undefined) return;
    options.signal.addEventListener("abort", () => resolve(), { once: true });
  });
  control.close();
  for (const identity of identities.values()) identity.server?.close();
}

// Opens a listener for every policy file and closes those whose file went.
async function syncIdentities(
  paths: EgressPaths,
  state: {
    identities: Map<string, Identity>;
    accept: (identity: Identity, client: Socket) => void;
  },
): Promise<number> {
  const { identities } = state;
  mkdirSync(paths.policies, { recursive: true });
  const present = new Set(
    readdirSync(paths.policies)
      .filter((name) => /^[a-z0-9-]{1,64}\.json$/.test(name))
      .map((name) => name.slice(0, -".json".length)),
  );
  for (const [id, identity] of identities) {
    if (present.has(id)) continue;
    identity.server?.close();
    identities.delete(id);
  }
  const opening: Promise<unknown>[] = [];
  for (const id of present) {
    if (identities.has(id)) continue;
    const files = identityPaths(paths, id);
    mkdirSync(files.dir, { recursive: true, mode: 0o755 });
    // Sandboxes connect as their own uids: the directory is what they mount.
    const server = listen(files.socket, (client) => state.accept(identity, client), 0o666);
    opening.push(server.catch((error) => egressLog(`Cannot listen for '${id}': ${error.message}`)));
    const identity: Identity = {
      id,
      file: files.policy,
      server: undefined,
      policy: undefined,
      problem: undefined,
      stamp: "",
      active: 0,
      buckets: { up: new ByteBucket(0), down: new ByteBucket(0) },
      counts: zeroCounts(),
    };
    void server.then((listening) => (identity.server = listening), () => {});
    identities.set(id, identity);
  }
  await Promise.all(opening);
  return identities.size;
}

// The identity's policy as its file says now: read again when it changed,
// and refused whole (every connection denied) when it cannot be read.
function currentPolicy(identity: Identity): PolicyFile | undefined {
  try {
    const stat = statSync(identity.file);
    // Not the mtime alone: two writes within one tick of the file system's
    // clock share it, and the host's rename gives each write a new inode.
    const stamp = `${stat.mtimeMs}:${stat.ino}:${stat.size}`;
    if (stamp === identity.stamp) return identity.policy;
    if (stat.size > MAX_POLICY_FILE_BYTES) {
      throw new Error(`Larger than ${MAX_POLICY_FILE_BYTES} bytes`);
    }
    identity.policy = parsePolicyFile(Deno.readTextFileSync(identity.file));
    identity.problem = undefined;
    identity.stamp = stamp;
    identity.buckets.up.rate = identity.policy.bytesPerSecond;
    identity.buckets.down.rate = identity.policy.bytesPerSecond;
  } catch (error) {
    identity.policy = undefined;
    identity.stamp = "";
    identity.problem = `Cannot read policy '${identity.file}': ${(error as Error).message}`;
  }
  return identity.policy;
}

function deniedLine(
  options: { time: string; who: PolicyFile["identity"]; reason: string },
): Parameters<EgressAudit["write"]>[0] {
  return {
    time: options.time,
    ...options.who,
    method: null,
    destination: null,
    port: null,
    address: null,
    decision: "denied",
    reason: options.reason,
    secrets: [],
    bytesUp: 0,
    bytesDown: 0,
    durationMs: 0,
  };
}

function listen(
  path: string,
  onConnection: (socket: Socket) => void,
  mode: number,
): Promise<Server> {
  mkdirSync(path.slice(0, path.lastIndexOf("/")), { recursive: true, mode: 0o700 });
  rmSync(path, { force: true });
  return new Promise((resolve, reject) => {
    const server = net.createServer(onConnection);
    server.once("error", reject);
    server.listen(path, () => {
      chmodSync(path, mode);
      resolve(server);
    });
  });
}
