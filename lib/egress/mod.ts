/**
 * Controlled egress: sandboxes and restricted MCP servers stay network-less
 * and reach only named destinations through waffle's egress proxy, which
 * injects secrets the sandbox sees only as placeholders: the entries and
 * addresses of its lists, the config's egress policy, what a sandbox is
 * attached with, the proxy and its container, its CA, audit and status.
 *
 * @module
 */
export * from "./audit.ts";
export * from "./ca.ts";
export * from "./policy_file.ts";
export * from "./policy_writer.ts";
export * from "./proxy.ts";
export * from "./proxy_container.ts";
export * from "./status.ts";
export * from "./supervisor.ts";
