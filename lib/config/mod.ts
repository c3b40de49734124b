/**
 * waffle's configuration: `waffle.toml` with its `[sandbox]` settings and
 * MCP policy, layered under `WAFFLE_*` variables and CLI flags.
 *
 * @module
 */
export {
  defaultHome,
  loadConfig,
  type LoadOptions,
  loadWaffleConfig,
  SANDBOX_KEYS,
  type SandboxConfig,
  sandboxToml,
  type WaffleConfig,
} from "./config.ts";
