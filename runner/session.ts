/**
 * The runner's side of a session: feeds the process's stdin from the host's
 * `input` rows, holds its output to a window the host has acknowledged, and
 * ends it when the host's lease lapses, when it idles, or after the end of
 * its input.
 *
 * @module
 */
import type { SessionSpec, StreamName, TtySize } from "../lib/queue/protocol.ts";
import { SESSION_WINDOW_BYTES } from "../lib/queue/protocol.ts";
import type { RunnerQueue } from "../lib/queue/runner_queue.ts";
import { messageOf } from "../lib/queue/connection.ts";
import type { RunnerChannel } from "../lib/queue/channel.ts";
import { logLine } from "./log.ts";

/** After the end of its input, a server gets this long to exit by itself. */
export const END_GRACE_MS = 2000;
/** How often the lease and idle limits are checked. */
const CHECK_MS = 500;
/** A check this late means the runner did not run (a paused sandbox's freeze). */
const STALL_MS = 2000;

/** One running session's feed and watchdog. */
export class SessionFeed {
  #rowStdin: ReadableStream<Uint8Array>;
  #channel: RunnerChannel | undefined;
  #channelStdin: ReadableStream<Uint8Array> | undefined;
  /** Why the watchdog ended the session; undefined while it runs. */
  endedBecause: string | undefined;
  /** Called when the host sets a new window size (a terminal session). */
  onResize: ((size: TtySize) => void) | undefined;
  #queue: RunnerQueue;
  #id: string;
  #spec: SessionSpec;
  #abort: AbortController;
  #controller!: ReadableStreamDefaultController<Uint8Array>;
  #inputSeq = -1;
  #inputChanged: (() => void) | undefined;
  #tty: TtySize | undefined;
  #inputEnded = false;
  #lease = { value: -1, changedAt: Date.now() };
  #activeAt = Date.now();
  #checkedAt = Date.now();
  #endedAt: number | undefined;
  #written = { stdout: 0, stderr: 0 };
  // Per stream: the end offset and seq of each chunk written and not yet dropped.
  #pending: Record<StreamName, { end: number; seq: number }[]> = { stdout: [], stderr: [] };
  #read = { stdout: 0, stderr: 0 };
  #waiters = new Set<() => void>();
  #timer: ReturnType<typeof setInterval>;
  #dropping: Promise<void> | undefined;
  #dropAgain = false;
  #below: Record<StreamName, number> = { stdout: 0, stderr: 0 };

  /**
   * Starts watching a session.
   *
   * @param queue The runner's queue.
   * @param options The session id, its spec, and the abort controller that kills its tree.
   */
  constructor(
    queue: RunnerQueue,
    options: { id: string; spec: SessionSpec; abort: AbortController },
  ) {
    this.#queue = queue;
    this.#id = options.id;
    this.#spec = options.spec;
    this.#abort = options.abort;
    this.#tty = options.spec.tty;
    // Pulled: input rows are read only as fast as the process takes them,
    // and the host sends at most a window past the last row taken.
    this.#rowStdin = new ReadableStream<Uint8Array>({
      start: (controller) => {
        this.#controller = controller;
      },
      pull: () => this.#pull(),
    }, { highWaterMark: 0 });
    this.#timer = setInterval(() => this.#check(), CHECK_MS);
    options.abort.signal.addEventListener("abort", () => this.stop(), { once: true });
  }

  /**
   * The window size the host last set (the spec's until it sets one): a
   * terminal opened after the feed started opens at this size, since a
   * change the feed saw before then had no terminal to go to.
   */
  get ttySize(): TtySize | undefined {
    return this.#tty;
  }

  /** The session's stdin: from the channel once there is one, else from the host's input rows. */
  get stdin(): ReadableStream<Uint8Array> {
    return this.#channelStdin ?? this.#rowStdin;
  }

  /**
   * Streams this session over the host's socket: stdin from it, output to
   * it (its backpressure is the window), closed when the session stops.
   *
   * @param channel The connected channel.
   */
  useChannel(channel: RunnerChannel): void {
    this.#channel = channel;
    const reader = channel.stdin.getReader();
    this.#channelStdin = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        let next: ReadableStreamReadResult<Uint8Array>;
        try {
          next = await reader.read();
        } catch (error) {
          // Input cut short is no end of input: the session ends (its tree
          // killed, its result saying why) and its stdin never does, so the
          // process cannot take what it got for the whole.
          this.#end(`its input was cut short: ${messageOf(error)}`);
          return new Promise<void>(() => {});
        }
        const { value, done } = next;
        if (done) {
          this.#inputEnded = true;
          this.#endedAt = Date.now();
          controller.close();
          return;
        }
        this.#activeAt = Date.now();
        // As for rows: a resize made before this input is applied first.
        this.#syncTtyQuietly();
        controller.enqueue(value);
      },
    }, { highWaterMark: 0 });
  }

  /** Reads the lease and window size rows and wakes the input; called whenever inbound.db changed. */
  poll(): void {
    try {
      const lease = this.#queue.sessionLease(this.#id);
      if (lease !== undefined && lease.lease !== this.#lease.value) {
        this.#lease = { value: lease.lease, changedAt: Date.now() };
        this.#acknowledge({ stdout: lease.stdout, stderr: lease.stderr });
      }
      this.#syncTty();
    } catch (error) {
      // Retried on the next change or check.
      logLine(`cannot read session '${this.#id}' rows yet: ${messageOf(error)}`);
    }
    this.#inputChanged?.();
  }

  // A terminal's size as the host last set it, applied when it changed.
  #syncTty(): void {
    if (this.#tty === undefined) return;
    const size = this.#queue.ttySize(this.#id);
    if (size !== undefined && (size.rows !== this.#tty.rows || size.cols !== this.#tty.cols)) {
      this.#tty = size;
      this.#activeAt = Date.now();
      this.onResize?.(size);
    }
  }

  #syncTtyQuietly(): void {
    try {
      this.#syncTty();
    } catch (error) {
      logLine(`cannot read session '${this.#id}' size yet: ${messageOf(error)}`);
    }
  }

  // The next rows for the process's stdin, waiting for the host to send them.
  async #pull(): Promise<void> {
    while (!this.#inputEnded && !this.#abort.signal.aborted) {
      let rows: { seq: number; data: Uint8Array | null }[] = [];
      try {
        // A resize the host made before this input is applied before the
        // process reads it, though the runner's loop may not have polled yet.
        this.#syncTty();
        rows = this.#queue.sessionInput(this.#id, this.#inputSeq);
      } catch (error) {
        logLine(`cannot read session '${this.#id}' input yet: ${messageOf(error)}`);
      }
      if (rows.length > 0) {
        this.#take(rows);
        return;
      }
      // Woken by the next inbound change (poll) or the watchdog's check.
      await new Promise<void>((resolve) => {
        this.#inputChanged = resolve;
      });
      this.#inputChanged = undefined;
    }
  }

  #take(rows: { seq: number; data: Uint8Array | null }[]): void {
    for (const row of rows) {
      this.#inputSeq = row.seq;
      this.#activeAt = Date.now();
      if (row.data === null) {
        this.#inputEnded = true;
        this.#endedAt = Date.now();
        this.#closeStdin();
        break;
      }
      this.#enqueue(row.data);
    }
    this.#queue.recordInputRead(this.#id, this.#inputSeq).catch((error) => {
      logLine(`cannot record session '${this.#id}' input read: ${messageOf(error)}`);
    });
  }

  /**
   * Counts output about to be written and waits while more than the window
   * is unread by the host. Resolves at once when the session is stopping.
   *
   * @param stream The stream.
   * @param seq The chunk's sequence number.
   * @param bytes The chunk's size.
   */
  async admit(stream: StreamName, seq: number, bytes: number): Promise<void> {
    this.#activeAt = Date.now();
    if (this.#channel !== undefined) return;
    this.#written[stream] += bytes;
    this.#pending[stream].push({ end: this.#written[stream], seq });
    while (
      this.#written[stream] - this.#read[stream] > SESSION_WINDOW_BYTES &&
      !this.#abort.signal.aborted
    ) {
      await new Promise<void>((resolve) => this.#waiters.add(resolve));
    }
  }

  /** Stops the watchdog and releases every waiter (the session is over). */
  stop(): void {
    clearInterval(this.#timer);
    // A host that stopped reading must not hold a write of a dead session.
    if (this.#abort.signal.aborted) this.#channel?.close();
    this.#closeStdin();
    this.#inputChanged?.();
    for (const wake of this.#waiters) wake();
    this.#waiters.clear();
  }

  // The process may have closed its stdin (the pipe is cancelled): drop the rest.
  #enqueue(data: Uint8Array): void {
    try {
      this.#controller.enqueue(data);
    } catch {
      // Nobody reads this stdin any more.
    }
  }

  #closeStdin(): void {
    try {
      this.#controller.close();
    } catch {
      // Already closed.
    }
  }

  // The host read this much: drop those chunks and let the pumps go on.
  #acknowledge(read: Record<StreamName, number>): void {
    let drop = false;
    for (const stream of ["stdout", "stderr"] as const) {
      const known = Math.min(read[stream], this.#written[stream]);
      this.#read[stream] = Math.max(this.#read[stream], known);
      const pending = this.#pending[stream];
      while (pending.length > 0 && pending[0]!.end <= this.#read[stream]) {
        this.#below[stream] = pending.shift()!.seq + 1;
        drop = true;
      }
    }
    if (drop) this.#drop();
    for (const wake of this.#waiters) wake();
    this.#waiters.clear();
  }

  // One delete at a time, always up to the newest acknowledged chunk.
  #drop(): void {
    if (this.#dropping !== undefined) {
      this.#dropAgain = true;
      return;
    }
    this.#dropping = this.#queue.dropChunks(this.#id, { ...this.#below }).catch((error) => {
      logLine(`cannot drop read output of '${this.#id}': ${messageOf(error)}`);
    }).finally(() => {
      this.#dropping = undefined;
      if (this.#dropAgain) {
        this.#dropAgain = false;
        this.#drop();
      }
    });
  }

  #check(): void {
    const now = Date.now();
    // Time this runner did not run (its sandbox paused, then resumed) is no
    // time its host failed to renew, nor idleness: the limits resume where
    // they stood, and the lease is read again first.
    const stalled = now - this.#checkedAt - CHECK_MS;
    this.#checkedAt = now;
    if (stalled > STALL_MS) {
      this.#lease.changedAt += stalled;
      this.#activeAt += stalled;
      if (this.#endedAt !== undefined) this.#endedAt += stalled;
      this.poll();
      return;
    }
    const grace = this.#spec.endGraceMs ?? END_GRACE_MS;
    // Lease and idle are timed by this runner's clock alone.
    if (now - this.#lease.changedAt > this.#spec.leaseMs) {
      this.#end(`its host stopped renewing the lease for ${this.#spec.leaseMs} ms`);
    } else if (now - this.#activeAt > this.#spec.idleMs) {
      this.#end(`it was idle for ${this.#spec.idleMs} ms`);
    } else if (this.#endedAt !== undefined && grace > 0 && now - this.#endedAt > grace) {
      this.#end(`it did not exit within ${grace} ms of the end of its input`);
    }
    this.#inputChanged?.();
  }

  #end(why: string): void {
    if (this.#abort.signal.aborted) return;
    this.endedBecause = `Session ended: ${why}`;
    this.#abort.abort("cancel");
  }
}
