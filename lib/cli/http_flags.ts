/**
 * The flags of every command that serves HTTP (`waffle mcp serve`): the
 * listener's connection caps and deadlines, declared once, with their help
 * and their parsing into `lib/http`'s {@linkcode HttpLimits}.
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import {
  DEFAULT_HEADER_TIMEOUT_MS,
  DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
  DEFAULT_MAX_CONNECTIONS,
  DEFAULT_MAX_CONNECTIONS_PER_PEER,
  DEFAULT_REQUEST_TIMEOUT_MS,
  DEFAULT_WRITE_STALL_TIMEOUT_MS,
  type HttpLimits,
  MAX_TIMEOUT_MS,
} from "../http/limits.ts";
import { numberFlag, type Parsed } from "./args.ts";

/** The flag definitions, for a command's `parse()` table. */
export const HTTP_LIMIT_FLAGS = {
  "max-connections": { type: "string" },
  "max-connections-per-peer": { type: "string" },
  "header-timeout": { type: "string" },
  "request-timeout": { type: "string" },
  "keep-alive-timeout": { type: "string" },
  "write-stall-timeout": { type: "string" },
} as const;

/** The usage lines of the flags. */
export const HTTP_LIMIT_USAGE = "[--max-connections N] [--max-connections-per-peer N]\n" +
  "[--header-timeout SECONDS] [--request-timeout SECONDS]\n" +
  "[--keep-alive-timeout SECONDS] [--write-stall-timeout SECONDS]";

/** What the flags do, for a command's help. */
export const HTTP_LIMIT_HELP =
  `Connections: at most --max-connections N open at once (default ${DEFAULT_MAX_CONNECTIONS}, never
more than half the process's open-file limit), at most ${DEFAULT_MAX_CONNECTIONS_PER_PEER} from one address
(--max-connections-per-peer N; an IPv6 address counts by its /64). A new
connection past either cap is closed as soon as it is accepted; the open
ones are served meanwhile. A request's headers must arrive within
--header-timeout SECONDS (default ${
    seconds(DEFAULT_HEADER_TIMEOUT_MS)
  }), the whole request, body included,
within --request-timeout SECONDS (default ${
    seconds(DEFAULT_REQUEST_TIMEOUT_MS)
  }), else 408 and the connection
closes; a kept-alive connection with no request for --keep-alive-timeout
SECONDS (default ${
    seconds(DEFAULT_KEEP_ALIVE_TIMEOUT_MS)
  }) closes. A response the client stops reading (no byte taken for
--write-stall-timeout SECONDS, default ${
    seconds(DEFAULT_WRITE_STALL_TIMEOUT_MS)
  }) closes its connection. None of
these cuts a response that streams (an SSE stream lasts as long as the
client keeps reading it).`;

/**
 * The limits the flags set (the others are left to `lib/http`'s defaults).
 *
 * @param parsed The command's parsed flags.
 * @returns The limits given.
 * @throws {UsageError} When a value is not a positive number, or the request
 *   deadline is shorter than the header deadline.
 */
export function httpLimitsOf(parsed: Parsed): Partial<HttpLimits> {
  const count = (name: string): number | undefined =>
    numberFlag(parsed, name, { integer: true, max: 1_000_000 });
  const ms = (name: string): number | undefined => {
    const value = numberFlag(parsed, name, { max: MAX_TIMEOUT_MS / 1000 });
    return value === undefined ? undefined : Math.max(1, Math.round(value * 1000));
  };
  const limits: Partial<HttpLimits> = {};
  const set = <K extends keyof HttpLimits>(key: K, value: number | undefined): void => {
    if (value !== undefined) limits[key] = value;
  };
  set("maxConnections", count("max-connections"));
  set("maxConnectionsPerPeer", count("max-connections-per-peer"));
  set("headerTimeoutMs", ms("header-timeout"));
  set("requestTimeoutMs", ms("request-timeout"));
  set("keepAliveTimeoutMs", ms("keep-alive-timeout"));
  set("writeStallTimeoutMs", ms("write-stall-timeout"));
  // A request deadline left out is never shorter than the header deadline.
  const header = limits.headerTimeoutMs ?? DEFAULT_HEADER_TIMEOUT_MS;
  if (limits.requestTimeoutMs !== undefined && limits.requestTimeoutMs < header) {
    throw new UsageError(
      `Invalid --request-timeout '${
        parsed.values["request-timeout"]
      }': it must be at least the header timeout (${seconds(header)} s)`,
    );
  }
  return limits;
}

function seconds(ms: number): number {
  return ms / 1000;
}
