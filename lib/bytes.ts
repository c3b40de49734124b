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
