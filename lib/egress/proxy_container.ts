/**
 * The egress proxy's container, one per waffle home: waffle's own program
 * (`waffle egress-proxy`) in the configured image, as an unprivileged uid
 * with no capabilities, a read-only root, bounded memory and pids, and the
 * host's network (it is what reaches upstreams; sandboxes have none). It
 * sees the CA and the policies read-only, and may write only its sockets
 * and the audit file, so a compromised proxy cannot make the host write
 * through a link it planted.
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { join } from "../path.ts";
import type { SandboxConfig } from "../config/config.ts";
import type { ContainerCreateBody } from "../docker/mod.ts";
import {
  bind,
  hostCanChown,
  type ImageFacts,
  imageVolumeMasks,
  LABELS,
  maskImageEnv,
  programLaunch,
} from "../lifecycle/posture.ts";
import { egressPaths, PROXY_AUDIT_FILE, PROXY_EGRESS_DIR } from "../config/egress_paths.ts";

/** The uid (and gid) the proxy runs as when the host is root: neither root nor the sandbox's. */
export const PROXY_UID = 10002;

/** The label naming the home whose proxy a container is. */
export const EGRESS_LABEL = "waffle.egress";

/** The proxy container to create. */
export interface ProxyContainerSpec {
  /** Its name: `waffle-egress-<home fingerprint>`. */
  name: string;
  /** The create body. */
  body: ContainerCreateBody;
  /** Digest of the body without the image and the volatile labels. */
  postureHash: string;
}

/**
 * The uid:gid the proxy runs as: {@linkcode PROXY_UID} for a root host (which
 * hands it its files), else the host's own (which owns them already).
 *
 * @returns `uid:gid`.
 */
export function proxyUser(): { uid: number; gid: number } {
  return hostCanChown()
    ? { uid: PROXY_UID, gid: PROXY_UID }
    : { uid: Deno.uid() ?? 0, gid: Deno.gid() ?? 0 };
}

/**
 * The audit file of a home, as users read it: a link to the file the proxy
 * writes (`<home>/egress/audit/egress.jsonl`).
 *
 * @param home The waffle home.
 * @returns `<home>/egress.jsonl`.
 */
export function egressAuditFile(home: string): string {
  return join(home, "egress.jsonl");
}

/**
 * The proxy container's name of a home.
 *
 * @param home The waffle home.
 * @returns `waffle-egress-<home fingerprint>`.
 */
export function proxyContainerName(home: string): string {
  return `waffle-egress-${sha256Hex(home).slice(0, 12)}`;
}

/**
 * Builds the proxy container of a home.
 *
 * @param home The waffle home.
 * @param options The config (image, artefact) and the resolved image.
 * @returns The spec.
 * @throws {UncoverableVolumeError} When the image has a VOLUME no capped tmpfs can cover.
 */
export function proxyContainerSpec(
  home: string,
  options: { config: SandboxConfig; image: ImageFacts },
): ProxyContainerSpec {
  const paths = egressPaths(join(home, "egress"));
  const program = programLaunch(options.config);
  const user = proxyUser();
  const inside = egressPaths(PROXY_EGRESS_DIR);
  const env = maskImageEnv([
    ...program.launchIdentity,
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "HOME=/tmp",
    `DENO_DIR=${program.denoDir ?? "/tmp/deno"}`,
    "DENO_NO_UPDATE_CHECK=1",
    "NO_COLOR=1",
  ], options.image);
  const mounts = [
    ...program.mounts,
    bind(join(paths.root, "ca"), join(inside.root, "ca"), true, paths.root),
    bind(paths.policies, inside.policies, true, paths.root),
    bind(paths.sockets, inside.sockets, false, paths.root),
    bind(join(paths.root, "ctl"), join(inside.root, "ctl"), false, paths.root),
    // A directory, not the file: the proxy rotates the audit in it.
    bind(join(paths.root, "audit"), join(inside.root, "audit"), false, paths.root),
  ];
  // The image's VOLUMEs as in a sandbox: never anonymous volumes on the
  // host's disk (one no tmpfs can cover refuses the image).
  const volumes = imageVolumeMasks(options.image, {
    sizeBytes: options.config.tmpBytes,
    mounted: ["/tmp", ...mounts.map((mount) => mount.Target)],
  });
  const body: ContainerCreateBody = {
    Image: options.image.id,
    Entrypoint: program.argv.slice(0, 1),
    Cmd: [
      ...program.argv.slice(1),
      "egress-proxy",
      "--dir",
      PROXY_EGRESS_DIR,
      "--audit",
      PROXY_AUDIT_FILE,
    ],
    Env: env,
    User: `${user.uid}:${user.gid}`,
    WorkingDir: "/tmp",
    Healthcheck: { Test: ["NONE"] },
    StopSignal: "SIGTERM",
    StopTimeout: 5,
    Labels: { [EGRESS_LABEL]: home, [LABELS.state]: paths.root },
    HostConfig: {
      Init: true,
      ReadonlyRootfs: true,
      Tmpfs: { "/tmp": "rw,noexec,nosuid,nodev,size=128m,mode=1777", ...volumes },
      CapDrop: ["ALL"],
      CapAdd: [],
      SecurityOpt: ["no-new-privileges"],
      PidsLimit: 128,
      Memory: 512 * 1024 * 1024,
      MemorySwap: 512 * 1024 * 1024,
      NetworkMode: "host",
      LogConfig: { Type: "json-file", Config: { "max-size": "1m", "max-file": "2" } },
      Mounts: mounts,
      RestartPolicy: { Name: "on-failure", MaximumRetryCount: 5 },
      Privileged: false,
    },
  };
  const { Image: _image, ...posture } = body;
  const postureHash = sha256Hex(JSON.stringify(posture));
  body.Labels = { ...body.Labels, [LABELS.posture]: postureHash };
  return { name: proxyContainerName(home), body, postureHash };
}
