/**
 * The per-sandbox lifecycle lock: an exclusive `flock` on
 * `$WAFFLE_HOME/locks/<hash>.lock`. It serialises ensure, submit, recycle,
 * stop and removal across threads of one process and across processes, and
 * the kernel releases it when a holder dies.
 *
 * @module
 */
import { dirname } from "../path.ts";

/**
 * Runs `fn` while holding the lock file's exclusive lock.
 *
 * @param path The lock file (created if missing).
 * @param fn The critical section.
 * @returns What `fn` returned.
 */
export async function withLock<T>(path: string, fn: () => Promise<T>): Promise<T> {
  // `waffle stop`/`rm` may run against a home that never held a sandbox.
  await Deno.mkdir(dirname(path), { recursive: true, mode: 0o700 });
  const file = await Deno.open(path, { read: true, write: true, create: true, mode: 0o600 });
  try {
    await file.lock(true);
    return await fn();
  } finally {
    file.close(); // closing drops the flock
  }
}
