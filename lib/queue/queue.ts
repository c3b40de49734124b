/**
 * The host side of a queue: submit, wait, stream, cancel, re-attach. Writes
 * only `inbound.db`; reads `outbound.db` as untrusted input.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { z } from "zod";
import { concat } from "../bytes.ts";
import { ProtocolError, QueueError, RunnerError, UsageError } from "../errors.ts";
import { dataVersion, isBusyError, messageOf, openDatabase, statement } from "./connection.ts";
import { GroupCommit } from "./group_commit.ts";
import {
  type ChunkCursor,
  idsWithOutboundRows,
  newCursor,
  readChunks,
  readHeartbeat,
  readInFlight,
  readResult,
  readState,
} from "./outbound_rows.ts";
import {
  DEFAULT_OUTPUT_CAP,
  type ExecPayload,
  execPayloadSchema,
  type ExecResult,
  type Heartbeat,
  HEARTBEAT_INTERVAL_MS,
  MAX_STDIN_BYTES,
  type OutputChunk,
  type RequestState,
} from "./protocol.ts";
import { initQueue, type QueuePaths, queuePaths } from "./schema.ts";
import { Bell, ChangeWatcher } from "./watch.ts";

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
}

/** Options for {@linkcode Queue.open}. */
export interface QueueOpenOptions {
  /** Create the directory and files when missing. */
  create?: boolean;
  /** Fallback poll interval in milliseconds. */
  pollMs?: number;
}

/** Options for waiting on a request. */
export interface WaitOptions {
  /** Aborts the wait (not the request). */
  signal?: AbortSignal;
  /**
   * Called when the runner looks gone (heartbeat older than twice its
   * interval, or the runner said it exited) while the request is unfinished.
   * A backend restarts its runner here. Without it, the wait fails after
   * `staleAfterMs`.
   */
  revive?: () => Promise<void>;
  /** How old a heartbeat may get before a wait without `revive` fails. Default 10 s. */
  staleAfterMs?: number;
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
  #outbound: DatabaseSync;
  #commits: GroupCommit;
  #bell: Bell;
  #watcher: ChangeWatcher;
  #listeners = new Set<() => void>();
  #pumping = false;
  #closed = new AbortController();
  #caps = new Map<string, number>();

  private constructor(paths: QueuePaths, options: QueueOpenOptions) {
    this.paths = paths;
    this.#inbound = openDatabase(paths.inbound, { role: "owner" });
    try {
      this.#outbound = openDatabase(paths.outbound, { role: "reader" });
    } catch (error) {
      this.#inbound.close();
      throw error;
    }
    this.#bell = new Bell(paths.inboundBell);
    this.#commits = new GroupCommit(this.#inbound, { bell: this.#bell });
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
    const paths = options.create ? initQueue(dir) : queuePaths(dir);
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
   *
   * @param options What to run.
   * @returns The request id; the request is durable when this resolves.
   * @throws {UsageError} When the request is invalid (nothing is written).
   */
  submit(options: SubmitOptions): Promise<string> {
    const payload = buildPayload(options);
    const id = crypto.randomUUID();
    const toolUseId = options.toolUseId ?? id;
    if (!ID_PATTERN.test(toolUseId)) {
      return Promise.reject(
        new UsageError(`Invalid tool-use id '${toolUseId}': use 1-128 of A-Z a-z 0-9 . _ : -`),
      );
    }
    const body = JSON.stringify(payload);
    return this.#commits.add(() => {
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
        `INSERT INTO requests (id, tool_use_id, kind, payload, timeout_ms, created_at)
         VALUES (?, ?, 'exec', ?, ?, ?)`,
      ).run(id, toolUseId, body, payload.timeoutMs ?? null, Date.now());
      return id;
    }).then((assigned) => {
      this.#caps.set(assigned, payload.outputCap ?? DEFAULT_OUTPUT_CAP);
      return assigned;
    });
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
  }

  /**
   * Tells the runner the result was consumed, so it may delete the outbound
   * rows; {@linkcode Queue.gc} then deletes the inbound ones.
   *
   * @param id The request.
   */
  async ack(id: string): Promise<void> {
    await this.#commits.add(() =>
      statement(this.#inbound, "INSERT OR IGNORE INTO acks (request_id, created_at) VALUES (?, ?)")
        .run(id, Date.now())
    );
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
    const present = this.#guard("", () => idsWithOutboundRows(this.#outbound, acked));
    const gone = acked.filter((id) => !present.has(id));
    if (gone.length === 0) return 0;
    await this.#commits.add(() => {
      const statements = ["requests WHERE id", "cancels WHERE request_id", "acks WHERE request_id"]
        .map((target) => statement(this.#inbound, `DELETE FROM ${target} = ?`));
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
   */
  state(id: string): { state: RequestState; result?: ExecResult } {
    this.#requireRequest(id);
    return this.#guard(id, () => {
      const result = readResult(this.#outbound, id);
      if (result !== undefined) return { state: "done" as const, result };
      return { state: readState(this.#outbound, id) };
    });
  }

  /**
   * The runner's last heartbeat.
   *
   * @returns The heartbeat, or undefined when no runner ever wrote a valid one.
   */
  heartbeat(): Heartbeat | undefined {
    try {
      return readHeartbeat(this.#outbound);
    } catch {
      return undefined;
    }
  }

  /**
   * Requests the runner has started and not finished (from any host).
   *
   * @returns Their ids; empty when the runner is idle or unreadable.
   */
  inFlight(): string[] {
    try {
      return readInFlight(this.#outbound);
    } catch {
      return [];
    }
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
    while (true) {
      const version = dataVersion(this.#outbound);
      let result: ExecResult | undefined;
      const pages: OutputChunk[][] = [];
      try {
        // Read the result first: the runner commits the last chunks with it,
        // so once the result is visible every chunk is too.
        result = this.#guard(id, () => readResult(this.#outbound, id));
        for (
          let page = this.#page(id, cursor, cap);
          page.length > 0;
          page = this.#page(id, cursor, cap)
        ) {
          pages.push(page);
        }
      } catch (error) {
        if (!isBusyError(error)) throw error;
      }
      for (const page of pages) yield* page;
      if (result !== undefined) return result;
      this.#refuseCollected(id);
      await this.#changedSince(version, options);
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
    while (true) {
      const version = dataVersion(this.#outbound);
      let result: ExecResult | undefined;
      try {
        result = this.#guard(id, () => readResult(this.#outbound, id));
      } catch (error) {
        if (!isBusyError(error)) throw error;
      }
      if (result !== undefined) return result;
      this.#refuseCollected(id);
      await this.#changedSince(version, options);
    }
  }

  /**
   * Waits for a request and gathers its whole output.
   *
   * @param id The request.
   * @param options Abort signal and runner revival.
   * @returns Result, stdout and stderr.
   */
  async collect(id: string, options: WaitOptions = {}): Promise<Collected> {
    const parts: Record<"stdout" | "stderr", Uint8Array[]> = { stdout: [], stderr: [] };
    const stream = this.output(id, options);
    let next = await stream.next();
    while (!next.done) {
      parts[next.value.stream].push(next.value.data);
      next = await stream.next();
    }
    return { result: next.value, stdout: concat(parts.stdout), stderr: concat(parts.stderr) };
  }

  /** Closes both connections and the watcher. */
  close(): void {
    this.#closed.abort();
    this.#commits.flush();
    this.#watcher.close();
    this.#bell.close();
    this.#inbound.close();
    this.#outbound.close();
  }

  #page(id: string, cursor: ChunkCursor, cap: number): OutputChunk[] {
    return this.#guard(id, () => readChunks(this.#outbound, id, { cursor, cap }));
  }

  #capOf(id: string): number {
    const cached = this.#caps.get(id);
    if (cached !== undefined) return cached;
    const row = statement(this.#inbound, "SELECT payload FROM requests WHERE id = ?").get(id) as
      | { payload: string }
      | undefined;
    const cap = row === undefined
      ? DEFAULT_OUTPUT_CAP
      : execPayloadSchema.parse(JSON.parse(row.payload)).outputCap ?? DEFAULT_OUTPUT_CAP;
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

  // Errors reading outbound.db belong to the request being read: the host
  // keeps serving. A lock held past busy_timeout is passed through unchanged,
  // for the wait loops to retry: it is not the request's fault.
  #guard<T>(id: string, read: () => T): T {
    try {
      return read();
    } catch (error) {
      if (error instanceof ProtocolError || isBusyError(error)) throw error;
      throw new ProtocolError(
        `Cannot read outbound.db${id ? ` for request '${id}'` : ""}: ${messageOf(error)}`,
        { cause: error },
      );
    }
  }

  // Resolves once outbound.db changed after `version` was read, checking
  // runner liveness on every wake (at least once per poll interval).
  async #changedSince(version: number, options: WaitOptions): Promise<void> {
    while (true) {
      if (options.signal?.aborted) {
        throw options.signal.reason ?? new DOMException("Aborted", "AbortError");
      }
      if (this.#closed.signal.aborted) throw new QueueError(`Queue '${this.paths.dir}' is closed`);
      if (dataVersion(this.#outbound) !== version) return;
      await this.#checkLiveness(options);
      await new Promise<void>((resolve) => {
        const listener = (): void => {
          this.#listeners.delete(listener);
          options.signal?.removeEventListener("abort", listener);
          resolve();
        };
        this.#listeners.add(listener);
        options.signal?.addEventListener("abort", listener, { once: true });
        this.#pump();
      });
    }
  }

  #lastLivenessCheck = 0;
  async #checkLiveness(options: WaitOptions): Promise<void> {
    const now = Date.now();
    if (now - this.#lastLivenessCheck < 500) return;
    this.#lastLivenessCheck = now;
    const beat = this.heartbeat();
    const age = beat === undefined ? Infinity : now - beat.time;
    const gone = beat === undefined || beat.state === "exited" || age > 2 * HEARTBEAT_INTERVAL_MS;
    if (!gone) return;
    if (options.revive !== undefined) {
      await options.revive();
      return;
    }
    const staleAfter = options.staleAfterMs ?? 10_000;
    if (beat?.state === "exited" || age > staleAfter) {
      throw new RunnerError(
        beat === undefined
          ? `No runner is serving queue '${this.paths.dir}'`
          : `The runner of queue '${this.paths.dir}' is not alive: ${
            beat.state === "exited" ? "it exited" : `last heartbeat ${Math.round(age / 1000)} s ago`
          }`,
      );
    }
  }

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

function buildPayload(options: SubmitOptions): ExecPayload {
  if ((options.argv === undefined) === (options.shell === undefined)) {
    throw new UsageError("Give exactly one of 'argv' and 'shell'");
  }
  const argv = options.argv ?? ["/bin/sh", "-c", options.shell ?? ""];
  if (argv.length === 0) throw new UsageError("Missing command: 'argv' is empty");
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
