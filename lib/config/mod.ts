/**
 * waffle's configuration: the whole of `waffle.toml` (`[sandbox]`,
 * `[egress]`, `[mcp.*]`, `[groups.*]`, `[cron.*]`, `[users.*]`,
 * `[secrets.*]`, `[serve]`, `[templates.*]`), its schemas, cross-key checks
 * and one-line errors, layered under `WAFFLE_*` variables and CLI flags,
 * and where the file is looked for; the egress policy each identity is
 * composed to, the names and paths a sandbox's spec is made of, and the
 * settings `waffle serve` runs with.
 *
 * @module
 */
export {
  absoluteConfigPath,
  configCandidates,
  configSource,
  defaultHome,
  loadConfig,
  type LoadOptions,
  loadWaffleConfig,
  SANDBOX_KEYS,
  type SandboxConfig,
  sandboxToml,
  SYSTEM_CONFIG,
  type WaffleConfig,
} from "./config.ts";
export type { ConfigProblem } from "./toml.ts";
export * from "./egress_checks.ts";
export * from "./egress_compose.ts";
export * from "./egress_entries.ts";
export * from "./egress_launch.ts";
export * from "./egress_paths.ts";
export * from "./egress_schema.ts";
export * from "./egress_types.ts";
export * from "./mcp_policy.ts";
export * from "./mcp_schema.ts";
export * from "./mcp_types.ts";
export * from "./package_pin.ts";
export * from "./resolve.ts";
export * from "./sandbox_key.ts";
export * from "./subject.ts";
export * from "./serve_schema.ts";
