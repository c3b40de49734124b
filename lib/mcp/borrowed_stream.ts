/**
 * A byte stream whose reader borrows each chunk from its writer: the writer
 * may reuse a chunk's memory once the reader has asked for the next one, so
 * a producer that reads into one buffer (the session channel's frames) hands
 * a flood on with no copy per chunk. Its reader copies what it keeps, as
 * `readLines` does.
 *
 * @module
 */

/**
 * One writer hands chunks to one reader, one at a time, with no queue.
 *
 * @example
 * ```ts
 * const stream = new BorrowedStream();
 * const buffer = new Uint8Array(4);
 * const writing = (async () => {
 *   for (const byte of [1, 2]) {
 *     buffer.fill(byte);
 *     await stream.hand(buffer); // the reader is done with it when this resolves
 *   }
 *   stream.close();
 * })();
 * for await (const chunk of stream.readable) console.log(chunk.slice());
 * await writing;
 * ```
 */
export class BorrowedStream {
  /** What the reader reads. */
  readonly readable: ReadableStream<Uint8Array>;
  #controller!: ReadableStreamDefaultController<Uint8Array>;
  // Settled when the reader asks for a chunk; rejected once it cancelled.
  #asked = BorrowedStream.#signal();
  // Ends the pending pull once a chunk is there (or the stream closed).
  #served: (() => void) | undefined;
  #ended = false;

  /** A stream with nothing handed yet. */
  constructor() {
    this.readable = new ReadableStream<Uint8Array>({
      start: (controller) => {
        this.#controller = controller;
      },
      // Called only while a read waits (no queue): the reader is done with
      // any chunk it had before.
      pull: () =>
        new Promise<void>((resolve) => {
          this.#served = resolve;
          this.#asked.resolve();
        }),
      cancel: () => {
        this.#ended = true;
        this.#asked.reject(new Error("The reader cancelled the stream"));
      },
    }, { highWaterMark: 0 });
  }

  /**
   * Hands a chunk to the reader.
   *
   * @param chunk The bytes; the writer keeps them unchanged until this resolves.
   * @returns Once the reader asked for the next chunk, so it is done with this one.
   * @throws {Error} When the reader cancelled the stream, or it was closed.
   */
  async hand(chunk: Uint8Array): Promise<void> {
    await this.#asked.promise;
    if (this.#ended) throw new Error("The stream has ended");
    this.#asked = BorrowedStream.#signal();
    this.#controller.enqueue(chunk);
    this.#served?.();
    this.#served = undefined;
    await this.#asked.promise;
  }

  /** Ends the stream: the reader's next read is its end; a pending hand returns. Idempotent. */
  close(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#controller.close();
    this.#served?.();
    this.#asked.resolve();
  }

  static #signal(): PromiseWithResolvers<void> {
    const signal = Promise.withResolvers<void>();
    // Rejected on a cancel nobody may be waiting for.
    signal.promise.catch(() => {});
    return signal;
  }
}
