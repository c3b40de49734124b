/**
 * Docker's multiplexed attach/exec stream format (used when `Tty` is false):
 * frames of an 8-byte header `[stream, 0, 0, 0, size (uint32 BE)]` followed by
 * `size` bytes, where stream 1 is stdout and 2 is stderr.
 *
 * @module
 */

import { concat } from "../bytes.ts";

/** Bytes of one demultiplexed stream pair. */
export interface DemuxedOutput {
  /** Concatenated stdout frames. */
  stdout: Uint8Array;
  /** Concatenated stderr frames. */
  stderr: Uint8Array;
}

const HEADER_BYTES = 8;

/**
 * Splits a complete multiplexed stream into stdout and stderr. A stream that
 * does not start with a valid header (a TTY exec) is returned whole as stdout;
 * a truncated final frame keeps the bytes that arrived.
 *
 * @example
 * ```ts
 * const { stdout } = demuxDockerStream(new Uint8Array([1, 0, 0, 0, 0, 0, 0, 2, 104, 105]));
 * // stdout is "hi"
 * ```
 */
export function demuxDockerStream(data: Uint8Array): DemuxedOutput {
  const out: Uint8Array[] = [];
  const err: Uint8Array[] = [];
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  let pos = 0;
  while (pos + HEADER_BYTES <= data.length) {
    const kind = data[pos];
    if (kind !== 0 && kind !== 1 && kind !== 2) {
      // Not multiplexed (or misaligned): pass the rest through as stdout.
      if (pos === 0) return { stdout: data.slice(), stderr: new Uint8Array() };
      out.push(data.subarray(pos));
      pos = data.length;
      break;
    }
    const size = view.getUint32(pos + 4);
    const start = pos + HEADER_BYTES;
    const end = Math.min(start + size, data.length);
    (kind === 2 ? err : out).push(data.subarray(start, end));
    pos = end;
  }
  if (pos === 0 && data.length > 0) return { stdout: data.slice(), stderr: new Uint8Array() };
  return { stdout: concat(out), stderr: concat(err) };
}
