/**
 * One connection through the egress proxy, from the sandbox's socket to its
 * upstream: the request head, the policy's decision, name resolution by the
 * proxy, the address check, and then one of three ways on:
 *
 * - `CONNECT` to a host without secrets: the tunnel must start with a TLS
 *   ClientHello whose SNI is the CONNECT host (so an allowed name cannot
 *   carry another one, nor a plaintext CONNECT to a further proxy), then
 *   bytes pass through untouched;
 * - `CONNECT` to a host a secret is for: TLS is terminated with a leaf of
 *   the waffle CA, each request's placeholder replaced in its header, and
 *   the request sent on over TLS verified against the real roots;
 * - an absolute-form HTTP request: forwarded with `Connection: close`.
 *
 * Nothing reaches an upstream before every check passed.
 *
 * @module
 */
import net, { type Socket } from "node:net";
import tls from "node:tls";
import { lookup } from "node:dns/promises";
import type { Buffer } from "node:buffer";
import { addressRefusal, allows, canonicalIp, isIpLiteral } from "./entries.ts";
import {
  collect,
  headerValues,
  readHead,
  type RequestHead,
  serializeHead,
  upstreamHead,
} from "./http_head.ts";
import { injectSecrets } from "./inject.ts";
import { MAX_HELLO_BYTES, parseClientHello } from "./client_hello.ts";
import type { EgressAuditLine } from "./audit.ts";
import type { PolicyFile } from "./policy_file.ts";
import type { ByteBucket } from "./throttle.ts";

/** How long a client has to send its request head, or a tunnel its ClientHello. */
const HEAD_TIMEOUT_MS = 10_000;
/** How long a connection to an upstream may take. */
const CONNECT_TIMEOUT_MS = 10_000;
/** A tunnel or forwarded request idle this long is closed. */
const IDLE_TIMEOUT_MS = 300_000;

/** What a connection needs from the identity it arrived for. */
export interface ConnectionContext {
  /** Today's policy (read afresh for this connection). */
  policy: PolicyFile;
  /** The bandwidth buckets, up and down. */
  buckets: { up: ByteBucket; down: ByteBucket };
  /** A TLS context presenting a waffle-CA leaf for a host (for secret injection). */
  leafFor: (host: string) => Promise<tls.SecureContext>;
  /** The roots upstream certificates are verified against. */
  roots: string[];
}

/** A refusal by policy: answered to the client (when it still can be) and audited `denied`. */
class Refused extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

/** A failure that is no refusal (malformed, unreachable): the decision stands. */
class Failed extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

/**
 * Serves one client connection to its end and returns its audit line
 * (without identity and time, which the caller adds).
 *
 * @param client The socket from the sandbox.
 * @param context The identity's policy, caps and TLS material.
 * @returns What happened, for the audit.
 */
export async function serveConnection(
  client: Socket,
  context: ConnectionContext,
): Promise<Omit<EgressAuditLine, "time" | keyof PolicyFile["identity"]>> {
  const started = performance.now();
  const line = {
    method: null as string | null,
    destination: null as string | null,
    port: null as number | null,
    address: null as string | null,
    decision: "denied" as "allowed" | "denied",
    secrets: [] as string[],
    bytesUp: 0,
    bytesDown: 0,
    durationMs: 0,
  };
  let reason: string | undefined;
  let answered = false;
  let refusal: string | undefined;
  try {
    const { head, rest } = await readHead(client, { timeoutMs: HEAD_TIMEOUT_MS });
    line.method = head.method;
    const target = requestTarget(head);
    line.destination = target.host;
    line.port = target.port;
    const address = await checkedAddress(target, context.policy);
    line.address = address;
    line.decision = "allowed";
    const counters = {
      up: (n: number) => (line.bytesUp += n),
      down: (n: number) => (line.bytesDown += n),
    };
    if (head.method === "CONNECT") {
      client.write("HTTP/1.1 200 Connection established\r\n\r\n");
      answered = true;
      const hello = await readHello(client, rest, target.host);
      const secrets = context.policy.secrets.filter((s) => s.hosts.includes(target.host));
      if (secrets.length > 0) {
        line.secrets = await terminate(client, hello, { target, address, context, counters });
      } else {
        const upstream = present(client, await dial(address, target.port));
        upstream.write(hello);
        counters.up(hello.length);
        await splice(client, upstream, { buckets: context.buckets, counters });
      }
    } else {
      const upstream = present(client, await dial(address, target.port));
      const path = new URL(head.target);
      const sent = serializeHead(upstreamHead(head, `${path.pathname}${path.search}`));
      upstream.write(sent);
      upstream.write(rest);
      counters.up(sent.length + rest.length);
      await splice(client, upstream, { buckets: context.buckets, counters });
    }
  } catch (error) {
    reason = error instanceof Error ? error.message : String(error);
    if (error instanceof Refused) line.decision = "denied";
    if (!answered && (error instanceof Refused || error instanceof Failed)) {
      const body = `${reason}\n`;
      const verdict = error instanceof Refused ? "Refused" : "Failed";
      refusal = `HTTP/1.1 ${error.status} ${verdict} by waffle egress\r\n` +
        `Content-Type: text/plain; charset=utf-8\r\nContent-Length: ${
          new TextEncoder().encode(body).length
        }\r\nConnection: close\r\n\r\n${body}`;
    }
  } finally {
    endSoon(client, refusal);
    line.durationMs = Math.round(performance.now() - started);
  }
  return reason === undefined ? line : { ...line, reason };
}

/**
 * Ends a socket and frees it once the client has ended too (at most a
 * second later): a refused client that never reads holds nothing of the
 * proxy's for long.
 *
 * @param socket The socket, with a refusal (or nothing) written.
 * @param text What to write last, if anything.
 */
export function endSoon(socket: Socket, text?: string): void {
  if (socket.destroyed) return;
  // What the client sent and nobody read would make the close a reset,
  // which can discard the refusal before the client reads it: read it away,
  // and free the socket at the client's own end, or a second later.
  socket.on("data", () => {});
  socket.resume();
  const timer = setTimeout(() => socket.destroy(), 1000);
  socket.once("close", () => clearTimeout(timer));
  socket.once("end", () => socket.destroy());
  if (text === undefined) socket.end();
  else socket.end(text);
}

interface Target {
  host: string;
  port: number;
}

// The destination a request names: `host:port` for CONNECT, the URL's for an
// absolute-form request (whose Host header must agree).
function requestTarget(head: RequestHead): Target {
  if (head.method === "CONNECT") {
    const match = /^(\[[0-9a-fA-F:.]+\]|[^:\[\]]+):(\d{1,5})$/.exec(head.target);
    if (match === null) throw new Failed(400, `Malformed CONNECT target '${shown(head.target)}'`);
    return { host: checkedHost(match[1]!), port: port(match[2]!) };
  }
  let url: URL;
  try {
    url = new URL(head.target);
  } catch {
    throw new Failed(
      400,
      `Not a proxy request: '${shown(head.target)}' is no absolute URL`,
    );
  }
  if (url.protocol !== "http:") {
    throw new Failed(400, `Only http:// is forwarded ('${url.protocol}'); use CONNECT for https`);
  }
  const target = { host: checkedHost(url.hostname), port: url.port === "" ? 80 : port(url.port) };
  const hosts = headerValues(head, "host");
  const named = hosts.length === 1 ? normalHost(hosts[0]!.replace(/:\d+$/, "")) : undefined;
  if (named !== target.host) {
    throw new Refused(
      403,
      `Host header '${shown(hosts.join(", "))}' does not match '${target.host}'`,
    );
  }
  return target;
}

// A destination as the policy compares it: an IP literal, or a name of DNS
// characters (anything else is refused before it reaches a message or the audit).
function checkedHost(host: string): string {
  const normal = normalHost(host);
  if (isIpLiteral(normal) || /^[a-z0-9_.-]{1,253}$/.test(normal)) return normal;
  throw new Failed(400, `Malformed host '${shown(host)}'`);
}

/**
 * A value from the client as a message shows it: at most 100 characters,
 * control characters as `?` (a refusal or an audit line stays one short line).
 *
 * @param text The value.
 * @returns The shown form.
 */
export function shown(text: string): string {
  // deno-lint-ignore no-control-regex
  const clean = text.replace(/[\x00-\x1f\x7f]/g, "?");
  return clean.length > 100 ? `${clean.slice(0, 100)}…` : clean;
}

function normalHost(host: string): string {
  const bare = host.replace(/^\[(.*)\]$/, "$1").toLowerCase().replace(/\.$/, "");
  return canonicalIp(bare) ?? bare;
}

function port(text: string): number {
  const value = Number(text);
  if (!Number.isInteger(value) || value < 1 || value > 65535) {
    throw new Failed(400, `Invalid port '${shown(text)}'`);
  }
  return value;
}

// The policy's decision, then the address the proxy itself resolved, which
// is the only one ever connected to (no second lookup to rebind).
async function checkedAddress(target: Target, policy: PolicyFile): Promise<string> {
  if (!allows(policy.allow, target.host, target.port)) {
    throw new Refused(
      403,
      isIpLiteral(target.host)
        ? `'${target.host}:${target.port}' is an IP literal not in this sandbox's egress list`
        : `'${target.host}:${target.port}' is not in this sandbox's egress list`,
    );
  }
  const candidates = isIpLiteral(target.host)
    ? [target.host]
    : policy.hosts[target.host] !== undefined
    ? [policy.hosts[target.host]!]
    : await resolveName(target.host);
  let refusal = "";
  for (const candidate of candidates) {
    const ip = canonicalIp(candidate) ?? candidate;
    const why = addressRefusal(ip, policy.addresses);
    if (why === undefined) return ip;
    refusal ||= why;
  }
  throw new Refused(403, `'${target.host}' resolves to ${refusal}`);
}

async function resolveName(host: string): Promise<string[]> {
  try {
    return (await lookup(host, { all: true })).map((entry) => entry.address);
  } catch (error) {
    throw new Failed(502, `Cannot resolve '${host}': ${(error as Error).message}`);
  }
}

// The tunnel's first TLS record, whose SNI must be the CONNECT host (none
// for an IP literal, which clients send without one).
async function readHello(client: Socket, rest: Buffer, host: string): Promise<Buffer> {
  if (rest.length > 0) client.unshift(rest);
  const { taken } = await collect(client, {
    enough: (bytes) => {
      const verdict = parseClientHello(bytes);
      if (verdict.kind === "incomplete") return undefined;
      if (verdict.kind === "not-tls") {
        throw new Refused(403, `Refused tunnel to '${host}': ${verdict.detail}`);
      }
      const sni = verdict.sni;
      if (sni === undefined ? !isIpLiteral(host) : sni !== host) {
        throw new Refused(
          403,
          `TLS server name '${sni ?? "(none)"}' does not match CONNECT host '${host}'`,
        );
      }
      return bytes.length;
    },
    maxBytes: MAX_HELLO_BYTES,
    timeoutMs: HEAD_TIMEOUT_MS,
  }).catch((error) => {
    throw error instanceof Refused
      ? error
      : new Failed(400, `No TLS ClientHello: ${error.message}`);
  });
  return taken;
}

function dial(address: string, port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    // No Nagle: a TLS handshake's small writes must not wait for delayed ACKs.
    const socket = net.connect({ host: address, port, noDelay: true });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(
        new Failed(504, `No connection to '${address}:${port}' within ${CONNECT_TIMEOUT_MS} ms`),
      );
    }, CONNECT_TIMEOUT_MS);
    socket.once("connect", () => {
      clearTimeout(timer);
      resolve(socket);
    });
    socket.once("error", (error) => {
      clearTimeout(timer);
      reject(new Failed(502, `Cannot connect to '${address}:${port}': ${error.message}`));
    });
  });
}

// TLS terminated with a waffle-CA leaf: one request per connection, its
// placeholders replaced, sent on over TLS verified for the host's name.
async function terminate(
  client: Socket,
  hello: Buffer,
  options: {
    target: Target;
    address: string;
    context: ConnectionContext;
    counters: { up: (n: number) => void; down: (n: number) => void };
  },
): Promise<string[]> {
  const { target, address, context, counters } = options;
  client.unshift(hello);
  const secure = new tls.TLSSocket(client, {
    isServer: true,
    secureContext: await context.leafFor(target.host),
    ALPNProtocols: ["http/1.1"],
  });
  secure.on("error", () => secure.destroy());
  const { head, rest } = await readHead(secure as unknown as Socket, {
    timeoutMs: HEAD_TIMEOUT_MS,
  });
  const hosts = headerValues(head, "host").map((h) => normalHost(h.replace(/:\d+$/, "")));
  if (hosts.length !== 1 || hosts[0] !== target.host) {
    throw new Refused(421, `Host header does not match the tunnel's '${target.host}'`);
  }
  const { head: injected, injected: names } = injectSecrets(upstreamHead(head, head.target), {
    host: target.host,
    secrets: context.policy.secrets,
  });
  const upstream = await new Promise<tls.TLSSocket>((resolve, reject) => {
    const socket = tls.connect({
      host: address,
      port: target.port,
      servername: isIpLiteral(target.host) ? undefined : target.host,
      ca: context.roots,
      ALPNProtocols: ["http/1.1"],
      checkServerIdentity: (_host, cert) => tls.checkServerIdentity(target.host, cert),
    });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`No TLS connection to '${target.host}' within ${CONNECT_TIMEOUT_MS} ms`));
    }, CONNECT_TIMEOUT_MS);
    socket.once("secureConnect", () => {
      clearTimeout(timer);
      socket.setNoDelay(true);
      resolve(socket);
    });
    socket.once("error", (error) => {
      clearTimeout(timer);
      reject(new Error(`TLS to '${target.host}' failed: ${error.message}`));
    });
  });
  present(secure as unknown as Socket, upstream);
  const sent = serializeHead(injected);
  upstream.write(sent);
  // Deno's node:tls fails a zero-length write (EPERM), which left the
  // connection open until the idle timeout: a request without a body.
  if (rest.length > 0) upstream.write(rest);
  counters.up(sent.length + rest.length);
  await splice(secure as unknown as Socket, upstream as unknown as Socket, {
    buckets: context.buckets,
    counters,
  });
  return names;
}

// The upstream, once the client is known to be still there; else both go.
function present<T extends { destroy(): void }>(client: Socket, upstream: T): T {
  if (!client.destroyed) return upstream;
  upstream.destroy();
  throw new Failed(499, "The client left while the upstream was connected");
}

// Both ways until both sides closed, each direction held to its bucket; an
// error or a long silence on either side ends both.
function splice(
  client: Socket,
  upstream: Socket,
  options: {
    buckets: { up: ByteBucket; down: ByteBucket };
    counters: { up: (n: number) => void; down: (n: number) => void };
  },
): Promise<void> {
  // A side that went while the upstream was dialled has emitted its close
  // already (a listener added now would never hear it): both end here.
  if (client.destroyed || upstream.destroyed) {
    client.destroy();
    upstream.destroy();
    return Promise.resolve();
  }
  return new Promise((resolve) => {
    let closed = 0;
    const fail = (): void => {
      client.destroy();
      upstream.destroy();
    };
    for (const socket of [client, upstream]) {
      socket.once("close", () => ++closed === 2 && resolve());
      socket.on("error", fail);
      socket.setTimeout(IDLE_TIMEOUT_MS, fail);
    }
    pump(client, upstream, { bucket: options.buckets.up, count: options.counters.up });
    pump(upstream, client, { bucket: options.buckets.down, count: options.counters.down });
  });
}

function pump(
  from: Socket,
  to: Socket,
  options: { bucket: ByteBucket; count: (n: number) => void },
): void {
  from.on("data", (chunk: Buffer) => {
    options.count(chunk.length);
    const flowing = to.write(chunk);
    const wait = options.bucket.take(chunk.length);
    if (flowing && wait === 0) return;
    from.pause();
    const resume = (): void => void from.resume();
    const drained = (): void => (flowing ? resume() : void to.once("drain", resume));
    if (wait > 0) setTimeout(drained, wait);
    else drained();
  });
  from.once("end", () => to.end());
  from.resume();
}
