/**
 * A crash in the middle of a write: the host holds an exclusive lock on
 * `outbound.db`, a command in the container writes its marker to the
 * bind-mounted workspace and exits, so the runner's result write blocks on
 * the lock; with no result committed, `docker kill` ends the container. Both
 * files must then pass `PRAGMA integrity_check` (the runner's as its owner
 * will recover it), and the host must see the request started, without a
 * result.
 *
 * @module
 */
import { join } from "../path.ts";
import { BUSY_TIMEOUT_MS } from "../queue/connection.ts";
import type { DockerClient } from "../docker/client.ts";
import { type CheckResult, type Failure, judged } from "./check.ts";
import { integrityCheck, type QueueIntegrity, recoveredIntegrity } from "./integrity.ts";
import { type ExclusiveLock, lockExclusive } from "./lock_holder.ts";
import type { QueueRig } from "./rig.ts";
import { delay, pollUntil } from "./_poll.ts";

/** The runner's main thread as this host's kernel shows it. */
export interface RunnerThread {
  /** True or false when the host can see the runner's main thread; undefined otherwise. */
  inBusyWait: boolean | undefined;
  /** What was seen, e.g. `pid 1234 in hrtimer_nanosleep (syscall 230)`. */
  describe: string;
}

/** What the kill-mid-write check measured. */
export interface KillFigures {
  /** The interrupted request. */
  requestId: string;
  /** The marker file's name in the workspace: the command appended one line to it. */
  marker: string;
  /** The command's exit as seen from the host (it had ended before the kill). */
  command: string;
  /** Where the runner's main thread was when the container was killed. */
  runnerThread: RunnerThread;
  /** Results of the request committed while the host held the lock (must be 0). */
  resultsUnderLock: number;
  /** The container's state after the kill. */
  container: { running: boolean; exitCode: number; oomKilled: boolean; status: string };
  /** Journal sizes after the kill, in bytes. */
  journals: { inbound: number; outbound: number };
  /** `integrity_check` after the kill: inbound as is, outbound as its owner will recover it. */
  integrityAfterKill: QueueIntegrity;
  /** The request's state as the host reads it before any restart. */
  stateAfterKill: string;
  /** The host's read left the runner's journal byte for byte as it was. */
  journalUntouched: boolean;
}

/** The kill-mid-write check's result. */
export type KillCheck = CheckResult<KillFigures>;

/**
 * Runs the check against a rig whose runner serves. The container is left
 * killed: the caller restarts or removes it.
 *
 * @param rig The runner and the queue.
 * @param options `onProgress` receives a line per step.
 * @returns The result with its figures.
 * @throws {CertifyError} When a step does not happen in time (the lock is released first).
 *
 * @example
 * ```ts ignore
 * const check = await killCheck(rig);
 * check.figures?.integrityAfterKill; // { inbound: "ok", outbound: "ok" }
 * ```
 */
export async function killCheck(
  rig: QueueRig,
  options: { onProgress?: (line: string) => void } = {},
): Promise<KillCheck> {
  const started = performance.now();
  const { docker, containerId, paths } = rig;
  const tag = crypto.randomUUID().slice(0, 8);
  const go = join(rig.workspace, `go-${tag}`);
  const marker = join(rig.workspace, `marker-${tag}.log`);
  // Waits for the host's go, appends one line, prints. Never re-run: one line, always.
  const id = await rig.submit({
    shell: `while [ ! -e go-${tag} ]; do sleep 0.02; done; echo ran >> marker-${tag}.log; ` +
      `echo after-marker-${tag}`,
    timeoutMs: 120_000,
  });
  await pollUntil(() => rig.queue.state(id).state === "started", {
    timeoutMs: 30_000,
    what: "the request to start",
  });
  options.onProgress?.(`kill mid-write (${rig.mount}): holding outbound.db's lock`);
  const lock = await lockExclusive(paths.outbound);
  let under: { command: string; runnerThread: RunnerThread; resultsUnderLock: number };
  try {
    under = await underLock(rig, { lock, id, go, marker, needle: `after-marker-${tag}` });
    options.onProgress?.(`kill mid-write (${rig.mount}): docker kill`);
    await docker.killContainer(containerId, { signal: "SIGKILL" });
    await docker.waitContainer(containerId, { timeoutMs: 30_000 });
  } finally {
    await lock.release();
  }
  const killed = await docker.inspectContainer(containerId);
  const journalAfterKill = readOr(`${paths.outbound}-journal`);
  const figures: KillFigures = {
    requestId: id,
    marker: `marker-${tag}.log`,
    ...under,
    container: {
      running: killed?.State.Running ?? false,
      exitCode: killed?.State.ExitCode ?? -1,
      oomKilled: killed?.State.OOMKilled ?? false,
      status: killed?.State.Status ?? "gone",
    },
    journals: {
      inbound: readOr(`${paths.inbound}-journal`).byteLength,
      outbound: journalAfterKill.byteLength,
    },
    // Both files as their owners will recover them (on a copy: the host
    // never rolls back the runner's journal).
    integrityAfterKill: {
      inbound: integrityCheck(paths.inbound),
      outbound: recoveredIntegrity(paths.outbound),
    },
    // Before any restart the host sees a started request without a result,
    // reading around the hot journal without touching it.
    stateAfterKill: rig.queue.state(id).state,
    journalUntouched: equalBytes(readOr(`${paths.outbound}-journal`), journalAfterKill),
  };
  return judged("kill mid-write", {
    mount: rig.mount,
    started,
    summary: describeKill(figures),
    figures,
    failures: killFailures(figures),
  });
}

// With the lock held: let the command run to its end, then see that the
// runner is blocked on the lock and that nothing was committed.
async function underLock(
  rig: QueueRig,
  step: { lock: ExclusiveLock; id: string; go: string; marker: string; needle: string },
): Promise<{ command: string; runnerThread: RunnerThread; resultsUnderLock: number }> {
  await Deno.writeTextFile(step.go, "");
  await pollUntil(async () => (await Deno.readTextFile(step.marker).catch(() => "")) !== "", {
    timeoutMs: 30_000,
    what: "the command's marker in the workspace",
  });
  // The command exits right after its marker; the runner then blocks on
  // the lock with its chunks and result.
  const command = await waitForCommandExit(rig.docker, {
    containerId: rig.containerId,
    needle: step.needle,
  });
  const runnerThread = await waitForBlockedRunner(rig.docker, rig.containerId);
  const rows = await step.lock.query(
    "SELECT count(*) AS n FROM results WHERE request_id = ?",
    step.id,
  );
  return { command, runnerThread, resultsUnderLock: Number(rows[0]?.n) };
}

/**
 * What a kill check's figures fail on, by mode.
 *
 * @param f The figures.
 * @returns The failures; empty when it passed.
 */
export function killFailures(f: KillFigures): Failure[] {
  const failures: Failure[] = [];
  const fail = (mode: Failure["mode"], detail: string): number => failures.push({ mode, detail });
  if (f.resultsUnderLock !== 0) {
    fail("lock not honoured", `${f.resultsUnderLock} result committed under the host's lock`);
  }
  if (f.runnerThread.inBusyWait === false) {
    fail("lock not honoured", `runner not waiting on the lock: ${f.runnerThread.describe}`);
  }
  if (f.container.running || f.container.exitCode !== 137) {
    fail("runner", `container not killed: ${f.container.status}, exit ${f.container.exitCode}`);
  }
  for (const file of ["inbound", "outbound"] as const) {
    const found = f.integrityAfterKill[file];
    if (found !== "ok") fail("corruption", `${file}.db after the kill: ${found}`);
  }
  if (f.stateAfterKill !== "started") {
    fail("lock not honoured", `request '${f.stateAfterKill}' after the kill, not 'started'`);
  }
  if (!f.journalUntouched) fail("corruption", "the host's read changed the runner's journal");
  return failures;
}

function describeKill(f: KillFigures): string {
  return `command ${f.command.split(" (")[0]}, runner ${
    f.runnerThread.inBusyWait === undefined
      ? "thread not visible"
      : f.runnerThread.inBusyWait
      ? "in the busy handler"
      : "not blocked"
  }, ${f.resultsUnderLock} results under the lock, docker kill -> exit ${f.container.exitCode}, ` +
    `journals ${f.journals.inbound}/${f.journals.outbound} B, integrity ` +
    `${f.integrityAfterKill.inbound}/${f.integrityAfterKill.outbound}, request '${f.stateAfterKill}'`;
}

/**
 * Waits until no live process of the container runs a command line
 * containing `needle`; describes what was seen (a zombie is an exited
 * process its parent, the blocked runner, has not reaped yet).
 *
 * @param docker The daemon.
 * @param target The container and the command line's needle.
 * @returns What was seen.
 * @throws {CertifyError} When the command still runs after 30 s.
 */
export async function waitForCommandExit(
  docker: DockerClient,
  target: { containerId: string; needle: string },
): Promise<string> {
  let seen = false;
  let zombies = 0;
  await pollUntil(async () => {
    const top = await docker.top(target.containerId, { psArgs: "-eo pid,stat,args" });
    const live = top.Processes.filter((row) =>
      (row.at(-1) ?? "").includes(target.needle) && !(row[1] ?? "").startsWith("Z")
    );
    seen ||= live.length > 0;
    zombies = top.Processes.filter((row) => (row[1] ?? "").startsWith("Z")).length;
    return live.length === 0;
  }, { timeoutMs: 30_000, what: "the command to exit" });
  return `exited (${seen ? "seen running first" : "already gone at the first look"}, ` +
    `${zombies} unreaped zombie(s) in the container)`;
}

/**
 * The runner's main thread as the host kernel shows it (`docker top` gives
 * host pids), checked to be the runner by its command line; not visible when
 * this host does not see the container's processes (Docker Desktop, a remote
 * daemon, a host in another pid namespace).
 *
 * @param docker The daemon.
 * @param containerId The container.
 * @returns Whether it sleeps in SQLite's busy handler, when visible.
 */
export async function runnerThread(
  docker: DockerClient,
  containerId: string,
): Promise<RunnerThread> {
  const top = await docker.top(containerId, { psArgs: "-eo pid,args" });
  const row = top.Processes.find((r) =>
    (r[1] ?? "").includes(" runner --queue ") && !(r[1] ?? "").includes("docker-init")
  );
  const pid = Number(row?.[0]);
  const read = (file: string): string | undefined => {
    try {
      return Deno.readTextFileSync(`/proc/${pid}/${file}`).trim();
    } catch {
      return undefined;
    }
  };
  const cmdline = read("cmdline")?.replaceAll("\0", " ") ?? "";
  const wchan = read("wchan");
  const syscall = read("syscall")?.split(" ")[0];
  if (!Number.isSafeInteger(pid) || !cmdline.includes("runner") || wchan === undefined) {
    return { inBusyWait: undefined, describe: "not visible from this host" };
  }
  // 230 clock_nanosleep, 35 nanosleep (x86-64); 101, 115 on arm64.
  const sleeping = /nanosleep/.test(wchan) ||
    (Deno.build.arch === "x86_64" ? ["230", "35"] : ["101", "115"]).includes(syscall ?? "");
  return {
    inBusyWait: sleeping,
    describe: `pid ${pid} in ${wchan || "?"} (syscall ${syscall ?? "?"})`,
  };
}

// Waits (within half of SQLite's busy timeout) until the runner's main thread
// sleeps in the busy handler; the last look when it never does or is not visible.
async function waitForBlockedRunner(
  docker: DockerClient,
  containerId: string,
): Promise<RunnerThread> {
  const deadline = Date.now() + BUSY_TIMEOUT_MS / 2;
  for (;;) {
    const seen = await runnerThread(docker, containerId);
    if (seen.inBusyWait !== false || Date.now() > deadline) return seen;
    await delay(20);
  }
}

function readOr(path: string): Uint8Array {
  try {
    return Deno.readFileSync(path);
  } catch {
    return new Uint8Array();
  }
}

function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.byteLength === b.byteLength && a.every((byte, i) => byte === b[i]);
}
