/**
 * Who a sandbox belongs to, and the names derived from it.
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { join } from "../path.ts";
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

/** Host paths of one sandbox's state. */
export interface StatePaths {
  /** `$WAFFLE_HOME/sandboxes/<hash>`: the host's, mode 0700. */
  root: string;
  /** The queue directory; its `inbound/` is bind-mounted read-only at `/queue/inbound`. */
  queue: string;
  /** The sandbox's volume: the disk quota's mount point (a plain directory without one). */
  volume: string;
  /** The runner's directory inside the volume, bind-mounted at `/queue/outbound`. */
  outbound: string;
  /** The user's workspace inside the volume, bind-mounted at `/workspace`. */
  workspace: string;
  /**
   * `<root>/last_use`: the host's record of its last use of the sandbox
   * (see `queue/use_mark.ts`), in the root, which no container mounts.
   */
  useMark: string;
  /** Cross-process lock of this sandbox's lifecycle. */
  lock: string;
  /**
   * `$WAFFLE_HOME/ch/<hash prefix>`: where hosts listen for the runner's
   * session channels (short: a socket path holds 107 bytes); read-only inside.
   */
  channel: string;
}

/**
 * The state paths of a sandbox under a waffle home.
 *
 * @param home `WAFFLE_HOME`.
 * @param key The sandbox key.
 * @returns Its paths.
 */
export function statePaths(home: string, key: SandboxKey): StatePaths {
  return {
    ...stateLayout(join(home, "sandboxes", key.hash)),
    lock: join(home, "locks", `${key.hash}.lock`),
    channel: join(home, "ch", key.hash.slice(0, 16)),
  };
}

/**
 * The layout of a sandbox's state directory (all but the lock and the channel
 * directory, which live in the home), e.g. for a root found in a container's label.
 *
 * @param root The state root.
 * @returns Its paths.
 */
export function stateLayout(root: string): Omit<StatePaths, "lock" | "channel"> {
  const volume = join(root, "volume");
  return {
    root,
    queue: join(root, "queue"),
    volume,
    outbound: join(volume, "outbound"),
    workspace: join(volume, "workspace"),
    useMark: join(root, "last_use"),
  };
}
