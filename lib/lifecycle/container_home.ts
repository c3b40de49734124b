/**
 * Which waffle home a sandbox container belongs to, read from the labels it
 * already carries: `waffle.state` is `statePaths(home, key).root`, that is
 * `<home>/sandboxes/<pair hash>`, so the home is the state root's
 * grandparent. No label of its own: one would enter the posture hash and
 * recreate every container on upgrade, and it would say nothing the state
 * label does not.
 *
 * The labels place a container only when they are exactly what waffle writes:
 * an absolute, normalized state root whose last segment is the hash of the
 * `waffle.tenant` and `waffle.user` labels. Anything else (a label missing,
 * edited or copied) places it in no home, so no home's fleet command judges
 * it as its own; `--all` shows it as such.
 *
 * Homes are compared as directories, never as string prefixes: `/a/home`
 * and `/a/home2` are two homes, `/a/home/` and `/a/home` one, and a
 * symlinked spelling of a home is that home.
 *
 * @module
 */
import { dirname, normalize, resolve } from "../path.ts";
import { statePaths } from "./identity.ts";
import { type SandboxKey, sandboxKey } from "../config/sandbox_key.ts";
import { LABELS } from "./posture.ts";

/** Where a container's labels place it. */
export type ContainerHome =
  | {
    /** The waffle home whose state root the labels name. */
    home: string;
    /** The sandbox the labels name. */
    key: SandboxKey;
  }
  | {
    /** Placed in no home. */
    home: null;
    /** Why the labels place it in no home. */
    problem: string;
  };

// `<home>/sandboxes/<64 hex>`, the home absolute (`/` included).
const STATE_ROOT = /^(?:\/.+)?\/sandboxes\/[0-9a-f]{64}$/s;

/**
 * Reads the waffle home a container belongs to from its labels.
 *
 * @example
 * ```ts ignore
 * const placed = containerHome(summary.Labels);
 * if (placed.home === null) console.log(placed.problem);
 * ```
 *
 * @param labels The container's labels.
 * @returns The home and sandbox key, or why the labels name none.
 */
export function containerHome(labels: Record<string, string>): ContainerHome {
  const state = labels[LABELS.state] ?? "";
  if (state === "") return { home: null, problem: `No '${LABELS.state}' label` };
  if (normalize(state) !== state || !STATE_ROOT.test(state)) {
    return {
      home: null,
      problem: `Label '${LABELS.state}' '${state.slice(0, 200)}' is not a waffle state root`,
    };
  }
  const home = dirname(dirname(state));
  let key: SandboxKey;
  try {
    key = sandboxKey(labels[LABELS.tenant] ?? "", labels[LABELS.user] ?? "", {
      home,
      pool: labels[LABELS.pool],
    });
  } catch {
    return {
      home: null,
      problem: `Labels '${LABELS.tenant}' and '${LABELS.user}' name no valid tenant and user`,
    };
  }
  if (statePaths(home, key).root !== state) {
    return {
      home: null,
      problem:
        `Label '${LABELS.state}' '${state}' is not the state root of user '${key.user}' of tenant '${key.tenant}'`,
    };
  }
  return { home, key };
}

/**
 * A test of whether a home, as a container's labels name it, is `home`: the
 * same normalized path, or the same directory however spelled (a symlink).
 * Real paths are looked up once per spelling.
 *
 * @example
 * ```ts ignore
 * const ours = homeMatcher(config.home);
 * ours("/var/lib/waffle"); // true for the home itself, also through a symlink
 * ```
 *
 * @param home This process's `WAFFLE_HOME` (absolute).
 * @returns The test; false for null (no home) and for a home that cannot be resolved and is spelled otherwise.
 */
export function homeMatcher(home: string): (other: string | null) => boolean {
  const own = resolve(home);
  const realOwn = realPathOf(own);
  const seen = new Map<string, boolean>([[own, true]]);
  return (other) => {
    if (other === null) return false;
    let same = seen.get(other);
    if (same === undefined) {
      same = realOwn !== undefined && realPathOf(other) === realOwn;
      seen.set(other, same);
    }
    return same;
  };
}

function realPathOf(path: string): string | undefined {
  try {
    return Deno.realPathSync(path);
  } catch {
    // Gone or unreadable: compared by spelling only.
    return undefined;
  }
}
