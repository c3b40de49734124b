/**
 * The runner: serves one queue directory. It executes requests in submission
 * order (one at a time unless `concurrency` says otherwise), makes "started"
 * durable before each process starts, streams output in bounded chunks, and
 * writes exactly one result per request.
 *
 * @module
 */
import { concat } from "../lib/bytes.ts";
import { connectChannel, type RunnerChannel } from "../lib/queue/channel.ts";
import { SANDBOX_CHANNEL_DIR } from "../lib/config/sandbox_paths.ts";
import { openPty, type Pty, reservePtys } from "./pty.ts";
import { EGRESS_ENV_VARIABLE, EGRESS_SOCKET_VARIABLE } from "../lib/config/egress_paths.ts";
import { startEgressBridge } from "./egress_bridge.ts";
import { imageEnv, imageWorkdir as defaultWorkdir } from "./image_defaults.ts";
import { mark } from "../lib/trace.ts";
import { UsageError } from "../lib/errors.ts";
import { EXIT_RUNNER_FAILED } from "../lib/exit_codes.ts";
import { isBusyError, messageOf } from "../lib/queue/connection.ts";
import {
  DEFAULT_OUTPUT_CAP,
  type ExecResult,
  HEARTBEAT_INTERVAL_MS,
  MAX_CHUNK_BYTES,
  notRunResult,
  type StreamName,
} from "../lib/queue/protocol.ts";
import { type InboundRequest, RunnerQueue } from "../lib/queue/runner_queue.ts";
import { queuePaths } from "../lib/queue/schema.ts";
import { ChangeWatcher } from "../lib/queue/watch.ts";
import { type ExecOutcome, notRun, runCommand } from "./exec.ts";
import type { HeartbeatMessage } from "./heartbeat_worker.ts";
import { HEARTBEAT_BUNDLE } from "./worker_name.ts";
import { logLine } from "./log.ts";
import { acquireRunnerLock } from "./runner_lock.ts";
import { enableSubreaper, reapOrphans } from "./subreaper.ts";
import { spawnedPids } from "./exec.ts";
import { SessionFeed } from "./session.ts";
import { buildEnv, resolveCwd } from "./workspace.ts";

/** Options for {@linkcode runRunner}. */
export interface RunnerOptions {
  /** The queue directory (created by the host). */
  queueDir: string;
  /** The runner's own directory, when not `<queueDir>/outbound`. */
  outboundDir?: string;
  /** Run commands as this uid and gid (a uid the runner does not run as). */
  commandUser?: { uid: number; gid: number };
  /**
   * The runner owns the pty devices of its (container's) devpts: only it may
   * open a pty, so commands cannot use up the host's shared pty pool.
   */
  privatePtys?: boolean;
  /** Root that every request's cwd must resolve inside. */
  workspace: string;
  /** Requests run at once. Default 1: one user's commands never overlap. */
  concurrency?: number;
  /** Exit after this long with nothing queued or running; 0 (default) never. */
  idleExitMs?: number;
  /** Fallback poll interval of inbound.db. */
  pollMs?: number;
  /** Shown in the heartbeat; defaults to the hostname. */
  runnerId?: string;
  /** Heartbeat interval; default 2 s. */
  heartbeatMs?: number;
  /** Stops the runner as SIGTERM would (for in-process use). */
  signal?: AbortSignal;
  /** Called once the first heartbeat is written and requests are served. */
  onReady?: () => void;
}

/** Output flushed at least this often while a command runs. */
const FLUSH_MS = 50;
/** Buffered output that forces a flush before the timer. */
const FLUSH_BYTES = 1024 * 1024;
/** A session's output that arrived during a commit waits this long for more before the next. */
const SESSION_FLUSH_MS = 5;
/** How often acknowledged outbound rows are deleted. */
const COLLECT_MS = 1000;
/** Orphan reaping interval (descendants that escaped and then died). */
const REAP_MS = 1000;
/** First pause before a write is tried again after a lock timeout; doubles up to the max. */
const RECORD_RETRY_MS = 250;
const RECORD_RETRY_MAX_MS = 5000;
/** Write failures other than a lock tolerated before the runner gives up. */
const OTHER_FAILURES = 3;

/** Output not yet durable, in per-stream order. */
type Chunk = { stream: StreamName; seq: number; data: Uint8Array };

const BASE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/**
 * The environment every command starts from: a fixed minimum, the image's
 * own `Env` over it (its PATH, language settings), HOME and TMPDIR, then the
 * variables named in `WAFFLE_PASS_ENV` (the config's allowlist, which the
 * host passed into the container). Never the runner's whole environment.
 *
 * @param workspace The workspace root (HOME).
 * @param options `passEnv: false` leaves out `WAFFLE_PASS_ENV` (sessions).
 * @returns The base environment.
 */
export function commandBaseEnv(
  workspace: string,
  options: { passEnv?: boolean } = {},
): Record<string, string> {
  const env: Record<string, string> = {
    PATH: BASE_PATH,
    LANG: "C.UTF-8",
    ...imageEnv(),
    // The image's HOME is rarely writable here: the workspace is.
    HOME: workspace,
    TMPDIR: "/tmp",
    // Egress (its proxy, CA bundle, placeholders), sessions included.
    ...egressEnv(),
  };
  // A session (an MCP server) gets only what its request names.
  if (options.passEnv === false) return env;
  for (const name of (Deno.env.get("WAFFLE_PASS_ENV") ?? "").split(",")) {
    const value = name === "" ? undefined : Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  return env;
}

// The variables the host gave for egress; none when not attached.
function egressEnv(): Record<string, string> {
  const text = Deno.env.get(EGRESS_ENV_VARIABLE);
  if (text === undefined || text === "") return {};
  const parsed = JSON.parse(text) as Record<string, unknown>;
  return Object.fromEntries(
    Object.entries(parsed).filter((entry): entry is [string, string] =>
      typeof entry[1] === "string"
    ),
  );
}

interface Running {
  request: InboundRequest;
  abort: AbortController;
  feed?: SessionFeed;
}

/**
 * Serves a queue until SIGTERM/SIGINT, `options.signal`, or the idle exit.
 * On stop it kills running trees and records them as interrupted.
 *
 * @param options Queue, workspace and limits.
 * @returns The process exit code (0 on a clean stop).
 * @throws {RunnerError} When another runner holds the queue.
 */
export async function runRunner(options: RunnerOptions): Promise<number> {
  const paths = queuePaths(options.queueDir, { outboundDir: options.outboundDir });
  acquireRunnerLock(paths.runnerLock);
  const subreaper = enableSubreaper();
  if (options.privatePtys) reservePtys();
  const stop = new AbortController();
  const egressSocket = Deno.env.get(EGRESS_SOCKET_VARIABLE);
  if (egressSocket) startEgressBridge(egressSocket, { signal: stop.signal });
  const queue = RunnerQueue.open(options.queueDir, { outboundDir: options.outboundDir });
  mark("runner: queue open");
  const bootId = crypto.randomUUID();
  const runnerId = options.runnerId ?? Deno.hostname();
  const concurrency = Math.max(1, options.concurrency ?? 1);
  const idleExitMs = options.idleExitMs ?? 0;
  const workspace = Deno.realPathSync(options.workspace);
  const baseEnv = commandBaseEnv(workspace);
  const sessionEnv = commandBaseEnv(workspace, { passEnv: false });
  const imageWorkdir = defaultWorkdir();

  const waiting: InboundRequest[] = [];
  const running = new Map<string, Running>();
  // Sessions run beside the commands: neither ever waits for the other.
  const sessions = new Map<string, Running>();
  let kick = new AbortController();
  let idleSince: number | null = Date.now();

  let exitCode = 0;
  // A write that keeps failing for another reason than a lock (a full or
  // broken disk) would leave a request without a result while the heartbeat
  // stays fresh: stop instead, so hosts see the runner gone and restart it.
  const fail = (why: string): void => {
    logLine(`stopping: ${why}`);
    exitCode = EXIT_RUNNER_FAILED;
    stop.abort();
  };
  const onSignal = (): void => stop.abort();
  const signals: Deno.Signal[] = ["SIGTERM", "SIGINT"];
  for (const name of signals) Deno.addSignalListener(name, onSignal);
  options.signal?.addEventListener("abort", onSignal, { once: true });
  stop.signal.addEventListener("abort", () => kick.abort(), { once: true });

  const recovery = queue.recover();
  // Fatal when it cannot be written: nothing here may run twice.
  await Promise.all(
    recovery.interrupted.map((request) =>
      queue.finish(
        notRunResult(request.id, {
          interrupted: true,
          error: "The runner stopped while this request ran; it was not re-run",
        }),
      )
    ),
  );
  const queueOrStart = (requests: InboundRequest[]): void => {
    for (const request of requests) {
      if (request.payload?.session === undefined) waiting.push(request);
      else void execute(request);
    }
  };

  // The first beat comes from this thread, so the host sees the runner as
  // soon as it serves; the worker (a second isolate, slower to boot) takes
  // over the timer without delaying that.
  queue.writeHeartbeat({ runnerId, bootId, seq: 0, time: Date.now(), state: "running" });
  mark("runner: first beat");
  // From the bundled artefact (this module is one of its chunks): the
  // worker's own bundle beside it; from source, the module.
  const workerUrl = new URL(
    import.meta.url.endsWith(".ts") ? "./heartbeat_worker.ts" : `./${HEARTBEAT_BUNDLE}`,
    import.meta.url,
  );
  const heartbeat = new Worker(workerUrl, { type: "module" });
  heartbeat.onmessage = (event): void => {
    const data = event.data as { type?: string; message?: string } | undefined;
    if (data?.type === "failed") {
      // Without beats every host would call this runner dead: stop, as after any failed write.
      fail(`cannot write the heartbeat: ${data.message}`);
    } else if (data?.type === "error") {
      logLine(`heartbeat write failed: ${data.message}`);
    }
  };
  heartbeat.onerror = (event): void => {
    event.preventDefault();
    logLine(`heartbeat worker failed, stopping: ${event.message}`);
    stop.abort();
  };
  post(heartbeat, {
    type: "start",
    path: queue.paths.heartbeat,
    beat: { runnerId, bootId, seq: 1, time: Date.now(), state: "running" },
    intervalMs: options.heartbeatMs ?? HEARTBEAT_INTERVAL_MS,
  });
  // The worker beats only while this thread ticks: a wedged serve loop must look dead.
  const ticker = setInterval(
    () => post(heartbeat, { type: "tick" }),
    options.heartbeatMs ?? HEARTBEAT_INTERVAL_MS,
  );
  const reaper = subreaper ? setInterval(() => reapOrphans(spawnedPids()), REAP_MS) : undefined;
  const watcher = new ChangeWatcher([queue.paths.inboundBell], {
    ...(options.pollMs === undefined ? {} : { pollMs: options.pollMs }),
  });
  options.onReady?.();

  // Writes a result together with the output not yet durable (one group
  // commit). A lock held past busy_timeout (the host, an operator's sqlite3,
  // a slow mount) is waited out: giving up would leave the request without a
  // result while this runner keeps heartbeating, so its host would wait
  // forever. Only a stopping runner gives up; the next one reports a started
  // request as interrupted.
  const record = async (result: ExecResult, unsent: Chunk[] = []): Promise<void> => {
    const id = result.requestId;
    let chunks = unsent;
    try {
      await retryBusy(`the result of '${id}'`, stop.signal, async () => {
        const [wrote, finished] = await Promise.allSettled([
          chunks.length === 0 ? Promise.resolve() : queue.appendChunks(id, chunks),
          queue.finish(result),
        ]);
        if (wrote.status === "fulfilled") chunks = [];
        if (finished.status === "rejected") throw finished.reason;
        // Same transaction as the result: only a bad row (not a lock) fails alone.
        if (wrote.status === "rejected") {
          logLine(`cannot record the last output of '${id}': ${messageOf(wrote.reason)}`);
        }
      });
    } catch (error) {
      if (!stop.signal.aborted) fail(`cannot record the result of '${id}': ${messageOf(error)}`);
    }
  };

  const execute = async (request: InboundRequest): Promise<void> => {
    const spec = request.payload?.session;
    const entry: Running = { request, abort: new AbortController() };
    if (spec !== undefined) {
      entry.feed = new SessionFeed(queue, { id: request.id, spec, abort: entry.abort });
      entry.feed.poll();
    }
    const slots = spec === undefined ? running : sessions;
    slots.set(request.id, entry);
    const release = (): void => {
      if (slots.delete(request.id)) kick.abort();
    };
    try {
      const { result, unsent } = await runOne(queue, request, {
        bootId,
        workspace,
        baseEnv: spec === undefined ? baseEnv : sessionEnv,
        imageWorkdir,
        abort: entry.abort.signal,
        // An orphan may belong to a session's server: claim none while one runs.
        claimOrphans: concurrency === 1 && sessions.size === 0,
        user: options.commandUser,
        feed: entry.feed,
      });
      // The tree is dead: free the slot before the result is durable, so the
      // next request's "started" joins the result's commit (one fsync per
      // request, not two). Its process starts only after that commit.
      mark(`'${request.id}' ran`);
      const recorded = record(result, unsent);
      release();
      await recorded;
      mark(`'${request.id}' result committed`);
    } catch (error) {
      // "started" could not be written, so the command did not run: say so,
      // or stop if even that cannot be written.
      await record(
        notRunResult(request.id, { error: `Could not record the start: ${messageOf(error)}` }),
      );
    } finally {
      entry.feed?.stop();
      release();
    }
  };
  queueOrStart(recovery.pending);

  const onWriteError = (what: string) => (error: unknown): void => {
    logLine(`cannot record ${what}: ${messageOf(error)}`);
  };
  // Reads new requests, cancels and acks. A failed read (e.g. a lock held
  // past busy_timeout) is retried on the next turn rather than lost.
  const poll = (): void => {
    const fresh = queue.newRequests();
    if (fresh.length > 0) mark(`${fresh.length} new request(s) read`);
    // The cursor moved past `fresh`: from here on nothing of it may be dropped.
    const valid = fresh.filter((request) => request.payload !== undefined);
    if (valid.length > 0) {
      queueOrStart(valid);
      queue.accept(valid.map((request) => request.id), bootId).catch(onWriteError("acceptance"));
    }
    for (const request of fresh.filter((r) => r.payload === undefined)) {
      void record(notRunResult(request.id, { error: `Invalid request: ${request.invalid}` }));
    }
    for (const entry of sessions.values()) entry.feed?.poll();
    const open = [...waiting.map((r) => r.id), ...running.keys(), ...sessions.keys()];
    for (const id of queue.cancelled(open)) {
      (running.get(id) ?? sessions.get(id))?.abort.abort("cancel");
      const index = waiting.findIndex((request) => request.id === id);
      if (index >= 0) {
        waiting.splice(index, 1);
        void record(notRunResult(id, { cancelled: true, error: "Cancelled before it started" }));
      }
    }
  };

  let retry = false;
  let failedReads = 0;
  let lastCollect = 0;
  try {
    while (!stop.signal.aborted) {
      if (retry || queue.inboundChanged()) {
        retry = false;
        try {
          poll();
          failedReads = 0;
        } catch (error) {
          retry = true;
          logLine(`cannot read the queue, retrying: ${messageOf(error)}`);
          // A failure once (a hot journal the host has yet to roll back: a
          // lock was already waited out by busy_timeout) is retried soon; one
          // that persists, ever more slowly (5 ms doubling to 500 ms).
          await new Promise((resolve) =>
            setTimeout(resolve, Math.min(500, 5 * 2 ** failedReads++))
          );
          continue;
        }
      }
      // Acknowledged rows are deleted in the background, at most once a
      // second: one commit for many acks, and never on a request's hot path.
      if (Date.now() - lastCollect >= COLLECT_MS) {
        lastCollect = Date.now();
        queue.collectAcked().catch(onWriteError("garbage collection"));
      }
      while (running.size < concurrency && waiting.length > 0) {
        void execute(waiting.shift()!);
      }
      const now = Date.now();
      const busy = running.size > 0 || waiting.length > 0 || sessions.size > 0;
      // The runner's own idle exit; hosts judge idleness from inbound.db, never from this.
      idleSince = busy ? null : (idleSince ?? now);
      if (idleExitMs > 0 && idleSince !== null && now - idleSince >= idleExitMs) {
        // A last look, so a request committed just now is served, not stranded.
        if (queue.inboundChanged()) {
          retry = true;
          continue;
        }
        break;
      }
      kick = new AbortController();
      if (stop.signal.aborted) break;
      await watcher.wait(kick.signal);
    }
  } finally {
    for (const entry of [...running.values(), ...sessions.values()]) entry.abort.abort("interrupt");
    while (running.size + sessions.size > 0) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    clearInterval(reaper);
    clearInterval(ticker);
    watcher.close();
    await stopWorker(heartbeat);
    try {
      queue.writeHeartbeat({
        runnerId,
        bootId,
        seq: Number.MAX_SAFE_INTEGER,
        time: Date.now(),
        state: "exited",
      });
    } catch {
      // Hosts see the beat go stale instead.
    }
    queue.close();
    for (const name of signals) Deno.removeSignalListener(name, onSignal);
  }
  return exitCode;
}

interface RunOneOptions {
  user: { uid: number; gid: number } | undefined;
  bootId: string;
  workspace: string;
  baseEnv: Record<string, string>;
  /** Where a request that names no cwd runs, when not the workspace (the image's). */
  imageWorkdir: string | undefined;
  abort: AbortSignal;
  claimOrphans: boolean;
  /** A session's stdin feed and output window. */
  feed: SessionFeed | undefined;
}

// Validates, marks started (durably), runs, and returns the result with the
// output not yet durable. Chunks are appended through the group commit, one
// write at a time; a failed write is kept and sent again ahead of newer
// output, so the host never sees a gap, and the last chunks share the
// result's transaction.
async function runOne(
  queue: RunnerQueue,
  request: InboundRequest,
  options: RunOneOptions,
): Promise<{ result: ExecResult; unsent: Chunk[] }> {
  const payload = request.payload!;
  const feed = options.feed;
  let cwd: string;
  let env: Record<string, string>;
  try {
    if (payload.session?.makeCwd && payload.cwd !== undefined) {
      await makeDirectory(options.workspace, payload.cwd, options.user);
    }
    cwd = payload.cwd === undefined && options.imageWorkdir !== undefined
      ? options.imageWorkdir
      : resolveCwd(options.workspace, payload.cwd);
    env = buildEnv(options.baseEnv, { extra: payload.env, requestId: request.id });
  } catch (error) {
    if (error instanceof UsageError) {
      return { result: notRunResult(request.id, { error: error.message }), unsent: [] };
    }
    throw error;
  }
  try {
    await retryBusy(
      `the start of '${request.id}'`,
      options.abort,
      () => queue.start(request.id, options.bootId, request.seq),
    );
  } catch (error) {
    if (!options.abort.aborted) throw error;
  }
  if (options.abort.aborted) {
    const cancelled = options.abort.reason !== "interrupt";
    return {
      result: notRunResult(request.id, {
        ...(cancelled ? { cancelled } : { interrupted: true }),
        error: cancelled
          ? "Cancelled before it started"
          : "The runner stopped before this request started",
      }),
      unsent: [],
    };
  }

  let channel: RunnerChannel | undefined;
  const channelSpec = payload.session?.channel;
  if (channelSpec !== undefined && feed !== undefined) {
    try {
      channel = await connectChannel(SANDBOX_CHANNEL_DIR, channelSpec);
      feed.useChannel(channel);
    } catch (error) {
      return {
        result: notRunResult(request.id, {
          error: `Cannot connect to the host's channel '${channelSpec.socket}': ${
            messageOf(error)
          }`,
        }),
        unsent: [],
      };
    }
  }

  const seq: Record<StreamName, number> = { stdout: 0, stderr: 0 };
  let buffered: Chunk[] = [];
  let bufferedBytes = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let writing: Promise<void> | undefined;
  const flush = (): void => {
    clearTimeout(timer);
    timer = undefined;
    if (buffered.length === 0 || writing !== undefined) return;
    const batch = buffered;
    buffered = [];
    bufferedBytes = 0;
    writing = queue.appendChunks(request.id, batch).then(
      () => {
        writing = undefined;
        if (buffered.length > 0) {
          // A session's output waited for this commit: a little more is let
          // in first, so bulk output goes in large commits (each one blocks
          // the loop that reads the pipe) while a conversation's line waits
          // at most SESSION_FLUSH_MS.
          const wait = bufferedBytes >= FLUSH_BYTES
            ? 0
            : feed !== undefined
            ? SESSION_FLUSH_MS
            : FLUSH_MS;
          timer ??= setTimeout(flush, wait);
        }
      },
      (error) => {
        logLine(`cannot record output of '${request.id}' yet, retrying: ${messageOf(error)}`);
        buffered = [...batch, ...buffered];
        bufferedBytes = buffered.reduce((n, chunk) => n + chunk.data.byteLength, 0);
        writing = undefined;
        timer ??= setTimeout(flush, FLUSH_MS);
      },
    );
  };
  const onOutput = (stream: StreamName, data: Uint8Array): void | Promise<void> => {
    if (channel !== undefined) return sendOverChannel(channel, { stream, data, feed });
    // exec.ts already splits at MAX_CHUNK_BYTES; this guards the protocol limit.
    let admitted: Promise<void> | undefined;
    for (let offset = 0; offset < data.byteLength; offset += MAX_CHUNK_BYTES) {
      const piece = data.slice(offset, offset + MAX_CHUNK_BYTES);
      bufferedBytes += piece.byteLength;
      // Small reads of one stream share a row while it is not yet written:
      // fewer rows for both sides to check, whatever size the pipe gives.
      const last = buffered.at(-1);
      if (last?.stream === stream && last.data.byteLength + piece.byteLength <= MAX_CHUNK_BYTES) {
        last.data = concat([last.data, piece]);
        admitted = feed?.admit(stream, last.seq, piece.byteLength);
        continue;
      }
      const at = seq[stream]++;
      buffered.push({ stream, seq: at, data: piece });
      admitted = feed?.admit(stream, at, piece.byteLength);
    }
    // A session is a conversation: its output goes out at once, unless it
    // is waiting for more after a commit (see SESSION_FLUSH_MS).
    if (bufferedBytes >= FLUSH_BYTES || (feed !== undefined && timer === undefined)) flush();
    else timer ??= setTimeout(flush, FLUSH_MS);
    return admitted;
  };

  mark(`'${request.id}' start committed`);
  let pty: Pty | undefined;
  const tty = payload.session?.tty;
  let outcome: ExecOutcome;
  try {
    if (tty !== undefined && feed !== undefined) {
      // At the size the feed last saw: a resize read before the terminal
      // existed (the feed polls from its start) would otherwise be lost.
      pty = openPty(feed.ttySize ?? tty);
      feed.onResize = (size) => pty?.resize(size);
    }
    outcome = await runCommand({
      requestId: request.id,
      argv: payload.argv,
      cwd,
      env: tty === undefined ? env : { TERM: "xterm-256color", ...env },
      stdin: feed?.stdin ?? (payload.stdin === undefined ? null : fromBase64(payload.stdin)),
      ...(payload.timeoutMs === undefined ? {} : { timeoutMs: payload.timeoutMs }),
      outputCap: feed === undefined ? payload.outputCap ?? DEFAULT_OUTPUT_CAP : Infinity,
      user: options.user,
      pty,
    }, { onOutput, signal: options.abort, claimOrphans: options.claimOrphans });
  } catch (error) {
    // Only the pty can fail here (runCommand reports its own failures).
    outcome = notRun(Date.now(), `Cannot open a terminal: ${messageOf(error)}`);
  } finally {
    pty?.close();
  }
  if (channel !== undefined) await endChannel(channel, options.abort);
  // The output left over (and any a failed write gave back) goes with the result.
  clearTimeout(timer);
  timer = undefined;
  await writing;
  clearTimeout(timer);
  const result: ExecResult = {
    requestId: request.id,
    exitCode: outcome.exitCode,
    signal: outcome.signal,
    timedOut: outcome.timedOut,
    interrupted: outcome.interrupted,
    cancelled: outcome.cancelled,
    stdoutTruncated: outcome.stdoutTruncated,
    stderrTruncated: outcome.stderrTruncated,
    stdoutBytes: outcome.stdoutBytes,
    stderrBytes: outcome.stderrBytes,
    startedAt: outcome.startedAt,
    endedAt: outcome.endedAt,
    durationMs: Math.max(0, outcome.endedAt - outcome.startedAt),
    error: (feed?.endedBecause ?? outcome.error)?.slice(0, 4096) ?? null,
  };
  return { result, unsent: buffered };
}

// Output over the channel: frames of at most MAX_CHUNK_BYTES, each resolved
// when the socket took it (the pipe is read no faster than the host reads).
async function sendOverChannel(
  channel: RunnerChannel,
  chunk: { stream: StreamName; data: Uint8Array; feed: SessionFeed | undefined },
): Promise<void> {
  const { stream, data, feed } = chunk;
  for (let offset = 0; offset < data.byteLength; offset += MAX_CHUNK_BYTES) {
    const piece = data.subarray(offset, offset + MAX_CHUNK_BYTES);
    await feed?.admit(stream, 0, piece.byteLength);
    await channel.write(stream, piece).catch(() => {
      // The host is gone: the process's output goes nowhere, as with a closed pipe.
    });
  }
}

// Sends what is queued and closes; a cancelled session closes at once.
async function endChannel(channel: RunnerChannel, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return channel.close();
  const aborted = new Promise<void>((resolve) => {
    signal.addEventListener("abort", () => resolve(), { once: true });
  });
  await Promise.race([channel.end(), aborted]);
  channel.close();
}

// Creates a session's working directory as the command's user, so a link a
// command planted in the workspace gives it nothing the command lacked.
async function makeDirectory(
  workspace: string,
  cwd: string,
  user: { uid: number; gid: number } | undefined,
): Promise<void> {
  // Outside the workspace: resolveCwd reports it.
  if (cwd.startsWith("/") || cwd.split("/").includes("..")) return;
  const made = await new Deno.Command("mkdir", {
    args: ["-p", "--", cwd],
    cwd: workspace,
    clearEnv: true,
    env: { PATH: BASE_PATH },
    stdout: "null",
    stderr: "piped",
    ...(user === undefined ? {} : { uid: user.uid, gid: user.gid }),
  }).output().catch((error) => ({
    success: false,
    stderr: new TextEncoder().encode(messageOf(error)),
  }));
  if (!made.success) {
    const why = new TextDecoder().decode(made.stderr).trim().split("\n")[0];
    throw new UsageError(`Cannot create working directory '${cwd}': ${why}`);
  }
}

// Runs a write again while it fails on a lock held past busy_timeout (the
// host, an operator's sqlite3, a slow mount), until `signal` aborts.
async function retryBusy<T>(
  what: string,
  signal: AbortSignal,
  write: () => Promise<T>,
): Promise<T> {
  let failures = 0;
  for (let pause = RECORD_RETRY_MS;; pause = Math.min(pause * 2, RECORD_RETRY_MAX_MS)) {
    try {
      return await write();
    } catch (error) {
      // A lock is waited out; anything else (a full disk may free up) a few times.
      if (signal.aborted || (!isBusyError(error) && ++failures > OTHER_FAILURES)) throw error;
      logLine(`cannot record ${what} yet, retrying: ${messageOf(error)}`);
      await new Promise((resolve) => setTimeout(resolve, pause));
    }
  }
}

function post(worker: Worker, message: HeartbeatMessage): void {
  worker.postMessage(message);
}

async function stopWorker(worker: Worker): Promise<void> {
  await new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, 1000);
    worker.onmessage = (event): void => {
      if (event.data?.type === "stopped") {
        clearTimeout(timer);
        resolve();
      }
    };
    post(worker, { type: "stop" });
  });
  worker.terminate();
}

function fromBase64(text: string): Uint8Array {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}
