/**
 * What a Docker daemon says about itself, in one place: the `docker daemon`
 * row of `waffle doctor` and the evidence header of `waffle doctor --deep`
 * both show these facts, described the same way.
 *
 * @module
 */
import type { DockerClient } from "./client.ts";

/** The daemon facts that decide how the queue's files behave on it. */
export interface DaemonFacts {
  /** Where the client connects (socket path or `tcp://host:port`). */
  endpoint: string;
  /** Engine version, e.g. `20.10.24+dfsg1`. */
  server: string;
  /** Highest API version the daemon speaks. */
  api: string;
  /** The daemon's OS as it names it (`Docker Desktop`, a Linux distribution). */
  operatingSystem: string;
  /** `linux` or `windows`. */
  osType: string;
  /** Kernel-style architecture, e.g. `x86_64`. */
  architecture: string;
  /** The kernel the containers run on. */
  kernel: string;
  /** Storage driver, e.g. `overlay2`. */
  storageDriver: string;
  /** `cgroupfs`, `systemd` or `none`. */
  cgroupDriver: string;
  /** `1` or `2`; `?` when the daemon does not say. */
  cgroupVersion: string;
  /** True when the daemon is Docker Desktop's (its files cross a VM boundary). */
  desktop: boolean;
  /** True when the daemon runs rootless (`name=rootless` among its security options). */
  rootless: boolean;
}

/**
 * Asks a daemon for its version and info.
 *
 * @param docker The client.
 * @returns The facts.
 * @throws {DockerError} When the daemon does not answer.
 *
 * @example
 * ```ts ignore
 * const facts = await daemonFacts(new DockerClient());
 * console.log(describeDaemon(facts));
 * ```
 */
export async function daemonFacts(docker: DockerClient): Promise<DaemonFacts> {
  const [version, info] = await Promise.all([docker.version(), docker.info()]);
  return {
    endpoint: docker.location,
    server: version.Version,
    api: version.ApiVersion,
    operatingSystem: info.OperatingSystem,
    osType: info.OSType || version.Os,
    architecture: info.Architecture,
    kernel: version.KernelVersion,
    storageDriver: info.Driver,
    cgroupDriver: info.CgroupDriver,
    cgroupVersion: info.CgroupVersion || "?",
    desktop: /docker desktop/i.test(info.OperatingSystem),
    rootless: info.SecurityOptions.some((option) => option.includes("name=rootless")),
  };
}

/**
 * One line: version, API, architecture and drivers.
 *
 * @param facts What {@linkcode daemonFacts} found.
 * @returns E.g. `server 20.10.24 (API 1.41), x86_64, overlay2, cgroup cgroupfs v1`.
 *
 * @example
 * ```ts ignore
 * describeDaemon(await daemonFacts(docker)); // "server 20.10.24 (API 1.41), x86_64, overlay2, cgroup cgroupfs v1"
 * ```
 */
export function describeDaemon(facts: DaemonFacts): string {
  return `server ${facts.server} (API ${facts.api}), ${facts.architecture}, ${facts.storageDriver}, ` +
    `cgroup ${facts.cgroupDriver} v${facts.cgroupVersion}${facts.rootless ? ", rootless" : ""}`;
}
