/**
 * Serves Connect RPCs from `Deno.serve`: the protocol of E2B's envd API
 * (`/process.Process/Start`, `/filesystem.Filesystem/Stat`…), on
 * connect-es's own router and protocol code, so the envelopes, JSON, error
 * bodies and `Connect-Timeout-Ms` are the library's, not ours.
 *
 * Only the Connect protocol is served (gRPC and gRPC-web are off), in JSON
 * and binary. Unary calls answer `application/json` (errors as
 * `{"code":"not_found","message":…}` with the matching HTTP status); server
 * streams answer `application/connect+json`, each message written to the
 * response as it is produced, and end with the end-stream envelope (an error
 * goes there). Handlers read the deadline with `context.timeoutMs()`; the
 * `context.signal` aborts at the deadline, when the client goes away and on
 * `shutdownSignal`.
 *
 * @module
 */
import {
  Code,
  ConnectError,
  type ConnectRouter,
  createConnectRouter,
  type Interceptor,
} from "@connectrpc/connect";
import {
  type UniversalHandler,
  type UniversalServerRequest,
  universalServerResponseToFetch,
} from "@connectrpc/connect/protocol";

/** The default cap on a request body, in bytes (16 MiB). */
export const DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024;

// connect-es's own ceiling for a message size (readMaxBytes).
const MAX_BODY_BYTES_LIMIT = 0xffff_ffff;

/** Options of {@linkcode connectHandler}. */
export interface ConnectHandlerOptions {
  /**
   * The most bytes a request body may have: a unary request's message, or all
   * the envelopes of a streamed request together. A larger body ends the call
   * with `resource_exhausted` and is not read further. Default
   * {@linkcode DEFAULT_MAX_BODY_BYTES}.
   */
  maxBodyBytes?: number;
  /**
   * The largest `Connect-Timeout-Ms` a client may ask for; a larger one is
   * refused with `invalid_argument`. Default: no limit.
   */
  maxTimeoutMs?: number;
  /** Aborting it aborts every call's `context.signal` (server shutdown). */
  shutdownSignal?: AbortSignal;
  /** connect-es interceptors, run around every call in order. */
  interceptors?: Interceptor[];
}

/**
 * A `Deno.serve` handler for Connect routes: the response, or `undefined` when
 * no registered RPC has the request's path (the caller serves it otherwise).
 */
export type ConnectFetchHandler = (request: Request) => Promise<Response | undefined>;

/**
 * Makes a fetch-style handler for the Connect RPCs that `routes` registers.
 *
 * @param routes Registers the services: `router.service(Process, impl)`.
 * @param options Body cap, deadline limit, shutdown signal, interceptors.
 * @returns A handler answering the registered paths, `undefined` for others.
 * @throws {RangeError} When `maxBodyBytes` or `maxTimeoutMs` is not a positive
 * integer (`maxBodyBytes` at most 4 GiB - 1), or a path is registered twice.
 * @example
 * ```ts ignore
 * import { connectHandler } from "./connect.ts";
 * import { Process } from "./gen/process/process_pb.ts";
 *
 * const connect = connectHandler((router) => router.service(Process, processImpl));
 * Deno.serve(async (request) =>
 *   await connect(request) ?? new Response("Not found", { status: 404 })
 * );
 * ```
 */
export function connectHandler(
  routes: (router: ConnectRouter) => void,
  options: ConnectHandlerOptions = {},
): ConnectFetchHandler {
  const maxBodyBytes = checkedCount(
    "maxBodyBytes",
    options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES,
    MAX_BODY_BYTES_LIMIT,
  );
  const router = createConnectRouter({
    connect: true,
    grpc: false,
    grpcWeb: false,
    readMaxBytes: maxBodyBytes,
    interceptors: options.interceptors ?? [],
    ...(options.maxTimeoutMs === undefined ? {} : {
      maxTimeoutMs: checkedCount("maxTimeoutMs", options.maxTimeoutMs, Number.MAX_SAFE_INTEGER),
    }),
    ...(options.shutdownSignal === undefined ? {} : { shutdownSignal: options.shutdownSignal }),
  });
  routes(router);
  const byPath = routeTable(router.handlers);
  return async (request) => {
    const handler = byPath.get(new URL(request.url).pathname);
    if (handler === undefined) return undefined;
    const response = await handler(serverRequest(request, maxBodyBytes));
    return universalServerResponseToFetch(response);
  };
}

function routeTable(handlers: readonly UniversalHandler[]): Map<string, UniversalHandler> {
  const byPath = new Map<string, UniversalHandler>();
  for (const handler of handlers) {
    if (byPath.has(handler.requestPath)) {
      throw new RangeError(`Connect route '${handler.requestPath}' is registered twice`);
    }
    byPath.set(handler.requestPath, handler);
  }
  return byPath;
}

// Like connect-es's universalServerRequestFromFetch, but its body counts the
// bytes against the cap and cancels the upload when the call stops reading
// (the library's adapter leaves an abandoned body unread).
function serverRequest(request: Request, maxBodyBytes: number): UniversalServerRequest {
  return {
    httpVersion: "",
    method: request.method,
    url: request.url,
    header: request.headers,
    body: cappedBody(request.body, maxBodyBytes),
    signal: request.signal,
  };
}

function cappedBody(
  body: ReadableStream<Uint8Array> | null,
  maxBytes: number,
): AsyncIterable<Uint8Array> {
  return {
    async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array> {
      if (body === null) return;
      const reader = body.getReader();
      let total = 0;
      let done = false;
      try {
        for (;;) {
          const chunk = await reader.read();
          if (chunk.done) {
            done = true;
            return;
          }
          total += chunk.value.byteLength;
          if (total > maxBytes) {
            throw new ConnectError(
              `Request body exceeds the limit of ${maxBytes} bytes`,
              Code.ResourceExhausted,
            );
          }
          yield chunk.value;
        }
      } finally {
        if (!done) await reader.cancel().catch(() => {});
      }
    },
  };
}

function checkedCount(name: string, value: number, max: number): number {
  if (!Number.isSafeInteger(value) || value < 1 || value > max) {
    throw new RangeError(
      `Cannot serve Connect as '${name}' must be an integer from 1 to ${max}: current value is ${value}`,
    );
  }
  return value;
}
