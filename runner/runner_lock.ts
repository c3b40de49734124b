/**
 * One runner per queue: the runner holds an exclusive `flock` on the queue's
 * `runner.lock` for its whole life. The kernel drops it when the process dies
 * (even by SIGKILL), so a stale lock cannot outlive its runner. Works across
 * the bind mount because host and container share one kernel.
 *
 * @module
 */
import { RunnerError } from "../lib/errors.ts";
import { EXIT_LOCKED } from "../lib/exit_codes.ts";
import { libc, O_CLOEXEC, O_NOFOLLOW } from "../lib/libc.ts";
import { setAsideUnlessRegular } from "../lib/queue/runner_queue.ts";

const O_RDWR = 2;
const O_CREAT = 0o100;
const LOCK_EX = 2;
const LOCK_NB = 4;

/**
 * Takes the queue's runner lock without waiting. The descriptor stays open
 * (and the lock held) until the process exits.
 *
 * @param path The queue's `runner.lock`.
 * @throws {RunnerError} When another runner holds it or the file cannot be opened.
 */
export function acquireRunnerLock(path: string): void {
  const c = libc();
  if (c === undefined) throw new RunnerError("Cannot lock the queue: libc is not available here");
  // The runner's own directory: it creates the file (never through a link),
  // and sets aside whatever else a previous occupant left under the name.
  setAsideUnlessRegular(path, { anyLinks: true });
  const fd = c.open(
    new TextEncoder().encode(`${path}\0`),
    O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
    0o600,
  );
  if (fd < 0) throw new RunnerError(`Cannot open runner lock '${path}'`);
  if (c.flock(fd, LOCK_EX | LOCK_NB) !== 0) {
    throw new RunnerError(`Another runner already serves the queue (lock '${path}' is held)`, {
      exitCode: EXIT_LOCKED,
    });
  }
}
