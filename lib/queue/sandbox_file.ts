/**
 * The one place the host opens a SQLite file that the sandbox side can write
 * (`outbound.db`). Nothing the sandbox put there may make the host touch
 * another file, block, or run SQL of the sandbox's choosing:
 *
 * - The file is opened by this module with `O_NOFOLLOW | O_NONBLOCK` after an
 *   `lstat` that must show a regular file, and SQLite opens the magic link
 *   `/proc/self/fd/<n>` to that open file. So a symlink, FIFO, socket or
 *   device under the name is refused without being followed or blocked on,
 *   and SQLite looks for the journal at `/proc/self/fd/<n>-journal`, which
 *   cannot exist: a hot or crafted journal (whose super-journal name would
 *   make SQLite delete a file) is never opened, rolled back or deleted.
 * - The connection is read-only, `busy_timeout` 0 (the caller waits
 *   asynchronously), defensive, `trusted_schema=OFF`, with small limits on
 *   value and statement sizes, so an oversized value can never be
 *   materialised and schema text is bounded.
 * - The schema must equal waffle's exactly (checked in the same read
 *   transaction as every read, so it cannot change between check and use),
 *   and an authorizer refuses anything that would run inside a view or
 *   trigger and any table or function outside the protocol's.
 *
 * @module
 */
import { DatabaseSync } from "node:sqlite";
import { SandboxFileError } from "../errors.ts";
import { errno, libc, O_CLOEXEC, O_NOFOLLOW, O_NONBLOCK, O_RDONLY } from "../libc.ts";
import { messageOf } from "./connection.ts";
import { SCHEMA_VERSION } from "./protocol.ts";

const ENOENT = 2;

// Present in Deno's node:sqlite (SQLite 3.53) but missing from its types.
interface Hardenable {
  enableDefensive(on: boolean): void;
  limits: Record<string, number>;
  setAuthorizer(
    callback: (
      action: number,
      arg1: string | null,
      arg2: string | null,
      db: string | null,
      inner: string | null,
    ) => number,
  ): void;
}

// sqlite3_set_authorizer action codes and answers.
const SQLITE_OK = 0;
const SQLITE_DENY = 1;
const SQLITE_PRAGMA = 19;
const SQLITE_READ = 20;
const SQLITE_SELECT = 21;
const SQLITE_TRANSACTION = 22;
const SQLITE_FUNCTION = 31;

const FUNCTIONS = new Set(["typeof", "octet_length", "length", "count", "max", "min"]);
const PRAGMAS = new Set(["schema_version", "data_version", "user_version"]);

/** Options for {@linkcode SandboxFile}. */
export interface SandboxFileOptions {
  /** The DDL the file must hold, exactly. */
  schema: string;
  /** Largest text or blob SQLite may materialise, in bytes. */
  maxValueBytes: number;
}

/**
 * A read-only, hostile-safe view of one SQLite file the sandbox can write.
 * Reopens by itself when the file under the name is replaced.
 */
export class SandboxFile {
  /** The file's path (for messages and the inode check). */
  readonly path: string;
  #options: SandboxFileOptions;
  #db: DatabaseSync | undefined;
  #fd = -1;
  #ino = -1;
  #schemaVersion = -1;

  /**
   * Prepares a reader; nothing is opened until the first read.
   *
   * @param path The file.
   * @param options The exact schema and the value size limit.
   */
  constructor(path: string, options: SandboxFileOptions) {
    this.path = path;
    this.#options = options;
  }

  /**
   * Runs `read` inside one read transaction, after checking the schema in
   * that same transaction.
   *
   * @param read The reads; must be synchronous.
   * @returns What `read` returned.
   * @throws {SandboxFileError} `missing`, `busy` (try again later) or `damaged`.
   */
  read<T>(read: (db: DatabaseSync) => T): T {
    const db = this.#connection();
    try {
      db.exec("BEGIN");
      const version = Number(first(db, "PRAGMA schema_version"));
      if (version !== this.#schemaVersion) {
        this.#checkSchema(db);
        this.#schemaVersion = version;
      }
      const value = read(db);
      db.exec("COMMIT");
      return value;
    } catch (error) {
      if (db.isTransaction) {
        try {
          db.exec("ROLLBACK");
        } catch {
          // A connection that cannot roll back a read is reopened next time.
          this.close();
        }
      }
      throw classify(this.path, error);
    }
  }

  /**
   * The inode currently open, or -1.
   *
   * @returns The inode number.
   */
  get inode(): number {
    return this.#ino;
  }

  /** Closes the connection, then the descriptor that pins the file. */
  close(): void {
    try {
      this.#db?.close();
    } catch {
      // Already closed.
    }
    this.#db = undefined;
    // Closed only after SQLite's own descriptor: closing any descriptor of
    // the file drops this process's POSIX locks on it.
    if (this.#fd >= 0) libc()?.close(this.#fd);
    this.#fd = -1;
    this.#ino = -1;
    this.#schemaVersion = -1;
  }

  #connection(): DatabaseSync {
    const current = lstatOrNull(this.path);
    if (this.#db !== undefined && current?.ino === this.#ino) return this.#db;
    this.close();
    if (current === null) {
      throw new SandboxFileError(`Queue file '${this.path}' does not exist`, {
        problem: "missing",
      });
    }
    if (!current.isFile) {
      throw new SandboxFileError(`Queue file '${this.path}' is not a regular file`, {
        problem: "damaged",
      });
    }
    const lib = libc();
    if (lib === undefined) {
      throw new SandboxFileError(`Cannot open '${this.path}' safely: libc is not available`, {
        problem: "damaged",
      });
    }
    const fd = lib.open(
      new TextEncoder().encode(`${this.path}\0`),
      O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
      0,
    );
    if (fd < 0) {
      const code = errno(lib);
      throw new SandboxFileError(
        `Cannot open queue file '${this.path}' (errno ${code})`,
        { problem: code === ENOENT ? "missing" : "damaged" },
      );
    }
    this.#fd = fd;
    const magic = `/proc/self/fd/${fd}`;
    try {
      // Checked on the open file itself: the name may have changed since lstat.
      const info = Deno.statSync(magic);
      if (!info.isFile) throw new Error("not a regular file");
      this.#ino = info.ino ?? -1;
      const db = new DatabaseSync(magic, { readOnly: true, timeout: 0 });
      this.#db = db;
      const hardened = db as unknown as Hardenable;
      hardened.enableDefensive(true);
      db.exec("PRAGMA trusted_schema = OFF");
      const limits = hardened.limits;
      limits.length = this.#options.maxValueBytes;
      limits.sqlLength = 64 * 1024;
      limits.exprDepth = 64;
      limits.compoundSelect = 4;
      limits.vdbeOp = 100_000;
      limits.functionArg = 8;
      limits.attach = 0;
      limits.triggerDepth = 0;
      limits.likePatternLength = 64;
      hardened.setAuthorizer(authorize);
      return db;
    } catch (error) {
      this.close();
      throw classify(this.path, error);
    }
  }

  #checkSchema(db: DatabaseSync): void {
    const version = Number(first(db, "PRAGMA user_version"));
    if (version !== SCHEMA_VERSION) {
      throw new SandboxFileError(
        `Queue file '${this.path}' has schema version ${version}, this waffle speaks ${SCHEMA_VERSION}`,
        { problem: "damaged" },
      );
    }
    if (!hasSchema(db, this.#options.schema)) {
      throw new SandboxFileError(`Queue file '${this.path}' has a schema that is not waffle's`, {
        problem: "damaged",
      });
    }
  }
}

// Reads of the protocol's tables from plain SELECTs only: nothing inside a
// view or trigger, no function or pragma outside the short lists.
function authorize(
  action: number,
  arg1: string | null,
  arg2: string | null,
  _db: string | null,
  inner: string | null,
): number {
  if (inner !== null) return SQLITE_DENY;
  switch (action) {
    case SQLITE_SELECT:
    case SQLITE_TRANSACTION:
    case SQLITE_READ:
      return SQLITE_OK;
    case SQLITE_FUNCTION:
      // The function's name comes second for this action.
      return FUNCTIONS.has(String(arg2).toLowerCase()) ? SQLITE_OK : SQLITE_DENY;
    case SQLITE_PRAGMA:
      return PRAGMAS.has(String(arg1).toLowerCase()) ? SQLITE_OK : SQLITE_DENY;
    default:
      return SQLITE_DENY;
  }
}

function memorySchema(ddl: string): DatabaseSync {
  const db = new DatabaseSync(":memory:");
  db.exec(ddl);
  return db;
}

const expectedSchemas = new Map<string, string>();

/**
 * Whether a database holds exactly the tables, indexes and DDL text of
 * `ddl` and nothing else (no view, trigger or extra index).
 *
 * @param db Any connection.
 * @param ddl The expected schema.
 * @returns True when they match exactly.
 */
export function hasSchema(db: DatabaseSync, ddl: string): boolean {
  let expected = expectedSchemas.get(ddl);
  if (expected === undefined) {
    expected = describeSchema(memorySchema(ddl));
    expectedSchemas.set(ddl, expected);
  }
  return describeSchema(db) === expected;
}

// Every schema object, in a stable order (root pages differ between files).
function describeSchema(db: DatabaseSync): string {
  return JSON.stringify(
    db.prepare(
      "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name, tbl_name",
    ).all(),
  );
}

function first(db: DatabaseSync, sql: string): unknown {
  const row = db.prepare(sql).get() as Record<string, unknown> | undefined;
  return row === undefined ? undefined : Object.values(row)[0];
}

function lstatOrNull(path: string): Deno.FileInfo | null {
  try {
    return Deno.lstatSync(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw new SandboxFileError(`Cannot inspect queue file '${path}': ${messageOf(error)}`, {
      problem: "damaged",
      cause: error,
    });
  }
}

function classify(path: string, error: unknown): unknown {
  if (error instanceof SandboxFileError) return error;
  const message = messageOf(error);
  if (/database (table )?is locked|SQLITE_BUSY/i.test(message)) {
    return new SandboxFileError(`Queue file '${path}' is locked`, {
      problem: "busy",
      cause: error,
    });
  }
  // A ProtocolError (one bad row) belongs to its request, not to the file.
  if (error instanceof Error && error.name === "ProtocolError") return error;
  return new SandboxFileError(`Queue file '${path}' is unusable: ${message}`, {
    problem: "damaged",
    cause: error,
  });
}
