/**
 * Per-identity caps of the egress proxy: a token bucket for bandwidth (one
 * per direction, shared by all of an identity's connections) and the
 * number of connections open at once.
 *
 * @module
 */

/** A token bucket of bytes per second, with one second of burst. */
export class ByteBucket {
  #rate: number;
  #tokens: number;
  #at = performance.now();

  /**
   * @param bytesPerSecond The rate; 0 means unlimited.
   */
  constructor(bytesPerSecond: number) {
    this.#rate = bytesPerSecond;
    this.#tokens = bytesPerSecond;
  }

  /** Changes the rate (a reloaded policy). */
  set rate(bytesPerSecond: number) {
    this.#rate = bytesPerSecond;
    this.#tokens = Math.min(this.#tokens, bytesPerSecond);
  }

  /**
   * Takes `bytes` and says how long the sender should pause to stay within
   * the rate.
   *
   * @param bytes Bytes just passed.
   * @returns Milliseconds to wait (0 when within the rate or unlimited).
   */
  take(bytes: number): number {
    if (this.#rate <= 0) return 0;
    const now = performance.now();
    this.#tokens = Math.min(this.#rate, this.#tokens + (now - this.#at) * this.#rate / 1000);
    this.#at = now;
    this.#tokens -= bytes;
    return this.#tokens >= 0 ? 0 : Math.ceil(-this.#tokens * 1000 / this.#rate);
  }
}
