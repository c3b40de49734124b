/**
 * POSIX path arithmetic (`join`, `dirname`, `basename`, `resolve`,
 * `normalize`) with `node:path`'s results, without loading `node:path`:
 * importing any of Deno's Node modules but `node:sqlite` costs ~12 ms of
 * every process start, which `waffle exec` pays on every call. (`pathe`,
 * the usual light replacement, rewrites backslashes to slashes, which on
 * Linux are ordinary file-name bytes: a check and a use could disagree.)
 * `tests/path_test.ts` compares every function with `node:path.posix`.
 *
 * @module
 */

/**
 * Resolves `.` and `..` segments and repeated slashes, keeping a leading and
 * a trailing slash, as `node:path.posix.normalize` does.
 *
 * @param path The path.
 * @returns The normal form; `.` for an empty path.
 */
export function normalize(path: string): string {
  if (path === "") return ".";
  const absolute = path.startsWith("/");
  const out: string[] = [];
  for (const segment of path.split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment !== "..") out.push(segment);
    else if (out.length > 0 && out.at(-1) !== "..") out.pop();
    else if (!absolute) out.push("..");
  }
  let body = out.join("/");
  if (body === "" && !absolute) body = ".";
  if (path.endsWith("/") && body !== "" && body !== ".") body += "/";
  else if (path.endsWith("/") && body === ".") body = "./";
  return absolute ? `/${body}` : body;
}

/**
 * Joins non-empty segments with `/` and normalizes the result.
 *
 * @param segments Path segments.
 * @returns The joined path; `.` when all are empty.
 */
export function join(...segments: string[]): string {
  const parts = segments.filter((segment) => segment !== "");
  return parts.length === 0 ? "." : normalize(parts.join("/"));
}

/**
 * An absolute path: the segments applied right to left onto the working
 * directory, normalized, with no trailing slash but for the root.
 *
 * @param segments Path segments.
 * @returns The absolute path.
 */
export function resolve(...segments: string[]): string {
  let path = "";
  for (let i = segments.length - 1; i >= 0 && !path.startsWith("/"); i--) {
    const segment = segments[i]!;
    if (segment !== "") path = path === "" ? segment : `${segment}/${path}`;
  }
  if (!path.startsWith("/")) path = `${Deno.cwd()}/${path}`;
  const normal = normalize(path);
  return normal.length > 1 && normal.endsWith("/") ? normal.slice(0, -1) : normal;
}

/**
 * The directory part: everything before the last segment.
 *
 * @param path The path.
 * @returns `.` when there is no directory part, `/` at the root.
 */
export function dirname(path: string): string {
  if (path === "") return ".";
  const rooted = path.startsWith("/");
  // The slash just before the last segment (trailing slashes skipped).
  let end = -1;
  let inTrailingSlashes = true;
  for (let i = path.length - 1; i >= 1; i--) {
    if (path[i] !== "/") inTrailingSlashes = false;
    else if (!inTrailingSlashes) {
      end = i;
      break;
    }
  }
  if (end === -1) return rooted ? "/" : ".";
  return rooted && end === 1 ? "//" : path.slice(0, end);
}

/**
 * The last segment, trailing slashes ignored.
 *
 * @param path The path.
 * @returns The segment; empty for the root or an empty path.
 */
export function basename(path: string): string {
  const trimmed = trimTrailingSlashes(path);
  return trimmed.slice(trimmed.lastIndexOf("/") + 1);
}

// "/" stays "/"; "a//" becomes "a".
function trimTrailingSlashes(path: string): string {
  let end = path.length;
  while (end > 1 && path[end - 1] === "/") end--;
  return path.slice(0, end);
}
