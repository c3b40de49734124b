/**
 * Per-user persistent sandbox containers: identity, posture, state, ensure,
 * and the fleet operations (ps, sweep, stop, rm).
 *
 * @module
 */
export type { SandboxConfig } from "../config/config.ts";
export {
  type EnsureAction,
  ensureContainer,
  type Ensured,
  type EnsureOptions,
  incompatibility,
  resolveImage,
} from "./ensure.ts";
export { type SandboxKey, sandboxKey, type StatePaths, statePaths } from "./identity.ts";
export { withLock } from "./lock.ts";
export { bind, type ContainerSpec, containerSpec, LABELS, SANDBOX_UID } from "./posture.ts";
export { openSandbox, type Sandbox, type SandboxOptions } from "./sandbox.ts";
export { prepareState, stateExists } from "./state_dir.ts";
export {
  listSandboxes,
  removeSandbox,
  type SandboxStatus,
  stopSandbox,
  sweep,
  type SweepAction,
  type SweepOptions,
} from "./fleet.ts";
