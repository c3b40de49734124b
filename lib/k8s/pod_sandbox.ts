/**
 * The sandbox as `waffle agent` holds it inside a pod: the host side of the
 * queue in the pod's shared `emptyDir`s, served by the runner container the
 * kubelet runs beside the agent. Unlike a Docker sandbox the agent starts
 * nothing: the runner is the pod's to run and restart, so `ensure` waits for
 * its heartbeat, and says so in one line when it does not come.
 *
 * @module
 */
import type { SandboxConfig } from "../config/config.ts";
import { RunnerError } from "../errors.ts";
import { makeChannelDir } from "../queue/channel.ts";
import { Queue, type SubmitOptions } from "../queue/queue.ts";
import { initQueue } from "../queue/schema.ts";
import type { RunnerTrouble } from "../queue/liveness.ts";
import { processesOf, type SandboxProcesses } from "../lifecycle/run.ts";
import { type FilesTarget, type SandboxFiles, sandboxFiles } from "../files/mod.ts";

/** The sandbox of a pod: what envd's services use of a sandbox. */
export interface PodSandbox extends FilesTarget, SandboxProcesses {
  /** Files in and out of it. */
  readonly files: SandboxFiles;
  /**
   * Why the queue cannot be served in this pod, as a call found it (a
   * runner-side file damaged, oversized or not a file: only a broken-into
   * runner makes one), or undefined. The agent cannot set `outbound/` aside (an emptyDir mount) nor
   * restart the runner: it says so, and the server replaces the pod.
   */
  damaged(): string | undefined;
}

/** Options of {@linkcode openPodSandbox}. */
export interface PodSandboxOptions {
  /** The queue's directory (its `inbound/` and `outbound/` are the pod's emptyDirs). */
  queueDir: string;
  /** The channel directory the runner sees at `SANDBOX_CHANNEL_DIR`. */
  channelDir: string;
  /** How the runner runs waffle (its artefact's layout). */
  config: SandboxConfig;
  /** How long `ensure` waits for the runner's heartbeat, in ms (default 60 s). */
  readyTimeoutMs?: number;
  /** Fallback poll interval of the queue. */
  pollMs?: number;
}

/**
 * Opens the queue of the pod (making `inbound.db`, the host's file) and the
 * sandbox over it. The directories are made the host's alone (0700, the
 * agent's uid 0): a command (uid 10001) reaches neither queue file.
 *
 * @param options Where the queue and channel lie, and the config.
 * @returns The sandbox.
 */
export function openPodSandbox(options: PodSandboxOptions): PodSandbox {
  const outboundDir = `${options.queueDir}/outbound`;
  initQueue(options.queueDir, { outboundDir, mode: 0o700 });
  // The emptyDir comes 0777: the runner (uid 0, the directory's owner) writes
  // there; a command must not.
  Deno.chmodSync(outboundDir, 0o700);
  makeChannelDir(options.channelDir);
  const queue = Queue.open(options.queueDir, {
    outboundDir,
    ...(options.pollMs === undefined ? {} : { pollMs: options.pollMs }),
  });
  const readyTimeoutMs = options.readyTimeoutMs ?? 60_000;
  // What the last ensure found damaged: it lasts as long as this pod.
  let damage: string | undefined;
  const ensure = async (trouble?: RunnerTrouble): Promise<void | false> => {
    // The kubelet restarts a runner that exited; the agent only waits for it.
    const deadline = Date.now() + readyTimeoutMs;
    let judged = queue.liveness();
    if (trouble !== undefined && trouble !== "none" && judged.state === "alive") return false;
    while (judged.state !== "alive") {
      // Nothing in the pod heals it: refused at once, never waited out.
      if (judged.state === "damaged") {
        damage = judged.detail;
        throw damagedError(judged.detail);
      }
      if (Date.now() >= deadline) {
        throw new RunnerError(
          `The runner container does not serve the queue after ${readyTimeoutMs} ms: ${judged.detail}`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
      judged = queue.liveness();
    }
  };
  const backend = {
    queue,
    config: options.config,
    channelDir: options.channelDir,
    ensure,
    submit: async (request: SubmitOptions): Promise<string> => {
      await ensure();
      return await queue.submit(request);
    },
    close: () => queue.close(),
  };
  const sandbox = Object.assign(backend, processesOf(backend));
  return Object.assign(sandbox, { files: sandboxFiles(sandbox), damaged: () => damage });
}

function damagedError(detail: string): RunnerError {
  return new RunnerError(
    `The sandbox's queue cannot be served in this pod (${detail}): its pod is being replaced, call again in a few seconds`,
  );
}
