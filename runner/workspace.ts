/**
 * Validation of a request's working directory and environment before it runs.
 * Every failure is a {@linkcode UsageError} with a one-line message that
 * quotes the offending value.
 *
 * @module
 */
import { resolve } from "../lib/path.ts";
import { UsageError } from "../lib/errors.ts";
import { isEnvName } from "../lib/env_name.ts";
import { REQUEST_ID_ENV } from "./process_tree.ts";

/** Longest value shown in a message before it is cut. */
const MAX_QUOTED_CHARS = 200;

/**
 * Quotes a value for a one-line message: single quotes, control characters
 * and backslashes escaped, long values cut with an ellipsis.
 *
 * @param value Any user-supplied string.
 * @returns The quoted value, e.g. `'../x'`.
 */
export function quoteValue(value: string): string {
  const cut = value.length > MAX_QUOTED_CHARS ? value.slice(0, MAX_QUOTED_CHARS) : value;
  let out = "";
  for (const char of cut) {
    const code = char.charCodeAt(0);
    if (char === "\0") out += "\\0";
    else if (char === "\n") out += "\\n";
    else if (char === "\t") out += "\\t";
    else if (char === "\\" || char === "'") out += `\\${char}`;
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, "0")}`;
    else out += char;
  }
  return `'${out}${cut === value ? "" : "…"}'`;
}

/**
 * Resolves a request's working directory inside the workspace.
 *
 * Relative paths resolve against `root`; absolute paths must lie inside it.
 * The result is the real path (symlinks resolved), which must also lie
 * inside the real path of `root`, exist, and be a directory. Returning the
 * real path means the checked directory is the one the command starts in.
 *
 * @param root The workspace root.
 * @param cwd The requested directory; undefined means the root itself.
 * @returns The real, absolute path of the directory.
 * @throws {UsageError} When the directory is outside the workspace, missing,
 *   not a directory, or contains a NUL byte.
 */
export function resolveCwd(root: string, cwd: string | undefined): string {
  const shown = quoteValue(cwd ?? ".");
  const shownRoot = quoteValue(root);
  if (root.includes("\0")) throw new UsageError(`Workspace ${shownRoot} contains a NUL byte`);
  if (cwd !== undefined && cwd.includes("\0")) {
    throw new UsageError(`Working directory ${shown} contains a NUL byte`);
  }
  const absRoot = resolve(root);
  const target = cwd === undefined ? absRoot : resolve(absRoot, cwd);
  // Checked lexically first, so a path outside is reported as outside rather
  // than revealing whether it exists.
  if (!isInside(absRoot, target)) {
    throw new UsageError(`Working directory ${shown} is outside the workspace ${shownRoot}`);
  }

  let realRoot: string;
  try {
    realRoot = Deno.realPathSync(absRoot);
  } catch (error) {
    throw new UsageError(`Workspace ${shownRoot} ${describeFsError(error)}`, { cause: error });
  }
  let real: string;
  try {
    real = Deno.realPathSync(target);
  } catch (error) {
    throw new UsageError(`Working directory ${shown} ${describeFsError(error)}`, {
      cause: error,
    });
  }
  if (!isInside(realRoot, real)) {
    throw new UsageError(
      `Working directory ${shown} resolves outside the workspace ${shownRoot}`,
    );
  }
  let isDirectory: boolean;
  try {
    isDirectory = Deno.statSync(real).isDirectory;
  } catch (error) {
    throw new UsageError(`Working directory ${shown} ${describeFsError(error)}`, {
      cause: error,
    });
  }
  if (!isDirectory) throw new UsageError(`Working directory ${shown} is not a directory`);
  return real;
}

/**
 * Builds a command's complete environment: `base`, then the request's
 * `extra` variables, then the `WAFFLE_REQUEST_ID` marker that attributes
 * every process of the request (see `process_tree.ts`).
 *
 * The result has no prototype, so a variable named `__proto__` is an
 * ordinary entry.
 *
 * @param base The runner's minimal base environment.
 * @param options `extra`: the request's variables (they override `base`);
 *   `requestId`: stored in `WAFFLE_REQUEST_ID`.
 * @returns A fresh environment object.
 * @throws {UsageError} On an invalid name, a NUL byte in a value, or an attempt
 *   to set `WAFFLE_REQUEST_ID`.
 */
export function buildEnv(
  base: Record<string, string>,
  options: { extra?: Record<string, string> | undefined; requestId: string },
): Record<string, string> {
  const { extra, requestId } = options;
  if (requestId === "" || requestId.includes("\0")) {
    throw new UsageError(`Request id ${quoteValue(requestId)} is not valid in an environment`);
  }
  const env = Object.create(null) as Record<string, string>;
  for (const [name, value] of Object.entries(base)) {
    checkVariable(name, value);
    env[name] = value;
  }
  for (const [name, value] of Object.entries(extra ?? {})) {
    checkVariable(name, value);
    if (name === REQUEST_ID_ENV) {
      throw new UsageError(`Environment variable ${quoteValue(name)} is reserved by waffle`);
    }
    env[name] = value;
  }
  env[REQUEST_ID_ENV] = requestId;
  return env;
}

function checkVariable(name: string, value: unknown): void {
  if (!isEnvName(name)) {
    throw new UsageError(`Environment variable name ${quoteValue(name)} is invalid`);
  }
  if (typeof value !== "string") {
    throw new UsageError(`Environment variable ${quoteValue(name)} is not a string`);
  }
  if (value.includes("\0")) {
    throw new UsageError(`Environment variable ${quoteValue(name)} contains a NUL byte`);
  }
}

function isInside(root: string, path: string): boolean {
  if (path === root) return true;
  return path.startsWith(root.endsWith("/") ? root : `${root}/`);
}

// The tail of a message about a path that could not be resolved or read.
function describeFsError(error: unknown): string {
  if (error instanceof Deno.errors.NotFound) return "does not exist";
  if (error instanceof Deno.errors.NotADirectory) return "is not a directory";
  if (error instanceof Deno.errors.PermissionDenied) return "is not accessible";
  if (error instanceof Deno.errors.FilesystemLoop) return "has a symbolic link loop";
  const message = error instanceof Error ? error.message : String(error);
  return `cannot be resolved: ${message.split("\n")[0]}`;
}
