/**
 * waffle's configuration: `waffle.toml` with its `[sandbox]` settings and
 * MCP policy, layered under `WAFFLE_*` variables and CLI flags, and where
 * the file is looked for.
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
export * from "./egress_entries.ts";
export * from "./egress_paths.ts";
export * from "./egress_types.ts";
export * from "./package_pin.ts";
export * from "./sandbox_key.ts";
export * from "./subject.ts";
