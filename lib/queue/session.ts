/**
 * The host side of a session: a long-lived process in the sandbox whose
 * stdin and stdout stream through the queue both ways (an MCP server).
 *
 * @module
 */
import type { ExecResult, OutputChunk, SessionSpec, TtySize } from "./protocol.ts";
import { SESSION_WINDOW_BYTES } from "./protocol.ts";
import type { Queue, SubmitOptions, WaitOptions } from "./queue.ts";
import { concat, writeAll } from "../bytes.ts";
import { HostChannel, readFrames } from "./channel.ts";
import { settlesWithin } from "../async.ts";
import { ProtocolError, UsageError } from "../errors.ts";

/** Default lease: the runner ends a session whose host stops renewing for this long. */
export const SESSION_LEASE_MS = 10_000;
/** Default idle limit: no input or output for this long ends a session. */
export const SESSION_IDLE_MS = 30 * 60_000;
/** Input a session holds before sending it, at most: a writer waits past it. */
export const PENDING_INPUT_BYTES = 4 * 1024 * 1024;

/** Where a session is submitted: a queue, or a backend that ensures a runner first. */
export interface SessionTarget {
  /** The queue the session lives in. */
  readonly queue: Queue;
  /** Submits a request (a backend makes sure a runner serves the queue first). */
  submit(options: SubmitOptions): Promise<string>;
  /** Where the runner can reach a host's socket (see `channel.ts`); none: rows only. */
  readonly channelDir?: string | undefined;
}

/** What to start, and how long it may live unattended. */
export interface SessionOptions extends Omit<SubmitOptions, "session" | "stdin"> {
  /** The runner ends the session when the lease is not renewed for this long. */
  leaseMs?: number;
  /** The runner ends the session after this long with no input and no output. */
  idleMs?: number;
  /** Create the working directory when missing. */
  makeCwd?: boolean;
  /** After the end of its input the process may run this long (default 2 s; 0: on, as a command). */
  endGraceMs?: number;
  /** Run on a terminal of this size. */
  tty?: TtySize;
  /** Stream over the target's channel directory when it has one (default true); false: rows. */
  channel?: boolean;
}

/** After a result, how long a started session's channel may take to connect, or to end. */
const LATE_CONNECT_MS = 5000;

/**
 * A session opened by this host. It renews its lease while open; once this
 * process dies, the runner ends the session within the lease.
 *
 * @example
 * ```ts ignore
 * const session = await QueueSession.open(sandbox, { argv: ["cat"] });
 * await session.write(new TextEncoder().encode("hi\n"));
 * await session.end();
 * for await (const chunk of session.output()) console.log(chunk.data);
 * session.close();
 * ```
 */
export class QueueSession {
  /** The session's request id. */
  readonly id: string;
  /** The queue it lives in. */
  readonly queue: Queue;
  /** It runs on a terminal (it can be resized). */
  readonly tty: boolean;
  #read = { stdout: 0, stderr: 0 };
  #reported = { stdout: 0, stderr: 0 };
  #timer: ReturnType<typeof setInterval>;
  #renewing: Promise<void> | undefined;
  #wait: WaitOptions;
  // Input accepted and not yet sent: one commit carries all of it.
  #pending: Uint8Array[] = [];
  #pendingBytes = 0;
  #sending: Promise<void> | undefined;
  #sendError: unknown;
  #channel: HostChannel | undefined;
  // Channel writes, one after another.
  #channelWrites: Promise<void> = Promise.resolve();
  #inputGone = false;
  #drainTimer: ReturnType<typeof setTimeout> | undefined;
  #closed = false;

  private constructor(
    queue: Queue,
    id: string,
    options: {
      leaseMs: number;
      wait: WaitOptions;
      channel: HostChannel | undefined;
      tty: boolean;
      read?: { stdout: number; stderr: number };
    },
  ) {
    const { leaseMs, wait } = options;
    this.queue = queue;
    this.id = id;
    this.tty = options.tty;
    this.#wait = wait;
    this.#channel = options.channel;
    if (options.read !== undefined) {
      this.#read = { ...options.read };
      this.#reported = { ...options.read };
    }
    // Three renewals per lease: one lost to a slow commit does not end it.
    this.#timer = setInterval(() => this.#renew(), Math.max(250, Math.floor(leaseMs / 3)));
  }

  /** The socket name of the channel the session streams over; undefined when over rows. */
  get channelSocket(): string | undefined {
    return this.#channel?.spec.socket;
  }

  /**
   * Submits a session and starts renewing its lease.
   *
   * @param target A backend (or anything with a queue and `submit`).
   * @param options What to run, and the lease and idle limits.
   * @param wait How waits on the session revive its runner.
   * @returns The open session.
   */
  static async open(
    target: SessionTarget,
    options: SessionOptions,
    wait: WaitOptions = {},
  ): Promise<QueueSession> {
    const {
      leaseMs = SESSION_LEASE_MS,
      idleMs = SESSION_IDLE_MS,
      makeCwd,
      endGraceMs,
      tty,
      channel: useChannel = true,
      ...rest
    } = options;
    const channel = useChannel ? openChannel(target.channelDir) : undefined;
    const session: SessionSpec = {
      leaseMs,
      idleMs,
      ...(makeCwd ? { makeCwd } : {}),
      ...(endGraceMs === undefined ? {} : { endGraceMs }),
      ...(tty === undefined ? {} : { tty }),
      ...(channel === undefined ? {} : { channel: channel.spec }),
    };
    let id: string;
    try {
      id = await target.submit({ ...rest, session });
    } catch (error) {
      channel?.close();
      throw error;
    }
    return new QueueSession(target.queue, id, { leaseMs, wait, channel, tty: tty !== undefined });
  }

  /**
   * Takes over a session another host opened (a restarted server): renews
   * its lease and streams its output from what that host acknowledged. The
   * session must stream over rows (opened with `channel: false`): a socket
   * dies with its host.
   *
   * @param target The queue the session lives in.
   * @param id The session's request id.
   * @param wait How waits on the session revive its runner.
   * @returns The session, open again.
   * @throws {UsageError} When `id` is no session of the queue, or one on a channel.
   */
  static attach(
    target: Pick<SessionTarget, "queue">,
    id: string,
    wait: WaitOptions = {},
  ): QueueSession {
    const { spec, read } = target.queue.sessionOf(id);
    if (spec.channel !== undefined) {
      throw new UsageError(
        `Session '${id}' streams over its host's socket and ended with it: only a session opened with 'channel: false' can be taken over`,
      );
    }
    const session = new QueueSession(target.queue, id, {
      leaseMs: spec.leaseMs,
      wait,
      channel: undefined,
      tty: spec.tty !== undefined,
      read,
    });
    // At once: the runner has been counting down since the last host's renewal.
    session.#renew();
    return session;
  }

  /**
   * Sends bytes to the session's stdin. It resolves once they are accepted:
   * what is written while a commit is under way goes out together in the
   * next one (many small writes cost few commits), and a writer waits while
   * more than {@linkcode PENDING_INPUT_BYTES} are not yet sent. `end()`
   * resolves once everything is durable.
   *
   * @param data The bytes: unchanged until the write resolves (they are
   *   written from, not copied, on a channel).
   * @throws {Error} What a previous send failed with.
   */
  async write(data: Uint8Array): Promise<void> {
    if (this.#sendError !== undefined) throw this.#sendError;
    if (data.byteLength === 0) return;
    if (this.#channel !== undefined) return await this.#channelWrite(data);
    this.#pending.push(data.slice());
    this.#pendingBytes += data.byteLength;
    this.#sending ??= this.#send();
    while (this.#pendingBytes > PENDING_INPUT_BYTES && this.#sending !== undefined) {
      await this.#sending.catch(() => {});
    }
    if (this.#sendError !== undefined) throw this.#sendError;
  }

  // Sends what is pending, batch after batch, until nothing is.
  async #send(): Promise<void> {
    try {
      while (this.#pending.length > 0) {
        const batch = concat(this.#pending);
        this.#pending = [];
        this.#pendingBytes = 0;
        await this.queue.sendInput(this.id, batch, this.#wait);
      }
    } catch (error) {
      this.#sendError = error;
      this.#pending = [];
      this.#pendingBytes = 0;
    } finally {
      this.#sending = undefined;
    }
  }

  /**
   * Sets a terminal session's window size.
   *
   * @param size Rows and columns.
   */
  resize(size: TtySize): Promise<void> {
    return this.queue.resize(this.id, size);
  }

  // Waits for the runner to connect; the socket's own backpressure paces the
  // writer. A process that is gone takes no more input: the rest is dropped,
  // as rows for a closed stdin are, and its output says why.
  #channelWrite(data: Uint8Array | null): Promise<void> {
    const channel = this.#channel!;
    const written = this.#channelWrites.then(async () => {
      const conn = await channel.connection();
      if (this.#inputGone) return;
      try {
        if (data === null) await conn.closeWrite();
        else await writeAll(conn, data);
      } catch (error) {
        if (!isClosedSocket(error)) throw error;
        this.#inputGone = true;
      }
    });
    this.#channelWrites = written.catch(() => {});
    return written;
  }

  /** Sends what is pending and closes the session's stdin (a well-behaved server then exits). */
  async end(): Promise<void> {
    if (this.#channel !== undefined) return await this.#channelWrite(null);
    while (this.#sending !== undefined) await this.#sending;
    if (this.#sendError !== undefined) throw this.#sendError;
    await this.queue.sendInput(this.id, null);
  }

  /** Asks the runner to kill the session's process tree now. */
  cancel(): Promise<void> {
    return this.queue.cancel(this.id);
  }

  /**
   * Streams the session's output until it ends, acknowledging what was read
   * so the runner can go on reading the process's pipes.
   *
   * @param options `borrowed`: a chunk that came over the channel is a view
   *   valid until the next `next()` (see `readFrames`), for a reader that
   *   copies what it keeps; default a chunk of its own.
   * @returns Chunks in order; the result on the iterator's return value.
   */
  async *output(options: { borrowed?: boolean } = {}): AsyncGenerator<OutputChunk, ExecResult> {
    if (this.#channel === undefined) return yield* this.#rowOutput();
    try {
      return yield* this.#channelOutput(this.#channel, options.borrowed === true);
    } finally {
      clearInterval(this.#timer);
    }
  }

  // The output comes over the socket, the result (and nothing else: a runner
  // writing rows anyway is ignored) over the queue. A session reports its
  // result only when its output came whole, up to the runner's end frame;
  // a channel that never connected, broke or did not end is an error unless
  // the result is already a failure (cancelled or interrupted, whose
  // channel the runner closes at once, or not run).
  async *#channelOutput(
    channel: HostChannel,
    borrowed: boolean,
  ): AsyncGenerator<OutputChunk, ExecResult> {
    const rows = this.#rowOutput();
    const result = (async () => {
      let next = await rows.next();
      while (!next.done) next = await rows.next();
      return next.value;
    })();
    // Why the host gave up the channel (a flood of connections), if it did:
    // the root of a runner's "cannot connect".
    let refused: unknown;
    try {
      const first = await Promise.race([
        channel.connection().then((conn) => ({ conn }), (error) => {
          refused = error;
          return { conn: undefined };
        }),
        result.then(() => ({ conn: undefined })),
      ]);
      let conn = first.conn;
      if (conn === undefined) {
        // A result first: if the process started, the runner had connected
        // before, and this host has not taken the connection yet.
        const done = await result;
        if (done.startedAt !== null) await settlesWithin(channel.connection(), LATE_CONNECT_MS);
        conn = channel.connected;
        if (conn === undefined) {
          if (refused !== undefined) throw refused;
          if (done.startedAt === null) return done;
          throw new ProtocolError(
            `Session '${this.id}' started but its runner never connected to its channel`,
          );
        }
      }
      let failure: unknown;
      try {
        yield* this.#framesUntilCut(channel, conn, { result, borrowed });
      } catch (error) {
        failure = error;
      }
      channel.close();
      const done = await result;
      // A result that is a failure already says why; any other is no
      // success without the whole output.
      const failed = done.cancelled || done.interrupted || done.startedAt === null;
      if (failure !== undefined && !failed) throw failure;
      return done;
    } finally {
      channel.close();
    }
  }

  // The frames; once the result is in, the reads may wait LATE_CONNECT_MS
  // in all (not the reader's own time between chunks): a runner holding its
  // socket open and silent cannot keep the session alive, and a slow reader
  // loses nothing.
  async *#framesUntilCut(
    channel: HostChannel,
    conn: Deno.UnixConn,
    options: { result: Promise<unknown>; borrowed: boolean },
  ): AsyncGenerator<OutputChunk, void> {
    const { result, borrowed } = options;
    const frames = readFrames(conn, { borrowed });
    let left = LATE_CONNECT_MS;
    let resultIn = false;
    let reading = false;
    let since: number | undefined;
    let cut = false;
    const arm = (): void => {
      since = Date.now();
      this.#drainTimer = setTimeout(() => {
        cut = true;
        channel.close();
      }, left);
    };
    // One callback, never one per frame: a reaction per read on a pending
    // promise would hold every chunk read until the result.
    const arrived = (): void => {
      resultIn = true;
      if (reading && since === undefined) arm();
    };
    result.then(arrived, arrived);
    try {
      while (true) {
        reading = true;
        if (resultIn) arm();
        let next: IteratorResult<OutputChunk, void>;
        try {
          next = await frames.next();
        } finally {
          reading = false;
          clearTimeout(this.#drainTimer);
          if (since !== undefined) left = Math.max(0, left - (Date.now() - since));
          since = undefined;
        }
        if (next.done) return;
        yield next.value;
      }
    } catch (error) {
      if (!cut) throw error;
      throw new ProtocolError(
        `Session '${this.id}' did not end its output within ${LATE_CONNECT_MS} ms of its result`,
      );
    }
  }

  async *#rowOutput(): AsyncGenerator<OutputChunk, ExecResult> {
    const stream = this.queue.output(this.id, this.#wait);
    try {
      let next = await stream.next();
      while (!next.done) {
        const chunk = next.value;
        this.#read[chunk.stream] += chunk.data.byteLength;
        // Tell the runner early, before its window fills and it stops reading.
        if (this.#read[chunk.stream] - this.#reported[chunk.stream] >= SESSION_WINDOW_BYTES / 4) {
          this.#renew();
        }
        yield chunk;
        next = await stream.next();
      }
      return next.value;
    } finally {
      clearInterval(this.#timer);
    }
  }

  /** Stops renewing and acknowledges the session (its rows may go). */
  async close(): Promise<void> {
    clearInterval(this.#timer);
    this.#closed = true;
    clearTimeout(this.#drainTimer);
    this.#channel?.close();
    await this.#renewing?.catch(() => {});
    await this.queue.ack(this.id).catch(() => {});
  }

  // One renewal at a time; a failed one is retried by the next tick.
  #renew(): void {
    if (this.#renewing !== undefined) return;
    const read = { ...this.#read };
    this.#renewing = this.queue.renewLease(this.id, read).then(
      () => {
        this.#reported = read;
      },
      () => {},
    ).finally(() => {
      this.#renewing = undefined;
    });
  }
}

// A missing or too long directory means rows: slower, never wrong.
function openChannel(dir: string | undefined): HostChannel | undefined {
  if (dir === undefined) return undefined;
  try {
    return HostChannel.open(dir);
  } catch {
    return undefined;
  }
}

function isClosedSocket(error: unknown): boolean {
  return error instanceof Deno.errors.BrokenPipe || error instanceof Deno.errors.ConnectionReset ||
    error instanceof Deno.errors.NotConnected || error instanceof Deno.errors.BadResource ||
    // A write still pending when the session's end closed the socket.
    error instanceof Deno.errors.Interrupted;
}
