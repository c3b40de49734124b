/**
 * Probes a configured MCP server for `waffle doctor` and `waffle mcp plan
 * --probe`: starts it where its plan says, as a throwaway user in a
 * throwaway home (so no real user's sandbox or server state is touched),
 * sends `initialize` and `tools/list`, and compares what it offers with its
 * `tools` allowlist. The host's package cache is used as it is: nothing is
 * fetched.
 *
 * @module
 */
import { loadWaffleConfig, type WaffleConfig } from "../config/config.ts";
import { DockerClient } from "../docker/mod.ts";
import { UsageError, WaffleError } from "../errors.ts";
import { removeSandbox } from "../sandbox/remove.ts";
import { sandboxKey } from "../config/sandbox_key.ts";
import { removeTree } from "../lifecycle/remove_tree.ts";
import type { ServerConnection } from "../mcp/connection.ts";
import { openHostServer } from "../mcp/host_server.ts";
import { isCached, mcpCacheDir } from "../mcp/package_cache.ts";
import { planLaunch, type PlannedServer, resolveEnv, type Where } from "../mcp/plan.ts";
import { probeServer } from "../mcp/probe.ts";
import { openSandboxServer } from "../mcp/sandbox_server.ts";

/** What a probe of a configured server found. */
export interface ServerProbe {
  /** Where it ran. */
  where: Where;
  /** The tools it offers (first page of `tools/list`). */
  tools: string[];
  /** Tools its `tools` allowlist names that it does not offer: a misspelling, or a removed tool. */
  notOffered: string[];
  /** How many of its tools the allowlist lets through ("all" without an allowlist). */
  allowed: number | "all";
  /** Milliseconds of `initialize`. */
  initializeMs: number;
  /** Milliseconds of `tools/list`. */
  listMs: number;
  /** Milliseconds from the start, container start included. */
  totalMs: number;
}

/** Options of {@linkcode probeConfiguredServer}. */
export interface ProbeOptions {
  /** The group or cron job whose plan to probe (default: group "default"). */
  subject?: { group?: string | undefined; cron?: string | undefined } | undefined;
  /** The throwaway user's name (default "probe"). */
  user?: string | undefined;
  /** Milliseconds for `initialize` and `tools/list` together (default 60 s). */
  timeoutMs?: number | undefined;
}

/**
 * Starts a configured server in a throwaway home, initializes it, lists its
 * tools and ends it. Needs Docker for a sandboxed server; a host server is
 * started on the host, as `waffle mcp run` would.
 *
 * @example
 * ```ts ignore
 * const found = await probeConfiguredServer(loadWaffleConfig(), "memory");
 * if (found.notOffered.length > 0) console.error(found.notOffered);
 * ```
 *
 * @param config The loaded config (its file is read again, with a throwaway home).
 * @param name The server (`[mcp.<name>]`).
 * @param options The plan's subject, the user name and a timeout.
 * @returns What it offers, and what its allowlist names that it does not.
 * @throws {UsageError} When the server is not configured or its plan denies it.
 * @throws {WaffleError} When its package is not cached, or it cannot start or answer.
 */
export async function probeConfiguredServer(
  config: WaffleConfig,
  name: string,
  options: ProbeOptions = {},
): Promise<ServerProbe> {
  if (config.path === undefined || !Object.hasOwn(config.policy.servers, name)) {
    throw new UsageError(`Unknown MCP server '${name}'`);
  }
  const home = await Deno.makeTempDir({ prefix: "waffle-probe-" });
  const user = options.user ?? "probe";
  const started = performance.now();
  let planned: PlannedServer | undefined;
  let scratch: WaffleConfig | undefined;
  try {
    // The same file and the same package cache, another home.
    scratch = loadWaffleConfig({
      configPath: config.path,
      overrides: { home, idleSeconds: 60, mcpCache: mcpCacheDir(config.sandbox) },
    });
    planned = planLaunch(scratch, options.subject ?? {}).servers.find((s) => s.name === name);
    if (planned === undefined || planned.decision !== "launch") {
      throw new UsageError(`Denied by policy: ${planned?.reasons.join("; ") ?? "not planned"}`);
    }
    const spec = planned.program.package;
    if (spec !== undefined && !isCached(spec, scratch.sandbox.mcpCache)) {
      throw new WaffleError(
        `Package '${spec}' is not in the cache '${scratch.sandbox.mcpCache}': run 'waffle mcp fetch ${name}'`,
      );
    }
    const env = resolveEnv(planned.envSources);
    const connection: ServerConnection = planned.where === "host"
      ? await openHostServer(planned, { env, cacheDir: scratch.sandbox.mcpCache })
      : await openSandboxServer(planned, {
        user,
        tenant: "default",
        env,
        config: scratch.sandbox,
      });
    try {
      const found = await probeServer(connection, { timeoutMs: options.timeoutMs ?? 60_000 });
      const allowlist = planned.tools;
      return {
        where: planned.where ?? "sandbox",
        tools: found.tools,
        notOffered: allowlist === "all" ? [] : allowlist.filter((t) => !found.tools.includes(t)),
        allowed: allowlist === "all"
          ? "all"
          : found.tools.filter((tool) => allowlist.includes(tool)).length,
        initializeMs: found.initializeMs,
        listMs: found.listMs,
        totalMs: performance.now() - started,
      };
    } finally {
      await connection.close();
    }
  } finally {
    if (scratch !== undefined && planned?.where !== undefined && planned.where !== "host") {
      const key = sandboxKey("default", user, { home });
      await removeSandbox(new DockerClient(), key, { config: scratch.sandbox, purge: true })
        .catch(() => false);
    }
    // What is left is a sandbox's state: never a recursive delete in process.
    await removeTree(home).catch(() => false);
  }
}
