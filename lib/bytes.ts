/**
 * Byte helpers shared by the queue, the CLI and the Docker client.
 *
 * @module
 */

/**
 * Joins byte chunks into one array.
 *
 * @param chunks The pieces, in order.
 * @returns One array holding all of them.
 */
export function concat(chunks: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(chunks.reduce((total, chunk) => total + chunk.byteLength, 0));
  let offset = 0;
  for (const chunk of chunks) {
    out.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return out;
}

/**
 * Writes every byte to a writer whose `write` may take fewer (a file, a socket).
 *
 * @param writer The destination.
 * @param data The bytes.
 */
export async function writeAll(
  writer: { write(p: Uint8Array): Promise<number> },
  data: Uint8Array,
): Promise<void> {
  let rest = data;
  while (rest.byteLength > 0) rest = rest.subarray(await writer.write(rest));
}

/**
 * Whether two byte strings are equal, in time that depends on neither's
 * contents (only on the expected one's length): for secrets.
 *
 * @example
 * ```ts
 * timingSafeEqual(new Uint8Array([1, 2]), new Uint8Array([1, 2])); // true
 * ```
 *
 * @param given What the caller sent.
 * @param expected The secret.
 * @returns True when they are equal.
 */
export function timingSafeEqual(given: Uint8Array, expected: Uint8Array): boolean {
  let difference = given.length ^ expected.length;
  for (let i = 0; i < expected.length; i++) difference |= expected[i]! ^ (given[i] ?? 0);
  return difference === 0;
}
