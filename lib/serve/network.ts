/**
 * E2B's per-sandbox network settings (`allowInternetAccess`,
 * `network.allowOut`, `network.denyOut`) mapped onto waffle's egress: what
 * the config grants every sandbox (nothing, the `[sandbox] egress` list, or
 * anything with `network = "bridge"`), narrowed by the create, never widened.
 * The result is a narrower sandbox config (overrides for `openSandbox`); the
 * matching, intersection and address rules stay with `lib/config/`.
 *
 * E2B's semantics: `allowInternetAccess: false` is `denyOut: ["0.0.0.0/0"]`;
 * `denyOut` holds addresses and CIDRs only; `allowOut` (names, `*.` names,
 * addresses, CIDRs) wins over `denyOut`.
 *
 * @module
 */
import type { SandboxConfig } from "../config/config.ts";
import {
  addressKind,
  canonicalIp,
  checkCidr,
  checkEntry,
  type Cidr,
  DEFAULT_PORTS,
  formatCidr,
  formatEntry,
  inCidrs,
  intersect,
  mergeEntries,
} from "../config/egress_entries.ts";
import type { EgressEntry } from "../config/egress_types.ts";

/** What a create asked of the network (persisted with the sandbox). */
export interface NetworkAsk {
  /** `allow_internet_access`: false denies everything but `allowOut`; absent: not said. */
  allowInternetAccess?: boolean | undefined;
  /** Destinations allowed even when denied: names, `*.` names, addresses, CIDRs. */
  allowOut?: string[] | undefined;
  /** Addresses and CIDRs denied. */
  denyOut?: string[] | undefined;
}

/** What the config grants every sandbox, as `loadWaffleConfig` resolved it. */
export type EgressGrant = Pick<
  SandboxConfig,
  "network" | "egress" | "egressAddresses" | "egressAllowHostLoopback"
>;

/** The sandbox config a create gets, or why it is refused (403: wider than granted; 400: not expressible). */
export type Narrowing =
  | { overrides: Partial<SandboxConfig> }
  | { status: 400 | 403; message: string };

const NEVER_WIDER = "a create may narrow what the config grants, never widen it";

// One allowOut value: an egress entry (`portless` when no port was written:
// E2B's values have none and mean every port), or a range.
type Allowed =
  | { text: string; entry: EgressEntry; portless: boolean }
  | { text: string; cidr: Cidr };

/**
 * The sandbox config a create's network settings give: the grant, narrowed.
 *
 * @example
 * ```ts ignore
 * narrowEgress(grant, { allowInternetAccess: false, allowOut: ["api.example.com"] });
 * // { overrides: { egress: [{ kind: "name", host: "api.example.com", ports: [443] }] } }
 * ```
 *
 * @param grant What the config grants every sandbox.
 * @param ask What the create asked.
 * @returns Overrides for the sandbox's config (`{}`: the grant as it is), or a refusal.
 */
export function narrowEgress(grant: EgressGrant, ask: NetworkAsk): Narrowing {
  const allowed: Allowed[] = [];
  for (const text of ask.allowOut ?? []) {
    const read = readAllowed(text);
    if ("problem" in read) return { status: 400, message: read.problem };
    allowed.push(read);
  }
  const denied: Cidr[] = [];
  for (const text of ask.denyOut ?? []) {
    const read = checkCidr(text);
    if ("problem" in read) {
      return {
        status: 400,
        message: `Network denyOut '${text}' is not an IP address or CIDR (${read.problem})`,
      };
    }
    denied.push(read.cidr);
  }
  const bridge = grant.network === "bridge";
  if (ask.allowInternetAccess === true && !bridge) {
    return {
      status: 403,
      message:
        `Internet access is not granted to this server's sandboxes: 'sandbox.network = "bridge"' in waffle.toml would grant it (${NEVER_WIDER})`,
    };
  }
  const list = bridge ? undefined : grant.egress;
  const wider = allowed.filter((item) => !bridge && !granted(item, list ?? []));
  if (wider.length > 0) {
    return {
      status: 403,
      message: `Network allowOut '${
        wider.map((item) => item.text).join(",").slice(0, 500)
      }' is not granted to this server's sandboxes: 'sandbox.egress' in waffle.toml would grant it (${NEVER_WIDER})`,
    };
  }
  const denyAll = ask.allowInternetAccess === false || denied.some((cidr) => cidr.bits === 0);
  if (bridge) return fromBridge(allowed, { denied, denyAll });
  if (list === undefined) return { overrides: {} };
  if (denyAll) {
    return {
      overrides: { egress: intersect(list, allowed.flatMap((item) => asEntries(item, list))) },
    };
  }
  return withoutDenied(list, { allowed, denied });
}

// An allowOut value as an entry or a range; a port is waffle's extension.
function readAllowed(text: string): Allowed | { problem: string } {
  if (text.includes("/")) {
    const read = checkCidr(text);
    if ("problem" in read) {
      return { problem: `Network allowOut '${text}' is not a CIDR (${read.problem})` };
    }
    const full = read.cidr.ip.includes(":") ? 128 : 32;
    if (read.cidr.bits < full) return { text, cidr: read.cidr };
    return {
      text,
      entry: { kind: "ip", host: read.cidr.ip, ports: [...DEFAULT_PORTS] },
      portless: true,
    };
  }
  const ip = canonicalIp(text);
  if (ip !== undefined) {
    return { text, entry: { kind: "ip", host: ip, ports: [...DEFAULT_PORTS] }, portless: true };
  }
  const read = checkEntry(text);
  if ("problem" in read) {
    return {
      problem:
        `Network allowOut '${text}' is not a domain name, IP address or CIDR (${read.problem})`,
    };
  }
  return { text, entry: read.entry, portless: !text.includes(":") };
}

// Whether the list grants all of an allowOut value: a value written without
// a port asks for its host (on the ports the list grants it), one with ports
// for those; a range only when each of its addresses is listed (never, but a
// one-address range is an address).
function granted(item: Allowed, list: readonly EgressEntry[]): boolean {
  if ("cidr" in item) return false;
  const entries = asEntries(item, list);
  if (entries.length === 0) return false;
  const got = intersect(entries, list);
  return entries.every((entry) =>
    got.some((g) =>
      g.kind === entry.kind && g.host === entry.host &&
      (item.portless || entry.ports.every((port) => g.ports.includes(port)))
    )
  );
}

// An allowOut value as entries of the list's terms: without a port, every
// port the list uses; a range, the list's addresses inside it.
function asEntries(item: Allowed, list: readonly EgressEntry[]): EgressEntry[] {
  if ("cidr" in item) {
    return list.filter((entry) =>
      entry.kind === "ip" && inCidrs(entry.host, [formatCidr(item.cidr)])
    );
  }
  if (!item.portless) return [item.entry];
  const ports = [...new Set(list.flatMap((entry) => entry.ports))].sort((a, b) => a - b);
  return ports.length === 0 ? [] : [{ ...item.entry, ports }];
}

// A grant of anything narrowed: to nothing but allowOut, through the egress
// proxy. Denying some addresses of "anything" has no expression in waffle's
// lists (they allow, never deny).
function fromBridge(
  allowed: readonly Allowed[],
  options: { denied: readonly Cidr[]; denyAll: boolean },
): Narrowing {
  if (!options.denyAll) {
    const denied = options.denied[0];
    if (denied === undefined) return { overrides: {} };
    return {
      status: 400,
      message: `Network denyOut '${
        formatCidr(denied)
      }' cannot be expressed on this server: its sandboxes reach anything ('sandbox.network = "bridge"'), and waffle's egress lists what is allowed, not what is denied; deny everything (allowInternetAccess: false) and list what to allow in allowOut`,
    };
  }
  const egress: EgressEntry[] = [];
  const addresses: string[] = [];
  for (const item of allowed) {
    if ("cidr" in item) {
      return {
        status: 400,
        message:
          `Network allowOut '${item.text}' cannot be expressed on this server: waffle's egress lists single addresses, not ranges; list the addresses`,
      };
    }
    const { entry } = item;
    if (entry.kind !== "ip") {
      egress.push(entry);
      continue;
    }
    const kind = addressKind(entry.host);
    // The sandbox's own loopback: reached without the proxy, never through it (the host's).
    if (kind === "loopback") continue;
    if (kind !== "public") addresses.push(`${entry.host}/${entry.host.includes(":") ? 128 : 32}`);
    egress.push(entry);
  }
  if (egress.length === 0) return { overrides: { network: "none" } };
  return {
    overrides: {
      network: "none",
      egress: mergeEntries(egress),
      egressAddresses: addresses,
      // What a bridge sandbox reached: the host's own addresses too, never its loopback.
      egressAllowHostLoopback: true,
    },
  };
}

// The list less the addresses denied, but for what allowOut allows again.
// A name's address is known only when it is connected to: denying a range
// while a name stays allowed has no exact expression.
function withoutDenied(
  list: readonly EgressEntry[],
  options: { allowed: readonly Allowed[]; denied: readonly Cidr[] },
): Narrowing {
  const { allowed, denied } = options;
  if (denied.length === 0) return { overrides: {} };
  const again = intersect(list, allowed.flatMap((item) => asEntries(item, list)));
  const allowedAgain = (entry: EgressEntry): boolean =>
    intersect([entry], again).some((g) =>
      g.kind === entry.kind && g.host === entry.host && g.ports.length === entry.ports.length
    );
  const names = list.filter((entry) => entry.kind !== "ip" && !allowedAgain(entry));
  if (names.length > 0) {
    return {
      status: 400,
      message: `Network denyOut '${
        denied.map(formatCidr).join(",")
      }' cannot be expressed on this server: 'sandbox.egress' allows names (${
        names.map(formatEntry).join(", ").slice(0, 300)
      }) whose addresses are known only when connecting, and waffle's egress lists what is allowed; deny everything (allowInternetAccess: false) and list what to allow in allowOut`,
    };
  }
  const kept = list.filter((entry) =>
    entry.kind !== "ip" || !inCidrs(entry.host, denied.map(formatCidr))
  );
  return { overrides: { egress: mergeEntries([...kept, ...again]) } };
}
