/**
 * The one place the host reads a SQLite file that the sandbox side can write
 * (`outbound.db`). Nothing the sandbox put there may make the host touch
 * another file, block, or run SQL of the sandbox's choosing. So SQLite never
 * opens the file at all:
 *
 * - This module opens it itself: an `lstat` that must show a regular file,
 *   then `open(O_RDONLY | O_NOFOLLOW | O_NONBLOCK)`, so a symlink, FIFO,
 *   socket or device under the name is refused without being followed or
 *   blocked on. (SQLite would resolve even `/proc/self/fd/<n>` back to the
 *   name and open `<name>-journal` by name: a FIFO there hangs any reader,
 *   and a read-write reader rolls back a crafted journal whose super-journal
 *   name makes SQLite delete a file of the sandbox's choosing.)
 * - It copies the file while holding SQLite's shared lock (an open file
 *   description lock on the same bytes SQLite uses, so the runner cannot
 *   commit meanwhile and the copy is consistent), refuses a copy while a hot
 *   journal says the file may be half-written, and bounds the size first.
 * - The copy is loaded into an in-memory database: defensive,
 *   `trusted_schema=OFF`, small value and statement limits, an authorizer
 *   that refuses anything run inside a view or trigger and any function or
 *   pragma outside short lists, and a schema that must equal waffle's
 *   exactly. A copy is reused until the file's change counter moves.
 *
 * @module
 */
import { DatabaseSync } from "node:sqlite";
import { SandboxFileError } from "../errors.ts";
import { errno, type Libc, libc, O_CLOEXEC, O_NOFOLLOW, O_NONBLOCK, O_RDONLY } from "../libc.ts";
import { messageOf, schemaVersionProblem } from "./connection.ts";

const ENOENT = 2;

/** A copy is followed by at least this many times its cost without one. */
const COPY_DUTY = 4;

// What reading `size` bytes cost, roughly (1 GB/s), in ms: part of a copy's cost.
function readCost(size: number): number {
  return size / 1e6;
}

/** Tries further apart than this do not count as one long lock. */
const BUSY_GAP_MS = 1000;

/** Files up to this size are always read; above it, the caller's limit decides. */
export const SMALL_FILE_BYTES = 16 * 1024 * 1024;

// Loaded with the module, not on a first read in the middle of other work.
libc();

// SQLite's lock bytes (os_unix.c), which its connections lock with fcntl.
const PENDING_BYTE = 0x40000000;
const RESERVED_BYTE = PENDING_BYTE + 1;
const SHARED_FIRST = PENDING_BYTE + 2;
const SHARED_SIZE = 510;
// Open file description locks: owned by our descriptor, not the process, so
// they neither drop nor are dropped by SQLite connections of this process.
const F_OFD_GETLK = 36;
const F_OFD_SETLK = 37;
const F_RDLCK = 0;
const F_WRLCK = 1;
const F_UNLCK = 2;

// sqlite3_set_authorizer action codes and answers.
const SQLITE_OK = 0;
const SQLITE_DENY = 1;
const SQLITE_PRAGMA = 19;
const SQLITE_READ = 20;
const SQLITE_SELECT = 21;
const SQLITE_TRANSACTION = 22;
const SQLITE_FUNCTION = 31;

const FUNCTIONS = new Set(["typeof", "octet_length", "length", "count", "max", "min"]);
const PRAGMAS = new Set(["schema_version", "user_version"]);

// Present in Deno's node:sqlite (SQLite 3.53) but missing from its types.
interface Hardenable {
  enableDefensive(on: boolean): void;
  deserialize(data: Uint8Array): void;
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

/** Options for {@linkcode SandboxFile}. */
export interface SandboxFileOptions {
  /** The DDL the file must hold, exactly. */
  schema: string;
  /** Largest text or blob SQLite may materialise, in bytes. */
  maxValueBytes: number;
  /**
   * Largest file accepted, in bytes: a larger one is refused unread. A
   * function is asked only for a file above {@linkcode SMALL_FILE_BYTES}.
   */
  maxFileBytes: number | (() => number);
}

/**
 * A read-only, hostile-safe view of one SQLite file the sandbox can write.
 * Follows the file under the name when it is replaced.
 */
export class SandboxFile {
  /** The file's path (for messages). */
  readonly path: string;
  #options: SandboxFileOptions;
  #fd = -1;
  #ino = -1;
  #db: DatabaseSync | undefined;
  #key = "";
  #busySince: number | undefined;
  #lastBusy = 0;
  #nextCopy = 0;
  #served: string | undefined;
  #deferredUntil: number | undefined;

  /**
   * Prepares a reader; nothing is opened until the first read.
   *
   * @param path The file.
   * @param options The exact schema and the size limits.
   */
  constructor(path: string, options: SandboxFileOptions) {
    this.path = path;
    this.#options = options;
  }

  /**
   * Since when (epoch ms) every attempt to copy the file met a lock or a hot
   * journal, or undefined when the last attempt succeeded.
   *
   * @returns The time, or undefined.
   */
  get busySince(): number | undefined {
    return this.#busySince;
  }

  /**
   * When the last read served an older copy because a new one was not due
   * yet (see the copy rate), the time the next copy is due; else undefined.
   *
   * @returns Epoch ms, or undefined.
   */
  get deferredUntil(): number | undefined {
    return this.#deferredUntil;
  }

  /**
   * Runs `read` on a consistent copy of the file, taken now (or reused while
   * the file's change counter has not moved). While the file is locked, the
   * last copy is read again: it is consistent, only older.
   *
   * @param read The reads; must be synchronous.
   * @returns What `read` returned.
   * @throws {SandboxFileError} `missing`, `busy` (try again later) or `damaged`.
   */
  read<T>(read: (db: DatabaseSync) => T): T {
    let db: DatabaseSync;
    // `deferredUntil` and `busySince` describe the last read only: a read
    // that failed otherwise (the file grew too large, was damaged or went
    // away) served no deferred or locked copy, and a wait must judge the
    // runner instead of retrying on their stale word.
    this.#deferredUntil = undefined;
    try {
      db = this.#snapshot();
    } catch (error) {
      if (!(error instanceof SandboxFileError && error.problem === "busy")) {
        this.#busySince = undefined;
      }
      throw error;
    }
    try {
      return read(db);
    } catch (error) {
      throw classify(this.path, error);
    }
  }

  /**
   * The {@linkcode version} of the copy that reads are served from: read
   * right after a `read()`, it says what that read saw, whoever else reads
   * this file meanwhile. Undefined before the first copy.
   *
   * @returns The fingerprint, or undefined.
   */
  get servedVersion(): string | undefined {
    return this.#served;
  }

  /**
   * When the next copy may be made (epoch ms): until then a changed file is
   * served from the last copy.
   *
   * @returns The time.
   */
  get nextCopyAt(): number {
    return this.#nextCopy;
  }

  /**
   * A cheap fingerprint of the file's current content (inode and SQLite's
   * change counter), without a lock or a copy: it changes when the runner
   * commits or the file is replaced.
   *
   * @returns The fingerprint; empty when the file cannot be looked at.
   */
  version(): string {
    try {
      const info = Deno.lstatSync(this.path);
      if (!info.isFile) return "";
      if (info.ino !== this.#ino || this.#fd < 0) return `ino:${info.ino}`;
      return `${info.ino}:${readCounter(this.#lib(), this.#fd)}`;
    } catch {
      return "";
    }
  }

  /** Closes the copy and the descriptor. */
  close(): void {
    this.#drop();
    if (this.#fd >= 0) libc()?.close(this.#fd);
    this.#fd = -1;
    this.#ino = -1;
  }

  #snapshot(): DatabaseSync {
    const lib = this.#lib();
    const fd = this.#descriptor(lib);
    const magic = `/proc/self/fd/${fd}`;
    if (!shareLock(lib, fd)) {
      return this.#busy(
        new SandboxFileError(`Queue file '${this.path}' is locked`, {
          problem: "busy",
        }),
      );
    }
    let bytes: Uint8Array | undefined;
    let key: string;
    let version: string;
    try {
      if (hotJournal(lib, fd, `${this.path}-journal`)) {
        return this.#busy(
          new SandboxFileError(
            `Queue file '${this.path}' has a hot journal: the runner must recover it`,
            { problem: "busy" },
          ),
        );
      }
      // stat() on the magic link follows it to the open file; it opens nothing.
      const size = Deno.statSync(magic).size;
      const limit = this.#options.maxFileBytes;
      const max = typeof limit === "number" ? limit : size > SMALL_FILE_BYTES ? limit() : size;
      if (size === 0 || size > max) {
        throw new SandboxFileError(
          `Queue file '${this.path}' has ${size} bytes (at most ${max})`,
          { problem: "damaged" },
        );
      }
      const counter = readCounter(lib, fd);
      key = `${this.#ino}:${counter}:${size}`;
      version = `${this.#ino}:${counter}`;
      const changed = key !== this.#key || this.#db === undefined;
      // However fast the runner changes the file, copies take at most a
      // fifth of this thread: until the next one is due, the last one serves.
      this.#deferredUntil = changed && this.#db !== undefined && Date.now() < this.#nextCopy
        ? this.#nextCopy
        : undefined;
      if (changed && this.#deferredUntil === undefined) bytes = readAll(lib, fd, size);
    } finally {
      unlock(lib, fd, SHARED_FIRST, SHARED_SIZE);
    }
    this.#busySince = undefined;
    if (bytes === undefined) return this.#db!;
    this.#drop();
    const started = performance.now();
    const db = this.#load(bytes);
    this.#nextCopy = Date.now() +
      COPY_DUTY * (performance.now() - started + readCost(bytes.byteLength));
    this.#db = db;
    this.#key = key;
    this.#served = version;
    return db;
  }

  #load(bytes: Uint8Array): DatabaseSync {
    const db = new DatabaseSync(":memory:");
    const hardened = db as unknown as Hardenable;
    try {
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
      hardened.deserialize(bytes);
      hardened.setAuthorizer(authorize);
      const problem = schemaVersionProblem(db, this.path);
      if (problem !== undefined) throw new SandboxFileError(problem, { problem: "damaged" });
      if (!hasSchema(db, this.#options.schema)) {
        throw new SandboxFileError(`Queue file '${this.path}' has a schema that is not waffle's`, {
          problem: "damaged",
        });
      }
      return db;
    } catch (error) {
      db.close();
      throw classify(this.path, error);
    }
  }

  #descriptor(lib: Libc): number {
    // The same inode as last time: its descriptor serves again.
    if (this.#fd >= 0 && inodeOf(this.path) === this.#ino) return this.#fd;
    this.close();
    const opened = openSandboxName(lib, this.path);
    this.#fd = opened.fd;
    this.#ino = opened.info.ino ?? -1;
    return opened.fd;
  }

  #busy(error: SandboxFileError): DatabaseSync {
    const now = Date.now();
    // A lock seen now after a long quiet spell is a new one, not the old one
    // still held: "busy since" counts only tries that keep meeting it.
    if (now - this.#lastBusy > BUSY_GAP_MS) this.#busySince = now;
    this.#busySince ??= now;
    this.#lastBusy = now;
    if (this.#db === undefined) throw error;
    return this.#db;
  }

  #drop(): void {
    try {
      this.#db?.close();
    } catch {
      // Already closed.
    }
    this.#db = undefined;
    this.#key = "";
    this.#served = undefined;
  }

  #lib(): Libc {
    const lib = libc();
    if (lib === undefined) {
      throw new SandboxFileError(`Cannot read '${this.path}' safely: libc is not available`, {
        problem: "damaged",
      });
    }
    return lib;
  }
}

// A reader's SHARED lock as SQLite takes it: PENDING first (so a writer that
// is waiting for readers to leave is not starved), then the shared range.
function shareLock(lib: Libc, fd: number): boolean {
  if (!setLock(lib, fd, F_RDLCK, PENDING_BYTE, 1)) return false;
  const shared = setLock(lib, fd, F_RDLCK, SHARED_FIRST, SHARED_SIZE);
  unlock(lib, fd, PENDING_BYTE, 1);
  return shared;
}

function unlock(lib: Libc, fd: number, start: number, length: number): void {
  setLock(lib, fd, F_UNLCK, start, length);
}

function setLock(lib: Libc, fd: number, type: number, start: number, length: number): boolean {
  return lib.fcntl(fd, F_OFD_SETLK, flock(type, start, length)) === 0;
}

// A non-empty journal with nobody holding RESERVED was left by a writer that
// died mid-commit: the file may be half-written until the runner rolls it
// back. The journal is only looked at (lstat), never opened. With RESERVED
// held, a writer is alive and, while we hold SHARED, cannot touch the file.
function hotJournal(lib: Libc, fd: number, journal: string): boolean {
  try {
    const info = Deno.lstatSync(journal);
    if (!info.isFile || info.size === 0) return false;
  } catch {
    return false;
  }
  const probe = flock(F_WRLCK, RESERVED_BYTE, 1);
  if (lib.fcntl(fd, F_OFD_GETLK, probe) !== 0) return true;
  return new DataView(probe.buffer).getInt16(0, true) === F_UNLCK;
}

// struct flock on 64-bit Linux: l_type, l_whence (shorts), l_start, l_len
// (off_t), l_pid (0 for open file description locks).
function flock(type: number, start: number, length: number): Uint8Array<ArrayBuffer> {
  const bytes = new Uint8Array(32);
  const view = new DataView(bytes.buffer);
  view.setInt16(0, type, true);
  view.setInt16(2, 0, true);
  view.setBigInt64(8, BigInt(start), true);
  view.setBigInt64(16, BigInt(length), true);
  return bytes;
}

function readCounter(lib: Libc, fd: number): number {
  const bytes = new Uint8Array(4);
  if (Number(lib.pread(fd, bytes, 4n, 24n)) !== 4) return -1;
  return new DataView(bytes.buffer).getUint32(0);
}

function inodeOf(path: string): number | undefined {
  try {
    return Deno.lstatSync(path).ino ?? undefined;
  } catch {
    return undefined;
  }
}

/**
 * Opens a name in a directory the sandbox can write, for reading, the one
 * way the host does: `lstat` must show a regular file, the open itself has
 * `O_NOFOLLOW | O_NONBLOCK` (a link swapped in is refused, a FIFO never
 * blocks), and the open file is checked again by descriptor (the name may
 * have changed since the `lstat`).
 *
 * @param lib libc.
 * @param path The name.
 * @returns The descriptor (the caller closes it) and the open file's status.
 * @throws {SandboxFileError} `missing` when there is no such name, else `damaged`.
 */
export function openSandboxName(lib: Libc, path: string): { fd: number; info: Deno.FileInfo } {
  let info: Deno.FileInfo;
  try {
    info = Deno.lstatSync(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      throw new SandboxFileError(`Queue file '${path}' does not exist`, { problem: "missing" });
    }
    throw new SandboxFileError(`Cannot inspect queue file '${path}': ${messageOf(error)}`, {
      problem: "damaged",
      cause: error,
    });
  }
  if (!info.isFile) {
    throw new SandboxFileError(`Queue file '${path}' is not a regular file`, {
      problem: "damaged",
    });
  }
  const fd = lib.open(
    new TextEncoder().encode(`${path}\0`),
    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
    0,
  );
  if (fd < 0) {
    const code = errno(lib);
    throw new SandboxFileError(`Cannot open queue file '${path}' (errno ${code})`, {
      problem: code === ENOENT ? "missing" : "damaged",
    });
  }
  const opened = Deno.statSync(`/proc/self/fd/${fd}`);
  if (!opened.isFile) {
    lib.close(fd);
    throw new SandboxFileError(`Queue file '${path}' is not a regular file`, {
      problem: "damaged",
    });
  }
  return { fd, info: opened };
}

/**
 * Reads up to `size` bytes of an open file from its start.
 *
 * @param lib libc.
 * @param fd The descriptor.
 * @param size How many bytes (already bounded by the caller).
 * @returns The bytes read (fewer when the file is shorter).
 */
export function readAll(lib: Libc, fd: number, size: number): Uint8Array {
  const bytes = new Uint8Array(size);
  let done = 0;
  while (done < size) {
    const got = Number(lib.pread(fd, bytes.subarray(done), BigInt(size - done), BigInt(done)));
    if (got <= 0) break;
    done += got;
  }
  return done === size ? bytes : bytes.subarray(0, done);
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
    const memory = new DatabaseSync(":memory:");
    memory.exec(ddl);
    expected = describeSchema(memory);
    memory.close();
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

function classify(path: string, error: unknown): unknown {
  if (error instanceof SandboxFileError) return error;
  // A ProtocolError (one bad row) belongs to its request, not to the file.
  if (error instanceof Error && error.name === "ProtocolError") return error;
  return new SandboxFileError(`Queue file '${path}' is unusable: ${messageOf(error)}`, {
    problem: "damaged",
    cause: error,
  });
}
