/**
 * The addresses of the proxy's host: the proxy has the host's network, so
 * an `egress_addresses` entry covering one of them (`172.16.0.0/12` covers
 * docker0's gateway) would open every service the host binds there to
 * every sandbox. The proxy refuses them unless the identity's policy allows
 * the host (`egress_allow_host_loopback`).
 *
 * @module
 */
import { addressKind, canonicalIp } from "../config/egress_entries.ts";

/** Interfaces come and go (a Docker network is made): the list is read again after this long. */
const REFRESH_MS = 5000;

let cached: { at: number; addresses: Set<string> } | undefined;

/**
 * Whether `ip` is an address of one of this host's interfaces, loopback
 * aside (read at most
 * every {@linkcode REFRESH_MS}, and always on a miss that is older than a
 * second, so a new interface counts at once).
 *
 * @param ip A canonical IP address.
 * @returns Whether it is the host's own.
 */
export function isHostAddress(ip: string): boolean {
  const now = Date.now();
  if (cached === undefined || now - cached.at > REFRESH_MS) {
    cached = { at: now, addresses: readAddresses() };
  }
  if (cached.addresses.has(ip)) return true;
  if (now - cached.at > 1000) cached = { at: now, addresses: readAddresses() };
  return cached.addresses.has(ip);
}

function readAddresses(): Set<string> {
  const addresses = new Set<string>();
  for (const entry of Deno.networkInterfaces()) {
    // A link-local IPv6 address carries its zone (`fe80::1%eth0`).
    const address = canonicalIp(entry.address.replace(/%.*$/, ""));
    // Loopback is the config's to refuse: egress_addresses covers it only
    // beside egress_allow_host_loopback = true.
    if (address !== undefined && addressKind(address) !== "loopback") addresses.add(address);
  }
  return addresses;
}
