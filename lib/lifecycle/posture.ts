/**
 * The one place that builds a sandbox container's create body and the
 * posture hash: a digest of every security-relevant launch setting. A
 * container whose `waffle.posture` label differs from today's hash is
 * recycled on its next use, so a tightened setting can never be silently
 * skipped by adopting an old container.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { realpathSync } from "node:fs";
import { UsageError } from "../errors.ts";
import type { SandboxConfig } from "../config/config.ts";
import { selfCommand } from "../config/self.ts";
import type { ContainerCreateBody, HostConfigMount } from "../docker/mod.ts";
import type { SandboxKey, StatePaths } from "./identity.ts";

/** Uid and gid of the sandbox user (the image's `waffle` user). */
export const SANDBOX_UID = 10001;

/** Where the runner's program is mounted inside the container. */
const PROGRAM_DIR = "/opt/waffle";

/** Labels waffle puts on its containers. */
export const LABELS = {
  key: "waffle.key",
  tenant: "waffle.tenant",
  user: "waffle.user",
  image: "waffle.image",
  posture: "waffle.posture",
  created: "waffle.created",
  state: "waffle.state",
} as const;

/** Everything that decides how a sandbox container is launched. */
export interface Posture {
  user: string;
  readOnlyRootfs: true;
  tmpfs: string;
  capDrop: ["ALL"];
  securityOpt: ["no-new-privileges"];
  pidsLimit: number;
  memoryBytes: number;
  nanoCpus: number;
  network: string;
  logConfig: { Type: "json-file"; Config: { "max-size": string; "max-file": string } };
  init: true;
  env: string[];
  mounts: HostConfigMount[];
  cmd: string[];
}

/** A container to create, with its identity labels. */
export interface ContainerSpec {
  /** The sandbox's deterministic container name. */
  name: string;
  /** The Docker create body: image, command, labels and posture. */
  body: ContainerCreateBody;
  /** SHA-256 of the posture; a container labelled with another one is recycled. */
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
  options: { config: SandboxConfig; imageId: string; paths: StatePaths },
): ContainerSpec {
  const { config, imageId, paths } = options;
  const posture = buildPosture(config, paths);
  const postureHash = createHash("sha256").update(JSON.stringify(posture)).digest("hex");
  return {
    name: key.containerName,
    postureHash,
    body: {
      Image: imageId,
      Cmd: posture.cmd,
      Env: posture.env,
      User: posture.user,
      WorkingDir: "/workspace",
      Hostname: key.containerName.slice(0, 63),
      StopSignal: "SIGTERM",
      StopTimeout: 10,
      Labels: {
        [LABELS.key]: key.hash,
        [LABELS.tenant]: key.tenant,
        [LABELS.user]: key.user,
        [LABELS.image]: imageId,
        [LABELS.posture]: postureHash,
        [LABELS.created]: new Date().toISOString(),
        [LABELS.state]: paths.root,
      },
      HostConfig: {
        Init: true,
        ReadonlyRootfs: true,
        Tmpfs: { "/tmp": posture.tmpfs },
        CapDrop: posture.capDrop,
        SecurityOpt: posture.securityOpt,
        PidsLimit: posture.pidsLimit,
        Memory: posture.memoryBytes,
        MemorySwap: posture.memoryBytes,
        NanoCpus: posture.nanoCpus,
        NetworkMode: posture.network,
        LogConfig: posture.logConfig,
        Mounts: posture.mounts,
        RestartPolicy: { Name: "no" },
        AutoRemove: false,
        Privileged: false,
      },
    },
  };
}

function buildPosture(config: SandboxConfig, paths: StatePaths): Posture {
  const self = selfCommand();
  const runnerArgs = [
    "runner",
    "--queue",
    "/queue",
    "--workspace",
    "/workspace",
    "--idle-exit",
    String(config.idleSeconds),
  ];
  const mounts: HostConfigMount[] = [
    bind(paths.queue, "/queue", false, paths.root),
    bind(paths.workspace, "/workspace", false, paths.root),
  ];
  let cmd: string[];
  if (self.sourceRoot === undefined) {
    mounts.push(bind(realpathSync(self.executable), `${PROGRAM_DIR}/waffle`, true));
    cmd = [`${PROGRAM_DIR}/waffle`, ...runnerArgs];
  } else {
    // From source: the Deno executable plus the project (sources and
    // node_modules), both read-only. --cached-only: never fetch anything.
    mounts.push(bind(realpathSync(self.executable), `${PROGRAM_DIR}/deno`, true));
    // Only what the runner loads: not .git, .tools or anything else in the checkout.
    for (const entry of ["main.ts", "deno.json", "deno.lock", "lib", "runner", "node_modules"]) {
      mounts.push(bind(`${self.sourceRoot}/${entry}`, `${PROGRAM_DIR}/src/${entry}`, true));
    }
    cmd = [
      `${PROGRAM_DIR}/deno`,
      "run",
      "--allow-all",
      "--quiet",
      "--no-prompt",
      "--cached-only",
      "--node-modules-dir=manual",
      "--config",
      `${PROGRAM_DIR}/src/deno.json`,
      `${PROGRAM_DIR}/src/main.ts`,
      ...runnerArgs,
    ];
  }
  const env = [
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "HOME=/workspace",
    "DENO_DIR=/tmp/.deno",
    "DENO_NO_UPDATE_CHECK=1",
    "NO_COLOR=1",
    `WAFFLE_PASS_ENV=${config.envAllowlist.join(",")}`,
    ...config.envAllowlist.flatMap((name) => {
      const value = Deno.env.get(name);
      return value === undefined ? [] : [`${name}=${value}`];
    }),
  ];
  const uid = hostCanChown() ? SANDBOX_UID : Deno.uid();
  return {
    user: `${uid}:${uid === SANDBOX_UID ? SANDBOX_UID : Deno.gid()}`,
    readOnlyRootfs: true,
    tmpfs: `rw,noexec,nosuid,nodev,size=${config.tmpBytes}`,
    capDrop: ["ALL"],
    securityOpt: ["no-new-privileges"],
    pidsLimit: config.pidsLimit,
    memoryBytes: config.memoryBytes,
    nanoCpus: Math.round(config.cpus * 1e9),
    network: config.network,
    logConfig: { Type: "json-file", Config: { "max-size": "1m", "max-file": "2" } },
    init: true,
    env,
    mounts,
    cmd,
  };
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
    const real = realpathSync(source);
    const root = realpathSync(within);
    if (real !== root && !real.startsWith(`${root}/`)) {
      throw new UsageError(
        `Mount source '${source}' resolves outside the sandbox state '${within}'`,
      );
    }
  }
  return { Type: "bind", Source: source, Target: target, ReadOnly: readOnly };
}
