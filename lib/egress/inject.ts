/**
 * Credentials by placeholder: the sandbox holds a placeholder, and the proxy
 * writes the real value into the one header its secret names, for the
 * secret's own hosts, on a TLS connection it terminated itself, into a
 * request whose authority (by RFC 9112's rules: an absolute-form target's
 * over `Host`) is that connection's. Nowhere else: not in other headers,
 * the URL or the body, and not for any other host or port.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type { RequestHead } from "./http_head.ts";
import { type Authority, effectiveAuthority, sameAuthority } from "./request_target.ts";

/** A secret as the proxy holds it: the config's rule, its placeholder and its value. */
export interface HeldSecret {
  /** The `[secrets.<name>]` key. */
  name: string;
  /** The exact host names it is for. */
  hosts: string[];
  /** The header it goes in. */
  header: string;
  /** How the header is written when the sandbox sends the bare placeholder (`{}` = the value). */
  format: string;
  /** What the sandbox sees instead of the value. */
  placeholder: string;
  /** The value. */
  value: string;
}

/**
 * Replaces the placeholders of the secrets meant for the connection's host
 * in their headers: a header that is the bare placeholder becomes the
 * secret's `format`; one that contains it gets the value in its place; a
 * `Basic` credential whose decoded `user:password` contains it is decoded,
 * replaced and encoded again (git sends a token that way). Nothing is
 * replaced unless the request names the connection's authority, host and
 * port, as an HTTPS server reads it (see `effectiveAuthority`).
 *
 * @example
 * ```ts ignore
 * injectSecrets(head, { authority: { host: "api.github.com", port: 443 }, secrets }); // { head, injected: ["github"] }
 * ```
 *
 * @param head The request head to send (origin form, its `Host` the connection's).
 * @param options The authority the connection goes to and the identity's secrets.
 * @returns The head to send and the names of the secrets written into it.
 */
export function injectSecrets(
  head: RequestHead,
  options: { authority: Authority; secrets: readonly HeldSecret[] },
): { head: RequestHead; injected: string[] } {
  const named = effectiveAuthority(head, "https");
  if (named === undefined || !sameAuthority(named, options.authority)) {
    return { head, injected: [] };
  }
  const injected = new Set<string>();
  const headers = head.headers.map(([name, value]): [string, string] => {
    for (const secret of options.secrets) {
      if (!secret.hosts.includes(named.host)) continue;
      if (name.toLowerCase() !== secret.header.toLowerCase()) continue;
      const replaced = replaceIn(value, secret);
      if (replaced !== value) {
        injected.add(secret.name);
        value = replaced;
      }
    }
    return [name, value];
  });
  return { head: { ...head, headers }, injected: [...injected] };
}

function replaceIn(value: string, secret: HeldSecret): string {
  // A function, not the value itself: replace() would read `$&`, `$$`… in it.
  if (value === secret.placeholder) return secret.format.replace("{}", () => secret.value);
  if (value.includes(secret.placeholder)) return value.split(secret.placeholder).join(secret.value);
  const basic = /^Basic\s+([A-Za-z0-9+/=]+)$/i.exec(value);
  if (basic === null) return value;
  const decoded = Buffer.from(basic[1]!, "base64").toString("utf8");
  if (!decoded.includes(secret.placeholder)) return value;
  const credential = decoded.split(secret.placeholder).join(secret.value);
  return `Basic ${Buffer.from(credential, "utf8").toString("base64")}`;
}
