/**
 * Where a sandbox's state lives on the host, derived from its key (the key
 * itself, who a sandbox belongs to, is `lib/config/sandbox_key.ts`'s).
 *
 * @module
 */
import { join } from "../path.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";

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
 * The channel directory of one restricted container of a sandbox (see
 * `lib/sandbox/restricted.ts`): its own, beside the sandbox's, so neither container
 * sees the other's session sockets.
 *
 * @param paths The sandbox's state paths.
 * @param id The restricted session's id (`[0-9a-f-]{12}`).
 * @returns The host directory mounted at the container's channel directory.
 */
export function restrictedChannelDir(paths: Pick<StatePaths, "channel">, id: string): string {
  return `${paths.channel}-r-${id}`;
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
