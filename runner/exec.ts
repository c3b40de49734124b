/**
 * Runs one request's command: spawns it in its own session, streams and caps
 * its output, enforces the timeout and cancellation, and makes sure nothing
 * of its process tree outlives it.
 *
 * @module
 */
import { mark } from "../lib/trace.ts";
import { settlesWithin } from "../lib/async.ts";
import { EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, exitCodeOfSignal } from "../lib/exit_codes.ts";
import { MAX_CHUNK_BYTES, notRunResult, type StreamName } from "../lib/queue/protocol.ts";
import {
  DEFAULT_KILL_GRACE_MS,
  killTree,
  type KillTreeOptions,
  readProcStat,
} from "./process_tree.ts";
import { planSpawn, type Resolution, resolveProgram, ttySupported } from "./spawn.ts";
import type { Pty } from "./pty.ts";
import { quoteValue } from "./workspace.ts";
import { exists, isDirectory } from "../lib/fs.ts";

/** What to run. */
export interface ExecSpec {
  /** Request id; exported to the command as `WAFFLE_REQUEST_ID` by `buildEnv()`. */
  requestId: string;
  /** Program and arguments; no shell. */
  argv: string[];
  /** Absolute working directory (from `resolveCwd()`). */
  cwd: string;
  /** The complete environment (from `buildEnv()`); the runner's own is not inherited. */
  env: Record<string, string>;
  /**
   * Bytes written to stdin before it is closed, or a stream piped into it
   * (a session); null means stdin is closed from the start.
   */
  stdin: Uint8Array | ReadableStream<Uint8Array> | null;
  /** Run time limit in milliseconds, counted from start. */
  timeoutMs?: number | undefined;
  /** Most bytes forwarded per stream; the rest is counted and dropped. */
  outputCap: number;
  /** Run the command as this uid and gid (the runner needs CAP_SETUID/CAP_SETGID). */
  user?: { uid: number; gid: number } | undefined;
  /**
   * Run on this terminal: its slave is the command's stdin, stdout and
   * stderr (all output is stdout), `stdin` is written to its master.
   */
  pty?: Pty | undefined;
}

/** How a command ended. */
export interface ExecOutcome {
  /** Exit code; 128+n for death by signal n; 126/127 when it could not run; null when it never ran. */
  exitCode: number | null;
  /** Name of the signal that killed the command, e.g. `SIGKILL`. */
  signal: string | null;
  /** Killed because it hit `timeoutMs`. */
  timedOut: boolean;
  /** Killed because the request was cancelled (abort reason `"cancel"`). */
  cancelled: boolean;
  /** Killed because the runner is stopping (abort reason `"interrupt"`). */
  interrupted: boolean;
  /** Stdout went over the cap. */
  stdoutTruncated: boolean;
  /** Stderr went over the cap. */
  stderrTruncated: boolean;
  /** Total bytes written to stdout, including those dropped. */
  stdoutBytes: number;
  /** Total bytes written to stderr, including those dropped. */
  stderrBytes: number;
  /** Epoch milliseconds just before spawning. */
  startedAt: number;
  /** Epoch milliseconds once the tree was dead and output drained. */
  endedAt: number;
  /** Why the command could not run or was stopped, for the user; null otherwise. */
  error: string | null;
}

/** Callbacks and controls for {@linkcode runCommand}. */
export interface RunOptions {
  /**
   * Receives output as it arrives, at most `MAX_CHUNK_BYTES` per call, in
   * order within each stream. The bytes are not reused by the caller side.
   * A returned promise holds the stream's reading until it settles (backpressure).
   */
  onOutput(stream: StreamName, data: Uint8Array): void | Promise<void>;
  /** Abort with reason `"cancel"` or `"interrupt"` (any other reason counts as cancel). */
  signal?: AbortSignal | undefined;
  /** Time between SIGTERM and SIGKILL when killing the tree; default 500 ms. */
  killGraceMs?: number | undefined;
  /** Also kill every adopted orphan of the runner; only when one request runs at a time. */
  claimOrphans?: boolean | undefined;
  /** Called with the root pid right after spawning. */
  onSpawn?: ((pid: number) => void) | undefined;
}

/** How long to wait for the pipes to hit EOF once the tree was killed. */
const DRAIN_MS = 1000;
/** How long to wait for the stdin writer once the tree was killed. */
const STDIN_SETTLE_MS = 100;

/** Linux signal numbers (x86-64 and arm64 agree on these). */
const SIGNAL_NUMBERS: Readonly<Record<string, number>> = {
  SIGHUP: 1,
  SIGINT: 2,
  SIGQUIT: 3,
  SIGILL: 4,
  SIGTRAP: 5,
  SIGABRT: 6,
  SIGIOT: 6,
  SIGBUS: 7,
  SIGFPE: 8,
  SIGKILL: 9,
  SIGUSR1: 10,
  SIGSEGV: 11,
  SIGUSR2: 12,
  SIGPIPE: 13,
  SIGALRM: 14,
  SIGTERM: 15,
  SIGSTKFLT: 16,
  SIGCHLD: 17,
  SIGCONT: 18,
  SIGSTOP: 19,
  SIGTSTP: 20,
  SIGTTIN: 21,
  SIGTTOU: 22,
  SIGURG: 23,
  SIGXCPU: 24,
  SIGXFSZ: 25,
  SIGVTALRM: 26,
  SIGPROF: 27,
  SIGWINCH: 28,
  SIGIO: 29,
  SIGPOLL: 29,
  SIGPWR: 30,
  SIGSYS: 31,
};

type StopKind = "timeout" | "cancel" | "interrupt" | "error";

// Pids spawned through Deno. Deno reaps these itself; the subreaper sweep
// and orphan claiming must leave them alone.
const spawned = new Set<number>();

/**
 * The pids of live processes the runner spawned through Deno (and that Deno
 * will reap). A live view: pass it to `reapOrphans()`.
 *
 * @returns The set, read-only.
 */
export function spawnedPids(): ReadonlySet<number> {
  return spawned;
}

/**
 * The Linux number of a signal.
 *
 * @param name A signal name such as `SIGTERM`.
 * @returns Its number, or undefined for an unknown name.
 */
export function signalNumber(name: string): number | undefined {
  return Object.hasOwn(SIGNAL_NUMBERS, name) ? SIGNAL_NUMBERS[name] : undefined;
}

/**
 * Runs one command to completion and kills whatever it leaves behind.
 *
 * The command runs in its own session and process group. When it exits,
 * times out, or is aborted, its whole tree (including `setsid`/double-fork
 * escapees, see `process_tree.ts`) is killed, and the call returns once the
 * tree is dead and the pipes are drained. It never throws: failures to start
 * are reported as exit code 127 (not found) or 126 (cannot execute).
 *
 * @param spec Program, directory, environment, stdin, timeout and output cap.
 * @param options Output callback, abort signal and kill settings.
 * @returns How the command ended.
 */
export async function runCommand(spec: ExecSpec, options: RunOptions): Promise<ExecOutcome> {
  const startedAt = Date.now();
  try {
    return await execute(spec, options, startedAt);
  } catch (error) {
    return notRun(startedAt, `Internal error while running the command: ${messageOf(error)}`);
  }
}

async function execute(
  spec: ExecSpec,
  options: RunOptions,
  startedAt: number,
): Promise<ExecOutcome> {
  const argv0 = spec.argv[0];
  if (argv0 === undefined) return notRun(startedAt, "Command is empty");
  const invalid = invalidInput(spec);
  if (invalid !== null) return notRun(startedAt, invalid);
  const abortSignal = options.signal;
  if (abortSignal?.aborted === true) {
    const kind = abortKind(abortSignal);
    return { ...notRun(startedAt, stopMessage(kind, spec)), ...stopFlags(kind) };
  }

  // Decided before spawning: the program's own exec happens in the spawn
  // helper or a wrapper (see spawn.ts).
  const program = resolveProgram(argv0, spec.cwd, spec.env, spec.user);
  if (!program.ok) return notExecutable(spec, argv0, program, startedAt);
  const pty = spec.pty;
  if (pty !== undefined && !ttySupported(spec.user)) {
    return notRun(startedAt, "A terminal needs waffle's spawn helper, which this sandbox lacks");
  }
  const plan = planSpawn(program.path, spec.argv.slice(1), spec.env, spec.user, {
    tty: pty?.slave,
  });
  let child: Deno.ChildProcess;
  try {
    child = new Deno.Command(plan.program, {
      args: plan.args,
      cwd: spec.cwd,
      env: plan.env,
      clearEnv: true,
      // On a terminal the helper opens the slave as all three.
      stdin: spec.stdin === null || pty !== undefined ? "null" : "piped",
      stdout: pty === undefined ? "piped" : "null",
      stderr: pty === undefined ? "piped" : "null",
      // Without helper or wrappers, Deno's own setsid() and uid/gid drop (it
      // forks the runner for them): the request gets its own session and
      // process group (pgid = pid), and another uid than the runner's, so the
      // command can neither signal the runner nor touch its queue files.
      // Supplementary groups are dropped either way.
      ...(plan.detached ? { detached: true } : {}),
      ...(plan.user === undefined ? {} : { uid: plan.user.uid, gid: plan.user.gid }),
    }).spawn();
  } catch (error) {
    return spawnFailed(spec, argv0, error, startedAt);
  }
  const pid = child.pid;
  mark("spawned");
  spawned.add(pid);
  // Read before yielding to the event loop, so Deno cannot have reaped it yet.
  const rootStartTime = readProcStat(pid)?.starttime;

  // An object, not `let`s: they are set from callbacks.
  const state: { stop: StopKind | null; failure: string | null; exited: boolean } = {
    stop: null,
    failure: null,
    exited: false,
  };
  const treeOptions: KillTreeOptions = {
    known: spawned,
    requestId: spec.requestId,
    claimOrphans: options.claimOrphans ?? false,
    rootStartTime,
    graceMs: options.killGraceMs ?? DEFAULT_KILL_GRACE_MS,
  };
  const kills: Promise<unknown>[] = [];
  const stop = (kind: StopKind): void => {
    if (state.exited || state.stop !== null) return;
    state.stop = kind;
    if (plan.sessionPending) killUnsettledRoot(pid, rootStartTime);
    kills.push(killTree(pid, treeOptions));
  };
  const fail = (message: string): void => {
    state.failure ??= message;
    stop("error");
  };

  let forwarding = true;
  const deliver = (stream: StreamName, data: Uint8Array): void | Promise<void> => {
    if (!forwarding) return;
    try {
      return options.onOutput(stream, data);
    } catch (error) {
      forwarding = false;
      fail(`Output handler failed: ${messageOf(error)}`);
    }
  };
  const stdout = startPump(
    pty?.output ?? child.stdout,
    spec.outputCap,
    (data) => deliver("stdout", data),
  );
  const stderr = startPump(
    pty === undefined ? child.stderr : new ReadableStream({ start: (c) => c.close() }),
    spec.outputCap,
    (data) => deliver("stderr", data),
  );
  const stdinDone = spec.stdin === null
    ? Promise.resolve()
    : spec.stdin instanceof ReadableStream
    ? pumpStdin(spec.stdin, pty?.input ?? child.stdin, { preventClose: pty !== undefined })
    : writeStdin(pty?.input ?? child.stdin, spec.stdin);

  let timer: ReturnType<typeof setTimeout> | undefined;
  if (spec.timeoutMs !== undefined) {
    const left = Math.max(0, spec.timeoutMs - (Date.now() - startedAt));
    timer = setTimeout(() => stop("timeout"), left);
  }
  const onAbort = (): void => stop(abortKind(abortSignal));
  abortSignal?.addEventListener("abort", onAbort, { once: true });
  try {
    options.onSpawn?.(pid);
  } catch (error) {
    fail(`Spawn handler failed: ${messageOf(error)}`);
  }

  let status: { code: number; signal: string | null } | null = null;
  try {
    status = await child.status;
  } catch (error) {
    status = realtimeSignalStatus(error);
    if (status === null) {
      state.failure ??= `Lost track of the command's exit status: ${messageOf(error)}`;
    }
  } finally {
    state.exited = true;
    spawned.delete(pid);
    clearTimeout(timer);
    abortSignal?.removeEventListener("abort", onAbort);
  }

  // The foreground is done: kill what it left behind (background children
  // holding the pipes, escapees), then drain. A kill already under way
  // (timeout, abort) finishes first; the sweep after it is cheap when empty.
  mark("command exited");
  await Promise.all(kills);
  await killTree(pid, treeOptions);
  mark("tree swept");
  if (!await settlesWithin(Promise.all([stdout.done, stderr.done]), DRAIN_MS)) {
    // Something we could not find or kill still holds a pipe open.
    await Promise.all([stdout.cancel(), stderr.cancel()]);
    await Promise.all([stdout.done, stderr.done]);
  }
  // Settles with EPIPE once the readers are dead; not awaited past the bound.
  await settlesWithin(stdinDone, STDIN_SETTLE_MS);
  mark("pipes drained");

  const signal = status?.signal ?? null;
  const number = signal === null ? undefined : signalNumber(signal);
  let exitCode = status?.code ?? null;
  if (status !== null && number !== undefined) exitCode = exitCodeOfSignal(number);
  return {
    exitCode,
    signal,
    ...stopFlags(state.stop),
    stdoutTruncated: stdout.stats.truncated,
    stderrTruncated: stderr.stats.truncated,
    stdoutBytes: stdout.stats.total,
    stderrBytes: stderr.stats.total,
    startedAt,
    endedAt: Date.now(),
    error: state.failure ?? (state.stop === null ? null : stopMessage(state.stop, spec)),
  };
}

interface PumpStats {
  total: number;
  forwarded: number;
  truncated: boolean;
}

interface Pump {
  stats: PumpStats;
  done: Promise<void>;
  cancel(): Promise<void>;
}

// Reads a pipe to EOF, forwarding pieces of at most MAX_CHUNK_BYTES until
// `cap` bytes were forwarded; keeps draining (and counting) past the cap so
// the command never blocks on a full pipe.
function startPump(
  stream: ReadableStream<Uint8Array>,
  cap: number,
  forward: (data: Uint8Array) => void | Promise<void>,
): Pump {
  const reader = stream.getReader();
  const stats: PumpStats = { total: 0, forwarded: 0, truncated: false };
  const done = (async (): Promise<void> => {
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        stats.total += value.byteLength;
        const take = Math.min(Math.max(0, cap - stats.forwarded), value.byteLength);
        if (take < value.byteLength) stats.truncated = true;
        stats.forwarded += take;
        for (let offset = 0; offset < take; offset += MAX_CHUNK_BYTES) {
          await forward(value.subarray(offset, Math.min(take, offset + MAX_CHUNK_BYTES)));
        }
      }
    } catch {
      // Cancelled, or the pipe failed: there is nothing more to read.
    }
  })();
  const cancel = async (): Promise<void> => {
    try {
      await reader.cancel();
    } catch {
      // Already closed.
    }
  };
  return { stats, done, cancel };
}

/**
 * A session's stdin into the process, one chunk written before the next is
 * read, so the source may lend one buffer for every chunk (a channel's
 * stdin does: no allocation per chunk). As `pipeTo` would: the end closes
 * the process's stdin (a terminal's stays open), a failed source aborts it,
 * and a process that stops reading cancels the source.
 */
async function pumpStdin(
  source: ReadableStream<Uint8Array>,
  dest: WritableStream<Uint8Array>,
  options: { preventClose: boolean },
): Promise<void> {
  const reader = source.getReader();
  const writer = dest.getWriter();
  try {
    while (true) {
      let next: ReadableStreamReadResult<Uint8Array>;
      try {
        next = await reader.read();
      } catch (error) {
        await writer.abort(error).catch(() => {});
        return;
      }
      if (next.done) {
        if (!options.preventClose) await writer.close();
        return;
      }
      await writer.write(next.value);
    }
  } catch {
    // EPIPE: the command exited or closed stdin; what is left is dropped.
    await reader.cancel().catch(() => {});
  } finally {
    reader.releaseLock();
    writer.releaseLock();
  }
}

async function writeStdin(stream: WritableStream<Uint8Array>, data: Uint8Array): Promise<void> {
  const writer = stream.getWriter();
  try {
    if (data.byteLength > 0) await writer.write(data);
    await writer.close();
  } catch {
    // EPIPE: the command exited or closed stdin without reading everything.
    // That is its choice, not an error.
  }
}

function invalidInput(spec: ExecSpec): string | null {
  for (const [index, arg] of spec.argv.entries()) {
    if (arg.includes("\0")) return `Argument ${index} ${quoteValue(arg)} contains a NUL byte`;
  }
  for (const [name, value] of Object.entries(spec.env)) {
    if (name.includes("\0") || name.includes("=") || name === "" || value.includes("\0")) {
      return `Environment variable ${quoteValue(name)} is invalid`;
    }
  }
  if (spec.cwd.includes("\0")) {
    return `Working directory ${quoteValue(spec.cwd)} contains a NUL byte`;
  }
  return null;
}

function abortKind(signal: AbortSignal | undefined): StopKind {
  return signal?.reason === "interrupt" ? "interrupt" : "cancel";
}

function stopFlags(
  kind: StopKind | null,
): Pick<ExecOutcome, "timedOut" | "cancelled" | "interrupted"> {
  return {
    timedOut: kind === "timeout",
    cancelled: kind === "cancel",
    interrupted: kind === "interrupt",
  };
}

function stopMessage(kind: StopKind, spec: ExecSpec): string {
  switch (kind) {
    case "timeout":
      return `Command timed out after ${spec.timeoutMs} ms`;
    case "cancel":
      return "Command was cancelled";
    case "interrupt":
      return "Command was interrupted because the runner is stopping";
    case "error":
      return "Command was stopped after an internal error";
  }
}

/**
 * The protocol's one not-run result, as an outcome: the caller adds the
 * request id and the duration back.
 *
 * @param startedAt When running it was attempted (epoch ms).
 * @param error Why it did not run.
 * @param exitCode `EXIT_CANNOT_EXECUTE` or `EXIT_NOT_FOUND` when the program was rejected.
 * @returns The outcome.
 */
export function notRun(
  startedAt: number,
  error: string,
  exitCode: number | null = null,
): ExecOutcome {
  const { requestId: _id, durationMs: _ms, ...outcome } = notRunResult("", {
    error,
    exitCode,
    startedAt,
  });
  return { ...outcome, startedAt };
}

// A wrapped root spends its first moments (before the helper or the setsid
// wrapper called setsid()) in the runner's session and group, where
// killTree() never looks. Nothing of the command has run yet then: SIGKILL
// the wrapper by pid. Still our unreaped child (the caller checked
// `exited`), so the pid cannot have been reused.
function killUnsettledRoot(pid: number, startTime: number | undefined): void {
  const stat = readProcStat(pid);
  if (stat === null || stat.sid === pid || stat.state === "Z") return;
  if (startTime !== undefined && stat.starttime !== startTime) return;
  try {
    Deno.kill(pid, "SIGKILL");
  } catch {
    // Exited meanwhile.
  }
}

// Not found or cannot execute, for a program resolveProgram() rejected.
function notExecutable(
  spec: ExecSpec,
  argv0: string,
  program: Exclude<Resolution, { ok: true }>,
  startedAt: number,
): ExecOutcome {
  if (!isDirectory(spec.cwd)) {
    return notRun(startedAt, `Working directory ${quoteValue(spec.cwd)} does not exist`);
  }
  if (program.notFound) {
    return notRun(startedAt, `Command not found: ${quoteValue(argv0)}`, EXIT_NOT_FOUND);
  }
  return notRun(
    startedAt,
    `Cannot execute ${quoteValue(argv0)}: ${program.reason}`,
    EXIT_CANNOT_EXECUTE,
  );
}

// Maps a spawn failure to not found or cannot execute, the way shells do.
function spawnFailed(
  spec: ExecSpec,
  argv0: string,
  error: unknown,
  startedAt: number,
): ExecOutcome {
  if (!isDirectory(spec.cwd)) {
    // Deno reports a vanished cwd as NotFound too; that is not "command not found".
    return notRun(startedAt, `Working directory ${quoteValue(spec.cwd)} does not exist`);
  }
  if (error instanceof Deno.errors.NotFound) {
    // execve() also says ENOENT when the file exists but its `#!` interpreter
    // (or ELF loader) does not.
    if (argv0.includes("/") && exists(commandPath(spec, argv0))) {
      return notRun(
        startedAt,
        `Cannot execute ${quoteValue(argv0)}: Its interpreter or loader was not found`,
        EXIT_CANNOT_EXECUTE,
      );
    }
    return notRun(startedAt, `Command not found: ${quoteValue(argv0)}`, EXIT_NOT_FOUND);
  }
  return notRun(
    startedAt,
    `Cannot execute ${quoteValue(argv0)}: ${execFailureReason(spec, argv0, error)}`,
    EXIT_CANNOT_EXECUTE,
  );
}

function execFailureReason(spec: ExecSpec, argv0: string, error: unknown): string {
  // execve() says EACCES for a directory; say what it is.
  if (argv0.includes("/") && isDirectory(commandPath(spec, argv0))) return "Is a directory";
  const code = typeof error === "object" && error !== null && "code" in error
    ? String(error.code)
    : "";
  switch (code) {
    case "EACCES":
      return "Permission denied";
    case "ENOEXEC":
      return "Exec format error";
    case "E2BIG":
      return "Argument list too long";
    case "ETXTBSY":
      return "Text file busy";
  }
  if (error instanceof Deno.errors.PermissionDenied) return "Permission denied";
  // "Failed to spawn 'x': Reason (os error 13)" -> "Reason"
  return messageOf(error).replace(/^Failed to spawn '.*?': /s, "").replace(
    / \(os error \d+\)$/,
    "",
  );
}

// Deno rejects `status` with "Invalid signal: 34" when a process dies of a
// real-time signal (it has no name for it). The process was reaped all the
// same; report it as SIGRT<n>, exit code 128+n.
function realtimeSignalStatus(error: unknown): { code: number; signal: string } | null {
  const match = /^Invalid signal: (\d+)$/.exec(messageOf(error));
  const number = Number(match?.[1]);
  if (match === null || !Number.isSafeInteger(number) || number < 32 || number > 64) return null;
  return { code: exitCodeOfSignal(number), signal: `SIGRT${number}` };
}

// A command given as a path is relative to the command's working directory.
function commandPath(spec: ExecSpec, argv0: string): string {
  return argv0.startsWith("/") ? argv0 : `${spec.cwd}/${argv0}`;
}

function messageOf(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  return message.split("\n")[0] ?? "";
}
