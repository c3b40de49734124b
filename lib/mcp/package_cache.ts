/**
 * The npm package cache of MCP servers: a `DENO_DIR` on the host that
 * waffle's own Deno fills (`deno cache`), and that sandboxes mount read-only
 * (their uid 10001 reads it, so everything in it is made world-readable).
 * Servers then run with `--cached-only`: nothing is fetched at launch, and
 * nothing inside a sandbox needs the network.
 *
 * @module
 */
import { join } from "../path.ts";
import type { SandboxConfig } from "../config/config.ts";
import { UsageError, WaffleError } from "../errors.ts";

/** Where npm packages are fetched from when nothing says otherwise. */
const DEFAULT_REGISTRY_DIR = "registry.npmjs.org";
/** Lines of `deno cache` output kept for an error message. */
const KEPT_LINES = 20;

/**
 * The cache directory of a configuration: `[sandbox] mcp_cache` /
 * `WAFFLE_MCP_CACHE`, else `<home>/mcp-cache`.
 *
 * @example
 * ```ts ignore
 * const dir = mcpCacheDir(loadWaffleConfig().sandbox);
 * ```
 *
 * @param config The sandbox settings.
 * @returns An absolute path.
 */
export function mcpCacheDir(config: Pick<SandboxConfig, "home" | "mcpCache">): string {
  return config.mcpCache || join(config.home, "mcp-cache");
}

/** An `npm:` spec split into its name and version. */
export interface PackageSpec {
  /** The package name, scope included: `@scope/name`. */
  name: string;
  /** The version as written (exact versions are what the cache can be checked for). */
  version: string;
}

/**
 * Splits `npm:[@scope/]name@version`.
 *
 * @example
 * ```ts
 * parsePackageSpec("npm:@modelcontextprotocol/server-everything@2026.8.31");
 * // { name: "@modelcontextprotocol/server-everything", version: "2026.8.31" }
 * ```
 *
 * @param spec The spec.
 * @returns Name and version.
 * @throws {UsageError} When it is not an `npm:` spec with a version.
 */
export function parsePackageSpec(spec: string): PackageSpec {
  const match = /^npm:((?:@[a-z0-9][\w.-]*\/)?[a-z0-9][\w.-]*)@([\w.+-]+)$/i.exec(spec);
  if (match === null) {
    throw new UsageError(`Package '${spec}' is not "npm:<name>@<version>"`);
  }
  return { name: match[1]!, version: match[2]! };
}

/**
 * Whether a package is in the cache: its extracted `package.json` exists
 * (Deno extracts a package to a temporary name and renames it, so a present
 * directory is complete). Its dependencies are fetched by the same
 * `deno cache`; should one be missing, the server's own `--cached-only`
 * error says which.
 *
 * @example
 * ```ts ignore
 * if (!isCached(spec, dir)) await fetchPackage(spec, { cacheDir: dir });
 * ```
 *
 * @param spec `npm:<name>@<version>`.
 * @param dir The cache directory.
 * @returns Whether it is cached.
 */
export function isCached(spec: string, dir: string): boolean {
  let parsed: PackageSpec;
  try {
    parsed = parsePackageSpec(spec);
  } catch {
    return false;
  }
  const registries = [DEFAULT_REGISTRY_DIR];
  try {
    for (const entry of Deno.readDirSync(join(dir, "npm"))) {
      if (entry.isDirectory && entry.name !== DEFAULT_REGISTRY_DIR) registries.push(entry.name);
    }
  } catch {
    return false;
  }
  return registries.some((registry) => {
    try {
      return Deno.statSync(join(dir, "npm", registry, parsed.name, parsed.version, "package.json"))
        .isFile;
    } catch {
      return false;
    }
  });
}

/** Options of {@linkcode fetchPackage}. */
export interface FetchOptions {
  /** The cache directory (created if missing). */
  cacheDir: string;
  /** Progress lines (Deno's download lines), for stderr. */
  onProgress?: ((line: string) => void) | undefined;
}

/**
 * Fetches a package and its dependencies into the cache with the host's
 * Deno (`deno cache --no-config <spec>`, `DENO_DIR=<cacheDir>`), then makes
 * the cache world-readable (`a+rX`) for the sandbox's uid. Needs the
 * network, and run and write permissions.
 *
 * @example
 * ```ts ignore
 * await fetchPackage("npm:@modelcontextprotocol/server-everything@2026.8.31", {
 *   cacheDir: "/var/lib/waffle/mcp-cache",
 *   onProgress: (line) => console.error(line),
 * });
 * ```
 *
 * @param spec `npm:<name>@<version>`.
 * @param options The cache directory and a progress callback.
 * @throws {UsageError} When the spec is not an npm package.
 * @throws {WaffleError} When Deno cannot fetch it (one line naming the package).
 */
export async function fetchPackage(spec: string, options: FetchOptions): Promise<void> {
  parsePackageSpec(spec);
  const { cacheDir } = options;
  Deno.mkdirSync(cacheDir, { recursive: true, mode: 0o755 });
  const child = new Deno.Command(Deno.execPath(), {
    args: ["cache", "--no-config", spec],
    // Its own directory: no deno.json or package.json of the caller's cwd applies.
    cwd: cacheDir,
    env: { DENO_DIR: cacheDir, DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const kept: string[] = [];
  const onLine = (line: string): void => {
    const text = line.trim();
    if (text === "" || text.startsWith("Stack backtrace") || /^\d+: </.test(text)) return;
    kept.push(text);
    if (kept.length > KEPT_LINES) kept.shift();
    options.onProgress?.(text);
  };
  // stdout too goes to progress: a caller's stdout may be an MCP stream.
  const [status] = await Promise.all([
    child.status,
    forEachLine(child.stdout, onLine),
    forEachLine(child.stderr, onLine),
  ]);
  if (!status.success) {
    const why = kept.findLast((line) => /error/i.test(line)) ?? kept.at(-1) ??
      `deno cache exited with status ${status.code}`;
    throw new WaffleError(
      `Cannot fetch package '${spec}': ${why.replace(/^error:\s*/i, "").replace(/\.$/, "")}`,
    );
  }
  await makeReadable(cacheDir);
}

/**
 * The command line that runs a cached package with waffle's Deno:
 * `deno run -A --cached-only --no-config --quiet --no-prompt <spec> ...args`,
 * and the environment it needs. Offline: everything comes from the cache.
 *
 * @example
 * ```ts ignore
 * const { argv, env } = packageLaunch(spec, ["stdio"], { deno: [Deno.execPath()], cacheDir });
 * ```
 *
 * @param spec `npm:<name>@<version>`.
 * @param args The server's arguments.
 * @param where `deno`: the argv that starts Deno; `cacheDir`: the cache (both as the server's
 *   side sees them); `preload`: a module Deno runs first (`--preload`), e.g. the one that makes
 *   the server's state directories.
 * @returns The argv (program first) and the variables to add (DENO_DIR and quiet settings).
 */
export function packageLaunch(
  spec: string,
  args: string[],
  where: { deno: readonly string[]; cacheDir: string; preload?: string | undefined },
): { argv: string[]; env: Record<string, string> } {
  return {
    argv: [
      ...where.deno,
      "run",
      "-A",
      "--cached-only",
      "--no-config",
      "--quiet",
      "--no-prompt",
      ...(where.preload === undefined ? [] : [`--preload=${where.preload}`]),
      spec,
      ...args,
    ],
    env: { DENO_DIR: where.cacheDir, DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" },
  };
}

async function forEachLine(
  stream: ReadableStream<Uint8Array>,
  onLine: (line: string) => void,
): Promise<void> {
  let rest = "";
  // deno-lint-ignore no-control-regex
  const ansi = /\x1b\[[0-9;]*m/g;
  for await (const text of stream.pipeThrough(new TextDecoderStream())) {
    const lines = (rest + text).split("\n");
    rest = lines.pop() ?? "";
    // A line without an end is not held forever.
    if (rest.length > 4096) {
      lines.push(rest);
      rest = "";
    }
    for (const line of lines) onLine(line.replace(ansi, "").slice(0, 1000));
  }
  if (rest !== "") onLine(rest.replace(ansi, "").slice(0, 1000));
}

/** `chmod -R a+rX`: read for everyone, and search on directories (and executables). */
async function makeReadable(dir: string): Promise<void> {
  const stack = [dir];
  while (stack.length > 0) {
    const path = stack.pop()!;
    let info: Deno.FileInfo;
    try {
      info = await Deno.lstat(path);
    } catch {
      continue; // removed meanwhile
    }
    if (info.isSymlink || info.mode === null) continue;
    const mode = info.mode & 0o7777;
    const wanted = info.isDirectory || (mode & 0o111) !== 0 ? mode | 0o555 : mode | 0o444;
    if (wanted !== mode) await Deno.chmod(path, wanted);
    if (info.isDirectory) {
      for await (const entry of Deno.readDir(path)) stack.push(join(path, entry.name));
    }
  }
}
