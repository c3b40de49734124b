/**
 * Loopback addresses, for `waffle mcp serve`: where it may listen without
 * `--allow-remote`, and which `Host` and `Origin` headers a loopback
 * listener accepts. A browser page on any other origin (a DNS-rebinding
 * attack resolves its own name to 127.0.0.1) is refused by these checks.
 *
 * @module
 */
import { UsageError } from "../errors.ts";

/** A listen address: `HOST:PORT`, `[IPV6]:PORT`. */
export interface ListenAddress {
  /** The host as given, without brackets. */
  hostname: string;
  /** The port; 0 asks for a free one. */
  port: number;
}

/**
 * Whether a host name or address is on the loopback interface: `localhost`,
 * `127.0.0.0/8` and `::1` (with or without brackets).
 *
 * @example
 * ```ts
 * isLoopbackHost("127.0.0.1"); // true
 * isLoopbackHost("0.0.0.0"); // false
 * ```
 *
 * @param host A host name or address, without a port.
 * @returns Whether it is loopback.
 */
export function isLoopbackHost(host: string): boolean {
  const name = host.toLowerCase().replace(/^\[(.*)\]$/, "$1");
  if (name === "localhost" || name === "::1" || name === "0:0:0:0:0:0:0:1") return true;
  const octets = /^127\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(name);
  return octets !== null && octets.slice(1).every((octet) => Number(octet) <= 255);
}

/**
 * Parses `HOST:PORT` (`[::1]:PORT` for IPv6).
 *
 * @example
 * ```ts
 * parseListenAddress("127.0.0.1:8808"); // { hostname: "127.0.0.1", port: 8808 }
 * ```
 *
 * @param text The address.
 * @returns Host and port.
 * @throws {UsageError} When it is not `HOST:PORT` with a port from 0 to 65535.
 */
export function parseListenAddress(text: string): ListenAddress {
  const match = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]\s]+)):(\d{1,5})$/.exec(text);
  const port = match === null ? NaN : Number(match[3]);
  if (match === null || port > 65535) {
    throw new UsageError(`Invalid --listen '${text}': expected HOST:PORT, e.g. 127.0.0.1:8808`);
  }
  return { hostname: match[1] ?? match[2]!, port };
}

/**
 * Whether a `Host` header names a loopback host (any port).
 *
 * @example
 * ```ts
 * isLoopbackHostHeader("localhost:8808"); // true
 * isLoopbackHostHeader("evil.example.com"); // false
 * ```
 *
 * @param header The header's value.
 * @returns Whether it is loopback.
 */
export function isLoopbackHostHeader(header: string): boolean {
  const match = /^(\[[0-9a-fA-F:.]+\]|[^:\[\]]+)(?::\d{1,5})?$/.exec(header.trim());
  return match !== null && isLoopbackHost(match[1]!);
}

/**
 * Whether an `Origin` header is a loopback origin (`http://` or `https://`,
 * any port). `null` (a sandboxed frame, a file) is not.
 *
 * @example
 * ```ts
 * isLoopbackOrigin("http://127.0.0.1:8808"); // true
 * isLoopbackOrigin("https://evil.example.com"); // false
 * ```
 *
 * @param origin The header's value.
 * @returns Whether it is loopback.
 */
export function isLoopbackOrigin(origin: string): boolean {
  let url: URL;
  try {
    url = new URL(origin);
  } catch {
    return false;
  }
  return (url.protocol === "http:" || url.protocol === "https:") && isLoopbackHost(url.hostname);
}
