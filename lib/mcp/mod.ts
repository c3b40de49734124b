/**
 * MCP servers under waffle's policy: the launch plan, where each server
 * runs (host process, the user's sandbox, a restricted container), the
 * relay that enforces the tools and client-requests allowlists and writes
 * the audit log, and the host's npm package cache.
 *
 * @module
 */
export * from "./audit.ts";
export * from "./connection.ts";
export * from "./host_server.ts";
export * from "./jsonrpc.ts";
export * from "./package_cache.ts";
export * from "./plan.ts";
export * from "./policy.ts";
export * from "./probe.ts";
export * from "./relay.ts";
export * from "./sandbox_server.ts";
export * from "./server_request_gate.ts";
