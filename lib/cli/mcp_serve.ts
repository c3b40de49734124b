/**
 * `waffle mcp serve`: one configured MCP server over MCP's Streamable HTTP
 * transport, for clients that connect by URL. The launch is decided exactly
 * as `waffle mcp run` decides it (the same flags, plan and refusals), and
 * every MCP session gets what one `mcp run` process gets: its own server
 * (a sandbox session, a restricted container or a host process) behind its
 * own relay, with the same allowlists and audit lines.
 *
 * @module
 */
import { escapeControls } from "../terminal/control_text.ts";
import { UsageError } from "../errors.ts";
import { EXIT_WAFFLE, exitCodeOfSignal } from "../exit_codes.ts";
import { openAuditLog } from "../mcp/audit.ts";
import { newBearerToken, readBearerToken } from "../mcp/bearer_token.ts";
import type { ServerConnection } from "../mcp/connection.ts";
import {
  DEFAULT_IDLE_TIMEOUT_MS,
  DEFAULT_MAX_SESSIONS,
  type McpHttpServer,
  serveMcpHttp,
} from "../mcp/http_server.ts";
import { isLoopbackHost, parseListenAddress } from "../mcp/loopback.ts";
import { resolveEnv } from "../mcp/plan.ts";
import { numberFlag, parse, stringFlag } from "./args.ts";
import { HTTP_LIMIT_FLAGS, HTTP_LIMIT_HELP, HTTP_LIMIT_USAGE, httpLimitsOf } from "./http_flags.ts";
import type { CliIo } from "./io.ts";
import {
  ensureFetched,
  killNow,
  type Launch,
  LAUNCH_FLAGS,
  maxMessageBytes,
  onEndSignals,
  openLaunch,
  relayOptions,
  resolveLaunch,
} from "./mcp_launch.ts";

/** Where `mcp serve` listens without `--listen`: a free loopback port. */
const DEFAULT_LISTEN = "127.0.0.1:0";
const IDLE_SECONDS = DEFAULT_IDLE_TIMEOUT_MS / 1000;

/** Help of `waffle mcp serve`. */
export const MCP_SERVE_HELP =
  `Usage: waffle mcp serve NAME [--listen HOST:PORT] [--user U] [--tenant T]
                        [--group G | --cron J] [--config FILE] [--token-file PATH]
                        [--max-sessions N] [--idle-timeout SECONDS] [--allow-remote] [--json]
${HTTP_LIMIT_USAGE.replace(/^/gm, " ".repeat(24))}

Serves MCP server NAME over MCP's Streamable HTTP transport at
http://HOST:PORT/mcp (default ${DEFAULT_LISTEN}: a free loopback port), for
clients that connect by URL. The server is planned and started exactly as
'waffle mcp run' does it (same flags, same refusals): each MCP session (from
its initialize to its DELETE) gets its own server, in user U's sandbox, a
restricted container or on the host, behind the same allowlists and audit.

Every request needs 'Authorization: Bearer TOKEN' (else 401). The token is
32 random bytes, printed on stderr at start (and with --json, on stdout as
{"url", "token", ...}); --token-file PATH reads one instead (at least 32
characters). Only loopback addresses are served: a non-loopback --listen is
refused unless --allow-remote is given (the token still applies), and a
request whose Host (on loopback) or Origin is not loopback gets 403.

Limits: at most --max-sessions N sessions at once (default ${DEFAULT_MAX_SESSIONS}); at the cap, a
new one takes the place of the session with nothing open (no request, no
stream) that was active least recently, and gets 503 when every one is busy.
A session with nothing open for --idle-timeout SECONDS (default ${IDLE_SECONDS})
ends. A request body over the server's max_message_bytes gets 413.

${HTTP_LIMIT_HELP}

SIGINT or SIGTERM ends every session (each server closed, its audit lines
written), then waffle exits 128+N. Exit status ${EXIT_WAFFLE} when denied or on a
usage or config error, before anything listens.
`;

const SERVE_FLAGS = {
  ...LAUNCH_FLAGS,
  listen: { type: "string" },
  "token-file": { type: "string" },
  "allow-remote": { type: "boolean" },
  "max-sessions": { type: "string" },
  "idle-timeout": { type: "string" },
  json: { type: "boolean" },
  ...HTTP_LIMIT_FLAGS,
} as const;

/**
 * Runs `waffle mcp serve`.
 *
 * @param args Arguments after `mcp serve`.
 * @param io Process streams.
 * @returns The exit status: 128+N on signal N.
 * @throws {UsageError} On bad flags (a limit out of range), a non-loopback address without --allow-remote, an
 *   unknown server, a missing --user, a bad token file or a bad config.
 * @throws {WaffleError} When the server is denied or the address cannot be listened on.
 */
export async function mcpServeCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, SERVE_FLAGS);
  const listenText = stringFlag(parsed, "listen") ?? DEFAULT_LISTEN;
  const listen = parseListenAddress(listenText);
  const allowRemote = parsed.values["allow-remote"] === true;
  if (!isLoopbackHost(listen.hostname) && !allowRemote) {
    throw new UsageError(
      `Address '${listenText}' is not a loopback address; give --allow-remote to listen beyond this machine`,
    );
  }
  const maxSessions = numberFlag(parsed, "max-sessions", { integer: true, max: 1024 }) ??
    DEFAULT_MAX_SESSIONS;
  const idleSeconds = numberFlag(parsed, "idle-timeout", { max: 7 * 24 * 3600 });
  const limits = httpLimitsOf(parsed);
  const launch = resolveLaunch(parsed);
  const tokenFile = stringFlag(parsed, "token-file");
  const token = tokenFile === undefined ? newBearerToken() : await readBearerToken(tokenFile);
  const audit = openAuditLog(launch.config.sandbox.home, {
    onError: (message) => void io.stderr(`waffle: ${escapeControls(message)}\n`),
  });
  // Signals are caught from here on: one ends every session cleanly.
  let stopListening = (): void => {};
  const signalled = new Promise<number>((resolve) => {
    stopListening = onEndSignals(resolve);
  });
  try {
    await ensureFetched(launch, io);
    const env = resolveEnv(launch.planned.envSources);
    const connections = new Set<ServerConnection>();
    const server = await serveMcpHttp({
      hostname: listen.hostname,
      port: listen.port,
      token,
      allowRemote,
      maxSessions,
      idleTimeoutMs: idleSeconds === undefined ? undefined : idleSeconds * 1000,
      limits,
      maxBodyBytes: maxMessageBytes(launch),
      open: () => openTracked(launch, { io, env, connections }),
      relay: relayOptions(launch, { audit, stderr: (data) => io.stderr(data) }),
      onEvent: (line) => void io.stderr(`waffle: ${escapeControls(line)}\n`),
    });
    await announce(server, {
      io,
      launch,
      token: tokenFile === undefined ? token : null,
      json: parsed.values.json === true,
    });
    const signal = await signalled;
    // A host server dies at once; a sandbox session ends through close().
    for (const connection of connections) killNow(connection);
    const results = await server.close();
    await io.stderr(`waffle: ended ${results.length} session(s); exiting\n`);
    return exitCodeOfSignal(signal);
  } finally {
    stopListening();
    audit.close();
  }
}

/** Opens one session's server, remembered until it ends (a signal kills what is left). */
async function openTracked(
  launch: Launch,
  options: { io: CliIo; env: Record<string, string>; connections: Set<ServerConnection> },
): Promise<ServerConnection> {
  const connection = await openLaunch(launch, { env: options.env, io: options.io });
  options.connections.add(connection);
  void connection.closed.finally(() => options.connections.delete(connection));
  return connection;
}

/** The start lines on stderr, and with --json the start object on stdout. */
async function announce(
  server: McpHttpServer,
  options: { io: CliIo; launch: Launch; token: string | null; json: boolean },
): Promise<void> {
  const { io, launch, token } = options;
  await io.stderr(
    `waffle: serving MCP server '${launch.name}' (${launch.where}) at ${server.url}\n` +
      (token === null
        ? "waffle: clients send the token of --token-file as 'Authorization: Bearer TOKEN'\n"
        : `waffle: token: ${token}\nwaffle: clients send 'Authorization: Bearer ${token}'\n`),
  );
  if (!options.json) return;
  await io.stdout(
    `${
      JSON.stringify({
        server: launch.name,
        where: launch.where,
        url: server.url,
        token,
        pid: Deno.pid,
      })
    }\n`,
  );
}
