/**
 * `waffle certify-lock FILE` (internal): the lock holder that `waffle doctor
 * --deep` starts as a process of its own (see `certify/lock_holder.ts`).
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import { holdExclusiveLock } from "../certify/lock_holder.ts";
import { parse } from "./args.ts";
import type { CliIo } from "./io.ts";

/** Help text of `waffle certify-lock`. */
export const CERTIFY_LOCK_HELP = `Usage: waffle certify-lock FILE

(internal) Holds BEGIN EXCLUSIVE on a queue file for 'waffle doctor --deep':
prints 'locked', answers JSON-line queries on stdin inside the lock, and
rolls back on {"op":"release"} or the end of stdin. It never writes.
`;

/**
 * Runs `waffle certify-lock`.
 *
 * @param args The file, alone.
 * @param io Process streams.
 * @returns 0 after a release, 1 when the file could not be locked.
 * @throws {UsageError} Unless exactly one file is given.
 */
export async function certifyLockCommand(args: string[], io: CliIo): Promise<number> {
  const { positionals } = parse(args, {});
  const [path, extra] = positionals;
  if (path === undefined || extra !== undefined) {
    throw new UsageError(`Expected one queue file, got '${positionals.join(" ")}'`);
  }
  return await holdExclusiveLock(path, {
    input: io.stdin,
    write: (line) => io.stdout(`${line}\n`),
  });
}
