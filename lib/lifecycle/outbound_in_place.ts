/**
 * Whether a sandbox's `outbound/` is the directory its running container was
 * started on. A container mounts the directory (its inode) when it starts, so
 * once `outbound/` is made anew (a reset, or a missing one recreated) a
 * container still running serves the old one, which the host no longer
 * reads. The host records that with a mark in its own state root (no
 * container mounts it), made before the new directory and removed only when a
 * runner started on the new one beats: whatever step a host is killed at, the
 * next ensure restarts the container and the warm path never holds meanwhile.
 *
 * Loaded by the warm path: it imports nothing heavier than path arithmetic.
 *
 * @module
 */
import { join } from "../path.ts";
import type { StatePaths } from "./identity.ts";

/** The mark, in the state root: `outbound/` was made anew since the container started. */
const REPLACED_MARK = "outbound.replaced";

type Paths = Pick<StatePaths, "root" | "outbound">;

/**
 * Whether `outbound/` is the directory the running container was started
 * on: present, a directory (not a link), and not made anew since. The warm
 * path holds only while this does.
 *
 * @param paths The sandbox's state paths.
 * @returns False when it is missing, not a directory, or was replaced.
 */
export function outboundInPlace(paths: Paths): boolean {
  try {
    if (!Deno.lstatSync(paths.outbound).isDirectory) return false;
  } catch {
    return false;
  }
  return !outboundReplaced(paths);
}

/**
 * Whether `outbound/` was made anew since the container last started (so a
 * running container must be restarted before it serves).
 *
 * @param paths The sandbox's state paths.
 * @returns True while the mark is there (or cannot be looked at).
 */
export function outboundReplaced(paths: Pick<StatePaths, "root">): boolean {
  try {
    Deno.lstatSync(join(paths.root, REPLACED_MARK));
    return true;
  } catch (error) {
    return !(error instanceof Deno.errors.NotFound);
  }
}

/**
 * Marks `outbound/` as made anew: call before making it.
 *
 * @param paths The sandbox's state paths.
 */
export function markOutboundReplaced(paths: Pick<StatePaths, "root">): void {
  Deno.writeTextFileSync(join(paths.root, REPLACED_MARK), "", { mode: 0o600 });
}

/**
 * Records that a runner started on today's `outbound/` beats in it: the
 * mark goes.
 *
 * @param paths The sandbox's state paths.
 */
export function outboundMounted(paths: Pick<StatePaths, "root">): void {
  try {
    Deno.removeSync(join(paths.root, REPLACED_MARK));
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
}
