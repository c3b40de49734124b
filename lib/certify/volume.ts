/**
 * The support statement's fallback, tried on this installation: the same
 * sandbox container (today's spec, from `containerSpec`), with the queue's
 * two directories on Docker named volumes instead of bind mounts. The host's
 * clients reach the files through each volume's `Mountpoint`, which only a
 * local daemon's host sees (as root, or as the user of a rootless daemon):
 * where it is not reachable (Docker Desktop keeps volumes inside its VM)
 * the rig is skipped with the reason, never passed.
 *
 * @module
 */
import { join } from "../path.ts";
import { CertifyError } from "../errors.ts";
import { messageOf } from "../queue/connection.ts";
import type { DockerClient } from "../docker/client.ts";
import type { ContainerCreateBody, HostConfigMount } from "../docker/types.ts";
import { resolveImage } from "../lifecycle/ensure.ts";
import { containerSpec, hostCanChown } from "../lifecycle/posture.ts";
import { prepareState } from "../lifecycle/state_dir.ts";
import { Queue } from "../queue/queue.ts";
import type { Cleanup } from "./cleanup.ts";
import { runLabels } from "./owner.ts";
import { type QueueRig, rigSandbox } from "./rig.ts";
import { delay } from "./_poll.ts";

/** The queue's mount points in every sandbox container. */
const QUEUE_TARGETS = { inbound: "/queue/inbound", outbound: "/queue/outbound" } as const;
/** How long the runner may take to beat in the volume. */
const READY_MS = 20_000;

/** A rig, or why there is none on this installation. */
export type VolumeRigOutcome = { rig: QueueRig } | { skipped: string };

/**
 * Opens the volume rig: two named volumes (labelled with the run and its owner), the
 * sandbox container with them at `/queue/inbound` (read-only) and
 * `/queue/outbound`, and the host's queue on their mountpoints. Everything
 * is registered with `cleanup` before it is made.
 *
 * @param docker The daemon.
 * @param options The image, the runner artefact, the run's id and cleanup.
 * @returns The rig, or the reason it cannot be made here.
 * @throws {DockerError} When the daemon refuses a volume or the container.
 * @throws {CertifyError} When the container stops before its first heartbeat.
 *
 * @example
 * ```ts ignore
 * const opened = await openVolumeRig(docker, { image, runId, cleanup });
 * if ("skipped" in opened) console.log(opened.skipped);
 * ```
 */
export async function openVolumeRig(
  docker: DockerClient,
  options: { image: string; runner?: string | undefined; runId: string; cleanup: Cleanup },
): Promise<VolumeRigOutcome> {
  const { cleanup, runId } = options;
  const sandbox = await rigSandbox(docker, { ...options, user: "volume" });
  await prepareState(sandbox.paths, { quotaBytes: sandbox.config.quotaBytes });
  const mountpoints: Record<keyof typeof QUEUE_TARGETS, string> = { inbound: "", outbound: "" };
  for (const side of ["inbound", "outbound"] as const) {
    const name = `waffle-certify-${runId}-${side}`;
    cleanup.volume(name);
    const volume = await cleanup.creating(
      docker.createVolume(name, { labels: runLabels(runId) }),
    );
    const unreachable = reachable(volume.Mountpoint);
    if (unreachable !== undefined) return { skipped: unreachable };
    mountpoints[side] = volume.Mountpoint;
  }
  // The host's queue directory: `inbound` is the inbound volume.
  const queueDir = join(sandbox.paths.root, "volume-queue");
  Deno.mkdirSync(queueDir, { mode: 0o700 });
  Deno.symlinkSync(mountpoints.inbound, join(queueDir, "inbound"));
  const mode = hostCanChown() ? 0o700 : 0o750;
  Deno.chmodSync(mountpoints.outbound, mode);
  const open = (): Queue => Queue.open(queueDir, { outboundDir: mountpoints.outbound });
  const queue = Queue.open(queueDir, { create: true, outboundDir: mountpoints.outbound, mode });
  cleanup.close(() => queue.close());
  const spec = containerSpec(sandbox.key, {
    config: sandbox.config,
    image: await resolveImage(docker, sandbox.config.image),
    paths: sandbox.paths,
  });
  const name = `${spec.name}-volume`;
  cleanup.container(name);
  const containerId = await cleanup.creating(
    docker.createContainer(name, onVolumes(spec.body, { runId, prefix: `waffle-certify-${runId}` }))
      .then(async (id) => {
        await docker.startContainer(id);
        return id;
      }),
  );
  const silent = await waitForBeat(docker, { containerId, queue });
  if (silent !== undefined) return { skipped: silent };
  await queue.syncGeneration();
  return {
    rig: {
      docker,
      mount: "volume",
      containerId,
      queue,
      paths: queue.paths,
      workspace: sandbox.paths.workspace,
      openQueue: open,
      submit: (request) => queue.submit(request),
    },
  };
}

// The spec's body with the queue's bind mounts replaced by the volumes, and
// the run's labels.
function onVolumes(
  body: ContainerCreateBody,
  options: { runId: string; prefix: string },
): ContainerCreateBody {
  const volume = (side: keyof typeof QUEUE_TARGETS): HostConfigMount => ({
    Type: "volume",
    Source: `${options.prefix}-${side}`,
    Target: QUEUE_TARGETS[side],
    ReadOnly: side === "inbound",
    VolumeOptions: { NoCopy: true },
  });
  const mounts = (body.HostConfig?.Mounts ?? []).map((mount) =>
    mount.Target === QUEUE_TARGETS.inbound
      ? volume("inbound")
      : mount.Target === QUEUE_TARGETS.outbound
      ? volume("outbound")
      : mount
  );
  return {
    ...body,
    Labels: { ...body.Labels, ...runLabels(options.runId) },
    HostConfig: { ...body.HostConfig, Mounts: mounts },
  };
}

// Why this host cannot use a volume's files, or undefined when it can.
function reachable(mountpoint: string): string | undefined {
  const why = (reason: string): string =>
    `the volume's Mountpoint '${mountpoint}' is ${reason} on this host (Docker Desktop ` +
    `and remote daemons keep volumes where only their VM reaches them)`;
  try {
    if (!Deno.statSync(mountpoint).isDirectory) return why("not a directory");
    const probe = join(mountpoint, `.waffle-probe-${crypto.randomUUID()}`);
    Deno.writeTextFileSync(probe, "");
    Deno.removeSync(probe);
    return undefined;
  } catch (error) {
    return why(
      error instanceof Deno.errors.NotFound ? "missing" : `not writable (${messageOf(error)})`,
    );
  }
}

// Waits for the runner's first heartbeat in the volume. A container that
// stops is an error; one that runs but whose heartbeat never shows means
// the Mountpoint this host sees is not the daemon's: a skip.
async function waitForBeat(
  docker: DockerClient,
  target: { containerId: string; queue: Queue },
): Promise<string | undefined> {
  const deadline = Date.now() + READY_MS;
  for (let n = 0; Date.now() < deadline; n++) {
    const judged = target.queue.liveness();
    if (judged.state === "alive" && judged.beat !== undefined) return undefined;
    if (n % 25 === 0) {
      const state = await docker.inspectContainer(target.containerId);
      if (state?.State.Running !== true) {
        throw new CertifyError(
          `The volume rig's container stopped (exit ${state?.State.ExitCode ?? "?"}${
            state?.State.Error ? `: ${state.State.Error}` : ""
          })`,
        );
      }
    }
    await delay(20);
  }
  return `no heartbeat within ${READY_MS / 1000} s in the volume's Mountpoint ` +
    `'${target.queue.paths.outboundDir}': this host does not see the daemon's volume files`;
}
