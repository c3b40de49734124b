/**
 * The schema of the two queue files and the layout of a queue directory.
 *
 * A queue directory holds two subdirectories, one per writer, so that no
 * side ever has to create, replace or remove a name in a directory the other
 * side can write:
 *
 * - `inbound/` (the host's): `inbound.db`, `inbound.bell`. Mounted read-only
 *   into the sandbox; only the runner (never a command) can read it.
 * - `outbound/` (the runner's): `outbound.db`, `outbound.bell`,
 *   `runner.lock`. The runner creates these itself; the host only ever opens
 *   `outbound.db` read-only through a checked file descriptor
 *   (`sandbox_file.ts`), never by a name SQLite derives from it.
 *
 * @module
 */
import { join } from "../path.ts";
import { QueueError } from "../errors.ts";
import { messageOf, openDatabase } from "./connection.ts";

// Added in schema version 3.
const SESSION_TABLES = `
-- A session's stdin, in order; a NULL data row ends it.
CREATE TABLE input (
  request_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  data BLOB,
  PRIMARY KEY (request_id, seq)
);
-- A session's lease (bumped by the host while it lives) and how much of each
-- stream the host has read (so the runner may drop those chunks).
CREATE TABLE sessions (
  request_id TEXT PRIMARY KEY,
  lease INTEGER NOT NULL,
  stdout_read INTEGER NOT NULL,
  stderr_read INTEGER NOT NULL
);
`;

// Added in schema version 5.
const TTY_TABLE = `
-- A terminal session's window size, as the host last set it.
CREATE TABLE tty (
  request_id TEXT PRIMARY KEY,
  rows INTEGER NOT NULL,
  cols INTEGER NOT NULL
);
`;

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
  -- The outbound generation this request may run under (NULL: whichever comes first).
  generation TEXT,
  created_at INTEGER NOT NULL
);
CREATE TABLE cancels (request_id TEXT PRIMARY KEY, created_at INTEGER NOT NULL);
CREATE TABLE acks (request_id TEXT PRIMARY KEY, created_at INTEGER NOT NULL);
CREATE TABLE lost (request_id TEXT PRIMARY KEY, created_at INTEGER NOT NULL);
CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), generation TEXT);
${SESSION_TABLES}${TTY_TABLE}`;

/**
 * What older `inbound.db` files lack, by version: upgraded in place by their
 * owner. Version 4 moved the heartbeat out of `outbound.db`; `inbound.db`
 * did not change.
 */
export const INBOUND_UPGRADES: Readonly<Record<number, string>> = {
  2: SESSION_TABLES + TTY_TABLE,
  3: TTY_TABLE,
  4: TTY_TABLE,
};

/** `outbound.db`: written only by the runner. */
export const OUTBOUND_SCHEMA = `
CREATE TABLE meta (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  generation TEXT NOT NULL,
  max_started_seq INTEGER NOT NULL
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
-- The last input row of each session the runner took for the process's
-- stdin: the host sends no more than a window beyond it.
CREATE TABLE input_read (
  request_id TEXT PRIMARY KEY,
  seq INTEGER NOT NULL
);
`;

/** Paths of the files inside one queue directory. */
export interface QueuePaths {
  /** The queue directory. */
  dir: string;
  /** The host's directory: `inbound.db` and its bell. */
  inboundDir: string;
  /** The runner's directory: `outbound.db`, its bell and the runner lock. */
  outboundDir: string;
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
  /** The runner's heartbeat, replaced every beat (see `heartbeat_file.ts`). */
  heartbeat: string;
}

/**
 * The file paths of a queue directory.
 *
 * @param dir The queue directory.
 * @param options `outboundDir`: where the runner's files live, when not `<dir>/outbound`.
 * @returns Its file paths.
 */
export function queuePaths(
  dir: string,
  options: { outboundDir?: string | undefined } = {},
): QueuePaths {
  const inboundDir = join(dir, "inbound");
  const outboundDir = options.outboundDir ?? join(dir, "outbound");
  return {
    dir,
    inboundDir,
    outboundDir,
    inbound: join(inboundDir, "inbound.db"),
    outbound: join(outboundDir, "outbound.db"),
    runnerLock: join(outboundDir, "runner.lock"),
    inboundBell: join(inboundDir, "inbound.bell"),
    outboundBell: join(outboundDir, "outbound.bell"),
    heartbeat: join(outboundDir, "heartbeat.json"),
  };
}

/** Options for {@linkcode initQueue}. */
export interface InitQueueOptions {
  /** Where the runner's directory lives, when not `<dir>/outbound`. */
  outboundDir?: string | undefined;
  /**
   * Mode of the directories (and 0640 of the files): 0o700 when the runner
   * runs as the host's uid or as root; 0o750 (plus a group the runner has)
   * when it reads `inbound/` through the group.
   */
  mode?: number | undefined;
}

/**
 * Creates the host's half of a queue directory (`inbound/` with
 * `inbound.db` and its bell) and, unless it lives elsewhere, the runner's
 * empty `outbound/`. Idempotent:
 * existing files are checked, not replaced. The runner creates its own files.
 *
 * @param dir The queue directory; its parent must exist.
 * @param options Directory mode and where the runner's directory lives.
 * @returns The queue's paths.
 * @throws {QueueError} When a directory or file cannot be created or has another schema.
 */
export function initQueue(dir: string, options: InitQueueOptions = {}): QueuePaths {
  const paths = queuePaths(dir, options);
  const mode = options.mode ?? 0o700;
  try {
    // A separate outbound directory is its owner's to create (see `prepareState`).
    const dirs = options.outboundDir === undefined ? [paths.outboundDir] : [];
    for (const path of [dir, paths.inboundDir, ...dirs]) {
      Deno.mkdirSync(path, { recursive: true, mode });
    }
    Deno.chmodSync(paths.inboundDir, mode);
  } catch (cause) {
    throw new QueueError(`Cannot create queue directory '${dir}': ${messageOf(cause)}`, { cause });
  }
  openDatabase(paths.inbound, { role: "owner", schema: INBOUND_SCHEMA, upgrades: INBOUND_UPGRADES })
    .close();
  try {
    Deno.writeFileSync(paths.inboundBell, new Uint8Array(), { append: true, create: true });
    // SQLite creates the journal with the database file's mode.
    for (const path of [paths.inbound, paths.inboundBell]) Deno.chmodSync(path, mode & 0o640);
  } catch (cause) {
    throw new QueueError(`Cannot prepare queue files in '${dir}': ${messageOf(cause)}`, { cause });
  }
  return paths;
}
