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
