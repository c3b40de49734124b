/**
 * A `waffle runner` child process for benchmarks: started the way the host
 * backend starts it (`selfCommand()` + `runner --queue … --workspace …`),
 * but attached, so the benchmark can stop it and knows its pid.
 *
 * @module
 */
import { join } from "node:path";
import { runnerArgs, selfCommand } from "../lib/config/self.ts";
import { Queue } from "../lib/queue/queue.ts";

/** Options for {@linkcode startBenchRunner}. */
export interface BenchRunnerOptions {
  /** Workspace root (created when missing). */
  workspace: string;
  /** `--concurrency`; the runner's default (1) when absent. */
  concurrency?: number;
  /** `--poll-ms`; the runner's default when absent. */
  pollMs?: number;
  /** Safety net should the benchmark die without stopping it. Default 120 s. */
  idleExitSeconds?: number;
  /** How long to wait for the first heartbeat. Default 20 s. */
  readyTimeoutMs?: number;
}

/** A started runner. */
export interface BenchRunner {
  /** The runner's pid. */
  readonly pid: number;
  /** The runner's log file (its `console.error` output). */
  readonly log: string;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves with the exit status. */
  stop(graceMs?: number): Promise<Deno.CommandStatus>;
}

/**
 * Starts a runner on an existing queue directory and waits until it
 * heartbeats as running.
 *
 * @param queueDir The queue directory (created by the host side first).
 * @param options Workspace, concurrency and polling.
 * @returns The running process.
 * @throws {Error} When it exits early or does not heartbeat in time.
 */
export async function startBenchRunner(
  queueDir: string,
  options: BenchRunnerOptions,
): Promise<BenchRunner> {
  await Deno.mkdir(options.workspace, { recursive: true });
  const self = selfCommand();
  const log = join(queueDir, "runner.log");
  const probe = Queue.open(queueDir);
  const before = probe.heartbeat()?.bootId;
  const child = new Deno.Command(self.executable, {
    args: runnerArgs(queueDir, {
      ...options,
      log,
      idleExitSeconds: options.idleExitSeconds ?? 120,
    }),
    stdin: "null",
    // stdout stays clean for `--json`; diagnostics go to the log file.
    stdout: "null",
    stderr: "null",
  }).spawn();
  let status: Deno.CommandStatus | undefined;
  const exited = child.status.then((value) => (status = value));
  try {
    const deadline = Date.now() + (options.readyTimeoutMs ?? 20_000);
    while (true) {
      const beat = probe.heartbeat();
      if (beat !== undefined && beat.bootId !== before && beat.state === "running") break;
      if (status !== undefined) {
        throw new Error(`Runner exited early with code ${status.code}; see '${log}'`);
      }
      if (Date.now() > deadline) throw new Error(`Runner did not heartbeat in time; see '${log}'`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  } catch (error) {
    killQuietly(child, "SIGKILL");
    await exited;
    throw error;
  } finally {
    probe.close();
  }
  const stop = async (graceMs = 5000): Promise<Deno.CommandStatus> => {
    if (status !== undefined) return status;
    killQuietly(child, "SIGTERM");
    const timer = setTimeout(() => killQuietly(child, "SIGKILL"), graceMs);
    try {
      return await exited;
    } finally {
      clearTimeout(timer);
    }
  };
  return { pid: child.pid, log, stop };
}

function killQuietly(child: Deno.ChildProcess, signal: Deno.Signal): void {
  try {
    child.kill(signal);
  } catch {
    // Already gone.
  }
}
