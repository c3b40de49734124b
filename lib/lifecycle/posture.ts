/**
 * The one place that builds a sandbox container's create body and the
 * posture hash: a digest of every security-relevant launch setting. A
 * container whose `waffle.posture` label differs from today's hash is
 * recycled on its next use, so a tightened setting can never be silently
 * skipped by adopting an old container.
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { normalize } from "../path.ts";
import { UncoverableVolumeError, UsageError } from "../errors.ts";
import { escapeControls } from "../terminal/control_text.ts";
import type { SandboxConfig } from "../config/config.ts";
import {
  ARTEFACT_FLAGS,
  artefactCommand,
  artefactDigest,
  RUNNER_V8_FLAGS,
  runnerCacheOf,
  runtimeKitOf,
  selfCommand,
} from "../config/self.ts";
import type {
  ContainerCreateBody,
  ContainerInspect,
  HostConfigMount,
  ImageSummary,
} from "../docker/mod.ts";
import type { StatePaths } from "./identity.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";
import { type ContainerEgress, recordedLaunch } from "./egress_record.ts";
import {
  IMAGE_ENV_VARIABLE,
  IMAGE_WORKDIR_VARIABLE,
  METADATA_READER,
  PROGRAM_DIR,
  PROXY_EGRESS_DIR,
  SANDBOX_ARTEFACT_DIR,
  SANDBOX_CHANNEL_DIR,
  SANDBOX_RUNNER_CACHE,
  SANDBOX_RUNTIME,
} from "../config/sandbox_paths.ts";
import { ARTEFACT_ENTRY } from "../config/artefact_dir.ts";

/** Uid and gid every command runs as (the image's `waffle` user). */
export const SANDBOX_UID = 10001;

/**
 * What the runner may do beyond an unprivileged process: switch a command to
 * {@linkcode SANDBOX_UID} (SETUID, SETGID) and signal its tree (KILL). The
 * runner runs as the container's uid 0 with only these; a command loses them
 * all when it drops to its own uid, and `no-new-privileges` keeps it so.
 * Never DAC_READ_SEARCH: with it Docker's seccomp profile allows
 * `open_by_handle_at`, which walks out of any bind mount to the whole host
 * filesystem.
 */
export const RUNNER_CAPS = ["SETUID", "SETGID", "KILL"] as const;

/** The Deno executable inside the container (it runs the runner, npm MCP servers and cp). */
const SANDBOX_DENO = `${PROGRAM_DIR}/deno`;
/**
 * The variables a command running {@linkcode SANDBOX_DENO_ARGV} needs: a Deno
 * cache it can write (on the sandbox's /tmp) and quiet output.
 */
export const SANDBOX_DENO_ENV: Readonly<Record<string, string>> = {
  DENO_DIR: "/tmp/.waffle-deno",
  DENO_NO_UPDATE_CHECK: "1",
  NO_COLOR: "1",
};

/**
 * How anything in a sandbox starts waffle's Deno: through the runtime kit's
 * own loader and libraries (`image/runtime_kit.sh`), so that the image's
 * libc, or its lack of one, never matters.
 */
export const SANDBOX_DENO_ARGV: readonly string[] = [
  `${SANDBOX_RUNTIME}/ld.so`,
  "--library-path",
  SANDBOX_RUNTIME,
  SANDBOX_DENO,
];
/** The runner cache's mount point (read-only), the runner's `DENO_DIR` when there is one. */
export const RUNNER_CACHE = SANDBOX_RUNNER_CACHE;
/** The host's npm package cache for MCP servers, read-only inside (`DENO_DIR` of a server). */
export const SANDBOX_MCP_CACHE = `${PROGRAM_DIR}/mcp-cache`;
/** A restricted session's home: a tmpfs owned by the commands' uid. */
export const RESTRICTED_HOME = "/home/sandbox";
/** How long a restricted container's runner outlives its session's host. */
const RESTRICTED_IDLE_SECONDS = 60;
/** The runner's private scratch (Deno's cache): a tmpfs no command can enter. */
export const RUNNER_DIR = "/run/waffle";
/**
 * How a sandbox starts the bundled artefact, up to its subcommand: the
 * artefact mounted (or copied, on Kubernetes) at `SANDBOX_ARTEFACT_DIR`, run
 * by {@linkcode SANDBOX_DENO_ARGV} with the runner's own flags.
 */
export const SANDBOX_ARTEFACT_ARGV: readonly string[] = [
  ...SANDBOX_DENO_ARGV,
  ...ARTEFACT_FLAGS,
  RUNNER_V8_FLAGS,
  `${SANDBOX_ARTEFACT_DIR}/${ARTEFACT_ENTRY}`,
];

/** Labels waffle puts on its containers. */
export const LABELS = {
  key: "waffle.key",
  /** On a restricted session's container instead of `key`: fleet commands leave it alone. */
  restricted: "waffle.restricted",
  tenant: "waffle.tenant",
  user: "waffle.user",
  image: "waffle.image",
  posture: "waffle.posture",
  created: "waffle.created",
  state: "waffle.state",
  /** On a warm pool's member: the template it was made for (see `pool.ts`). */
  pool: "waffle.pool",
} as const;

/** A container to create, with its identity labels. */
export interface ContainerSpec {
  /** The sandbox's deterministic container name. */
  name: string;
  /** The Docker create body: image, command, labels and posture. */
  body: ContainerCreateBody;
  /**
   * SHA-256 of the whole create body except the image (compared by id on its
   * own) and the labels that cannot be part of it (the hash itself and the
   * creation time): every setting, present or future, is covered without a
   * list to keep in step.
   */
  postureHash: string;
}

/**
 * Builds the create body for a sandbox.
 *
 * @param key Whose sandbox.
 * @param options Config, resolved image id and state paths.
 * @returns The name, create body and posture hash.
 * @throws {UsageError} When a mount path is unsafe.
 * @throws {UncoverableVolumeError} When the image has a VOLUME no capped tmpfs can cover.
 */
export function containerSpec(
  key: SandboxKey,
  options: {
    config: SandboxConfig;
    image: ImageFacts;
    paths: StatePaths;
    restricted?: { id: string } | undefined;
    /**
     * A restricted session's own egress, or the egress to judge a spec with;
     * when absent, a sandbox's is what its last open recorded.
     */
    egress?: ContainerEgress | undefined;
  },
): ContainerSpec {
  const { image, paths, restricted } = options;
  // A restricted session's own, or one asked about (a user a pool member
  // may be taken for); else what the sandbox's last open recorded.
  const egress = "egress" in options ? options.egress : recordedLaunch(paths.root);
  const imageId = image.id;
  // A restricted session's container: no network, the workspace read-only,
  // a tmpfs home, removed when its runner exits.
  // The commands' env allowlist is not the session's: none of it goes in.
  const config = restricted === undefined ? options.config : {
    ...options.config,
    network: "none" as const,
    idleSeconds: RESTRICTED_IDLE_SECONDS,
    envAllowlist: [],
  };
  const { cmd, mounts, launchIdentity, denoDir } = runnerLaunch(config, paths, {
    readOnlyWorkspace: restricted !== undefined,
  });
  const groups = hostCanChown() ? [] : [String(Deno.gid())];
  const ownTmpfs = sandboxTmpfs(config, { restricted: restricted !== undefined });
  const allMounts = [...mounts, ...(egress?.mounts ?? [])];
  const body: ContainerCreateBody = {
    Image: imageId,
    // Whatever the image's own entrypoint, the container runs the runner.
    Entrypoint: cmd.slice(0, 1),
    Cmd: cmd.slice(1),
    Env: runnerEnv(config, {
      launchIdentity: [...launchIdentity, ...(egress?.env ?? [])],
      denoDir: denoDir ?? `${RUNNER_DIR}/deno`,
      image,
    }),
    // The runner is the container's root with RUNNER_CAPS only; commands
    // run as SANDBOX_UID (see RUNNER_CAPS).
    User: "0:0",
    WorkingDir: "/workspace",
    Hostname: key.containerName.slice(0, 63),
    StopSignal: "SIGTERM",
    StopTimeout: 10,
    // An image's HEALTHCHECK would run its command in here, outside any request.
    Healthcheck: { Test: ["NONE"] },
    Labels: {
      [restricted === undefined ? LABELS.key : LABELS.restricted]: key.hash,
      [LABELS.tenant]: key.tenant,
      [LABELS.user]: key.user,
      [LABELS.image]: imageId,
      [LABELS.state]: paths.root,
      ...(key.pool === undefined ? {} : { [LABELS.pool]: key.pool }),
    },
    HostConfig: {
      Init: true,
      ReadonlyRootfs: true,
      Tmpfs: {
        ...ownTmpfs,
        ...imageVolumeMasks(image, {
          sizeBytes: config.tmpBytes,
          mounted: [...Object.keys(ownTmpfs), ...allMounts.map((mount) => mount.Target)],
        }),
      },
      CapDrop: ["ALL"],
      CapAdd: [...RUNNER_CAPS],
      GroupAdd: groups,
      SecurityOpt: ["no-new-privileges"],
      PidsLimit: config.pidsLimit,
      Memory: config.memoryBytes,
      MemorySwap: config.memoryBytes,
      NanoCpus: Math.round(config.cpus * 1e9),
      NetworkMode: config.network,
      LogConfig: { Type: "json-file", Config: { "max-size": "1m", "max-file": "2" } },
      // The egress socket (and CA bundle) when attached; the network stays "none".
      Mounts: allMounts,
      RestartPolicy: { Name: "no" },
      AutoRemove: restricted !== undefined,
      Privileged: false,
    },
  };
  const postureHash = postureHashOf(body, paths);
  body.Labels = {
    ...body.Labels,
    [LABELS.posture]: postureHash,
    [LABELS.created]: new Date().toISOString(),
  };
  const name = restricted === undefined
    ? key.containerName
    : `${key.containerName}-r-${restricted.id}`;
  return { name, postureHash, body };
}

/**
 * The posture hash of a create body: SHA-256 of the body without what names
 * the sandbox (its labels, its hostname, where its own state and channel
 * directory lie on the host) and without the image, which is compared by id
 * on its own. Two sandboxes of one config have one posture whoever they
 * belong to, so a warm pool's member fits a user exactly when its posture is
 * the one a cold sandbox of that user would get (`pool.ts`).
 *
 * @param body The create body.
 * @param paths The sandbox's state root and channel directory (they exist).
 * @returns The hex hash.
 */
export function postureHashOf(
  body: ContainerCreateBody,
  paths: Pick<StatePaths, "root" | "channel">,
): string {
  return sha256Hex(JSON.stringify(identityFree(body, paths)));
}

function identityFree(
  body: ContainerCreateBody,
  paths: Pick<StatePaths, "root" | "channel">,
): unknown {
  const { Image: _image, Hostname: _hostname, Labels: _labels, ...posture } = body;
  const own: [string, string][] = [
    [realOrAsIs(paths.root), "<state>"],
    [realOrAsIs(paths.channel), "<channel>"],
  ];
  const relative = (source: string | undefined): string | undefined => {
    for (const [dir, name] of own) {
      if (source === dir) return name;
      if (source?.startsWith(`${dir}/`)) return `${name}${source.slice(dir.length)}`;
    }
    return source;
  };
  const mounts = posture.HostConfig?.Mounts?.map((mount) => ({
    ...mount,
    Source: relative(mount.Source),
  }));
  return { ...posture, HostConfig: { ...posture.HostConfig, Mounts: mounts } };
}

// A path by its real path, as the state's mounts are named; as it is while
// it does not exist yet (a channel directory made at the first open).
function realOrAsIs(path: string): string {
  try {
    return Deno.realPathSync(path);
  } catch {
    return path;
  }
}

// A sandbox's own tmpfs mounts: /tmp, the runner's scratch, and a
// restricted session's home.
function sandboxTmpfs(
  config: SandboxConfig,
  options: { restricted: boolean },
): Record<string, string> {
  return {
    "/tmp": `rw,noexec,nosuid,nodev,size=${config.tmpBytes}`,
    [RUNNER_DIR]: "rw,noexec,nosuid,nodev,size=128m,mode=0700",
    ...(options.restricted
      ? {
        [RESTRICTED_HOME]:
          `rw,noexec,nosuid,nodev,size=64m,uid=${SANDBOX_UID},gid=${SANDBOX_UID},mode=0700`,
      }
      : {}),
  };
}

/**
 * Where an inspected container differs from the spec it should have been
 * created from, in the settings that decide what the sandbox can do. Adoption
 * checks this as well as the posture label: a label can be copied, the
 * daemon's record of the container cannot.
 *
 * @param container The inspected container.
 * @param spec Today's spec.
 * @returns The first differing setting's name, or undefined when they agree.
 */
export function postureDrift(container: ContainerInspect, spec: ContainerSpec): string | undefined {
  const want = spec.body;
  const host = want.HostConfig ?? {};
  const have = container.HostConfig;
  const sorted = (values: readonly string[] | undefined): string =>
    JSON.stringify([...(values ?? [])].sort());
  const mounts = (list: readonly HostConfigMount[]): string =>
    JSON.stringify(
      list.map((m) => [m.Type, m.Source ?? "", m.Target, m.ReadOnly ?? false]).sort(),
    );
  const checks: [string, unknown, unknown][] = [
    ["User", container.Config.User, want.User],
    ["Entrypoint", JSON.stringify(container.Config.Entrypoint), JSON.stringify(want.Entrypoint)],
    ["Cmd", JSON.stringify(container.Config.Cmd), JSON.stringify(want.Cmd)],
    ["StopTimeout", container.Config.StopTimeout, want.StopTimeout],
    ["Privileged", have.Privileged, host.Privileged],
    ["ReadonlyRootfs", have.ReadonlyRootfs, host.ReadonlyRootfs],
    ["CapDrop", sorted(have.CapDrop), sorted(host.CapDrop)],
    ["CapAdd", sorted(have.CapAdd.map((cap) => cap.replace(/^CAP_/, ""))), sorted(host.CapAdd)],
    ["GroupAdd", sorted(have.GroupAdd), sorted(host.GroupAdd as string[] | undefined)],
    ["SecurityOpt", sorted(have.SecurityOpt), sorted(host.SecurityOpt)],
    ["NetworkMode", have.NetworkMode, host.NetworkMode],
    ["PidsLimit", have.PidsLimit, host.PidsLimit],
    ["Memory", have.Memory, host.Memory],
    ["MemorySwap", have.MemorySwap, host.MemorySwap],
    ["NanoCpus", have.NanoCpus, host.NanoCpus],
    ["Init", have.Init, host.Init],
    ["AutoRemove", have.AutoRemove, host.AutoRemove],
    ["RestartPolicy", have.RestartPolicy.Name || "no", host.RestartPolicy?.Name],
    [
      "Tmpfs",
      JSON.stringify(have.Tmpfs, Object.keys(have.Tmpfs).sort()),
      JSON.stringify(
        host.Tmpfs,
        Object.keys(host.Tmpfs ?? {}).sort(),
      ),
    ],
    ["Mounts", mounts(have.Mounts), mounts(host.Mounts ?? [])],
  ];
  return checks.find(([, got, expected]) => got !== expected)?.[0];
}

/**
 * What the sandbox takes from its image: the id, and the settings whose
 * semantics commands keep (`Env`, `WorkingDir`) or that must be covered
 * (`Volumes`). Part of the spec, so recorded with the image id (warm.ts).
 */
export type ImageFacts = Pick<ImageSummary, "id" | "env" | "workingDir" | "volumes">;

// Docker adds the image's Env to the container's: each of its names is set
// empty for the runner (an image's LD_PRELOAD, LD_AUDIT, DENO_* must not
// reach the container's root), and handed to commands instead.
function runnerEnv(
  config: SandboxConfig,
  options: { launchIdentity: string[]; denoDir: string; image: ImageFacts },
): string[] {
  const own = [
    ...options.launchIdentity,
    "PATH=/usr/local/bin:/usr/bin:/bin",
    `HOME=${RUNNER_DIR}`,
    `DENO_DIR=${options.denoDir}`,
    "DENO_NO_UPDATE_CHECK=1",
    "NO_COLOR=1",
    `WAFFLE_PASS_ENV=${config.envAllowlist.join(",")}`,
    `${IMAGE_ENV_VARIABLE}=${JSON.stringify(options.image.env)}`,
    `${IMAGE_WORKDIR_VARIABLE}=${options.image.workingDir}`,
    ...config.envAllowlist.flatMap((name) => {
      const value = Deno.env.get(name);
      return value === undefined ? [] : [`${name}=${value}`];
    }),
  ];
  return maskImageEnv(own, options.image);
}

/**
 * A container's environment for waffle's own program: `own`, then every
 * other variable of the image set empty (Docker adds the image's Env to the
 * container's; an image's LD_PRELOAD, LD_AUDIT or DENO_* must not reach it).
 *
 * @param own The program's own `NAME=value` entries.
 * @param image The image.
 * @returns The container's `Env`.
 */
export function maskImageEnv(own: string[], image: ImageFacts): string[] {
  const named = new Set(own.map((entry) => entry.slice(0, entry.indexOf("="))));
  const masked = image.env
    .map((entry) => entry.includes("=") ? entry.slice(0, entry.indexOf("=")) : entry)
    .filter((name) => name !== "" && !named.has(name) && !name.includes("\0"));
  // Deno refuses an empty DENO_V8_FLAGS: it gets the runner's own flag instead.
  const value = (name: string): string =>
    name === "DENO_V8_FLAGS" ? RUNNER_V8_FLAGS.slice("--v8-flags=".length) : "";
  return [...own, ...[...new Set(masked)].map((name) => `${name}=${value(name)}`)];
}

/**
 * Where waffle mounts one thing of its own, whole: an image VOLUME at one of
 * these is covered by that mount, or by a capped tmpfs in a container that
 * mounts nothing there (see {@linkcode uncoverableVolume}).
 */
const WAFFLE_MOUNTS: readonly string[] = [
  "/workspace",
  "/tmp",
  RUNNER_DIR,
  RESTRICTED_HOME,
  "/etc/ld.so.preload",
];

/** Directories that hold several of waffle's own mounts (the queue's, the program's, the proxy's). */
const WAFFLE_DIRS: readonly string[] = ["/queue", PROGRAM_DIR, PROXY_EGRESS_DIR];

// System directories a tmpfs must not hide: the image would not run.
const SYSTEM_DIRS: readonly string[] = [
  "/",
  "/etc",
  "/usr",
  "/bin",
  "/sbin",
  "/lib",
  "/lib32",
  "/lib64",
  "/dev",
  "/proc",
  "/sys",
];

// Whether `path` is strictly inside `dir`.
function isUnder(path: string, dir: string): boolean {
  return path !== dir && path.startsWith(dir === "/" ? "/" : `${dir}/`);
}

// A VOLUME path as Docker cleans it (`/opt/./waffle/` is `/opt/waffle`);
// undefined when it is not one a tmpfs can be named at.
function cleanVolume(path: string): string | undefined {
  if (!path.startsWith("/") || /[\0,]/.test(path)) return undefined;
  return normalize(path).replace(/\/+$/, "") || "/";
}

/**
 * Why an image VOLUME cannot be covered by a capped tmpfs in every container
 * waffle runs the image in, or undefined when it can. The one rule:
 *
 * - a system directory (`/`, `/etc`, `/usr`, …): a tmpfs there hides what the image needs to run;
 * - at, under or over a directory holding several of waffle's mounts
 *   (`/queue`, `/opt/waffle`, `/egress`): a tmpfs would stand between them
 *   and the image, a volume inside them would write into the host's files;
 * - under or over one of waffle's whole mounts (`/workspace`, `/tmp`,
 *   `/run/waffle`, `/home/sandbox`, `/etc/ld.so.preload`): under `/workspace`, Docker's volume
 *   would hide part of the workspace and escape its quota; over one, the
 *   mount would sit inside an uncapped volume. At one, it is covered;
 * - a path that is not absolute, or holds NUL or `,`: no tmpfs can be named there.
 *
 * Docker would make any of these an anonymous volume on the host's disk,
 * with no cap: an image that declares one is refused.
 *
 * @param path The VOLUME as the image declares it.
 * @returns The reason, e.g. `a system directory`, or undefined.
 *
 * @example
 * ```ts
 * uncoverableVolume("/etc"); // "a system directory"
 * uncoverableVolume("/workspace/x"); // "under waffle's own mount '/workspace'"
 * uncoverableVolume("/data"); // undefined
 * ```
 */
export function uncoverableVolume(path: string): string | undefined {
  const clean = cleanVolume(path);
  if (clean === undefined) return "not an absolute path a tmpfs can be mounted at";
  if (SYSTEM_DIRS.includes(clean)) return "a system directory";
  for (const dir of WAFFLE_DIRS) {
    if (clean === dir) return `waffle's own directory '${dir}'`;
    if (isUnder(clean, dir)) return `under waffle's own directory '${dir}'`;
    if (isUnder(dir, clean)) return `over waffle's own directory '${dir}'`;
  }
  for (const mount of WAFFLE_MOUNTS) {
    if (isUnder(clean, mount)) return `under waffle's own mount '${mount}'`;
    if (isUnder(mount, clean)) return `over waffle's own mount '${mount}'`;
  }
  return undefined;
}

/**
 * An image's first VOLUME that {@linkcode uncoverableVolume} names, with why.
 *
 * @param facts The image's VOLUMEs.
 * @returns The VOLUME as declared and the reason, or undefined when each can be covered.
 *
 * @example
 * ```ts
 * findUncoverableVolume({ volumes: ["/data", "/etc"] }); // { volume: "/etc", reason: "a system directory" }
 * ```
 */
export function findUncoverableVolume(
  facts: Pick<ImageFacts, "volumes">,
): { volume: string; reason: string } | undefined {
  for (const volume of facts.volumes) {
    const reason = uncoverableVolume(volume);
    if (reason !== undefined) return { volume, reason };
  }
  return undefined;
}

/**
 * Refuses an image with a VOLUME that {@linkcode uncoverableVolume} names:
 * every path that builds a container of the configured image calls this
 * (through {@linkcode imageVolumeMasks}, and `resolveImage` before anything
 * is made).
 *
 * @param image How the user names the image (its reference), or its id.
 * @param facts Its VOLUMEs.
 * @throws {UncoverableVolumeError} At the first VOLUME no capped tmpfs can cover.
 *
 * @example
 * ```ts
 * refuseUncoverableVolumes("python:3.12", { volumes: ["/data"] }); // fine
 * ```
 */
export function refuseUncoverableVolumes(
  image: string,
  facts: Pick<ImageFacts, "volumes">,
): void {
  const found = findUncoverableVolume(facts);
  if (found !== undefined) throw uncoverable(image, found);
}

function uncoverable(
  image: string,
  options: { volume: string; reason: string },
): UncoverableVolumeError {
  const { volume, reason } = options;
  return new UncoverableVolumeError(
    `Image '${escapeControls(image)}' declares VOLUME '${escapeControls(volume)}', ` +
      `which waffle cannot cover with a capped tmpfs (${reason}): rebuild the image without it`,
    { image, volume, reason },
  );
}

/**
 * The tmpfs masks over an image's VOLUMEs, for every container waffle runs
 * the image in. Docker would make each VOLUME an anonymous volume: outside
 * the sandbox's quota, on the host's disk, with no cap. Each is a tmpfs
 * instead, of `sizeBytes`, owned by the commands' uid (not world-writable: a
 * VOLUME under a root-only path stays theirs alone), except one at a target
 * the container mounts itself (`mounted`), which that mount covers.
 *
 * @param image The image (its id and `volumes`).
 * @param options `sizeBytes`: each tmpfs's cap; `mounted`: the container's own mount and tmpfs targets.
 * @returns `HostConfig.Tmpfs` entries: path → mount options.
 * @throws {UncoverableVolumeError} When a VOLUME cannot be covered (see
 * {@linkcode uncoverableVolume}), or lies under or over one of `mounted`.
 *
 * @example
 * ```ts
 * const masks = imageVolumeMasks(
 *   { id: "sha256:aa", volumes: ["/data"] },
 *   { sizeBytes: 1024 * 1024, mounted: [] },
 * );
 * masks["/data"]; // "rw,nosuid,nodev,size=1048576,uid=10001,gid=10001,mode=0755"
 * ```
 */
export function imageVolumeMasks(
  image: Pick<ImageFacts, "id" | "volumes">,
  options: { sizeBytes: number; mounted: readonly string[] },
): Record<string, string> {
  refuseUncoverableVolumes(image.id, image);
  const mounted = options.mounted.map((target) => normalize(target));
  const covered: string[] = [];
  for (const volume of image.volumes) {
    // Never undefined: refused above.
    const clean = cleanVolume(volume)!;
    if (mounted.includes(clean)) continue;
    // A mount of this container the fixed lists do not know of.
    const other = mounted.find((target) => isUnder(clean, target) || isUnder(target, clean));
    if (other !== undefined) {
      const where = isUnder(clean, other) ? "under" : "over";
      throw uncoverable(image.id, { volume, reason: `${where} waffle's own mount '${other}'` });
    }
    covered.push(clean);
  }
  const mask =
    `rw,nosuid,nodev,size=${options.sizeBytes},uid=${SANDBOX_UID},gid=${SANDBOX_UID},mode=0755`;
  return Object.fromEntries([...new Set(covered)].map((path) => [path, mask]));
}

// The runner's command line and mounts: the host's inbound directory
// read-only, the runner's outbound directory and the workspace read-write,
// and the program read-only.
function runnerLaunch(
  config: SandboxConfig,
  paths: StatePaths,
  options: { readOnlyWorkspace: boolean },
): { cmd: string[]; mounts: HostConfigMount[]; launchIdentity: string[]; denoDir?: string } {
  const program = programLaunch(config);
  const mounts: HostConfigMount[] = [
    bind(`${paths.queue}/inbound`, "/queue/inbound", true, paths.root),
    bind(paths.outbound, "/queue/outbound", false, paths.root),
    bind(paths.workspace, "/workspace", options.readOnlyWorkspace, paths.root),
    bind(config.mcpCache, SANDBOX_MCP_CACHE, true),
    // Read-only: the sandbox can connect to a host's socket there, never
    // replace one. Named by its real path, as the state's mounts are.
    bind(realOrAsIs(paths.channel), SANDBOX_CHANNEL_DIR, true),
    ...program.mounts,
  ];
  return {
    cmd: [...program.argv, ...runnerArguments(config)],
    mounts,
    launchIdentity: program.launchIdentity,
    ...(program.denoDir === undefined ? {} : { denoDir: program.denoDir }),
  };
}

/**
 * The runner's subcommand and flags in a sandbox (after the program's
 * argv): the queue at `/queue`, the workspace at `/workspace`, commands as
 * {@linkcode SANDBOX_UID}, a private devpts. The one list a container and a
 * Kubernetes pod (`lib/k8s/sandbox_object.ts`) both run.
 *
 * @param config `idleSeconds`: the runner's idle exit (0: never).
 * @returns The arguments from `runner` on.
 *
 * @example
 * ```ts
 * runnerArguments({ idleSeconds: 0 }).slice(0, 3); // ["runner", "--queue", "/queue"]
 * ```
 */
export function runnerArguments(config: Pick<SandboxConfig, "idleSeconds">): string[] {
  return [
    "runner",
    "--queue",
    "/queue",
    "--workspace",
    "/workspace",
    "--idle-exit",
    String(config.idleSeconds),
    "--command-user",
    `${SANDBOX_UID}:${SANDBOX_UID}`,
    "--private-ptys",
  ];
}

/** waffle's own program as a sandbox runs it: argv up to the subcommand, and its mounts. */
export interface ProgramLaunch {
  /** The command line before the subcommand. */
  argv: string[];
  /** The read-only mounts it needs. */
  mounts: HostConfigMount[];
  /** Variables that pin the build into the posture. */
  launchIdentity: string[];
  /** A read-only warm Deno cache, when the install made one. */
  denoDir?: string;
}

/**
 * waffle's own program as any container runs it (the runner, the egress
 * proxy): its argv up to the subcommand and its read-only mounts.
 *
 * @param config The config (its `runner` artefact).
 * @returns The launch.
 */
export function programLaunch(config: SandboxConfig): ProgramLaunch {
  const self = config.runner === undefined ? selfCommand() : artefactCommand(config.runner);
  if (self.sourceRoot === undefined && self.artefact === undefined) {
    return {
      argv: [`${PROGRAM_DIR}/waffle`],
      mounts: [bind(Deno.realPathSync(self.executable), `${PROGRAM_DIR}/waffle`, true)],
      launchIdentity: [`WAFFLE_ARTEFACT_SHA256=${artefactDigest(self.executable)}`],
    };
  }
  // The Deno that runs waffle and the kit it runs with (any image); the
  // kit's hash joins the posture, so a rebuilt kit recycles every sandbox.
  const kit = runtimeKitOf(self);
  const mounts = [
    bind(Deno.realPathSync(self.executable), SANDBOX_DENO, true),
    bind(Deno.realPathSync(kit), SANDBOX_RUNTIME, true),
    // The kit's loader would still preload what the image's
    // /etc/ld.so.preload names into the root runner: it names nothing.
    bind("/dev/null", "/etc/ld.so.preload", true),
  ];
  const kitIdentity = `WAFFLE_RUNTIME_KIT=${readKitHash(kit)}`;
  if (self.artefact !== undefined) {
    // The bundled artefact's build directory (its entry and chunks), nothing
    // else; its digest (over every file) joins the posture, so a new build
    // recycles every sandbox.
    const build = self.artefact.slice(0, self.artefact.lastIndexOf("/"));
    mounts.push(bind(Deno.realPathSync(build), SANDBOX_ARTEFACT_DIR, true));
    const cache = runnerCacheOf(self.artefact);
    if (cache !== undefined) mounts.push(bind(Deno.realPathSync(cache), RUNNER_CACHE, true));
    return {
      ...(cache === undefined ? {} : { denoDir: RUNNER_CACHE }),
      argv: [...SANDBOX_ARTEFACT_ARGV],
      mounts,
      launchIdentity: [`WAFFLE_ARTEFACT_SHA256=${artefactDigest(self.artefact)}`, kitIdentity],
    };
  }
  // From source: only what the runner loads (sources and node_modules), not
  // .git, .tools or anything else in the checkout. --cached-only: never fetch.
  for (const entry of ["main.ts", "deno.json", "deno.lock", "lib", "runner", "node_modules"]) {
    mounts.push(bind(`${self.sourceRoot}/${entry}`, `${PROGRAM_DIR}/src/${entry}`, true));
  }
  const argv = [
    ...SANDBOX_DENO_ARGV,
    "run",
    "--allow-all",
    "--quiet",
    "--no-prompt",
    "--cached-only",
    RUNNER_V8_FLAGS,
    "--node-modules-dir=manual",
    "--config",
    `${PROGRAM_DIR}/src/deno.json`,
    `${PROGRAM_DIR}/src/main.ts`,
  ];
  return { argv, mounts, launchIdentity: [kitIdentity] };
}

// The kit's input hash (image/runtime_kit.sh writes it); "unknown" when unreadable.
function readKitHash(kit: string): string {
  try {
    const hash = Deno.readTextFileSync(`${kit}/kit.hash`).trim();
    return /^[0-9a-f]{64}$/.test(hash) ? hash : "unknown";
  } catch {
    return "unknown";
  }
}

/**
 * How a command in the sandbox runs waffle's own CLI (the same program as
 * its runner, e.g. `waffle files …` for `waffle cp`): as any other command,
 * with the commands' uid and nothing of the runner's privileges, so it can
 * touch only what the sandbox's own code could. Works in any image.
 *
 * @param config The sandbox's config.
 * @param args The subcommand and its arguments.
 * @returns The argv and the variables it needs (a Deno cache it can use).
 */
export function sandboxWaffleCommand(
  config: SandboxConfig,
  args: string[],
): { argv: string[]; env: Record<string, string> } {
  const program = programLaunch(config);
  return {
    argv: [...program.argv, ...args],
    // The install's warm cache is read-only; from source Deno needs a writable one.
    env: {
      ...SANDBOX_DENO_ENV,
      ...(program.denoDir === undefined ? {} : { DENO_DIR: program.denoDir }),
    },
  };
}

/**
 * The runtime kit's static metadata reader (`image/metadata_helper.c`) as a
 * command in the sandbox runs it, when the kit mounted in its sandboxes has
 * one: a kit built without a static C compiler has none (nor does a compiled
 * waffle, which mounts no kit), and `waffle files metadata` does the work.
 * The kit's hash is part of the posture, so the kit a sandbox has mounted
 * is the one seen here.
 *
 * @param config The sandbox's config (its `runner` artefact).
 * @returns The reader's absolute path inside the sandbox, or undefined.
 */
export function sandboxMetadataReader(config: SandboxConfig): string | undefined {
  try {
    const self = config.runner === undefined ? selfCommand() : artefactCommand(config.runner);
    if (self.sourceRoot === undefined && self.artefact === undefined) return undefined;
    return Deno.statSync(`${runtimeKitOf(self)}/${METADATA_READER}`).isFile
      ? `${SANDBOX_RUNTIME}/${METADATA_READER}`
      : undefined;
  } catch {
    return undefined; // no kit: the fallback reports why
  }
}

/**
 * Whether this host process can hand state to the sandbox uid (it is root).
 *
 * @returns True when running as root.
 */
export function hostCanChown(): boolean {
  return Deno.uid() === 0;
}

/**
 * A validated bind mount. Sources must be absolute, free of NUL, `:` and
 * `..`, and (for writable state) inside the sandbox's state directory.
 *
 * @param source Host path.
 * @param target Container path.
 * @param readOnly Mount read-only.
 * @param within When given, `source` must resolve inside it.
 * @returns The mount.
 * @throws {UsageError} When the path is unsafe.
 */
export function bind(
  source: string,
  target: string,
  readOnly: boolean,
  within?: string,
): HostConfigMount {
  if (!source.startsWith("/") || /[\0:]/.test(source) || source.split("/").includes("..")) {
    throw new UsageError(
      `Unsafe mount source '${source}': it must be absolute, without NUL, ':' or '..'`,
    );
  }
  if (within !== undefined) {
    const real = Deno.realPathSync(source);
    const root = Deno.realPathSync(within);
    if (real !== root && !real.startsWith(`${root}/`)) {
      throw new UsageError(
        `Mount source '${source}' resolves outside the sandbox state '${within}'`,
      );
    }
    // By its real path: a pool member taken by a user keeps its mounts while
    // the user's state root names its own (see `pool.ts`), and both name one.
    return { Type: "bind", Source: real, Target: target, ReadOnly: readOnly };
  }
  return { Type: "bind", Source: source, Target: target, ReadOnly: readOnly };
}
