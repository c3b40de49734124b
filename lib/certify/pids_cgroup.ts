/**
 * A container's pids cgroup as this host's kernel shows it (cgroup v1 or
 * v2, cgroupfs or systemd driver): the limit, the tasks now, the peak and
 * the forks refused. Not visible when the daemon is not local (Docker
 * Desktop, a remote host): callers then rely on `docker stats` alone.
 *
 * @module
 */

/** What the kernel says about a container's pids cgroup. */
export interface PidsCgroup {
  /** The cgroup directory on this host. */
  dir: string;
  /** `pids.max` ("max" or a number). */
  max: string;
  /** `pids.current`: tasks (threads included) now. */
  current: number;
  /** `pids.peak`, when the kernel has it. */
  peak: number | undefined;
  /** Forks refused because of the limit (`pids.events` "max N"), when available. */
  refused: number | undefined;
}

/**
 * Finds a container's pids cgroup on this host.
 *
 * @param containerId Full container id.
 * @returns The cgroup directory, or undefined when it is not visible here.
 *
 * @example
 * ```ts ignore
 * const dir = findPidsCgroup(containerId); // "/sys/fs/cgroup/pids/docker/<id>"
 * ```
 */
export function findPidsCgroup(containerId: string): string | undefined {
  const candidates = [
    `/sys/fs/cgroup/pids/docker/${containerId}`,
    `/sys/fs/cgroup/pids/system.slice/docker-${containerId}.scope`,
    `/sys/fs/cgroup/system.slice/docker-${containerId}.scope`,
    `/sys/fs/cgroup/docker/${containerId}`,
  ];
  return candidates.find((dir) => readOr(`${dir}/pids.current`) !== undefined);
}

/**
 * Reads a pids cgroup.
 *
 * @param dir The cgroup directory.
 * @returns Its counters; undefined once it is gone.
 *
 * @example
 * ```ts ignore
 * readPidsCgroup(dir)?.max; // "32"
 * ```
 */
export function readPidsCgroup(dir: string): PidsCgroup | undefined {
  const current = readOr(`${dir}/pids.current`);
  if (current === undefined) return undefined;
  const peak = readOr(`${dir}/pids.peak`);
  const events = readOr(`${dir}/pids.events`);
  const refused = events === undefined ? undefined : /^max (\d+)$/m.exec(events)?.[1];
  return {
    dir,
    max: readOr(`${dir}/pids.max`) ?? "?",
    current: Number(current),
    peak: peak === undefined ? undefined : Number(peak),
    refused: refused === undefined ? undefined : Number(refused),
  };
}

function readOr(path: string): string | undefined {
  try {
    return Deno.readTextFileSync(path).trim();
  } catch {
    return undefined;
  }
}
