/**
 * Per-user persistent sandbox containers: identity, posture, state, ensure,
 * and the fleet operations (ps, sweep, stop, pause, resume). Opening a sandbox and removing
 * one compose these with egress: `lib/sandbox/`.
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
  unusableState,
} from "./ensure.ts";
export { type ContainerHome, containerHome, homeMatcher } from "./container_home.ts";
export { stateLayout, type StatePaths, statePaths } from "./identity.ts";
export { type SandboxKey, sandboxKey } from "../config/sandbox_key.ts";
export { tryLock, withLock } from "./lock.ts";
export {
  dropMarker,
  listPools,
  markReady,
  memberKey,
  type PoolBinding,
  type PoolMember,
  type PoolStatus,
  readBinding,
  readyMembers,
  resolveTaken,
  servingRecord,
  takeMember,
  type TakenMember,
} from "./pool.ts";
export {
  bind,
  type ContainerSpec,
  containerSpec,
  LABELS,
  postureDrift,
  RUNNER_CAPS,
  SANDBOX_UID,
} from "./posture.ts";
export {
  DEFAULT_QUOTA_BYTES,
  ensureVolume,
  quotaSupport,
  removeVolume,
  type VolumeStatus,
} from "./quota.ts";
export {
  inspectState,
  prepareState,
  type PrepareStateOptions,
  purgeState,
  resetOutbound,
  stateExists,
  type StateReport,
} from "./state_dir.ts";
export { removeTree, type RemoveTreeOptions, settleRemovals } from "./remove_tree.ts";
export {
  listSandboxes,
  type ListSandboxesOptions,
  type SandboxStatus,
  stopSandbox,
  sweep,
  type SweepAction,
  type SweepOptions,
} from "./fleet.ts";
export {
  captureImage,
  type ForkedSandbox,
  type ForkOptions,
  type ForkResult,
  forkSandbox,
  type ForkSource,
  type ForkTarget,
  MAX_FORK_TARGETS,
  sandboxExists,
  sandboxFromImage,
} from "./fork.ts";
export { type PauseOptions, pauseSandbox, resumeSandbox } from "./pause.ts";
export { clearPause, type PauseRecord, readPause } from "./pause_record.ts";
export {
  listSnapshots,
  removeSnapshot,
  type RestoredSnapshot,
  restoreSnapshot,
  type RestoreSnapshotOptions,
  saveSnapshot,
  type SaveSnapshotOptions,
  type SnapshotInfo,
} from "./snapshot.ts";
export {
  type NetworkStats,
  type SandboxStats,
  sandboxStats,
  type SandboxStatsOptions,
} from "./stats.ts";
export { CgroupReadError, type CgroupReading, findCgroup, readCgroup } from "./cgroup.ts";
export { initMark, readWarm, recordedPid, stillWarm, type WarmRecord, writeWarm } from "./warm.ts";
