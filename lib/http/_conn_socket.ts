/**
 * A `Deno.Conn` as the socket `node:http`'s server expects: a Node Duplex
 * with the few `net.Socket` members the server uses (`setTimeout`,
 * `destroySoon`, the remote address). The accept loop owns the connection;
 * the HTTP server parses it, applies its deadlines, and closes it.
 *
 * Loaded only by {@linkcode serveHttp}: Node's stream modules cost every
 * process that imports them.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { Duplex } from "node:stream";
import { settlesWithin } from "../async.ts";

/** Bytes read at a time: a connection waiting for its next bytes holds one such buffer. */
const READ_BYTES = 16 * 1024;
/**
 * Bytes read at a time, at most, by a connection whose reads keep filling
 * its buffer (an upload): each full read doubles it up to this, and a short
 * one takes it back to {@linkcode READ_BYTES}.
 */
const STREAM_READ_BYTES = 256 * 1024;
/** How long a last response (a 408 or 431) may take to go out before the connection closes anyway. */
const LAST_WRITE_MS = 1000;
/**
 * After its last response, what the client still sends is read and dropped
 * for this long, this much at most, before the connection closes: closing
 * with unread bytes resets the connection, and the client would lose the
 * response (a 401 to a large POST).
 */
const LINGER_MS = 2000;
const LINGER_BYTES = 4 * 1024 * 1024;

/** A Node socket over one accepted `Deno.Conn`. */
export class ConnSocket extends Duplex {
  /** The peer's address. */
  readonly remoteAddress: string | undefined;
  /** The peer's port. */
  readonly remotePort: number | undefined;
  /** `IPv4` or `IPv6`. */
  readonly remoteFamily: string | undefined;
  readonly #conn: Deno.Conn;
  readonly #onClosed: () => void;
  readonly #idleMs: number;
  readonly #writeStallMs: number;
  #requests = 0;
  #idleTimer: ReturnType<typeof setTimeout> | undefined;
  #buffer = new Uint8Array(READ_BYTES);
  #reading = false;
  /** Bytes still dropped before closing, once the last response is out; undefined before. */
  #lingering: number | undefined;
  #lingerTimer: ReturnType<typeof setTimeout> | undefined;
  #lastWrite: Promise<unknown> = Promise.resolve();
  #timeoutMs = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;

  /**
   * Wraps an accepted connection.
   *
   * @param conn The connection.
   * @param options `idleMs`: the keep-alive deadline; `writeStallMs`: how
   *   long a pending write may make no progress before the connection closes;
   *   `onClosed`: called once the connection itself is closed.
   */
  constructor(
    conn: Deno.Conn,
    options: { idleMs: number; writeStallMs: number; onClosed: () => void },
  ) {
    // Half-open is the HTTP server's decision (it ends its side on the peer's end).
    super({ allowHalfOpen: true });
    this.#conn = conn;
    this.#onClosed = options.onClosed;
    this.#idleMs = options.idleMs;
    this.#writeStallMs = options.writeStallMs;
    const remote = conn.remoteAddr;
    if (remote.transport === "tcp" || remote.transport === "udp") {
      this.remoteAddress = remote.hostname;
      this.remotePort = remote.port;
      this.remoteFamily = remote.hostname.includes(":") ? "IPv6" : "IPv4";
    }
  }

  /** A request's headers have arrived: the connection is not idle until its response ends. */
  requestStarted(): void {
    this.#requests++;
    clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
  }

  /**
   * A response has ended (or was abandoned). With no other request in
   * progress the connection is idle, and closes after the keep-alive
   * deadline unless another request's headers arrive first. `node:http`'s
   * own keep-alive timer is not enough: any byte (a blank line) clears it.
   */
  requestEnded(): void {
    if (--this.#requests > 0 || this.destroyed) return;
    clearTimeout(this.#idleTimer);
    this.#idleTimer = setTimeout(() => this.destroy(), this.#idleMs);
  }

  /**
   * Emits `timeout` after `ms` with nothing written and no request activity
   * (the HTTP server's keep-alive deadline); 0 turns it off.
   *
   * @param ms The idle time.
   * @param callback Called once on the next timeout.
   * @returns This socket.
   */
  setTimeout(ms: number, callback?: () => void): this {
    this.#timeoutMs = ms;
    if (callback !== undefined) {
      if (ms === 0) this.removeListener("timeout", callback);
      else this.once("timeout", callback);
    }
    this._unrefTimer();
    return this;
  }

  /**
   * Restarts the idle timer. `node:http` calls it while a request is being
   * read; bytes that are no request (a peer trickling blank lines into a
   * kept-alive connection) do not keep the connection open.
   */
  _unrefTimer(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#timeoutMs > 0 && !this.destroyed) {
      this.#timer = setTimeout(() => this.emit("timeout"), this.#timeoutMs);
    }
  }

  /**
   * Sets TCP_NODELAY.
   *
   * @param noDelay Whether to send small writes at once.
   * @returns This socket.
   */
  setNoDelay(noDelay = true): this {
    (this.#conn as Partial<Deno.TcpConn>).setNoDelay?.(noDelay);
    return this;
  }

  /**
   * Sets SO_KEEPALIVE.
   *
   * @param keepAlive Whether the kernel probes an idle connection.
   * @returns This socket.
   */
  setKeepAlive(keepAlive = false): this {
    (this.#conn as Partial<Deno.TcpConn>).setKeepAlive?.(keepAlive);
    return this;
  }

  /**
   * Ends the writable side and closes the connection once that is flushed
   * and the client has stopped sending (or {@linkcode LINGER_MS} passed).
   */
  destroySoon(): void {
    if (this.writable) this.end();
    if (this.writableFinished) this.#linger();
    else this.once("finish", () => this.#linger());
  }

  #linger(): void {
    if (this.destroyed || this.#lingering !== undefined) return;
    this.#lingering = LINGER_BYTES;
    this.#lingerTimer = setTimeout(() => this.destroy(), LINGER_MS);
    if (this.#reading) return; // the pending read drops what it gets
    this.#reading = true;
    void this.#pump();
  }

  override _read(): void {
    if (this.#reading) return;
    this.#reading = true;
    void this.#pump();
  }

  async #pump(): Promise<void> {
    try {
      for (;;) {
        const read = await this.#conn.read(this.#buffer);
        if (this.#lingering !== undefined) {
          this.#lingering -= read ?? 0;
          if (read === null || this.#lingering <= 0) return void this.destroy();
          continue;
        }
        if (read === null) {
          this.push(null);
          return;
        }
        const chunk = Buffer.from(this.#buffer.subarray(0, read));
        this.#fit(read);
        if (!this.push(chunk)) return;
      }
    } catch (error) {
      // A read pending when the connection closes fails: that is no error.
      if (!this.destroyed) this.destroy(error as Error);
    } finally {
      this.#reading = false;
    }
  }

  // Few large reads while bytes keep coming, one small buffer while they do not.
  #fit(read: number): void {
    const size = this.#buffer.byteLength;
    if (read === size && size < STREAM_READ_BYTES) this.#buffer = new Uint8Array(size * 2);
    else if (read < size / 4 && size > READ_BYTES) this.#buffer = new Uint8Array(READ_BYTES);
  }

  override _write(
    chunk: Uint8Array,
    _encoding: string,
    callback: (error?: Error | null) => void,
  ): void {
    this.#send(chunk, callback);
  }

  override _writev(
    chunks: { chunk: Uint8Array }[],
    callback: (error?: Error | null) => void,
  ): void {
    this.#send(Buffer.concat(chunks.map((entry) => entry.chunk)), callback);
  }

  #send(bytes: Uint8Array, callback: (error?: Error | null) => void): void {
    const written = this.#writeAll(bytes);
    this.#lastWrite = written.catch(() => {});
    written.then(() => {
      this._unrefTimer();
      callback();
    }, (error) => callback(error));
  }

  /**
   * Writes every byte. A client that stops reading leaves a write pending
   * forever: one with no progress for the stall deadline closes the
   * connection (a stream read steadily, however slowly, is never cut).
   */
  async #writeAll(bytes: Uint8Array): Promise<void> {
    const stalled = () => this.destroy();
    let timer = setTimeout(stalled, this.#writeStallMs);
    try {
      for (let at = 0; at < bytes.byteLength;) {
        at += await this.#conn.write(bytes.subarray(at));
        clearTimeout(timer);
        timer = setTimeout(stalled, this.#writeStallMs);
      }
    } finally {
      clearTimeout(timer);
    }
  }

  override _final(callback: (error?: Error | null) => void): void {
    const conn = this.#conn as Partial<Deno.TcpConn>;
    (conn.closeWrite?.() ?? Promise.resolve()).then(() => callback(), () => callback());
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    clearTimeout(this.#timer);
    clearTimeout(this.#lingerTimer);
    clearTimeout(this.#idleTimer);
    this.#timer = undefined;
    // The server's last words (a 408, a 431) may still be on their way.
    void settlesWithin(this.#lastWrite, LAST_WRITE_MS).then(() => {
      try {
        this.#conn.close();
      } catch {
        // Already closed.
      }
      this.#onClosed();
    });
    callback(error);
  }
}
