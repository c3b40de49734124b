/**
 * One-call command execution on a sandbox: {@linkcode runIn} (the whole
 * result at once) and {@linkcode spawnIn} (a process whose stdin, stdout and
 * stderr stream while it runs). `openSandbox` attaches both as
 * `sandbox.run` and `sandbox.spawn`.
 *
 * Commands are argv arrays, never a shell line: for a shell, pass
 * `["sh", "-c", "echo $HOME | wc -c"]`.
 *
 * @example
 * ```ts ignore
 * const sandbox = openSandbox("alice");
 * const { exitCode, stdout } = await sandbox.run(["sh", "-c", "echo hi"]);
 * const cat = await sandbox.spawn(["cat"]);
 * ```
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import type { Backend } from "../queue/backend.ts";
import type { RunnerTrouble } from "../queue/liveness.ts";
import {
  type ExecResult,
  MAX_OUTPUT_CAP,
  MAX_STDIN_BYTES,
  type TtySize,
} from "../queue/protocol.ts";
import { QueueSession } from "../queue/session.ts";
import { envNameSchema } from "../env_name.ts";

/** What {@linkcode runIn} and {@linkcode spawnIn} share. */
export interface ProcessOptions {
  /** Working directory inside the workspace (relative to it, or absolute inside it). */
  cwd?: string;
  /** Extra environment variables; nothing of the host's environment is passed. */
  env?: Record<string, string>;
  /** Kill the command after this many milliseconds (`timedOut` is then true). */
  timeoutMs?: number;
  /** Aborting it cancels the command (`cancelled` is then true). */
  signal?: AbortSignal;
}

/** Options of {@linkcode runIn} (`sandbox.run`). */
export interface RunOptions extends ProcessOptions {
  /** The command's stdin (a string is sent as UTF-8), at most 16 MiB; closed when absent. */
  stdin?: string | Uint8Array;
  /** Per-stream output cap in bytes (default 1 MiB, at most 64 MiB); past it output is dropped. */
  outputCap?: number;
  /** `"text"` (default): stdout and stderr as UTF-8 strings; `"bytes"`: as `Uint8Array`s. */
  encoding?: "text" | "bytes";
}

/** {@linkcode RunOptions} asking for the output as bytes. */
export interface RunBytesOptions extends RunOptions {
  /** The output as `Uint8Array`s. */
  encoding: "bytes";
}

/** How a command ended, without its output. */
export interface ProcessStatus {
  /** The request's id in the sandbox's queue. */
  requestId: string;
  /** Exit code; 128+n for death by signal n; 126/127 when it could not run; null when it never ran. */
  exitCode: number | null;
  /** Signal name (`"SIGKILL"`) when the command died of a signal, else null. */
  signal: string | null;
  /** True when the exit code is 0 and nothing stopped the command. */
  success: boolean;
  /** Killed because it ran past `timeoutMs`. */
  timedOut: boolean;
  /** Stopped by `kill()` or the abort signal. */
  cancelled: boolean;
  /** The runner died or was stopped while the command ran (it is never re-run). */
  interrupted: boolean;
  /** Either stream went over the output cap (`run` only; `spawn` output is unbounded). */
  truncated: boolean;
  /** Stdout went over the output cap. */
  stdoutTruncated: boolean;
  /** Stderr went over the output cap. */
  stderrTruncated: boolean;
  /** Total bytes the command wrote to stdout, including any dropped past the cap. */
  stdoutBytes: number;
  /** Total bytes the command wrote to stderr, including any dropped past the cap. */
  stderrBytes: number;
  /** How long the command ran, in milliseconds. */
  durationMs: number;
  /** Why the command could not run or was stopped, else null. */
  error: string | null;
}

/** The result of {@linkcode runIn}: the status plus the output as strings. */
export interface RunResult extends ProcessStatus {
  /** Stdout decoded as UTF-8 (invalid bytes become U+FFFD). */
  stdout: string;
  /** Stderr decoded as UTF-8. */
  stderr: string;
}

/** The result of {@linkcode runIn} with `encoding: "bytes"`. */
export interface RunBytesResult extends ProcessStatus {
  /** Stdout, exactly as written (up to the cap). */
  stdout: Uint8Array;
  /** Stderr, exactly as written (up to the cap). */
  stderr: Uint8Array;
}

/** Options of {@linkcode spawnIn} (`sandbox.spawn`). */
export interface SpawnOptions extends ProcessOptions {
  /** The runner ends the process when this host stops renewing its lease for this long (ms). */
  leaseMs?: number;
  /** The runner ends the process after this long with no input and no output (ms). */
  idleMs?: number;
  /**
   * Run on a terminal of this size (rows and columns, 1 to 4096): the command's
   * stdin, stdout and stderr are the terminal, its output comes on `stdout`,
   * and `resize()` changes the size.
   */
  tty?: TtySize;
  /**
   * The process outlives this host: its input and output go through the
   * queue's rows (not a socket that dies with the host), and another host
   * takes it over with `sandbox.attach(id)` while its lease holds. Give it
   * a lease long enough for the host to come back (`leaseMs`).
   */
  detached?: boolean;
}

/**
 * A command running in the sandbox. Read (or cancel) both `stdout` and
 * `stderr`: each buffers at most 1 MiB unread, past which the command's
 * output waits, as with a pipe. Close `stdin` when the command reads it to
 * its end (`cat`, `wc`).
 */
export interface SandboxProcess extends AsyncDisposable {
  /** The request's id in the sandbox's queue. */
  readonly id: string;
  /** The command's stdin; `close()` it to send end-of-file. */
  readonly stdin: WritableStream<Uint8Array>;
  /** The command's stdout, streamed while it runs. */
  readonly stdout: ReadableStream<Uint8Array>;
  /** The command's stderr, streamed while it runs. */
  readonly stderr: ReadableStream<Uint8Array>;
  /** Resolves once the command has ended and its output was read. */
  readonly status: Promise<ProcessStatus>;
  /** Kills the command's process tree (`status` then says `cancelled`). */
  kill(): Promise<void>;
  /**
   * Sets the terminal's size (its foreground process group gets SIGWINCH).
   *
   * @param size Rows and columns, 1 to 4096.
   * @throws {UsageError} When the process has no terminal (no `tty` option) or
   *   the size is out of range.
   */
  resize(size: TtySize): Promise<void>;
}

/** The methods `openSandbox` attaches to a sandbox. */
export interface SandboxProcesses {
  /**
   * Runs a command to its end and returns its status and output (strings).
   *
   * @param argv Program and arguments; no implicit shell (`["sh", "-c", line]` for one).
   * @param options Stdin, cwd, env, timeout, output cap and encoding.
   * @returns The status with stdout and stderr.
   * @throws {UsageError} On invalid arguments (nothing is run).
   */
  run(argv: string[], options?: RunOptions & { encoding?: "text" }): Promise<RunResult>;
  /**
   * Runs a command to its end and returns its status and output (bytes).
   *
   * @param argv Program and arguments; no implicit shell.
   * @param options `encoding: "bytes"` and the other {@linkcode RunOptions}.
   * @returns The status with stdout and stderr as bytes.
   * @throws {UsageError} On invalid arguments (nothing is run).
   */
  run(argv: string[], options: RunBytesOptions): Promise<RunBytesResult>;
  /**
   * Starts a command whose stdin, stdout and stderr stream while it runs.
   *
   * @param argv Program and arguments; no implicit shell.
   * @param options Cwd, env, timeout and lease.
   * @returns The running process.
   * @throws {UsageError} On invalid arguments (nothing is run).
   */
  spawn(argv: string[], options?: SpawnOptions): Promise<SandboxProcess>;
  /**
   * Takes over a process another host spawned with `detached: true`.
   *
   * @param id The process's id.
   * @returns The running process.
   * @throws {UsageError} When `id` is no detached process of this sandbox.
   */
  attach(id: string): SandboxProcess;
}

const RUN_KEYS = ["cwd", "env", "timeoutMs", "signal", "stdin", "outputCap", "encoding"];
const SPAWN_KEYS = ["cwd", "env", "timeoutMs", "signal", "leaseMs", "idleMs", "tty", "detached"];
/** The largest side of a terminal, as the queue takes it. */
const MAX_TTY_SIDE = 4096;
/** Unread output each of a spawned process's streams holds before the command waits. */
const STREAM_BUFFER_BYTES = 1024 * 1024;

/**
 * Runs a command through a backend's queue (submit, collect, ack) and
 * returns its status and output. `sandbox.run` is this on the sandbox.
 *
 * @param backend The sandbox (or any backend).
 * @param argv Program and arguments.
 * @param options Stdin, cwd, env, timeout, output cap and encoding.
 * @returns The status with the output as strings.
 * @throws {UsageError} On invalid arguments.
 */
export function runIn(
  backend: Backend,
  argv: string[],
  options?: RunOptions & { encoding?: "text" },
): Promise<RunResult>;
/**
 * Runs a command and returns its output as bytes.
 *
 * @param backend The sandbox (or any backend).
 * @param argv Program and arguments.
 * @param options `encoding: "bytes"` and the other options.
 * @returns The status with the output as bytes.
 * @throws {UsageError} On invalid arguments.
 */
export function runIn(
  backend: Backend,
  argv: string[],
  options: RunBytesOptions,
): Promise<RunBytesResult>;
/**
 * Runs a command (either encoding).
 *
 * @param backend The sandbox (or any backend).
 * @param argv Program and arguments.
 * @param options Stdin, cwd, env, timeout, output cap and encoding.
 * @returns The status with the output.
 * @throws {UsageError} On invalid arguments.
 */
export function runIn(
  backend: Backend,
  argv: string[],
  options?: RunOptions,
): Promise<RunResult | RunBytesResult>;
export async function runIn(
  backend: Backend,
  argv: string[],
  options: RunOptions = {},
): Promise<RunResult | RunBytesResult> {
  checkArgv("run", argv);
  checkOptions("run", options, RUN_KEYS);
  const { stdin, outputCap, encoding = "text", signal } = options;
  if (encoding !== "text" && encoding !== "bytes") {
    throw new UsageError(`Encoding must be "text" or "bytes", got ${quote(encoding)}`);
  }
  if (outputCap !== undefined) checkInt("outputCap", outputCap, MAX_OUTPUT_CAP);
  let input: Uint8Array | undefined;
  if (typeof stdin === "string") input = new TextEncoder().encode(stdin);
  else if (stdin instanceof Uint8Array) input = stdin;
  else if (stdin !== undefined) {
    throw new UsageError(`Stdin must be a string or a Uint8Array, got ${quote(stdin)}`);
  }
  if (input !== undefined && input.byteLength > MAX_STDIN_BYTES) {
    throw new UsageError(
      `Stdin of ${input.byteLength} bytes exceeds the ${MAX_STDIN_BYTES}-byte limit: use spawn() to stream it`,
    );
  }
  signal?.throwIfAborted();
  const id = await backend.submit({
    argv: [...argv],
    ...common(options),
    ...(input === undefined ? {} : { stdin: input }),
    ...(outputCap === undefined ? {} : { outputCap }),
  });
  const cancel = (): void => void backend.queue.cancel(id).catch(() => {});
  signal?.addEventListener("abort", cancel, { once: true });
  try {
    const { result, stdout, stderr } = await backend.queue.collect(id, {
      revive: reviver(backend),
    });
    const status = statusOf(result);
    if (encoding === "bytes") return { ...status, stdout, stderr };
    const decoder = new TextDecoder();
    return { ...status, stdout: decoder.decode(stdout), stderr: decoder.decode(stderr) };
  } finally {
    signal?.removeEventListener("abort", cancel);
    await backend.queue.ack(id).catch(() => {});
  }
}

/**
 * Starts a command as a queue session (stdin streamed with flow control,
 * output unbounded, the process may run on after its stdin ends).
 * `sandbox.spawn` is this on the sandbox.
 *
 * @param backend The sandbox (or any backend).
 * @param argv Program and arguments.
 * @param options Cwd, env, timeout, lease, idle limit and terminal.
 * @returns The running process.
 * @throws {UsageError} On invalid arguments.
 */
export async function spawnIn(
  backend: Backend,
  argv: string[],
  options: SpawnOptions = {},
): Promise<SandboxProcess> {
  checkArgv("spawn", argv);
  checkOptions("spawn", options, SPAWN_KEYS);
  const { leaseMs, idleMs, signal, detached } = options;
  if (leaseMs !== undefined) checkInt("leaseMs", leaseMs, 3600 * 1000, 1000);
  if (idleMs !== undefined) checkInt("idleMs", idleMs, 7 * 24 * 3600 * 1000);
  if (detached !== undefined && typeof detached !== "boolean") {
    throw new UsageError(`Detached must be a boolean, got ${quote(detached)}`);
  }
  const tty = options.tty === undefined ? undefined : checkTty("tty", options.tty);
  signal?.throwIfAborted();
  const wait = { revive: reviver(backend) };
  const session = await QueueSession.open(backend, {
    argv: [...argv],
    ...common(options),
    endGraceMs: 0,
    ...(leaseMs === undefined ? {} : { leaseMs }),
    ...(idleMs === undefined ? {} : { idleMs }),
    ...(tty === undefined ? {} : { tty }),
    // Rows outlive this host; a socket does not.
    ...(detached ? { channel: false } : {}),
  }, wait);
  return processOf(session, signal);
}

/**
 * Takes over a process another host spawned with `detached: true` (a
 * restarted server): its stdin, its output from what that host last read,
 * its status and its kill, as `spawn` gave them. Output the process wrote
 * while no host read it waited in the queue (at most a window, then the
 * process waited too): nothing is lost and nothing runs again.
 * `sandbox.attach` is this on the sandbox.
 *
 * @param backend The sandbox.
 * @param id The process's id (`SandboxProcess.id`).
 * @returns The running process.
 * @throws {UsageError} When `id` is no detached process of this sandbox.
 */
export function attachIn(backend: Backend, id: string): SandboxProcess {
  return processOf(QueueSession.attach(backend, id, { revive: reviver(backend) }), undefined);
}

// A session as the process `spawn` returns: its streams, status and kill.
function processOf(session: QueueSession, signal: AbortSignal | undefined): SandboxProcess {
  const kill = (): Promise<void> => session.cancel().catch(() => {});
  const onAbort = (): void => void kill();
  signal?.addEventListener("abort", onAbort, { once: true });
  const stdout = new OutputPipe();
  const stderr = new OutputPipe();
  const status = (async (): Promise<ProcessStatus> => {
    try {
      const output = session.output();
      let next = await output.next();
      while (!next.done) {
        await (next.value.stream === "stdout" ? stdout : stderr).push(next.value.data);
        next = await output.next();
      }
      stdout.end();
      stderr.end();
      return statusOf(next.value);
    } catch (error) {
      stdout.fail(error);
      stderr.fail(error);
      throw error;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      await session.close();
    }
  })();
  // Seen by whoever awaits `status`; never an unhandled rejection by itself.
  status.catch(() => {});
  let ended = false;
  const end = async (): Promise<void> => {
    if (ended) return;
    ended = true;
    await session.end();
  };
  const stdin = new WritableStream<Uint8Array>({
    write: async (chunk) => {
      if (!(chunk instanceof Uint8Array)) {
        throw new UsageError(`Stdin chunks must be Uint8Arrays, got ${quote(chunk)}`);
      }
      if (!ended) await session.write(chunk);
    },
    close: end,
    abort: end,
  });
  return {
    id: session.id,
    stdin,
    stdout: stdout.readable,
    stderr: stderr.readable,
    status,
    kill,
    resize: async (size) => {
      if (!session.tty) {
        throw new UsageError("Cannot resize a process without a terminal: spawn it with 'tty'");
      }
      await session.resize(checkTty("resize", size));
    },
    [Symbol.asyncDispose]: async () => {
      await kill();
      await stdout.readable.cancel().catch(() => {});
      await stderr.readable.cancel().catch(() => {});
      await status.catch(() => {});
    },
  };
}

/**
 * The `run` and `spawn` methods of a backend, as `openSandbox` attaches them.
 *
 * @param backend The sandbox.
 * @returns `run` and `spawn` bound to it.
 */
export function processesOf(backend: Backend): SandboxProcesses {
  return {
    run:
      ((argv: string[], options?: RunOptions) => runIn(backend, argv, options)) as SandboxProcesses[
        "run"
      ],
    spawn: (argv, options) => spawnIn(backend, argv, options),
    attach: (id) => attachIn(backend, id),
  };
}

// One stream of a spawned process: a byte-counted buffer the pump waits on when full.
class OutputPipe {
  readonly readable: ReadableStream<Uint8Array>;
  #controller!: ReadableStreamDefaultController<Uint8Array>;
  #room: (() => void) | undefined;
  #cancelled = false;

  constructor() {
    this.readable = new ReadableStream<Uint8Array>({
      start: (controller) => {
        this.#controller = controller;
      },
      pull: () => this.#wake(),
      cancel: () => {
        this.#cancelled = true;
        this.#wake();
      },
    }, { highWaterMark: STREAM_BUFFER_BYTES, size: (chunk) => chunk.byteLength });
  }

  async push(data: Uint8Array): Promise<void> {
    if (this.#cancelled) return;
    this.#controller.enqueue(data);
    while (!this.#cancelled && (this.#controller.desiredSize ?? 1) <= 0) {
      await new Promise<void>((resolve) => this.#room = resolve);
    }
  }

  end(): void {
    if (!this.#cancelled) this.#controller.close();
  }

  fail(error: unknown): void {
    if (!this.#cancelled) this.#controller.error(error);
  }

  #wake(): void {
    const room = this.#room;
    this.#room = undefined;
    room?.();
  }
}

function reviver(backend: Backend): (trouble: RunnerTrouble) => Promise<void | false> {
  return (trouble) => backend.ensure(trouble);
}

function common(options: ProcessOptions): { cwd?: string; env?: Record<string, string> } & {
  timeoutMs?: number;
} {
  const { cwd, env, timeoutMs } = options;
  if (cwd !== undefined && (typeof cwd !== "string" || cwd === "" || cwd.includes("\0"))) {
    throw new UsageError(`Cwd must be a non-empty path without NUL, got ${quote(cwd)}`);
  }
  if (env !== undefined) {
    if (typeof env !== "object" || env === null || Array.isArray(env)) {
      throw new UsageError(`Env must be an object of strings, got ${quote(env)}`);
    }
    for (const [name, value] of Object.entries(env)) {
      if (!envNameSchema.safeParse(name).success) {
        throw new UsageError(`Env name ${quote(name)} is not a valid variable name`);
      }
      if (typeof value !== "string" || value.includes("\0")) {
        throw new UsageError(
          `Env value of '${name}' must be a string without NUL, got ${quote(value)}`,
        );
      }
    }
  }
  if (timeoutMs !== undefined) checkInt("timeoutMs", timeoutMs, 7 * 24 * 3600 * 1000);
  return {
    ...(cwd === undefined ? {} : { cwd }),
    ...(env === undefined ? {} : { env: { ...env } }),
    ...(timeoutMs === undefined ? {} : { timeoutMs }),
  };
}

function checkArgv(method: string, argv: unknown): void {
  if (typeof argv === "string") {
    throw new UsageError(
      `Argv must be an array, not a string (no implicit shell: use ["sh", "-c", ${
        JSON.stringify(argv)
      }]), got ${quote(argv)}`,
    );
  }
  if (!Array.isArray(argv) || argv.length === 0) {
    throw new UsageError(`Argv of ${method}() must be a non-empty array, got ${quote(argv)}`);
  }
  const bad = argv.find((arg) => typeof arg !== "string" || arg.includes("\0"));
  if (bad !== undefined) {
    throw new UsageError(`Argv items must be strings without NUL, got ${quote(bad)}`);
  }
}

function checkOptions(method: string, options: unknown, keys: string[]): void {
  if (typeof options !== "object" || options === null || Array.isArray(options)) {
    throw new UsageError(`Options of ${method}() must be an object, got ${quote(options)}`);
  }
  const unknown = Object.keys(options).find((key) => !keys.includes(key));
  if (unknown !== undefined) {
    throw new UsageError(
      `Unknown ${method}() option '${unknown}' (known: ${keys.join(", ")})`,
    );
  }
}

function checkInt(name: string, value: unknown, max: number, min = 1): void {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    throw new UsageError(
      `Option ${name} must be an integer from ${min} to ${max}, got ${quote(value)}`,
    );
  }
}

function checkTty(name: string, size: unknown): TtySize {
  const { rows, cols } = (typeof size === "object" && size !== null ? size : {}) as Partial<
    TtySize
  >;
  const side = (value: unknown): boolean =>
    typeof value === "number" && Number.isInteger(value) && value >= 1 && value <= MAX_TTY_SIDE;
  if (!side(rows) || !side(cols)) {
    throw new UsageError(
      `Option ${name} must be { rows, cols } of integers from 1 to ${MAX_TTY_SIDE}, got ${
        quote(size)
      }`,
    );
  }
  return { rows: rows!, cols: cols! };
}

function statusOf(result: ExecResult): ProcessStatus {
  const stopped = result.timedOut || result.cancelled || result.interrupted;
  return {
    requestId: result.requestId,
    exitCode: result.exitCode,
    signal: result.signal,
    success: result.exitCode === 0 && !stopped && result.error === null,
    timedOut: result.timedOut,
    cancelled: result.cancelled,
    interrupted: result.interrupted,
    truncated: result.stdoutTruncated || result.stderrTruncated,
    stdoutTruncated: result.stdoutTruncated,
    stderrTruncated: result.stderrTruncated,
    stdoutBytes: result.stdoutBytes,
    stderrBytes: result.stderrBytes,
    durationMs: result.durationMs,
    error: result.error,
  };
}

// A value for an error message: strings in single quotes, others as JSON, all short.
function quote(value: unknown): string {
  let text: string;
  if (typeof value === "string") text = value;
  else if (value instanceof Uint8Array) text = `Uint8Array(${value.byteLength})`;
  else {
    try {
      text = JSON.stringify(value) ?? String(value);
    } catch {
      text = String(value);
    }
  }
  return `'${text.length > 80 ? `${text.slice(0, 77)}...` : text}'`;
}
