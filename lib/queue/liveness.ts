/**
 * The one judgement of whether a runner serves its queue. `exec`'s wait, the
 * warm path, `ps`, `sweep` and the running cap all ask this module, and only
 * this module.
 *
 * A runner is alive while its heartbeat file keeps changing by the kernel's
 * clock, which is the host's (see `heartbeat_file.ts`): the last change no
 * older than {@linkcode STALE_AFTER_MS}. What the runner writes in the beat
 * (its time, its boot id) is never evidence of liveness: a frozen runner
 * cannot change the file, whatever it wrote last, and a process that has
 * just started judges as well as one that has watched for minutes.
 *
 * @module
 */
import * as z from "../schema.ts";
import { SandboxFileError } from "../errors.ts";
import { type Libc, libc } from "../libc.ts";
import { type Heartbeat, HEARTBEAT_INTERVAL_MS, type RequestState } from "./protocol.ts";
import { HEARTBEAT_FILE_BYTES } from "./heartbeat_file.ts";
import { openSandboxName, readAll } from "./sandbox_file.ts";

/** How long the heartbeat may stay unchanged before the runner is dead: three beats. */
export const STALE_AFTER_MS = 3 * HEARTBEAT_INTERVAL_MS;

/** What is wrong with a runner, as a waiting host's `revive` is told. */
export type RunnerTrouble = "none" | "exited" | "stale" | "locked" | "damaged";

/** The host's judgement of a runner. */
export interface Liveness {
  /** `alive`, or what is wrong. */
  state: "alive" | RunnerTrouble;
  /** One line for the user. */
  detail: string;
  /** The heartbeat, when the file holds a valid one. */
  beat?: Heartbeat;
  /** When the heartbeat last changed by the host's clock (epoch ms), when there is one. */
  changedAt?: number;
}

/** Options for {@linkcode judgeRunner}. */
export interface JudgeRunnerOptions {
  /** The queue, as messages name it. */
  queue: string;
  /** The host's time (epoch ms); default now. */
  now?: number;
}

/**
 * Judges a runner by its heartbeat file.
 *
 * @param heartbeatPath The queue's `heartbeat.json`.
 * @param options The queue's name for messages, and the time.
 * @returns `alive`, `none` (no heartbeat file, or not a regular file), `exited` or
 *   `stale`, with a one-line detail.
 */
export function judgeRunner(heartbeatPath: string, options: JudgeRunnerOptions): Liveness {
  const now = options.now ?? Date.now();
  const observed = readHeartbeatFile(heartbeatPath);
  if (observed === undefined || observed.changedAt === 0) {
    return {
      state: "none",
      detail: observed === undefined
        ? `No runner has served queue '${options.queue}' yet`
        : `The runner of queue '${options.queue}' left no valid heartbeat`,
    };
  }
  // The kernel's word decides; what the file says only adds the beat. A beat
  // that does not parse (half-written, or a forger's) in a file that keeps
  // changing is a runner that runs: only a change time can make it dead.
  const beat = observed.beat;
  // The latest the change can have happened (rounded up), and never later than now.
  const changedAt = Math.min(observed.changedAt, now);
  const seen = { changedAt, ...(beat === undefined ? {} : { beat }) };
  if (beat?.state === "exited") {
    return { state: "exited", detail: `The runner of queue '${options.queue}' exited`, ...seen };
  }
  const still = now - changedAt;
  if (still > STALE_AFTER_MS) {
    return {
      state: "stale",
      detail: `The runner of queue '${options.queue}' stopped beating: no heartbeat for ${
        Math.round(still / 1000)
      } s`,
      ...seen,
    };
  }
  return { state: "alive", detail: "alive", ...seen };
}

/**
 * How long a runner that beats may leave a request untaken (no state row)
 * before it is judged not to serve: five beats. An honest runner takes every
 * request it reads at once, queued behind others or not, within a poll.
 */
export const TAKE_WITHIN_MS = 5 * HEARTBEAT_INTERVAL_MS;

/** How long past its time limit a started request may go without a result: the kill and the last commit. */
export const RESULT_GRACE_MS = 30_000;

/** What a waiting host knows of one request, all by its own clock. */
export interface RequestProgress {
  /** The request. */
  id: string;
  /** Its state as the runner reports it. */
  state: RequestState;
  /** Since when the runner could have taken it: submitted, and this boot judged alive. */
  takeableSince: number;
  /** When this host first saw it started, if it has. */
  startedSeenAt?: number;
  /** Its run-time limit, if it has one. */
  timeoutMs?: number;
}

/**
 * Judges whether a runner that beats serves a request: a request it leaves
 * untaken for {@linkcode TAKE_WITHIN_MS}, or started and without a result
 * {@linkcode RESULT_GRACE_MS} past its own time limit, is one it does not
 * serve (wedged, or lying), and the runner is as dead as a stale one. A
 * started request without a time limit is never judged: a long command and
 * a lie look the same.
 *
 * @param progress The request as the host saw it.
 * @param options The queue's name for messages, and the time.
 * @returns A `stale` judgement, or undefined while the request progresses.
 */
export function judgeProgress(
  progress: RequestProgress,
  options: JudgeRunnerOptions,
): (Liveness & { state: "stale" }) | undefined {
  const now = options.now ?? Date.now();
  const waited = now - progress.takeableSince;
  if (progress.state === "queued" && waited > TAKE_WITHIN_MS) {
    return {
      state: "stale",
      detail:
        `The runner of queue '${options.queue}' beats but has not taken request '${progress.id}' in ${
          Math.round(waited / 1000)
        } s`,
    };
  }
  const { startedSeenAt, timeoutMs } = progress;
  if (progress.state !== "started" || startedSeenAt === undefined || timeoutMs === undefined) {
    return undefined;
  }
  const running = now - startedSeenAt;
  if (running <= timeoutMs + RESULT_GRACE_MS) return undefined;
  return {
    state: "stale",
    detail:
      `The runner of queue '${options.queue}' has reported no result for request '${progress.id}' ${
        Math.round(running / 1000)
      } s after it started, past its ${Math.round(timeoutMs / 1000)} s limit`,
  };
}

const heartbeatSchema: z.ZodMiniType<Heartbeat> = z.object({
  runnerId: z.string().check(z.minLength(1), z.maxLength(128)),
  bootId: z.string().check(z.minLength(1), z.maxLength(128)),
  seq: z.int().check(z.minimum(0)),
  time: z.int().check(z.minimum(0)),
  state: z.enum(["running", "exited"]),
});

/** A heartbeat as the host found it. */
export interface ObservedBeat {
  /** The beat, validated; undefined when the file holds none (malformed, oversized, not a file). */
  beat: Heartbeat | undefined;
  /**
   * When the file last changed, by the kernel's clock (epoch ms, rounded up:
   * Deno reports the inode change time in whole seconds).
   */
  changedAt: number;
}

/**
 * Reads the heartbeat file the way the host reads any name the sandbox can
 * write: no link followed, no FIFO blocked on, at most
 * {@linkcode HEARTBEAT_FILE_BYTES} read, the content validated.
 *
 * @param path The heartbeat file.
 * @returns The beat and when it changed; undefined when there is no file.
 */
export function readHeartbeatFile(path: string): ObservedBeat | undefined {
  const lib = libc();
  if (lib === undefined) return undefined;
  let opened: { fd: number; info: Deno.FileInfo };
  try {
    opened = openSandboxName(lib, path);
  } catch (error) {
    if (error instanceof SandboxFileError && error.problem === "missing") return undefined;
    // A link, FIFO or socket under the name: no beat, and no time to judge by.
    return { beat: undefined, changedAt: 0 };
  }
  try {
    return { beat: parse(lib, opened), changedAt: changedAt(opened.info) };
  } finally {
    lib.close(opened.fd);
  }
}

/** Reads of a beat that does not parse, before it counts as none: one may meet a rewrite. */
const READS = 3;

function parse(lib: Libc, opened: { fd: number; info: Deno.FileInfo }): Heartbeat | undefined {
  const size = opened.info.size;
  if (size === 0 || size > HEARTBEAT_FILE_BYTES) return undefined;
  for (let read = 0; read < READS; read++) {
    try {
      const parsed = heartbeatSchema.safeParse(
        JSON.parse(new TextDecoder().decode(readAll(lib, opened.fd, size))),
      );
      if (parsed.success) return parsed.data;
    } catch {
      // Half-written, or not a beat: read again.
    }
  }
  return undefined;
}

function changedAt(info: Deno.FileInfo): number {
  const ctime = info.ctime?.getTime();
  return ctime === undefined ? 0 : ctime + 999;
}
