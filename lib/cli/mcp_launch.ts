/**
 * What `waffle mcp run` and `waffle mcp serve` share: the selection flags
 * (server, user, tenant, group or cron job, config), the launch decision
 * made from them, and the opening of the planned server where that decision
 * says (a host process, the user's sandbox, a restricted container). A
 * denied server is refused here, before anything starts, and a server with
 * execution "sandbox" never reaches {@linkcode openHostServer}.
 *
 * @module
 */
import { escapeControls } from "../terminal/control_text.ts";
import { configSource, loadWaffleConfig, type WaffleConfig } from "../config/config.ts";
import { UsageError, WaffleError } from "../errors.ts";
import type { EgressAttachment } from "../config/egress_types.ts";
import { restrictedAttachment } from "../config/resolve.ts";
import type { ServerConnection } from "../mcp/connection.ts";
import { type HostServerConnection, openHostServer } from "../mcp/host_server.ts";
import { fetchPackage, isCached, mcpCacheDir } from "../mcp/package_cache.ts";
import { planLaunch, type PlannedServer, type Where } from "../mcp/plan.ts";
import { DEFAULT_MAX_MESSAGE_BYTES, type McpServerConfig } from "../config/mcp_types.ts";
import type { RelayContext, RelayOptions } from "../mcp/relay.ts";
import { openSandboxServer } from "../mcp/sandbox_server.ts";
import { type Parsed, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";

/** The flags that pick a server's launch: spread them into a subcommand's own. */
export const LAUNCH_FLAGS = {
  user: { type: "string" },
  tenant: { type: "string" },
  group: { type: "string" },
  cron: { type: "string" },
  config: { type: "string" },
} as const;

/** A server cleared to launch: the plan, who it is for, and where its packages are cached. */
export interface Launch {
  /** The server's name (`[mcp.<name>]`). */
  name: string;
  /** The loaded configuration. */
  config: WaffleConfig;
  /** The server's own configuration. */
  server: McpServerConfig;
  /** Its launch decision (always "launch"). */
  planned: PlannedServer;
  /** Where it executes. */
  where: Where;
  /** Who is calling, for the relay's audit lines. */
  context: RelayContext;
  /** The host's npm package cache. */
  cacheDir: string;
}

/**
 * Decides a launch from a subcommand's parsed flags (see {@linkcode LAUNCH_FLAGS})
 * and its one positional, the server's name.
 *
 * @example
 * ```ts ignore
 * const launch = resolveLaunch(parse(args, { ...LAUNCH_FLAGS }));
 * ```
 *
 * @param parsed The parsed arguments.
 * @returns The launch.
 * @throws {UsageError} On both --group and --cron, an unknown server, a missing --user or a bad config.
 * @throws {WaffleError} When the plan denies the server.
 */
export function resolveLaunch(parsed: Parsed): Launch {
  const name = onePositional(parsed.positionals);
  const group = stringFlag(parsed, "group");
  const cron = stringFlag(parsed, "cron");
  if (group !== undefined && cron !== undefined) {
    throw new UsageError("Give --group G or --cron J, not both");
  }
  const user = stringFlag(parsed, "user");
  const tenant = stringFlag(parsed, "tenant") ?? "default";
  const config = loadWaffleConfig({ configPath: stringFlag(parsed, "config") });
  const server = configuredServer(config, name);
  const plan = planLaunch({ sandbox: config.sandbox, policy: config.policy }, {
    group,
    cron,
    user,
  });
  const planned = plan.servers.find((s) => s.name === name)!;
  if (planned.decision !== "launch") {
    const subject = plan.subject.kind === "cron"
      ? `cron '${plan.subject.name}'`
      : `group '${plan.group}'`;
    throw new WaffleError(
      `Server '${name}' is denied for ${subject}: ${planned.reasons.join("; ")}`,
    );
  }
  const where = planned.where;
  if (where === undefined) throw new WaffleError(`Server '${name}' has no place to execute`);
  if (where !== "host" && user === undefined) {
    throw new UsageError(`Missing --user U: server '${name}' runs in a ${where} container`);
  }
  return {
    name,
    config,
    server,
    planned,
    where,
    context: { user: user ?? null, tenant, group: plan.group, cron: cron ?? null },
    cacheDir: mcpCacheDir(config.sandbox),
  };
}

/** Options of {@linkcode openLaunch}. */
export interface OpenLaunchOptions {
  /** The resolved environment (`resolveEnv(planned.envSources)`: literals and host values). */
  env: Record<string, string>;
  /** Where progress lines go (stderr). */
  io: CliIo;
}

/**
 * Starts the server of a launch: one connection, one server process (or
 * sandbox session). Fetch its package first with {@linkcode ensureFetched}.
 *
 * @example
 * ```ts ignore
 * const connection = await openLaunch(launch, { env: resolveEnv(launch.planned.envSources), io });
 * ```
 *
 * @param launch The launch.
 * @param options Environment and progress output.
 * @returns The connection.
 * @throws {WaffleError} When the server cannot start, or a host plan is for a sandboxed server.
 */
export function openLaunch(launch: Launch, options: OpenLaunchOptions): Promise<ServerConnection> {
  const { name, planned, where, context } = launch;
  if (where === "host") {
    // Belt and braces: the plan never puts an execution "sandbox" server
    // on the host; if it ever did, refuse rather than start it.
    if (launch.server.execution !== "host") {
      return Promise.reject(
        new WaffleError(`Server '${name}' has execution "sandbox"; it never starts on the host`),
      );
    }
    return openHostServer(planned, { env: options.env, cacheDir: launch.cacheDir });
  }
  return openSandboxServer(planned, {
    user: context.user!,
    tenant: context.tenant,
    env: options.env,
    config: launch.config.sandbox,
    onProgress: (line) => void options.io.stderr(`waffle: ${escapeControls(line)}\n`),
    egress: where === "restricted" ? launchEgress(launch) : undefined,
  });
}

/**
 * The egress identity of a restricted launch's session: its server's own
 * `egress`, narrowed by the session's group or cron job (see
 * `restrictedAttachment`); undefined when it has none.
 *
 * @example
 * ```ts ignore
 * const egress = launchEgress(resolveLaunch(parsed)); // { id: "r-…", identity: { server: "fetch", … }, … }
 * ```
 *
 * @param launch A launch whose `where` is "restricted".
 * @returns The attachment, or undefined.
 * @throws {UsageError} When the launch is not restricted.
 */
export function launchEgress(launch: Launch): EgressAttachment | undefined {
  const { context } = launch;
  if (launch.where !== "restricted" || context.user === null) {
    throw new UsageError(`Server '${launch.name}' is not a restricted server's session`);
  }
  return restrictedAttachment(launch.config, {
    tenant: context.tenant,
    user: context.user,
    server: launch.name,
    // A cron job names its own group.
    ...(context.cron === null ? { group: context.group } : { cron: context.cron }),
  });
}

/**
 * The relay's options for a launch: its allowlists, who is calling, and the
 * audit log. Every session of `mcp run` and `mcp serve` gets exactly these.
 *
 * @example
 * ```ts ignore
 * await relay(client, connection, relayOptions(launch, { audit, stderr: io.stderr, signal }));
 * ```
 *
 * @param launch The launch.
 * @param options The audit log, the stderr writer and the signal that ends the session.
 * @returns The relay's options.
 */
export function relayOptions(
  launch: Launch,
  options: Pick<RelayOptions, "audit" | "stderr" | "signal">,
): RelayOptions {
  const { planned } = launch;
  return {
    name: planned.name,
    tools: planned.tools,
    clientRequests: planned.clientRequests,
    context: launch.context,
    maxMessageBytes: maxMessageBytes(launch),
    ...options,
  };
}

/**
 * The largest message the launch's server may send or be sent: its plan's,
 * when the plan carries one, else its config's `max_message_bytes`, else the
 * default. `mcp serve` caps request bodies at this size.
 *
 * @example
 * ```ts ignore
 * const limit = maxMessageBytes(launch); // 67108864 by default
 * ```
 *
 * @param launch The launch.
 * @returns Bytes.
 */
export function maxMessageBytes(launch: Launch): number {
  const planned: { maxMessageBytes?: number | undefined } = launch.planned;
  const server: { maxMessageBytes?: number | undefined } = launch.server;
  return planned.maxMessageBytes ?? server.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
}

/** The signals that end a session, with their numbers (for the exit status 128+N). */
const SIGNALS: [Deno.Signal, number][] = [["SIGTERM", 15], ["SIGINT", 2], ["SIGHUP", 1]];

/**
 * Calls `onSignal` with the signal's number on SIGTERM, SIGINT or SIGHUP
 * until the returned function is called.
 *
 * @example
 * ```ts ignore
 * const stop = onEndSignals((number) => abort.abort());
 * try { await work(); } finally { stop(); }
 * ```
 *
 * @param onSignal What to do (it may be called more than once).
 * @returns A function that removes the listeners.
 */
export function onEndSignals(onSignal: (number: number) => void): () => void {
  const handlers: [Deno.Signal, () => void][] = SIGNALS.map((
    [signal, number],
  ) => [signal, () => onSignal(number)]);
  for (const [signal, handler] of handlers) {
    try {
      Deno.addSignalListener(signal, handler);
    } catch {
      // Not supported here (Windows): the default action applies.
    }
  }
  return () => {
    for (const [signal, handler] of handlers) {
      try {
        Deno.removeSignalListener(signal, handler);
      } catch {
        // Never added.
      }
    }
  };
}

/**
 * Ends a connection at once where that is possible (a host server's
 * process group is killed); a sandbox session ends through its `close()`.
 *
 * @param connection The connection.
 */
export function killNow(connection: ServerConnection): void {
  void (connection as Partial<HostServerConnection>).kill?.();
}

/**
 * Fetches a launch's npm package into the host cache unless it is there.
 *
 * @example
 * ```ts ignore
 * await ensureFetched(launch, io);
 * ```
 *
 * @param launch The launch.
 * @param io Where progress goes (stderr).
 * @throws {WaffleError} When the package cannot be fetched.
 */
export async function ensureFetched(launch: Launch, io: CliIo): Promise<void> {
  const spec = launch.planned.program.package;
  if (spec === undefined || isCached(spec, launch.cacheDir)) return;
  await fetchWithProgress(spec, { cacheDir: launch.cacheDir, io });
}

/**
 * Fetches an npm package into the cache, with Deno's progress on stderr.
 *
 * @example
 * ```ts ignore
 * await fetchWithProgress("npm:@modelcontextprotocol/server-everything@2026.8.31", { cacheDir, io });
 * ```
 *
 * @param spec `npm:<name>@<version>`.
 * @param options The cache and the streams.
 * @throws {WaffleError} When the package cannot be fetched.
 */
export async function fetchWithProgress(
  spec: string,
  options: { cacheDir: string; io: CliIo },
): Promise<void> {
  const { io, cacheDir } = options;
  let chain = io.stderr(`waffle: fetching '${spec}' into '${cacheDir}'\n`);
  try {
    await fetchPackage(spec, {
      cacheDir,
      onProgress: (line) => {
        chain = chain.then(() => io.stderr(`waffle: ${escapeControls(line)}\n`));
      },
    });
  } finally {
    await chain.catch(() => {});
  }
}

/**
 * A configured server by name.
 *
 * @example
 * ```ts ignore
 * const server = configuredServer(loadWaffleConfig(), "everything");
 * ```
 *
 * @param config The configuration.
 * @param name The server's name.
 * @returns Its configuration.
 * @throws {UsageError} When no server has that name (the message lists the configured ones).
 */
export function configuredServer(config: WaffleConfig, name: string): McpServerConfig {
  const servers = config.policy.servers;
  if (!Object.hasOwn(servers, name)) {
    const names = Object.keys(servers);
    const configured = names.length === 0 ? "none" : names.map((n) => `'${n}'`).join(", ");
    throw new UsageError(
      `Unknown MCP server '${name}' (${configSource(config)}); configured: ${configured}`,
    );
  }
  return servers[name]!;
}

/**
 * The one positional argument, a server's name.
 *
 * @example
 * ```ts
 * onePositional(["everything"]); // "everything"
 * ```
 *
 * @param positionals The parsed positionals.
 * @returns The name.
 * @throws {UsageError} When there is none, or more than one.
 */
export function onePositional(positionals: string[]): string {
  const [name, extra] = positionals;
  if (name === undefined) throw new UsageError("Missing server NAME");
  if (extra !== undefined) throw new UsageError(`Unexpected argument '${extra}'`);
  return name;
}
