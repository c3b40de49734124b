/**
 * What commands keep of their image: its `Env` (PATH, language settings)
 * and its `WorkingDir`, as the host handed them to the runner (see
 * `lib/config/sandbox_paths.ts`). The runner itself runs with neither.
 *
 * @module
 */
import { IMAGE_ENV_VARIABLE, IMAGE_WORKDIR_VARIABLE } from "../lib/config/sandbox_paths.ts";

/**
 * The image's own environment, as a map (later entries win, as in Docker).
 * Entries without `=` or with an empty name are left out.
 *
 * @returns The variables; empty when the host passed none.
 */
export function imageEnv(): Record<string, string> {
  let entries: unknown;
  try {
    entries = JSON.parse(Deno.env.get(IMAGE_ENV_VARIABLE) ?? "[]");
  } catch {
    return {};
  }
  const env: Record<string, string> = {};
  if (!Array.isArray(entries)) return env;
  for (const entry of entries) {
    if (typeof entry !== "string" || entry.includes("\0")) continue;
    const at = entry.indexOf("=");
    if (at > 0) env[entry.slice(0, at)] = entry.slice(at + 1);
  }
  return env;
}

/**
 * The image's working directory, where a request that names no cwd runs,
 * as Docker would run it: only when the image sets one and it is a
 * directory (the image's own root filesystem is read-only, so it cannot be
 * made). Undefined means the workspace.
 *
 * @returns Its real path, or undefined.
 */
export function imageWorkdir(): string | undefined {
  const dir = Deno.env.get(IMAGE_WORKDIR_VARIABLE) ?? "";
  if (!dir.startsWith("/") || dir.includes("\0")) return undefined;
  try {
    const real = Deno.realPathSync(dir);
    return Deno.statSync(real).isDirectory ? real : undefined;
  } catch {
    return undefined;
  }
}
