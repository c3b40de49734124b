/**
 * `waffle mcp run` and `waffle mcp fetch`: serve a configured MCP server on
 * stdio, executed where its plan says, and fetch npm server packages into
 * the host cache. Nothing but JSON-RPC is ever written to `mcp run`'s stdout;
 * progress and errors go to stderr.
 *
 * @module
 */
import { escapeControls } from "../terminal/control_text.ts";
import { loadWaffleConfig } from "../config/config.ts";
import { ProtocolError, UsageError, WaffleError } from "../errors.ts";
import { EXIT_FAILURE, EXIT_SIGNAL_BASE, EXIT_WAFFLE, exitCodeOfSignal } from "../exit_codes.ts";
import { type AuditLog, openAuditLog } from "../mcp/audit.ts";
import type { ServerConnection } from "../mcp/connection.ts";
import { isCached, mcpCacheDir } from "../mcp/package_cache.ts";
import { resolveEnv } from "../mcp/plan.ts";
import { relay } from "../mcp/relay.ts";
import { parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";
import { warnUnsetEnv } from "./mcp_warnings.ts";
import {
  configuredServer,
  ensureFetched,
  fetchWithProgress,
  killNow,
  type Launch,
  LAUNCH_FLAGS,
  onEndSignals,
  onePositional,
  openLaunch,
  relayOptions,
  resolveLaunch,
} from "./mcp_launch.ts";

/** Help of `waffle mcp run`. */
export const MCP_RUN_HELP =
  `Usage: waffle mcp run NAME [--user U] [--tenant T] [--group G | --cron J] [--config FILE]

Serves MCP server NAME on stdin/stdout for any MCP client, executed where
the config's plan for the group (default 'default') or cron job says: on the
host, in user U's sandbox, or in a restricted container (--user is required
for both sandboxes). A denied server is refused before anything starts; a
server with execution "sandbox" never starts on the host.

The config is --config FILE (an absolute path), else $WAFFLE_CONFIG, else
$WAFFLE_HOME/waffle.toml, else the first of ~/.config/waffle/waffle.toml,
/etc/waffle/waffle.toml and the default home's waffle.toml, so a client that
passes no environment still finds it. The server gets its own writable
HOME, XDG_*_HOME and TMPDIR (see 'waffle mcp plan'); a host variable its
env names that is not set is named on stderr.

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
  const launch = resolveLaunch(parse(args, { ...LAUNCH_FLAGS }));
  if (io.stdin === null) {
    throw new UsageError("Stdin is a terminal: 'waffle mcp run' expects an MCP client on stdin");
  }
  const audit = openAuditLog(launch.config.sandbox.home, {
    onError: (message) => void io.stderr(`waffle: ${escapeControls(message)}\n`),
  });
  try {
    await ensureFetched(launch, io);
    await warnUnsetEnv(launch.planned, io);
    const connection = await openLaunch(launch, {
      env: resolveEnv(launch.planned.envSources),
      io,
    });
    return await serve(connection, { io, stdin: io.stdin, launch, audit });
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
  options: { io: CliIo; stdin: ReadableStream<Uint8Array>; launch: Launch; audit: AuditLog },
): Promise<number> {
  const { io, launch } = options;
  const abort = new AbortController();
  let signalled: number | undefined;
  const stopListening = onEndSignals((number) => {
    signalled ??= number;
    // A host server dies at once; a sandbox session ends through close().
    killNow(connection);
    abort.abort();
  });
  try {
    const result = await relay(
      { input: options.stdin, output: (bytes) => io.stdout(bytes) },
      connection,
      relayOptions(launch, {
        audit: options.audit,
        stderr: (data) => io.stderr(data),
        signal: abort.signal,
      }),
    );
    if (result.ended === "client") return 0;
    if (result.ended === "aborted") return exitCodeOfSignal(signalled ?? 15);
    if (result.ended === "error") throw new ProtocolError(result.reason);
    throw new WaffleError(`Server '${launch.name}' ended: ${result.reason}`, {
      exitCode: EXIT_FAILURE,
    });
  } finally {
    stopListening();
  }
}
