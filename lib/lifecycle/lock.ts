/**
 * The per-sandbox lifecycle lock: an exclusive `flock` on
 * `$WAFFLE_HOME/locks/<hash>.lock`. It serialises ensure, submit, recycle,
 * stop and removal across threads of one process and across processes, and
 * the kernel releases it when a holder dies.
 *
 * @module
 */
import { dirname } from "../path.ts";
import { QueueError } from "../errors.ts";
import { errno, libc, O_CLOEXEC, O_NOFOLLOW, O_RDWR } from "../libc.ts";

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

/**
 * Takes a lock file's exclusive lock if nobody holds it, without waiting
 * (`flock(LOCK_EX | LOCK_NB)`): for work one holder at a time is enough for
 * (a warm pool's filler).
 *
 * @param path The lock file (created if missing).
 * @returns The release, or undefined when another holds the lock.
 * @throws {QueueError} When libc cannot be loaded or the file cannot be opened.
 */
export function tryLock(path: string): (() => void) | undefined {
  const lib = libc();
  if (lib === undefined) throw new QueueError(`Cannot lock '${path}': libc is not available`);
  Deno.mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const fd = lib.open(
    new TextEncoder().encode(`${path}\0`),
    O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC,
    0o600,
  );
  if (fd < 0) throw new QueueError(`Cannot open lock '${path}' (errno ${errno(lib)})`);
  if (lib.flock(fd, LOCK_EX | LOCK_NB) !== 0) {
    lib.close(fd);
    return undefined;
  }
  return () => lib.close(fd);
}

const LOCK_EX = 2;
const LOCK_NB = 4;
const O_CREAT = 0o100;
