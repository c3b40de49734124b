/**
 * The one rule for environment variable names, wherever a name comes from:
 * `--env` flags, a request's payload, the runner's checks before it spawns,
 * and the config's allowlists (`[sandbox] env`, an MCP server's `env`).
 *
 * @module
 */
import * as z from "./schema.ts";

/** Letters, digits and `_`, not starting with a digit (what a POSIX shell accepts). */
export const ENV_NAME_PATTERN: RegExp = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Whether a string is a valid environment variable name.
 *
 * @param name The candidate name.
 * @returns True when it follows {@linkcode ENV_NAME_PATTERN}.
 *
 * @example
 * ```ts
 * import { isEnvName } from "./env_name.ts";
 * isEnvName("HOME"); // true
 * isEnvName("1X"); // false
 * ```
 */
export function isEnvName(name: string): boolean {
  return ENV_NAME_PATTERN.test(name);
}

/**
 * Schema of an environment variable name, for config files and the queue's
 * wire types alike.
 *
 * @ignore
 */
export const envNameSchema: z.ZodMiniString<string> = z.string().check(z.regex(ENV_NAME_PATTERN, {
  error: "must be a variable name (letters, digits and '_', not starting with a digit)",
}));
