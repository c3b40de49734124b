/**
 * waffle's configuration: defaults, then `$WAFFLE_HOME/config.json`, then
 * environment variables. Every value is validated; a bad one is a one-line
 * error naming where it came from.
 *
 * @module
 */
import { join } from "node:path";
import { z } from "zod";
import { UsageError } from "../errors.ts";

/** Settings that shape the sandbox container. */
export interface SandboxConfig {
  /** Root of per-user state (queues, workspaces) and locks. */
  home: string;
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
}

const fileSchema = z.object({
  image: z.string().min(1).max(256).optional(),
  idleSeconds: z.number().min(0).max(7 * 24 * 3600).optional(),
  // The runner itself uses up to ~25 tasks (threads count against pids.max).
  pidsLimit: z.number().int().min(32).max(65536).optional(),
  memoryBytes: z.number().int().min(32 * 1024 * 1024).optional(),
  cpus: z.number().positive().max(1024).optional(),
  tmpBytes: z.number().int().min(1024 * 1024).optional(),
  network: z.enum(["none", "bridge"]).optional(),
  envAllowlist: z.array(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/)).max(256).optional(),
  maxRunning: z.number().int().min(0).optional(),
  quotaBytes: z.number().int().min(16 * 1024 * 1024).optional(),
}).strict();

const DEFAULTS: Omit<SandboxConfig, "home"> = {
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
};

const ENV_OVERRIDES: [string, keyof z.infer<typeof fileSchema>][] = [
  ["WAFFLE_IMAGE", "image"],
  ["WAFFLE_IDLE_SECONDS", "idleSeconds"],
  ["WAFFLE_PIDS_LIMIT", "pidsLimit"],
  ["WAFFLE_MEMORY_BYTES", "memoryBytes"],
  ["WAFFLE_CPUS", "cpus"],
  ["WAFFLE_MAX_RUNNING", "maxRunning"],
  ["WAFFLE_QUOTA_BYTES", "quotaBytes"],
];

/**
 * The default state root: `$WAFFLE_HOME`, else `/var/lib/waffle` for root,
 * else `$XDG_STATE_HOME/waffle` or `~/.local/state/waffle`.
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

/**
 * Loads the configuration.
 *
 * @param overrides Values that win over everything (CLI flags, library callers).
 * @returns The validated configuration.
 * @throws {UsageError} When the config file or an environment variable is invalid.
 */
export function loadConfig(overrides: Partial<SandboxConfig> = {}): SandboxConfig {
  const home = overrides.home ?? defaultHome();
  if (home.includes("\0") || !home.startsWith("/")) {
    throw new UsageError(`WAFFLE_HOME must be an absolute path: '${home}'`);
  }
  const path = join(home, "config.json");
  let fromFile: z.infer<typeof fileSchema> = {};
  let raw: string | undefined;
  try {
    raw = Deno.readTextFileSync(path);
  } catch (cause) {
    if (!(cause instanceof Deno.errors.NotFound)) {
      throw new UsageError(`Cannot read config file '${path}': ${String(cause)}`, { cause });
    }
  }
  if (raw !== undefined) {
    let json: unknown;
    try {
      json = JSON.parse(raw);
    } catch (cause) {
      throw new UsageError(`Config file '${path}' is not valid JSON`, { cause });
    }
    const parsed = fileSchema.safeParse(json);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      throw new UsageError(
        `Config file '${path}': '${
          issue?.path.join(".") || (issue as { keys?: string[] })?.keys?.join(",") || "?"
        }' ${issue?.message ?? "is invalid"}`,
      );
    }
    fromFile = parsed.data;
  }
  const fromEnv: Record<string, unknown> = {};
  for (const [name, key] of ENV_OVERRIDES) {
    const value = Deno.env.get(name);
    if (value === undefined || value === "") continue;
    fromEnv[key] = key === "image" ? value : Number(value);
    const single = fileSchema.safeParse({ [key]: fromEnv[key] });
    if (!single.success) {
      throw new UsageError(
        `Invalid ${name} '${value}': ${single.error.issues[0]?.message ?? "invalid"}`,
      );
    }
  }
  const defined = Object.fromEntries(Object.entries(overrides).filter(([, v]) => v !== undefined));
  const { home: _home, ...checked } = defined;
  const valid = fileSchema.safeParse(checked);
  if (!valid.success) {
    const issue = valid.error.issues[0];
    throw new UsageError(
      `Invalid setting '${issue?.path.join(".") ?? "?"}': ${issue?.message ?? "invalid"}`,
    );
  }
  return { ...DEFAULTS, ...fromFile, ...fromEnv, ...defined, home } as SandboxConfig;
}
