/**
 * The wire types of the queue: what the host writes into `inbound.db` and
 * what the runner writes into `outbound.db`. Both sides validate with these
 * schemas; the host treats everything from outbound.db as untrusted.
 *
 * @module
 */
import * as z from "../schema.ts";
import { envNameSchema } from "../env_name.ts";

export { SCHEMA_VERSION } from "./version.ts";
export { envNameSchema };

/** Largest single output chunk a runner may write, in bytes. */
export const MAX_CHUNK_BYTES = 64 * 1024;
/** Default cap on each of stdout and stderr, in bytes. */
export const DEFAULT_OUTPUT_CAP = 1024 * 1024;
/** Largest cap a request may ask for, in bytes. */
export const MAX_OUTPUT_CAP = 64 * 1024 * 1024;
/** Largest stdin a request may carry, in bytes. */
export const MAX_STDIN_BYTES = 16 * 1024 * 1024;
/** Largest error message accepted from the runner, in characters. */
export const MAX_ERROR_CHARS = 4096;
/** Largest piece of session input in one inbound row, in bytes. */
export const MAX_INPUT_CHUNK_BYTES = 64 * 1024;
/**
 * Session input rows the host may have written beyond the last one the runner
 * took for the process (`input_read` in `outbound.db`): 256 rows, at most 16 MiB.
 */
export const INPUT_WINDOW_ROWS = 256;
/**
 * Session output per stream the runner may have written and the host not yet
 * read: past it the runner stops reading the server's pipe until the host's
 * lease row says it caught up. It bounds `outbound.db` however long a session lives.
 */
export const SESSION_WINDOW_BYTES = 4 * 1024 * 1024;
/** A session channel's socket file name: random hex (short: a unix socket path holds 107 bytes). */
export const CHANNEL_SOCKET_PATTERN: RegExp = /^[0-9a-f]{16}\.s$/;
/** A session channel's token: 32 random bytes in hex. */
export const CHANNEL_TOKEN_PATTERN: RegExp = /^[0-9a-f]{64}$/;
/** Runner heartbeat interval. Hosts call a runner dead after three (see `liveness.ts`). */
export const HEARTBEAT_INTERVAL_MS = 2000;

const noNul = (value: string): boolean => !value.includes("\0");
/** A terminal's rows or columns. */
const ttySide = z.int().check(z.minimum(1), z.maximum(4096));

// The schemas are `@ignore`d in the docs: their types are zod's internals,
// which `deno doc` cannot show. The interfaces they are annotated with
// (`ExecPayload`, `ExecResult`, `Heartbeat`) document the shapes instead.

/**
 * The payload of an `exec` request, as stored in `inbound.db`.
 *
 * @ignore
 */
export const execPayloadSchema: z.ZodMiniType<ExecPayload> = z.object({
  /** Program and arguments; no implicit shell. */
  argv: z.array(
    z.string().check(z.maxLength(128 * 1024), z.refine(noNul, "NUL in argument")),
  ).check(z.minLength(1), z.maxLength(4096)),
  /** Working directory, relative to (or inside) the runner's workspace root. */
  cwd: z.optional(z.string().check(z.maxLength(4096), z.refine(noNul, "NUL in path"))),
  /** Extra environment; the runner starts from a minimal base, never the host's. */
  env: z.optional(
    z.record(
      envNameSchema,
      z.string().check(z.maxLength(128 * 1024), z.refine(noNul, "NUL in value")),
    ),
  ),
  /** Base64 stdin bytes; absent means stdin is closed. */
  stdin: z.optional(z.string().check(z.maxLength(Math.ceil(MAX_STDIN_BYTES / 3) * 4))),
  /** Run time limit in milliseconds, counted from start (clocks of host and sandbox may differ). */
  timeoutMs: z.optional(z.int().check(z.positive(), z.maximum(7 * 24 * 3600 * 1000))),
  /** Per-stream output cap in bytes. */
  outputCap: z.optional(z.int().check(z.positive(), z.maximum(MAX_OUTPUT_CAP))),
  /** Present for a session: stdin streamed from `input` rows, output unbounded. */
  session: z.optional(z.strictObject({
    idleMs: z.int().check(z.positive(), z.maximum(7 * 24 * 3600 * 1000)),
    leaseMs: z.int().check(z.minimum(1000), z.maximum(3600 * 1000)),
    makeCwd: z.optional(z.boolean()),
    endGraceMs: z.optional(z.int().check(z.minimum(0), z.maximum(7 * 24 * 3600 * 1000))),
    tty: z.optional(z.strictObject({ rows: ttySide, cols: ttySide })),
    channel: z.optional(z.strictObject({
      socket: z.string().check(z.regex(CHANNEL_SOCKET_PATTERN)),
      token: z.string().check(z.regex(CHANNEL_TOKEN_PATTERN)),
    })),
  })),
});

/** A validated `exec` payload. */
export interface ExecPayload {
  /** Program and arguments; no implicit shell. */
  argv: string[];
  /** Working directory, relative to (or inside) the runner's workspace root. */
  cwd?: string | undefined;
  /** Extra environment; the runner starts from a minimal base, never the host's. */
  env?: Record<string, string> | undefined;
  /** Base64 stdin bytes; absent means stdin is closed. */
  stdin?: string | undefined;
  /** Run time limit in milliseconds, counted from start (clocks of host and sandbox may differ). */
  timeoutMs?: number | undefined;
  /** Per-stream output cap in bytes. */
  outputCap?: number | undefined;
  /** Present for a session (see {@linkcode SessionSpec}). */
  session?: SessionSpec | undefined;
}

/**
 * A long-lived session: its stdin is streamed from the host's `input` rows
 * (a NULL row ends it), its output is unbounded in total but at most
 * {@linkcode SESSION_WINDOW_BYTES} unread per stream, and it ends when its
 * lease stops being renewed, when it is idle, or when the host cancels it.
 */
export interface SessionSpec {
  /** No input or output for this long ends the session. */
  idleMs: number;
  /** The host renews its lease row at least this often, or the session ends (runner's clock). */
  leaseMs: number;
  /** Create the working directory (inside the workspace) when missing. */
  makeCwd?: boolean | undefined;
  /**
   * After the end of its input the process gets this long to exit by itself
   * (default 2000 ms, for a server); 0 lets it run on (a command: `exec -i`).
   */
  endGraceMs?: number | undefined;
  /** Run on a terminal of this size (`waffle shell`); the host resizes it with `Queue.resize`. */
  tty?: TtySize | undefined;
  /**
   * Stream stdin and output over the host's socket instead of rows (see
   * `channel.ts`); the runner connects to it in its channel directory.
   */
  channel?: { socket: string; token: string } | undefined;
}

/** A terminal's window size. */
export interface TtySize {
  /** Rows. */
  rows: number;
  /** Columns. */
  cols: number;
}

/**
 * The final outcome of one request, written once into `outbound.db`.
 *
 * @ignore
 */
export const resultSchema: z.ZodMiniType<ExecResult> = z.object({
  requestId: z.string().check(z.minLength(1), z.maxLength(128)),
  /** Exit code; 128+n for death by signal n; 126/127 when it could not run; null when it never ran. */
  exitCode: z.nullable(z.int().check(z.minimum(0), z.maximum(255))),
  /** Signal name when the process died of a signal. */
  signal: z.nullable(z.string().check(z.regex(/^SIG[A-Z0-9]+$/), z.maxLength(16))),
  timedOut: z.boolean(),
  /** The runner died (or was stopped) while the command ran; it is never re-run. */
  interrupted: z.boolean(),
  cancelled: z.boolean(),
  stdoutTruncated: z.boolean(),
  stderrTruncated: z.boolean(),
  /** Total bytes the command wrote to each stream, including what was dropped. */
  stdoutBytes: z.int().check(z.minimum(0)),
  stderrBytes: z.int().check(z.minimum(0)),
  startedAt: z.nullable(z.int().check(z.minimum(0))),
  endedAt: z.int().check(z.minimum(0)),
  durationMs: z.number().check(z.minimum(0)),
  /** Why the command could not run or was stopped, for the user. */
  error: z.nullable(z.string().check(z.maxLength(MAX_ERROR_CHARS))),
});

/** A validated result row. */
export interface ExecResult {
  /** The request this result belongs to. */
  requestId: string;
  /** Exit code; 128+n for death by signal n; 126/127 when it could not run; null when it never ran. */
  exitCode: number | null;
  /** Signal name when the process died of a signal. */
  signal: string | null;
  /** Killed because it hit its `timeoutMs`. */
  timedOut: boolean;
  /** The runner died (or was stopped) while the command ran; it is never re-run. */
  interrupted: boolean;
  /** Stopped because the host cancelled the request. */
  cancelled: boolean;
  /** Stdout went over the output cap. */
  stdoutTruncated: boolean;
  /** Stderr went over the output cap. */
  stderrTruncated: boolean;
  /** Total bytes the command wrote to stdout, including what was dropped. */
  stdoutBytes: number;
  /** Total bytes the command wrote to stderr, including what was dropped. */
  stderrBytes: number;
  /** Epoch milliseconds (sandbox clock) just before spawning; null when it never ran. */
  startedAt: number | null;
  /** Epoch milliseconds (sandbox clock) when the request ended. */
  endedAt: number;
  /** How long the command ran, in milliseconds. */
  durationMs: number;
  /** Why the command could not run or was stopped, for the user. */
  error: string | null;
}

/** What {@linkcode notRunResult} records; everything else is null, false or 0. */
export interface NotRunFields {
  /** The runner stopped, or the queue was lost, before the command could end. */
  interrupted?: boolean;
  /** Cancelled by the host before it started. */
  cancelled?: boolean;
  /** Why it did not run, for the user. */
  error?: string | null;
  /** `EXIT_CANNOT_EXECUTE` or `EXIT_NOT_FOUND` when the program was rejected; else null. */
  exitCode?: number | null;
  /** When running it was attempted (epoch ms); null (the default) when it never was. */
  startedAt?: number | null;
  /** When it ended (epoch ms); default now. */
  endedAt?: number;
}

/**
 * The one builder of a result for a request that never ran to an exit
 * status: no output, no signal, nothing truncated. Used by the runner (a
 * request it could not start, or was stopped before) and by the host (a
 * request lost with its queue file).
 *
 * @param requestId The request.
 * @param fields What happened instead.
 * @returns A complete result.
 */
export function notRunResult(requestId: string, fields: NotRunFields = {}): ExecResult {
  const startedAt = fields.startedAt ?? null;
  const endedAt = fields.endedAt ?? Date.now();
  return {
    requestId,
    exitCode: fields.exitCode ?? null,
    signal: null,
    timedOut: false,
    interrupted: fields.interrupted ?? false,
    cancelled: fields.cancelled ?? false,
    stdoutTruncated: false,
    stderrTruncated: false,
    stdoutBytes: 0,
    stderrBytes: 0,
    startedAt,
    endedAt,
    durationMs: startedAt === null ? 0 : Math.max(0, endedAt - startedAt),
    error: fields.error ?? null,
  };
}

/** Which stream a chunk belongs to. */
export type StreamName = "stdout" | "stderr";

/** One piece of a request's output. */
export interface OutputChunk {
  /** The stream the bytes were written to. */
  stream: StreamName;
  /** Position within the stream, from 0 without gaps. */
  seq: number;
  /** At most {@linkcode MAX_CHUNK_BYTES} bytes. */
  data: Uint8Array;
}

/** A validated heartbeat. */
export interface Heartbeat {
  /** Which runner wrote it (by default its hostname). */
  runnerId: string;
  /** Random per runner start: a new one means the runner restarted. */
  bootId: string;
  /** Counts the beats of one boot. */
  seq: number;
  /** Epoch milliseconds of the beat by the sandbox's clock: for the record, never judged by. */
  time: number;
  /** `running`, or `exited` once the runner has decided to stop (idle exit, SIGTERM). */
  state: "running" | "exited";
}

/** Lifecycle of a request as the runner reports it. */
export type RequestState = "queued" | "accepted" | "started" | "done";
