/**
 * waffle's configuration: defaults, then `waffle.toml`, then `WAFFLE_*`
 * environment variables, then CLI flags. Every value is validated; a bad one
 * is a one-line error naming the file, the key, what was expected and what
 * was found. Unknown keys are errors. No file at all means defaults.
 *
 * Which file: `--config FILE` (absolute), else `$WAFFLE_CONFIG` (absolute),
 * else `$WAFFLE_HOME/waffle.toml` when `WAFFLE_HOME` is set (or a caller
 * names the home), else the first that exists of
 * {@linkcode configCandidates}: the user's `$XDG_CONFIG_HOME/waffle/waffle.toml`
 * (`~/.config/waffle/waffle.toml`), `/etc/waffle/waffle.toml`, and the
 * default home's `waffle.toml`. So an MCP client that starts waffle with a
 * stripped environment (no `WAFFLE_HOME`) still finds it; the file's
 * `[sandbox] home` then names the state root.
 *
 * @module
 */
import { join, resolve } from "../path.ts";
import * as z from "../schema.ts";
import { UnpinnedPackageError, UsageError } from "../errors.ts";
import { envNameSchema } from "../env_name.ts";
import { buildPolicy } from "./mcp_policy.ts";
import { EMPTY_POLICY, type McpPolicy } from "./mcp_types.ts";
import { POLICY_TABLE_KEYS, policyShape, tableNameProblem } from "./mcp_schema.ts";
import { stringify } from "npm:smol-toml@1.9.1";
import {
  EGRESS_TABLE_KEYS,
  egressAddressesSchema,
  egressEntrySchema,
  egressListSchema,
  egressNameProblem,
  egressSettings,
  egressShape,
  secretNamesSchema,
} from "./egress_schema.ts";
import { egressConfigProblem } from "./egress_checks.ts";
import { formatEntry } from "./egress_entries.ts";
import type { EgressEntry, EgressSettings } from "./egress_types.ts";
import { type ConfigProblem, issueProblem, parseToml } from "./toml.ts";
import { exists } from "../fs.ts";
import { absolutePathSchema as absolutePath } from "./absolute_path.ts";
import { imageRefSchema } from "./image_ref.ts";
import {
  serveNameProblem,
  type ServeSettings,
  serveSettings,
  serveShape,
  serveTableKeys,
} from "./serve_schema.ts";

/** Settings that shape the sandbox container. */
export interface SandboxConfig {
  /** Root of per-user state (queues, workspaces) and locks. */
  home: string;
  /** "docker" (default), or "host": no isolation, only when written explicitly in `[sandbox]`. */
  mode: "docker" | "host";
  /** Runner image reference; resolved to its immutable id on every ensure. */
  image: string;
  /** The runner stops its container after this long idle; 0 never. */
  idleSeconds: number;
  /** Process limit of a container. */
  pidsLimit: number;
  /** Memory limit of a container, in bytes (swap included). */
  memoryBytes: number;
  /** CPU limit of a container, in CPUs. */
  cpus: number;
  /** Size of the container's `/tmp` tmpfs, in bytes. */
  tmpBytes: number;
  /** Network mode; `none` unless configured otherwise. */
  network: "none" | "bridge";
  /** Names of host environment variables passed into the container (default none). */
  envAllowlist: string[];
  /** `waffle sweep` stops least recently used containers beyond this many running; 0 no cap. */
  maxRunning: number;
  /** Disk quota of each sandbox's volume (workspace and queue), in bytes. */
  quotaBytes: number;
  /** Most workspace snapshots one sandbox (tenant, user) may keep; 0 allows none. */
  maxSnapshots: number;
  /** Most host disk, in bytes, one sandbox's snapshots may take together; 0 no limit beyond the count. */
  snapshotBytes: number;
  /** Host directory of the npm package cache, mounted read-only into sandboxes (default `<home>/mcp-cache`). */
  mcpCache: string;
  /**
   * `[sandbox] egress`: the destinations every sandbox's egress proxy allows
   * (before `[users.<user>] egress` narrows them). Set, the sandbox is
   * attached to the egress proxy (its network stays "none"); undefined (the
   * default), it is not.
   */
  egress?: EgressEntry[] | undefined;
  /** `[sandbox] egress_addresses`: non-public CIDRs (`ip/bits`) a listed name may resolve to (default none). */
  egressAddresses: string[];
  /**
   * `[sandbox] egress_allow_host_loopback`: whether `egress_addresses` may
   * cover the host's loopback (default false: the proxy has the host's
   * network, so that would open every service listening there).
   */
  egressAllowHostLoopback: boolean;
  /** `[sandbox] secrets`: the `[secrets.<name>]` sandboxes get by placeholder (default none). */
  secrets: string[];
  /**
   * An installed artefact (`…/lib/waffle/waffle.js`, with the Deno that runs
   * it beside it) that sandboxes run as their runner. Default: the artefact
   * this process runs from, else (from source) the checkout.
   */
  runner?: string | undefined;
  /**
   * The config file to read (as an override), or the one that was read;
   * undefined when there was none.
   */
  configPath?: string | undefined;
}

/** The whole loaded configuration: sandbox settings, MCP policy and egress settings. */
export interface WaffleConfig {
  /** The file the settings came from; undefined when there was none. */
  path: string | undefined;
  /** The files looked at, in order, up to the one read (all of them when none was). */
  searched: string[];
  /** Sandbox settings, every layer applied. */
  sandbox: SandboxConfig;
  /** The `[mcp.*]`, `[groups.*]`, `[cron.*]`, `[users.*]` and `[secrets.*]` policy. */
  policy: McpPolicy;
  /** The `[egress]` table, defaults filled in. */
  egress: EgressSettings;
  /** `waffle serve`'s `[serve]` and `[templates.*]` tables, defaults filled in. */
  serve: ServeSettings;
}

/** Options of {@linkcode loadWaffleConfig}. */
export interface LoadOptions {
  /**
   * The config file (`--config FILE`), an absolute path; wins over
   * `WAFFLE_CONFIG` and the searched places.
   */
  configPath?: string | undefined;
  /** Values that win over everything (CLI flags, library callers). */
  overrides?: Partial<SandboxConfig> | undefined;
}

const field = {
  mode: z.enum(["docker", "host"]),
  image: imageRefSchema,
  idleSeconds: z.number().check(z.minimum(0), z.maximum(7 * 24 * 3600)),
  // The runner itself uses up to ~25 tasks (threads count against pids.max).
  pidsLimit: z.int().check(z.minimum(32), z.maximum(65536)),
  memoryBytes: z.int().check(z.minimum(32 * 1024 * 1024)),
  cpus: z.number().check(z.positive(), z.maximum(1024)),
  tmpBytes: z.int().check(z.minimum(1024 * 1024)),
  network: z.enum(["none", "bridge"]),
  envAllowlist: z.array(envNameSchema).check(z.maxLength(256)),
  maxRunning: z.int().check(z.minimum(0)),
  quotaBytes: z.int().check(z.minimum(16 * 1024 * 1024)),
  maxSnapshots: z.int().check(z.minimum(0), z.maximum(1024)),
  snapshotBytes: z.int().check(z.minimum(0)),
  mcpCache: absolutePath,
  runner: absolutePath.check(
    z.refine((v) => v.endsWith(".js"), { error: "must name a bundled artefact (*.js)" }),
  ),
};

// Overrides and environment variables, in the library's camelCase.
const settingsSchema = z.strictObject({
  mode: z.optional(field.mode),
  image: z.optional(field.image),
  idleSeconds: z.optional(field.idleSeconds),
  pidsLimit: z.optional(field.pidsLimit),
  memoryBytes: z.optional(field.memoryBytes),
  cpus: z.optional(field.cpus),
  tmpBytes: z.optional(field.tmpBytes),
  network: z.optional(field.network),
  envAllowlist: z.optional(field.envAllowlist),
  maxRunning: z.optional(field.maxRunning),
  quotaBytes: z.optional(field.quotaBytes),
  maxSnapshots: z.optional(field.maxSnapshots),
  snapshotBytes: z.optional(field.snapshotBytes),
  mcpCache: z.optional(field.mcpCache),
  runner: z.optional(field.runner),
  egress: z.optional(z.array(egressEntrySchema).check(z.maxLength(1024))),
  egressAddresses: z.optional(egressAddressesSchema),
  egressAllowHostLoopback: z.optional(z.boolean()),
  secrets: z.optional(secretNamesSchema),
  configPath: z.optional(
    z.string().check(z.minLength(1), z.maxLength(4096), z.refine((v) => !v.includes("\0"))),
  ),
});

type Settings = z.infer<typeof settingsSchema>;

/** `[sandbox]` keys of `waffle.toml` and the {@linkcode SandboxConfig} field each sets. */
export const SANDBOX_KEYS: Readonly<Record<string, keyof SandboxConfig>> = Object.freeze({
  mode: "mode",
  image: "image",
  idle_seconds: "idleSeconds",
  pids_limit: "pidsLimit",
  memory_bytes: "memoryBytes",
  cpus: "cpus",
  tmp_bytes: "tmpBytes",
  network: "network",
  env: "envAllowlist",
  max_running: "maxRunning",
  quota_bytes: "quotaBytes",
  max_snapshots: "maxSnapshots",
  snapshot_bytes: "snapshotBytes",
  mcp_cache: "mcpCache",
  runner: "runner",
  egress: "egress",
  egress_addresses: "egressAddresses",
  secrets: "secrets",
  egress_allow_host_loopback: "egressAllowHostLoopback",
});

const sandboxTableSchema = z.strictObject({
  home: z.optional(absolutePath),
  mode: z.optional(field.mode),
  image: z.optional(field.image),
  idle_seconds: z.optional(field.idleSeconds),
  pids_limit: z.optional(field.pidsLimit),
  memory_bytes: z.optional(field.memoryBytes),
  cpus: z.optional(field.cpus),
  tmp_bytes: z.optional(field.tmpBytes),
  network: z.optional(field.network),
  env: z.optional(field.envAllowlist),
  max_running: z.optional(field.maxRunning),
  quota_bytes: z.optional(field.quotaBytes),
  max_snapshots: z.optional(field.maxSnapshots),
  snapshot_bytes: z.optional(field.snapshotBytes),
  mcp_cache: z.optional(field.mcpCache),
  runner: z.optional(field.runner),
  egress: z.optional(egressListSchema),
  egress_addresses: z.optional(egressAddressesSchema),
  egress_allow_host_loopback: z.optional(z.boolean()),
  secrets: z.optional(secretNamesSchema),
});

const fileSchema = z.strictObject({
  sandbox: z.optional(sandboxTableSchema),
  ...policyShape,
  ...egressShape,
  ...serveShape,
});

const KNOWN_KEYS: Record<string, readonly string[]> = {
  "": [
    "sandbox",
    "mcp",
    "groups",
    "cron",
    "users",
    "secrets",
    "egress",
    "serve",
    "templates",
    "backend",
  ],
  sandbox: [...Object.keys(SANDBOX_KEYS), "home"],
  ...POLICY_TABLE_KEYS,
  ...EGRESS_TABLE_KEYS,
};

function knownKeys(path: readonly PropertyKey[]): string[] {
  // `mcp.<name>.env.<VAR>` is `{ host = "NAME" }`.
  if (path[0] === "mcp" && path[2] === "env" && path.length === 4) return ["host"];
  const serve = serveTableKeys(path);
  if (serve !== undefined) return serve;
  return [...(KNOWN_KEYS[path.length === 0 ? "" : String(path[0])] ?? [])];
}

/** A sandbox's settings when neither the file nor the environment sets them. */
export const SANDBOX_DEFAULTS: Readonly<Omit<SandboxConfig, "home" | "mcpCache">> = {
  mode: "docker",
  image: "waffle-runner:latest",
  idleSeconds: 1800,
  pidsLimit: 256,
  memoryBytes: 1024 * 1024 * 1024,
  cpus: 1,
  tmpBytes: 256 * 1024 * 1024,
  network: "none",
  envAllowlist: [],
  maxRunning: 0,
  quotaBytes: 1024 ** 3,
  maxSnapshots: 8,
  snapshotBytes: 0,
  egressAddresses: [],
  egressAllowHostLoopback: false,
  secrets: [],
};

const ENV_OVERRIDES: [string, keyof Settings][] = [
  ["WAFFLE_IMAGE", "image"],
  ["WAFFLE_IDLE_SECONDS", "idleSeconds"],
  ["WAFFLE_PIDS_LIMIT", "pidsLimit"],
  ["WAFFLE_MEMORY_BYTES", "memoryBytes"],
  ["WAFFLE_CPUS", "cpus"],
  ["WAFFLE_MAX_RUNNING", "maxRunning"],
  ["WAFFLE_QUOTA_BYTES", "quotaBytes"],
  ["WAFFLE_MAX_SNAPSHOTS", "maxSnapshots"],
  ["WAFFLE_MCP_CACHE", "mcpCache"],
  ["WAFFLE_RUNNER", "runner"],
];

const STRING_SETTINGS = new Set<keyof Settings>(["image", "mcpCache", "runner"]);

/**
 * The default state root: `$WAFFLE_HOME`, else `/var/lib/waffle` for root,
 * else `$XDG_STATE_HOME/waffle` or `~/.local/state/waffle`.
 *
 * @example
 * ```ts ignore
 * const home = defaultHome();
 * ```
 *
 * @returns An absolute path.
 */
export function defaultHome(): string {
  const explicit = Deno.env.get("WAFFLE_HOME");
  if (explicit) return explicit;
  if (Deno.uid() === 0) return "/var/lib/waffle";
  const state = Deno.env.get("XDG_STATE_HOME") ??
    join(Deno.env.get("HOME") ?? "/tmp", ".local", "state");
  return join(state, "waffle");
}

/** The system-wide config file, read when neither the user's nor `WAFFLE_HOME` names one. */
export const SYSTEM_CONFIG = "/etc/waffle/waffle.toml";

/**
 * The places a config file is looked for when neither `--config`,
 * `WAFFLE_CONFIG` nor `WAFFLE_HOME` names one, in order (the first that
 * exists is read; the others are not merged in):
 *
 * 1. `$XDG_CONFIG_HOME/waffle/waffle.toml` (an absolute `XDG_CONFIG_HOME`),
 *    else `$HOME/.config/waffle/waffle.toml`: the user's own, root's included;
 * 2. {@linkcode SYSTEM_CONFIG};
 * 3. `<default home>/waffle.toml`: `/var/lib/waffle/waffle.toml` for root,
 *    else `$XDG_STATE_HOME/waffle/waffle.toml` or
 *    `~/.local/state/waffle/waffle.toml`.
 *
 * @example
 * ```ts ignore
 * configCandidates(); // ["/root/.config/waffle/waffle.toml", "/etc/waffle/waffle.toml", "/var/lib/waffle/waffle.toml"]
 * ```
 *
 * @returns Absolute paths.
 */
export function configCandidates(): string[] {
  const xdg = Deno.env.get("XDG_CONFIG_HOME");
  const user = Deno.env.get("HOME");
  const base = xdg?.startsWith("/") ? xdg : user?.startsWith("/") ? join(user, ".config") : "";
  return [
    ...(base === "" ? [] : [join(base, "waffle", "waffle.toml")]),
    SYSTEM_CONFIG,
    join(defaultHome(), "waffle.toml"),
  ].filter((path, i, all) => all.indexOf(path) === i);
}

/**
 * Checks a `--config FILE` flag: it must be absolute, since an MCP client
 * starts waffle in a directory of its own choosing.
 *
 * @example
 * ```ts ignore
 * absoluteConfigPath("/etc/waffle/waffle.toml"); // the same
 * absoluteConfigPath("waffle.toml"); // throws
 * ```
 *
 * @param path The flag's value.
 * @param source How it was given, for the message (default `--config`).
 * @returns The path, normalized.
 * @throws {UsageError} When it is relative or contains NUL.
 */
export function absoluteConfigPath(path: string, source = "--config"): string {
  if (!path.startsWith("/") || path.includes("\0")) {
    throw new UsageError(
      `Invalid ${source} '${path}': must be an absolute path (an MCP client may start waffle in any directory)`,
    );
  }
  return resolve(path);
}

/**
 * Loads the sandbox settings (the whole file is validated, MCP policy included).
 *
 * @example
 * ```ts ignore
 * const config = loadConfig({ image: "waffle-runner:dev" });
 * ```
 *
 * @param overrides Values that win over everything (CLI flags, library callers);
 *   `configPath` names the config file.
 * @returns The validated configuration.
 * @throws {UsageError} When the config file or an environment variable is invalid.
 */
export function loadConfig(overrides: Partial<SandboxConfig> = {}): SandboxConfig {
  return loadWaffleConfig({ overrides }).sandbox;
}

/**
 * Loads the whole configuration: sandbox settings and MCP policy. The file is
 * `options.configPath`, else `overrides.configPath`, else `$WAFFLE_CONFIG`,
 * else `<home>/waffle.toml` when the home is given (`overrides.home` or
 * `$WAFFLE_HOME`), else the first of {@linkcode configCandidates} that exists
 * (optional). The home is `overrides.home`, else `$WAFFLE_HOME`, else the
 * file's `[sandbox] home`, else {@linkcode defaultHome}. Needs read access to
 * the file and the environment; never the network.
 *
 * @example
 * ```ts ignore
 * const { sandbox, policy } = loadWaffleConfig({ configPath: "/etc/waffle/waffle.toml" });
 * ```
 *
 * @param options The config file and overrides.
 * @returns The file read (if any) and the files looked at, the settings and the policy.
 * @throws {UnpinnedPackageError} When an MCP server's `package` is not one exact version.
 * @throws {UsageError} When the file, an environment variable or an override is invalid,
 *   a config path is relative, or only a legacy `config.json` exists.
 */
export function loadWaffleConfig(options: LoadOptions = {}): WaffleConfig {
  const overrides = options.overrides ?? {};
  const givenHome = overrides.home ?? (Deno.env.get("WAFFLE_HOME") || undefined);
  if (givenHome !== undefined && (givenHome.includes("\0") || !givenHome.startsWith("/"))) {
    throw new UsageError(`WAFFLE_HOME must be an absolute path: '${givenHome}'`);
  }
  const defined = Object.fromEntries(
    Object.entries(overrides).filter(([, v]) => v !== undefined),
  ) as Partial<SandboxConfig>;
  const { home: _home, ...checked } = defined;
  const valid = settingsSchema.safeParse(checked);
  if (!valid.success) {
    const issue = valid.error.issues[0]!;
    const problem = issueProblem(issue, checked);
    throw new UsageError(`Invalid setting '${problem.key}': ${problem.detail}`);
  }
  const fromEnvConfig = Deno.env.get("WAFFLE_CONFIG") || undefined;
  const explicit = options.configPath !== undefined
    ? absoluteConfigPath(options.configPath)
    : defined.configPath !== undefined
    ? absoluteConfigPath(defined.configPath, "setting 'configPath'")
    : fromEnvConfig !== undefined
    ? absoluteConfigPath(fromEnvConfig, "WAFFLE_CONFIG")
    : undefined;
  const candidates = explicit !== undefined
    ? [explicit]
    : givenHome !== undefined
    ? [join(givenHome, "waffle.toml")]
    : configCandidates();
  const found = findConfigFile(candidates, {
    explicit: explicit !== undefined,
    home: givenHome ?? defaultHome(),
  });
  const fromFile: Settings = {};
  let policy = EMPTY_POLICY;
  let egress = egressSettings(undefined);
  let serve = settingsOrThrow(serveSettings({}), undefined);
  let fileHome: string | undefined;
  if (found !== undefined) {
    const root = parseToml(found.text, found.path);
    const badName = tableNameProblem(root) ?? egressNameProblem(root) ?? serveNameProblem(root);
    if (badName !== undefined) {
      throw new UsageError(`Config file '${found.path}': '${badName.key}' ${badName.detail}`);
    }
    const parsed = fileSchema.safeParse(root);
    if (!parsed.success) {
      const problem = issueProblem(parsed.error.issues[0]!, root, { knownKeys });
      throw new UsageError(`Config file '${found.path}': '${problem.key}' ${problem.detail}`);
    }
    const built = buildPolicy(parsed.data);
    if ("problem" in built) {
      const { key, detail, unpinned } = built.problem;
      const message = `Config file '${found.path}': '${key}' ${detail}`;
      if (unpinned !== undefined) throw new UnpinnedPackageError(message, unpinned);
      throw new UsageError(message);
    }
    policy = built.policy;
    egress = egressSettings(parsed.data.egress);
    serve = settingsOrThrow(serveSettings(parsed.data), found.path);
    const { home: homeKey, ...table } = parsed.data.sandbox ?? {};
    fileHome = homeKey;
    for (const [key, value] of Object.entries(table)) {
      if (value !== undefined) (fromFile as Record<string, unknown>)[SANDBOX_KEYS[key]!] = value;
    }
  }
  // WAFFLE_HOME (or the caller's) wins over the file's home, as every
  // variable wins over the file.
  const spelt = givenHome ?? fileHome ?? defaultHome();
  if (spelt.includes("\0") || !spelt.startsWith("/")) {
    throw new UsageError(`WAFFLE_HOME must be an absolute path: '${spelt}'`);
  }
  // One spelling per home ("/a/home/" and "/a//home" are "/a/home"): container
  // names, labels and state paths are made from it.
  const home = resolve(spelt);
  const fromEnv: Record<string, unknown> = {};
  for (const [name, key] of ENV_OVERRIDES) {
    const value = Deno.env.get(name);
    if (value === undefined || value === "") continue;
    fromEnv[key] = STRING_SETTINGS.has(key) ? value : Number(value);
    const single = settingsSchema.safeParse({ [key]: fromEnv[key] });
    if (!single.success) {
      const issue = single.error.issues[0]!;
      throw new UsageError(
        `Invalid ${name} '${value}': ${issueProblem(issue, {}).detail.replace(/, found .*$/, "")}`,
      );
    }
  }
  const sandbox = {
    ...SANDBOX_DEFAULTS,
    mcpCache: join(home, "mcp-cache"),
    ...fromFile,
    ...fromEnv,
    ...defined,
    home,
    configPath: found?.path,
  } as SandboxConfig;
  refuseOverlap(sandbox.mcpCache, home);
  refuseProblem(egressConfigProblem({ sandbox, policy }), found?.path);
  const searched = found === undefined ? candidates : candidates.slice(0, found.index + 1);
  return { path: found?.path, searched, sandbox, policy, egress, serve };
}

// Settings resolved from the file's tables, or the error of their problem.
function settingsOrThrow<T>(
  built: { settings: T } | { problem: ConfigProblem },
  file: string | undefined,
): T {
  if ("settings" in built) return built.settings;
  throw problemError(built.problem, file);
}

// A problem found once every layer is applied: the file's when there is one.
function refuseProblem(problem: ConfigProblem | undefined, file: string | undefined): void {
  if (problem !== undefined) throw problemError(problem, file);
}

function problemError(problem: ConfigProblem, file: string | undefined): UsageError {
  return new UsageError(
    file === undefined
      ? `Invalid setting '${problem.key}': ${problem.detail}`
      : `Config file '${file}': '${problem.key}' ${problem.detail}`,
  );
}

/**
 * How a config's source reads in a message: `'<file>'`, or `no config file
 * (looked at '<a>', '<b>')`.
 *
 * @example
 * ```ts ignore
 * configSource(loadWaffleConfig()); // "no config file (looked at '/root/.config/waffle/waffle.toml', …)"
 * ```
 *
 * @param config A loaded config (its `path` and `searched`).
 * @returns The phrase.
 */
export function configSource(config: Pick<WaffleConfig, "path" | "searched">): string {
  if (config.path !== undefined) return `'${config.path}'`;
  const looked = config.searched.map((file) => `'${file}'`).join(", ");
  return `no config file (looked at ${looked === "" ? "nothing" : looked})`;
}

// The cache is made world-readable and mounted into every sandbox: it must
// hold nothing of any user's state.
function refuseOverlap(cache: string, home: string): void {
  const a = cache.replace(/\/+$/, "") || "/";
  const b = home.replace(/\/+$/, "") || "/";
  const inside = (x: string, y: string): boolean =>
    x === y || x.startsWith(y === "/" ? "/" : `${y}/`);
  if (inside(a, b) && a !== `${b}/mcp-cache` && !a.startsWith(`${b}/mcp-cache/`)) {
    throw new UsageError(
      `Invalid 'sandbox.mcp_cache' '${cache}': it must not be the waffle home '${home}' or inside it, other than its 'mcp-cache'`,
    );
  }
  if (inside(b, a)) {
    throw new UsageError(
      `Invalid 'sandbox.mcp_cache' '${cache}': it must not contain the waffle home '${home}'`,
    );
  }
}

// The first candidate that exists, with its text. A missing explicit file
// is an error; so is a home with only the legacy config.json.
function findConfigFile(
  candidates: string[],
  options: { explicit: boolean; home: string },
): { path: string; text: string; index: number } | undefined {
  for (const [index, path] of candidates.entries()) {
    try {
      return { path, text: Deno.readTextFileSync(path), index };
    } catch (cause) {
      if (!(cause instanceof Deno.errors.NotFound)) {
        throw new UsageError(`Cannot read config file '${path}': ${String(cause)}`, { cause });
      }
      if (options.explicit) {
        throw new UsageError(`Config file '${path}' does not exist`, { cause });
      }
    }
  }
  const legacy = join(options.home, "config.json");
  if (exists(legacy)) {
    throw new UsageError(
      `Config file '${legacy}' is no longer read: move its settings to '${
        join(options.home, "waffle.toml")
      }' under [sandbox] with snake_case keys (idleSeconds becomes idle_seconds)`,
    );
  }
  return undefined;
}

/**
 * Renders sandbox settings as the `[sandbox]` table of a `waffle.toml`
 * (`home` and `configPath` are not file settings and are left out).
 *
 * @example
 * ```ts ignore
 * Deno.writeTextFileSync(`${home}/waffle.toml`, sandboxToml({ idleSeconds: 5 }));
 * // [sandbox]
 * // idle_seconds = 5
 * ```
 *
 * @param settings camelCase settings.
 * @returns The TOML text.
 */
export function sandboxToml(settings: Partial<SandboxConfig>): string {
  const table: Record<string, unknown> = {};
  for (const [key, field] of Object.entries(SANDBOX_KEYS)) {
    const value = settings[field];
    if (value !== undefined) {
      table[key] = field === "egress" ? settings.egress!.map(formatEntry) : value;
    }
  }
  return stringify({ sandbox: table });
}
