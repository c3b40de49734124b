/**
 * Controlled egress: sandboxes and restricted MCP servers stay network-less
 * and reach only named destinations through waffle's egress proxy, which
 * injects secrets the sandbox sees only as placeholders: the proxy and its
 * container, each identity's policy file, the CA, audit and status. What an
 * identity may reach is the config's (`lib/config/egress_*.ts`).
 *
 * @module
 */
export * from "./audit.ts";
export * from "./ca.ts";
export * from "./counts.ts";
export * from "./policy_file.ts";
export * from "./policy_writer.ts";
export * from "./proxy.ts";
export * from "./proxy_container.ts";
export * from "./status.ts";
export * from "./supervisor.ts";
