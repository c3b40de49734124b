/**
 * Kubernetes names for waffle's objects: the DNS-1123 rules the API server
 * enforces, the KubeSpawner-style safe name that maps any tenant to a
 * distinct valid namespace, and the names of a sandbox's objects. A name
 * made here is stored (in a label or an annotation) and read back, never
 * recomputed from the tenant.
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { UsageError } from "../errors.ts";

/** The longest DNS-1123 label: a namespace, a Service, a label's name part. */
export const DNS1123_LABEL_MAX = 63;
/** The longest DNS-1123 subdomain: most objects' `metadata.name`, a label key's prefix. */
export const DNS1123_SUBDOMAIN_MAX = 253;
/** The longest label value. */
export const LABEL_VALUE_MAX = 63;

const LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const LABEL_VALUE = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
/** The hash suffix a changed or shortened name carries: `-` and 8 hex digits. */
const HASH_SUFFIX_LENGTH = 9;

/**
 * Whether a value is a DNS-1123 label: 1-63 of `a-z 0-9 -`, starting and
 * ending with a letter or digit (a namespace, a Service, a container's name).
 *
 * @param value The name.
 * @returns True when Kubernetes accepts it as a label.
 *
 * @example
 * ```ts
 * isDns1123Label("waffle-acme"); // true
 * isDns1123Label("Bad_Name"); // false
 * ```
 */
export function isDns1123Label(value: string): boolean {
  return value.length <= DNS1123_LABEL_MAX && LABEL.test(value);
}

/**
 * Whether a value is a DNS-1123 subdomain: at most 253 characters, labels
 * joined by dots (most objects' `metadata.name`).
 *
 * @param value The name.
 * @returns True when Kubernetes accepts it as a subdomain.
 *
 * @example
 * ```ts
 * isDns1123Subdomain("sandboxes.agents.x-k8s.io"); // true
 * isDns1123Subdomain("a..b"); // false
 * ```
 */
export function isDns1123Subdomain(value: string): boolean {
  return value.length <= DNS1123_SUBDOMAIN_MAX &&
    value.split(".").every((part) => LABEL.test(part));
}

/**
 * Whether a value may be a label's value: empty, or at most 63 of
 * `A-Z a-z 0-9 - _ .` starting and ending with a letter or digit.
 *
 * @param value The value.
 * @returns True when valid.
 *
 * @example
 * ```ts
 * isLabelValue("waffle"); // true
 * isLabelValue("x".repeat(64)); // false
 * ```
 */
export function isLabelValue(value: string): boolean {
  return value === "" || (value.length <= LABEL_VALUE_MAX && LABEL_VALUE.test(value));
}

/**
 * Whether a value may be a label's (or an annotation's) key: a name part as
 * {@linkcode isLabelValue} but not empty, after an optional DNS-1123
 * subdomain prefix and `/`.
 *
 * @param key The key.
 * @returns True when valid.
 *
 * @example
 * ```ts
 * isLabelKey("app.kubernetes.io/managed-by"); // true
 * isLabelKey("waffle.dev/"); // false
 * ```
 */
export function isLabelKey(key: string): boolean {
  const slash = key.indexOf("/");
  const name = slash < 0 ? key : key.slice(slash + 1);
  if (slash >= 0 && !isDns1123Subdomain(key.slice(0, slash))) return false;
  return name !== "" && isLabelValue(name);
}

/**
 * A KubeSpawner-style safe DNS-1123 label for any value: lower-cased, each
 * character outside `a-z 0-9 -` made `-`, leading and trailing `-` trimmed.
 * When that changed the value, or it is longer than `maxLength`, it is
 * truncated and suffixed with `-` and the first 8 hex digits of the value's
 * SHA-256, so two values that clean up alike still get distinct names. A
 * valid short value is itself.
 *
 * @param value Any string (a tenant id).
 * @param options `prefix`: put before the cleaned value (counted in the
 *   length, never hashed; must itself start a valid label); `maxLength`: at
 *   most 63 (the default).
 * @returns A valid DNS-1123 label.
 * @throws {RangeError} When `maxLength` leaves no room for the prefix and the hash.
 *
 * @example
 * ```ts
 * dns1123Label("acme", { prefix: "waffle-" }); // "waffle-acme"
 * dns1123Label("Acme_Corp"); // "acme-corp-" + 8 hex digits
 * ```
 */
export function dns1123Label(
  value: string,
  options: { prefix?: string; maxLength?: number } = {},
): string {
  const prefix = options.prefix ?? "";
  const max = options.maxLength ?? DNS1123_LABEL_MAX;
  if (!(max <= DNS1123_LABEL_MAX && prefix.length + HASH_SUFFIX_LENGTH <= max)) {
    throw new RangeError(
      `Cannot make a label as 'maxLength' must leave room for the prefix and the hash: current value is ${max}`,
    );
  }
  const cleaned = value.toLowerCase().replace(/[^a-z0-9-]/g, "-").replace(/^-+|-+$/g, "");
  const plain = `${prefix}${cleaned}`;
  if (cleaned === value && cleaned !== "" && plain.length <= max && isDns1123Label(plain)) {
    return plain;
  }
  const hash = sha256Hex(value).slice(0, 8);
  const kept = plain.slice(0, max - HASH_SUFFIX_LENGTH).replace(/-+$/, "");
  return kept === "" ? hash : `${kept}-${hash}`;
}

/** The prefix of a tenant's namespace unless configured otherwise. */
export const DEFAULT_NAMESPACE_PREFIX = "waffle-";

/**
 * The namespace of a tenant's sandboxes: `<prefix><tenant>` as a safe
 * DNS-1123 label (see {@linkcode dns1123Label}). Stored on each Sandbox
 * (its namespace and the `waffle.dev/tenant` annotation), never recomputed
 * when read back.
 *
 * @param tenant The tenant id.
 * @param prefix The namespaces' prefix (default `waffle-`).
 * @returns The namespace.
 * @throws {UsageError} When the prefix is not the start of a DNS-1123 label.
 *
 * @example
 * ```ts
 * tenantNamespace("acme"); // "waffle-acme"
 * ```
 */
export function tenantNamespace(tenant: string, prefix: string = DEFAULT_NAMESPACE_PREFIX): string {
  if (prefix.length > 32 || !(prefix === "" || /^[a-z0-9][-a-z0-9]*$/.test(prefix))) {
    throw new UsageError(
      `Invalid namespace prefix '${prefix}': use up to 32 of a-z 0-9 - starting with a letter or digit`,
    );
  }
  return dns1123Label(tenant, { prefix });
}

/** An E2B sandbox id as the object names can hold it (`workspace-wfl-<id>` stays within 63). */
const SANDBOX_ID = /^[a-z0-9]([-a-z0-9]{0,47}[a-z0-9])?$/;

/**
 * The name of a sandbox's `Sandbox` object (and so of its pod): `wfl-<id>`.
 *
 * @param id The sandbox id (E2B's: 20 of `a-z 0-9`, a letter first).
 * @returns The name.
 * @throws {UsageError} When the id is not 1-49 of `a-z 0-9 -` starting and ending with a letter or digit.
 *
 * @example
 * ```ts
 * sandboxObjectName("i1a2b3c4d5e6f7g8h9j0"); // "wfl-i1a2b3c4d5e6f7g8h9j0"
 * ```
 */
export function sandboxObjectName(id: string): string {
  if (!SANDBOX_ID.test(id)) {
    throw new UsageError(
      `Invalid sandbox id '${
        id.slice(0, 80)
      }': use 1-49 of a-z 0-9 - starting and ending with a letter or digit`,
    );
  }
  return `wfl-${id}`;
}

/**
 * The PVC agent-sandbox makes from the Sandbox's `workspace` claim
 * template: `<template>-<sandbox name>`.
 *
 * @param name The Sandbox's name.
 * @returns The claim's name.
 */
export function workspaceClaimName(name: string): string {
  return `workspace-${name}`;
}

/**
 * The Secret holding a sandbox's tokens: `<sandbox name>-waffle`.
 *
 * @param name The Sandbox's name.
 * @returns The Secret's name.
 */
export function sandboxSecretName(name: string): string {
  return `${name}-waffle`;
}
