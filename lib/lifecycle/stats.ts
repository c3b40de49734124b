/**
 * What a sandbox costs while it runs: CPU time and share, memory, tasks,
 * disk, from the kernel's own counters (`cgroup.ts`) and the file system of
 * the sandbox's quota volume (`quota.ts`). Network bytes through the egress
 * proxy are the proxy's to count: `lib/sandbox/` adds them.
 *
 * Reading stats never trusts a sandbox-writable file: the cgroup is found
 * from `/proc/<pid>/cgroup` (the kernel's) of the pid Docker reports, and the
 * disk figures are `statvfs(3)` of the volume's mount point, a directory of
 * the host's state root, after checking that a file system is mounted there.
 * Nothing costs anything until asked: no sampling runs in the background.
 *
 * @module
 */
import type { DockerClient } from "../docker/client.ts";
import type { ContainerInspect } from "../docker/types.ts";
import { cString, libc } from "../libc.ts";
import { dirname } from "../path.ts";
import { type CgroupReading, findCgroup, readCgroup } from "./cgroup.ts";

/** One reading of a sandbox's costs. */
export interface SandboxStats {
  /** The container's id. */
  containerId: string;
  /** Docker's state of the container (`running`, `paused`, `exited`…), or `missing`. */
  state: string;
  /** When this reading was taken, ms since epoch (the host's clock). */
  time: number;
  /** Which cgroup version the counters came from; null when none were read. */
  cgroup: 1 | 2 | null;
  /** CPU time used since the container started, ns; its limit in CPUs; the share used. */
  cpu: {
    usageNs: number;
    /** The container's CPU limit (Docker's NanoCpus), in CPUs; the host's count when unlimited. */
    limitCpus: number;
    /**
     * CPU time used over the sampling window (or since `previous`) as a
     * fraction of the limit: 1 is the whole limit. Null without a window.
     */
    share: number | null;
  } | null;
  /** Memory charged to the sandbox now and at most, and its limit (null: none), in bytes. */
  memory: { currentBytes: number; peakBytes: number | null; limitBytes: number | null } | null;
  /** Tasks (processes and threads) now, and the limit (null: none). */
  pids: { current: number; limit: number | null } | null;
  /**
   * The quota volume: bytes used and the file system's size, and the
   * configured quota. Null when the volume is not a mounted file system
   * (no quota: nothing the host can measure without walking the sandbox's files).
   */
  disk: { usedBytes: number; totalBytes: number; quotaBytes: number | null } | null;
  /**
   * Bytes through the egress proxy (closed connections, since the proxy
   * started) and its allowed and denied connections; null when the sandbox
   * is not attached to egress or the proxy could not say.
   */
  network: NetworkStats | null;
  /** Why a part is null when it should not be, one line each. */
  problems: string[];
}

/** What the egress proxy counted for one identity. */
export interface NetworkStats {
  /** Bytes from the sandbox to its upstreams. */
  bytesUp: number;
  /** Bytes from the upstreams to the sandbox. */
  bytesDown: number;
  /** Connections allowed. */
  allowed: number;
  /** Connections denied. */
  denied: number;
}

/** Options of {@linkcode sandboxStats}. */
export interface SandboxStatsOptions {
  /** The quota volume's mount point (`<root>/volume`, `VolumeStatus.mountPoint`); no disk figures without it. */
  volume?: string;
  /** The configured quota in bytes, reported beside the file system's size. */
  quotaBytes?: number;
  /** A reading of the same container to compute the CPU share against. */
  previous?: SandboxStats;
  /** Without `previous`: read the CPU time twice this many ms apart for the share. */
  sampleMs?: number;
}

/**
 * Reads what a sandbox costs now (see the module doc for what is trusted).
 * A part that cannot be read is null, with a line in `problems`; a stopped
 * container has no CPU, memory or task figures.
 *
 * @param docker The Docker client (asked only when given an id).
 * @param container The container's id or name, or its inspect (null: no container).
 * @param options The volume, quota and CPU-share window.
 * @returns The reading.
 *
 * @example
 * ```ts ignore
 * const stats = await sandboxStats(docker, containerId, { volume: `${root}/volume`, sampleMs: 500 });
 * console.log(stats.memory?.currentBytes, stats.cpu?.share);
 * ```
 */
export async function sandboxStats(
  docker: DockerClient,
  container: string | ContainerInspect | null,
  options: SandboxStatsOptions = {},
): Promise<SandboxStats> {
  const inspect = typeof container === "string"
    ? await docker.inspectContainer(container)
    : container;
  const stats: SandboxStats = {
    containerId: inspect?.Id ?? "",
    state: inspect?.State.Status ?? "missing",
    time: Date.now(),
    cgroup: null,
    cpu: null,
    memory: null,
    pids: null,
    disk: null,
    network: null,
    problems: [],
  };
  if (options.volume !== undefined) readDisk(stats, options.volume, options.quotaBytes);
  if (inspect === null || !inspect.State.Running) return stats;
  let dirs: Record<string, string>;
  let first: CgroupReading;
  try {
    dirs = findCgroup(inspect.State.Pid, inspect.Id);
    first = readCgroup(dirs);
  } catch (error) {
    stats.problems.push((error as Error).message);
    return stats;
  }
  const limitCpus = inspect.HostConfig.NanoCpus > 0
    ? inspect.HostConfig.NanoCpus / 1e9
    : navigator.hardwareConcurrency;
  let reading = first;
  let since = options.previous?.cpu === null || options.previous?.containerId !== inspect.Id
    ? undefined
    : { time: options.previous.time, ns: options.previous.cpu.usageNs };
  if (since === undefined && options.sampleMs !== undefined && options.sampleMs > 0) {
    since = { time: stats.time, ns: first.cpuNs ?? 0 };
    await new Promise((resolve) => setTimeout(resolve, options.sampleMs));
    stats.time = Date.now();
    try {
      reading = readCgroup(dirs);
    } catch (error) {
      stats.problems.push((error as Error).message);
    }
  }
  fillCgroup(stats, reading, { limitCpus, since });
  return stats;
}

function fillCgroup(
  stats: SandboxStats,
  reading: CgroupReading,
  options: { limitCpus: number; since: { time: number; ns: number } | undefined },
): void {
  stats.cgroup = reading.version;
  if (reading.cpuNs !== null) {
    const { since, limitCpus } = options;
    const wallNs = since === undefined ? 0 : (stats.time - since.time) * 1e6;
    stats.cpu = {
      usageNs: reading.cpuNs,
      limitCpus,
      share: since === undefined || wallNs <= 0
        ? null
        : Math.max(0, reading.cpuNs - since.ns) / wallNs / limitCpus,
    };
  } else stats.problems.push("The kernel keeps no CPU time for this cgroup");
  if (reading.memoryBytes !== null) {
    stats.memory = {
      currentBytes: reading.memoryBytes,
      peakBytes: reading.memoryPeakBytes,
      limitBytes: reading.memoryLimitBytes,
    };
  }
  if (reading.pids !== null) stats.pids = { current: reading.pids, limit: reading.pidsLimit };
}

/** `struct statvfs` (glibc, 64-bit Linux): f_frsize at 8, f_blocks at 16, f_bfree at 24. */
const STATVFS = { frsize: 8, blocks: 16, bfree: 24, bytes: 112 };

// statvfs of the volume's mount point, once lstat shows a directory (never a
// symlink) on another device than its parent: a mounted file system, not
// the host's own under it.
function readDisk(stats: SandboxStats, mountPoint: string, quotaBytes: number | undefined): void {
  try {
    const here = Deno.lstatSync(mountPoint);
    const parent = Deno.lstatSync(dirname(mountPoint));
    if (!here.isDirectory || here.dev === parent.dev) {
      stats.problems.push(`Volume '${mountPoint}' is not a mounted file system: no disk figures`);
      return;
    }
  } catch (error) {
    stats.problems.push(`Cannot look at volume '${mountPoint}': ${(error as Error).message}`);
    return;
  }
  const lib = libc();
  if (lib === undefined) {
    stats.problems.push("No disk figures: libc is not loaded (needs --allow-ffi)");
    return;
  }
  const buffer = new Uint8Array(STATVFS.bytes + 16);
  if (lib.statvfs(cString(mountPoint), buffer) !== 0) {
    stats.problems.push(`statvfs of '${mountPoint}' failed`);
    return;
  }
  const view = new DataView(buffer.buffer);
  const word = (at: number): number => Number(view.getBigUint64(at, true));
  const frsize = word(STATVFS.frsize);
  const blocks = word(STATVFS.blocks);
  const free = word(STATVFS.bfree);
  stats.disk = {
    usedBytes: (blocks - free) * frsize,
    totalBytes: blocks * frsize,
    quotaBytes: quotaBytes ?? null,
  };
}
