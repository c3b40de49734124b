/**
 * Yes/no questions about paths that fail quietly: anything that cannot be
 * looked at counts as "no" (but for {@linkcode lexists}, which must not
 * mistake "cannot look" for "not there"). Synchronous, dependency-free (the
 * runner and the volume code load this alone).
 *
 * @module
 */

/**
 * Whether a name exists at `path`, the name itself (a symlink is not
 * followed). Only a definite "not there" counts as no: what cannot be looked
 * at may be there, so it is never replaced or recreated in error.
 *
 * @param path The path.
 * @returns False only when nothing is at `path`.
 */
export function lexists(path: string): boolean {
  try {
    Deno.lstatSync(path);
    return true;
  } catch (error) {
    return !(error instanceof Deno.errors.NotFound);
  }
}

/**
 * Whether something exists at `path` (a symlink is followed).
 *
 * @param path The path.
 * @returns False when it is missing or cannot be looked at.
 */
export function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Whether `path` is a regular file (a symlink is followed).
 *
 * @param path The path.
 * @returns False when it is anything else, missing or cannot be looked at.
 */
export function isFile(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

/**
 * Whether `path` is a directory (a symlink is followed).
 *
 * @param path The path.
 * @returns False when it is anything else, missing or cannot be looked at.
 */
export function isDirectory(path: string): boolean {
  try {
    return Deno.statSync(path).isDirectory;
  } catch {
    return false;
  }
}

/**
 * Whether a program is a file in one of `PATH`'s directories.
 *
 * @param program The program's name.
 * @returns True when found.
 */
export function onPath(program: string): boolean {
  return (Deno.env.get("PATH") ?? "").split(":").some((dir) => isFile(`${dir}/${program}`));
}

/**
 * Writes a small JSON record atomically (a temporary file renamed onto
 * `path`, mode 0600), or removes it when `record` is undefined (a missing
 * file is fine). The host's own records (warm, pause) live in directories no
 * sandbox mounts.
 *
 * @example
 * ```ts ignore
 * writeJsonRecord("/var/lib/waffle/sandboxes/x/pause.json", { state: "paused", at: Date.now() });
 * ```
 *
 * @param path The record's file.
 * @param record What to write; undefined removes it.
 */
export function writeJsonRecord(path: string, record: unknown): void {
  if (record === undefined) {
    try {
      Deno.removeSync(path);
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    }
    return;
  }
  const temp = `${path}.${Deno.pid}.tmp`;
  Deno.writeTextFileSync(temp, JSON.stringify(record), { mode: 0o600 });
  Deno.renameSync(temp, path);
}
