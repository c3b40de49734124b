/**
 * Egress lists and addresses: parsing an entry of `egress = [...]`
 * (`api.github.com`, `*.pypi.org:443`, `10.1.2.3`, `[fd00::1]:8443`),
 * deciding whether a list allows a destination, intersecting two lists, and
 * classifying the address a name resolves to (loopback, private, the cloud
 * metadata address…) against the CIDRs of `egress_addresses`. Pure: no I/O.
 *
 * Names are compared as DNS names: lower case, one trailing dot stripped,
 * labels of a-z 0-9 and '-'. A name whose last label is numeric (`127.1`,
 * `0x7f.1`) is taken for an IPv4 address, as URL parsers do, and must then be
 * in dotted decimal without leading zeros: a resolver would read `0177.1` as
 * 127.0.0.1, so no such spelling is ever allowed. IP addresses are compared in
 * canonical form (RFC 5952 for IPv6; an IPv4-mapped address is its IPv4).
 *
 * The config's grammar and the proxy's matching are one file: both rest on
 * the same name and address parsing, which has one owner here (the proxy, in
 * `lib/egress/`, imports it from below).
 *
 * @module
 */
import type { EgressEntry } from "./egress_types.ts";

/** The ports of an entry written without one: 80 and 443. */
export const DEFAULT_PORTS: readonly number[] = Object.freeze([80, 443]);

/** What {@linkcode addressKind} says of an address. */
export type AddressKind =
  | "public"
  | "loopback"
  | "private"
  | "link-local"
  | "metadata"
  | "unspecified"
  | "multicast"
  | "reserved";

/** A parsed CIDR: the canonical network address and the prefix length. */
export interface Cidr {
  /** The network address, canonical (see {@linkcode canonicalIp}), host bits zero. */
  ip: string;
  /** The prefix length: 0-32 for IPv4, 0-128 for IPv6. */
  bits: number;
}

const MAX_ENTRY_CHARS = 300;
const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const NUMERIC_LABEL = /^(?:[0-9]+|0x[0-9a-f]*)$/;
const V4_OCTET = /^(?:0|[1-9][0-9]{0,2})$/;
const V6_GROUP = /^[0-9a-f]{1,4}$/;
const PORT = /^[1-9][0-9]{0,4}$/;

// An address as a number: 32 bits for IPv4, 128 for IPv6.
type Address = { v6: boolean; value: bigint };

/**
 * Parses one entry of an egress list.
 *
 * @example
 * ```ts
 * import { parseEntry } from "./egress_entries.ts";
 * parseEntry("*.PyPI.org:443"); // { kind: "suffix", host: "pypi.org", ports: [443] }
 * parseEntry("api.github.com"); // { kind: "name", host: "api.github.com", ports: [80, 443] }
 * ```
 *
 * @param text `host`, `host:port`, `*.domain`, `*.domain:port`, an IPv4
 *   address with an optional `:port`, `[ipv6]` with an optional `:port`, or a
 *   bare IPv6 address; a port may be a list, `host:80,8080`.
 * @returns The entry, canonical (lower case, ports ascending).
 * @throws {Error} When it is none of those: one line quoting the value.
 */
export function parseEntry(text: string): EgressEntry {
  const checked = checkEntry(text);
  if ("problem" in checked) throw new Error(`Invalid egress entry '${text}': ${checked.problem}`);
  return checked.entry;
}

/**
 * Checks one entry of an egress list without throwing; the config's schema
 * uses it to name the key of a bad entry.
 *
 * @example
 * ```ts
 * import { checkEntry } from "./egress_entries.ts";
 * checkEntry("*.com"); // { problem: "too broad: a wildcard needs at least two labels after '*.', such as '*.example.com'" }
 * ```
 *
 * @param text As for {@linkcode parseEntry}.
 * @returns The entry, or what is wrong with it (a phrase, no value quoted).
 */
export function checkEntry(text: string): { entry: EgressEntry } | { problem: string } {
  if (text === "") return { problem: "empty" };
  if (text.length > MAX_ENTRY_CHARS) {
    return { problem: `longer than ${MAX_ENTRY_CHARS} characters` };
  }
  if (/[/\s@?#]/.test(text)) return { problem: "a host, not a URL: no scheme, path or spaces" };
  const split = splitPort(text);
  if ("problem" in split) return split;
  const host = hostOf(split.host);
  return "problem" in host ? host : { entry: { ...host, ports: split.ports } };
}

// `host[:ports]`, `[v6][:ports]` or a bare IPv6 address.
function splitPort(text: string): { host: string; ports: number[] } | { problem: string } {
  let host = text;
  let ports: string | undefined;
  if (text.startsWith("[")) {
    const close = text.indexOf("]");
    if (close < 0) return { problem: "an IPv6 address without its closing ']'" };
    host = text.slice(0, close + 1);
    const rest = text.slice(close + 1);
    if (rest !== "") {
      if (!rest.startsWith(":")) return { problem: "only ':port' may follow ']'" };
      ports = rest.slice(1);
    }
  } else if (text.indexOf(":") === text.lastIndexOf(":") && text.includes(":")) {
    host = text.slice(0, text.indexOf(":"));
    ports = text.slice(text.indexOf(":") + 1);
  }
  if (ports === undefined) return { host, ports: [...DEFAULT_PORTS] };
  const list = ports.split(",");
  const bad = list.find((port) => !PORT.test(port) || Number(port) > 65535);
  if (bad !== undefined) return { problem: `port '${bad}' is not 1-65535` };
  return { host, ports: sortedPorts(list.map(Number)) };
}

// The host part of an entry: a wildcard, an IP literal or a name.
function hostOf(raw: string): Omit<EgressEntry, "ports"> | { problem: string } {
  if (raw.startsWith("[")) {
    const inner = raw.slice(1, -1);
    const v6 = parseV6(inner.toLowerCase());
    if (v6 === undefined) {
      return {
        problem: parseV4(inner) === undefined
          ? "not a valid IPv6 address"
          : "brackets are for IPv6 addresses",
      };
    }
    return { kind: "ip", host: formatAddress(v6) };
  }
  const lower = raw.toLowerCase();
  if (lower.includes(":")) {
    const v6 = parseV6(lower);
    if (v6 === undefined) {
      return { problem: "not a valid IPv6 address: write '[address]:port' for a port" };
    }
    return { kind: "ip", host: formatAddress(v6) };
  }
  if (lower === "*.") return { problem: "a wildcard needs a domain after '*.'" };
  const host = lower.endsWith(".") ? lower.slice(0, -1) : lower;
  if (host === "*") return { problem: "too broad: '*' alone would allow everything" };
  if (host.startsWith("*.")) {
    const domain = host.slice(2);
    if (domain === "") return { problem: "a wildcard needs a domain after '*.'" };
    const problem = nameProblem(domain);
    if (problem !== undefined) return { problem };
    if (!domain.includes(".")) {
      return {
        problem:
          "too broad: a wildcard needs at least two labels after '*.', such as '*.example.com'",
      };
    }
    return { kind: "suffix", host: domain };
  }
  if (host.includes("*")) {
    return { problem: "a wildcard may only be a whole first label, as in '*.example.com'" };
  }
  const v4 = parseV4(host);
  if (v4 !== undefined) return { kind: "ip", host: formatAddress(v4) };
  const problem = nameProblem(host);
  return problem === undefined ? { kind: "name", host } : { problem };
}

// What is wrong with a lower-case DNS name (no trailing dot), if anything.
function nameProblem(name: string): string | undefined {
  if (/[\u0080-\uffff]/.test(name)) return "a name with non-ASCII characters: write its xn-- form";
  if (name.length > 253) return "a name longer than 253 characters";
  const labels = name.split(".");
  if (NUMERIC_LABEL.test(labels.at(-1)!)) {
    return "not a valid IPv4 address: write it in dotted decimal without leading zeros";
  }
  const bad = labels.find((label) => !LABEL.test(label));
  if (bad !== undefined) {
    return `label '${bad}' is not 1-63 of a-z 0-9 and '-', not starting or ending with '-'`;
  }
  return undefined;
}

/**
 * Renders an entry as it is written in `waffle.toml`; {@linkcode parseEntry}
 * reads it back to the same entry. The default ports (80 and 443) are not
 * shown; IPv6 addresses are always bracketed.
 *
 * @example
 * ```ts
 * import { formatEntry } from "./egress_entries.ts";
 * formatEntry({ kind: "suffix", host: "pypi.org", ports: [80, 443] }); // "*.pypi.org"
 * formatEntry({ kind: "ip", host: "fd00::1", ports: [8443] }); // "[fd00::1]:8443"
 * ```
 *
 * @param entry The entry.
 * @returns Its text.
 */
export function formatEntry(entry: EgressEntry): string {
  const host = entry.kind === "suffix"
    ? `*.${entry.host}`
    : entry.kind === "ip" && entry.host.includes(":")
    ? `[${entry.host}]`
    : entry.host;
  const defaults = entry.ports.length === DEFAULT_PORTS.length &&
    entry.ports.every((port, i) => port === DEFAULT_PORTS[i]);
  return defaults ? host : `${host}:${entry.ports.join(",")}`;
}

/**
 * Whether a list allows a destination. A name matches `name` entries
 * exactly and `suffix` entries it ends in (`x.pypi.org` for `*.pypi.org`,
 * never `pypi.org` itself); an IP literal matches only `ip` entries. A host
 * that is neither a valid name nor an IP literal (`127.1`, `a..b`) is
 * never allowed.
 *
 * @example
 * ```ts
 * import { allows, parseEntry } from "./egress_entries.ts";
 * const list = [parseEntry("*.pypi.org"), parseEntry("[fd00::1]:443")];
 * allows(list, "Files.PyPI.org.", 443); // true
 * allows(list, "[FD00:0::1]", 443); // true
 * allows(list, "pypi.org", 443); // false
 * ```
 *
 * @param list The allowed entries.
 * @param host What the client asked for: a name, or an IP literal (brackets optional).
 * @param port The port asked for.
 * @returns True when some entry covers both.
 */
export function allows(list: readonly EgressEntry[], host: string, port: number): boolean {
  if (!Number.isInteger(port) || port < 1 || port > 65535) return false;
  const ip = canonicalIp(host);
  if (ip !== undefined) {
    return list.some((e) => e.kind === "ip" && e.host === ip && e.ports.includes(port));
  }
  const lower = host.toLowerCase();
  const name = lower.endsWith(".") ? lower.slice(0, -1) : lower;
  if (name === "" || nameProblem(name) !== undefined) return false;
  return list.some((e) => e.ports.includes(port) && coversName(e, name));
}

function coversName(entry: EgressEntry, name: string): boolean {
  if (entry.kind === "name") return entry.host === name;
  return entry.kind === "suffix" && name.endsWith(`.${entry.host}`);
}

/**
 * The list that allows exactly what both lists allow: the pairwise
 * intersection of their entries (a name within a wildcard is the name; of
 * two nested wildcards the narrower; ports intersected), empty results
 * dropped, entries of the same host merged.
 *
 * @example
 * ```ts
 * import { intersect, parseEntry } from "./egress_entries.ts";
 * intersect([parseEntry("*.github.com")], [parseEntry("api.github.com:443")]);
 * // [{ kind: "name", host: "api.github.com", ports: [443] }]
 * ```
 *
 * @param a One list.
 * @param b The other.
 * @returns Their intersection, in the order of `a`.
 */
export function intersect(a: readonly EgressEntry[], b: readonly EgressEntry[]): EgressEntry[] {
  const out: EgressEntry[] = [];
  for (const x of a) {
    for (const y of b) {
      const ports = x.ports.filter((port) => y.ports.includes(port));
      if (ports.length === 0) continue;
      const narrower = within(x, y) ? x : within(y, x) ? y : undefined;
      if (narrower !== undefined) out.push({ kind: narrower.kind, host: narrower.host, ports });
    }
  }
  return mergeEntries(out);
}

// Whether every host `x` covers, `y` covers too (ports aside).
function within(x: EgressEntry, y: EgressEntry): boolean {
  if (x.kind === "ip" || y.kind === "ip") return x.kind === y.kind && x.host === y.host;
  if (y.kind === "name") return x.kind === "name" && x.host === y.host;
  // `*.a.com` covers `*.a.com` and what is below it, never `a.com` itself.
  return (x.kind === "suffix" && x.host === y.host) || x.host.endsWith(`.${y.host}`);
}

/**
 * Merges the entries of one host (same kind and host) into one with the
 * union of their ports, keeping the order of first appearance. What the list
 * allows does not change.
 *
 * @example
 * ```ts
 * import { mergeEntries, parseEntry } from "./egress_entries.ts";
 * mergeEntries([parseEntry("a.com:443"), parseEntry("A.com:80")]); // [{ kind: "name", host: "a.com", ports: [80, 443] }]
 * ```
 *
 * @param list Entries.
 * @returns A new list, one entry per host.
 */
export function mergeEntries(list: readonly EgressEntry[]): EgressEntry[] {
  const byHost = new Map<string, EgressEntry>();
  for (const entry of list) {
    const key = `${entry.kind} ${entry.host}`;
    const seen = byHost.get(key);
    byHost.set(key, {
      kind: entry.kind,
      host: entry.host,
      ports: sortedPorts([...(seen?.ports ?? []), ...entry.ports]),
    });
  }
  return [...byHost.values()];
}

/**
 * The part of `list` that `limit` does not allow: each entry of `list` with
 * the ports no entry of `limit` covers it on (a wildcard is covered only by
 * a wildcard). Empty when everything `list` allows, `limit` allows too.
 *
 * @example
 * ```ts
 * import { beyond, parseEntry } from "./egress_entries.ts";
 * beyond([parseEntry("*.pypi.org"), parseEntry("a.com")], [parseEntry("*.pypi.org")]);
 * // [{ kind: "name", host: "a.com", ports: [80, 443] }]
 * ```
 *
 * @param list What is allowed.
 * @param limit What may be allowed at most.
 * @returns The entries (or ports of entries) beyond the limit.
 */
export function beyond(list: readonly EgressEntry[], limit: readonly EgressEntry[]): EgressEntry[] {
  const out: EgressEntry[] = [];
  for (const entry of list) {
    const ports = entry.ports.filter((port) =>
      !limit.some((outer) => outer.ports.includes(port) && within(entry, outer))
    );
    if (ports.length > 0) out.push({ kind: entry.kind, host: entry.host, ports });
  }
  return out;
}

function sortedPorts(ports: readonly number[]): number[] {
  return [...new Set(ports)].sort((x, y) => x - y);
}

/**
 * Whether a host is an IP literal (see {@linkcode canonicalIp}).
 *
 * @example
 * ```ts
 * import { isIpLiteral } from "./egress_entries.ts";
 * isIpLiteral("[::1]"); // true
 * isIpLiteral("127.1"); // false: not dotted decimal
 * ```
 *
 * @param host A host as a client gives it.
 * @returns True for an IPv4 address in dotted decimal or an IPv6 address.
 */
export function isIpLiteral(host: string): boolean {
  return canonicalIp(host) !== undefined;
}

/**
 * The canonical form of an IP literal: IPv4 in dotted decimal; IPv6 lower
 * case and compressed (RFC 5952), without brackets; an IPv4-mapped IPv6
 * address (`::ffff:1.2.3.4`) as its IPv4 address. IPv4 must be four decimal
 * numbers 0-255 without leading zeros; IPv6 may end in a dotted IPv4 and may
 * be bracketed; a zone (`%eth0`) is refused.
 *
 * @example
 * ```ts
 * import { canonicalIp } from "./egress_entries.ts";
 * canonicalIp("[FD00:0:0::01]"); // "fd00::1"
 * canonicalIp("::ffff:10.0.0.1"); // "10.0.0.1"
 * canonicalIp("010.0.0.1"); // undefined
 * ```
 *
 * @param host The literal.
 * @returns Its canonical form, or undefined when it is no IP literal.
 */
export function canonicalIp(host: string): string | undefined {
  const address = parseAddress(host);
  return address === undefined ? undefined : formatAddress(address);
}

// Either family, brackets optional around IPv6.
function parseAddress(host: string): Address | undefined {
  if (host.startsWith("[") && host.endsWith("]")) return parseV6(host.slice(1, -1).toLowerCase());
  return parseV4(host) ?? (host.includes(":") ? parseV6(host.toLowerCase()) : undefined);
}

function parseV4(text: string): Address | undefined {
  const parts = text.split(".");
  if (parts.length !== 4 || !parts.every((part) => V4_OCTET.test(part) && Number(part) <= 255)) {
    return undefined;
  }
  return { v6: false, value: parts.reduce((sum, part) => (sum << 8n) | BigInt(part), 0n) };
}

// IPv6, lower case, possibly ending in a dotted IPv4; an IPv4-mapped one as IPv4.
function parseV6(text: string): Address | undefined {
  let head = text;
  let tail: Address | undefined;
  if (text.includes(".")) {
    const at = text.lastIndexOf(":");
    tail = parseV4(text.slice(at + 1));
    if (tail === undefined) return undefined;
    head = `${text.slice(0, at + 1)}0:0`;
  }
  const halves = head.split("::");
  if (halves.length > 2) return undefined;
  const groupsOf = (part: string): string[] => (part === "" ? [] : part.split(":"));
  const left = groupsOf(halves[0]!);
  const right = halves.length === 2 ? groupsOf(halves[1]!) : [];
  const count = left.length + right.length;
  if (halves.length === 1 ? count !== 8 : count > 7) return undefined;
  if (![...left, ...right].every((group) => V6_GROUP.test(group))) return undefined;
  const groups = [...left, ...Array(8 - count).fill("0"), ...right];
  let value = groups.reduce((sum, group) => (sum << 16n) | BigInt(parseInt(group, 16)), 0n);
  if (tail !== undefined) value = (value & ~0xffffffffn) | tail.value;
  if (value >> 32n === 0xffffn) return { v6: false, value: value & 0xffffffffn };
  return { v6: true, value };
}

function formatAddress(address: Address): string {
  if (!address.v6) {
    return [24n, 16n, 8n, 0n].map((shift) => String((address.value >> shift) & 0xffn)).join(".");
  }
  const groups = [...Array(8).keys()].map((i) =>
    Number((address.value >> BigInt(112 - 16 * i)) & 0xffffn)
  );
  // The longest run of two or more zero groups (the first of equals) becomes "::".
  let best = { at: -1, length: 1 };
  for (let i = 0; i < 8;) {
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > best.length) best = { at: i, length: j - i };
    i = j === i ? i + 1 : j;
  }
  const hex = (list: number[]): string => list.map((group) => group.toString(16)).join(":");
  if (best.at < 0) return hex(groups);
  return `${hex(groups.slice(0, best.at))}::${hex(groups.slice(best.at + best.length))}`;
}

// [network, prefix length, kind], most specific first.
const V4_KINDS: [string, number, AddressKind][] = [
  ["169.254.169.254", 32, "metadata"],
  ["255.255.255.255", 32, "reserved"],
  ["0.0.0.0", 8, "unspecified"],
  ["127.0.0.0", 8, "loopback"],
  ["10.0.0.0", 8, "private"],
  ["172.16.0.0", 12, "private"],
  ["192.168.0.0", 16, "private"],
  ["100.64.0.0", 10, "private"],
  ["169.254.0.0", 16, "link-local"],
  ["192.0.0.0", 24, "reserved"],
  ["192.0.2.0", 24, "reserved"],
  ["198.18.0.0", 15, "reserved"],
  ["198.51.100.0", 24, "reserved"],
  ["203.0.113.0", 24, "reserved"],
  ["224.0.0.0", 4, "multicast"],
  ["240.0.0.0", 4, "reserved"],
];

const V6_KINDS: [string, number, AddressKind][] = [
  ["::", 128, "unspecified"],
  ["::1", 128, "loopback"],
  ["fd00:ec2::254", 128, "metadata"],
  ["fc00::", 7, "private"],
  ["fec0::", 10, "private"],
  ["fe80::", 10, "link-local"],
  ["ff00::", 8, "multicast"],
  // Teredo and documentation: tunnels and examples, never a destination.
  ["2001::", 32, "reserved"],
  ["2001:db8::", 32, "reserved"],
];

/**
 * Classifies an IP address. IPv4: 0.0.0.0/8 unspecified, 127/8 loopback,
 * 10/8, 172.16/12, 192.168/16 and 100.64/10 (CGNAT) private, 169.254/16
 * link-local but 169.254.169.254 metadata, 224/4 multicast, 240/4,
 * 255.255.255.255, 192.0.0.0/24, 198.18/15 and the documentation ranges
 * (192.0.2/24, 198.51.100/24, 203.0.113/24) reserved. IPv6: `::`
 * unspecified, `::1` loopback, `fd00:ec2::254` metadata, fc00::/7 (and the
 * old site-local fec0::/10) private, fe80::/10 link-local, ff00::/8
 * multicast; an address that embeds an IPv4 one (IPv4-mapped
 * `::ffff:0:0/96`, IPv4-compatible `::/96`, NAT64 `64:ff9b::/96`, 6to4
 * `2002::/16`) is classified by it; Teredo `2001::/32`, documentation
 * `2001:db8::/32` and anything outside 2000::/3 are reserved. The rest is
 * public.
 *
 * @example
 * ```ts
 * import { addressKind } from "./egress_entries.ts";
 * addressKind("169.254.169.254"); // "metadata"
 * addressKind("64:ff9b::7f00:1"); // "loopback"
 * addressKind("1.1.1.1"); // "public"
 * ```
 *
 * @param ip An IP literal (brackets optional).
 * @returns Its kind.
 * @throws {Error} When it is no IP literal.
 */
export function addressKind(ip: string): AddressKind {
  const address = parseAddress(ip);
  if (address === undefined) throw new Error(`Invalid IP address '${ip}'`);
  return kindOf(address);
}

function kindOf(address: Address): AddressKind {
  if (!address.v6) {
    const found = V4_KINDS.find(([net, bits]) => inPrefix(address, parseAddress(net)!, bits));
    return found?.[2] ?? "public";
  }
  const found = V6_KINDS.find(([net, bits]) => inPrefix(address, parseAddress(net)!, bits));
  if (found !== undefined) return found[2];
  const high = address.value >> 32n;
  const low = address.value & 0xffffffffn;
  if (high === 0n || high === 0x64ff9bn << 64n) return kindOf({ v6: false, value: low });
  // 6to4 (2002::/16) carries an IPv4 address in bits 16-47: judged by it.
  if (address.value >> 112n === 0x2002n) {
    return kindOf({ v6: false, value: (address.value >> 80n) & 0xffffffffn });
  }
  return address.value >> 125n === 1n ? "public" : "reserved";
}

function inPrefix(address: Address, net: Address, bits: number): boolean {
  if (address.v6 !== net.v6) return false;
  const shift = BigInt((address.v6 ? 128 : 32) - bits);
  return address.value >> shift === net.value >> shift;
}

// The prefixes through which the host's own loopback is reached from its
// network namespace (the egress proxy's): what addressKind calls loopback,
// every IPv6 form it judges by an embedded loopback IPv4 address
// (IPv4-compatible, IPv4-mapped, NAT64, 6to4), and the unspecified
// `0.0.0.0` and `::`, which Linux connects to the local host.
const HOST_LOOPBACK: { net: Address; bits: number }[] = (() => {
  const prefix = (net: string, bits: number): { net: Address; bits: number } => ({
    net: parseAddress(net)!,
    bits,
  });
  const v4 = V4_KINDS.filter(([, , kind]) => kind === "loopback");
  const v6 = V6_KINDS.filter(([, , kind]) => kind === "loopback");
  const embedded = v4.flatMap(([net, bits]) => {
    const value = parseAddress(net)!.value;
    return [
      { net: { v6: true, value }, bits: 96 + bits },
      { net: { v6: true, value: (0xffffn << 32n) | value }, bits: 96 + bits },
      { net: { v6: true, value: (0x64ff9bn << 96n) | value }, bits: 96 + bits },
      { net: { v6: true, value: (0x2002n << 112n) | (value << 80n) }, bits: 16 + bits },
    ];
  });
  return [
    ...[...v4, ...v6].map(([net, bits]) => prefix(net, bits)),
    ...embedded,
    prefix("0.0.0.0", 32),
    prefix("::", 128),
  ];
})();

/**
 * The host loopback addresses a CIDR covers, if any: `127.0.0.0/8`, `::1`,
 * the IPv6 forms embedding a 127/8 address (`::ffff:127.0.0.1`,
 * `::127.0.0.1`, `64:ff9b::7f00:1`, `2002:7f00:1::`), and the unspecified
 * `0.0.0.0` and `::` (Linux connects them to the local host). The egress proxy has
 * the host's network, so such an entry of `egress_addresses` opens every
 * service listening on the host's loopback.
 *
 * @example
 * ```ts
 * import { hostLoopbackIn } from "./egress_entries.ts";
 * hostLoopbackIn("0.0.0.0/0"); // "127.0.0.0/8"
 * hostLoopbackIn("127.0.0.1"); // "127.0.0.1/32"
 * hostLoopbackIn("::/0"); // "::1/128"
 * hostLoopbackIn("10.0.0.0/8"); // undefined
 * ```
 *
 * @param text A CIDR or bare address.
 * @returns The first loopback prefix the two share (the narrower of the
 *   two, as `ip/bits`), or undefined when it covers none.
 * @throws {Error} When it is no CIDR.
 */
export function hostLoopbackIn(text: string): string | undefined {
  const cidr = parseCidr(text);
  const net = parseAddress(cidr.ip)!;
  for (const region of HOST_LOOPBACK) {
    const bits = Math.min(cidr.bits, region.bits);
    if (!inPrefix(net, region.net, bits)) continue;
    return cidr.bits >= region.bits
      ? formatCidr(cidr)
      : formatCidr({ ip: formatAddress(region.net), bits: region.bits });
  }
  return undefined;
}

/**
 * Parses a CIDR (`10.0.0.0/8`, `fd00::/8`); a bare address is a single
 * host (`/32` or `/128`). The address is canonicalized (an IPv4-mapped
 * network becomes IPv4, its length less 96) and must have no bits set past
 * the prefix.
 *
 * @example
 * ```ts
 * import { parseCidr } from "./egress_entries.ts";
 * parseCidr("127.0.0.1"); // { ip: "127.0.0.1", bits: 32 }
 * parseCidr("FD00::/8"); // { ip: "fd00::", bits: 8 }
 * ```
 *
 * @param text The CIDR.
 * @returns The network.
 * @throws {Error} When it is no CIDR: one line quoting the value.
 */
export function parseCidr(text: string): Cidr {
  const checked = checkCidr(text);
  if ("problem" in checked) throw new Error(`Invalid CIDR '${text}': ${checked.problem}`);
  return checked.cidr;
}

/**
 * Checks a CIDR without throwing (see {@linkcode parseCidr}).
 *
 * @example
 * ```ts
 * import { checkCidr } from "./egress_entries.ts";
 * checkCidr("10.1.0.0/8"); // { problem: "bits set past /8: did you mean '10.0.0.0/8'?" }
 * ```
 *
 * @param text The CIDR.
 * @returns The network, or what is wrong with it (a phrase).
 */
export function checkCidr(text: string): { cidr: Cidr } | { problem: string } {
  const slash = text.indexOf("/");
  const address = parseAddress(slash < 0 ? text : text.slice(0, slash));
  if (address === undefined) return { problem: "not an IP address or CIDR" };
  const mapped = slash >= 0 && !address.v6 && text.slice(0, slash).includes(":");
  const width = address.v6 ? 128 : 32;
  const written = slash < 0 ? String(width) : text.slice(slash + 1);
  const max = mapped ? 128 : width;
  if (!/^(?:0|[1-9][0-9]{0,2})$/.test(written) || Number(written) > max) {
    return { problem: `prefix length '${written}' is not 0-${max}` };
  }
  const bits = Number(written) - (mapped ? 96 : 0);
  if (bits < 0) return { problem: "an IPv4-mapped prefix shorter than /96" };
  const shift = BigInt(width - bits);
  const net = { v6: address.v6, value: (address.value >> shift) << shift };
  if (net.value !== address.value) {
    return { problem: `bits set past /${bits}: did you mean '${formatAddress(net)}/${bits}'?` };
  }
  return { cidr: { ip: formatAddress(net), bits } };
}

/**
 * Renders a CIDR as `ip/bits` (what `egress_addresses` holds once loaded).
 *
 * @example
 * ```ts
 * import { formatCidr, parseCidr } from "./egress_entries.ts";
 * formatCidr(parseCidr("127.0.0.1")); // "127.0.0.1/32"
 * ```
 *
 * @param cidr The network.
 * @returns Its text.
 */
export function formatCidr(cidr: Cidr): string {
  return `${cidr.ip}/${cidr.bits}`;
}

/**
 * Whether an address lies in one of the CIDRs.
 *
 * @example
 * ```ts
 * import { inCidrs } from "./egress_entries.ts";
 * inCidrs("10.1.2.3", ["10.0.0.0/8"]); // true
 * inCidrs("::ffff:10.1.2.3", ["10.0.0.0/8"]); // true
 * ```
 *
 * @param ip An IP literal (brackets optional).
 * @param cidrs CIDRs or bare addresses.
 * @returns True when one contains it; false for a host that is no IP literal.
 * @throws {Error} When a CIDR is invalid.
 */
export function inCidrs(ip: string, cidrs: readonly string[]): boolean {
  const address = parseAddress(ip);
  if (address === undefined) return false;
  return cidrs.some((text) => {
    const cidr = parseCidr(text);
    return inPrefix(address, parseAddress(cidr.ip)!, cidr.bits);
  });
}

/**
 * Why the proxy must not connect to an address a name resolved to: it is not
 * public and no CIDR of `egress_addresses` contains it.
 *
 * @example
 * ```ts
 * import { addressRefusal } from "./egress_entries.ts";
 * addressRefusal("127.0.0.1", []); // "'127.0.0.1' is a loopback address (not in egress_addresses)"
 * addressRefusal("127.0.0.1", ["127.0.0.0/8"]); // undefined
 * addressRefusal("8.8.8.8", []); // undefined
 * ```
 *
 * @param ip The address (brackets optional).
 * @param allowedCidrs The identity's `egress_addresses`.
 * @returns Undefined when the address may be used, else a one-line reason.
 * @throws {Error} When a CIDR is invalid.
 */
export function addressRefusal(ip: string, allowedCidrs: readonly string[]): string | undefined {
  const address = parseAddress(ip);
  if (address === undefined) return `'${ip}' is not an IP address`;
  const kind = kindOf(address);
  if (kind === "public" || inCidrs(ip, allowedCidrs)) return undefined;
  const shown = formatAddress(address);
  const article = kind === "unspecified" ? "an" : "a";
  return `'${shown}' is ${article} ${kind} address (not in egress_addresses)`;
}
