/**
 * Who a sandbox belongs to: a validated (tenant, user) pair, and the names
 * derived from it (its hash and container name). The id rule is the one
 * every user id of the config is checked by.
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { UsageError } from "../errors.ts";

/** A validated (tenant, user) pair and its derived names. */
export interface SandboxKey {
  /** Validated tenant id. */
  tenant: string;
  /** Validated user id. */
  user: string;
  /** Hex SHA-256 of the length-prefixed pair: collision-free across separators. */
  hash: string;
  /**
   * Deterministic container name: `waffle-<home fingerprint>-<pair hash>`.
   * The home is part of it so two waffle installations (or test homes) on
   * one daemon can never adopt, recycle or remove each other's containers.
   */
  containerName: string;
  /**
   * Set on a warm pool's member only: the template it was made for. Its
   * tenant is {@linkcode POOL_TENANT}, which no other key may have.
   */
  pool?: string;
}

/**
 * The tenant of every warm pool member (`lib/lifecycle/pool.ts`): reserved,
 * so no user's sandbox can be taken for, or take, a pool's.
 */
export const POOL_TENANT = "waffle-pool";

const ID = /^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$/;

/** The id rule as a message gives it. */
export const ID_RULE = "use 1-128 of A-Z a-z 0-9 . _ @ + - starting with a letter or digit";

/**
 * Whether a value is a valid id (see {@linkcode checkId}).
 *
 * @example
 * ```ts
 * import { isId } from "./sandbox_key.ts";
 * isId("alice@example.com"); // true
 * isId("../x"); // false
 * ```
 *
 * @param value The id.
 * @returns True when it keeps the rule.
 */
export function isId(value: string): boolean {
  return ID.test(value);
}

/**
 * Checks an id by the rule of tenant and user ids (`--tenant`, `--user`):
 * 1-128 of `A-Z a-z 0-9 . _ @ + -`, starting with a letter or digit. Other
 * names that stand beside them (a `waffle serve` key's name) use it too.
 *
 * @example
 * ```ts
 * import { checkId } from "./sandbox_key.ts";
 * checkId("tenant id", "acme"); // "acme"
 * ```
 *
 * @param what What the id is, for the message: `tenant id`, `user id`, `key name`.
 * @param value The id.
 * @returns The id.
 * @throws {UsageError} When it breaks the rule: one line quoting it.
 */
export function checkId(what: string, value: string): string {
  if (ID.test(value)) return value;
  throw new UsageError(`Invalid ${what} '${value.slice(0, 140)}': ${ID_RULE}`);
}

/**
 * Validates a tenant and user id and derives the sandbox key. Ids are
 * length-prefixed before hashing, so ("ab","c") and ("a","bc") never collide.
 *
 * @param tenant Tenant id.
 * @param user User id.
 * @param options `home`: the `WAFFLE_HOME` the sandbox belongs to; `pool`: the
 *   template of a warm pool's member (its tenant is then {@linkcode POOL_TENANT}).
 * @returns The key.
 * @throws {UsageError} When an id has characters outside `A-Z a-z 0-9 . _ @ + -` or is longer
 *   than 128, or the pool tenant is named without `pool` (or another with it).
 */
export function sandboxKey(
  tenant: string,
  user: string,
  options: { home: string; pool?: string | undefined },
): SandboxKey {
  checkId("tenant id", tenant);
  checkId("user id", user);
  if ((tenant === POOL_TENANT) !== (options.pool !== undefined)) {
    throw new UsageError(
      options.pool === undefined
        ? `Tenant id '${tenant}' is reserved for warm pools`
        : `A pool member's tenant must be '${POOL_TENANT}', found '${tenant}'`,
    );
  }
  const hash = sha256Hex(`${tenant.length}:${tenant}|${user.length}:${user}`);
  const home = sha256Hex(options.home).slice(0, 8);
  const containerName = `waffle-${home}-${hash.slice(0, 24)}`;
  return options.pool === undefined
    ? { tenant, user, hash, containerName }
    : { tenant, user, hash, containerName, pool: options.pool };
}
