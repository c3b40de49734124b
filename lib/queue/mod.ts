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
  type Liveness,
  LOCK_WAIT_MS,
  MAX_OUTBOUND_BYTES,
  Queue,
  type QueueOpenOptions,
  type RunnerTrouble,
  STALE_AFTER_MS,
  type SubmitOptions,
  submittedAndOpen,
  type WaitOptions,
} from "./queue.ts";
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
