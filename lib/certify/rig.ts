/**
 * What a certification check runs against: a runner serving a queue from a
 * real sandbox container, and the host's side of that queue. A rig is a
 * sandbox of its own in a throwaway home (the queue on bind mounts, as every
 * sandbox has it), a sandbox the caller already has (the test suite's), or
 * the same container with the queue's files on Docker named volumes
 * (`volume.ts`).
 *
 * @module
 */
import { CertifyError } from "../errors.ts";
import { join } from "../path.ts";
import type { DockerClient } from "../docker/client.ts";
import { openSandbox, type Sandbox } from "../sandbox/open.ts";
import { Queue, type SubmitOptions } from "../queue/queue.ts";
import type { QueuePaths } from "../queue/schema.ts";
import type { QueueMount } from "./check.ts";
import type { Cleanup } from "./cleanup.ts";
import { OWNER_FILE, runOwner } from "./owner.ts";
import { within } from "./_poll.ts";

/** The tenant of every sandbox a certification run opens. */
export const CERTIFY_TENANT = "waffle-certify";

/** The name prefix of a certification sandbox's throwaway home, in the temporary directory. */
export const RIG_HOME_PREFIX = "waffle-certify-";

/** How long a certification sandbox's runner may sit idle: longer than any pause between checks. */
const RIG_IDLE_SECONDS = 600;

/** A runner in a container and the host's side of its queue. */
export interface QueueRig {
  /** The daemon the container runs on. */
  readonly docker: DockerClient;
  /** Where the queue's files are. */
  readonly mount: QueueMount;
  /** The container's id. */
  readonly containerId: string;
  /** The host's handle on the queue. */
  readonly queue: Queue;
  /** The queue's files as the host reaches them. */
  readonly paths: QueuePaths;
  /** The host directory mounted at `/workspace`. */
  readonly workspace: string;
  /** Opens another host handle on the same queue (the caller closes it). */
  openQueue(): Queue;
  /**
   * Submits a request.
   *
   * @param request What to run.
   * @returns The request id.
   */
  submit(request: SubmitOptions): Promise<string>;
}

/**
 * A rig over a sandbox that has been ensured.
 *
 * @param sandbox The sandbox.
 * @param docker The daemon it runs on.
 * @returns The rig.
 * @throws {CertifyError} When the sandbox has not been ensured yet.
 *
 * @example
 * ```ts ignore
 * await sandbox.ensure();
 * const figures = await stressCheck(sandboxRig(sandbox, docker), { seconds: 5 });
 * ```
 */
export function sandboxRig(sandbox: Sandbox, docker: DockerClient): QueueRig {
  const containerId = sandbox.lastEnsure?.containerId;
  if (containerId === undefined) {
    throw new CertifyError(`Sandbox '${sandbox.key.containerName}' has not been ensured`);
  }
  return {
    docker,
    mount: "bind mount",
    containerId,
    queue: sandbox.queue,
    paths: sandbox.queue.paths,
    workspace: sandbox.paths.workspace,
    openQueue: () => Queue.open(sandbox.paths.queue, { outboundDir: sandbox.paths.outbound }),
    submit: (request) => sandbox.submit(request),
  };
}

/**
 * Opens a sandbox of its own in a fresh temporary home, with the configured
 * image, and starts it: its queue on bind mounts, as every sandbox has it.
 * Everything it makes is registered with `cleanup` first.
 *
 * @param docker The daemon.
 * @param options The image, the runner artefact (default: this waffle) and the run's cleanup.
 * @returns The rig and its sandbox.
 * @throws {DockerError} When the container cannot be started.
 *
 * @example
 * ```ts ignore
 * const { rig } = await openBindRig(docker, { image: "waffle-runner:latest", cleanup });
 * ```
 */
export async function openBindRig(
  docker: DockerClient,
  options: { image: string; runner?: string | undefined; cleanup: Cleanup },
): Promise<{ rig: QueueRig; sandbox: Sandbox }> {
  const sandbox = await rigSandbox(docker, { ...options, user: "bind" });
  await within(options.cleanup.creating(sandbox.ensure()), {
    ms: 120_000,
    what: "the certification sandbox to start",
  });
  return { rig: sandboxRig(sandbox, docker), sandbox };
}

/**
 * A sandbox in a fresh temporary home (`waffle-certify-*`), registered with
 * `cleanup` (its queue, container, quota volume and home): not started yet.
 *
 * @param docker The daemon.
 * @param options The image, the runner artefact, the run's cleanup and the user id's suffix.
 * @returns The sandbox.
 */
export async function rigSandbox(
  docker: DockerClient,
  options: { image: string; runner?: string | undefined; cleanup: Cleanup; user: string },
): Promise<Sandbox> {
  const { cleanup } = options;
  const home = await Deno.makeTempDir({ prefix: RIG_HOME_PREFIX });
  cleanup.dir(home);
  // Before the container: a later run sweeps it should this process die (leftovers.ts).
  Deno.writeTextFileSync(join(home, OWNER_FILE), runOwner(), { mode: 0o600 });
  const sandbox = openSandbox(`certify-${options.user}`, {
    tenant: CERTIFY_TENANT,
    // The home's own config (none): only the image and runner are the user's.
    config: {
      home,
      image: options.image,
      idleSeconds: RIG_IDLE_SECONDS,
      ...(options.runner === undefined ? {} : { runner: options.runner }),
    },
    docker,
  });
  cleanup.close(() => sandbox.close());
  cleanup.container(sandbox.key.containerName, { stateRoot: sandbox.paths.root });
  cleanup.quota(sandbox.paths.root);
  return sandbox;
}
