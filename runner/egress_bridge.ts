/**
 * The sandbox's one way out: a listener on the container's own loopback
 * (`HTTP(S)_PROXY` points at it) that carries each connection to the
 * egress proxy's Unix socket, which waffle mounted read-only. The container
 * has no network, so a client that ignores the proxy variables has no route
 * at all, and while the proxy is down every connection is refused.
 *
 * @module
 */
import { SANDBOX_PROXY_PORT } from "../lib/config/egress_paths.ts";
import { settlesWithin } from "../lib/async.ts";

/** Most connections bridged at once; more are closed at once. */
const MAX_BRIDGED = 1024;
/** How long one direction may go on after the other ended. */
const LINGER_MS = 5000;

/**
 * Bridges the loopback proxy port to the socket until the signal aborts.
 *
 * @param socket The proxy's socket inside the container.
 * @param options `signal` stops it; `port` overrides the loopback port.
 * @returns When the listener is open (it serves in the background).
 */
export function startEgressBridge(
  socket: string,
  options: { signal: AbortSignal; port?: number },
): void {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: options.port ?? SANDBOX_PROXY_PORT });
  options.signal.addEventListener("abort", () => listener.close(), { once: true });
  let open = 0;
  void (async () => {
    try {
      for await (const client of listener) {
        if (open >= MAX_BRIDGED) {
          client.close();
          continue;
        }
        open++;
        // No Nagle: a TLS handshake's small writes must not wait for delayed ACKs.
        client.setNoDelay(true);
        void bridge(client, socket).finally(() => open--);
      }
    } catch {
      // closed
    }
  })();
}

async function bridge(client: Deno.Conn, socket: string): Promise<void> {
  let upstream: Deno.UnixConn;
  try {
    upstream = await Deno.connect({ transport: "unix", path: socket });
  } catch {
    // Fail closed: the proxy is down or the sandbox's socket is gone.
    client.close();
    return;
  }
  const close = (conn: Deno.Conn): void => {
    try {
      conn.close();
    } catch {
      // already closed
    }
  };
  const up = client.readable.pipeTo(upstream.writable, { preventClose: true })
    .finally(() => upstream.closeWrite().catch(() => {}));
  const down = upstream.readable.pipeTo(client.writable, { preventClose: true })
    .finally(() => client.closeWrite().catch(() => {}));
  // Once either way ends, the other has a moment to finish: a peer that
  // keeps its half open and silent holds no descriptor for long.
  await Promise.race([up, down]).catch(() => {});
  await settlesWithin(Promise.allSettled([up, down]), LINGER_MS);
  close(client);
  close(upstream);
}
