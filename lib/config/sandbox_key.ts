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
}

const ID = /^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$/;

/**
 * Validates a tenant and user id and derives the sandbox key. Ids are
 * length-prefixed before hashing, so ("ab","c") and ("a","bc") never collide.
 *
 * @param tenant Tenant id.
 * @param user User id.
 * @param options `home`: the `WAFFLE_HOME` the sandbox belongs to.
 * @returns The key.
 * @throws {UsageError} When an id has characters outside `A-Z a-z 0-9 . _ @ + -` or is longer than 128.
 */
export function sandboxKey(tenant: string, user: string, options: { home: string }): SandboxKey {
  for (const [what, value] of [["tenant", tenant], ["user", user]] as const) {
    if (!ID.test(value)) {
      throw new UsageError(
        `Invalid ${what} id '${
          value.slice(0, 140)
        }': use 1-128 of A-Z a-z 0-9 . _ @ + - starting with a letter or digit`,
      );
    }
  }
  const hash = sha256Hex(`${tenant.length}:${tenant}|${user.length}:${user}`);
  const home = sha256Hex(options.home).slice(0, 8);
  return { tenant, user, hash, containerName: `waffle-${home}-${hash.slice(0, 24)}` };
}
