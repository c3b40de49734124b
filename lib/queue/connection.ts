/**
 * The one place that opens SQLite connections to the queue files, sets and
 * verifies their pragmas, and checks their schema version (the host's
 * in-memory copies of `outbound.db` in `sandbox_file.ts` use the same check).
 *
 * Why TRUNCATE and not WAL: WAL needs a shared-memory index (`-shm`) that is
 * mmap-ed by every connection, which does not work across the host/VM
 * boundary of Docker Desktop and is unsafe on network-like mounts. A rollback
 * journal only needs POSIX locks and fsync. TRUNCATE (not DELETE) saves an
 * unlink and a directory fsync per commit.
 *
 * Why each side opens the other's file read-only: a read-write connection
 * rolls back any hot journal it finds, and a journal can name a super-journal
 * that SQLite then deletes: whoever can write a journal next to a file can make
 * every read-write opener delete a file of its choosing. Only the owner of a
 * directory ever opens a file in it read-write, so a hot journal is only ever
 * rolled back by the side that wrote it. The host reads `outbound.db` through
 * `sandbox_file.ts`, never through this function.
 *
 * @module
 */
import { DatabaseSync, type StatementSync } from "node:sqlite";
import { QueueError } from "../errors.ts";
import { SCHEMA_VERSION } from "./version.ts";

/** Milliseconds SQLite waits on a lock held by the other side before failing. */
export const BUSY_TIMEOUT_MS = 5000;

/** How this connection relates to the file it opens. */
export type Role = "owner" | "reader";

/** Options for {@linkcode openDatabase}. */
export interface OpenOptions {
  /** `owner` may write rows; `reader` opens the file read-only. */
  role: Role;
  /** DDL run (once) when the file has `user_version` 0; only the creator passes it. */
  schema?: string;
  /**
   * How long SQLite itself waits on a lock. Default {@linkcode BUSY_TIMEOUT_MS}.
   * Hosts pass 0 and wait asynchronously instead: a synchronous wait would
   * stop the event loop for every user the process serves.
   */
  busyTimeoutMs?: number;
  /** DDL that brings a file of an older schema version (the key) to this one; owner only. */
  upgrades?: Readonly<Record<number, string>>;
  /**
   * The schema version the file must have, stored in `user_version`. Default
   * the queue's {@linkcode SCHEMA_VERSION}; another host-only file (`waffle
   * serve`'s state) passes its own.
   */
  version?: number;
  /**
   * What an owner's commits survive: `power-loss` (default, `synchronous=FULL`)
   * or only `process-death` (`synchronous=OFF`: a commit is in the kernel's
   * page cache, not on the disk, when it returns). The second suits rows
   * about things that die with the machine anyway (a server's record of the
   * processes its sandboxes run), written on a hot path.
   */
  survives?: "power-loss" | "process-death";
}

/**
 * Opens one queue file: sets `busy_timeout` (and, for an owner,
 * `journal_mode=TRUNCATE` and `synchronous=FULL`, or `OFF` as `survives`
 * says), checks that each took
 * effect, creates or upgrades the schema where the options allow, and
 * checks the schema version.
 *
 * @param path The database file. It must exist unless `options.schema` is given.
 * @param options Role and (for the creator) the schema.
 * @returns The open connection.
 * @throws {QueueError} When the file is missing, is not a database, refuses a pragma or has another schema version.
 */
export function openDatabase(path: string, options: OpenOptions): DatabaseSync {
  refuseSymlink(path, options.schema !== undefined);
  const readOnly = options.role === "reader";
  const busyTimeout = options.busyTimeoutMs ?? BUSY_TIMEOUT_MS;
  let db: DatabaseSync;
  try {
    db = new DatabaseSync(path, { open: true, readOnly });
  } catch (cause) {
    throw new QueueError(`Cannot open queue file '${path}': ${messageOf(cause)}`, { cause });
  }
  try {
    setBusyTimeout(db, busyTimeout);
    if (!readOnly) {
      expectPragma(db, path, "journal_mode", "TRUNCATE", "truncate");
      if (options.survives === "process-death") expectPragma(db, path, "synchronous", "OFF", 0);
      else expectPragma(db, path, "synchronous", "FULL", 2);
    }
    const busy = readPragma(db, "busy_timeout");
    if (Number(busy) !== busyTimeout) {
      throw new QueueError(`Queue file '${path}' refused busy_timeout: got '${busy}'`);
    }
    const version = userVersion(db);
    const wanted = options.version ?? SCHEMA_VERSION;
    const upgrade = readOnly ? undefined : options.upgrades?.[version];
    if ((version === 0 && options.schema !== undefined) || upgrade !== undefined) {
      migrate(db, { from: version, to: wanted }, version === 0 ? options.schema! : upgrade!);
    }
    const problem = schemaVersionProblem(db, path, wanted);
    if (problem !== undefined) throw new QueueError(problem);
    return db;
  } catch (cause) {
    db.close();
    if (cause instanceof QueueError) throw cause;
    throw new QueueError(`Cannot use queue file '${path}': ${messageOf(cause)}`, { cause });
  }
}

// Runs the DDL that creates (from version 0) or upgrades the file, once:
// the version is read again under the write lock, as the other side may
// have just done it.
function migrate(db: DatabaseSync, version: { from: number; to: number }, ddl: string): void {
  db.exec("BEGIN IMMEDIATE");
  try {
    if (userVersion(db) === version.from) {
      db.exec(ddl);
      db.exec(`PRAGMA user_version = ${version.to}`);
    }
    db.exec("COMMIT");
  } catch (cause) {
    db.exec("ROLLBACK");
    throw cause;
  }
}

/**
 * The schema-version check every queue file passes, however it is opened:
 * its `user_version` must be this waffle's {@linkcode SCHEMA_VERSION} (or
 * the version another file of {@linkcode openDatabase}'s is opened at).
 *
 * @param db A connection to the file, or the host's copy of it.
 * @param path The file, for the message.
 * @param wanted The version it must have; default {@linkcode SCHEMA_VERSION}.
 * @returns Undefined when the versions match, else a one-line reason naming the file.
 */
export function schemaVersionProblem(
  db: DatabaseSync,
  path: string,
  wanted: number = SCHEMA_VERSION,
): string | undefined {
  const version = userVersion(db);
  if (version === wanted) return undefined;
  return `Queue file '${path}' has schema version ${version}, this waffle speaks ${wanted}`;
}

/**
 * Sets how long SQLite itself waits on a lock held by another connection.
 *
 * @param db Any connection.
 * @param ms Milliseconds; 0 fails at once with SQLITE_BUSY.
 */
export function setBusyTimeout(db: DatabaseSync, ms: number): void {
  db.exec(`PRAGMA busy_timeout = ${ms}`);
}

/**
 * The connection's current busy timeout.
 *
 * @param db Any connection.
 * @returns Milliseconds.
 */
export function busyTimeoutOf(db: DatabaseSync): number {
  return Number(readPragma(db, "busy_timeout"));
}

/**
 * Runs `fn` inside `BEGIN IMMEDIATE … COMMIT`. IMMEDIATE takes the write
 * lock up front, so two writers never deadlock upgrading from a read lock
 * (that case fails at once with SQLITE_BUSY, ignoring busy_timeout).
 *
 * @param db An owner connection.
 * @param fn The writes; its return value is returned.
 * @returns What `fn` returned.
 */
export function transaction<T>(db: DatabaseSync, fn: () => T): T {
  db.exec("BEGIN IMMEDIATE");
  try {
    const value = fn();
    db.exec("COMMIT");
    return value;
  } catch (cause) {
    if (db.isTransaction) db.exec("ROLLBACK");
    throw cause;
  }
}

/**
 * Tells whether an error from `node:sqlite` is a lock timeout. The module's
 * errors carry no result code, so the message is matched.
 *
 * @param error Anything thrown by `node:sqlite`.
 * @returns True for "database is locked" / "database table is locked".
 */
export function isBusyError(error: unknown): boolean {
  return /database (table )?is locked|SQLITE_BUSY/i.test(messageOf(error));
}

/**
 * `PRAGMA data_version`: changes whenever another connection commits to the
 * file. Cheap enough to poll.
 *
 * @param db Any connection.
 * @returns The current data version.
 */
export function dataVersion(db: DatabaseSync): number {
  return Number(readPragma(db, "data_version"));
}

/**
 * The message of anything thrown.
 *
 * @param error A thrown value.
 * @returns Its message, or its string form.
 */
export function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

// Prepared once per connection: a statement prepared per call holds its
// SQLite memory until V8 collects it, and an idle runner asks for
// data_version ten times a second with little else to make V8 collect (its
// native heap grew ~1 MiB a minute).
function readPragma(db: DatabaseSync, name: string): unknown {
  const row = statement(db, `PRAGMA ${name}`).get() as Record<string, unknown> | undefined;
  return row === undefined ? undefined : Object.values(row)[0];
}

function userVersion(db: DatabaseSync): number {
  return Number(readPragma(db, "user_version"));
}

function expectPragma(
  db: DatabaseSync,
  path: string,
  name: string,
  value: string,
  expected: string | number,
): void {
  db.exec(`PRAGMA ${name} = ${value}`);
  const got = readPragma(db, name);
  if (got !== expected && String(got).toLowerCase() !== String(expected)) {
    throw new QueueError(`Queue file '${path}' refused ${name}=${value}: got '${String(got)}'`);
  }
}

// The sandbox can write inside its queue directory on some setups; a symlink
// planted there must never redirect a host write (hot-journal rollback included).
function refuseSymlink(path: string, mayCreate: boolean): void {
  try {
    const info = Deno.lstatSync(path);
    if (info.isSymlink || !info.isFile) {
      throw new QueueError(`Queue file '${path}' is not a regular file`);
    }
  } catch (cause) {
    if (cause instanceof QueueError) throw cause;
    if (cause instanceof Deno.errors.NotFound && mayCreate) return;
    if (cause instanceof Deno.errors.NotFound) {
      throw new QueueError(`Queue file '${path}' does not exist`, { cause });
    }
    throw new QueueError(`Cannot inspect queue file '${path}': ${messageOf(cause)}`, { cause });
  }
}

const statements = new WeakMap<DatabaseSync, Map<string, StatementSync>>();

/**
 * A prepared statement for `sql`, prepared once per connection: the queue's
 * hot paths run the same few statements thousands of times.
 *
 * @param db The connection.
 * @param sql The statement text.
 * @returns The cached prepared statement.
 */
export function statement(db: DatabaseSync, sql: string): StatementSync {
  let cache = statements.get(db);
  if (cache === undefined) statements.set(db, cache = new Map());
  let prepared = cache.get(sql);
  if (prepared === undefined) cache.set(sql, prepared = db.prepare(sql));
  return prepared;
}
