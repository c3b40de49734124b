/**
 * A container's cgroup counters as this host's kernel keeps them: CPU time,
 * memory (current, peak, limit) and tasks (current, limit), from cgroup v1
 * (one hierarchy per controller) or v2 (unified), cgroupfs or systemd driver.
 *
 * Only the kernel's word is read. The cgroup comes from
 * `/proc/<pid>/cgroup` of the container's init process as Docker reports it,
 * and must name the container's id (a pid reused by another process after
 * the container ended names another cgroup, and is refused); the directory
 * read is the container's own cgroup even when its init moved to a child.
 * The files are the host's cgroupfs, which no sandbox writes, each read up to
 * a small cap and checked to be a whole number. Nothing inside the sandbox,
 * nor any file it can write, is ever read.
 *
 * @module
 */
import { join } from "../path.ts";

/** The most bytes read of any one file here: cgroup and proc files are a few hundred. */
const MAX_FILE_BYTES = 64 * 1024;
/** This host's mountinfo grows with its containers' mounts (a few hundred bytes each). */
const MAX_MOUNTINFO_BYTES = 4 * 1024 * 1024;

/** At or above this, a v1 limit means "none" (the kernel's unlimited is 2^63 rounded down to a page). */
const V1_UNLIMITED = 2 ** 62;

/** What the kernel counts for one container's cgroup. */
export interface CgroupReading {
  /** Which cgroup version the counters came from. */
  version: 1 | 2;
  /** CPU time used by every task of the cgroup since it was made, in ns. */
  cpuNs: number | null;
  /** Memory charged to the cgroup now, in bytes (v1: includes page cache). */
  memoryBytes: number | null;
  /** The most memory ever charged, in bytes; null when the kernel keeps no peak. */
  memoryPeakBytes: number | null;
  /** The memory limit in bytes; null when unlimited. */
  memoryLimitBytes: number | null;
  /** Tasks (processes and threads) now. */
  pids: number | null;
  /** The task limit; null when unlimited. */
  pidsLimit: number | null;
  /** The cgroup directories read, by controller. */
  dirs: Record<string, string>;
}

/** A cgroup file that could not be read as the kernel writes it. */
export class CgroupReadError extends Error {
  /**
   * @param message What went wrong, naming the file.
   * @param options `cause`.
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "CgroupReadError";
  }
}

/**
 * Reads a file of the kernel's (procfs, cgroupfs), at most
 * {@linkcode MAX_FILE_BYTES} of it (or `maxBytes`).
 *
 * @param path The file.
 * @param maxBytes The cap.
 * @returns Its text.
 * @throws {CgroupReadError} When it cannot be opened or is larger than the cap.
 */
export function readKernelFile(path: string, maxBytes: number = MAX_FILE_BYTES): string {
  let file: Deno.FsFile;
  try {
    file = Deno.openSync(path, { read: true });
  } catch (cause) {
    throw new CgroupReadError(`Cannot read '${path}': ${(cause as Error).message}`, { cause });
  }
  try {
    const buffer = new Uint8Array(maxBytes + 1);
    let total = 0;
    while (total < buffer.length) {
      const n = file.readSync(buffer.subarray(total));
      if (n === null || n === 0) break;
      total += n;
    }
    if (total > maxBytes) {
      throw new CgroupReadError(`File '${path}' is larger than ${maxBytes} bytes`);
    }
    return new TextDecoder().decode(buffer.subarray(0, total));
  } finally {
    file.close();
  }
}

// A whole number the kernel wrote: digits only, and a safe integer.
function count(text: string, path: string): number {
  const trimmed = text.trim();
  const value = Number(trimmed);
  if (!/^\d{1,16}$/.test(trimmed) || !Number.isSafeInteger(value)) {
    throw new CgroupReadError(`File '${path}' holds '${trimmed.slice(0, 40)}', not a count`);
  }
  return value;
}

// A limit: "max" (v2) or a v1 value near 2^63 mean none.
function limit(text: string, path: string): number | null {
  const trimmed = text.trim();
  if (trimmed === "max") return null;
  if (/^\d{17,20}$/.test(trimmed) && Number(trimmed) >= V1_UNLIMITED) return null;
  return count(trimmed, path);
}

// Reads one file of a cgroup directory as a count; null when the kernel has no such file.
function optional<T>(path: string, parse: (text: string, path: string) => T): T | null {
  let text: string;
  try {
    text = readKernelFile(path);
  } catch (error) {
    if (error instanceof CgroupReadError && error.cause instanceof Deno.errors.NotFound) {
      return null;
    }
    throw error;
  }
  return parse(text, path);
}

/** One line of `/proc/<pid>/cgroup`: a hierarchy's controllers and the path in it. */
interface Membership {
  controllers: string[];
  path: string;
}

/** One cgroup mount of this host: its controllers (empty for v2) and where. */
export interface CgroupMount {
  /** 1 for a v1 hierarchy, 2 for the unified one. */
  version: 1 | 2;
  /** A v1 hierarchy's mount options (its controllers among them). */
  controllers: string[];
  /** The cgroup the mount shows as its root (`/` outside a cgroup namespace). */
  root: string;
  /** Where it is mounted. */
  mountPoint: string;
}

function parseMemberships(text: string): Membership[] {
  const out: Membership[] = [];
  for (const line of text.split("\n")) {
    const match = /^(\d+):([^:]*):(\/.*)$/.exec(line);
    if (match === null) continue;
    const controllers = match[2]!.split(",").filter((name) => name !== "" && !name.includes("="));
    out.push({ controllers, path: match[3]! });
  }
  return out;
}

function parseCgroupMounts(mountinfo: string): CgroupMount[] {
  const mounts: CgroupMount[] = [];
  for (const line of mountinfo.split("\n")) {
    const fields = line.split(" ");
    const dash = fields.indexOf("-");
    if (dash < 0) continue;
    const type = fields[dash + 1];
    const root = fields[3];
    const mountPoint = fields[4];
    if (root === undefined || mountPoint === undefined) continue;
    if (type === "cgroup2") mounts.push({ version: 2, controllers: [], root, mountPoint });
    if (type === "cgroup") {
      const options = (fields[dash + 3] ?? "").split(",");
      mounts.push({ version: 1, controllers: options, root, mountPoint });
    }
  }
  return mounts;
}

let mountsCache: CgroupMount[] | undefined;

/** The cgroup mounts of this process's mount namespace (read once: they do not move). */
function cgroupMounts(): CgroupMount[] {
  return mountsCache ??= parseCgroupMounts(
    readKernelFile("/proc/self/mountinfo", MAX_MOUNTINFO_BYTES),
  );
}

/**
 * The container's own cgroup from a path of `/proc/<pid>/cgroup`: the path
 * cut after the component naming the container (a child cgroup its init
 * moved to counts within it).
 */
function containerPath(path: string, containerId: string): string | undefined {
  const parts = path.split("/");
  if (parts.some((part) => part === "..")) return undefined;
  const at = parts.findIndex((part) =>
    part === containerId || part === `docker-${containerId}.scope` ||
    part === `cri-containerd-${containerId}.scope` || part === `libpod-${containerId}.scope`
  );
  return at < 0 ? undefined : parts.slice(0, at + 1).join("/");
}

// The directory of a hierarchy's cgroup on this host; undefined when not mounted here.
function dirOf(mount: CgroupMount, path: string): string | undefined {
  if (mount.root === "/") return join(mount.mountPoint, path);
  if (path !== mount.root && !path.startsWith(`${mount.root}/`)) return undefined;
  return join(mount.mountPoint, path.slice(mount.root.length));
}

/**
 * Finds where a container's counters are on this host: per controller
 * (`cpuacct`, `memory`, `pids` on v1; `unified` on v2).
 *
 * @param pid The container's init pid, as Docker reports it (the host's pid).
 * @param containerId The container's full id, which the cgroup must name.
 * @returns The directories by controller.
 * @throws {CgroupReadError} When the process is gone or its cgroup does not name the container.
 */
export function findCgroup(pid: number, containerId: string): Record<string, string> {
  if (!Number.isSafeInteger(pid) || pid <= 0) {
    throw new CgroupReadError(`Container '${containerId}' has no process (pid '${pid}')`);
  }
  if (!/^[0-9a-f]{64}$/.test(containerId)) {
    throw new CgroupReadError(`Invalid container id '${containerId}'`);
  }
  const membership = readKernelFile(`/proc/${pid}/cgroup`);
  const dirs = cgroupDirs({ membership, mounts: cgroupMounts(), containerId });
  if (dirs === undefined) {
    throw new CgroupReadError(
      `Process ${pid} is in no cgroup of container '${containerId.slice(0, 12)}' on this host`,
    );
  }
  return dirs;
}

/**
 * Where a container's counters are, from a process's `/proc/<pid>/cgroup`
 * and this host's `mountinfo`: v1's controllers when the host has them,
 * else v2's unified hierarchy; each cut after the component naming the
 * container.
 *
 * @param options The process's cgroup file, the host's mounts (a `mountinfo`
 * text or parsed), and the container's id.
 * @returns The directories by controller; undefined when none names the container.
 */
export function cgroupDirs(
  options: { membership: string; mounts: string | CgroupMount[]; containerId: string },
): Record<string, string> | undefined {
  const { containerId } = options;
  const memberships = parseMemberships(options.membership);
  const mounts = typeof options.mounts === "string"
    ? parseCgroupMounts(options.mounts)
    : options.mounts;
  const dirs: Record<string, string> = {};
  for (const wanted of ["cpuacct", "memory", "pids"]) {
    const member = memberships.find((m) => m.controllers.includes(wanted));
    const mount = mounts.find((m) => m.version === 1 && m.controllers.includes(wanted));
    const path = member === undefined ? undefined : containerPath(member.path, containerId);
    const dir = mount === undefined || path === undefined ? undefined : dirOf(mount, path);
    if (dir !== undefined) dirs[wanted] = dir;
  }
  if (Object.keys(dirs).length > 0) return dirs;
  const unified = memberships.find((m) => m.controllers.length === 0);
  const mount = mounts.find((m) => m.version === 2);
  const path = unified === undefined ? undefined : containerPath(unified.path, containerId);
  const dir = mount === undefined || path === undefined ? undefined : dirOf(mount, path);
  return dir === undefined ? undefined : { unified: dir };
}

/**
 * Reads a container's counters from the directories {@linkcode findCgroup} found.
 *
 * @param dirs The directories by controller.
 * @returns The counters; a counter whose file the kernel lacks is null.
 * @throws {CgroupReadError} When a file is too large or holds no number.
 *
 * @example
 * ```ts ignore
 * const reading = readCgroup(findCgroup(inspect.State.Pid, inspect.Id));
 * console.log(reading.memoryBytes);
 * ```
 */
export function readCgroup(dirs: Record<string, string>): CgroupReading {
  const unified = dirs.unified;
  if (unified !== undefined) {
    const usec = optional(join(unified, "cpu.stat"), (text, path) => {
      const line = /^usage_usec (\S+)$/m.exec(text);
      return line === null ? null : count(line[1]!, path);
    });
    return {
      version: 2,
      cpuNs: usec === null ? null : usec * 1000,
      memoryBytes: optional(join(unified, "memory.current"), count),
      memoryPeakBytes: optional(join(unified, "memory.peak"), count),
      memoryLimitBytes: optional(join(unified, "memory.max"), limit),
      pids: optional(join(unified, "pids.current"), count),
      pidsLimit: optional(join(unified, "pids.max"), limit),
      dirs,
    };
  }
  const at = (controller: string, file: string): string | undefined =>
    dirs[controller] === undefined ? undefined : join(dirs[controller]!, file);
  const read = <T>(path: string | undefined, parse: (t: string, p: string) => T): T | null =>
    path === undefined ? null : optional(path, parse);
  return {
    version: 1,
    cpuNs: read(at("cpuacct", "cpuacct.usage"), count),
    memoryBytes: read(at("memory", "memory.usage_in_bytes"), count),
    memoryPeakBytes: read(at("memory", "memory.max_usage_in_bytes"), count),
    memoryLimitBytes: read(at("memory", "memory.limit_in_bytes"), limit),
    pids: read(at("pids", "pids.current"), count),
    pidsLimit: read(at("pids", "pids.max"), limit),
    dirs,
  };
}
