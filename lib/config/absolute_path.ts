/**
 * The one rule for a host path written in `waffle.toml` (`[sandbox] home`,
 * `mcp_cache`, a secret's `from_file`, `[egress] extra_ca`): absolute,
 * without NUL, at most 4096 characters.
 *
 * @module
 */
import * as z from "../schema.ts";

/**
 * Schema of an absolute host path in the config.
 *
 * @ignore
 */
export const absolutePathSchema: z.ZodMiniString<string> = z.string().check(
  z.maxLength(4096),
  z.refine((v) => v.startsWith("/") && !v.includes("\0"), { error: "must be an absolute path" }),
);
