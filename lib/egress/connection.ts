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
 *   the waffle CA, the request inside checked to name the tunnel's host and
 *   port (lib/egress/request_target.ts) and sent on in origin form over TLS
 *   verified against the real roots, its placeholder replaced in its header;
 * - an absolute-form `http://` request: forwarded in origin form with
 *   `Connection: close`, under the same rule.
 *
 * A forwarded or terminated connection carries exactly one request: its
 * body framing must be unambiguous (else 400), and what the client sends
 * after that message's end is dropped, never a second request unchecked.
 *
 * Nothing reaches an upstream before every check passed.
 *
 * @module
 */
import net, { type Socket } from "node:net";
import tls from "node:tls";
import { lookup } from "node:dns/promises";
import type { Buffer } from "node:buffer";
import { addressRefusal, allows, canonicalIp, isIpLiteral } from "../config/egress_entries.ts";
import { isHostAddress } from "./host_addresses.ts";
import { type BodyFraming, bodyFraming, type BodyTracker, bodyTracker } from "./http_framing.ts";
import { collect, readHead, type RequestHead, serializeHead, upstreamHead } from "./http_head.ts";
import { injectSecrets } from "./inject.ts";
import { EgressFailed, EgressRefused, refusalResponse } from "./refusal.ts";
import {
  type Authority,
  connectAuthority,
  forwardedRequest,
  type RoutedRequest,
  tunnelRequest,
} from "./request_target.ts";
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
    const forwarded = head.method === "CONNECT" ? undefined : forwardedRequest(head);
    const framing = forwarded === undefined ? undefined : checkedFraming(forwarded.head);
    const target = forwarded?.authority ?? connectAuthority(head.target);
    line.destination = target.host;
    line.port = target.port;
    const address = await checkedAddress(target, context.policy);
    line.address = address;
    line.decision = "allowed";
    const counters = {
      up: (n: number) => (line.bytesUp += n),
      down: (n: number) => (line.bytesDown += n),
    };
    if (forwarded === undefined) {
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
        await splice(client, upstream, { buckets: context.buckets, counters, body: undefined });
      }
    } else {
      const upstream = present(client, await dial(address, target.port));
      const sent = serializeHead(upstreamHead(forwarded.head, forwarded.head.target));
      upstream.write(sent);
      counters.up(sent.length);
      const body = bodyTracker(framing!);
      const first = rest.subarray(0, body.take(rest));
      if (first.length > 0) upstream.write(first);
      counters.up(first.length);
      await splice(client, upstream, { buckets: context.buckets, counters, body });
    }
  } catch (error) {
    reason = error instanceof Error ? error.message : String(error);
    if (error instanceof EgressRefused) line.decision = "denied";
    if (!answered && (error instanceof EgressRefused || error instanceof EgressFailed)) {
      refusal = refusalResponse(error);
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

// A request's body framing, refused (400) when two parsers could read it two ways.
function checkedFraming(head: RequestHead): BodyFraming {
  try {
    return bodyFraming(head);
  } catch (error) {
    throw new EgressRefused(400, (error as Error).message);
  }
}

// The policy's decision, then the address the proxy itself resolved, which
// is the only one ever connected to (no second lookup to rebind).
async function checkedAddress(target: Authority, policy: PolicyFile): Promise<string> {
  if (!allows(policy.allow, target.host, target.port)) {
    throw new EgressRefused(
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
    const why = addressRefusal(ip, policy.addresses) ?? hostRefusal(ip, policy);
    if (why === undefined) return ip;
    refusal ||= why;
  }
  throw new EgressRefused(403, `'${target.host}' resolves to ${refusal}`);
}

// The proxy has the host's network: an address of the host's own interfaces
// (docker0's gateway under an `egress_addresses` of 172.16.0.0/12) reaches
// every service the host binds there.
function hostRefusal(ip: string, policy: PolicyFile): string | undefined {
  if (policy.allowHost === true || !isHostAddress(ip)) return undefined;
  return `'${ip}', an address of the proxy's host itself (egress_allow_host_loopback is not set)`;
}

async function resolveName(host: string): Promise<string[]> {
  try {
    return (await lookup(host, { all: true })).map((entry) => entry.address);
  } catch (error) {
    throw new EgressFailed(502, `Cannot resolve '${host}': ${(error as Error).message}`);
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
        throw new EgressRefused(403, `Refused tunnel to '${host}': ${verdict.detail}`);
      }
      const sni = verdict.sni;
      if (sni === undefined ? !isIpLiteral(host) : sni !== host) {
        throw new EgressRefused(
          403,
          `TLS server name '${sni ?? "(none)"}' does not match CONNECT host '${host}'`,
        );
      }
      return bytes.length;
    },
    maxBytes: MAX_HELLO_BYTES,
    timeoutMs: HEAD_TIMEOUT_MS,
  }).catch((error) => {
    throw error instanceof EgressRefused
      ? error
      : new EgressFailed(400, `No TLS ClientHello: ${error.message}`);
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
        new EgressFailed(
          504,
          `No connection to '${address}:${port}' within ${CONNECT_TIMEOUT_MS} ms`,
        ),
      );
    }, CONNECT_TIMEOUT_MS);
    socket.once("connect", () => {
      clearTimeout(timer);
      resolve(socket);
    });
    socket.once("error", (error) => {
      clearTimeout(timer);
      reject(new EgressFailed(502, `Cannot connect to '${address}:${port}': ${error.message}`));
    });
  });
}

// TLS terminated with a waffle-CA leaf: one request per connection, sent
// on in origin form when it names the tunnel's authority (else refused
// inside the tunnel), its placeholders replaced, over TLS verified for the
// host's name.
async function terminate(
  client: Socket,
  hello: Buffer,
  options: {
    target: Authority;
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
  const { routed, framing } = await routeInside(secure, { head, tunnel: target });
  // The authority the request names, by RFC 9112's rules: the tunnel's.
  const { head: injected, injected: names } = injectSecrets(
    upstreamHead(routed.head, routed.head.target),
    { authority: routed.authority, secrets: context.policy.secrets },
  );
  const upstream = await dialTls(address, target, context.roots);
  present(secure as unknown as Socket, upstream);
  const sent = serializeHead(names.length > 0 ? withoutRoutingHeaders(injected) : injected);
  upstream.write(sent);
  const body = bodyTracker(framing);
  const first = rest.subarray(0, body.take(rest));
  // Deno's node:tls fails a zero-length write (EPERM), which left the
  // connection open until the idle timeout: a request without a body.
  if (first.length > 0) upstream.write(first);
  counters.up(sent.length + first.length);
  await splice(secure as unknown as Socket, upstream as unknown as Socket, {
    buckets: context.buckets,
    counters,
    body,
  });
  return names;
}

// The request inside a tunnel, checked against the tunnel's authority; a
// refusal is answered inside the tunnel (the client reads it over TLS),
// with at most a second for it to leave before the connection closes.
async function routeInside(
  secure: tls.TLSSocket,
  request: { head: RequestHead; tunnel: Authority },
): Promise<{ routed: RoutedRequest; framing: BodyFraming }> {
  try {
    const routed = tunnelRequest(request.head, request.tunnel);
    return { routed, framing: checkedFraming(routed.head) };
  } catch (error) {
    if (error instanceof EgressRefused) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 1000);
        secure.end(refusalResponse(error), () => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    throw error;
  }
}

// Headers some origins and their front proxies route by instead of the
// target and Host: a request carrying a secret goes where the proxy checked.
const ROUTING_HEADERS = new Set([
  "forwarded",
  "x-forwarded-host",
  "x-original-url",
  "x-rewrite-url",
  "x-host",
]);

function withoutRoutingHeaders(head: RequestHead): RequestHead {
  return {
    ...head,
    headers: head.headers.filter(([name]) => !ROUTING_HEADERS.has(name.toLowerCase())),
  };
}

// TLS to the upstream, verified against the roots for the tunnel's host.
function dialTls(address: string, target: Authority, roots: string[]): Promise<tls.TLSSocket> {
  return new Promise<tls.TLSSocket>((resolve, reject) => {
    const socket = tls.connect({
      host: address,
      port: target.port,
      servername: isIpLiteral(target.host) ? undefined : target.host,
      ca: roots,
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
}

// The upstream, once the client is known to be still there; else both go.
function present<T extends { destroy(): void }>(client: Socket, upstream: T): T {
  if (!client.destroyed) return upstream;
  upstream.destroy();
  throw new EgressFailed(499, "The client left while the upstream was connected");
}

// Both ways until both sides closed, each direction held to its bucket; an
// error or a long silence on either side ends both.
function splice(
  client: Socket,
  upstream: Socket,
  options: {
    buckets: { up: ByteBucket; down: ByteBucket };
    counters: { up: (n: number) => void; down: (n: number) => void };
    /** The one message's body toward the upstream; what follows its end is dropped. */
    body: BodyTracker | undefined;
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
    pump(client, upstream, {
      bucket: options.buckets.up,
      count: options.counters.up,
      body: options.body,
      fail,
    });
    pump(upstream, client, { bucket: options.buckets.down, count: options.counters.down });
  });
}

function pump(
  from: Socket,
  to: Socket,
  options: {
    bucket: ByteBucket;
    count: (n: number) => void;
    body?: BodyTracker | undefined;
    fail?: () => void;
  },
): void {
  from.on("data", (all: Buffer) => {
    let chunk = all;
    if (options.body !== undefined) {
      try {
        chunk = all.subarray(0, options.body.ended() ? 0 : options.body.take(all));
      } catch {
        return options.fail?.(); // a malformed chunked body: nothing more of it goes on
      }
      if (chunk.length === 0) return;
    }
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
