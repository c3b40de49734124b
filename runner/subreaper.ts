/**
 * The runner as a child subreaper, and the procfs reading that goes with it.
 *
 * Descendants that escape a request's process tree (double fork, `setsid`,
 * `nohup`) are reparented to the nearest subreaper instead of PID 1, so the
 * runner can still find, kill and reap them. Deno reaps only the children it
 * spawned itself (by pid), so zombies of adopted orphans are reaped here, one
 * pid at a time: `waitpid(-1)` would steal the exit status of Deno's own
 * children and leave their `status` promises hanging or failing.
 *
 * The `/proc/<pid>/stat` parsing lives here, in the lowest layer, so that
 * `process_tree.ts` can build on it without an import cycle.
 *
 * @module
 */
import { libc } from "../lib/libc.ts";

/** `PR_SET_CHILD_SUBREAPER` from `<linux/prctl.h>`. */
const PR_SET_CHILD_SUBREAPER = 36;
/** `WNOHANG` from `<sys/wait.h>`. */
const WNOHANG = 1;

/** The fields of `/proc/<pid>/stat` the runner uses. */
export interface ProcStat {
  /** Process id. */
  pid: number;
  /** Executable name as the kernel reports it (may contain spaces and parentheses). */
  comm: string;
  /** One-letter state: R, S, D, Z, T, t, X, I, ... */
  state: string;
  /** Parent process id. */
  ppid: number;
  /** Process group id. */
  pgid: number;
  /** Session id. */
  sid: number;
  /** Start time in clock ticks since boot; with `pid` it identifies a process across pid reuse. */
  starttime: number;
}

/**
 * Parses the text of `/proc/<pid>/stat`.
 *
 * `comm` may contain spaces and parentheses, so the fixed fields are read
 * after the last `)`.
 *
 * @param text The file's content.
 * @returns The parsed fields, or null when the text is malformed.
 */
export function parseProcStat(text: string): ProcStat | null {
  const open = text.indexOf("(");
  const close = text.lastIndexOf(")");
  if (open < 0 || close < open) return null;
  const pid = Number(text.slice(0, open).trim());
  // After ") ": state ppid pgrp session tty_nr tpgid flags minflt cminflt
  // majflt cmajflt utime stime cutime cstime priority nice num_threads
  // itrealvalue starttime ...
  const fields = text.slice(close + 2).split(" ");
  const state = fields[0];
  const ppid = Number(fields[1]);
  const pgid = Number(fields[2]);
  const sid = Number(fields[3]);
  const starttime = Number(fields[19]);
  if (
    state === undefined || state.length !== 1 ||
    ![pid, ppid, pgid, sid, starttime].every(Number.isSafeInteger)
  ) {
    return null;
  }
  return { pid, comm: text.slice(open + 1, close), state, ppid, pgid, sid, starttime };
}

/**
 * Reads one process's `/proc/<pid>/stat`.
 *
 * @param pid The process.
 * @returns Its fields, or null when it does not exist (any more) or cannot be read.
 */
export function readProcStat(pid: number): ProcStat | null {
  try {
    return parseProcStat(Deno.readTextFileSync(`/proc/${pid}/stat`));
  } catch {
    // Gone (ENOENT/ESRCH) between listing and reading, or not readable.
    return null;
  }
}

/**
 * Lists every process visible in `/proc` (threads are not listed).
 *
 * @returns One entry per process that could be read; empty when `/proc` is unavailable.
 */
export function listProcesses(): ProcStat[] {
  const result: ProcStat[] = [];
  let entries: Iterable<Deno.DirEntry>;
  try {
    entries = Deno.readDirSync("/proc");
  } catch {
    return result;
  }
  try {
    for (const entry of entries) {
      if (!/^\d+$/.test(entry.name)) continue;
      const stat = readProcStat(Number(entry.name));
      if (stat !== null) result.push(stat);
    }
  } catch {
    // The directory iterator can fail part-way (e.g. /proc unmounted); keep what we have.
  }
  return result;
}

/**
 * Makes this process a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER, 1)`),
 * so orphaned descendants are reparented to it rather than to PID 1.
 *
 * @returns True when it took effect; false off Linux, without FFI permission, or on failure.
 */
export function enableSubreaper(): boolean {
  const lib = libc();
  if (lib === undefined) return false;
  try {
    subreaper = lib.prctl(PR_SET_CHILD_SUBREAPER, 1n, 0n, 0n, 0n) === 0;
  } catch {
    subreaper = false;
  }
  return subreaper;
}

let subreaper = false;

/**
 * Whether {@linkcode enableSubreaper} took effect in this process: then every
 * orphaned descendant is reparented here, never to PID 1.
 *
 * @returns True once this process is a child subreaper.
 */
export function isSubreaper(): boolean {
  return subreaper;
}

/**
 * The direct children of a process, from `/proc/<pid>/task/<tid>/children`
 * (one file per thread: a child belongs to the thread that forked it).
 *
 * @param pid The parent.
 * @returns Child pids, or undefined when the kernel does not offer the files.
 */
export function childrenOf(pid: number): number[] | undefined {
  const children: number[] = [];
  try {
    for (const task of Deno.readDirSync(`/proc/${pid}/task`)) {
      let text: string;
      try {
        text = Deno.readTextFileSync(`/proc/${pid}/task/${task.name}/children`);
      } catch (error) {
        if (error instanceof Deno.errors.NotFound && task.name === String(pid)) return undefined;
        continue; // the thread ended meanwhile
      }
      for (const word of text.split(" ")) if (word !== "") children.push(Number(word));
    }
  } catch {
    return [];
  }
  return children;
}

/**
 * Reaps zombie children of this process that Deno did not spawn (orphans
 * adopted as a subreaper), each with `waitpid(pid, WNOHANG)`.
 *
 * Never calls `waitpid(-1)`/`waitpid(0)`: that would steal the exit status
 * of Deno's own children. Every pid Deno spawned and will reap must be in
 * `known`, or its status is lost.
 *
 * @param known Pids this process spawned through Deno (see `spawnedPids()` in `exec.ts`).
 * @param options `children`: this process's children, when just read
 *   ({@linkcode childrenOf}); a zombie that came after them waits for the
 *   next sweep.
 * @returns The pids reaped.
 */
export function reapOrphans(
  known: ReadonlySet<number>,
  options: { children?: number[] | undefined } = {},
): number[] {
  const lib = libc();
  const reaped: number[] = [];
  if (lib === undefined) return reaped;
  const self = Deno.pid;
  const status = new Int32Array(1);
  // Only our own children can be ours to reap: read just those when the
  // kernel lists them, instead of every process on the machine.
  const children = options.children ?? childrenOf(self);
  const candidates = children === undefined
    ? listProcesses()
    : children.map(readProcStat).filter((proc): proc is ProcStat => proc !== null);
  for (const proc of candidates) {
    if (proc.ppid !== self || proc.state !== "Z" || proc.pid <= 1 || known.has(proc.pid)) {
      continue;
    }
    try {
      // Returns the pid when reaped, 0 if not yet waitable, -1 (ECHILD) if
      // someone else reaped it in between; only the first counts.
      if (lib.waitpid(proc.pid, status, WNOHANG) === proc.pid) reaped.push(proc.pid);
    } catch {
      // FFI failure: leave the zombie for the next sweep.
    }
  }
  return reaped;
}
