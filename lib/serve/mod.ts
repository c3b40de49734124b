/**
 * `waffle serve`: E2B's API on waffle's sandboxes. Its state (the API keys,
 * and what the server keeps of each sandbox) is one SQLite file of the
 * home; its tenants' limits come from `[serve.tenants.*]`.
 *
 * @module
 */
export { openServeDb, SERVE_MIGRATIONS, type ServeDbOptions, serveDbPath } from "./db.ts";
export {
  type CreatedKey,
  type ExportedKey,
  KEY_PATTERN,
  type KeyInfo,
  type KeyOwner,
  keysFile,
  KeyStore,
  type KeyStoreOptions,
} from "./keys.ts";
export { type Admission, streamLimiter, TenantLimits, type TenantLimitsOptions } from "./limits.ts";
export { EnvdRouter, type EnvdRouterOptions } from "./envd_router.ts";
export { type RunningServer, type ServerOptions, startServer } from "./server.ts";
export { ProcessStore, type SandboxRecord, SandboxStore } from "./state.ts";
export { type CreateRequest, newSandboxId, ServeSandboxes } from "./sandboxes.ts";
export { type AuditEntry, type Caller, ENVD_VERSION, scopeOf } from "./control.ts";
export {
  consoleApi,
  type ConsoleApiDeps,
  type ConsoleContainers,
  type ConsoleSandbox,
  MAX_COMMANDS,
} from "./console_api.ts";
export { CommandLog, type ConsoleCommand } from "./command_log.ts";
export {
  AUDIT_TAIL_BYTES,
  type EgressEntry,
  type EgressView,
  type McpEntry,
  type McpView,
} from "./audit_tail.ts";
export { type EgressGrant, narrowEgress, type Narrowing, type NetworkAsk } from "./network.ts";
export { fileSignature, sandboxPath } from "./envd_http.ts";
export { type AgentOptions, type RunningAgent, startAgent } from "./agent.ts";
export { type SandboxFleet, type SandboxView } from "./sandboxes.ts";
