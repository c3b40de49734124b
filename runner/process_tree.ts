/**
 * Finding and killing the whole process tree of one request, including
 * descendants that escaped with `setsid`, `nohup` or a double fork.
 *
 * A process belongs to a request when any of these holds:
 * - it is the request's root process (pid, and start time when known);
 * - it is in the root's session or process group (the root is spawned as a
 *   session leader, so pgid = sid = root pid);
 * - its `/proc/<pid>/environ` holds `WAFFLE_REQUEST_ID=<requestId>` (every
 *   command gets that marker, and descendants inherit it);
 * - with `claimOrphans`, it is a child of the runner that the runner did not
 *   spawn (an adopted orphan; the runner is a subreaper);
 * - its parent belongs to the request.
 *
 * The runner itself and its process group are never included.
 *
 * @module
 */
import {
  childrenOf,
  isSubreaper,
  listProcesses,
  type ProcStat,
  readProcStat,
  reapOrphans,
} from "./subreaper.ts";

export { listProcesses, parseProcStat, type ProcStat, readProcStat } from "./subreaper.ts";

/** Name of the environment variable that marks every process of a request. */
export const REQUEST_ID_ENV = "WAFFLE_REQUEST_ID";
/** Default time between SIGTERM and SIGKILL, in milliseconds. */
export const DEFAULT_KILL_GRACE_MS = 500;

const POLL_MS = 20;
/** Bound on SIGKILL rounds: processes may keep forking (or setsid-ing) while we kill. */
const KILL_ROUNDS = 10;
/** How long one SIGKILL round waits for its targets to die. */
const KILL_WAIT_MS = 200;

/** Options of {@linkcode findTree}. */
export interface FindTreeOptions {
  /** Pids the runner spawned through Deno; never claimed as orphans, never reaped here. */
  known: ReadonlySet<number>;
  /** Also match processes carrying `WAFFLE_REQUEST_ID=<requestId>` in their environment. */
  requestId?: string | undefined;
  /**
   * Claim every child of the runner not in `known` (adopted orphans). Only
   * correct when a single request runs at a time.
   */
  claimOrphans?: boolean | undefined;
  /**
   * Start time (`/proc/<pid>/stat` field 22) of the root, read right after
   * spawning. When given, a process that reuses the root's pid is not
   * mistaken for the root.
   */
  rootStartTime?: number | undefined;
}

/** A request's live processes. */
export interface ProcessTree {
  /** Live (non-zombie) processes, root first when alive. */
  pids: number[];
  /** Their distinct process groups, excluding the runner's own group. */
  pgids: number[];
}

/** Options of {@linkcode killTree}. */
export interface KillTreeOptions extends FindTreeOptions {
  /** Time between SIGTERM and SIGKILL, in milliseconds; default 500. */
  graceMs?: number | undefined;
}

/** What {@linkcode killTree} did. */
export interface KillTreeReport {
  /** Every pid that was sent a signal. */
  signalled: number[];
  /** Pids still alive after the last SIGKILL round (e.g. stuck in uninterruptible sleep). */
  survivors: number[];
  /** Orphaned zombies reaped afterwards. */
  reaped: number[];
}

let runnerPgid: number | undefined;

// The runner's own process group never changes once running.
function ownPgid(): number {
  if (runnerPgid === undefined) {
    runnerPgid = readProcStat(Deno.pid)?.pgid ?? -1;
  }
  return runnerPgid;
}

/**
 * Finds the live processes of one request.
 *
 * @param rootPid The pid of the request's root process (spawned as a session leader).
 * @param options Known runner-spawned pids, the request id and orphan claiming.
 * @returns The live pids and their process groups.
 */
export function findTree(rootPid: number, options: FindTreeOptions): ProcessTree {
  const procs = scanTree(rootPid, options);
  const self = ownPgid();
  const pgids = new Set<number>();
  for (const proc of procs) {
    if (proc.pgid > 1 && proc.pgid !== self) pgids.add(proc.pgid);
  }
  return { pids: procs.map((proc) => proc.pid), pgids: [...pgids] };
}

/**
 * Kills a request's whole tree: SIGTERM (then SIGCONT, so stopped processes
 * see it) to every process group and to each process whose group cannot be
 * signalled; waits up to the grace period, stopping early once all are gone;
 * then SIGKILLs whatever is left, re-scanning each round so processes forked
 * in the meantime are caught; finally reaps adopted orphans. Zombies count as
 * gone. Never throws.
 *
 * @param rootPid The pid of the request's root process.
 * @param options As for {@linkcode findTree}, plus the grace period.
 * @returns What was signalled, what survived and what was reaped.
 */
export async function killTree(rootPid: number, options: KillTreeOptions): Promise<KillTreeReport> {
  const signalled = new Set<number>();
  let survivors: ProcStat[] = [];
  // The runner's children, read once (a read per thread of this process):
  // the scan and, when nothing was signalled, the reaping below share it.
  let children = isSubreaper() ? childrenOf(Deno.pid) : undefined;
  try {
    const first = scanTree(rootPid, options, children);
    if (first.length > 0) {
      signalAll(first, "SIGTERM", signalled);
      signalAll(first, "SIGCONT", signalled);
      await waitGone(first, Math.max(0, options.graceMs ?? DEFAULT_KILL_GRACE_MS));
    }
    // Nothing found at all: nothing to escalate (the common case after a clean exit).
    if (first.length > 0) children = undefined; // signalled: zombies to come
    for (let round = 0; round < KILL_ROUNDS && first.length > 0; round++) {
      const left = scanTree(rootPid, options);
      survivors = left;
      if (left.length === 0) break;
      signalAll(left, "SIGKILL", signalled);
      survivors = await waitGone(left, KILL_WAIT_MS);
    }
  } catch {
    // Races are handled where they occur; this only guards against surprises.
  }
  let reaped: number[] = [];
  try {
    reaped = reapOrphans(options.known, { children });
  } catch {
    // Reaping is retried by the runner's periodic sweep.
  }
  return { signalled: [...signalled], survivors: survivors.map((proc) => proc.pid), reaped };
}

// The request's live processes, root first. `children`: the runner's, when
// already read.
function scanTree(
  rootPid: number,
  options: FindTreeOptions,
  children = isSubreaper() ? childrenOf(Deno.pid) : undefined,
): ProcStat[] {
  return children !== undefined ? walkTree(rootPid, options, children) : scanAll(rootPid, options);
}

// As a subreaper every descendant of the runner stays below it (orphans are
// reparented here, never to PID 1), so walking down the children files from
// the root and from the runner's adopted orphans finds the whole tree while
// reading only its own processes: cheap even on a host with thousands.
function walkTree(rootPid: number, options: FindTreeOptions, children: number[]): ProcStat[] {
  const self = Deno.pid;
  const selfPgid = ownPgid();
  const marker = markerOf(options.requestId);
  const seeds: ProcStat[] = [];
  const root = readProcStat(rootPid);
  if (
    root !== null && rootPid > 1 && rootPid !== self && root.ppid === self &&
    (options.rootStartTime === undefined || root.starttime === options.rootStartTime)
  ) seeds.push(root);
  for (const pid of children) {
    if (pid === rootPid || options.known.has(pid)) continue;
    const orphan = readProcStat(pid);
    if (orphan === null) continue;
    if (
      options.claimOrphans === true || orphan.sid === rootPid || orphan.pgid === rootPid ||
      marker !== undefined && orphan.state !== "Z" && hasMarker(pid, marker)
    ) seeds.push(orphan);
  }
  const members = new Map<number, ProcStat>();
  const queue = [...seeds];
  for (let next = queue.pop(); next !== undefined; next = queue.pop()) {
    if (members.has(next.pid) || next.pid === self || next.pgid === selfPgid) continue;
    members.set(next.pid, next);
    for (const child of childrenOf(next.pid) ?? []) {
      const stat = readProcStat(child);
      if (stat !== null) queue.push(stat);
    }
  }
  return liveRootFirst([...members.values()], rootPid);
}

function markerOf(requestId: string | undefined): Uint8Array | undefined {
  return requestId === undefined || requestId === ""
    ? undefined
    : new TextEncoder().encode(`${REQUEST_ID_ENV}=${requestId}`);
}

function liveRootFirst(procs: ProcStat[], rootPid: number): ProcStat[] {
  const live = procs.filter((proc) => proc.state !== "Z" && proc.state !== "X");
  live.sort((a, b) => (a.pid === rootPid ? -1 : b.pid === rootPid ? 1 : a.pid - b.pid));
  return live;
}

// Without a subreaper, orphans go to PID 1: every process must be examined.
function scanAll(rootPid: number, options: FindTreeOptions): ProcStat[] {
  const all = listProcesses();
  const self = Deno.pid;
  const selfPgid = ownPgid();
  const byPid = new Map<number, ProcStat>();
  const children = new Map<number, ProcStat[]>();
  for (const proc of all) {
    byPid.set(proc.pid, proc);
    const siblings = children.get(proc.ppid);
    if (siblings === undefined) children.set(proc.ppid, [proc]);
    else siblings.push(proc);
  }

  // A different process now holding the root's pid means the root's session
  // and group are gone too (the kernel never reuses a pid still in use as a
  // pgid or sid), so neither the pid nor the sid/pgid rule may be applied.
  const holder = byPid.get(rootPid);
  const rootValid = rootPid > 1 && rootPid !== self &&
    (holder === undefined || options.rootStartTime === undefined ||
      holder.starttime === options.rootStartTime);

  const marker = markerOf(options.requestId);

  // Request processes live in their own sessions, so nothing in the runner's
  // group is ours; and another request's root (spawned by the runner) never is.
  const excluded = (proc: ProcStat): boolean =>
    proc.pid <= 1 || proc.pid === self || proc.pgid === selfPgid ||
    (options.known.has(proc.pid) && !(rootValid && proc.pid === rootPid));

  const seeds: ProcStat[] = [];
  for (const proc of all) {
    if (excluded(proc)) continue;
    if (
      rootValid && (proc.pid === rootPid || proc.sid === rootPid || proc.pgid === rootPid) ||
      options.claimOrphans === true && proc.ppid === self ||
      marker !== undefined && proc.state !== "Z" && hasMarker(proc.pid, marker)
    ) {
      seeds.push(proc);
    }
  }

  // Close over the parent relation: descendants of members are members.
  const members = new Map<number, ProcStat>();
  const queue = [...seeds];
  for (let next = queue.pop(); next !== undefined; next = queue.pop()) {
    if (members.has(next.pid) || excluded(next)) continue;
    members.set(next.pid, next);
    queue.push(...(children.get(next.pid) ?? []));
  }

  return liveRootFirst([...members.values()], rootPid);
}

// True when the process's initial environment holds exactly `entry`.
function hasMarker(pid: number, entry: Uint8Array): boolean {
  let environ: Uint8Array;
  try {
    environ = Deno.readFileSync(`/proc/${pid}/environ`);
  } catch {
    // Gone, or not readable (another uid, non-dumpable): no evidence.
    return false;
  }
  let start = 0;
  for (let i = 0; i <= environ.length; i++) {
    if (i < environ.length && environ[i] !== 0) continue;
    if (i - start === entry.length && sameBytes(environ, start, entry)) return true;
    start = i + 1;
  }
  return false;
}

function sameBytes(haystack: Uint8Array, offset: number, needle: Uint8Array): boolean {
  for (let i = 0; i < needle.length; i++) {
    if (haystack[offset + i] !== needle[i]) return false;
  }
  return true;
}

// Signals each process group once, and individually every process whose
// group could not be signalled (or is the runner's own group).
function signalAll(procs: readonly ProcStat[], signal: Deno.Signal, signalled: Set<number>): void {
  const selfPgid = ownPgid();
  const groupDone = new Set<number>();
  const groupFailed = new Set<number>();
  for (const proc of procs) {
    const pgid = proc.pgid;
    if (pgid <= 1 || pgid === selfPgid || groupDone.has(pgid) || groupFailed.has(pgid)) continue;
    if (trySignal(-pgid, signal)) groupDone.add(pgid);
    else groupFailed.add(pgid);
  }
  for (const proc of procs) {
    if (groupDone.has(proc.pgid)) {
      signalled.add(proc.pid);
    } else if (trySignal(proc.pid, signal)) {
      signalled.add(proc.pid);
    }
  }
}

// kill(2) that tolerates ESRCH/EPERM and refuses targets that would hit the
// runner or everyone (0, -1, 1, our own pid).
function trySignal(target: number, signal: Deno.Signal): boolean {
  if (!Number.isSafeInteger(target) || Math.abs(target) <= 1 || target === Deno.pid) return false;
  if (target < 0 && -target === ownPgid()) return false;
  try {
    Deno.kill(target, signal);
    return true;
  } catch {
    return false;
  }
}

// Polls until every process in `procs` is gone or a zombie (or `ms` passes);
// returns those still alive.
async function waitGone(procs: readonly ProcStat[], ms: number): Promise<ProcStat[]> {
  const deadline = Date.now() + ms;
  let alive = procs.filter(isAlive);
  while (alive.length > 0 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, Math.min(POLL_MS, deadline - Date.now())));
    alive = alive.filter(isAlive);
  }
  return alive;
}

function isAlive(proc: ProcStat): boolean {
  const now = readProcStat(proc.pid);
  return now !== null && now.starttime === proc.starttime && now.state !== "Z" &&
    now.state !== "X";
}
