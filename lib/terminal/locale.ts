/**
 * Whether the user's terminal reads UTF-8, from the locale as the C library
 * picks it: the first of `LC_ALL`, `LC_CTYPE`, `LANG` that is set and not
 * empty; none set is the C locale (ASCII). A terminal that does not read
 * UTF-8 (latin-1, for one) takes the bytes 0x80–0x9F of a UTF-8 character
 * as C1 controls, so what waffle writes to it stays ASCII.
 *
 * @module
 */

/**
 * Whether a locale environment names UTF-8.
 *
 * @example
 * ```ts
 * import { localeIsUtf8 } from "./locale.ts";
 * localeIsUtf8((name) => ({ LANG: "de_DE.UTF-8", LC_ALL: "C" })[name]); // false
 * ```
 *
 * @param env Reads a variable (`(name) => Deno.env.get(name)`).
 * @returns True when the locale's codeset is UTF-8.
 */
export function localeIsUtf8(env: (name: string) => string | undefined): boolean {
  const locale = ["LC_ALL", "LC_CTYPE", "LANG"].map(env).find((value) =>
    value !== undefined && value !== ""
  );
  return locale !== undefined && /\.utf-?8(@|$)/i.test(locale);
}

let processLocale: boolean | undefined;

/**
 * Whether this process's terminal reads UTF-8 ({@linkcode localeIsUtf8} of
 * its environment, read once; false when the environment cannot be read).
 *
 * @returns True when the locale's codeset is UTF-8.
 */
export function terminalIsUtf8(): boolean {
  if (processLocale === undefined) {
    try {
      processLocale = localeIsUtf8((name) => Deno.env.get(name));
    } catch {
      processLocale = false;
    }
  }
  return processLocale;
}
