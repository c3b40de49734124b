/**
 * waffle's HTTP listeners: one owner for every server waffle runs (`waffle
 * mcp serve` now): its accept loop with connection caps (in all and per
 * peer), the deadlines of requests and kept-alive connections, and a
 * web handler (`Request` in, `Response` out) behind them. Node's HTTP
 * modules load only when a server starts.
 *
 * @module
 */
export {
  type HttpHandler,
  type HttpRequestInfo,
  type HttpServer,
  serveHttp,
  type ServeHttpOptions,
} from "./server.ts";
export {
  DEFAULT_HEADER_TIMEOUT_MS,
  DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
  DEFAULT_MAX_CONNECTIONS,
  DEFAULT_MAX_CONNECTIONS_PER_PEER,
  DEFAULT_MAX_HEADER_BYTES,
  DEFAULT_REQUEST_TIMEOUT_MS,
  type HttpLimits,
  MAX_TIMEOUT_MS,
  openFileLimit,
  resolveHttpLimits,
} from "./limits.ts";
export { acceptConnections, type AcceptLoop, type AcceptLoopOptions } from "./accept_loop.ts";
export { peerOf } from "./peer.ts";
