/**
 * The accept loop every HTTP listener of waffle runs: it admits a
 * connection only under the caps (open connections in all, and from its
 * peer) and closes any other as soon as it is accepted, so a flood of
 * connections never takes the file descriptors the admitted ones and
 * their sessions need. A failed accept (EMFILE when the process is out of
 * file descriptors, ENFILE, ENOBUFS) does not end the loop: it backs off
 * (until a connection ends, or a moment passes) and accepts again, and
 * says so in one line.
 *
 * @module
 */
import { oneLineOf } from "../errors.ts";
import type { HttpLimits } from "./limits.ts";
import { peerOf } from "./peer.ts";

/** The first wait after a failed accept; it doubles while accepting fails. */
const MIN_BACKOFF_MS = 10;
/** The longest wait between two tries of a failing accept. */
const MAX_BACKOFF_MS = 1000;
/** One notice of a kind at most this often: a flood is never a flood of lines. */
const NOTICE_EVERY_MS = 60_000;

/** Options of {@linkcode acceptConnections}. */
export interface AcceptLoopOptions {
  /** The caps. */
  limits: Pick<HttpLimits, "maxConnections" | "maxConnectionsPerPeer">;
  /**
   * Takes an admitted connection. `release` must be called once it is
   * closed (again is harmless): its place is free from then on.
   */
  onConnection: (conn: Deno.Conn, release: () => void) => void;
  /** One line when accepting fails or connections are refused (at most one a minute of each). */
  onEvent?: ((line: string) => void) | undefined;
}

/** A running accept loop. */
export interface AcceptLoop {
  /** Resolves once the loop has stopped. */
  readonly done: Promise<void>;
  /** Connections admitted and not yet released. */
  openCount(): number;
  /**
   * Waits until every admitted connection is released, for at most `ms`.
   *
   * @returns Whether they all were.
   */
  drained(ms: number): Promise<boolean>;
  /** Stops accepting: closes the listener. Admitted connections are left to their owner. */
  stop(): void;
}

/**
 * Runs the accept loop of `listener` until {@linkcode AcceptLoop.stop}.
 *
 * @example
 * ```ts ignore
 * const loop = acceptConnections(Deno.listen({ port: 0 }), {
 *   limits: { maxConnections: 128, maxConnectionsPerPeer: 32 },
 *   onConnection: (conn, release) => serveConnection(conn).finally(release),
 * });
 * loop.stop();
 * await loop.done;
 * ```
 *
 * @param listener What to accept from; it is closed on stop.
 * @param options The caps, what takes a connection, and where notices go.
 * @returns The running loop.
 */
export function acceptConnections(listener: Deno.Listener, options: AcceptLoopOptions): AcceptLoop {
  const state: LoopState = {
    listener,
    options,
    open: 0,
    byPeer: new Map(),
    stopped: false,
    wake: undefined,
    onDrained: new Set(),
    acceptFailed: new Notice(options.onEvent),
    refused: new Notice(options.onEvent),
  };
  const done = run(state);
  return {
    done,
    openCount: () => state.open,
    drained: (ms) => drained(state, ms),
    stop: () => {
      if (state.stopped) return;
      state.stopped = true;
      state.wake?.();
      try {
        listener.close();
      } catch {
        // Already closed.
      }
    },
  };
}

interface LoopState {
  readonly listener: Deno.Listener;
  readonly options: AcceptLoopOptions;
  open: number;
  readonly byPeer: Map<string, number>;
  stopped: boolean;
  /** Ends the current back-off wait early (a connection ended, or the loop stops). */
  wake: (() => void) | undefined;
  /** Called when the last admitted connection is released. */
  readonly onDrained: Set<() => void>;
  readonly acceptFailed: Notice;
  readonly refused: Notice;
}

async function run(state: LoopState): Promise<void> {
  let backoff = 0;
  while (!state.stopped) {
    let conn: Deno.Conn;
    try {
      conn = await state.listener.accept();
    } catch (error) {
      if (state.stopped) break;
      backoff = Math.min(MAX_BACKOFF_MS, Math.max(MIN_BACKOFF_MS, backoff * 2));
      state.acceptFailed.note(
        `cannot accept a connection: ${oneLineOf(error)}; accepting again once one ends`,
      );
      await backOff(state, backoff);
      continue;
    }
    backoff = 0;
    admit(state, conn);
  }
}

/** Hands `conn` on when it is under the caps, else closes it at once. */
function admit(state: LoopState, conn: Deno.Conn): void {
  const { maxConnections, maxConnectionsPerPeer } = state.options.limits;
  const peer = peerOf(hostnameOf(conn.remoteAddr));
  const fromPeer = state.byPeer.get(peer) ?? 0;
  if (state.open >= maxConnections || fromPeer >= maxConnectionsPerPeer) {
    closeQuietly(conn);
    state.refused.note(
      state.open >= maxConnections
        ? `closed a new connection from ${peer}: ${state.open} are open, the most allowed`
        : `closed a new connection from ${peer}: ${fromPeer} are open from it, the most allowed from one peer`,
    );
    return;
  }
  state.open++;
  state.byPeer.set(peer, fromPeer + 1);
  // Without it a small answer on a kept-alive connection waits for the
  // client's delayed ACK (Nagle): about 40 ms per request.
  if (conn.remoteAddr.transport === "tcp") (conn as Deno.TcpConn).setNoDelay(true);
  let released = false;
  const release = (): void => {
    if (released) return;
    released = true;
    state.open--;
    const left = (state.byPeer.get(peer) ?? 1) - 1;
    if (left > 0) state.byPeer.set(peer, left);
    else state.byPeer.delete(peer);
    state.wake?.();
    if (state.open === 0) { for (const resolve of [...state.onDrained]) resolve(); }
  };
  try {
    state.options.onConnection(conn, release);
  } catch {
    closeQuietly(conn);
    release();
  }
}

/** Waits `ms`, or less when a connection ends or the loop stops. */
function backOff(state: LoopState, ms: number): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(finish, ms);
    function finish(): void {
      clearTimeout(timer);
      state.wake = undefined;
      resolve();
    }
    state.wake = finish;
  });
}

function drained(state: LoopState, ms: number): Promise<boolean> {
  if (state.open === 0) return Promise.resolve(true);
  return new Promise((resolve) => {
    const finish = (all: boolean): void => {
      clearTimeout(timer);
      state.onDrained.delete(done);
      resolve(all);
    };
    const done = (): void => finish(true);
    const timer = Number.isFinite(ms) ? setTimeout(() => finish(false), ms) : undefined;
    state.onDrained.add(done);
  });
}

function hostnameOf(addr: Deno.Addr): string {
  return "hostname" in addr ? addr.hostname : "";
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // Already closed.
  }
}

/** One line per kind of trouble at most once a minute, with how often it was seen meanwhile. */
class Notice {
  readonly #onEvent: ((line: string) => void) | undefined;
  #last = -Infinity;
  #unsaid = 0;

  constructor(onEvent: ((line: string) => void) | undefined) {
    this.#onEvent = onEvent;
  }

  note(line: string): void {
    const now = Date.now();
    if (now - this.#last < NOTICE_EVERY_MS) {
      this.#unsaid++;
      return;
    }
    const since = this.#unsaid === 0 ? "" : ` (${this.#unsaid} more since the last such line)`;
    this.#last = now;
    this.#unsaid = 0;
    this.#onEvent?.(`${line}${since}`);
  }
}
