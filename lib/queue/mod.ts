/**
 * The sandbox queue: a durable, exactly-once host↔runner channel over two
 * SQLite files. See `docs/queue_protocol.md`.
 *
 * @module
 */
export {
  BUSY_TIMEOUT_MS,
  isBusyError,
  openDatabase,
  type OpenOptions,
  type Role,
  transaction,
} from "./connection.ts";
export { GroupCommit } from "./group_commit.ts";
export * from "./protocol.ts";
export {
  type Collected,
  collectOutput,
  LOCK_WAIT_MS,
  Queue,
  type QueueOpenOptions,
  type SubmitOptions,
  type WaitOptions,
} from "./queue.ts";
export {
  judgeRunner,
  type JudgeRunnerOptions,
  type Liveness,
  type ObservedBeat,
  readHeartbeatFile,
  type RunnerTrouble,
  STALE_AFTER_MS,
} from "./liveness.ts";
export {
  MAX_OUTBOUND_BYTES,
  OPEN_REQUEST,
  openRequestCount,
  outboundAllowance,
  submittedAndOpen,
} from "./open_requests.ts";
export { HEARTBEAT_FILE_BYTES, writeHeartbeatFile } from "./heartbeat_file.ts";
export { lastUse, markUse } from "./use_mark.ts";
export {
  hasSchema,
  SandboxFile,
  type SandboxFileOptions,
  SMALL_FILE_BYTES,
} from "./sandbox_file.ts";
export {
  type InboundRequest,
  type Recovery,
  RunnerQueue,
  setAsideUnlessRegular,
} from "./runner_queue.ts";
export {
  QueueSession,
  SESSION_IDLE_MS,
  SESSION_LEASE_MS,
  type SessionOptions,
  type SessionTarget,
} from "./session.ts";
export { initQueue, type InitQueueOptions, type QueuePaths, queuePaths } from "./schema.ts";
export { ChangeWatcher } from "./watch.ts";
export type { Backend } from "./backend.ts";
