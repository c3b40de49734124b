/**
 * The processes one sandbox runs for envd's `process.Process` service: each
 * a waffle `spawn` (a queue session, so exactly once and as the sandbox's
 * unprivileged uid) under a small pid of its own, with its events fanned out
 * to the `Start` stream and to any `Connect` stream attached later.
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import { normalize } from "../path.ts";
import type { ProcessStatus, SandboxProcess } from "../lifecycle/run.ts";
import type { TtySize } from "../queue/protocol.ts";
import type { EnvdSandbox } from "./envd_context.ts";
import { SANDBOX_HOME } from "./envd_http.ts";

/** A process's configuration, as `Start` gives it and `List` returns it. */
export interface ProcessConfig {
  /** The program. */
  cmd: string;
  /** Its arguments. */
  args: string[];
  /** Its own variables (over the sandbox's). */
  envs: Record<string, string>;
  /** Its working directory (the user's home when absent). */
  cwd?: string | undefined;
}

/** One event of a process, in the order envd sends them. */
export type ProcessEvent =
  | { kind: "start"; pid: number }
  | { kind: "data"; stream: "stdout" | "stderr" | "pty"; data: Uint8Array }
  | { kind: "end"; exitCode: number; exited: boolean; status: string; error?: string };

/** A process of the table. */
export interface ProcessEntry {
  /** Its pid in this table (what the SDK calls its pid). */
  pid: number;
  /** The tag it was started with. */
  tag: string | undefined;
  /** How it was started. */
  config: ProcessConfig;
  /** It runs on a terminal (its output is `pty` data; it can be resized). */
  pty: boolean;
  /** The waffle process. */
  process: SandboxProcess;
  /** Its stdin, while open. */
  stdin: WritableStreamDefaultWriter<Uint8Array> | undefined;
  /** Subscribers to its events; the output waits for a promise one returns. */
  listeners: Set<(event: ProcessEvent) => Promise<void> | undefined>;
}

/** Options of {@linkcode ProcessTable.start}. */
export interface StartOptions {
  /** A tag to find it by. */
  tag?: string | undefined;
  /** Keep stdin open for `SendInput` (closed at once otherwise; a terminal's stays open). */
  stdin: boolean;
  /** Run on a terminal of this size. */
  pty?: TtySize | undefined;
  /** Its lifetime in milliseconds (`Connect-Timeout-Ms`); none when undefined or 0. */
  timeoutMs?: number | undefined;
  /** Variables of the whole sandbox (the process's own win). */
  sandboxEnv: Record<string, string>;
}

/** The first pid handed out: small numbers stay clear of the container's own. */
const FIRST_PID = 1000;
/**
 * How long a process runs on while no server renews it: a server killed and
 * started again within this takes its processes over; one gone for longer
 * leaves none running unowned.
 */
export const PROCESS_LEASE_MS = 10 * 60_000;
/** A background process may be silent as long as its sandbox lives (the reaper ends it). */
const PROCESS_IDLE_MS = 7 * 24 * 3600_000;

/** A process as the table records it, so a server started again takes it over. */
export interface SavedProcess {
  /** Its pid in the table. */
  pid: number;
  /** The waffle process's id (`SandboxProcess.id`). */
  requestId: string;
  /** The tag it was started with. */
  tag: string | undefined;
  /** How it was started. */
  config: ProcessConfig;
  /** It runs on a terminal. */
  pty: boolean;
  /** Its stdin was kept open. */
  stdin: boolean;
}

/** Where a table records its processes (the server's database). */
export interface ProcessJournal {
  /** Records a started process. */
  save(process: SavedProcess): void;
  /** Forgets an ended one. */
  forget(pid: number): void;
  /** The processes recorded, oldest first. */
  saved(): SavedProcess[];
}

/** Told of each process a table starts or takes over; returns a listener of its events. */
export type ProcessWatch = (
  process: { requestId: string; pid: number; config: ProcessConfig },
) => ((event: ProcessEvent) => undefined) | undefined;

/** The processes of one sandbox. */
export class ProcessTable {
  readonly #sandbox: EnvdSandbox;
  readonly #journal: ProcessJournal | undefined;
  readonly #entries = new Map<number, ProcessEntry>();
  readonly #onExit: ((seconds: number) => void) | undefined;
  readonly #watch: ProcessWatch | undefined;
  /** When each process this table started began (performance.now()), for its latency. */
  readonly #began = new Map<number, number>();
  #nextPid = FIRST_PID;
  #detached = false;

  /**
   * @param sandbox The open waffle sandbox.
   * @param journal Where its processes are recorded; none: they end with this server.
   * @param options `onExit`: told how long each process this table started
   * ran, start to exit, in seconds (one taken over from another server is not timed);
   * `watch`: told of each process started or taken over, returns a listener of its events
   * (the console's command log).
   */
  constructor(
    sandbox: EnvdSandbox,
    journal?: ProcessJournal,
    options: { onExit?: (seconds: number) => void; watch?: ProcessWatch } = {},
  ) {
    this.#sandbox = sandbox;
    this.#journal = journal;
    this.#onExit = options.onExit;
    this.#watch = options.watch;
  }

  /**
   * Lets go of every process without ending or forgetting one (the server
   * is stopping, or the sandbox is being removed): their streams break,
   * and a server started again takes them over.
   */
  detach(): void {
    this.#detached = true;
  }

  /**
   * Takes over the processes a previous server recorded: each goes on
   * under its pid and tag, its output from what that server last read (none
   * is listening yet, as when a client disconnected). One that ended
   * meanwhile ends now; one its sandbox no longer knows is forgotten.
   *
   * @returns How many were taken over.
   */
  restore(): number {
    let taken = 0;
    for (const saved of this.#journal?.saved() ?? []) {
      this.#nextPid = Math.max(this.#nextPid, saved.pid + 1);
      let process: SandboxProcess;
      try {
        process = this.#sandbox.attach(saved.requestId);
      } catch {
        this.#journal?.forget(saved.pid);
        continue;
      }
      const entry: ProcessEntry = {
        pid: saved.pid,
        tag: saved.tag,
        config: saved.config,
        pty: saved.pty,
        process,
        stdin: saved.stdin ? process.stdin.getWriter() : undefined,
        listeners: new Set(),
      };
      const watcher = this.#watch?.({
        requestId: saved.requestId,
        pid: saved.pid,
        config: saved.config,
      });
      if (watcher !== undefined) entry.listeners.add(watcher);
      this.#entries.set(saved.pid, entry);
      void this.#pump(entry);
      taken++;
    }
    return taken;
  }

  /**
   * Starts a process; `onEvent` gets its events from `start` on.
   *
   * @param config What to run.
   * @param options Tag, stdin, lifetime, the sandbox's variables and the listener.
   * @returns The entry.
   */
  async start(
    config: ProcessConfig,
    options: StartOptions & { onEvent: (event: ProcessEvent) => Promise<void> | undefined },
  ): Promise<ProcessEntry> {
    const { argv, cwd } = placeCommand(config);
    const began = performance.now();
    const process = await this.#sandbox.spawn(argv, {
      env: { HOME: SANDBOX_HOME, ...homePwd(config.cwd), ...options.sandboxEnv, ...config.envs },
      ...(cwd === undefined ? {} : { cwd }),
      ...(options.timeoutMs ? { timeoutMs: options.timeoutMs } : {}),
      ...(options.pty === undefined ? {} : { tty: options.pty }),
      detached: true,
      leaseMs: PROCESS_LEASE_MS,
      idleMs: PROCESS_IDLE_MS,
    });
    const stdin = process.stdin.getWriter();
    const keepStdin = options.stdin || options.pty !== undefined;
    if (!keepStdin) await stdin.close().catch(() => {});
    const pid = this.#nextPid++;
    this.#journal?.save({
      pid,
      requestId: process.id,
      tag: options.tag,
      config,
      pty: options.pty !== undefined,
      stdin: keepStdin,
    });
    const entry: ProcessEntry = {
      pid,
      tag: options.tag,
      config,
      pty: options.pty !== undefined,
      process,
      stdin: keepStdin ? stdin : undefined,
      listeners: new Set([options.onEvent]),
    };
    const watcher = this.#watch?.({ requestId: process.id, pid, config });
    if (watcher !== undefined) entry.listeners.add(watcher);
    this.#entries.set(pid, entry);
    this.#began.set(pid, began);
    options.onEvent({ kind: "start", pid });
    void this.#pump(entry);
    return entry;
  }

  async #pump(entry: ProcessEntry): Promise<void> {
    // Each stream's next read waits for every listener to have room: memory
    // stays bounded however slowly a client reads.
    const emit = async (event: ProcessEvent): Promise<void> => {
      await Promise.all([...entry.listeners].map((listener) => listener(event)));
    };
    // A terminal's output is one stream, sent as `pty` data.
    const drain = async (stream: "stdout" | "stderr"): Promise<void> => {
      const as = entry.pty ? "pty" : stream;
      for await (const data of entry.process[stream]) {
        await emit({ kind: "data", stream: as, data });
      }
    };
    let end: ProcessEvent;
    try {
      await Promise.all([drain("stdout"), drain("stderr")]);
      end = endEvent(await entry.process.status);
    } catch (cause) {
      // Let go, not ended: the process runs on for the next server.
      if (this.#detached) return;
      const message = cause instanceof Error ? cause.message : String(cause);
      end = { kind: "end", exitCode: -1, exited: false, status: "error", error: message };
    }
    this.#entries.delete(entry.pid);
    const began = this.#began.get(entry.pid);
    this.#began.delete(entry.pid);
    if (began !== undefined && end.kind === "end" && end.exited) {
      this.#onExit?.((performance.now() - began) / 1000);
    }
    try {
      this.#journal?.forget(entry.pid);
    } catch {
      // A server stopping closed its journal: the next one finds this
      // process ended when it takes it over, and forgets it then.
    }
    await emit(end);
    entry.listeners.clear();
  }

  /**
   * A running process by pid or tag.
   *
   * @param selector `{pid}` or `{tag}`.
   * @returns The entry, or undefined.
   */
  find(selector: { pid?: number | undefined; tag?: string | undefined }): ProcessEntry | undefined {
    if (selector.pid !== undefined) return this.#entries.get(selector.pid);
    return [...this.#entries.values()].find((entry) => entry.tag === selector.tag);
  }

  /** The running processes. */
  list(): ProcessEntry[] {
    return [...this.#entries.values()];
  }
}

// A cwd in the home runs in the workspace (its target): PWD names it as the
// SDK did, so a shell's `pwd` prints `/home/user/…` as E2B's does (the shell
// keeps a PWD that is the same directory as its cwd).
function homePwd(cwd: string | undefined): { PWD?: string } {
  if (cwd === undefined || cwd === "") return { PWD: SANDBOX_HOME };
  const path = normalize(cwd).replace(/(.)\/$/, "$1");
  return path === SANDBOX_HOME || path.startsWith(`${SANDBOX_HOME}/`) ? { PWD: path } : {};
}

/**
 * The argv and waffle cwd for a process: a cwd in the user's home is the
 * workspace; another one is entered by a small `sh` wrapper, since a
 * request's own cwd must lie in the workspace.
 *
 * @param config The process.
 * @returns Argv and cwd.
 */
export function placeCommand(config: ProcessConfig): { argv: string[]; cwd: string | undefined } {
  const argv = [config.cmd, ...config.args];
  if (config.cmd === "") throw new UsageError("Empty command");
  const cwd = config.cwd;
  if (cwd === undefined || cwd === "" || cwd === SANDBOX_HOME) return { argv, cwd: undefined };
  if (cwd.startsWith(`${SANDBOX_HOME}/`)) {
    return { argv, cwd: cwd.slice(SANDBOX_HOME.length + 1) };
  }
  if (cwd === "/workspace" || cwd.startsWith("/workspace/")) return { argv, cwd };
  return {
    argv: ["/bin/sh", "-c", 'cd "$1" || exit 1; shift; exec "$@"', "sh", cwd, ...argv],
    cwd: undefined,
  };
}

function endEvent(status: ProcessStatus): ProcessEvent {
  if (status.signal !== null) {
    const name = status.signal.replace(/^SIG/, "").toLowerCase();
    return {
      kind: "end",
      exitCode: -1,
      exited: false,
      status: `signal: ${name === "kill" ? "killed" : name}`,
      ...(status.error === null ? {} : { error: status.error }),
    };
  }
  if (status.exitCode === null) {
    return {
      kind: "end",
      exitCode: -1,
      exited: false,
      status: "error",
      error: status.error ?? "The process did not run",
    };
  }
  return {
    kind: "end",
    exitCode: status.exitCode,
    exited: true,
    status: `exit status ${status.exitCode}`,
    ...(status.error === null || status.exitCode === 0 ? {} : { error: status.error }),
  };
}
