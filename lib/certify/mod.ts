/**
 * Certification of an installation: the real container-runner stress, the
 * kill-mid-write integrity check and the fork bomb, run against the user's
 * own Docker daemon and image by `waffle doctor --deep`, and by the test
 * suite's live tests through the same functions. Every check returns typed
 * figures and a pass/fail with the failing mode; the evidence header and
 * verdict record the installation they ran on.
 *
 * @example
 * ```ts ignore
 * import { certify, formatReport } from "./lib/certify/mod.ts";
 * const report = await certify({ seconds: 30, volume: true });
 * console.log(formatReport(report));
 * ```
 *
 * @module
 */
export { certify, type CertifyOptions } from "./certify.ts";
export {
  type AnyCheck,
  checkLabel,
  type CheckResult,
  type CheckStatus,
  type Failure,
  type FailureMode,
  type QueueMount,
} from "./check.ts";
export { CERTIFY_LABEL, Cleanup, type CleanupReport } from "./cleanup.ts";
export {
  type CertifyReport,
  type EvidenceHeader,
  FAILURE_MODE_NAMES,
  formatReport,
  type Verdict,
  verdictOf,
  type VerdictStatus,
} from "./evidence.ts";
export {
  FORK_BOMB_PIDS_LIMIT,
  type ForkBombCheck,
  forkBombCheck,
  type ForkBombFigures,
  type PidsPeak,
} from "./fork_bomb.ts";
export {
  HeartbeatObserver,
  type HeartbeatStats,
  MAX_HEARTBEAT_GAP_MS,
} from "./heartbeat_observer.ts";
export {
  integrityCheck,
  integrityOfQueue,
  type QueueCounts,
  queueCounts,
  type QueueIntegrity,
  recoveredIntegrity,
} from "./integrity.ts";
export {
  type KillCheck,
  killCheck,
  type KillFigures,
  type RunnerThread,
  runnerThread,
  waitForCommandExit,
} from "./kill_check.ts";
export { type ExclusiveLock, holdExclusiveLock, lockExclusive } from "./lock_holder.ts";
export {
  describeMount,
  hostMountOf,
  type MountEntry,
  type QueueMountFacts,
  queueMountFacts,
} from "./mounts.ts";
export { findPidsCgroup, type PidsCgroup, readPidsCgroup } from "./pids_cgroup.ts";
export { CERTIFY_TENANT, openBindRig, type QueueRig, rigSandbox, sandboxRig } from "./rig.ts";
export {
  DEFAULT_STRESS_SECONDS,
  STRESS_SUBMITTERS,
  type StressCheck,
  stressCheck,
  type StressFigures,
  type StressOptions,
} from "./stress.ts";
export {
  newSummary,
  stressLoop,
  type StressRequest,
  stressRequest,
  type StressSummary,
} from "./stress_loop.ts";
export { openVolumeRig, type VolumeRigOutcome } from "./volume.ts";
