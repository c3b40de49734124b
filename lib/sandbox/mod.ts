/**
 * A user's sandbox as the library opens it: the config's resolved spec
 * composed with the container's lifecycle and, only when the config attaches
 * it, the egress proxy; a restricted MCP server's session container; and
 * removing a sandbox with its state and egress identity.
 *
 * @module
 */
export { openSandbox, type Sandbox, type SandboxOptions } from "./open.ts";
export { openRestricted, type RestrictedOptions, type RestrictedSandbox } from "./restricted.ts";
export { removeSandbox } from "./remove.ts";
export {
  drainPool,
  type FillOptions,
  fillPool,
  type FillReport,
  keepPools,
  type PoolKeeper,
  type PoolTarget,
} from "./pool_fill.ts";
