/**
 * What this process holds in the kernel, read from `/proc/self`: descriptors,
 * inotify instances and their watches. Shared by the watch tests and the
 * attack bench, which show these stay bounded under a runner's attacks.
 *
 * @module
 */
/** Descriptors and inotify watches this process holds. */
export interface KernelUse {
  /** Every open descriptor. */
  fds: number;
  /**
   * Descriptors other than pipes, sockets and pidfds: those are the test's
   * own `docker` CLI children (a pidfd and three pipes each) and Docker API
   * connections.
   */
  own: number;
  /** inotify instances. */
  inotifyFds: number;
  /** inotify watches, over all instances. */
  watches: number;
}

/**
 * Counts what this process holds now.
 *
 * @returns Descriptors, inotify instances and watches.
 */
export function kernelUse(): KernelUse {
  const use: KernelUse = { fds: 0, own: 0, inotifyFds: 0, watches: 0 };
  // Listed first, so the listing's own descriptor is closed before the count.
  for (const entry of [...Deno.readDirSync("/proc/self/fd")]) {
    let target: string;
    try {
      target = Deno.readLinkSync(`/proc/self/fd/${entry.name}`);
    } catch {
      continue; // the listing's descriptor
    }
    use.fds++;
    if (!/^(pipe|socket):|^anon_inode:\[pidfd\]$/.test(target)) use.own++;
    if (target !== "anon_inode:inotify") continue;
    use.inotifyFds++;
    try {
      const info = Deno.readTextFileSync(`/proc/self/fdinfo/${entry.name}`);
      use.watches += info.split("\n").filter((line) => line.startsWith("inotify wd:")).length;
    } catch {
      // Closed meanwhile (another thread's descriptor).
    }
  }
  return use;
}
