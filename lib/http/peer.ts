/**
 * Who a connection comes from, for the per-peer connection cap: an IPv4
 * address, or an IPv6 address's /64 (one host is routinely given a whole
 * /64, so a cap per IPv6 address would be no cap at all).
 *
 * @module
 */

/**
 * The peer a remote address belongs to. An IPv4-mapped IPv6 address (a
 * dual-stack listener's IPv4 client) is its IPv4 address; an IPv6 address
 * is its first four groups, written out in full; anything else (a Unix
 * socket's path, an unparsable value) is itself.
 *
 * @example
 * ```ts
 * import { peerOf } from "./peer.ts";
 *
 * peerOf("::ffff:10.0.0.7"); // "10.0.0.7"
 * peerOf("2001:db8::1"); // "2001:db8:0:0::/64"
 * ```
 *
 * @param hostname The remote address, as `Deno.NetAddr.hostname` gives it.
 * @returns The peer's key.
 */
export function peerOf(hostname: string): string {
  const address = hostname.toLowerCase().replace(/^\[(.*)\]$/, "$1").replace(/%.*$/, "");
  const mapped = /^(?:0{0,4}:){0,5}:?ffff:(\d{1,3}(?:\.\d{1,3}){3})$/.exec(address);
  if (mapped !== null) return mapped[1]!;
  if (!address.includes(":")) return address;
  const prefix = ipv6Prefix64(address);
  return prefix === undefined ? address : `${prefix.join(":")}::/64`;
}

/** The first four groups of an IPv6 address (leading zeros dropped); undefined when malformed. */
function ipv6Prefix64(address: string): string[] | undefined {
  const halves = address.split("::");
  if (halves.length > 2) return undefined;
  const split = (half: string | undefined): string[] => half ? half.split(":") : [];
  const head = split(halves[0]);
  const tail = split(halves[1]);
  // An embedded IPv4 tail (`::1.2.3.4`) takes two groups.
  const last = tail.at(-1) ?? head.at(-1);
  const ipv4 = last !== undefined && last.includes(".") ? 1 : 0;
  const missing = 8 - head.length - tail.length - ipv4;
  if (halves.length === 1 ? missing !== 0 : missing < 1) return undefined;
  const groups = [...head, ...Array<string>(halves.length === 1 ? 0 : missing).fill("0"), ...tail];
  const hex = groups.slice(0, 4);
  if (!hex.every((group) => /^[0-9a-f]{1,4}$/.test(group))) return undefined;
  return hex.map((group) => group.replace(/^0+(?=.)/, ""));
}
