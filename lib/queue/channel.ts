/**
 * A session's fast channel: its stdin, stdout and stderr over a unix socket
 * instead of queue rows, so a conversation costs no durable commit per
 * message. The request (and its result) still goes through the queue: only
 * the bytes between them take the socket.
 *
 * The host listens and the runner connects, never the other way round: the
 * socket lives in a host directory of its container's own, mounted
 * read-only into it, so nothing in the sandbox can replace it, no other
 * container sees it, and the host never connects to a path the sandbox
 * could point elsewhere. Whoever connects must first send the session's
 * token (which only inbound.db carries); the host takes one such
 * connection, acknowledges it and removes the socket. A silent peer holds
 * no handshake slot the runner needs: at the cap the newest connection
 * replaces the oldest. What the runner sends is untrusted: framed, each
 * frame capped at {@linkcode MAX_CHUNK_BYTES}, read only as fast as the
 * host's reader takes it.
 *
 * Wire: runner → host, the token line, then frames `[stream u8][length
 * u32 BE][bytes]` (1 stdout, 2 stderr), then the end frame `[0][0]`; host →
 * runner, the acknowledgement byte {@linkcode ACK_BYTE}, then raw stdin
 * bytes, the end of input being the end of the host's writing half. Both
 * sides move data only once acknowledged, and a connection that ends any
 * other way (a reset, a close before the end frame) is an error, never an
 * end: a session never passes for having moved data it did not.
 *
 * @module
 */
import {
  CHANNEL_SOCKET_PATTERN,
  CHANNEL_TOKEN_PATTERN,
  MAX_CHUNK_BYTES,
  type OutputChunk,
  type SessionSpec,
  type StreamName,
} from "./protocol.ts";
import { ProtocolError } from "../errors.ts";
import { writeAll } from "../bytes.ts";
import { messageOf } from "./connection.ts";

/** The channel's part of a session request: the socket's name and the token to show. */
export type ChannelSpec = NonNullable<SessionSpec["channel"]>;

/** Longest host path of a channel socket the kernel takes. */
const MAX_SOCKET_PATH = 107;
/** How long a connection may take to show its token. */
const HANDSHAKE_MS = 2000;
/** Connections showing their token at once; a newer one replaces the oldest. */
const MAX_HANDSHAKES = 8;
/** What the host sends a connection that showed the token, before any stdin. */
export const ACK_BYTE = 0x06;
/** How long the runner waits for the host's acknowledgement, by default. */
export const ACK_MS = 10_000;
/** Connections the runner makes before it gives up on a host that closed them unacknowledged. */
const CONNECT_ATTEMPTS = 3;
/** Connections with a wrong token before the host gives up the channel. */
const MAX_BAD_CONNECTIONS = 64;
/** A socket older than this with nobody accepting on it is a dead host's: removed. */
const STALE_SOCKET_MS = 10 * 60_000;
const HEADER_BYTES = 5;
/** The runner's read size for a session's stdin (a socket's buffer holds about 200 KiB). */
const STDIN_READ_BYTES = 256 * 1024;
const STREAM_CODES: Record<StreamName, number> = { stdout: 1, stderr: 2 };
/** The runner's last frame: stream 0, length 0 (no data frame is empty). */
const END_FRAME = new Uint8Array(HEADER_BYTES);

/**
 * The host's end: a listener that takes the one connection showing the
 * token, then the framed output it carries and a writer for the stdin.
 */
export class HostChannel {
  /** What the request tells the runner. */
  readonly spec: ChannelSpec;
  #listener: Deno.UnixListener;
  #path: string;
  #connected: Promise<Deno.UnixConn>;
  // The connection that showed the token; #conn once it is acknowledged.
  #claimed: Deno.UnixConn | undefined;
  #conn: Deno.UnixConn | undefined;
  #closed = false;

  private constructor(listener: Deno.UnixListener, path: string, spec: ChannelSpec) {
    this.#listener = listener;
    this.#path = path;
    this.spec = spec;
    this.#connected = this.#accept();
    // Awaited by whoever uses the connection; a failure here is theirs to report.
    this.#connected.catch(() => {});
  }

  /**
   * Listens on a new socket in `dir` (its container's own channel
   * directory, mounted read-only into it).
   *
   * @param dir The host's channel directory.
   * @returns The channel, or undefined when `dir`'s path is too long for a socket.
   */
  static open(dir: string): HostChannel | undefined {
    const name = `${hex(8)}.s`;
    const path = `${dir}/${name}`;
    if (new TextEncoder().encode(path).byteLength > MAX_SOCKET_PATH) return undefined;
    removeStale(dir);
    const listener = Deno.listen({ transport: "unix", path });
    // Root's runner connects as the owner; another host user's through the
    // group the container is given (see GroupAdd in posture.ts).
    Deno.chmodSync(path, Deno.uid() === 0 ? 0o600 : 0o660);
    return new HostChannel(listener, path, { socket: name, token: hex(32) });
  }

  /** Resolves with the runner's connection once it showed the token and was acknowledged. */
  connection(): Promise<Deno.UnixConn> {
    return this.#connected;
  }

  /** The connection if the runner has made it (and it was acknowledged). */
  get connected(): Deno.UnixConn | undefined {
    return this.#conn;
  }

  /** Stops listening and closes the connection. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#stopListening();
    if (this.#claimed !== undefined) closeQuietly(this.#claimed);
  }

  #stopListening(): void {
    try {
      this.#listener.close();
    } catch {
      // Closed already.
    }
    try {
      Deno.removeSync(this.#path);
    } catch {
      // Gone already.
    }
  }

  async #accept(): Promise<Deno.UnixConn> {
    const expected = new TextEncoder().encode(`${this.spec.token}\n`);
    // Handshakes in progress, oldest first.
    const pending: Deno.UnixConn[] = [];
    let bad = 0;
    const { promise, resolve, reject } = Promise.withResolvers<Deno.UnixConn>();
    const failed = (): void => {
      if (++bad < MAX_BAD_CONNECTIONS) return;
      reject(new ProtocolError(`The channel had ${bad} connections without its token`));
      this.#stopListening();
    };
    const settle = async (conn: Deno.UnixConn, ok: boolean): Promise<void> => {
      const at = pending.indexOf(conn);
      if (at >= 0) pending.splice(at, 1);
      if (!ok) {
        closeQuietly(conn);
        // Those closed once the runner's was taken are no one's failure.
        if (this.#claimed === undefined) failed();
        return;
      }
      if (this.#claimed !== undefined || this.#closed) return closeQuietly(conn);
      this.#claimed = conn;
      this.#stopListening();
      for (const other of pending.splice(0)) closeQuietly(other);
      try {
        // Before any stdin: the runner moves nothing until it has this.
        await writeAll(conn, new Uint8Array([ACK_BYTE]));
      } catch (cause) {
        closeQuietly(conn);
        return reject(
          new ProtocolError("The channel's runner left before its acknowledgement", { cause }),
        );
      }
      this.#conn = conn;
      resolve(conn);
    };
    void (async () => {
      try {
        for await (const conn of this.#listener) {
          if (this.#claimed !== undefined) {
            closeQuietly(conn);
            continue;
          }
          // The oldest has had longest to show a token it already had: a
          // silent peer never holds the slot the runner needs. Its end
          // counts against the channel, so a connect loop cannot go on.
          if (pending.length >= MAX_HANDSHAKES) closeQuietly(pending.shift()!);
          pending.push(conn);
          void showsToken(conn, expected).then((ok) => settle(conn, ok));
        }
      } catch (error) {
        reject(error);
      }
      if (this.#claimed === undefined) {
        reject(new ProtocolError("The channel closed before the runner connected"));
      }
    })();
    try {
      return await promise;
    } finally {
      if (this.#conn === undefined) {
        this.#stopListening();
        for (const other of pending.splice(0)) closeQuietly(other);
      }
    }
  }
}

// Reads exactly the token line within HANDSHAKE_MS; anything else is a no.
async function showsToken(conn: Deno.UnixConn, expected: Uint8Array): Promise<boolean> {
  const got = new Uint8Array(expected.byteLength);
  let filled = 0;
  const timer = setTimeout(() => closeQuietly(conn), HANDSHAKE_MS);
  try {
    while (filled < got.byteLength) {
      const n = await conn.read(got.subarray(filled));
      if (n === null) return false;
      filled += n;
    }
    let diff = 0;
    for (let i = 0; i < got.byteLength; i++) diff |= got[i]! ^ expected[i]!;
    return diff === 0;
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Reads the runner's frames: stdout and stderr chunks in the order sent,
 * until the runner's end frame.
 *
 * @param conn The accepted connection.
 * @param options `borrowed`: each chunk's data is a view of the reader's one
 *   buffer, valid until the next `next()`, instead of a copy: a consumer that
 *   copies what it keeps then reads a flood with no allocation per frame
 *   (every copy is garbage V8 frees late, later still under CPU load).
 * @returns The chunks.
 * @throws {ProtocolError} On a frame of an unknown stream or over
 * {@linkcode MAX_CHUNK_BYTES}, and when the connection ends (a reset, a
 * close) before the end frame: the output may be cut, so it is not an end.
 */
export async function* readFrames(
  conn: Deno.UnixConn,
  options: { borrowed?: boolean } = {},
): AsyncGenerator<OutputChunk, void> {
  // Room for a few whole frames: one read takes what the socket holds.
  const buffer = new Uint8Array(4 * (HEADER_BYTES + MAX_CHUNK_BYTES));
  // Unparsed bytes are buffer[start, end): compacted only when a frame does
  // not fit after them, so tiny frames cost no copy each.
  let start = 0;
  let end = 0;
  const seq = { stdout: 0, stderr: 0 };
  const fill = async (want: number): Promise<void> => {
    if (start + want > buffer.byteLength) {
      buffer.copyWithin(0, start, end);
      end -= start;
      start = 0;
    }
    while (end - start < want) {
      const n = await readOrFail(conn, buffer.subarray(end));
      if (n === null) {
        throw new ProtocolError(
          end === start
            ? "The session's channel closed before the end of its output"
            : `The session's channel closed inside a frame (${end - start} bytes of it)`,
        );
      }
      end += n;
    }
  };
  while (true) {
    await fill(HEADER_BYTES);
    const code = buffer[start]!;
    const length = new DataView(buffer.buffer).getUint32(start + 1);
    if (code === 0 && length === 0) return;
    const stream = code === 1 ? "stdout" : code === 2 ? "stderr" : undefined;
    if (stream === undefined) {
      throw new ProtocolError(`The channel sent a frame of stream '${code}'`);
    }
    // An honest runner never sends an empty frame: a flood of them would be
    // work for the host and output for nobody.
    if (length === 0 || length > MAX_CHUNK_BYTES) {
      throw new ProtocolError(`The channel sent a frame of ${length} bytes`);
    }
    await fill(HEADER_BYTES + length);
    const from = start + HEADER_BYTES;
    const data = options.borrowed
      ? buffer.subarray(from, from + length)
      : buffer.slice(from, from + length);
    start += HEADER_BYTES + length;
    if (start === end) start = end = 0;
    yield { stream, seq: seq[stream]++, data };
  }
}

// A reset comes after the data sent before it, which is read first: once
// that is read, it means the other side left without its end.
async function readOrFail(conn: Deno.UnixConn, into: Uint8Array): Promise<number | null> {
  try {
    return await conn.read(into);
  } catch (cause) {
    throw new ProtocolError(`The session's channel failed: ${messageOf(cause)}`, { cause });
  }
}

/** Options for {@linkcode connectChannel}. */
export interface ConnectChannelOptions {
  /** How long to wait for the host's acknowledgement; default {@linkcode ACK_MS}. */
  ackMs?: number;
}

/**
 * The runner's end: connects to the host's socket, shows the token and
 * waits for the host's acknowledgement. A connection the host closes
 * unacknowledged (it had too many handshakes at once) is made again, a few
 * times.
 *
 * @example
 * ```ts ignore
 * const channel = await connectChannel(SANDBOX_CHANNEL_DIR, payload.session.channel);
 * await channel.write("stdout", new TextEncoder().encode("hi\n"));
 * await channel.end();
 * ```
 *
 * @param dir The channel directory inside the sandbox.
 * @param spec The request's channel.
 * @param options The acknowledgement's time bound.
 * @returns The acknowledged connection, with a framed writer for output.
 * @throws {ProtocolError} When the spec is malformed, or the host does not acknowledge the token.
 * @throws {Deno.errors.NotFound} When nobody listens there.
 */
export async function connectChannel(
  dir: string,
  spec: ChannelSpec,
  options: ConnectChannelOptions = {},
): Promise<RunnerChannel> {
  if (!CHANNEL_SOCKET_PATTERN.test(spec.socket) || !CHANNEL_TOKEN_PATTERN.test(spec.token)) {
    throw new ProtocolError(`Invalid channel '${spec.socket}'`);
  }
  const deadline = Date.now() + (options.ackMs ?? ACK_MS);
  const token = new TextEncoder().encode(`${spec.token}\n`);
  for (let attempt = 1;; attempt++) {
    const conn = await Deno.connect({ transport: "unix", path: `${dir}/${spec.socket}` });
    const answer = await acknowledged(conn, { token, deadline });
    if (answer === "ack") return new RunnerChannel(conn);
    closeQuietly(conn);
    if (answer !== "closed" || attempt >= CONNECT_ATTEMPTS || Date.now() >= deadline) {
      throw new ProtocolError(
        answer === "timeout"
          ? `The host did not acknowledge the channel's token within ${options.ackMs ?? ACK_MS} ms`
          : answer === "closed"
          ? `The host closed the channel unacknowledged ${attempt} times`
          : `The host answered the channel's token with byte '${answer}'`,
      );
    }
  }
}

// Shows the token and reads exactly one byte (what follows is stdin).
async function acknowledged(
  conn: Deno.UnixConn,
  options: { token: Uint8Array; deadline: number },
): Promise<"ack" | "closed" | "timeout" | number> {
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    closeQuietly(conn);
  }, Math.max(0, options.deadline - Date.now()));
  try {
    await writeAll(conn, options.token);
    const byte = new Uint8Array(1);
    const n = await conn.read(byte);
    if (n === null) return "closed";
    return byte[0] === ACK_BYTE ? "ack" : byte[0]!;
  } catch {
    return timedOut ? "timeout" : "closed";
  } finally {
    clearTimeout(timer);
  }
}

/** The runner's side of a connected channel. */
export class RunnerChannel {
  /**
   * The session's stdin: what the host writes, pulled as the process reads.
   * It ends at the end of the host's writing half; a reset errors it. Each
   * chunk is a view of one buffer, valid until the next is read (the runner
   * writes a chunk before it reads the next).
   */
  readonly stdin: ReadableStream<Uint8Array>;
  #conn: Deno.UnixConn;
  /** Each stream's frame buffer, and whether a frame built in it is still being sent. */
  #frames: Partial<Record<StreamName, { buffer: Uint8Array; busy: boolean }>> = {};
  #writing: Promise<void> = Promise.resolve();
  #closed = false;
  // A frame was cut: nothing more goes, the end frame least of all.
  #failed = false;

  /**
   * Wraps an acknowledged connection.
   *
   * @param conn The connected socket.
   */
  constructor(conn: Deno.UnixConn) {
    this.#conn = conn;
    // One buffer, lent: a chunk per read with no allocation or copy (a 1 GiB
    // copy in was 4096 fresh 256 KiB buffers, their faults and GC).
    const readBuffer = new Uint8Array(STDIN_READ_BYTES);
    // Not conn.readable: a process closing its stdin must not close the socket.
    this.stdin = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        let n: number | null;
        try {
          n = await conn.read(readBuffer);
        } catch (cause) {
          // Our own close (the session is over) ends it; anything else is
          // the host's input cut short, which the process must not take for its end.
          if (this.#closed) n = null;
          else {
            return controller.error(
              new ProtocolError(`The host's channel failed: ${messageOf(cause)}`, { cause }),
            );
          }
        }
        if (n === null) controller.close();
        else controller.enqueue(readBuffer.subarray(0, n));
      },
    }, { highWaterMark: 0 });
  }

  /**
   * Sends one chunk of output as a frame; resolves when the socket took it.
   * Each stream's frame is built in one buffer of its own, unless a frame
   * built there is still being sent (a writer that did not wait): then in a
   * fresh one.
   *
   * @param stream Which stream.
   * @param data At most {@linkcode MAX_CHUNK_BYTES} bytes.
   */
  write(stream: StreamName, data: Uint8Array): Promise<void> {
    if (data.byteLength > MAX_CHUNK_BYTES) {
      return Promise.reject(new ProtocolError(`A frame of ${data.byteLength} bytes is too large`));
    }
    // One buffer, one write: a frame's header and bytes in two writes cost
    // twice the socket calls; and the other stream's frame cannot come
    // between. Reused: a fresh 64 KiB frame per chunk was a GiB of
    // allocation per GiB sent.
    const own = this.#frames[stream] ??= {
      buffer: new Uint8Array(HEADER_BYTES + MAX_CHUNK_BYTES),
      busy: false,
    };
    const reused = !own.busy;
    const frame = reused ? own.buffer : new Uint8Array(HEADER_BYTES + data.byteLength);
    frame[0] = STREAM_CODES[stream];
    new DataView(frame.buffer, frame.byteOffset).setUint32(1, data.byteLength);
    frame.set(data, HEADER_BYTES);
    if (!reused) return this.writeRaw([frame]);
    own.busy = true;
    return this.writeRaw([frame.subarray(0, HEADER_BYTES + data.byteLength)]).finally(() => {
      own.busy = false;
    });
  }

  /**
   * Writes bytes as they are, after what is already queued.
   *
   * @param pieces The bytes, in order.
   */
  writeRaw(pieces: Uint8Array[]): Promise<void> {
    const conn = this.#conn;
    const written = this.#writing.then(async () => {
      if (this.#failed) throw new ProtocolError("The channel failed an earlier write");
      try {
        for (const piece of pieces) await writeAll(conn, piece);
      } catch (error) {
        this.#failed = true;
        throw error;
      }
    });
    // A failed write fails its caller; the chain goes on for the close.
    this.#writing = written.catch(() => {});
    return written;
  }

  /** Sends what is queued and the end frame, then closes the socket. */
  async end(): Promise<void> {
    // After a failed write no end goes: the host sees none, and says so.
    await this.writeRaw([END_FRAME]).catch(() => {});
    this.close();
  }

  /** Closes the socket at once (the session was cancelled). Idempotent. */
  close(): void {
    this.#closed = true;
    closeQuietly(this.#conn);
  }
}

/**
 * Makes a channel directory (mounted read-only into its sandbox): 0700 for
 * a root host, whose runner connects as the owner; 0750 for another host
 * user, whose runner gets the user's group. Idempotent.
 *
 * @param dir The host directory.
 */
export function makeChannelDir(dir: string): void {
  Deno.mkdirSync(dir, { recursive: true, mode: 0o700 });
  Deno.chmodSync(dir, Deno.uid() === 0 ? 0o700 : 0o750);
}

/**
 * Removes a channel directory and the sockets of hosts that used it (the
 * sandbox cannot have made anything there: it is mounted read-only).
 * Quiet when it is gone already.
 *
 * @param dir The host directory.
 */
export function removeChannelDir(dir: string): void {
  try {
    Deno.removeSync(dir, { recursive: true });
  } catch {
    // Never made, or gone.
  }
}

function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // Closed already.
  }
}

function hex(bytes: number): string {
  return Array.from(
    crypto.getRandomValues(new Uint8Array(bytes)),
    (b) => b.toString(16).padStart(2, "0"),
  )
    .join("");
}

// A host killed mid-session leaves its socket behind: an old one nobody
// listens on any more goes (the directory is the host's, never the sandbox's).
function removeStale(dir: string): void {
  const now = Date.now();
  let entries: Deno.DirEntry[] = [];
  try {
    entries = [...Deno.readDirSync(dir)];
  } catch {
    return;
  }
  for (const entry of entries) {
    if (!CHANNEL_SOCKET_PATTERN.test(entry.name)) continue;
    const path = `${dir}/${entry.name}`;
    try {
      if (now - (Deno.lstatSync(path).mtime?.getTime() ?? now) <= STALE_SOCKET_MS) continue;
    } catch {
      continue;
    }
    Deno.connect({ transport: "unix", path }).then(closeQuietly, (error) => {
      if (error instanceof Deno.errors.ConnectionRefused) Deno.remove(path).catch(() => {});
    });
  }
}
