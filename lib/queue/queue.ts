/**
 * The host side of a queue: submit, wait, stream, cancel, re-attach. Writes
 * only `inbound.db`; reads `outbound.db` as untrusted input.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import * as z from "../schema.ts";
import { concat } from "../bytes.ts";
import { ProtocolError, QueueError, RunnerError, SandboxFileError, UsageError } from "../errors.ts";
import { messageOf, openDatabase, statement } from "./connection.ts";
import { GroupCommit } from "./group_commit.ts";
import {
  idsWithOutboundRows,
  MAX_RESULT_BYTES,
  newCursor,
  readChunks,
  readGeneration,
  readInFlight,
  readInputTaken,
  readResult,
  readState,
  readStateIds,
} from "./outbound_rows.ts";
import {
  DEFAULT_OUTPUT_CAP,
  type ExecPayload,
  execPayloadSchema,
  type ExecResult,
  type Heartbeat,
  INPUT_WINDOW_ROWS,
  MAX_CHUNK_BYTES,
  MAX_INPUT_CHUNK_BYTES,
  MAX_STDIN_BYTES,
  notRunResult,
  type OutputChunk,
  type RequestState,
  type SessionSpec,
  type TtySize,
} from "./protocol.ts";
import { SandboxFile } from "./sandbox_file.ts";
import {
  INBOUND_UPGRADES,
  initQueue,
  OUTBOUND_SCHEMA,
  type QueuePaths,
  queuePaths,
} from "./schema.ts";
import { Bell, ChangeWatcher } from "./watch.ts";
import { markUse } from "./use_mark.ts";
import {
  judgeProgress,
  judgeRunner,
  type Liveness,
  type RunnerTrouble,
  STALE_AFTER_MS,
} from "./liveness.ts";

import { OPEN_REQUEST, outboundAllowance, submittedAndOpen } from "./open_requests.ts";

/**
 * How long the host keeps retrying a queue file that is locked before it
 * gives up on the runner. Every wait is asynchronous: a lock held by one
 * sandbox never stalls the event loop that serves the others.
 */
export const LOCK_WAIT_MS = 10_000;
/** How soon a read that met the runner's lock is tried again. */
const BUSY_RETRY_MS = 20;
/** How many times one wait restarts a runner before it gives up. */
const MAX_REVIVALS = 3;

/** What to run. Exactly one of `argv` and `shell`. */
export interface SubmitOptions {
  /** Program and arguments, run without a shell. */
  argv?: string[];
  /** A shell command line, run as `/bin/sh -c <shell>`. */
  shell?: string;
  /** Working directory inside the workspace. */
  cwd?: string;
  /** Extra environment variables (nothing of the host's environment is passed). */
  env?: Record<string, string>;
  /** Bytes for stdin; stdin is closed when absent. */
  stdin?: Uint8Array;
  /** Run-time limit in milliseconds. */
  timeoutMs?: number;
  /** Per-stream output cap in bytes. */
  outputCap?: number;
  /** The caller's tool-use id: submitting the same one again returns the same request. */
  toolUseId?: string;
  /**
   * Makes the request a session: stdin is streamed with
   * {@linkcode Queue.sendInput}, output is unbounded in total, and the host
   * keeps it alive with {@linkcode Queue.renewLease}. Use `QueueSession`.
   */
  session?: SessionSpec;
}

/** Options for {@linkcode Queue.open}. */
export interface QueueOpenOptions {
  /** Create the directory and files when missing. */
  create?: boolean;
  /** Fallback poll interval in milliseconds. */
  pollMs?: number;
  /** Where the runner's directory lives, when not `<dir>/outbound`. */
  outboundDir?: string | undefined;
  /** Mode of the queue's directories when created (see `initQueue`). */
  mode?: number | undefined;
  /**
   * A host-only file this handle touches after each use (see `use_mark.ts`):
   * the sandbox's record of its last use, which `ps` and `sweep` read. None:
   * no record is kept.
   */
  useMark?: string | undefined;
}

/** Options for waiting on a request. */
export interface WaitOptions {
  /** Aborts the wait (not the request). */
  signal?: AbortSignal;
  /**
   * Called when the runner cannot serve while the request is unfinished: no
   * heartbeat change for {@linkcode STALE_AFTER_MS} by the host's clock, an
   * exit, a queue file locked for {@linkcode LOCK_WAIT_MS}, or a damaged
   * `outbound.db`. A backend restarts (and if need be heals) its sandbox
   * here. Without it, the wait fails with a {@linkcode RunnerError}. It
   * resolves `false` when the runner was not in trouble after all (its
   * sandbox is paused): nothing was restarted, and the wait goes on without
   * counting a restart.
   */
  revive?: (trouble: RunnerTrouble) => Promise<void | false>;
}

/** A request's output and result, as `waffle exec --json` reports them. */
export interface Collected {
  /** How the request ended. */
  result: ExecResult;
  /** The command's stdout, up to the output cap. */
  stdout: Uint8Array;
  /** The command's stderr, up to the output cap. */
  stderr: Uint8Array;
}

const requestRowSchema = z.object({
  id: z.string(),
  tool_use_id: z.string(),
  payload: z.string(),
});

const ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/**
 * A host's handle on one queue directory.
 *
 * @example
 * ```ts ignore
 * const queue = Queue.open("/tmp/q", { create: true });
 * const id = await queue.submit({ argv: ["echo", "hi"] });
 * const { result, stdout } = await queue.collect(id);
 * queue.close();
 * ```
 */
export class Queue {
  /** The queue's file paths. */
  readonly paths: QueuePaths;
  #inbound: DatabaseSync;
  #outbound: SandboxFile;
  #commits: GroupCommit;
  #bell: Bell;
  #watcher: ChangeWatcher;
  #listeners = new Set<() => void>();
  #pumping = false;
  #closed = new AbortController();
  #caps = new Map<string, number>();
  #generation: string | undefined;
  #gcTimer: ReturnType<typeof setTimeout> | undefined;
  #useMark: string | undefined;

  private constructor(paths: QueuePaths, options: QueueOpenOptions) {
    this.paths = paths;
    this.#useMark = options.useMark;
    // Only other host processes (trusted, for a commit's length) can hold a
    // write lock on inbound.db; the runner's read lock blocks only commits,
    // which GroupCommit retries asynchronously.
    this.#inbound = openDatabase(paths.inbound, {
      role: "owner",
      busyTimeoutMs: 1000,
      upgrades: INBOUND_UPGRADES,
    });
    this.#outbound = new SandboxFile(paths.outbound, {
      schema: OUTBOUND_SCHEMA,
      // Sorted rows carry a whole chunk and more: room for that, never a huge value.
      maxValueBytes: 16 * Math.max(MAX_CHUNK_BYTES, MAX_RESULT_BYTES),
      maxFileBytes: () => outboundAllowance(this.#inbound),
    });
    this.#bell = new Bell(paths.inboundBell);
    this.#commits = new GroupCommit(this.#inbound, { bell: this.#bell, lockWaitMs: LOCK_WAIT_MS });
    this.#watcher = new ChangeWatcher([paths.outboundBell], { pollMs: options.pollMs ?? 100 });
  }

  /**
   * Opens (and with `create`, initialises) a queue directory.
   *
   * @param dir The queue directory.
   * @param options Creation and polling.
   * @returns The open queue.
   * @throws {QueueError} When the directory or its files are missing or unusable.
   */
  static open(dir: string, options: QueueOpenOptions = {}): Queue {
    const paths = options.create
      ? initQueue(dir, { outboundDir: options.outboundDir, mode: options.mode })
      : queuePaths(dir, { outboundDir: options.outboundDir });
    if (!options.create) {
      try {
        if (!Deno.statSync(dir).isDirectory) throw new Error("not a directory");
      } catch (cause) {
        throw new QueueError(`Queue directory '${dir}' is not usable: ${messageOf(cause)}`, {
          cause,
        });
      }
    }
    return new Queue(paths, options);
  }

  /** Number of inbound transactions committed (group commit shares them). */
  get commits(): number {
    return this.#commits.commits;
  }

  /**
   * Submits a command. Concurrent submissions share one durable transaction.
   * The request is bound to the runner's current outbound generation, so it
   * can only ever run under that file: if the file is lost or replaced, the
   * request is reported `interrupted`, never run again.
   *
   * @param options What to run.
   * @returns The request id; the request is durable when this resolves.
   * @throws {UsageError} When the request is invalid (nothing is written).
   */
  async submit(options: SubmitOptions): Promise<string> {
    const payload = buildPayload(options);
    const id = crypto.randomUUID();
    const toolUseId = options.toolUseId ?? id;
    if (!ID_PATTERN.test(toolUseId)) {
      throw new UsageError(`Invalid tool-use id '${toolUseId}': use 1-128 of A-Z a-z 0-9 . _ : -`);
    }
    const body = JSON.stringify(payload);
    const kind = payload.session === undefined ? "exec" : "session";
    await this.#syncGeneration().catch(() => {});
    const generation = this.#generation ?? null;
    const assigned = await this.#commits.add(() => {
      const existing = statement(
        this.#inbound,
        "SELECT id, payload FROM requests WHERE tool_use_id = ?",
      ).get(toolUseId) as { id: string; payload: string } | undefined;
      if (existing !== undefined) {
        if (existing.payload !== body) {
          throw new UsageError(
            `Tool-use id '${toolUseId}' was already submitted with a different command`,
          );
        }
        return existing.id;
      }
      statement(
        this.#inbound,
        `INSERT INTO requests (id, tool_use_id, kind, payload, timeout_ms, generation, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?)`,
      ).run(id, toolUseId, kind, body, payload.timeoutMs ?? null, generation, Date.now());
      if (payload.session !== undefined) {
        statement(
          this.#inbound,
          "INSERT INTO sessions (request_id, lease, stdout_read, stderr_read) VALUES (?, 0, 0, 0)",
        ).run(id);
      }
      return id;
    });
    this.#caps.set(assigned, capOf(payload));
    this.#used();
    return assigned;
  }

  /**
   * Appends bytes to a session's stdin, or ends it (`null`). Input is
   * durable, and so seen by the runner, when this resolves. At most
   * {@linkcode INPUT_WINDOW_ROWS} rows wait beyond what the runner took for
   * the process (it records that in `outbound.db`): past them this waits, so
   * neither side holds more than a window however much is streamed, and
   * rows the runner took are deleted as new ones go in. Input for a session
   * that has ended is dropped.
   *
   * @param id A session this host opened.
   * @param data The bytes, or null to close the session's stdin.
   * @param options Abort signal and runner revival while waiting for room.
   * @throws {UsageError} When `id` is not an open session.
   */
  async sendInput(id: string, data: Uint8Array | null, options: WaitOptions = {}): Promise<void> {
    this.#requireRequest(id);
    const pieces: (Uint8Array | null)[] = [];
    if (data === null) pieces.push(null);
    for (let at = 0; data !== null && at < data.byteLength; at += MAX_INPUT_CHUNK_BYTES) {
      pieces.push(data.subarray(at, at + MAX_INPUT_CHUNK_BYTES));
    }
    for (let at = 0; at < pieces.length; at += INPUT_WINDOW_ROWS / 4) {
      const taken = await this.#inputRoom(id, options);
      if (taken === undefined) break;
      await this.#appendInput(id, pieces.slice(at, at + INPUT_WINDOW_ROWS / 4), taken);
    }
    this.#used();
  }

  /**
   * Sets a terminal session's window size (the runner applies it to the pty,
   * which signals SIGWINCH to its foreground process group).
   *
   * @param id A terminal session this host opened.
   * @param size Rows and columns.
   */
  async resize(id: string, size: TtySize): Promise<void> {
    this.#requireRequest(id);
    const rows = Math.max(1, Math.min(4096, Math.trunc(size.rows)));
    const cols = Math.max(1, Math.min(4096, Math.trunc(size.cols)));
    await this.#commits.add(() =>
      statement(
        this.#inbound,
        `INSERT INTO tty (request_id, rows, cols) VALUES (?, ?, ?)
           ON CONFLICT (request_id) DO UPDATE SET rows = excluded.rows, cols = excluded.cols`,
      ).run(id, rows, cols)
    );
    this.#used();
  }

  // Waits until fewer than a window of input rows are untaken. Returns the
  // last row taken (-1: none), or undefined once the session has ended.
  async #inputRoom(id: string, options: WaitOptions): Promise<number | undefined> {
    const budget = newBudget(id);
    while (true) {
      let seen = this.#outbound.version();
      let read: { taken: number; ended: boolean } = { taken: -1, ended: false };
      try {
        read = this.#outbound.read((db) => ({
          taken: readInputTaken(db, id),
          ended: readResult(db, id) !== undefined,
        }));
        seen = this.#outbound.servedVersion ?? seen;
      } catch (error) {
        this.#rethrowForRequest(id, error);
      }
      const last = this.#lastInputSeq(id);
      if (read.ended || this.#lostResult(id) !== undefined) return undefined;
      if (last - read.taken < INPUT_WINDOW_ROWS) return read.taken;
      await this.#changedSince(seen, options, budget);
    }
  }

  // A session's last input row (-1: none yet), by the primary key's order so a
  // long session never rescans its input; nothing may follow the end-of-input row.
  #lastInputSeq(id: string): number {
    const last = statement(
      this.#inbound,
      `SELECT seq, data IS NULL AS closed FROM input WHERE request_id = ?
         ORDER BY seq DESC LIMIT 1`,
    ).get(id) as { seq: number; closed: number } | undefined;
    if (last?.closed) throw new UsageError(`Session '${id}' input is already closed`);
    return last?.seq ?? -1;
  }

  #appendInput(id: string, pieces: (Uint8Array | null)[], taken: number): Promise<void> {
    return this.#commits.add(() => {
      // What the runner took is gone from this file, so a long stream stays
      // small; the last row taken stays, the next one numbers after it.
      statement(
        this.#inbound,
        "DELETE FROM input WHERE request_id = ? AND seq < ? AND data IS NOT NULL",
      ).run(id, taken);
      const insert = statement(
        this.#inbound,
        "INSERT INTO input (request_id, seq, data) VALUES (?, ?, ?)",
      );
      const first = this.#lastInputSeq(id) + 1;
      pieces.forEach((piece, index) => insert.run(id, first + index, piece));
    });
  }

  /**
   * A session's spec and how much of its output its host acknowledged: what
   * a host needs to take over a session another one opened (a restarted
   * server). Read from `inbound.db`, which only hosts write.
   *
   * @param id The session.
   * @returns Its spec and acknowledged bytes.
   * @throws {UsageError} When `id` is no session of this queue.
   */
  sessionOf(id: string): { spec: SessionSpec; read: { stdout: number; stderr: number } } {
    this.#requireRequest(id);
    const row = statement(
      this.#inbound,
      `SELECT r.payload, s.stdout_read, s.stderr_read FROM requests r
         JOIN sessions s ON s.request_id = r.id WHERE r.id = ?`,
    ).get(id) as { payload: string; stdout_read: number; stderr_read: number } | undefined;
    const spec = row === undefined
      ? undefined
      : execPayloadSchema.parse(JSON.parse(row.payload)).session;
    if (row === undefined || spec === undefined) {
      throw new UsageError(`Request '${id}' is not a session`);
    }
    return { spec, read: { stdout: Number(row.stdout_read), stderr: Number(row.stderr_read) } };
  }

  /**
   * Renews a session's lease and tells the runner how much output was read
   * (so it may drop those chunks and read more from the server). A session
   * whose lease is not renewed within its `leaseMs` is ended by the runner.
   *
   * @param id A session this host opened.
   * @param read Bytes of each stream read so far.
   */
  async renewLease(id: string, read: { stdout: number; stderr: number }): Promise<void> {
    await this.#commits.add(() =>
      statement(
        this.#inbound,
        `UPDATE sessions SET lease = lease + 1, stdout_read = max(stdout_read, ?),
           stderr_read = max(stderr_read, ?) WHERE request_id = ?`,
      ).run(read.stdout, read.stderr, id)
    );
    this.#used();
  }

  /**
   * Asks the runner to kill a request's process tree. Harmless when it already ended.
   *
   * @param id The request.
   */
  async cancel(id: string): Promise<void> {
    this.#requireRequest(id);
    await this.#commits.add(() =>
      statement(
        this.#inbound,
        "INSERT OR IGNORE INTO cancels (request_id, created_at) VALUES (?, ?)",
      )
        .run(id, Date.now())
    );
    this.#used();
  }

  /**
   * Tells the runner the result was consumed, so it may delete the outbound
   * rows; the inbound ones are then deleted by {@linkcode Queue.gc}, which
   * runs by itself shortly after.
   *
   * @param id The request.
   */
  async ack(id: string): Promise<void> {
    await this.#commits.add(() =>
      statement(this.#inbound, "INSERT OR IGNORE INTO acks (request_id, created_at) VALUES (?, ?)")
        .run(id, Date.now())
    );
    // A result collected is the last use of a request; what follows is housekeeping.
    this.#used();
    // The runner deletes its rows about once a second; then ours can go.
    this.#scheduleGc();
  }

  // The host used the sandbox: its record says so (never housekeeping's writes).
  #used(): void {
    if (this.#useMark !== undefined) markUse(this.#useMark);
  }

  #scheduleGc(): void {
    if (this.#gcTimer !== undefined || this.#closed.signal.aborted) return;
    this.#gcTimer = setTimeout(() => {
      this.#gcTimer = undefined;
      this.gc().catch(() => {});
    }, 1500);
    Deno.unrefTimer(this.#gcTimer);
  }

  /**
   * Deletes inbound rows of acknowledged requests whose outbound rows the
   * runner already deleted.
   *
   * @returns How many requests were forgotten.
   */
  async gc(): Promise<number> {
    const acked = (statement(this.#inbound, "SELECT request_id FROM acks LIMIT 512").all() as {
      request_id: string;
    }[]).map((row) => row.request_id);
    if (acked.length === 0) return 0;
    let present: Set<string>;
    try {
      present = this.#outbound.read((db) => idsWithOutboundRows(db, acked));
    } catch (error) {
      // No outbound file (or a damaged one) holds nothing of ours.
      if (!(error instanceof SandboxFileError) || error.problem === "busy") throw error;
      present = new Set();
    }
    // A row's absence from an older copy (served while the runner held its
    // lock, or before the next copy was due) proves nothing: rows written
    // after it are not in it, and forgetting their acks would strand them in
    // outbound.db for good. Only a fresh copy decides; else later.
    if (this.#outbound.busySince !== undefined || this.#outbound.deferredUntil !== undefined) {
      this.#scheduleGc();
      return 0;
    }
    const gone = acked.filter((id) => !present.has(id));
    if (gone.length === 0) return 0;
    await this.#commits.add(() => {
      const statements = [
        "requests WHERE id",
        "cancels WHERE request_id",
        "lost WHERE request_id",
        "acks WHERE request_id",
        "input WHERE request_id",
        "sessions WHERE request_id",
      ].map((target) => statement(this.#inbound, `DELETE FROM ${target} = ?`));
      for (const id of gone) for (const query of statements) query.run(id);
    });
    for (const id of gone) this.#caps.delete(id);
    return gone.length;
  }

  /**
   * The runner's view of a request.
   *
   * @param id The request.
   * @returns Its state and, when done, its result.
   * @throws {ProtocolError} When the runner wrote a bad row for it.
   * @throws {SandboxFileError} When outbound.db is locked, missing or damaged.
   */
  state(id: string): { state: RequestState; result?: ExecResult } {
    this.#requireRequest(id);
    const lost = this.#lostResult(id);
    if (lost !== undefined) return { state: "done", result: lost };
    return this.#read(id, (db) => {
      const result = readResult(db, id);
      if (result !== undefined) return { state: "done" as const, result };
      return { state: readState(db, id) };
    });
  }

  /**
   * The runner's last valid heartbeat.
   *
   * @returns The heartbeat, or undefined when none can be read.
   */
  heartbeat(): Heartbeat | undefined {
    return this.liveness().beat;
  }

  /**
   * Whether the runner serves this queue: the outbound file must not be
   * damaged nor locked for {@linkcode LOCK_WAIT_MS}, and the runner is judged
   * by `judgeRunner` (its heartbeat file changing by the host's clock), the
   * judgement every other caller uses too.
   *
   * @returns The judgement with a one-line detail.
   */
  liveness(): Liveness {
    let error: unknown;
    try {
      this.#outbound.read(() => undefined);
    } catch (caught) {
      error = caught;
    }
    return this.#fileTrouble(error) ??
      judgeRunner(this.paths.heartbeat, { queue: this.paths.dir });
  }

  /**
   * Whether the outbound file is damaged, judged on a fresh copy (once the
   * next copy is due). For a host that just stopped a wedged runner: a runner
   * stopped while it held the file's lock hid any damage behind an older
   * copy, so the judgement that stopped it may have said "stale" or "locked".
   *
   * @returns True when the file cannot be a waffle queue.
   */
  async outboundDamaged(): Promise<boolean> {
    const due = this.#outbound.nextCopyAt - Date.now();
    if (due > 0) await new Promise((resolve) => setTimeout(resolve, due));
    try {
      this.#outbound.read(() => undefined);
      return false;
    } catch (error) {
      return this.#fileTrouble(error)?.state === "damaged";
    }
  }

  /**
   * Requests the runner has started and not finished (from any host), among
   * those a host submitted here and still waits for: a row the runner made
   * up for another id counts for nothing.
   *
   * @param options `sessions: false` leaves out sessions (a recycle ends them
   *   rather than waiting: they may live for hours).
   * @returns Their ids; empty when the runner is idle or unreadable.
   */
  inFlight(options: { sessions?: boolean } = {}): string[] {
    let ids: string[];
    try {
      ids = this.#outbound.read(readInFlight);
    } catch {
      return [];
    }
    return submittedAndOpen(this.#inbound, ids, options);
  }

  /**
   * Streams a request's output chunks as the runner writes them, ending once
   * its result is in. Works from any process, so a restarted host re-attaches
   * by id.
   *
   * @param id The request.
   * @param options Abort signal and runner revival.
   * @returns The chunks in order; `result` on the iterator's return value.
   */
  async *output(id: string, options: WaitOptions = {}): AsyncGenerator<OutputChunk, ExecResult> {
    this.#requireRequest(id);
    const cursor = newCursor();
    const cap = this.#capOf(id);
    const budget = newBudget(id);
    while (true) {
      const lost = this.#lostResult(id);
      if (lost !== undefined) return lost;
      let seen = this.#outbound.version();
      let read: { result: ExecResult | undefined; chunks: OutputChunk[] } | undefined;
      // A failed read leaves the cursor where it was: it advances on success only.
      const attempt = { ...cursor, seq: { ...cursor.seq }, bytes: { ...cursor.bytes } };
      try {
        read = this.#outbound.read((db) => {
          // Read the result first: the runner commits the last chunks with it,
          // so once the result is visible every chunk is too.
          const result = readResult(db, id);
          const chunks: OutputChunk[] = [];
          for (
            let page = readChunks(db, id, { cursor: attempt, cap });
            page.length > 0;
            page = readChunks(db, id, { cursor: attempt, cap })
          ) {
            chunks.push(...page);
          }
          return { result, chunks };
        });
        Object.assign(cursor, attempt);
        seen = this.#outbound.servedVersion ?? seen;
      } catch (error) {
        this.#rethrowForRequest(id, error);
      }
      yield* read?.chunks ?? [];
      if (read?.result !== undefined) return read.result;
      this.#refuseCollected(id);
      await this.#changedSince(seen, options, budget);
    }
  }

  /**
   * Waits for a request's result.
   *
   * @param id The request.
   * @param options Abort signal and runner revival.
   * @returns The validated result.
   */
  async wait(id: string, options: WaitOptions = {}): Promise<ExecResult> {
    this.#requireRequest(id);
    const budget = newBudget(id);
    while (true) {
      const lost = this.#lostResult(id);
      if (lost !== undefined) return lost;
      let seen = this.#outbound.version();
      let result: ExecResult | undefined;
      try {
        result = this.#outbound.read((db) => readResult(db, id));
        seen = this.#outbound.servedVersion ?? seen;
      } catch (error) {
        this.#rethrowForRequest(id, error);
      }
      if (result !== undefined) return result;
      this.#refuseCollected(id);
      await this.#changedSince(seen, options, budget);
    }
  }

  /**
   * Waits for a request and gathers its whole output.
   *
   * @param id The request.
   * @param options Abort signal and runner revival.
   * @returns Result, stdout and stderr.
   */
  collect(id: string, options: WaitOptions = {}): Promise<Collected> {
    return collectOutput(this.output(id, options));
  }

  /**
   * Records the runner's current outbound generation. When it differs from
   * the one requests were bound to, the file was lost or replaced: every
   * unfinished request of the old generation is marked lost (the runner
   * never runs a lost request, and waiters get `interrupted`).
   *
   * A runner's commit under way (its lock, a hot journal it is about to
   * roll back) is waited out, up to {@linkcode LOCK_WAIT_MS}: a host that has
   * no earlier copy to read, right after it started the runner, must not
   * fail the call for it.
   *
   * @returns The generation, or undefined when no runner has written one.
   * @throws {SandboxFileError} When outbound.db is damaged, or locked for LOCK_WAIT_MS.
   */
  async syncGeneration(): Promise<string | undefined> {
    const deadline = Date.now() + LOCK_WAIT_MS;
    while (true) {
      try {
        await this.#syncGeneration();
        return this.#generation;
      } catch (error) {
        const busy = error instanceof SandboxFileError && error.problem === "busy";
        if (!busy || Date.now() >= deadline) throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, BUSY_RETRY_MS));
    }
  }

  /** Closes the queue: connections, watcher and the pending gc. */
  close(): void {
    this.#closed.abort();
    clearTimeout(this.#gcTimer);
    this.#commits.flush(true);
    this.#watcher.close();
    this.#bell.close();
    this.#inbound.close();
    this.#outbound.close();
  }

  // Concurrent callers share one sync (and so one commit).
  #syncGeneration(): Promise<void> {
    this.#syncing ??= this.#doSyncGeneration().finally(() => {
      this.#syncing = undefined;
    });
    return this.#syncing;
  }

  #syncing: Promise<void> | undefined;

  async #doSyncGeneration(): Promise<void> {
    let generation: string | undefined;
    let started = new Set<string>();
    try {
      [generation, started] = this.#outbound.read((db) => {
        const found = readGeneration(db);
        return [found, found === this.#generation ? new Set<string>() : readStateIds(db)] as const;
      });
    } catch (error) {
      if (error instanceof SandboxFileError && error.problem === "missing") return;
      throw error;
    }
    if (generation === undefined || generation === this.#generation) return;
    await this.#commits.add(() => {
      const recorded = (statement(this.#inbound, "SELECT generation FROM meta WHERE id = 1")
        .get() as { generation: string | null } | undefined)?.generation ?? null;
      if (recorded === generation) return;
      if (recorded !== null) {
        const orphans = statement(
          this.#inbound,
          `SELECT id FROM requests r WHERE (generation IS NULL OR generation <> ?)
             AND ${OPEN_REQUEST}`,
        ).all(generation) as { id: string }[];
        const mark = statement(
          this.#inbound,
          "INSERT OR IGNORE INTO lost (request_id, created_at) VALUES (?, ?)",
        );
        const now = Date.now();
        for (const { id } of orphans) if (!started.has(id)) mark.run(id, now);
      }
      statement(
        this.#inbound,
        "INSERT INTO meta (id, generation) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET generation = excluded.generation",
      ).run(generation);
    });
    this.#generation = generation;
  }

  #lostResult(id: string): ExecResult | undefined {
    const row = statement(this.#inbound, "SELECT created_at FROM lost WHERE request_id = ?").get(
      id,
    ) as { created_at: number } | undefined;
    if (row === undefined) return undefined;
    return notRunResult(id, {
      interrupted: true,
      endedAt: row.created_at,
      error:
        "The sandbox's queue was lost or replaced while this request was pending; it was not re-run",
    });
  }

  #read<T>(id: string, read: (db: DatabaseSync) => T): T {
    try {
      return this.#outbound.read(read);
    } catch (error) {
      if (error instanceof ProtocolError || error instanceof SandboxFileError) throw error;
      throw new ProtocolError(`Cannot read outbound.db for request '${id}': ${messageOf(error)}`, {
        cause: error,
      });
    }
  }

  // A bad row fails its request; a locked, missing or damaged file is the
  // runner's trouble, which the wait loop turns into a revival or an error.
  #rethrowForRequest(id: string, error: unknown): void {
    if (error instanceof SandboxFileError) return;
    if (error instanceof ProtocolError) throw error;
    throw new ProtocolError(`Cannot read outbound.db for request '${id}': ${messageOf(error)}`, {
      cause: error,
    });
  }

  // What the outbound file says against the runner: damaged, or locked for
  // LOCK_WAIT_MS (whether or not an older copy was served meanwhile). A file
  // that is readable, missing or briefly locked (a commit, a hot journal the
  // runner will roll back) says nothing: the runner's beat decides.
  #fileTrouble(error: unknown): Liveness | undefined {
    if (error !== undefined && !(error instanceof SandboxFileError)) {
      return {
        state: "damaged",
        detail: `Cannot read queue '${this.paths.dir}': ${messageOf(error)}`,
      };
    }
    if (error instanceof SandboxFileError && error.problem === "damaged") {
      return { state: "damaged", detail: error.message };
    }
    const busySince = this.#outbound.busySince;
    const held = busySince === undefined ? 0 : Date.now() - busySince;
    if (held < LOCK_WAIT_MS) return undefined;
    return {
      state: "locked",
      detail: `The sandbox holds a lock on '${this.paths.outbound}': no read for ${
        Math.round(held / 1000)
      } s`,
    };
  }

  #capOf(id: string): number {
    const cached = this.#caps.get(id);
    if (cached !== undefined) return cached;
    const row = statement(this.#inbound, "SELECT payload FROM requests WHERE id = ?").get(id) as
      | { payload: string }
      | undefined;
    const cap = row === undefined
      ? DEFAULT_OUTPUT_CAP
      : capOf(execPayloadSchema.parse(JSON.parse(row.payload)));
    this.#caps.set(id, cap);
    return cap;
  }

  // An acknowledged result may already be deleted by the runner: waiting for
  // it again would wait forever.
  #refuseCollected(id: string): void {
    if (
      statement(this.#inbound, "SELECT 1 AS hit FROM acks WHERE request_id = ?").get(id) !==
        undefined
    ) {
      throw new UsageError(`Request '${id}' was already collected and acknowledged`);
    }
  }

  #requireRequest(id: string): void {
    if (!ID_PATTERN.test(id)) throw new UsageError(`Invalid request id '${id}'`);
    const row = statement(
      this.#inbound,
      "SELECT id, tool_use_id, payload FROM requests WHERE id = ?",
    )
      .get(id);
    if (row === undefined || !requestRowSchema.safeParse(row).success) {
      throw new UsageError(`No request '${id}' in queue '${this.paths.dir}'`);
    }
  }

  // Resolves once outbound.db changed after `version` was taken (or the file
  // was replaced), checking the runner on every wake (at least once per poll).
  async #changedSince(
    version: string,
    options: WaitOptions,
    budget: WaitBudget,
  ): Promise<void> {
    // The last read met the runner's lock and served the copy from before it.
    // The change this wait is for may be the very commit that held the lock,
    // already counted in `version`: read again on that commit's ring, or
    // shortly, instead of waiting for another change (none may come while
    // the runner is idle; its ring may have woken another waiter). A lock
    // held past BUSY_RETRY_MS is tried every BUSY_RETRY_MS, however often
    // the bell rings meanwhile. The runner is still judged, so a lock held
    // for good ends in `locked`, not a loop.
    const busySince = this.#outbound.busySince;
    if (busySince !== undefined) {
      this.#throwIfStopped(options);
      if (await this.#checkRunner(options, budget)) return;
      if (Date.now() - busySince < BUSY_RETRY_MS) await this.#nextRing(options, BUSY_RETRY_MS);
      else await new Promise((resolve) => setTimeout(resolve, BUSY_RETRY_MS));
      return;
    }
    // `version` is what the last read saw (the copy it was served from, which
    // copies being rate-limited may be older than the file). The file already
    // holds more: read again once the next copy is due. Judged by the copy,
    // not by a flag another read of this file (a second wait) may have reset.
    if (this.#outbound.version() !== version) {
      const due = this.#outbound.nextCopyAt - Date.now();
      if (due > 0) await new Promise((resolve) => setTimeout(resolve, due));
      await this.#syncGeneration().catch(() => {});
      return;
    }
    while (true) {
      this.#throwIfStopped(options);
      if (this.#outbound.version() !== version) {
        await this.#syncGeneration().catch(() => {});
        return;
      }
      if (await this.#checkRunner(options, budget)) return;
      await this.#nextRing(options);
    }
  }

  // Resolves on the runner's next ring (or the watcher's poll), an abort, or
  // after `timeoutMs` when given.
  #nextRing(options: WaitOptions, timeoutMs?: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const listener = (): void => {
        this.#listeners.delete(listener);
        options.signal?.removeEventListener("abort", listener);
        clearTimeout(timer);
        resolve();
      };
      const timer = timeoutMs === undefined ? undefined : setTimeout(listener, timeoutMs);
      this.#listeners.add(listener);
      options.signal?.addEventListener("abort", listener, { once: true });
      this.#pump();
    });
  }

  #throwIfStopped(options: WaitOptions): void {
    if (options.signal?.aborted) {
      throw options.signal.reason ?? new DOMException("Aborted", "AbortError");
    }
    if (this.#closed.signal.aborted) throw new QueueError(`Queue '${this.paths.dir}' is closed`);
  }

  // True when the runner was revived (the caller reads again at once).
  async #checkRunner(options: WaitOptions, budget: WaitBudget): Promise<boolean> {
    const now = Date.now();
    if (now - budget.lastCheck < 250) return false;
    budget.lastCheck = now;
    const judged = this.liveness();
    // A runner that beats but does not serve this request is as dead as a stale one.
    const trouble = judged.state === "alive"
      ? this.#stuck(budget, judged, now)
      : { state: judged.state, detail: judged.detail };
    if (trouble === undefined) return false;
    if (options.revive === undefined) {
      // A queue nobody has served yet may still get its runner.
      if (trouble.state === "none" && now - this.#openedAt < STALE_AFTER_MS) return false;
      throw new RunnerError(trouble.detail);
    }
    // Bounded: a sandbox that breaks its runner on every start fails the wait.
    if (budget.revivals >= MAX_REVIVALS) {
      throw new RunnerError(`${trouble.detail} (after ${MAX_REVIVALS} restarts)`);
    }
    if (await options.revive(trouble.state) !== false) budget.revivals++;
    await this.#syncGeneration().catch(() => {});
    return true;
  }

  // A runner that beats but does not serve this request (see judgeProgress).
  #stuck(
    budget: WaitBudget,
    judged: Liveness,
    now: number,
  ): (Liveness & { state: "stale" }) | undefined {
    // The clock for taking the request starts when a boot was first seen
    // alive. A beat that does not parse is no new boot, and one wait accepts
    // only as many new boots as it may revive: a runner that changes its boot
    // id every beat cannot keep resetting the clock. The clock of a started
    // request never resets (an honest new boot turns it into an interrupted
    // result at once).
    const bootId = judged.beat?.bootId;
    if (budget.boot === undefined) budget.boot = { id: bootId, since: now };
    else if (bootId !== undefined && bootId !== budget.boot.id && budget.boots < MAX_REVIVALS) {
      budget.boots++;
      budget.boot = { id: bootId, since: now };
    }
    let state: RequestState;
    try {
      state = this.#outbound.read((db) => readState(db, budget.id));
    } catch (error) {
      // No outbound file under a beating runner: nothing is taken. Any other
      // trouble with the file is liveness()'s to judge.
      if (!(error instanceof SandboxFileError && error.problem === "missing")) return undefined;
      state = "queued";
    }
    if (state === "started") budget.startedSeenAt ??= now;
    const row = statement(this.#inbound, "SELECT created_at, timeout_ms FROM requests WHERE id = ?")
      .get(budget.id) as { created_at: number; timeout_ms: number | null } | undefined;
    if (row === undefined) return undefined;
    return judgeProgress({
      id: budget.id,
      state,
      takeableSince: Math.max(row.created_at, budget.boot.since),
      ...(budget.startedSeenAt === undefined ? {} : { startedSeenAt: budget.startedSeenAt }),
      ...(row.timeout_ms === null ? {} : { timeoutMs: row.timeout_ms }),
    }, { queue: this.paths.dir, now });
  }

  #openedAt = Date.now();

  // One loop wakes every waiter on each change, however many wait.
  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      while (this.#listeners.size > 0 && !this.#closed.signal.aborted) {
        await this.#watcher.wait(this.#closed.signal);
        for (const listener of [...this.#listeners]) listener();
      }
    } finally {
      this.#pumping = false;
    }
  }
}

// What one wait keeps between its checks of the runner.
interface WaitBudget {
  id: string;
  revivals: number;
  lastCheck: number;
  /** The runner boot this wait saw alive, and since when. */
  boot?: { id: string | undefined; since: number };
  /** How many new boots this wait has accepted. */
  boots: number;
  startedSeenAt?: number | undefined;
}

function newBudget(id: string): WaitBudget {
  return { id, revivals: 0, lastCheck: 0, boots: 0 };
}

// A session's output has no total: the runner's window bounds what is unread.
function capOf(payload: ExecPayload): number {
  return payload.session === undefined
    ? payload.outputCap ?? DEFAULT_OUTPUT_CAP
    : Number.MAX_SAFE_INTEGER;
}

function buildPayload(options: SubmitOptions): ExecPayload {
  if ((options.argv === undefined) === (options.shell === undefined)) {
    throw new UsageError("Give exactly one of 'argv' and 'shell'");
  }
  const argv = options.argv ?? ["/bin/sh", "-c", options.shell ?? ""];
  if (argv.length === 0) throw new UsageError("Missing command: 'argv' is empty");
  if (options.session !== undefined && options.stdin !== undefined) {
    throw new UsageError("A session's stdin is streamed: give 'stdin' to sendInput, not submit");
  }
  if (options.stdin !== undefined && options.stdin.byteLength > MAX_STDIN_BYTES) {
    throw new UsageError(
      `Stdin of ${options.stdin.byteLength} bytes exceeds the ${MAX_STDIN_BYTES}-byte limit`,
    );
  }
  const candidate = {
    argv,
    ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
    ...(options.env === undefined ? {} : { env: options.env }),
    ...(options.stdin === undefined ? {} : { stdin: toBase64(options.stdin) }),
    ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
    ...(options.outputCap === undefined ? {} : { outputCap: options.outputCap }),
    ...(options.session === undefined ? {} : { session: options.session }),
  };
  const parsed = execPayloadSchema.safeParse(candidate);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue?.path.join(".") ?? "request";
    throw new UsageError(`Invalid request field '${where}': ${issue?.message ?? "invalid"}`);
  }
  return parsed.data;
}

function toBase64(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

/**
 * Gathers a whole output stream (of {@linkcode Queue.output} or a session's).
 *
 * @param stream The chunks, the result on the return value.
 * @returns Result, stdout and stderr.
 */
export async function collectOutput(
  stream: AsyncGenerator<OutputChunk, ExecResult>,
): Promise<Collected> {
  const parts: Record<"stdout" | "stderr", Uint8Array[]> = { stdout: [], stderr: [] };
  let next = await stream.next();
  while (!next.done) {
    parts[next.value.stream].push(next.value.data);
    next = await stream.next();
  }
  return { result: next.value, stdout: concat(parts.stdout), stderr: concat(parts.stderr) };
}
