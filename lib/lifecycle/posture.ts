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
import { UsageError } from "../errors.ts";
import type { SandboxConfig } from "../config/config.ts";
import {
  ARTEFACT_FLAGS,
  artefactCommand,
  artefactDigest,
  PROGRAM_DIR,
  RUNNER_V8_FLAGS,
  runnerCacheOf,
  selfCommand,
} from "../config/self.ts";
import type { ContainerCreateBody, ContainerInspect, HostConfigMount } from "../docker/mod.ts";
import type { SandboxKey, StatePaths } from "./identity.ts";

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

/** Where the runner's program is mounted inside the container. */
/** Deno inside the container, when waffle runs from source (it runs npm MCP servers too). */
export const SANDBOX_DENO = `${PROGRAM_DIR}/deno`;
/** The runner cache's mount point (read-only), the runner's `DENO_DIR` when there is one. */
const RUNNER_CACHE = `${PROGRAM_DIR}/cache`;
/** The host's npm package cache for MCP servers, read-only inside (`DENO_DIR` of a server). */
export const SANDBOX_MCP_CACHE = `${PROGRAM_DIR}/mcp-cache`;
/** A restricted session's home: a tmpfs owned by the commands' uid. */
export const RESTRICTED_HOME = "/home/sandbox";
/** How long a restricted container's runner outlives its session's host. */
const RESTRICTED_IDLE_SECONDS = 60;
/** The runner's private scratch (Deno's cache): a tmpfs no command can enter. */
const RUNNER_DIR = "/run/waffle";

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
 */
export function containerSpec(
  key: SandboxKey,
  options: {
    config: SandboxConfig;
    imageId: string;
    paths: StatePaths;
    restricted?: { id: string } | undefined;
  },
): ContainerSpec {
  const { imageId, paths, restricted } = options;
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
  const body: ContainerCreateBody = {
    Image: imageId,
    Cmd: cmd,
    Env: runnerEnv(config, launchIdentity, denoDir ?? `${RUNNER_DIR}/deno`),
    // The runner is the container's root with RUNNER_CAPS only; commands
    // run as SANDBOX_UID (see RUNNER_CAPS).
    User: "0:0",
    WorkingDir: "/workspace",
    Hostname: key.containerName.slice(0, 63),
    StopSignal: "SIGTERM",
    StopTimeout: 10,
    Labels: {
      [restricted === undefined ? LABELS.key : LABELS.restricted]: key.hash,
      [LABELS.tenant]: key.tenant,
      [LABELS.user]: key.user,
      [LABELS.image]: imageId,
      [LABELS.state]: paths.root,
    },
    HostConfig: {
      Init: true,
      ReadonlyRootfs: true,
      Tmpfs: {
        "/tmp": `rw,noexec,nosuid,nodev,size=${config.tmpBytes}`,
        [RUNNER_DIR]: "rw,noexec,nosuid,nodev,size=128m,mode=0700",
        ...(restricted === undefined ? {} : {
          [RESTRICTED_HOME]:
            `rw,noexec,nosuid,nodev,size=64m,uid=${SANDBOX_UID},gid=${SANDBOX_UID},mode=0700`,
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
      Mounts: mounts,
      RestartPolicy: { Name: "no" },
      AutoRemove: restricted !== undefined,
      Privileged: false,
    },
  };
  // The image is compared by id on its own; the rest is the posture.
  const { Image: _image, ...posture } = { ...body, Labels: { ...body.Labels } };
  delete posture.Labels[LABELS.image];
  const postureHash = sha256Hex(JSON.stringify(posture));
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

function runnerEnv(config: SandboxConfig, launchIdentity: string[], denoDir: string): string[] {
  return [
    ...launchIdentity,
    "PATH=/usr/local/bin:/usr/bin:/bin",
    `HOME=${RUNNER_DIR}`,
    `DENO_DIR=${denoDir}`,
    "DENO_NO_UPDATE_CHECK=1",
    "NO_COLOR=1",
    `WAFFLE_PASS_ENV=${config.envAllowlist.join(",")}`,
    ...config.envAllowlist.flatMap((name) => {
      const value = Deno.env.get(name);
      return value === undefined ? [] : [`${name}=${value}`];
    }),
  ];
}

// The runner's command line and mounts: the host's inbound directory
// read-only, the runner's outbound directory and the workspace read-write,
// and the program read-only.
function runnerLaunch(
  config: SandboxConfig,
  paths: StatePaths,
  options: { readOnlyWorkspace: boolean },
): { cmd: string[]; mounts: HostConfigMount[]; launchIdentity: string[]; denoDir?: string } {
  const self = config.runner === undefined ? selfCommand() : artefactCommand(config.runner);
  const runnerArgs = [
    "runner",
    "--queue",
    "/queue",
    "--workspace",
    "/workspace",
    "--idle-exit",
    String(config.idleSeconds),
    "--command-user",
    `${SANDBOX_UID}:${SANDBOX_UID}`,
  ];
  const mounts: HostConfigMount[] = [
    bind(`${paths.queue}/inbound`, "/queue/inbound", true, paths.root),
    bind(paths.outbound, "/queue/outbound", false, paths.root),
    bind(paths.workspace, "/workspace", options.readOnlyWorkspace, paths.root),
    bind(config.mcpCache, SANDBOX_MCP_CACHE, true),
  ];
  if (self.artefact !== undefined) {
    // The bundled artefact and the Deno that runs it, nothing else; its
    // digest joins the posture, so a new build recycles every sandbox.
    mounts.push(bind(Deno.realPathSync(self.executable), SANDBOX_DENO, true));
    mounts.push(bind(Deno.realPathSync(self.artefact), `${PROGRAM_DIR}/waffle.js`, true));
    const cache = runnerCacheOf(self.artefact);
    if (cache !== undefined) mounts.push(bind(Deno.realPathSync(cache), RUNNER_CACHE, true));
    return {
      ...(cache === undefined ? {} : { denoDir: RUNNER_CACHE }),
      cmd: [
        SANDBOX_DENO,
        ...ARTEFACT_FLAGS,
        RUNNER_V8_FLAGS,
        `${PROGRAM_DIR}/waffle.js`,
        ...runnerArgs,
      ],
      mounts,
      launchIdentity: [`WAFFLE_ARTEFACT_SHA256=${artefactDigest(self.artefact)}`],
    };
  }
  if (self.sourceRoot === undefined) {
    mounts.push(bind(Deno.realPathSync(self.executable), `${PROGRAM_DIR}/waffle`, true));
    return {
      cmd: [`${PROGRAM_DIR}/waffle`, ...runnerArgs],
      mounts,
      launchIdentity: [`WAFFLE_ARTEFACT_SHA256=${artefactDigest(self.executable)}`],
    };
  }
  // From source: the Deno executable plus the project (sources and
  // node_modules), both read-only. --cached-only: never fetch anything.
  mounts.push(bind(Deno.realPathSync(self.executable), SANDBOX_DENO, true));
  // Only what the runner loads: not .git, .tools or anything else in the checkout.
  for (const entry of ["main.ts", "deno.json", "deno.lock", "lib", "runner", "node_modules"]) {
    mounts.push(bind(`${self.sourceRoot}/${entry}`, `${PROGRAM_DIR}/src/${entry}`, true));
  }
  const cmd = [
    SANDBOX_DENO,
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
    ...runnerArgs,
  ];
  return { cmd, mounts, launchIdentity: [] };
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
  }
  return { Type: "bind", Source: source, Target: target, ReadOnly: readOnly };
}
