/**
 * The limits every HTTP listener of waffle applies to its connections: how
 * many may be open (in all, and from one peer), and how long a client may
 * take over a request's headers, over the whole request (its body), and
 * between two requests on a kept-alive connection, and how long a response
 * may wait for the client to take its next bytes. None of them bounds a
 * response's length: a stream to the client (MCP's SSE) lasts as long as
 * the client keeps reading it.
 *
 * @module
 */

/** The limits of one listener; {@linkcode resolveHttpLimits} fills in what is not given. */
export interface HttpLimits {
  /** Connections open at once; past it, a new one is closed as soon as it is accepted. */
  maxConnections: number;
  /** Connections open at once from one peer (an IPv4 address, an IPv6 /64). */
  maxConnectionsPerPeer: number;
  /** A request's line and headers must have arrived this long after it began (else 408). */
  headerTimeoutMs: number;
  /** The whole request, body included, must have arrived this long after it began (else 408). */
  requestTimeoutMs: number;
  /** A kept-alive connection with no request for this long is closed. */
  keepAliveTimeoutMs: number;
  /** The largest request line and headers, in bytes (else 431). */
  maxHeaderBytes: number;
  /**
   * A response's pending write that makes no progress (the client stopped
   * reading) for this long closes the connection: it would hold its slot
   * forever otherwise.
   */
  writeStallTimeoutMs: number;
}

/**
 * Connections open at once when nothing says otherwise, and never more than
 * half the process's open-file limit: the other half stays for what the
 * sessions themselves open (servers, queue files, the Docker socket).
 */
export const DEFAULT_MAX_CONNECTIONS = 512;
/** Connections open at once from one peer when nothing says otherwise. */
export const DEFAULT_MAX_CONNECTIONS_PER_PEER = 64;
/** Headers are sent at once by every real client: 10 s is generous. */
export const DEFAULT_HEADER_TIMEOUT_MS = 10_000;
/** A request (a body up to MCP's 64 MiB included) must arrive within this. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;
/** Longer than clients' own pauses between requests, shorter than a held slot is worth. */
export const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 30_000;
/** Node's default too: a bearer token and MCP's headers take a few hundred bytes. */
export const DEFAULT_MAX_HEADER_BYTES = 16 * 1024;
/** A client reading at all takes bytes far more often than this. */
export const DEFAULT_WRITE_STALL_TIMEOUT_MS = 30_000;
/** The largest deadline a listener takes (Node's timers are 32-bit). */
export const MAX_TIMEOUT_MS = 24 * 3600 * 1000;

/**
 * The limits to apply: each one given, or its default. The default
 * connection cap is at most half of `openFileLimit` (and at least 1), and
 * the per-peer default at most the total; values given are kept as they
 * are.
 *
 * @example
 * ```ts
 * import { resolveHttpLimits } from "./limits.ts";
 *
 * const limits = resolveHttpLimits({ headerTimeoutMs: 2000 }, { openFileLimit: 256 });
 * limits.maxConnections; // 128
 * ```
 *
 * @param given The limits set explicitly.
 * @param options `openFileLimit`: the process's open-file limit, when known
 *   (default: read from `/proc/self/limits`).
 * @returns Every limit.
 * @throws {RangeError} When a limit is not a positive integer, a deadline is
 *   over {@linkcode MAX_TIMEOUT_MS}, or the header deadline exceeds the
 *   request deadline.
 */
export function resolveHttpLimits(
  given: Partial<HttpLimits> = {},
  options: { openFileLimit?: number | undefined } = {},
): HttpLimits {
  const fileLimit = options.openFileLimit ?? openFileLimit();
  const maxConnections = given.maxConnections ?? Math.max(
    1,
    Math.min(DEFAULT_MAX_CONNECTIONS, Math.floor((fileLimit ?? Infinity) / 2)),
  );
  const limits: HttpLimits = {
    maxConnections,
    maxConnectionsPerPeer: given.maxConnectionsPerPeer ??
      Math.min(DEFAULT_MAX_CONNECTIONS_PER_PEER, maxConnections),
    headerTimeoutMs: given.headerTimeoutMs ?? DEFAULT_HEADER_TIMEOUT_MS,
    requestTimeoutMs: given.requestTimeoutMs ??
      Math.max(DEFAULT_REQUEST_TIMEOUT_MS, given.headerTimeoutMs ?? 0),
    keepAliveTimeoutMs: given.keepAliveTimeoutMs ?? DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
    maxHeaderBytes: given.maxHeaderBytes ?? DEFAULT_MAX_HEADER_BYTES,
    writeStallTimeoutMs: given.writeStallTimeoutMs ?? DEFAULT_WRITE_STALL_TIMEOUT_MS,
  };
  for (const [name, value] of Object.entries(limits)) {
    const bound = name.endsWith("TimeoutMs") ? MAX_TIMEOUT_MS : Number.MAX_SAFE_INTEGER;
    if (!Number.isInteger(value) || value < 1 || value > bound) {
      throw new RangeError(
        `Cannot serve HTTP as '${name}' must be an integer from 1 to ${bound}: current value is ${value}`,
      );
    }
  }
  if (limits.headerTimeoutMs > limits.requestTimeoutMs) {
    throw new RangeError(
      `Cannot serve HTTP as 'headerTimeoutMs' must not exceed 'requestTimeoutMs' (${limits.requestTimeoutMs}): current value is ${limits.headerTimeoutMs}`,
    );
  }
  return limits;
}

/**
 * The process's soft limit on open files (Linux: `/proc/self/limits`).
 * Deno raises its soft limit to the hard one at start, so this is what the
 * process may really open.
 *
 * @returns The limit; undefined when unknown or unlimited.
 */
export function openFileLimit(): number | undefined {
  let text: string;
  try {
    text = Deno.readTextFileSync("/proc/self/limits");
  } catch {
    return undefined; // not Linux, or no read permission for /proc
  }
  const soft = /^Max open files\s+(\d+)/m.exec(text)?.[1];
  return soft === undefined ? undefined : Number(soft);
}
