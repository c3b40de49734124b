/**
 * The runner's heartbeat: a small JSON file of its own, `outbound/heartbeat.json`,
 * replaced (written aside, then renamed over) every beat.
 *
 * Why a file of its own, not a row of `outbound.db`:
 * - whoever only needs liveness (`ps`, `sweep`, the warm path, a waiting
 *   host) reads at most {@linkcode HEARTBEAT_FILE_BYTES}, never a database
 *   the sandbox may have grown to the copy cap;
 * - `outbound.db` changes only when a request does, so a host's copy of it
 *   stays valid between requests instead of being taken again every beat;
 * - the replaced file's inode change time (ctime) is set by the kernel, by
 *   the host's clock, and no process can set it to another time: it is what
 *   `liveness.ts` judges, so a one-shot process judges as well as one that
 *   has watched for minutes, and a runner that stops (frozen, killed, wedged)
 *   stops changing it whatever it wrote.
 *
 * This module imports nothing, so the runner's heartbeat thread loads no
 * more than it needs; the host reads the file in `liveness.ts`.
 *
 * @module
 */
import type { Heartbeat } from "./protocol.ts";

/** Largest heartbeat file the host reads; a larger one is no heartbeat. */
export const HEARTBEAT_FILE_BYTES = 1024;

/**
 * Writes a beat: to `<path>.tmp`, then renamed over `path`, so a reader sees
 * the old beat or the new one, whole. Used by the runner only; a beat is
 * not durable (a lost one is the next one's job).
 *
 * @param path The heartbeat file.
 * @param beat The beat.
 */
export function writeHeartbeatFile(path: string, beat: Heartbeat): void {
  const tmp = `${path}.tmp`;
  Deno.writeTextFileSync(tmp, JSON.stringify(beat));
  Deno.renameSync(tmp, path);
}
