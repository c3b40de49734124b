/**
 * Per-user persistent sandbox containers: identity, posture, state, ensure,
 * and the fleet operations (ps, sweep, stop, rm).
 *
 * @module
 */
export { ensureContainer, type Ensured, incompatibility, resolveImage } from "./ensure.ts";
export { sandboxKey, type SandboxKey, type StatePaths, statePaths } from "./identity.ts";
export { withLock } from "./lock.ts";
export { bind, containerSpec, type ContainerSpec, LABELS, SANDBOX_UID } from "./posture.ts";
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
