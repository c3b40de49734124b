/**
 * Raw TCP clients for the HTTP listener tests: each from a chosen loopback
 * source address (127.0.0.1 and 127.0.0.2 are different peers to the
 * server), recording what the server sent and whether it closed; and a
 * slowloris flood of them, each sending half a request header a byte at a
 * time and never finishing it.
 *
 * @module
 */
import net from "node:net";
import { waitFor } from "./_helpers.ts";

/** One raw client connection. */
export interface RawClient {
  /** The source address it connected from. */
  readonly from: string;
  /** Everything the server sent so far. */
  received(): string;
  /** Whether the connection has ended (the server closed it, or it was reset). */
  closed(): boolean;
  /** Resolves once it has ended. */
  readonly ended: Promise<void>;
  /** Sends text. */
  write(text: string): void;
  /** Closes it from this side. */
  destroy(): void;
}

/**
 * Connects from `from` to `hostname:port` and resolves once connected.
 *
 * @param target Where to connect.
 * @param from The local (source) address.
 * @returns The client.
 */
export function rawClient(
  target: { hostname: string; port: number },
  from: string,
): Promise<RawClient> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: target.hostname, port: target.port, localAddress: from });
    let received = "";
    let closed = false;
    const ended = new Promise<void>((done) => socket.once("close", () => done()));
    void ended.then(() => closed = true);
    socket.setEncoding("latin1");
    socket.on("data", (data: string) => void (received += data));
    socket.on("error", () => {}); // a reset is an end like any other here
    socket.once("error", (error) => reject(error));
    socket.once("connect", () =>
      resolve({
        from,
        received: () => received,
        closed: () => closed,
        ended,
        write: (text) => void (closed || socket.write(text, "latin1")),
        destroy: () => void socket.destroy(),
      }));
  });
}

/** Options of {@linkcode slowloris}. */
export interface SlowlorisOptions {
  /** Connections in all. */
  connections: number;
  /** Source addresses, used in turn (one peer each). */
  peers: string[];
  /** One more byte of each connection's header this often. */
  everyMs: number;
  /** The start of the header; after it, one more header byte per tick, never the end. */
  head: string;
}

/** A running flood. */
export interface Slowloris {
  /** The connections made. */
  readonly clients: RawClient[];
  /** Connections that could not be made (nothing listened any more). */
  unreachable(): number;
  /** Connections the server closed without sending a byte: refused at a cap. */
  refused(): number;
  /** Connections the server answered 408 (a deadline) before closing. */
  timedOut(): number;
  /** Connections still open. */
  open(): number;
  /** Waits (at most `timeoutMs`) until the server has closed every connection. */
  allClosed(timeoutMs: number): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Opens `connections` connections, `peers` in turn as their source, in
 * small batches (a full accept queue would only delay the connects), each
 * sending `head` and then one byte per tick.
 *
 * @param target The server.
 * @param options Size, peers, pace and the header.
 * @returns The flood, once every connection is made or failed.
 */
export async function slowloris(
  target: { hostname: string; port: number },
  options: SlowlorisOptions,
): Promise<Slowloris> {
  const clients: RawClient[] = [];
  const sent = new Map<RawClient, number>();
  const tick = (): void => {
    for (const client of clients) {
      if (client.closed()) continue;
      const at = sent.get(client) ?? 0;
      client.write(at < options.head.length ? options.head[at]! : "a");
      sent.set(client, at + 1);
    }
  };
  const timer = setInterval(tick, options.everyMs);
  const dispose = (): void => {
    clearInterval(timer);
    for (const client of clients) client.destroy();
  };
  let unreachable = 0;
  for (let i = 0; i < options.connections; i += 32) {
    const batch = Array.from(
      { length: Math.min(32, options.connections - i) },
      (_, j) =>
        rawClient(target, options.peers[(i + j) % options.peers.length]!).catch(() => undefined),
    );
    for (const client of await Promise.all(batch)) {
      if (client === undefined) unreachable++;
      else clients.push(client);
    }
  }
  const count = (test: (client: RawClient) => boolean): number => clients.filter(test).length;
  return {
    clients,
    unreachable: () => unreachable,
    refused: () => count((client) => client.closed() && client.received() === ""),
    timedOut: () => count((client) => client.received().startsWith("HTTP/1.1 408")),
    open: () => count((client) => !client.closed()),
    allClosed: (timeoutMs) =>
      waitFor(() => clients.every((client) => client.closed()), {
        timeoutMs,
        what: "the server to close every slow connection",
      }),
    [Symbol.asyncDispose]: () => {
      dispose();
      return Promise.all(clients.map((client) => client.ended)).then(() => {});
    },
  };
}

/**
 * `count` loopback source addresses from 127.0.0.2 on: as many peers.
 *
 * @param count How many.
 * @returns The addresses.
 */
export function loopbackPeers(count: number): string[] {
  return Array.from({ length: count }, (_, i) => `127.0.${(i + 2) >> 8}.${(i + 2) & 255}`);
}
