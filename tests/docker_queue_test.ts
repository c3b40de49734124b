// deno-lint-ignore-file no-console
/**
 * The queue over a real bind mount, with the runner in a real sandbox
 * container (no network, read-only rootfs, pids limit): concurrent load from
 * several host handles, a SIGKILL of the container while its result write is
 * blocked on a lock, a lock held past the busy timeout, and a fork bomb
 * against the pids limit. Asserts
 * behaviour, never latency. Each test uses its own temporary WAFFLE_HOME and
 * force-removes its own container, whatever happens.
 *
 * `WAFFLE_SANDBOX_DOCKER_SECONDS` sets the load duration (default 5), counted
 * from the runner's first heartbeat.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { DockerClient } from "../lib/docker/mod.ts";
import type { Sandbox } from "../lib/lifecycle/sandbox.ts";
import { BUSY_TIMEOUT_MS } from "../lib/queue/connection.ts";
import { HEARTBEAT_INTERVAL_MS } from "../lib/queue/protocol.ts";
import { Queue } from "../lib/queue/queue.ts";
import { liveTest } from "./_docker_gate.ts";
import {
  type ExclusiveLock,
  findPidsCgroup,
  linesOf,
  lockExclusive,
  type PidsCgroup,
  readPidsCgroup,
  sizeOf,
  withSandbox,
} from "./_docker_queue_helpers.ts";
import { delay, MAX_HEARTBEAT_GAP_MS, text, waitFor } from "./_helpers.ts";
import {
  envNumber,
  HeartbeatObserver,
  integrityCheck,
  integrityOfQueue,
  newSummary,
  queueCounts,
  recoveredIntegrity,
  stressLoop,
  type StressSummary,
} from "./_stress_client.ts";

const OK = { inbound: "ok", outbound: "ok" };
/** Concurrent submitters, each with its own `Queue` handle on the bind-mounted directory. */
const SUBMITTERS = 8;

liveTest(
  "docker queue: runner in a networkless container serves 8 concurrent host handles over the bind mount",
  async (docker) => {
    const seconds = envNumber("WAFFLE_SANDBOX_DOCKER_SECONDS", 5);
    const server = await docker.version();
    await withSandbox(docker, "stress", {}, async (sandbox) => {
      await sandbox.ensure();
      const containerId = sandbox.lastEnsure?.containerId ?? "";
      const inspected = await docker.inspectContainer(containerId);
      assert.equal(inspected?.HostConfig.NetworkMode, "none", "the sandbox must have no network");
      const first = sandbox.queue.heartbeat();
      assert.equal(first?.state, "running", "no heartbeat after ensure");

      // Counted from the first heartbeat: ensure returned once it was seen.
      const started = Date.now();
      const deadline = started + seconds * 1000;
      const observerQueue = Queue.open(sandbox.paths.queue, {
        outboundDir: sandbox.paths.outbound,
      });
      const observer = new HeartbeatObserver(observerQueue);
      observer.start(100);
      const queues = Array.from(
        { length: SUBMITTERS },
        () => Queue.open(sandbox.paths.queue, { outboundDir: sandbox.paths.outbound }),
      );
      const summaries: StressSummary[] = queues.map(() => newSummary());
      let beats: ReturnType<HeartbeatObserver["stop"]>;
      let elapsed: number;
      try {
        await Promise.all(
          queues.map((queue, i) => stressLoop(queue, `d${i}`, deadline, summaries[i]!)),
        );
        elapsed = Date.now() - started;
        // Everything was acknowledged: the runner and the host collect the rows.
        const gcQueue = queues[0]!;
        await waitFor(async () => {
          await gcQueue.gc();
          const counts = queueCounts(sandbox.queue.paths);
          return counts.requests === 0 && counts.results === 0;
        }, { timeoutMs: 30_000, what: "acknowledged rows to be collected" });
      } finally {
        beats = observer.stop();
        for (const queue of queues) queue.close();
        observerQueue.close();
      }
      const integrity = integrityOfQueue(sandbox.queue.paths);
      const still = await docker.inspectContainer(containerId);

      const sum = (pick: (s: StressSummary) => number): number =>
        summaries.reduce((n, s) => n + pick(s), 0);
      const requests = sum((s) => s.requests);
      const results = sum((s) => s.results);
      const distinct = new Set(summaries.flatMap((s) => s.toolUseIds)).size;
      const errors = summaries.flatMap((s) => s.errors);
      const busy = sum((s) => s.busyErrors);
      const mismatches = summaries.flatMap((s) => s.mismatches);
      const throughput = (results / (elapsed / 1000)).toFixed(0);
      const sameRunner = sandbox.queue.heartbeat()?.bootId === first?.bootId;
      console.log(
        `docker stress: ${(elapsed / 1000).toFixed(1)} s (${seconds} s asked), ` +
          `${SUBMITTERS} host handles, ${requests} requests, ${distinct} distinct tool-use ids, ` +
          `${results} results, ${throughput} req/s, max heartbeat gap ${beats.maxGapMs} ms ` +
          `(seq step ${beats.maxSeqStep}, ${beats.beats} beats, observer max sample interval ` +
          `${beats.maxSampleIntervalMs} ms), ${errors.length} errors (${busy} busy), same runner ` +
          `${sameRunner}, integrity ${
            JSON.stringify(integrity)
          }, docker server ${server.Version} ` +
          `(API ${server.ApiVersion})`,
      );

      assert.deepEqual(errors, [], `${errors.length} errors (${busy} busy)`);
      assert.equal(busy, 0, "lock timeouts");
      assert.deepEqual(mismatches, [], "outputs that do not match their request");
      assert.ok(results > 0, "nothing completed");
      assert.equal(distinct, requests, "tool-use ids were not unique");
      assert.equal(results, requests, "a request got no result");
      assert.equal(beats.unreadable, 0, "the heartbeat was unreadable");
      assert.ok(beats.beats > 0, "no heartbeat seen during the load");
      assert.ok(beats.maxGapMs < MAX_HEARTBEAT_GAP_MS, `heartbeat gap ${beats.maxGapMs} ms`);
      assert.deepEqual(integrity, OK);
      assert.equal(still?.State.Running, true, "the container stopped during the load");
      assert.equal(still?.RestartCount, 0);
      assert.ok(sameRunner, "the runner restarted during the load");
    });
  },
);

liveTest(
  "docker queue: a container SIGKILLed while its result write waits on a lock leaves intact files and an interrupted request",
  async (docker, t) => {
    await withSandbox(docker, "kill", {}, async (sandbox) => {
      await sandbox.ensure();
      const containerId = sandbox.lastEnsure?.containerId ?? "";
      const paths = sandbox.queue.paths;
      const go = join(sandbox.paths.workspace, "go");
      const marker = join(sandbox.paths.workspace, "marker.log");
      // Waits for the host's go, appends one line, prints. Never re-run: one line, always.
      const id = await sandbox.submit({
        shell: "while [ ! -e go ]; do sleep 0.02; done; echo ran >> marker.log; echo after-marker",
        timeoutMs: 120_000,
      });
      await waitFor(() => sandbox.queue.state(id).state === "started", {
        timeoutMs: 30_000,
        what: "the request to start",
      });

      const lock = await lockExclusive(paths.outbound);
      let resultsUnderLock: number;
      let commandGone: string;
      let blocked: RunnerThread;
      try {
        await Deno.writeTextFile(go, "");
        await waitFor(async () => (await linesOf(marker)).length > 0, {
          timeoutMs: 30_000,
          what: "the marker (the command to run)",
        });
        // The command exits right after its marker; the runner then blocks on
        // our lock with its chunks and result. Show that the command is done.
        commandGone = await waitForCommandExit(docker, containerId, "after-marker");
        // Where the runner's main thread is: SQLite's busy handler sleeps
        // (clock_nanosleep) while an idle or working runner waits in epoll.
        blocked = await waitForBlockedRunner(docker, containerId);
        resultsUnderLock = await countResults(lock, id);
        await docker.killContainer(containerId, { signal: "SIGKILL" });
        await docker.waitContainer(containerId, { timeoutMs: 30_000 });
      } finally {
        await lock.release();
      }
      const killed = await docker.inspectContainer(containerId);
      const journals = {
        inbound: sizeOf(`${paths.inbound}-journal`),
        outbound: sizeOf(`${paths.outbound}-journal`),
      };
      const journalAfterKill = Deno.readFileSync(`${paths.outbound}-journal`);
      // Both files as their owners will recover them (on copies: the host
      // never rolls back the runner's journal).
      const integrityAfterKill = {
        inbound: integrityCheck(paths.inbound),
        outbound: recoveredIntegrity(paths.outbound),
      };
      // Before any restart the host sees a started request without a result,
      // reading around the hot journal without touching it.
      const stateAfterKill = sandbox.queue.state(id).state;
      const journalUntouched = equalBytes(
        Deno.readFileSync(`${paths.outbound}-journal`),
        journalAfterKill,
      );

      await sandbox.ensure();
      const ensured = sandbox.lastEnsure;
      const after = sandbox.queue.state(id);
      const collected = await sandbox.queue.collect(id);
      // The next request runs after recovery: the interrupted one was not re-run.
      const next = await sandbox.submit({ shell: "wc -l < marker.log" });
      const nextResult = await sandbox.queue.collect(next);
      const lines = await linesOf(marker);
      const integrityAtEnd = integrityOfQueue(sandbox.queue.paths);
      console.log(
        `docker kill mid-write: command ${commandGone}; runner main thread ${blocked.describe}; ` +
          `results under our lock ${resultsUnderLock}; ` +
          `container ${killed?.State.Status} (exit ${killed?.State.ExitCode}, OOMKilled ${killed?.State.OOMKilled}); ` +
          `journal sizes after kill ${JSON.stringify(journals)}; integrity after kill ` +
          `${JSON.stringify(integrityAfterKill)}; state before restart '${stateAfterKill}'; ` +
          `ensure ${ensured?.action}; result ${
            JSON.stringify(after.result)
          }; marker lines ${lines.length}`,
      );

      assert.equal(
        resultsUnderLock,
        0,
        "a result was committed although the runner could not write",
      );
      if (blocked.inBusyWait === undefined) {
        await unverifiable(t, "the runner waits in SQLite's busy handler", blocked.describe);
      } else {
        assert.equal(
          blocked.inBusyWait,
          true,
          `runner not blocked on the lock: ${blocked.describe}`,
        );
      }
      assert.equal(killed?.State.Running, false);
      assert.equal(killed?.State.ExitCode, 137, "not killed by SIGKILL");
      assert.deepEqual(integrityAfterKill, OK);
      assert.equal(stateAfterKill, "started");
      assert.ok(journalUntouched, "the host touched the runner's journal");
      assert.equal(ensured?.action, "started", "ensure should restart the same container");
      assert.equal(ensured?.containerId, containerId);
      assert.equal(after.state, "done");
      assert.equal(after.result?.interrupted, true, JSON.stringify(after.result));
      assert.equal(after.result?.exitCode, null);
      assert.equal(collected.result.interrupted, true);
      assert.equal(text(collected.stdout), "", "output written after our lock was committed");
      assert.equal(nextResult.result.exitCode, 0, JSON.stringify(nextResult.result));
      assert.equal(text(nextResult.stdout).trim(), "1");
      assert.deepEqual(lines, ["ran"], "the interrupted command ran again");
      assert.deepEqual(integrityAtEnd, OK);
    });
  },
);

liveTest(
  "docker queue: a lock held past the busy timeout delays output and result but loses neither",
  async (docker) => {
    await withSandbox(docker, "longlock", {}, async (sandbox) => {
      await sandbox.ensure();
      const bootId = sandbox.queue.heartbeat()?.bootId;
      const paths = sandbox.queue.paths;
      const go = join(sandbox.paths.workspace, "go");
      const marker = join(sandbox.paths.workspace, "marker.log");
      // Output over ~1 s, in many flushes, all of them while the lock is held.
      const id = await sandbox.submit({
        shell: "while [ ! -e go ]; do sleep 0.02; done; echo ran >> marker.log; " +
          "i=0; while [ $i -lt 20 ]; do echo line-$i; echo err-$i >&2; sleep 0.05; i=$((i+1)); done",
        timeoutMs: 120_000,
      });
      await waitFor(() => sandbox.queue.state(id).state === "started", {
        timeoutMs: 30_000,
        what: "the request to start",
      });
      const holdMs = BUSY_TIMEOUT_MS + HEARTBEAT_INTERVAL_MS;
      const lock = await lockExclusive(paths.outbound);
      let resultsUnderLock: number;
      try {
        await Deno.writeTextFile(go, "");
        await waitForCommandExit(docker, containerOf(sandbox), "line-$i");
        // Past the runner's busy timeout: its first writes fail, it must not give up.
        await delay(holdMs);
        resultsUnderLock = await countResults(lock, id);
      } finally {
        await lock.release();
      }
      // The heartbeat was blocked too; let it catch up before waiting on the result.
      await waitFor(() => {
        const beat = sandbox.queue.heartbeat();
        return beat !== undefined && Date.now() - beat.time < HEARTBEAT_INTERVAL_MS;
      }, { timeoutMs: 30_000, what: "a fresh heartbeat" });
      const collected = await withTimeout(sandbox.queue.collect(id), 60_000, "the result");
      const beat = sandbox.queue.heartbeat();
      const lines = await linesOf(marker);
      const integrity = integrityOfQueue(sandbox.queue.paths);
      const expected = (prefix: string): string =>
        Array.from({ length: 20 }, (_, i) => `${prefix}-${i}\n`).join("");
      console.log(
        `docker long lock: held ${holdMs} ms (busy timeout ${BUSY_TIMEOUT_MS} ms); results under ` +
          `the lock ${resultsUnderLock}; result ${JSON.stringify(collected.result)}; stdout ` +
          `${collected.stdout.byteLength} B, stderr ${collected.stderr.byteLength} B; same runner ` +
          `${beat?.bootId === bootId}; marker lines ${lines.length}; integrity ${
            JSON.stringify(integrity)
          }`,
      );
      assert.equal(resultsUnderLock, 0);
      assert.equal(collected.result.exitCode, 0, JSON.stringify(collected.result));
      assert.equal(collected.result.interrupted, false);
      assert.equal(text(collected.stdout), expected("line"), "stdout lost or reordered");
      assert.equal(text(collected.stderr), expected("err"), "stderr lost or reordered");
      assert.equal(beat?.bootId, bootId, "the runner was restarted");
      assert.deepEqual(lines, ["ran"]);
      assert.deepEqual(integrity, OK);
    });
  },
);

liveTest(
  "docker queue: the pids limit contains a fork bomb and the runner keeps serving",
  async (docker, t) => {
    // Room above the runner's own tasks (about 22 at rest, up to ~31 while
    // Deno's module-loading threads from its start have not ended yet).
    const limit = 48;
    await withSandbox(docker, "forkbomb", { pidsLimit: limit }, async (sandbox) => {
      await sandbox.ensure();
      const containerId = sandbox.lastEnsure?.containerId ?? "";
      const inspected = await docker.inspectContainer(containerId);
      const readBack = inspected?.HostConfig.PidsLimit;
      const cgroupDir = findPidsCgroup(containerId);
      // A runner just started has more threads than at rest (Deno's blocking
      // pool loading its modules; idle ones end within ~10 s): the bomb is
      // measured against the runner at rest.
      // A settling time, not an assertion: a loaded machine keeps more of them,
      // and the limit leaves room above 31 either way.
      await waitFor(async () => (await docker.stats(containerId)).pids <= limit - 16, {
        timeoutMs: 15_000,
      }).catch(() => {});
      const baseline = (await docker.stats(containerId)).pids;
      console.log(
        `docker fork bomb: HostConfig.PidsLimit read back ${readBack}; ` +
          `cgroup ${
            cgroupDir === undefined
              ? "not visible from this host"
              : JSON.stringify(readPidsCgroup(cgroupDir))
          }; runner tasks at rest ${baseline}`,
      );
      assert.equal(readBack, limit);

      const sampler = new PidsSampler(docker, containerId, cgroupDir);
      sampler.start();
      // The runner keeps its heartbeat while the container has no pid to spare.
      const observerQueue = Queue.open(sandbox.paths.queue, {
        outboundDir: sandbox.paths.outbound,
      });
      const observer = new HeartbeatObserver(observerQueue);
      observer.start(100);
      const bootId = sandbox.queue.heartbeat()?.bootId;
      const outcomes: string[] = [];
      try {
        // A bounded loop of background sleeps: forks until the limit refuses
        // one; the shell gives up and the runner kills the sleeps it left.
        const loop = await runAndReport(
          sandbox,
          "i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done; echo looped $i",
          10_000,
        );
        outcomes.push(`bounded loop: ${loop.summary}`);
        assert.equal(loop.result.timedOut, false, `should end at the limit: ${loop.summary}`);
        assert.notEqual(
          loop.result.exitCode,
          0,
          `200 sleeps under a limit of ${limit}? ${loop.summary}`,
        );
        assert.ok(hitLimit(loop), `the limit was not what stopped it: ${loop.summary}`);
        outcomes.push(`after loop: ${await aliveReport(sandbox)}`);

        // The classic bomb: stopped by the timeout, its whole tree killed.
        // The foreground forks once, while pids are free, then spins on
        // builtins only: it never meets the limit itself, so only the timeout
        // can end the request (a failed fork is fatal to a non-interactive sh).
        const bomb = await runAndReport(
          sandbox,
          "bomb() { bomb | bomb & }; bomb & while :; do :; done",
          3_000,
        );
        outcomes.push(`fork bomb: ${bomb.summary}`);
        // It ends by its timeout; or, should the runner's own threads and
        // the last workload's remains leave no pid to start it, with that
        // failure reported (exit 126), never a hang.
        assert.ok(
          bomb.result.timedOut || bomb.result.exitCode === 126,
          `the bomb neither timed out nor failed to start: ${bomb.summary}`,
        );
        assert.ok(hitLimit(bomb), `the bomb never met the limit: ${bomb.summary}`);
        outcomes.push(`after bomb: ${await aliveReport(sandbox)}`);
      } finally {
        await sampler.stop();
        observer.stop();
        observerQueue.close();
      }
      const beats = observer.stats;
      const end = cgroupDir === undefined ? undefined : readPidsCgroup(cgroupDir);
      console.log(
        `docker fork bomb: limit ${limit} (read back ${readBack}); max observed: ` +
          `${sampler.maxTasks} tasks (docker stats, threads included), ${sampler.maxProcesses} processes ` +
          `(docker top), ${sampler.maxCgroup ?? "-"} (cgroup pids.current), cgroup peak ${
            end?.peak ?? "-"
          }, forks refused ${end?.refused ?? "-"}, tasks at the end ${end?.current ?? "-"}; ` +
          `${sampler.samples} samples ` +
          `(${sampler.sampleErrors} failed); runner heartbeat max gap ${beats.maxGapMs} ms ` +
          `(${beats.beats} beats); ${outcomes.join("; ")}`,
      );
      assert.ok(sampler.samples > 0, "no pids sample");
      assert.ok(beats.beats > 0, "no heartbeat during the workloads");
      assert.ok(beats.maxGapMs < MAX_HEARTBEAT_GAP_MS, `heartbeat gap ${beats.maxGapMs} ms`);
      assert.equal(sandbox.queue.heartbeat()?.bootId, bootId, "the runner restarted");
      assert.ok(sampler.maxTasks <= limit, `${sampler.maxTasks} tasks > ${limit}`);
      assert.ok(sampler.maxProcesses <= limit, `${sampler.maxProcesses} processes > ${limit}`);
      if (end !== undefined) {
        assert.equal(end.max, String(limit));
        if (end.peak !== undefined) assert.ok(end.peak <= limit, `cgroup peak ${end.peak}`);
        if (end.refused !== undefined) assert.ok(end.refused > 0, "the limit was never hit");
      } else {
        await unverifiable(
          t,
          "the container's pids cgroup (pids.max, peak, refused forks)",
          "its cgroup is not visible from this host",
        );
      }
      const container = await docker.inspectContainer(containerId);
      assert.equal(container?.State.Running, true, "the container died");
    });
  },
);

// A fork refused by the pids limit, as the shell (stderr) or the runner
// (the command could not even start) reports it.
function hitLimit(reported: Reported): boolean {
  const refused = /fork|resource temporarily unavailable/i;
  return refused.test(reported.stderr) || refused.test(reported.result.error ?? "");
}

interface Reported {
  result: Awaited<ReturnType<Queue["collect"]>>["result"];
  stderr: string;
  summary: string;
}

async function runAndReport(
  sandbox: Sandbox,
  shell: string,
  timeoutMs: number,
): Promise<Reported> {
  const id = await sandbox.submit({ shell, timeoutMs });
  // Bounded: a runner that cannot finish the request must not hang the test.
  const collected = await withTimeout(sandbox.queue.collect(id), 60_000, "the request's result");
  const { result } = collected;
  const stderr = text(collected.stderr);
  const firstError = stderr.split("\n").find((line) => line !== "") ?? "";
  return {
    result,
    stderr,
    summary: `exit ${result.exitCode}, signal ${result.signal}, timedOut ${result.timedOut}, ` +
      `error ${JSON.stringify(result.error)}, ${result.durationMs} ms, ` +
      `stderr ${result.stderrBytes} B (${stderr.length} received: ${JSON.stringify(firstError)})`,
  };
}

// A follow-up request: the runner still serves and nothing of the workload
// runs any more (every process besides tini, the runner and this request's
// own group). Zombies not reaped yet (the runner reaps adopted orphans every
// second) are dead and only counted.
async function aliveReport(sandbox: Sandbox): Promise<string> {
  const id = await sandbox.submit({
    shell: "echo alive $$ $PPID; ps -o pid,pgid,stat,comm | tail -n +2",
  });
  const { result, stdout } = await withTimeout(sandbox.queue.collect(id), 60_000, "the follow-up");
  assert.equal(result.exitCode, 0, `follow-up request: ${JSON.stringify(result)}`);
  const [first = "", ...rest] = text(stdout).trim().split("\n");
  const [word, self, runner] = first.split(" ");
  assert.equal(word, "alive");
  const rows = rest.map((line) => line.trim().split(/\s+/));
  const others = rows.filter(([pid, pgid]) => pid !== "1" && pid !== runner && pgid !== self);
  const zombies = others.filter(([, , stat]) => (stat ?? "").startsWith("Z"));
  const leftovers = others.filter(([, , stat]) => !(stat ?? "").startsWith("Z"));
  assert.deepEqual(leftovers, [], `left behind: ${rest.join(" | ")}`);
  return `runner serves, nothing left running (${rows.map((row) => row[3]).join(", ")}; ` +
    `${zombies.length} zombie(s) not reaped yet)`;
}

// Samples the container's task and process counts until stopped.
class PidsSampler {
  maxTasks = 0;
  maxProcesses = 0;
  maxCgroup: number | undefined;
  samples = 0;
  sampleErrors = 0;
  #stopped = false;
  #loops: Promise<void>[] = [];

  constructor(
    private readonly docker: DockerClient,
    private readonly id: string,
    private readonly cgroupDir: string | undefined,
  ) {}

  start(): void {
    const loop = async (sample: () => Promise<void>, pauseMs: number): Promise<void> => {
      while (!this.#stopped) {
        try {
          await sample();
          this.samples++;
        } catch {
          // `ps` can fail while processes vanish under it; the next sample counts.
          this.sampleErrors++;
        }
        await delay(pauseMs);
      }
    };
    this.#loops.push(loop(async () => {
      this.maxTasks = Math.max(this.maxTasks, (await this.docker.stats(this.id)).pids);
    }, 20));
    this.#loops.push(loop(async () => {
      const top = await this.docker.top(this.id, { psArgs: "-e -o pid" });
      this.maxProcesses = Math.max(this.maxProcesses, top.Processes.length);
    }, 20));
    const dir = this.cgroupDir;
    if (dir !== undefined) {
      this.#loops.push(loop(() => {
        const now: PidsCgroup | undefined = readPidsCgroup(dir);
        if (now === undefined) throw new Error("cgroup gone");
        this.maxCgroup = Math.max(this.maxCgroup ?? 0, now.current);
        return Promise.resolve();
      }, 10));
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await Promise.all(this.#loops);
  }
}

// Waits until no live process of the container runs a command line
// containing `needle`; describes what was seen (a zombie is an exited process
// its parent, the blocked runner, has not reaped yet).
async function waitForCommandExit(
  docker: DockerClient,
  containerId: string,
  needle: string,
): Promise<string> {
  let seen = false;
  let zombies = 0;
  await waitFor(async () => {
    const top = await docker.top(containerId, { psArgs: "-eo pid,stat,args" });
    const live = top.Processes.filter((row) =>
      (row.at(-1) ?? "").includes(needle) && !(row[1] ?? "").startsWith("Z")
    );
    seen ||= live.length > 0;
    zombies = top.Processes.filter((row) => (row[1] ?? "").startsWith("Z")).length;
    return live.length === 0;
  }, { timeoutMs: 30_000, what: "the command to exit" });
  return `exited (${seen ? "seen running first" : "already gone at the first look"}, ` +
    `${zombies} unreaped zombie(s) in the container)`;
}

interface RunnerThread {
  /** True or false when the host can see the runner's main thread; undefined otherwise. */
  inBusyWait: boolean | undefined;
  describe: string;
}

// The runner's main thread as the host kernel shows it (`docker top` gives
// host pids), checked to be the runner by its command line; undefined when
// this host does not see the container's processes (Docker Desktop, a remote
// daemon, a host in another pid namespace).
async function runnerThread(docker: DockerClient, containerId: string): Promise<RunnerThread> {
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

// Waits (within SQLite's busy timeout) until the runner's main thread sleeps in
// the busy handler; returns the last look when it never does or is not visible.
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

// A check this host cannot make (the daemon's processes or cgroups are not
// visible here): with WAFFLE_REQUIRE_DOCKER=1 the test fails, as the gate in
// _docker_gate.ts does; otherwise the check shows as an ignored step with the
// reason, so it never passes in silence.
async function unverifiable(t: Deno.TestContext, check: string, reason: string): Promise<void> {
  if (Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1") {
    throw new Error(`Cannot check ${check} (WAFFLE_REQUIRE_DOCKER=1): ${reason}`);
  }
  await t.step({ name: `${check} [ignored: ${reason}]`, ignore: true, fn: () => {} });
}

async function countResults(lock: ExclusiveLock, id: string): Promise<number> {
  const rows = await lock.query("SELECT count(*) AS n FROM results WHERE request_id = ?", id);
  return Number(rows[0]?.n);
}

function containerOf(sandbox: Sandbox): string {
  const id = sandbox.lastEnsure?.containerId;
  assert.ok(id !== undefined, "ensure has not run");
  return id;
}

async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`Timed out after ${ms} ms waiting for ${what}`)),
          ms,
        );
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.byteLength === b.byteLength && a.every((byte, i) => byte === b[i]);
}
