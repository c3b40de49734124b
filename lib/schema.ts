/**
 * The one owner of zod: `zod/mini` with only the English locale registered,
 * so default issue messages stay English without classic zod's bundle of
 * every locale (760 KB). Import it as a namespace,
 * `import * as z from "../schema.ts"`, never from `"zod"`: a bundler drops
 * what is not used only when `z` is this module's namespace (re-exporting a
 * `z` object would keep all of zod, locales included).
 *
 * @module
 */
import { config } from "npm:zod@4.6.7/mini";
import en from "npm:zod@4.6.7/v4/locales/en.js";

config(en());

/** `zod/mini`'s API (`z.string()`, `z.optional()`, `z.infer`, …), English messages configured. */
export * from "npm:zod@4.6.7/mini";
