/**
 * waffle's library: hand tool executions to a sandboxed runner and get the
 * exact result back.
 *
 * @example
 * ```ts ignore
 * import { openHostBackend } from "./lib/mod.ts";
 * const backend = openHostBackend("/tmp/q");
 * await backend.ensure();
 * const id = await backend.queue.submit({ argv: ["echo", "hi"] });
 * const { result, stdout } = await backend.queue.collect(id);
 * ```
 *
 * @module
 */
export * from "./errors.ts";
export * from "./exit_codes.ts";
export * from "./queue/mod.ts";
export { type HostBackendOptions, openHostBackend, runnerAlive } from "./host_backend.ts";
export {
  type EnsureAction,
  type Ensured,
  type ForkedSandbox,
  type ForkOptions,
  type ForkResult,
  forkSandbox,
  type ForkSource,
  type ForkTarget,
  listSandboxes,
  type ListSandboxesOptions,
  listSnapshots,
  type NetworkStats,
  type PauseOptions,
  pauseSandbox,
  removeSnapshot,
  type RestoredSnapshot,
  restoreSnapshot,
  type RestoreSnapshotOptions,
  resumeSandbox,
  type SandboxConfig,
  type SandboxKey,
  type SandboxStats,
  sandboxStats,
  type SandboxStatsOptions,
  type SandboxStatus,
  saveSnapshot,
  type SaveSnapshotOptions,
  settleRemovals,
  type SnapshotInfo,
  type StatePaths,
  stopSandbox,
  sweep,
  type SweepAction,
  type SweepOptions,
  type VolumeStatus,
} from "./lifecycle/mod.ts";
export { openSandbox, removeSandbox, type Sandbox, type SandboxOptions } from "./sandbox/mod.ts";
export {
  drainPool,
  fillPool,
  type FillReport,
  keepPools,
  type PoolKeeper,
  type PoolTarget,
} from "./sandbox/mod.ts";
export {
  launchable,
  type LaunchPlan,
  openHostServer,
  openSandboxServer,
  planLaunch,
  type PlannedServer,
  probeServer,
  relay,
  resolveEnv,
  type ServerConnection,
} from "./mcp/mod.ts";
export {
  attachIn,
  type ProcessOptions,
  type ProcessStatus,
  type RunBytesOptions,
  type RunBytesResult,
  runIn,
  type RunOptions,
  type RunResult,
  type SandboxProcess,
  type SandboxProcesses,
  spawnIn,
  type SpawnOptions,
} from "./lifecycle/run.ts";
export {
  type FileEntry,
  listFiles,
  readFile,
  removeFile,
  type SandboxFiles,
  sandboxFiles,
  writeFile,
} from "./files/mod.ts";
export { loadConfig, loadWaffleConfig, type WaffleConfig } from "./config/config.ts";
/** The Engine API client the fleet functions take; its types live in `lib/docker/mod.ts`. */
export { DockerClient } from "./docker/mod.ts";
