/**
 * MCP servers under waffle's policy: the launch plan, where each server
 * runs (host process, the user's sandbox, a restricted container), the
 * relay that enforces the tools and client-requests allowlists and writes
 * the audit log, each server's state directories, the host's npm
 * package cache (exact versions only), and `waffle mcp serve`'s Streamable
 * HTTP side (bearer token, loopback checks, one relay per MCP session).
 *
 * @module
 */
export * from "./audit.ts";
export * from "./bearer_token.ts";
export * from "./connection.ts";
export * from "./host_server.ts";
export * from "./http_server.ts";
export * from "./http_session.ts";
export * from "./jsonrpc.ts";
export * from "./loopback.ts";
export * from "./npm_registry.ts";
export * from "./npm_version.ts";
export * from "./package_cache.ts";
export * from "./plan.ts";
export * from "./probe.ts";
export * from "./relay.ts";
export * from "./sandbox_server.ts";
export * from "./server_request_gate.ts";
export * from "./server_state.ts";
