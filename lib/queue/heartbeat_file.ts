/**
 * The runner's heartbeat: a small JSON file of its own, `outbound/heartbeat.json`,
 * rewritten in place every beat.
 *
 * Why a file of its own, not a row of `outbound.db`:
 * - whoever only needs liveness (`ps`, `sweep`, the warm path, a waiting
 *   host) reads at most {@linkcode HEARTBEAT_FILE_BYTES}, never a database
 *   the sandbox may have grown to the copy cap;
 * - `outbound.db` changes only when a request does, so a host's copy of it
 *   stays valid between requests instead of being taken again every beat;
 * - the file's inode change time (ctime) is set by the kernel on every
 *   write, by the host's clock, and no process can set it to another time:
 *   it is what `liveness.ts` judges, so a one-shot process judges as well as
 *   one that has watched for minutes, and a runner that stops (frozen,
 *   killed, wedged) stops changing it whatever it wrote.
 *
 * Why in place, at a fixed length, and not a new file renamed over it: a
 * rewrite needs no new inode or block, so a command that uses up the
 * volume's inodes or space cannot silence an honest runner (and have it
 * judged dead and reset). A reader that meets a half-written beat reads again
 * (`liveness.ts`).
 *
 * This module imports nothing, so the runner's heartbeat thread loads no
 * more than it needs; the host reads the file in `liveness.ts`.
 *
 * @module
 */
import type { Heartbeat } from "./protocol.ts";

/** Largest heartbeat file the host reads; a larger one is no heartbeat. */
export const HEARTBEAT_FILE_BYTES = 1024;

/** Every beat is padded to this length, so a rewrite never changes the file's size. */
const BEAT_BYTES = 512;

/**
 * Writes a beat over the previous one, in place, in one `write`. Used by the
 * runner only; a beat is not durable (a lost one is the next one's job).
 *
 * @param path The heartbeat file (created when missing).
 * @param beat The beat.
 */
export function writeHeartbeatFile(path: string, beat: Heartbeat): void {
  const bytes = new TextEncoder().encode(JSON.stringify(beat).padEnd(BEAT_BYTES));
  const file = Deno.openSync(path, { write: true, create: true });
  try {
    let done = 0;
    while (done < bytes.length) done += file.writeSync(bytes.subarray(done));
  } finally {
    file.close();
  }
}
