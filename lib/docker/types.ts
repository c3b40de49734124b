/**
 * The subset of Docker Engine API shapes waffle sends and reads. Responses
 * are validated with zod and stripped to these fields; `null` lists and maps
 * (Docker's way of saying "none") are normalised to `[]` and `{}`.
 *
 * Field names stay in Docker's PascalCase so they can be checked against the
 * Engine API reference and compared with what was sent in a create body.
 *
 * @module
 */
import * as z from "../schema.ts";

/** `GET /version`, reduced. */
export interface DockerVersion {
  /** Engine version, e.g. `20.10.24+dfsg1`. */
  Version: string;
  /** Highest API version the daemon speaks, e.g. `1.41`. */
  ApiVersion: string;
  /** Lowest API version the daemon accepts; empty when not reported. */
  MinAPIVersion: string;
  /** Go-style architecture, e.g. `amd64`. */
  Arch: string;
  /** Daemon OS, e.g. `linux`. */
  Os: string;
  /** Kernel version; empty when not reported. */
  KernelVersion: string;
}

/** `GET /info`, reduced. */
export interface DockerInfo {
  /** Engine version. */
  ServerVersion: string;
  /** Storage driver, e.g. `overlay2`. */
  Driver: string;
  /** `cgroupfs`, `systemd` or `none`. */
  CgroupDriver: string;
  /** `1` or `2`; empty when the daemon does not report it (API < 1.40). */
  CgroupVersion: string;
  /** Kernel-style architecture, e.g. `x86_64`. */
  Architecture: string;
  /** `linux` or `windows`. */
  OSType: string;
  /** The daemon's operating system as it names it, e.g. `Docker Desktop` or `Debian GNU/Linux 12 (bookworm)`; empty when not reported. */
  OperatingSystem: string;
  /** CPUs visible to the daemon. */
  NCPU: number;
  /** Memory visible to the daemon, in bytes. */
  MemTotal: number;
  /** Security options such as `name=seccomp,profile=default`. */
  SecurityOptions: string[];
}

/** What waffle needs to know about an image. */
export interface ImageSummary {
  /** Content-addressed image id, `sha256:...`. */
  id: string;
  /** Image labels (`Config.Labels`); `{}` when it has none. */
  labels: Record<string, string>;
  /** The image's own `Config.Env` entries (`NAME=value`); `[]` when it has none. */
  env: string[];
  /** The image's `Config.WorkingDir`; empty when it sets none. */
  workingDir: string;
  /** Paths the image declares as `VOLUME`s (`Config.Volumes`), sorted. */
  volumes: string[];
}

/** A mount in a create body or `HostConfig.Mounts`. */
export interface HostConfigMount {
  /** Mount type. */
  Type: "bind" | "volume" | "tmpfs" | "npipe" | "cluster";
  /** Host path (bind) or volume name. */
  Source?: string;
  /** Path inside the container. */
  Target: string;
  /** Mount read-only. */
  ReadOnly?: boolean;
  /** Bind-specific options. */
  BindOptions?: { Propagation?: string; NonRecursive?: boolean };
  /** Volume-specific options: `NoCopy` keeps the image's files at the target out of a new volume. */
  VolumeOptions?: { NoCopy?: boolean };
  /** tmpfs-specific options. */
  TmpfsOptions?: { SizeBytes?: number; Mode?: number };
}

/** `HostConfig` of a create body: the fields waffle sets, plus anything else the API accepts. */
export interface ContainerCreateHostConfig {
  /** `host:container[:options]` bind specs. */
  Binds?: string[];
  /** Structured mounts. */
  Mounts?: HostConfigMount[];
  /** tmpfs mounts: path → mount options. */
  Tmpfs?: Record<string, string>;
  /** Mount the root filesystem read-only. */
  ReadonlyRootfs?: boolean;
  /** Capabilities to drop, e.g. `["ALL"]`. */
  CapDrop?: string[];
  /** Capabilities to add. */
  CapAdd?: string[];
  /** e.g. `["no-new-privileges"]`. */
  SecurityOpt?: string[];
  /** `none`, `bridge`, `host`, ... */
  NetworkMode?: string;
  /** Max processes in the container's pids cgroup. */
  PidsLimit?: number;
  /** Memory limit in bytes. */
  Memory?: number;
  /** Memory + swap limit in bytes; equal to Memory disables swap. */
  MemorySwap?: number;
  /** CPU quota in units of 1e-9 CPUs. */
  NanoCpus?: number;
  /** Run docker-init (tini) as PID 1. */
  Init?: boolean;
  /** Remove the container when it exits. */
  AutoRemove?: boolean;
  /** Restart policy. */
  RestartPolicy?: { Name: string; MaximumRetryCount?: number };
  /** /dev/shm size in bytes. */
  ShmSize?: number;
  /** Resource limits. */
  Ulimits?: { Name: string; Soft: number; Hard: number }[];
  /** Anything else from the Engine API. */
  [key: string]: unknown;
}

/** Body of `POST /containers/create`: the fields waffle sets, plus anything else the API accepts. */
export interface ContainerCreateBody {
  /** Image reference or id. */
  Image: string;
  /** Command (after the entrypoint). */
  Cmd?: string[];
  /** Entrypoint; `[]` or `null` clears the image's. */
  Entrypoint?: string[] | null;
  /** `NAME=value` entries. */
  Env?: string[];
  /** `uid:gid` or a user name. */
  User?: string;
  /** Working directory. */
  WorkingDir?: string;
  /** Container hostname. */
  Hostname?: string;
  /** Container labels. */
  Labels?: Record<string, string>;
  /** Signal `docker stop` sends first. */
  StopSignal?: string;
  /** Default seconds `docker stop` waits before SIGKILL. */
  StopTimeout?: number;
  /** Host configuration. */
  HostConfig?: ContainerCreateHostConfig;
  /** Anything else from the Engine API. */
  [key: string]: unknown;
}

/** `State` of a container inspect. */
export interface ContainerState {
  /** `created`, `running`, `paused`, `restarting`, `removing`, `exited` or `dead`. */
  Status: string;
  /** Running (also true while paused). */
  Running: boolean;
  /** Frozen by `pause`. */
  Paused: boolean;
  /** Being restarted by its restart policy. */
  Restarting: boolean;
  /** Partially removed, unusable. */
  Dead: boolean;
  /** Killed by the OOM killer. */
  OOMKilled: boolean;
  /** Host PID of the container's PID 1; 0 when not running. */
  Pid: number;
  /** Exit code of the last run. */
  ExitCode: number;
  /** Error starting the container; empty when none. */
  Error: string;
  /** RFC 3339 start time; `0001-01-01T00:00:00Z` when never started. */
  StartedAt: string;
  /** RFC 3339 finish time; `0001-01-01T00:00:00Z` when never finished. */
  FinishedAt: string;
}

/** `Config` of a container inspect. */
export interface ContainerConfig {
  /** Image reference as given at create time. */
  Image: string;
  /** Labels. */
  Labels: Record<string, string>;
  /** Hostname. */
  Hostname: string;
  /** User; empty means the image default. */
  User: string;
  /** Environment. */
  Env: string[];
  /** Command. */
  Cmd: string[];
  /** Entrypoint. */
  Entrypoint: string[];
  /** Working directory. */
  WorkingDir: string;
  /** Signal `docker stop` sends first; empty for the default. */
  StopSignal: string;
  /** Seconds `docker stop` waits; null for the default. */
  StopTimeout: number | null;
}

/** `HostConfig` of a container inspect, normalised. */
export interface ContainerHostConfig {
  /** Supplementary groups of the container's user. */
  GroupAdd: string[];
  /** Restart policy (`""` or `no` when none). */
  RestartPolicy: { Name: string };
  /** Pids limit; `null` (or 0/-1) means unlimited. */
  PidsLimit: number | null;
  /** Memory limit in bytes; 0 means unlimited. */
  Memory: number;
  /** Memory + swap limit in bytes. */
  MemorySwap: number;
  /** CPU quota in 1e-9 CPUs; 0 means unlimited. */
  NanoCpus: number;
  /** Read-only root filesystem. */
  ReadonlyRootfs: boolean;
  /** Dropped capabilities. */
  CapDrop: string[];
  /** Added capabilities. */
  CapAdd: string[];
  /** Security options. */
  SecurityOpt: string[];
  /** Network mode. */
  NetworkMode: string;
  /** tmpfs mounts: path → options. */
  Tmpfs: Record<string, string>;
  /** Bind specs. */
  Binds: string[];
  /** Structured mounts as requested. */
  Mounts: HostConfigMount[];
  /** docker-init as PID 1; `null` means the daemon default. */
  Init: boolean | null;
  /** Remove on exit. */
  AutoRemove: boolean;
  /** Privileged mode. */
  Privileged: boolean;
  /** Log driver and its options; `Type` is `""` when the daemon reported none. */
  LogConfig: { Type: string; Config: Record<string, string> };
}

/** One entry of a container inspect's top-level `Mounts` (what is actually mounted). */
export interface ContainerMountPoint {
  /** `bind`, `volume`, `tmpfs`, ... */
  Type: string;
  /** Host path or volume source. */
  Source: string;
  /** Path inside the container. */
  Destination: string;
  /** Writable. */
  RW: boolean;
}

/** `GET /containers/{id}/json`, reduced. */
export interface ContainerInspect {
  /** Full container id. */
  Id: string;
  /** Name with Docker's leading slash, e.g. `/waffle-abc`. */
  Name: string;
  /** Id of the image the container was created from. */
  Image: string;
  /** RFC 3339 creation time. */
  Created: string;
  /** Restarts done by the restart policy. */
  RestartCount: number;
  /** Runtime state. */
  State: ContainerState;
  /** Creation config. */
  Config: ContainerConfig;
  /** Host config. */
  HostConfig: ContainerHostConfig;
  /** Effective mounts. */
  Mounts: ContainerMountPoint[];
}

/** One entry of `GET /containers/json`. */
export interface ContainerSummary {
  /** Full container id. */
  Id: string;
  /** Names, each with a leading slash. */
  Names: string[];
  /** Image reference as given at create time. */
  Image: string;
  /** Image id. */
  ImageID: string;
  /** Labels. */
  Labels: Record<string, string>;
  /** `created`, `running`, `paused`, `restarting`, `removing`, `exited` or `dead`. */
  State: string;
  /** Human-readable status, e.g. `Up 3 seconds`. */
  Status: string;
  /** Creation time, Unix seconds. */
  Created: number;
}

/** `GET /containers/{id}/top`. */
export interface ContainerTop {
  /** Column titles of `ps`. */
  Titles: string[];
  /** One row per process, aligned with {@linkcode ContainerTop.Titles}. */
  Processes: string[][];
}

/** A one-shot sample of `GET /containers/{id}/stats`, reduced. */
export interface ContainerStats {
  /** Memory usage in bytes (cgroup usage, includes page cache on cgroup v1). */
  memoryUsageBytes: number;
  /** Memory limit in bytes. */
  memoryLimitBytes: number;
  /** Current number of processes and threads. */
  pids: number;
  /** Total CPU time consumed, in nanoseconds. */
  cpuTotalNs: number;
}

/** A named volume (`GET /volumes/{name}`), reduced. */
export interface DockerVolume {
  /** The volume's name. */
  Name: string;
  /** Its driver, e.g. `local`. */
  Driver: string;
  /** Where its data lives on the daemon's host (not necessarily this machine). */
  Mountpoint: string;
  /** Labels; `{}` when it has none. */
  Labels: Record<string, string>;
}

/** The outcome of {@linkcode DockerClient.exec}. */
export interface ExecResult {
  /** Exit code of the command. */
  exitCode: number;
  /** Everything the command wrote to stdout. */
  stdout: Uint8Array;
  /** Everything the command wrote to stderr. */
  stderr: Uint8Array;
}

const strings = z.pipe(z.nullish(z.array(z.string())), z.transform((v): string[] => v ?? []));
const labels = z.pipe(
  z.nullish(z.record(z.string(), z.string())),
  z.transform((v): Record<string, string> => v ?? {}),
);
const text = z.pipe(z.nullish(z.string()), z.transform((v): string => v ?? ""));
const count = z.pipe(z.nullish(z.number()), z.transform((v): number => v ?? 0));
const flag = z.pipe(z.nullish(z.boolean()), z.transform((v): boolean => v ?? false));
const numberOrNull = z.pipe(z.nullish(z.number()), z.transform((v): number | null => v ?? null));

/** @internal */
export const versionSchema: z.ZodMiniType<DockerVersion> = z.object({
  Version: z.string(),
  ApiVersion: z.string(),
  MinAPIVersion: text,
  Arch: z.string(),
  Os: z.string(),
  KernelVersion: text,
});

/** @internal */
export const infoSchema: z.ZodMiniType<DockerInfo> = z.object({
  ServerVersion: z.string(),
  Driver: z.string(),
  CgroupDriver: text,
  CgroupVersion: text,
  Architecture: z.string(),
  OSType: text,
  OperatingSystem: text,
  NCPU: count,
  MemTotal: count,
  SecurityOptions: strings,
});

/** @internal */
export const imageInspectSchema: z.ZodMiniType<ImageSummary> = z.pipe(
  z.object({
    Id: z.string(),
    Config: z.nullish(z.object({
      Labels: labels,
      Env: strings,
      WorkingDir: z.nullish(z.string()),
      Volumes: z.nullish(z.record(z.string(), z.unknown())),
    })),
  }),
  z.transform((v): ImageSummary => ({
    id: v.Id,
    labels: v.Config?.Labels ?? {},
    env: v.Config?.Env ?? [],
    workingDir: v.Config?.WorkingDir ?? "",
    volumes: Object.keys(v.Config?.Volumes ?? {}).sort(),
  })),
);

/** @internal */
export const createResponseSchema: z.ZodMiniType<{ Id: string; Warnings: string[] }> = z.object({
  Id: z.string(),
  Warnings: strings,
});

const mountSchema = z.object({
  Type: z.enum(["bind", "volume", "tmpfs", "npipe", "cluster"]),
  Source: z.exactOptional(z.string()),
  Target: z.string(),
  ReadOnly: z.exactOptional(z.boolean()),
  BindOptions: z.exactOptional(z.object({
    Propagation: z.exactOptional(z.string()),
    NonRecursive: z.exactOptional(z.boolean()),
  })),
  TmpfsOptions: z.exactOptional(z.object({
    SizeBytes: z.exactOptional(z.number()),
    Mode: z.exactOptional(z.number()),
  })),
});

/** @internal */
export const containerInspectSchema: z.ZodMiniType<ContainerInspect> = z.object({
  Id: z.string(),
  Name: z.string(),
  Image: z.string(),
  Created: text,
  RestartCount: count,
  State: z.object({
    Status: z.string(),
    Running: z.boolean(),
    Paused: z.boolean(),
    Restarting: z.boolean(),
    Dead: z.boolean(),
    OOMKilled: flag,
    Pid: z.number(),
    ExitCode: z.number(),
    Error: text,
    StartedAt: text,
    FinishedAt: text,
  }),
  Config: z.object({
    Image: text,
    Labels: labels,
    Hostname: text,
    User: text,
    Env: strings,
    Cmd: strings,
    Entrypoint: strings,
    WorkingDir: text,
    StopSignal: text,
    StopTimeout: numberOrNull,
  }),
  HostConfig: z.object({
    GroupAdd: strings,
    RestartPolicy: z.pipe(
      z.nullish(z.object({ Name: text })),
      z.transform((v): { Name: string } => ({ Name: v?.Name ?? "" })),
    ),
    PidsLimit: numberOrNull,
    Memory: count,
    MemorySwap: count,
    NanoCpus: count,
    ReadonlyRootfs: flag,
    CapDrop: strings,
    CapAdd: strings,
    SecurityOpt: strings,
    NetworkMode: text,
    Tmpfs: labels,
    Binds: strings,
    Mounts: z.pipe(
      z.nullish(z.array(mountSchema)),
      z.transform((v): HostConfigMount[] => v ?? []),
    ),
    Init: z.pipe(z.nullish(z.boolean()), z.transform((v): boolean | null => v ?? null)),
    AutoRemove: flag,
    Privileged: flag,
    LogConfig: z.pipe(
      z.nullish(z.object({ Type: text, Config: labels })),
      z.transform((v): { Type: string; Config: Record<string, string> } => ({
        Type: v?.Type ?? "",
        Config: v?.Config ?? {},
      })),
    ),
  }),
  Mounts: z.pipe(
    z.nullish(z.array(z.object({
      Type: text,
      Source: text,
      Destination: z.string(),
      RW: flag,
    }))),
    z.transform((v): ContainerMountPoint[] => v ?? []),
  ),
});

/** @internal */
export const containerListSchema: z.ZodMiniType<ContainerSummary[]> = z.array(z.object({
  Id: z.string(),
  Names: strings,
  Image: text,
  ImageID: text,
  Labels: labels,
  State: text,
  Status: text,
  Created: count,
}));

/** @internal */
export const waitResponseSchema: z.ZodMiniType<
  { StatusCode: number; Error: { Message: string } | null }
> = z.object({
  StatusCode: z.number(),
  Error: z.pipe(
    z.nullish(z.object({ Message: text })),
    z.transform((v): { Message: string } | null => v ?? null),
  ),
});

/** @internal */
export const execCreateSchema: z.ZodMiniType<{ Id: string }> = z.object({ Id: z.string() });

/** @internal */
export const execInspectSchema: z.ZodMiniType<{ Running: boolean; ExitCode: number | null }> = z
  .object({
    Running: z.boolean(),
    ExitCode: numberOrNull,
  });

/** @internal */
export const topSchema: z.ZodMiniType<ContainerTop> = z.object({
  Titles: strings,
  Processes: z.pipe(
    z.nullish(z.array(z.array(z.string()))),
    z.transform((v): string[][] => v ?? []),
  ),
});

/** @internal */
export const statsSchema: z.ZodMiniType<ContainerStats> = z.pipe(
  z.object({
    memory_stats: z.nullish(z.object({ usage: count, limit: count })),
    pids_stats: z.nullish(z.object({ current: count })),
    cpu_stats: z.nullish(z.object({ cpu_usage: z.nullish(z.object({ total_usage: count })) })),
  }),
  z.transform((v): ContainerStats => ({
    memoryUsageBytes: v.memory_stats?.usage ?? 0,
    memoryLimitBytes: v.memory_stats?.limit ?? 0,
    pids: v.pids_stats?.current ?? 0,
    cpuTotalNs: v.cpu_stats?.cpu_usage?.total_usage ?? 0,
  })),
);

/** @internal */
export const volumeSchema: z.ZodMiniType<DockerVolume> = z.object({
  Name: z.string(),
  Driver: text,
  Mountpoint: text,
  Labels: labels,
});

/** @internal */
export const volumeListSchema: z.ZodMiniType<DockerVolume[]> = z.pipe(
  z.object({ Volumes: z.nullish(z.array(volumeSchema)) }),
  z.transform((v): DockerVolume[] => v.Volumes ?? []),
);
