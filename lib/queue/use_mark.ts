/**
 * The host's record of when it last used a sandbox: the modification time
 * of a small empty file the host touches after each use of the queue (a
 * request submitted, input sent, a session renewed or resized, a cancel, a
 * result collected and acknowledged), and never after the queue's own
 * housekeeping (deleting acknowledged rows, recording a new generation or
 * lost requests). `ps` shows it, and `sweep` judges idleness and the running
 * cap's least recently used by it.
 *
 * Why not `inbound.db`'s modification time: housekeeping writes that file
 * too, some of it when the runner chooses (the host deletes acknowledged
 * rows only once the runner has deleted its own), so a sandbox looked used
 * after its last use, and the one used first could outlive a newer one
 * under the running cap.
 *
 * Where it lives is its owner's choice (`lifecycle/identity.ts`: in the
 * sandbox's state root, mode 0700, which no container mounts): nothing in the
 * sandbox can touch it, and it is read with `lstat`, so only a regular file
 * counts. One `utimes` per use, never an fsync: a crash may lose a touch,
 * which makes a sandbox look idle a little early, never busy.
 *
 * @module
 */

/**
 * Records a use now (by the host's clock): sets the file's modification
 * time, creating it when missing. Never throws: the use itself succeeded,
 * and a lost record only makes the sandbox look idle sooner.
 *
 * @example
 * ```ts ignore
 * markUse("/home/u/.waffle/sandboxes/ab12…/last_use");
 * ```
 *
 * @param path The mark's path.
 */
export function markUse(path: string): void {
  const now = new Date();
  try {
    Deno.utimeSync(path, now, now);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) return;
    try {
      Deno.writeFileSync(path, new Uint8Array(), { mode: 0o600 });
    } catch {
      // Its directory is gone: nothing to record the use in.
    }
  }
}

/**
 * When the host last used the sandbox, by its mark.
 *
 * @example
 * ```ts ignore
 * const at = lastUse("/home/u/.waffle/sandboxes/ab12…/last_use"); // ms since epoch, or undefined
 * ```
 *
 * @param path The mark's path.
 * @returns Its modification time in ms since epoch; undefined when there is
 *   no mark (never used since marks exist) or it is not a regular file.
 */
export function lastUse(path: string): number | undefined {
  try {
    const info = Deno.lstatSync(path);
    return info.isFile ? info.mtime?.getTime() : undefined;
  } catch {
    return undefined;
  }
}
