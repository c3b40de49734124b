/**
 * What pins an npm package: one exact version (`1.2.3`, a prerelease
 * `1.2.3-rc.1` and build `+b5` allowed), the rule `[mcp.<name>] package`
 * is checked by and npm's version picker parses with. Pure.
 *
 * @module
 */

const NUMERIC = "0|[1-9]\\d*";
const IDENT = `(?:${NUMERIC}|\\d*[A-Za-z-][0-9A-Za-z-]*)`;
/**
 * One exact npm version (semver 2.0.0), anchored; its groups are the major,
 * minor and patch numbers, the prerelease and the build.
 */
export const EXACT_VERSION: RegExp = new RegExp(
  `^(${NUMERIC})\\.(${NUMERIC})\\.(${NUMERIC})(?:-(${IDENT}(?:\\.${IDENT})*))?(?:\\+([0-9A-Za-z-]+(?:\\.[0-9A-Za-z-]+)*))?$`,
);

/**
 * Whether a version string is one exact version (semver 2.0.0): three
 * numbers without leading zeros, an optional prerelease and build.
 *
 * @example
 * ```ts
 * import { isExactVersion } from "./package_pin.ts";
 * isExactVersion("2026.8.31"); // true
 * isExactVersion("1.0.0-rc.1+build.5"); // true
 * isExactVersion("latest"); // false
 * isExactVersion("^1"); // false
 * ```
 *
 * @param version The version as written after `@`.
 * @returns True for an exact version.
 */
export function isExactVersion(version: string): boolean {
  return EXACT_VERSION.test(version);
}
