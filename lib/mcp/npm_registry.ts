/**
 * Asks the npm registry which exact version a tag or range stands for, to
 * say it in the error that refuses an unpinned `package` (config loading
 * itself never touches the network). The registry is `$NPM_CONFIG_REGISTRY`
 * (as npm and Deno read it), else `https://registry.npmjs.org/`; one GET of
 * the package's abbreviated metadata, bounded by a timeout.
 *
 * @module
 */
import type { UnpinnedPackageError } from "../errors.ts";
import { type PackageVersions, pickVersion } from "./npm_version.ts";

/** The registry npm uses when nothing says otherwise. */
export const DEFAULT_NPM_REGISTRY = "https://registry.npmjs.org/";
/** How long the lookup may take before the registry counts as not reachable. */
export const REGISTRY_TIMEOUT_MS = 5000;
/** The most metadata read from the registry (a package with thousands of versions fits). */
const MAX_METADATA_BYTES = 32 * 1024 * 1024;

/** What the registry said: the version npm would pick, or why there is none. */
export type RegistryAnswer =
  | { version: string }
  | { problem: "not reachable" | "no such package" | "no matching version"; registry: string };

/**
 * The registry to ask: `$NPM_CONFIG_REGISTRY` / `$npm_config_registry`, else
 * {@linkcode DEFAULT_NPM_REGISTRY}; always ending in `/`.
 *
 * @example
 * ```ts ignore
 * npmRegistry(); // "https://registry.npmjs.org/"
 * ```
 *
 * @returns The registry's base URL.
 */
export function npmRegistry(): string {
  const configured = Deno.env.get("NPM_CONFIG_REGISTRY") || Deno.env.get("npm_config_registry") ||
    DEFAULT_NPM_REGISTRY;
  return configured.endsWith("/") ? configured : `${configured}/`;
}

/**
 * Looks up the exact version npm would install for `name@wanted`.
 *
 * @example
 * ```ts ignore
 * await registryVersion("@modelcontextprotocol/server-memory", "latest");
 * // { version: "2026.8.31" }
 * ```
 *
 * @param name The package name, scope included.
 * @param wanted A tag or range as written.
 * @param options `registry` (default {@linkcode npmRegistry}), `timeoutMs` (default
 *   {@linkcode REGISTRY_TIMEOUT_MS}). Needs network permission for the registry.
 * @returns The version, or the problem.
 */
export async function registryVersion(
  name: string,
  wanted: string,
  options: { registry?: string; timeoutMs?: number } = {},
): Promise<RegistryAnswer> {
  const registry = options.registry ?? npmRegistry();
  // A scoped name's slash is part of the path segment: "@scope%2fname".
  const url = `${registry}${name.replace("/", "%2f")}`;
  let known: PackageVersions;
  try {
    const response = await fetch(url, {
      headers: { accept: "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8" },
      signal: AbortSignal.timeout(options.timeoutMs ?? REGISTRY_TIMEOUT_MS),
    });
    if (response.status === 404) {
      await response.body?.cancel();
      return { problem: "no such package", registry };
    }
    if (!response.ok) {
      await response.body?.cancel();
      return { problem: "not reachable", registry };
    }
    const length = Number(response.headers.get("content-length") ?? "0");
    if (length > MAX_METADATA_BYTES) {
      await response.body?.cancel();
      return { problem: "not reachable", registry };
    }
    const body = await response.json() as {
      versions?: Record<string, unknown>;
      "dist-tags"?: Record<string, unknown>;
    };
    known = {
      versions: Object.keys(body.versions ?? {}),
      distTags: Object.fromEntries(
        Object.entries(body["dist-tags"] ?? {}).filter(([, v]) => typeof v === "string"),
      ) as Record<string, string>,
    };
  } catch {
    return { problem: "not reachable", registry };
  }
  const version = pickVersion(known, wanted);
  return version === undefined ? { problem: "no matching version", registry } : { version };
}

/**
 * The one-line message for an unpinned package: the config error, then the
 * exact version npm would pick (asked of the registry) or why there is none.
 *
 * @example
 * ```ts ignore
 * await unpinnedMessage(error);
 * // "Config file '/etc/waffle/waffle.toml': 'mcp.memory.package' must pin an exact version …;
 * //  npm would pick 2026.8.31: write \"npm:@modelcontextprotocol/server-memory@2026.8.31\""
 * ```
 *
 * @param error The config error.
 * @param options Passed to {@linkcode registryVersion}.
 * @returns The message.
 */
export async function unpinnedMessage(
  error: UnpinnedPackageError,
  options: { registry?: string; timeoutMs?: number } = {},
): Promise<string> {
  const answer = await registryVersion(error.packageName, error.requested, options);
  if ("version" in answer) {
    return `${error.message}; npm would pick ${answer.version}: write "npm:${error.packageName}@${answer.version}"`;
  }
  const where = `'${answer.registry}'`;
  const why = answer.problem === "not reachable"
    ? `registry not reachable (${where})`
    : answer.problem === "no such package"
    ? `the registry ${where} has no package '${error.packageName}'`
    : `no version of '${error.packageName}' on ${where} matches '${error.requested}'`;
  return `${error.message}; ${why}`;
}
