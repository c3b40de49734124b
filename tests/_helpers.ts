/**
 * Test helpers: temporary queues and real runner processes.
 *
 * @module
 */
import { join } from "node:path";
import { runnerArgs, selfCommand } from "../lib/config/self.ts";
import { Queue } from "../lib/queue/queue.ts";
import { RunnerQueue } from "../lib/queue/runner_queue.ts";

/** A temporary directory holding `queue/` and `workspace/`. */
export interface TempQueue {
  root: string;
  queueDir: string;
  workspace: string;
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Creates a queue directory (with both files: the host makes inbound.db, a
 * runner's first open makes outbound.db) and a workspace under a temp dir.
 *
 * @returns Paths; disposing removes the directory.
 */
export async function tempQueue(): Promise<TempQueue> {
  const root = await Deno.makeTempDir({ prefix: "waffle-test-" });
  const queueDir = join(root, "queue");
  const workspace = join(root, "workspace");
  await Deno.mkdir(workspace);
  Queue.open(queueDir, { create: true }).close();
  RunnerQueue.open(queueDir).close();
  return {
    root,
    queueDir,
    workspace,
    async [Symbol.asyncDispose](): Promise<void> {
      await Deno.remove(root, { recursive: true }).catch(() => {});
    },
  };
}

/** A runner started as a real child process (`waffle runner`). */
export interface RunnerProcess {
  child: Deno.ChildProcess;
  pid: number;
  /** Sends a signal and waits for the exit status. */
  stop(signal?: Deno.Signal): Promise<Deno.CommandStatus>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** Options for {@linkcode startRunner}. */
export interface StartRunnerOptions {
  workspace: string;
  idleExitSeconds?: number;
  concurrency?: number;
  pollMs?: number;
  /** Wait for a fresh heartbeat before returning (default true). */
  waitReady?: boolean;
}

/**
 * Starts `waffle runner` on a queue and waits for its first heartbeat.
 *
 * @param queueDir The queue directory.
 * @param options Runner flags.
 * @returns The process handle.
 */
export async function startRunner(
  queueDir: string,
  options: StartRunnerOptions,
): Promise<RunnerProcess> {
  const self = selfCommand();
  const queue = Queue.open(queueDir);
  const before = queue.heartbeat()?.bootId;
  const child = new Deno.Command(self.executable, {
    args: runnerArgs(queueDir, options),
    stdin: "null",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn();
  let status: Deno.CommandStatus | undefined;
  const exited = child.status.then((s) => (status = s));
  try {
    if (options.waitReady !== false) {
      const deadline = Date.now() + 20_000;
      while (true) {
        const beat = queue.heartbeat();
        if (beat !== undefined && beat.bootId !== before && beat.state === "running") break;
        if (status !== undefined) throw new Error(`Runner exited early with ${status.code}`);
        if (Date.now() > deadline) throw new Error("Runner did not heartbeat within 20 s");
        await delay(10);
      }
    }
  } finally {
    queue.close();
  }
  const stop = async (signal: Deno.Signal = "SIGTERM"): Promise<Deno.CommandStatus> => {
    if (status === undefined) {
      try {
        child.kill(signal);
      } catch {
        // Already gone.
      }
    }
    return await exited;
  };
  return {
    child,
    pid: child.pid,
    stop,
    [Symbol.asyncDispose]: async () => void (await stop("SIGKILL")),
  };
}

/**
 * Sleeps.
 *
 * @param ms Milliseconds.
 */
export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Polls until `check` returns true or the deadline passes.
 *
 * @param check The condition.
 * @param options Timeout and what to say on failure.
 */
export async function waitFor(
  check: () => boolean | Promise<boolean>,
  options: { timeoutMs?: number; what?: string } = {},
): Promise<void> {
  const deadline = Date.now() + (options.timeoutMs ?? 10_000);
  while (!(await check())) {
    if (Date.now() > deadline) {
      throw new Error(`Timed out waiting for ${options.what ?? "condition"}`);
    }
    await delay(10);
  }
}

/**
 * Whether a pid is alive (not a zombie).
 *
 * @param pid The process id.
 * @returns True when /proc shows it running.
 */
export function alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/** Heartbeats are declared stale after this gap (the library's, which doctor --deep applies). */
export { MAX_HEARTBEAT_GAP_MS } from "../lib/certify/heartbeat_observer.ts";

/** Text of bytes. */
export function text(bytes: Uint8Array): string {
  return new TextDecoder().decode(bytes);
}

/**
 * Runs a program as a child process, stdin from `options.stdin` (else none).
 *
 * @param command The program.
 * @param args Its arguments.
 * @param options stdin bytes, extra env, and a time bound (none by default).
 * @returns Exit code and output.
 */
export async function runProcess(
  command: string,
  args: string[],
  options: { stdin?: Uint8Array; env?: Record<string, string>; timeoutMs?: number } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const child = new Deno.Command(command, {
    args,
    stdin: options.stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
    ...(options.timeoutMs === undefined ? {} : { signal: AbortSignal.timeout(options.timeoutMs) }),
    ...(options.env === undefined ? {} : { env: options.env }),
  }).spawn();
  if (options.stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(options.stdin);
    await writer.close();
  }
  const out = await child.output();
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

/**
 * Runs the CLI from source as a child process.
 *
 * @param args CLI arguments.
 * @param options stdin bytes and extra env.
 * @returns Exit code and output.
 */
export function runCliProcess(
  args: string[],
  options: { stdin?: Uint8Array; env?: Record<string, string> } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const self = selfCommand();
  return runProcess(self.executable, [...self.prefix, ...args], options);
}

/**
 * Makes every test this module registers from now on carry `suffix` in its
 * name: a suite imported again under another setting (`hostile_pooled_test`)
 * is told apart from its first run in the report.
 *
 * @param suffix Appended to each name, e.g. " [pooled]".
 */
export function suffixTestNames(suffix: string): void {
  const register = Deno.test;
  Object.defineProperty(Deno, "test", {
    value: ((first: unknown, ...rest: unknown[]) => {
      if (typeof first === "string") {
        return (register as (...a: unknown[]) => void)(`${first}${suffix}`, ...rest);
      }
      const options = first as Deno.TestDefinition;
      // `Deno.test(options, fn)`: the name in the options, the function apart.
      if (typeof rest[0] === "function") {
        return (register as (...a: unknown[]) => void)(
          { ...options, name: `${options.name}${suffix}` },
          rest[0],
        );
      }
      return register({ ...options, name: `${options.name}${suffix}` });
    }) as typeof Deno.test,
  });
}
