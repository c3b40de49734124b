/**
 * The host backend: the runner as a child process on the host filesystem.
 * For tests, doctor and development. It is NOT a sandbox: the command runs
 * with the host user's rights. Nothing falls back to it; it is only used when
 * asked for by name (`--backend host`).
 *
 * @module
 */
import { join } from "./path.ts";
import { RunnerError } from "./errors.ts";
import { EXIT_LOCKED } from "./exit_codes.ts";
import { Queue } from "./queue/queue.ts";
import type { Backend } from "./queue/backend.ts";
import { runnerArgs, selfCommand } from "./config/self.ts";

/** Options for {@linkcode openHostBackend}. */
export interface HostBackendOptions {
  /** Workspace root for commands; default: the queue directory's `workspace` sibling. */
  workspace?: string;
  /** The runner exits after this long idle (seconds); 0 never. Default 60. */
  idleExitSeconds?: number;
  /** Fallback poll interval. */
  pollMs?: number;
  /** Runner concurrency. */
  concurrency?: number;
}

/**
 * Opens (creating if needed) a queue on the host and a backend that starts
 * a detached runner process for it on demand.
 *
 * @param queueDir The queue directory.
 * @param options Workspace, idle exit and polling.
 * @returns The backend.
 */
export function openHostBackend(queueDir: string, options: HostBackendOptions = {}): Backend {
  const queue = Queue.open(queueDir, {
    create: true,
    ...(options.pollMs === undefined ? {} : { pollMs: options.pollMs }),
  });
  const workspace = options.workspace ?? join(queueDir, "..", "workspace");
  Deno.mkdirSync(workspace, { recursive: true });
  let starting: Promise<void> | undefined;
  const ensure = (): Promise<void> => {
    starting ??= ensureHostRunner(queue, { ...options, workspace }).finally(() => {
      starting = undefined;
    });
    return starting;
  };
  return {
    queue,
    ensure,
    submit: async (request) => {
      await ensure();
      return await queue.submit(request);
    },
    close: () => queue.close(),
  };
}

/**
 * Whether a live runner serves the queue, by this host's own judgement
 * (see {@linkcode Queue.liveness}).
 *
 * @param queue The queue.
 * @returns True when the runner is judged alive.
 */
export function runnerAlive(queue: Queue): boolean {
  return queue.liveness().state === "alive";
}

async function ensureHostRunner(
  queue: Queue,
  options: HostBackendOptions & { workspace: string },
): Promise<void> {
  const judged = queue.liveness();
  if (judged.state === "alive") return;
  const before = judged.beat;
  const self = selfCommand();
  const args = runnerArgs(queue.paths.dir, {
    workspace: options.workspace,
    log: join(queue.paths.outboundDir, "runner.log"),
    idleExitSeconds: options.idleExitSeconds ?? 60,
    pollMs: options.pollMs,
    concurrency: options.concurrency,
  });
  // Detached: the runner outlives this host process, so a restarted host can
  // re-attach to its requests by id.
  const child = new Deno.Command(self.executable, {
    args,
    stdin: "null",
    stdout: "null",
    stderr: "null",
    detached: true,
  }).spawn();
  child.unref();
  let done: Deno.CommandStatus | undefined;
  const exited = child.status.then((status) => (done = status));
  const deadline = Date.now() + 15_000;
  while (Date.now() < deadline) {
    const beat = queue.heartbeat();
    if (
      beat !== undefined && beat.state === "running" && beat.bootId !== before?.bootId &&
      runnerAlive(queue)
    ) return;
    // Woken early by the child's exit, never again by an exit already seen.
    await Promise.race([
      ...(done === undefined ? [exited] : []),
      new Promise<void>((resolve) => setTimeout(resolve, 20)),
    ]);
    // Lost the race to a runner another host started: use that one.
    if (done !== undefined && runnerAlive(queue)) return;
    // EXIT_LOCKED: another runner took the queue first; wait for its beat.
    if (done !== undefined && done.code !== EXIT_LOCKED) {
      throw new RunnerError(
        `Runner for queue '${queue.paths.dir}' exited with code ${done.code}; see '${
          join(queue.paths.outboundDir, "runner.log")
        }'`,
      );
    }
  }
  throw new RunnerError(`Runner for queue '${queue.paths.dir}' did not start within 15 s`);
}
