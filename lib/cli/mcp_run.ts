/**
 * `waffle mcp run` and `waffle mcp fetch`: serve a configured MCP server on
 * stdio, executed where its plan says, and fetch npm server packages into
 * the host cache. Nothing but JSON-RPC is ever written to `mcp run`'s stdout;
 * progress and errors go to stderr.
 *
 * @module
 */
import { loadWaffleConfig, type WaffleConfig } from "../config/config.ts";
import { ProtocolError, UsageError, WaffleError } from "../errors.ts";
import { EXIT_FAILURE, EXIT_SIGNAL_BASE, EXIT_WAFFLE, exitCodeOfSignal } from "../exit_codes.ts";
import { openAuditLog } from "../mcp/audit.ts";
import type { ServerConnection } from "../mcp/connection.ts";
import { type HostServerConnection, openHostServer } from "../mcp/host_server.ts";
import { fetchPackage, isCached, mcpCacheDir } from "../mcp/package_cache.ts";
import { planLaunch, type PlannedServer, resolveEnv } from "../mcp/plan.ts";
import { relay } from "../mcp/relay.ts";
import { openSandboxServer } from "../mcp/sandbox_server.ts";
import { parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle mcp run`. */
export const MCP_RUN_HELP =
  `Usage: waffle mcp run NAME [--user U] [--tenant T] [--group G | --cron J] [--config FILE]

Serves MCP server NAME on stdin/stdout for any MCP client, executed where
the config's plan for the group (default 'default') or cron job says: on the
host, in user U's sandbox, or in a restricted container (--user is required
for both sandboxes). A denied server is refused before anything starts; a
server with execution "sandbox" never starts on the host.

Every message is relayed both ways; the server's 'tools' allowlist filters
tools/list and refuses other tools/call requests, and its 'client_requests'
allowlist (default roots/list and ping) refuses the server's other requests
to the client (sampling, elicitation) without showing them to it. Each
tools/call and server request appends a line to $WAFFLE_HOME/audit.jsonl
(argument names, never values). An npm package not yet cached is fetched
first, with progress on stderr.

Exit status: 0 when the client closed its input; ${EXIT_FAILURE} when the server ended
first (the reason on stderr); ${EXIT_WAFFLE} when denied or on a usage, config or
protocol error; ${EXIT_SIGNAL_BASE}+N on signal N.
`;

/** Help of `waffle mcp fetch`. */
export const MCP_FETCH_HELP = `Usage: waffle mcp fetch NAME [--config FILE] [--json]

Fetches npm server package NAME (and its dependencies) into the host's
package cache ([sandbox] mcp_cache, default $WAFFLE_HOME/mcp-cache), which
sandboxes mount read-only. Progress goes to stderr.
`;

const SIGNALS: [Deno.Signal, number][] = [["SIGTERM", 15], ["SIGINT", 2], ["SIGHUP", 1]];

/**
 * Runs `waffle mcp run`.
 *
 * @param args Arguments after `mcp run`.
 * @param io Process streams.
 * @returns The exit status.
 * @throws {UsageError} On bad flags, an unknown server, a missing --user or a bad config.
 * @throws {WaffleError} When the server is denied (`EXIT_WAFFLE`), cannot start, or ends
 *   first (`EXIT_FAILURE`).
 */
export async function mcpRunCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    user: { type: "string" },
    tenant: { type: "string" },
    group: { type: "string" },
    cron: { type: "string" },
    config: { type: "string" },
  });
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
  const plan = planLaunch({ sandbox: config.sandbox, policy: config.policy }, { group, cron });
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
  if (where !== "host" && user === undefined) {
    throw new UsageError(`Missing --user U: server '${name}' runs in a ${where} container`);
  }
  if (io.stdin === null) {
    throw new UsageError("Stdin is a terminal: 'waffle mcp run' expects an MCP client on stdin");
  }
  const audit = openAuditLog(config.sandbox.home, {
    onError: (message) => void io.stderr(`waffle: ${message}\n`),
  });
  try {
    const cacheDir = mcpCacheDir(config.sandbox);
    await ensureFetched(planned, { cacheDir, io });
    const env = resolveEnv(planned.env);
    let connection: ServerConnection;
    if (where === "host") {
      // Belt and braces: the plan never puts an execution "sandbox" server
      // on the host; if it ever did, refuse rather than start it.
      if (server.execution !== "host") {
        throw new WaffleError(
          `Server '${name}' has execution "sandbox"; it never starts on the host`,
        );
      }
      connection = await openHostServer(planned, { env, cacheDir });
    } else if (where === "sandbox" || where === "restricted") {
      connection = await openSandboxServer(planned, {
        user: user!,
        tenant,
        env,
        config: config.sandbox,
        onProgress: (line) => void io.stderr(`waffle: ${line}\n`),
      });
    } else {
      throw new WaffleError(`Server '${name}' has no place to execute`);
    }
    return await serve(connection, {
      io,
      stdin: io.stdin,
      planned,
      context: { user: user ?? null, tenant, group: plan.group, cron: cron ?? null },
      audit,
    });
  } finally {
    audit.close();
  }
}

/**
 * Runs `waffle mcp fetch`.
 *
 * @param args Arguments after `mcp fetch`.
 * @param io Process streams.
 * @returns 0.
 * @throws {UsageError} On bad flags, an unknown server or a server that is not a package.
 * @throws {WaffleError} When the package cannot be fetched.
 */
export async function mcpFetchCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { config: { type: "string" }, json: { type: "boolean" } });
  const name = onePositional(parsed.positionals);
  const config = loadWaffleConfig({ configPath: stringFlag(parsed, "config") });
  const server = configuredServer(config, name);
  if (server.package === undefined) {
    throw new UsageError(
      `Server '${name}' is a command ('${server.command}'), not an npm package; nothing to fetch`,
    );
  }
  const cacheDir = mcpCacheDir(config.sandbox);
  const wasCached = isCached(server.package, cacheDir);
  const started = Date.now();
  await fetchWithProgress(server.package, { cacheDir, io });
  const seconds = Math.round((Date.now() - started) / 100) / 10;
  if (parsed.values.json) {
    await io.stdout(
      `${
        JSON.stringify({
          server: name,
          package: server.package,
          cacheDir,
          alreadyCached: wasCached,
          seconds,
        })
      }\n`,
    );
  } else {
    await io.stdout(`Fetched '${server.package}' into '${cacheDir}' in ${seconds}s\n`);
  }
  return 0;
}

async function serve(
  connection: ServerConnection,
  options: {
    io: CliIo;
    stdin: ReadableStream<Uint8Array>;
    planned: PlannedServer;
    context: { user: string | null; tenant: string; group: string; cron: string | null };
    audit: ReturnType<typeof openAuditLog>;
  },
): Promise<number> {
  const { io, planned } = options;
  const abort = new AbortController();
  let signalled: number | undefined;
  const handlers: [Deno.Signal, () => void][] = SIGNALS.map(([signal, number]) => [
    signal,
    () => {
      signalled ??= number;
      // A host server dies at once; a sandbox session ends through close().
      void (connection as Partial<HostServerConnection>).kill?.();
      abort.abort();
    },
  ]);
  for (const [signal, handler] of handlers) {
    try {
      Deno.addSignalListener(signal, handler);
    } catch {
      // Not supported here (Windows): the default action applies.
    }
  }
  try {
    const result = await relay(
      { input: options.stdin, output: (bytes) => io.stdout(bytes) },
      connection,
      {
        name: planned.name,
        tools: planned.tools,
        clientRequests: planned.clientRequests,
        context: options.context,
        audit: options.audit,
        stderr: (data) => io.stderr(data),
        signal: abort.signal,
      },
    );
    if (result.ended === "client") return 0;
    if (result.ended === "aborted") return exitCodeOfSignal(signalled ?? 15);
    if (result.ended === "error") throw new ProtocolError(result.reason);
    throw new WaffleError(`Server '${planned.name}' ended: ${result.reason}`, {
      exitCode: EXIT_FAILURE,
    });
  } finally {
    for (const [signal, handler] of handlers) {
      try {
        Deno.removeSignalListener(signal, handler);
      } catch {
        // Never added.
      }
    }
  }
}

async function ensureFetched(
  planned: PlannedServer,
  options: { cacheDir: string; io: CliIo },
): Promise<void> {
  const spec = planned.program.package;
  if (spec === undefined || isCached(spec, options.cacheDir)) return;
  await fetchWithProgress(spec, options);
}

async function fetchWithProgress(
  spec: string,
  options: { cacheDir: string; io: CliIo },
): Promise<void> {
  const { io, cacheDir } = options;
  let chain = io.stderr(`waffle: fetching '${spec}' into '${cacheDir}'\n`);
  try {
    await fetchPackage(spec, {
      cacheDir,
      onProgress: (line) => {
        chain = chain.then(() => io.stderr(`waffle: ${line}\n`));
      },
    });
  } finally {
    await chain.catch(() => {});
  }
}

function configuredServer(
  config: WaffleConfig,
  name: string,
): WaffleConfig["policy"]["servers"][string] {
  const servers = config.policy.servers;
  if (!Object.hasOwn(servers, name)) {
    const names = Object.keys(servers);
    const configured = names.length === 0 ? "none" : names.map((n) => `'${n}'`).join(", ");
    const where = config.path === undefined ? "no config file" : `'${config.path}'`;
    throw new UsageError(`Unknown MCP server '${name}' (${where}); configured: ${configured}`);
  }
  return servers[name]!;
}

function onePositional(positionals: string[]): string {
  const [name, extra] = positionals;
  if (name === undefined) throw new UsageError("Missing server NAME");
  if (extra !== undefined) throw new UsageError(`Unexpected argument '${extra}'`);
  return name;
}
