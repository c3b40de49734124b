/**
 * A session's fast channel: its stdin, stdout and stderr over a unix socket
 * instead of queue rows, so a conversation costs no durable commit per
 * message. The request (and its result) still goes through the queue: only
 * the bytes between them take the socket.
 *
 * The host listens and the runner connects, never the other way round: the
 * socket lives in a host directory mounted read-only into the sandbox, so
 * nothing in the sandbox can replace it, and the host never connects to a
 * path the sandbox could point elsewhere. Whoever connects must first send
 * the session's token (which only inbound.db carries); the host accepts one
 * such connection and removes the socket. What the runner sends is
 * untrusted: framed, each frame capped at {@linkcode MAX_CHUNK_BYTES}, read
 * only as fast as the host's reader takes it.
 *
 * Wire: runner → host, the token line, then frames `[stream u8][length
 * u32 BE][bytes]` (1 stdout, 2 stderr); host → runner, raw stdin bytes, the
 * end of input being the end of the host's writing half.
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

/** The channel's part of a session request: the socket's name and the token to show. */
export type ChannelSpec = NonNullable<SessionSpec["channel"]>;

/** Longest host path of a channel socket the kernel takes. */
const MAX_SOCKET_PATH = 107;
/** How long a connection may take to show its token. */
const HANDSHAKE_MS = 2000;
/** Connections showing their token at once; more are closed unread. */
const MAX_HANDSHAKES = 8;
/** Connections with a wrong token before the host gives up the channel. */
const MAX_BAD_CONNECTIONS = 64;
/** A socket older than this with nobody accepting on it is a dead host's: removed. */
const STALE_SOCKET_MS = 10 * 60_000;
const HEADER_BYTES = 5;
const STREAM_CODES: Record<StreamName, number> = { stdout: 1, stderr: 2 };

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
   * Listens on a new socket in `dir` (made by the sandbox's state, mounted
   * read-only into its container).
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

  /** Resolves with the runner's connection once it showed the token. */
  connection(): Promise<Deno.UnixConn> {
    return this.#connected;
  }

  /** The connection if the runner has made it. */
  get connected(): Deno.UnixConn | undefined {
    return this.#conn;
  }

  /** Stops listening and closes the connection. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#stopListening();
    if (this.#conn !== undefined) closeQuietly(this.#conn);
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
    let handshakes = 0;
    let bad = 0;
    try {
      return await new Promise<Deno.UnixConn>((resolve, reject) => {
        void (async () => {
          try {
            const giveUp = (): void => {
              if (++bad < MAX_BAD_CONNECTIONS) return;
              reject(new ProtocolError(`The channel had ${bad} connections without its token`));
              this.#stopListening();
            };
            for await (const conn of this.#listener) {
              if (this.#conn !== undefined || handshakes >= MAX_HANDSHAKES) {
                // Counted: a connect loop cannot keep the host accepting forever.
                closeQuietly(conn);
                giveUp();
                continue;
              }
              handshakes++;
              void showsToken(conn, expected).then((ok) => {
                handshakes--;
                if (ok && this.#conn === undefined && !this.#closed) {
                  this.#conn = conn;
                  this.#stopListening();
                  resolve(conn);
                  return;
                }
                closeQuietly(conn);
                if (!ok) giveUp();
              }).catch(() => closeQuietly(conn));
            }
          } catch (error) {
            reject(error);
          }
          reject(new ProtocolError("The channel closed before the runner connected"));
        })();
      });
    } finally {
      if (this.#conn === undefined) this.#stopListening();
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
 * until the runner ends its writing half.
 *
 * @param conn The accepted connection.
 * @param options `borrowed`: each chunk's data is a view of the reader's one
 *   buffer, valid until the next `next()`, instead of a copy: a consumer that
 *   copies what it keeps then reads a flood with no allocation per frame
 *   (every copy is garbage V8 frees late, later still under CPU load).
 * @returns The chunks.
 * @throws {ProtocolError} On a frame of an unknown stream or over {@linkcode MAX_CHUNK_BYTES}.
 */
export async function* readFrames(
  conn: Deno.UnixConn,
  options: { borrowed?: boolean } = {},
): AsyncGenerator<OutputChunk, void> {
  const buffer = new Uint8Array(HEADER_BYTES + MAX_CHUNK_BYTES);
  // Unparsed bytes are buffer[start, end): compacted only when a frame does
  // not fit after them, so tiny frames cost no copy each.
  let start = 0;
  let end = 0;
  const seq = { stdout: 0, stderr: 0 };
  const fill = async (want: number): Promise<boolean> => {
    if (start + want > buffer.byteLength) {
      buffer.copyWithin(0, start, end);
      end -= start;
      start = 0;
    }
    while (end - start < want) {
      const n = await readOrEnd(conn, buffer.subarray(end));
      if (n === null) {
        if (end === start) return false;
        throw new ProtocolError(`The channel ended inside a frame (${end - start} bytes of it)`);
      }
      end += n;
    }
    return true;
  };
  while (await fill(HEADER_BYTES)) {
    const code = buffer[start]!;
    const length = new DataView(buffer.buffer).getUint32(start + 1);
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

// A runner closing with input unread resets the socket: after the data it
// sent, which is read first, that is its end.
async function readOrEnd(conn: Deno.UnixConn, into: Uint8Array): Promise<number | null> {
  try {
    return await conn.read(into);
  } catch (error) {
    if (error instanceof Deno.errors.ConnectionReset) return null;
    throw error;
  }
}

/**
 * The runner's end: connects to the host's socket and shows the token.
 *
 * @param dir The channel directory inside the sandbox.
 * @param spec The request's channel.
 * @returns The connection, with a framed writer for output.
 * @throws {ProtocolError} When the spec is malformed.
 * @throws {Deno.errors.NotFound} When nobody listens there.
 */
export async function connectChannel(dir: string, spec: ChannelSpec): Promise<RunnerChannel> {
  if (!CHANNEL_SOCKET_PATTERN.test(spec.socket) || !CHANNEL_TOKEN_PATTERN.test(spec.token)) {
    throw new ProtocolError(`Invalid channel '${spec.socket}'`);
  }
  const conn = await Deno.connect({ transport: "unix", path: `${dir}/${spec.socket}` });
  const channel = new RunnerChannel(conn);
  await channel.writeRaw([new TextEncoder().encode(`${spec.token}\n`)]);
  return channel;
}

/** The runner's side of a connected channel. */
export class RunnerChannel {
  /** The session's stdin: what the host writes, pulled as the process reads. */
  readonly stdin: ReadableStream<Uint8Array>;
  #conn: Deno.UnixConn;
  #writing: Promise<void> = Promise.resolve();

  /**
   * Wraps a connection.
   *
   * @param conn The connected socket.
   */
  constructor(conn: Deno.UnixConn) {
    this.#conn = conn;
    // Not conn.readable: a process closing its stdin must not close the socket.
    this.stdin = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        const chunk = new Uint8Array(MAX_CHUNK_BYTES);
        const n = await conn.read(chunk).catch(() => null);
        if (n === null) controller.close();
        else controller.enqueue(chunk.subarray(0, n));
      },
    }, { highWaterMark: 0 });
  }

  /**
   * Sends one chunk of output as a frame; resolves when the socket took it.
   *
   * @param stream Which stream.
   * @param data At most {@linkcode MAX_CHUNK_BYTES} bytes.
   */
  write(stream: StreamName, data: Uint8Array): Promise<void> {
    const header = new Uint8Array(HEADER_BYTES);
    header[0] = STREAM_CODES[stream];
    new DataView(header.buffer).setUint32(1, data.byteLength);
    // One chain: the other stream's frame cannot come between header and bytes.
    return this.writeRaw([header, data]);
  }

  /**
   * Writes bytes as they are (the token), after what is already queued.
   *
   * @param pieces The bytes, in order.
   */
  writeRaw(pieces: Uint8Array[]): Promise<void> {
    const conn = this.#conn;
    const written = this.#writing.then(async () => {
      for (const piece of pieces) await writeAll(conn, piece);
    });
    // A failed write fails its caller; the chain goes on for the close.
    this.#writing = written.catch(() => {});
    return written;
  }

  /** Sends what is queued, then closes the socket. */
  async end(): Promise<void> {
    await this.#writing;
    this.close();
  }

  /** Closes the socket at once (the session was cancelled). Idempotent. */
  close(): void {
    try {
      this.#conn.close();
    } catch {
      // Closed already.
    }
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
