/**
 * The one rule for an image reference written in `waffle.toml` (`[sandbox]
 * image`, `[templates.<name>] image`): 1-256 characters. Docker itself
 * judges the reference when the image is looked up.
 *
 * @module
 */
import * as z from "../schema.ts";

/**
 * Schema of an image reference in the config.
 *
 * @ignore
 */
export const imageRefSchema: z.ZodMiniString<string> = z.string().check(
  z.minLength(1),
  z.maxLength(256),
);
