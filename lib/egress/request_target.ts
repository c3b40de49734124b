/**
 * Which authority a request names, and the form it goes upstream in. RFC
 * 9112 §3.2.2: a server that receives an absolute-form target
 * (`GET http://a.example/x`) uses its authority and ignores `Host`, so on a
 * shared front a request that names another authority goes there, with
 * whatever credential it carries. The egress proxy sends on one form only:
 *
 * - inside a TLS tunnel it terminated (a secret's host) and for a
 *   forwarded `http://` request alike, what goes upstream is origin-form
 *   (`/path?query`) under a `Host` the proxy writes from the authority it
 *   checked and connects to;
 * - an absolute-form target must name that authority (scheme, host and
 *   port, the port defaulting to 443 for https and 80 for http; the host
 *   compared in lower case without a trailing dot, an IP literal in its
 *   canonical form), and a `Host` header must agree with it;
 * - asterisk-form (`OPTIONS *`), authority-form (`CONNECT h:p`), userinfo
 *   (`https://u@host/`), a path that reads as another authority to lenient
 *   servers (`//host/`, and a backslash anywhere), a fragment, and control
 *   or non-ASCII characters are refused.
 *
 * @module
 */
import { canonicalIp } from "../config/egress_entries.ts";
import { headerValues, type RequestHead } from "./http_head.ts";
import { EgressFailed, EgressRefused } from "./refusal.ts";

/** The schemes the proxy sends requests for: `http` forwarded, `https` in a tunnel it terminated. */
export type Scheme = "http" | "https";

/** A request's destination: a canonical host (lower case, no trailing dot; an IP literal unbracketed) and a port. */
export interface Authority {
  /** The host, canonical. */
  host: string;
  /** The port, 1-65535. */
  port: number;
}

/** A request as it goes upstream, and the authority it was checked for. */
export interface RoutedRequest {
  /** The head: an origin-form target, its `Host` written from {@linkcode RoutedRequest.authority}. */
  head: RequestHead;
  /** The authority checked (and connected to). */
  authority: Authority;
}

/** The port a scheme's URL means when it gives none. */
export const SCHEME_PORTS: Readonly<Record<Scheme, number>> = Object.freeze({
  http: 80,
  https: 443,
});

const ABSOLUTE = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?]*)((?:[/?].*)?)$/;
const AUTHORITY = /^(\[[0-9A-Fa-f:.]+\]|[^:[\]]+)(?::([0-9]{0,5}))?$/;
const CONNECT_TARGET = /^(\[[0-9A-Fa-f:.]+\]|[^:[\]]+):([0-9]{1,5})$/;

/**
 * A value from the client as a message shows it: at most 100 characters,
 * control characters as `?` (a refusal or an audit line stays one short line).
 *
 * @example
 * ```ts
 * import { shown } from "./request_target.ts";
 * shown("a\r\nb"); // "a??b"
 * ```
 *
 * @param text The value.
 * @returns The shown form.
 */
export function shown(text: string): string {
  // deno-lint-ignore no-control-regex
  const clean = text.replace(/[\x00-\x1f\x7f]/g, "?");
  return clean.length > 100 ? `${clean.slice(0, 100)}…` : clean;
}

/**
 * An authority as a message or a `Host` header writes it: an IPv6 host
 * bracketed; with a scheme, its default port left out.
 *
 * @example
 * ```ts
 * import { formatAuthority } from "./request_target.ts";
 * formatAuthority({ host: "fd00::1", port: 443 }); // "[fd00::1]:443"
 * formatAuthority({ host: "a.test", port: 443 }, "https"); // "a.test"
 * ```
 *
 * @param authority The authority.
 * @param scheme The scheme whose default port is left out; absent: the port is always written.
 * @returns `host:port`, or `host` alone.
 */
export function formatAuthority(authority: Authority, scheme?: Scheme): string {
  const host = authority.host.includes(":") ? `[${authority.host}]` : authority.host;
  return scheme !== undefined && authority.port === SCHEME_PORTS[scheme]
    ? host
    : `${host}:${authority.port}`;
}

/**
 * The destination of a `CONNECT`: `host:port`, the port required.
 *
 * @example
 * ```ts
 * import { connectAuthority } from "./request_target.ts";
 * connectAuthority("API.Test.:443"); // { host: "api.test", port: 443 }
 * ```
 *
 * @param target The request target.
 * @returns The authority, canonical.
 * @throws {EgressFailed} 400 when it is malformed.
 */
export function connectAuthority(target: string): Authority {
  const match = CONNECT_TARGET.exec(target);
  if (match === null) throw new EgressFailed(400, `Malformed CONNECT target '${shown(target)}'`);
  const host = hostOf(match[1]!);
  if (host === undefined) throw new EgressFailed(400, `Malformed host '${shown(match[1]!)}'`);
  const port = portOf(match[2]!);
  if (port === undefined) throw new EgressFailed(400, `Invalid port '${shown(match[2]!)}'`);
  return { host, port };
}

/**
 * A request to forward (`GET http://host:port/path`): its authority and
 * the head to send, in origin form. Only `http://` is forwarded, and its
 * `Host` header must agree with the target.
 *
 * @example
 * ```ts ignore
 * forwardedRequest(parseHead("GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n"));
 * // { authority: { host: "a.test", port: 80 }, head: { target: "/x", … } }
 * ```
 *
 * @param head The client's head.
 * @returns The head to send and the authority to check and connect to.
 * @throws {EgressFailed} 400 for a target that is no absolute URL, or not `http://`.
 * @throws {EgressRefused} 403 for a target or `Host` the rule above refuses.
 */
export function forwardedRequest(head: RequestHead): RoutedRequest {
  const absolute = ABSOLUTE.exec(head.target);
  if (absolute === null) {
    throw new EgressFailed(
      400,
      `Not a proxy request: '${shown(head.target)}' is no absolute URL`,
    );
  }
  const scheme = absolute[1]!.toLowerCase();
  if (scheme !== "http") {
    throw new EgressFailed(
      400,
      `Only http:// is forwarded ('${shown(scheme)}:'); use CONNECT for https`,
    );
  }
  const split = splitTarget(head.target, "http");
  if ("problem" in split) {
    throw new EgressRefused(403, `Request target '${shown(head.target)}' ${split.problem}`);
  }
  const authority = split.named!;
  hostAgrees(head, { authority, scheme: "http", whose: "the request target's" });
  return routed(head, { origin: split.origin, authority, scheme: "http" });
}

/**
 * A request read inside a TLS tunnel the proxy terminated: the head to send
 * to the tunnel's host, in origin form. An absolute-form target must be an
 * `https://` URL naming the tunnel's host and port; the `Host` header must
 * name them too.
 *
 * @example
 * ```ts ignore
 * tunnelRequest(parseHead("GET http://evil.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"), { host: "a.test", port: 443 });
 * // throws EgressRefused: Request target 'http://evil.test/' names 'evil.test:80', not this tunnel's 'a.test:443'
 * ```
 *
 * @param head The client's head, read inside the tunnel.
 * @param tunnel The tunnel's authority (the `CONNECT` host and port).
 * @returns The head to send, and the tunnel's authority.
 * @throws {EgressRefused} 403 for anything the rule above refuses.
 */
export function tunnelRequest(head: RequestHead, tunnel: Authority): RoutedRequest {
  const refused = (problem: string): EgressRefused =>
    new EgressRefused(403, `Request target '${shown(head.target)}' ${problem}`);
  const split = splitTarget(head.target, "https");
  if ("problem" in split) throw refused(split.problem);
  if (head.method === "CONNECT") {
    throw refused("comes with CONNECT: a tunnel holds no other tunnel");
  }
  if (split.named !== undefined && !sameAuthority(split.named, tunnel)) {
    throw refused(
      `names '${formatAuthority(split.named)}', not this tunnel's '${formatAuthority(tunnel)}'`,
    );
  }
  if (split.named !== undefined && split.scheme !== "https") {
    throw refused(`is an ${split.scheme}:// URL in a TLS tunnel, not https://`);
  }
  hostAgrees(head, { authority: tunnel, scheme: "https", whose: "this tunnel's" });
  return routed(head, { origin: split.origin, authority: tunnel, scheme: "https" });
}

/**
 * The authority a request names by RFC 9112's rules: an absolute-form
 * target's (which wins over `Host`), else its one `Host` header's; none for
 * a request the proxy would not send on (see the module's rule).
 *
 * @example
 * ```ts ignore
 * effectiveAuthority(parseHead("GET https://b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"), "https");
 * // { host: "b.test", port: 443 }
 * ```
 *
 * @param head The head.
 * @param scheme The scheme it is sent by.
 * @returns The authority, or undefined when it names none the proxy accepts.
 */
export function effectiveAuthority(head: RequestHead, scheme: Scheme): Authority | undefined {
  if (head.method === "CONNECT") return undefined;
  const split = splitTarget(head.target, scheme);
  if ("problem" in split) return undefined;
  if (split.named !== undefined) return split.scheme === scheme ? split.named : undefined;
  const values = headerValues(head, "host");
  const named = values.length === 1 ? authorityOf(values[0]!, scheme) : undefined;
  return named === undefined || "problem" in named ? undefined : named;
}

/**
 * Whether two authorities are one (both canonical).
 *
 * @param a One.
 * @param b The other.
 * @returns True when host and port are equal.
 */
export function sameAuthority(a: Authority, b: Authority): boolean {
  return a.host === b.host && a.port === b.port;
}

// The origin form of a target and, for an absolute form, the authority it
// names and by which scheme; or why the proxy sends no such target on.
function splitTarget(
  target: string,
  scheme: Scheme,
): { origin: string; named?: Authority; scheme?: Scheme } | { problem: string } {
  // A backslash reads as '/' to WHATWG URL parsers ('/\host' is '//host').
  if (/[^\x21-\x7e]|[\\#]/.test(target)) {
    return {
      problem:
        "holds a character no request target may (a backslash, '#', a control or non-ASCII character)",
    };
  }
  const absolute = ABSOLUTE.exec(target);
  let origin = target;
  let named: { named: Authority; scheme: Scheme } | undefined;
  if (absolute !== null) {
    const given = absolute[1]!.toLowerCase();
    if (given !== "http" && given !== "https") {
      return { problem: `is a ${shown(given)}: URL, not ${scheme}://` };
    }
    const authority = authorityOf(absolute[2]!, given);
    if ("problem" in authority) return authority;
    named = { named: authority, scheme: given };
    const rest = absolute[3]!;
    origin = rest.startsWith("/") ? rest : `/${rest}`;
  } else if (!target.startsWith("/")) {
    // Asterisk-form (`*`) and authority-form (`host:port`) included.
    return { problem: `is neither origin-form ('/path') nor an absolute ${scheme}:// URL` };
  }
  if (origin.startsWith("//")) {
    return { problem: "has a path starting with '//', which some servers read as another host" };
  }
  return named === undefined ? { origin } : { origin, ...named };
}

// `host[:port]` of an absolute URL or a Host header, canonical; no userinfo.
function authorityOf(text: string, scheme: Scheme): Authority | { problem: string } {
  if (text.includes("@")) return { problem: "carries userinfo ('…@'), which no request may" };
  const match = AUTHORITY.exec(text);
  const host = match === null ? undefined : hostOf(match[1]!);
  const port = match === null
    ? undefined
    : match[2] === undefined || match[2] === ""
    ? SCHEME_PORTS[scheme]
    : portOf(match[2]);
  if (host === undefined || port === undefined) {
    return { problem: "names no valid host and port" };
  }
  return { host, port };
}

// A host as the policy compares it: an IP literal (IPv6 only in brackets),
// or a name of DNS characters in lower case without its trailing dot.
function hostOf(raw: string): string | undefined {
  if (raw.startsWith("[")) {
    const inner = raw.slice(1, -1);
    return inner.includes(":") ? canonicalIp(inner) : undefined;
  }
  const bare = raw.toLowerCase().replace(/\.$/, "");
  const ip = canonicalIp(bare);
  if (ip !== undefined) return ip;
  return /^[a-z0-9_.-]{1,253}$/.test(bare) ? bare : undefined;
}

function portOf(text: string): number | undefined {
  const value = Number(text);
  return Number.isInteger(value) && value >= 1 && value <= 65535 ? value : undefined;
}

// Exactly one Host header, naming the authority.
function hostAgrees(
  head: RequestHead,
  options: { authority: Authority; scheme: Scheme; whose: string },
): void {
  const values = headerValues(head, "host");
  const named = values.length === 1 ? authorityOf(values[0]!, options.scheme) : undefined;
  if (named !== undefined && !("problem" in named) && sameAuthority(named, options.authority)) {
    return;
  }
  const { host, port } = options.authority;
  throw new EgressRefused(
    403,
    `Request Host header '${
      shown(values.join(", "))
    }' does not match '${host}' port ${port}, ${options.whose}`,
  );
}

// The head to send: the origin form, its Host written from the authority checked.
function routed(
  head: RequestHead,
  options: { origin: string; authority: Authority; scheme: Scheme },
): RoutedRequest {
  const host = formatAuthority(options.authority, options.scheme);
  return {
    authority: options.authority,
    head: {
      ...head,
      target: options.origin,
      headers: head.headers.map(([name, value]) =>
        name.toLowerCase() === "host" ? [name, host] : [name, value]
      ),
    },
  };
}
