/**
 * The schema of the two queue files and the layout of a queue directory.
 *
 * @module
 */
import { join } from "node:path";
import { QueueError } from "../errors.ts";
import { messageOf, openDatabase } from "./connection.ts";

/** `inbound.db`: written only by the host. */
export const INBOUND_SCHEMA = `
CREATE TABLE requests (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  tool_use_id TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  payload TEXT NOT NULL,
  -- Relative run-time limit: host and sandbox clocks may differ (Docker Desktop's VM).
  timeout_ms INTEGER,
  created_at INTEGER NOT NULL
);
CREATE TABLE cancels (request_id TEXT PRIMARY KEY, created_at INTEGER NOT NULL);
CREATE TABLE acks (request_id TEXT PRIMARY KEY, created_at INTEGER NOT NULL);
`;

/** `outbound.db`: written only by the runner. */
export const OUTBOUND_SCHEMA = `
CREATE TABLE heartbeat (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  runner_id TEXT NOT NULL,
  boot_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  time INTEGER NOT NULL,
  state TEXT NOT NULL,
  idle_since INTEGER
);
CREATE TABLE states (
  request_id TEXT PRIMARY KEY,
  state TEXT NOT NULL,
  boot_id TEXT NOT NULL,
  accepted_at INTEGER NOT NULL,
  started_at INTEGER
);
CREATE TABLE chunks (
  request_id TEXT NOT NULL,
  stream TEXT NOT NULL,
  seq INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (request_id, stream, seq)
);
CREATE TABLE results (
  request_id TEXT PRIMARY KEY,
  body TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
`;

/** Paths of the files inside one queue directory. */
export interface QueuePaths {
  /** The queue directory. */
  dir: string;
  /** `inbound.db`, written only by the host. */
  inbound: string;
  /** `outbound.db`, written only by the runner. */
  outbound: string;
  /** Held (flock) by the live runner so two runners never serve one queue. */
  runnerLock: string;
  /** Rung by the host after each inbound commit; watched by the runner. */
  inboundBell: string;
  /** Rung by the runner after each outbound commit; watched by the host. */
  outboundBell: string;
}

/**
 * The file paths of a queue directory.
 *
 * @param dir The queue directory.
 * @returns Its file paths.
 */
export function queuePaths(dir: string): QueuePaths {
  return {
    dir,
    inbound: join(dir, "inbound.db"),
    outbound: join(dir, "outbound.db"),
    runnerLock: join(dir, "runner.lock"),
    inboundBell: join(dir, "inbound.bell"),
    outboundBell: join(dir, "outbound.bell"),
  };
}

/** Options for {@linkcode initQueue}. */
export interface InitQueueOptions {
  /**
   * Share the directory with a sandbox running under another uid: the
   * directory becomes root-style `/tmp` (mode 1777) and the files 0666. With
   * the kernel's `fs.protected_symlinks` (on by default), a symlink the
   * sandbox plants there is never followed by the host, and the sticky bit
   * keeps the sandbox from deleting or replacing the host's files. This
   * matters because SQLite opens `<db>-journal` by name: a planted symlink
   * would otherwise let the sandbox make the host truncate any host file.
   */
  shared?: boolean;
}

/**
 * Creates a queue directory with both files (schema included) and the runner
 * lock file. Idempotent: existing files are checked, not replaced.
 *
 * @param dir The queue directory; its parent must exist.
 * @param options Whether the directory is shared with a sandbox uid.
 * @returns The queue's paths.
 * @throws {QueueError} When the directory or a file cannot be created or has another schema.
 */
export function initQueue(dir: string, options: InitQueueOptions = {}): QueuePaths {
  const paths = queuePaths(dir);
  try {
    Deno.mkdirSync(dir, { recursive: true, mode: 0o755 });
    if (options.shared) Deno.chmodSync(dir, 0o1777);
  } catch (cause) {
    throw new QueueError(`Cannot create queue directory '${dir}': ${messageOf(cause)}`, { cause });
  }
  openDatabase(paths.inbound, { role: "owner", schema: INBOUND_SCHEMA }).close();
  openDatabase(paths.outbound, { role: "owner", schema: OUTBOUND_SCHEMA }).close();
  try {
    for (const path of [paths.runnerLock, paths.inboundBell, paths.outboundBell]) {
      Deno.writeFileSync(path, new Uint8Array(), { append: true, create: true });
    }
    if (options.shared) {
      // Journals too: SQLite creates them with the mode the database file had then.
      const files = [
        paths.inbound,
        paths.outbound,
        `${paths.inbound}-journal`,
        `${paths.outbound}-journal`,
      ];
      for (const path of [...files, paths.runnerLock, paths.inboundBell, paths.outboundBell]) {
        try {
          Deno.chmodSync(path, 0o666);
        } catch (error) {
          if (!(error instanceof Deno.errors.NotFound)) throw error;
        }
      }
    }
  } catch (cause) {
    throw new QueueError(`Cannot prepare queue files in '${dir}': ${messageOf(cause)}`, { cause });
  }
  return paths;
}
