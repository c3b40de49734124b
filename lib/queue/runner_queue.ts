/**
 * The runner's side of a queue: reads `inbound.db` (query-only), writes
 * `outbound.db`. Used by `runner/`; lives here because it is one half of the
 * protocol whose other half is {@linkcode Queue}.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { QueueError } from "../errors.ts";
import { dataVersion, messageOf, openDatabase, statement } from "./connection.ts";
import { GroupCommit } from "./group_commit.ts";
import { idsWithOutboundRows } from "./outbound_rows.ts";
import { OPEN_REQUEST } from "./open_requests.ts";
import {
  type ExecPayload,
  execPayloadSchema,
  type ExecResult,
  type Heartbeat,
  type StreamName,
  type TtySize,
} from "./protocol.ts";
import { hasSchema } from "./sandbox_file.ts";
import { OUTBOUND_SCHEMA, type QueuePaths, queuePaths } from "./schema.ts";
import { Bell } from "./watch.ts";
import { writeHeartbeatFile } from "./heartbeat_file.ts";

/** A request as the runner sees it. `payload` is undefined when it failed validation. */
export interface InboundRequest {
  /** Position in `inbound.db`: requests are served in this order. */
  seq: number;
  /** The request id. */
  id: string;
  /** The caller's tool-use id. */
  toolUseId: string;
  /** What to run. */
  payload: ExecPayload | undefined;
  /** Why the payload was rejected. */
  invalid?: string;
}

/** What {@linkcode RunnerQueue.recover} found from earlier runners. */
export interface Recovery {
  /** Started by a runner that died before writing a result. */
  interrupted: InboundRequest[];
  /** Never started: safe to run. */
  pending: InboundRequest[];
}

/** Runner-side handle on one queue directory. */
export class RunnerQueue {
  /** The queue's paths. */
  readonly paths: QueuePaths;
  /** Shared transactions for everything this runner writes. */
  readonly commits: GroupCommit;
  #inbound: DatabaseSync;
  #outbound: DatabaseSync;
  #bell: Bell;
  /** This outbound file's generation: requests bound to another one never run here. */
  readonly generation: string;
  #cursor = 0;
  #inboundVersion = -1;

  private constructor(paths: QueuePaths) {
    this.paths = paths;
    this.#outbound = openOutbound(paths.outbound);
    try {
      this.#inbound = openInbound(paths.inbound);
      setAsideUnlessRegular(paths.outboundBell);
      // Written by name every beat: a link or FIFO there would redirect or block the writes.
      setAsideUnlessRegular(paths.heartbeat);
      Deno.writeFileSync(paths.outboundBell, new Uint8Array(), { append: true, create: true });
    } catch (error) {
      this.#outbound.close();
      throw error;
    }
    this.generation = String(
      (statement(this.#outbound, "SELECT generation FROM meta WHERE id = 1").get() as {
        generation: string;
      }).generation,
    );
    this.#bell = new Bell(paths.outboundBell);
    this.commits = new GroupCommit(this.#outbound, { bell: this.#bell });
  }

  /**
   * Opens a queue directory: the host's `inbound.db` read-only, and this
   * runner's `outbound.db`, created (with a fresh generation) when missing.
   * An outbound file that is not a usable waffle queue is set aside and
   * replaced: the requests bound to it come back `interrupted` to the host.
   *
   * @param dir The queue directory.
   * @param options `outboundDir`: where the runner's files live, when not `<dir>/outbound`.
   * @returns The runner's handle.
   * @throws {QueueError} When inbound.db is missing or has another schema.
   */
  static open(dir: string, options: { outboundDir?: string | undefined } = {}): RunnerQueue {
    return new RunnerQueue(queuePaths(dir, options));
  }

  /**
   * True when the host committed to inbound.db since the last call.
   *
   * @returns Whether inbound.db changed.
   */
  inboundChanged(): boolean {
    let version: number;
    try {
      version = dataVersion(this.#inbound);
    } catch {
      // Unreadable for now (the host died mid-commit and has not rolled its
      // journal back yet): report a change, so the caller reads and retries.
      return true;
    }
    if (version === this.#inboundVersion) return false;
    this.#inboundVersion = version;
    return true;
  }

  /**
   * Classifies every unacknowledged request left by earlier runners and sets
   * the read cursor past them. A request that started but has no result was
   * interrupted: it is reported, never re-run.
   *
   * @returns Interrupted and pending requests, in submission order.
   */
  recover(): Recovery {
    // One read transaction: a request committed between the list and the
    // cursor would otherwise be skipped for good.
    const { requests, max } = this.#inboundRead(() => ({
      requests: this.#readRequests(`${ELIGIBLE} ORDER BY seq`, this.generation),
      max: (statement(this.#inbound, "SELECT max(seq) AS seq FROM requests").get() as {
        seq: number | null;
      }).seq ?? 0,
    }));
    const recovery: Recovery = { interrupted: [], pending: [] };
    const state = statement(
      this.#outbound,
      `SELECT (SELECT state FROM states WHERE request_id = ?1) AS state,
              EXISTS (SELECT 1 FROM results WHERE request_id = ?1) AS done`,
    );
    const highWater = this.#maxStartedSeq();
    for (const request of requests) {
      const row = state.get(request.id) as { state: string | null; done: number };
      if (row.done) continue;
      // Requests start in submission order: one at or below the highest
      // started one without a state row lost its row, and may have run.
      if (row.state === "started" || request.seq <= highWater) recovery.interrupted.push(request);
      else recovery.pending.push(request);
    }
    this.#cursor = max;
    return recovery;
  }

  /**
   * Requests submitted since the last call.
   *
   * @returns New requests in submission order.
   */
  newRequests(): InboundRequest[] {
    const requests = this.#inboundRead(() =>
      this.#readRequests(
        `${ELIGIBLE} AND seq > ? ORDER BY seq LIMIT 1024`,
        this.generation,
        this.#cursor,
      )
    );
    const last = requests.at(-1);
    if (last !== undefined) this.#cursor = last.seq;
    return requests;
  }

  /**
   * Which of `ids` the host asked to cancel (or gave up on as lost).
   *
   * @param ids Requests queued or running here.
   * @returns The cancelled subset.
   */
  cancelled(ids: Iterable<string>): Set<string> {
    const query = statement(
      this.#inbound,
      `SELECT 1 AS hit WHERE EXISTS (SELECT 1 FROM cancels WHERE request_id = ?1)
         OR EXISTS (SELECT 1 FROM lost WHERE request_id = ?1)`,
    );
    const hits = new Set<string>();
    for (const id of ids) if (query.get(id) !== undefined) hits.add(id);
    return hits;
  }

  /**
   * A session's stdin rows after `afterSeq`, in order (bounded).
   *
   * @param id The session.
   * @param afterSeq The last row already read (-1 before the first).
   * @returns Rows; `data` null marks the end of input.
   */
  sessionInput(id: string, afterSeq: number): { seq: number; data: Uint8Array | null }[] {
    return this.#inboundRead(() =>
      (statement(
        this.#inbound,
        "SELECT seq, data FROM input WHERE request_id = ? AND seq > ? ORDER BY seq LIMIT 16",
      ).all(id, afterSeq) as { seq: number; data: Uint8Array | null }[]).map((row) => ({
        seq: Number(row.seq),
        data: row.data instanceof Uint8Array ? row.data : null,
      }))
    );
  }

  /**
   * A session's lease row: a counter the host bumps while it lives, and how
   * much of each stream it has read.
   *
   * @param id The session.
   * @returns The row, or undefined when the host wrote none.
   */
  sessionLease(id: string): { lease: number; stdout: number; stderr: number } | undefined {
    const row = this.#inboundRead(() =>
      statement(
        this.#inbound,
        "SELECT lease, stdout_read, stderr_read FROM sessions WHERE request_id = ?",
      ).get(id) as { lease: number; stdout_read: number; stderr_read: number } | undefined
    );
    return row === undefined ? undefined : {
      lease: Number(row.lease),
      stdout: Number(row.stdout_read),
      stderr: Number(row.stderr_read),
    };
  }

  /**
   * A terminal session's window size as the host last set it.
   *
   * @param id The session.
   * @returns The size, or undefined when the host set none.
   */
  ttySize(id: string): TtySize | undefined {
    const row = this.#inboundRead(() =>
      statement(this.#inbound, "SELECT rows, cols FROM tty WHERE request_id = ?").get(id) as
        | { rows: number; cols: number }
        | undefined
    );
    return row === undefined ? undefined : { rows: Number(row.rows), cols: Number(row.cols) };
  }

  /**
   * Records the last input row taken for a session's stdin, so the host may
   * send more (and drop what was taken).
   *
   * @param id The session.
   * @param seq The row's sequence number.
   */
  recordInputRead(id: string, seq: number): Promise<void> {
    return this.commits.add(() => {
      statement(
        this.#outbound,
        `INSERT INTO input_read (request_id, seq) VALUES (?, ?)
           ON CONFLICT (request_id) DO UPDATE SET seq = max(seq, excluded.seq)`,
      ).run(id, seq);
    });
  }

  /**
   * Deletes a session's output chunks the host has read.
   *
   * @param id The session.
   * @param below Per stream, the first sequence number still unread.
   */
  dropChunks(id: string, below: Record<StreamName, number>): Promise<void> {
    return this.commits.add(() => {
      const query = statement(
        this.#outbound,
        "DELETE FROM chunks WHERE request_id = ? AND stream = ? AND seq < ?",
      );
      for (const stream of ["stdout", "stderr"] as const) query.run(id, stream, below[stream]);
    });
  }

  /**
   * Deletes outbound rows of requests the host acknowledged.
   *
   * @returns How many requests were deleted.
   */
  async collectAcked(): Promise<number> {
    const acked = (statement(this.#inbound, "SELECT request_id FROM acks LIMIT 512").all() as {
      request_id: string;
    }[]).map((row) => row.request_id);
    if (acked.length === 0) return 0;
    const present = [...idsWithOutboundRows(this.#outbound, acked)];
    if (present.length === 0) return 0;
    await this.commits.add(() => {
      const statements = ["states", "chunks", "results", "input_read"].map((table) =>
        statement(this.#outbound, `DELETE FROM ${table} WHERE request_id = ?`)
      );
      for (const id of present) for (const query of statements) query.run(id);
    });
    return present.length;
  }

  /**
   * Records that requests were seen (durable with the next group commit).
   *
   * @param ids Requests.
   * @param bootId This runner's boot id.
   */
  accept(ids: string[], bootId: string): Promise<void> {
    return this.commits.add(() => {
      const query = statement(
        this.#outbound,
        "INSERT OR IGNORE INTO states (request_id, state, boot_id, accepted_at) VALUES (?, 'accepted', ?, ?)",
      );
      const now = Date.now();
      for (const id of ids) query.run(id, bootId, now);
    });
  }

  /**
   * Makes "started" durable. The runner awaits this before it starts the
   * process, which is what makes a crash reportable as `interrupted`.
   *
   * @param id The request.
   * @param bootId This runner's boot id.
   */
  start(id: string, bootId: string, seq: number): Promise<void> {
    return this.commits.add(() => {
      const now = Date.now();
      statement(
        this.#outbound,
        "UPDATE meta SET max_started_seq = max(max_started_seq, ?) WHERE id = 1",
      ).run(seq);
      statement(
        this.#outbound,
        `INSERT INTO states (request_id, state, boot_id, accepted_at, started_at)
         VALUES (?1, 'started', ?2, ?3, ?3)
         ON CONFLICT (request_id) DO UPDATE SET state = 'started', boot_id = ?2, started_at = ?3`,
      ).run(id, bootId, now);
    });
  }

  /**
   * Appends output chunks (durable with the next group commit).
   *
   * @param id The request.
   * @param chunks Chunks with their per-stream sequence numbers.
   */
  appendChunks(
    id: string,
    chunks: { stream: StreamName; seq: number; data: Uint8Array }[],
  ): Promise<void> {
    if (chunks.length === 0) return Promise.resolve();
    return this.commits.add(() => {
      const query = statement(
        this.#outbound,
        "INSERT INTO chunks (request_id, stream, seq, data) VALUES (?, ?, ?, ?)",
      );
      for (const chunk of chunks) query.run(id, chunk.stream, chunk.seq, chunk.data);
    });
  }

  /**
   * Writes a request's result (exactly once; a second result is an error).
   *
   * @param result The result.
   */
  finish(result: ExecResult): Promise<void> {
    return this.commits.add(() => {
      statement(
        this.#outbound,
        "INSERT INTO results (request_id, body, created_at) VALUES (?, ?, ?)",
      ).run(result.requestId, JSON.stringify(result), Date.now());
      statement(this.#outbound, "UPDATE states SET state = 'done' WHERE request_id = ?").run(
        result.requestId,
      );
    });
  }

  /**
   * Writes a heartbeat (the first one and the last; the heartbeat worker
   * writes those in between).
   *
   * @param beat The heartbeat.
   */
  writeHeartbeat(beat: Heartbeat): void {
    writeHeartbeatFile(this.paths.heartbeat, beat);
  }

  /** Commits what is queued and closes both connections. */
  close(): void {
    try {
      this.commits.flush();
    } finally {
      this.#bell.close();
      this.#inbound.close();
      this.#outbound.close();
    }
  }

  #maxStartedSeq(): number {
    const row = statement(this.#outbound, "SELECT max_started_seq AS seq FROM meta WHERE id = 1")
      .get() as { seq: number } | undefined;
    return row?.seq ?? 0;
  }

  #inboundRead<T>(read: () => T): T {
    try {
      this.#inbound.exec("BEGIN");
      const value = read();
      this.#inbound.exec("COMMIT");
      return value;
    } catch (cause) {
      if (this.#inbound.isTransaction) this.#inbound.exec("ROLLBACK");
      if (cause instanceof QueueError) throw cause;
      throw new QueueError(`Cannot read inbound.db: ${messageOf(cause)}`, { cause });
    }
  }

  #readRequests(sql: string, ...params: (number | string)[]): InboundRequest[] {
    let rows: Record<string, unknown>[];
    try {
      rows = statement(this.#inbound, sql).all(...params) as Record<string, unknown>[];
    } catch (cause) {
      throw new QueueError(`Cannot read inbound.db: ${messageOf(cause)}`, { cause });
    }
    return rows.map((row) => {
      const request: InboundRequest = {
        seq: Number(row.seq),
        id: String(row.id),
        toolUseId: String(row.tool_use_id),
        payload: undefined,
      };
      try {
        const parsed = execPayloadSchema.safeParse(JSON.parse(String(row.payload)));
        if (parsed.success) request.payload = parsed.data;
        else request.invalid = parsed.error.issues[0]?.message ?? "invalid payload";
      } catch {
        request.invalid = "payload is not JSON";
      }
      return request;
    });
  }
}

// The host's file, read-only: a host that died mid-commit leaves a journal
// only the next host rolls back, and a commit in flight can look like one for
// a moment. Retried briefly; the runner's poll retries any later read.
function openInbound(path: string): DatabaseSync {
  for (let attempt = 1;; attempt++) {
    try {
      return openDatabase(path, { role: "reader" });
    } catch (error) {
      if (!(error instanceof QueueError) || attempt >= 20) throw error;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50 * attempt);
    }
  }
}

// Requests this runner may serve: bound to its generation (or to none yet),
// not acknowledged, and not given up on by the host.
const ELIGIBLE = `SELECT seq, id, tool_use_id, payload FROM requests r
  WHERE (generation IS NULL OR generation = ?) AND ${OPEN_REQUEST}`;

// Opens (creating with a fresh generation) the runner's own file. One that is
// not a usable waffle outbound file is renamed aside, never repaired.
function openOutbound(path: string): DatabaseSync {
  // SQLite opens these by name: a link, FIFO or socket there (or a second
  // link to the database) would make every start fail or hang. WAL files are
  // never waffle's.
  setAsideUnlessRegular(`${path}-journal`);
  for (const suffix of ["-wal", "-shm"]) {
    setAsideUnlessRegular(`${path}${suffix}`, { always: true });
  }
  const schema = `${OUTBOUND_SCHEMA}
    INSERT INTO meta (id, generation, max_started_seq) VALUES (1, '${crypto.randomUUID()}', 0);`;
  try {
    const db = openDatabase(path, { role: "owner", schema });
    if (
      hasSchema(db, OUTBOUND_SCHEMA) &&
      statement(db, "SELECT 1 AS hit FROM meta WHERE id = 1").get() !== undefined
    ) return db;
    db.close();
  } catch (error) {
    if (!(error instanceof QueueError)) throw error;
  }
  const aside = `${path}.damaged-${Date.now()}`;
  for (const suffix of ["", "-journal"]) {
    try {
      Deno.renameSync(`${path}${suffix}`, `${aside}${suffix}`);
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    }
  }
  return openDatabase(path, { role: "owner", schema });
}

/**
 * Renames a name in the runner's own directory out of the way unless it is
 * a regular file with one link (or `anyLinks`), so that opening it by name
 * can neither follow a link nor block on a FIFO. Nothing is deleted.
 *
 * @param path A file in the runner's directory.
 * @param options `always`: set aside whatever is there; `anyLinks`: a
 *   regular file with several links is fine.
 */
export function setAsideUnlessRegular(
  path: string,
  options: { always?: boolean; anyLinks?: boolean } = {},
): void {
  let info: Deno.FileInfo;
  try {
    info = Deno.lstatSync(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return;
    throw error;
  }
  if (!options.always && info.isFile && (options.anyLinks || info.nlink === 1)) return;
  Deno.renameSync(path, `${path}.damaged-${Date.now()}`);
}
