/**
 * A loopback HTTP proxy that adds `Authorization: Bearer <token>` to every
 * request it forwards, streaming responses (SSE included) back as they come.
 * The official conformance suite connects by URL and sends no headers of its
 * own; this stands in for an MCP client that holds waffle's token.
 *
 * @module
 */

/** A running proxy. */
export interface BearerProxy {
  /** The proxy's URL for the upstream's path (`http://127.0.0.1:PORT/mcp`). */
  url: string;
  /** Stops it. */
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Starts a proxy on a free loopback port in front of `upstream`.
 *
 * @param upstream The upstream URL (`http://127.0.0.1:PORT/mcp`).
 * @param token The bearer token to add.
 * @returns The proxy.
 */
export function bearerProxy(upstream: string, token: string): BearerProxy {
  const target = new URL(upstream);
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    async (request) => {
      const url = new URL(request.url);
      url.protocol = target.protocol;
      url.host = target.host;
      const headers = new Headers(request.headers);
      headers.set("authorization", `Bearer ${token}`);
      headers.delete("host");
      const body = request.body === null ? null : await request.arrayBuffer();
      try {
        const response = await fetch(url, {
          method: request.method,
          headers,
          body,
          redirect: "manual",
        });
        return new Response(response.body, { status: response.status, headers: response.headers });
      } catch (error) {
        return new Response(`proxy: ${error}`, { status: 502 });
      }
    },
  );
  return {
    url: `http://127.0.0.1:${server.addr.port}${target.pathname}`,
    async [Symbol.asyncDispose](): Promise<void> {
      await server.shutdown();
    },
  };
}
