/**
 * Controlled egress: sandboxes and restricted MCP servers stay network-less
 * and reach only named destinations through waffle's egress proxy, which
 * injects secrets the sandbox sees only as placeholders. The entries and
 * addresses of its lists, the config's egress policy and the shared types.
 *
 * @module
 */
export * from "./entries.ts";
export * from "./policy.ts";
export * from "./types.ts";
