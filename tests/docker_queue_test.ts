// deno-lint-ignore-file no-console
/**
 * The queue over a real bind mount, with the runner in a real sandbox
 * container (no network, read-only rootfs, pids limit): concurrent load from
 * several host handles, a SIGKILL of the container while its result write is
 * blocked on a lock, a lock held past the busy timeout, and a fork bomb
 * against the pids limit. Asserts behaviour, never latency. Each test uses
 * its own temporary WAFFLE_HOME and force-removes its own container,
 * whatever happens. The load and the kill are the library's harness
 * (`lib/certify/`), the one `waffle doctor --deep` runs on a user's Docker:
 * these tests assert on the figures it returns.
 *
 * `WAFFLE_SANDBOX_DOCKER_SECONDS` sets the load duration (default 5), counted
 * from the runner's first heartbeat.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  type ExclusiveLock,
  findPidsCgroup,
  HeartbeatObserver,
  integrityOfQueue,
  killCheck,
  lockExclusive,
  MAX_HEARTBEAT_GAP_MS,
  type PidsCgroup,
  readPidsCgroup,
  sandboxRig,
  stressCheck,
  waitForCommandExit,
} from "../lib/certify/mod.ts";
import type { DockerClient } from "../lib/docker/mod.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import { BUSY_TIMEOUT_MS } from "../lib/queue/connection.ts";
import { HEARTBEAT_INTERVAL_MS } from "../lib/queue/protocol.ts";
import { Queue } from "../lib/queue/queue.ts";
import { liveTest } from "./_docker_gate.ts";
import { within } from "../lib/certify/_poll.ts";
import { linesOf, withSandbox } from "./_docker_queue_helpers.ts";
import { delay, text, waitFor } from "./_helpers.ts";
import { envNumber } from "./_stress_client.ts";

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
      assert.equal(sandbox.queue.heartbeat()?.state, "running", "no heartbeat after ensure");

      // The harness `waffle doctor --deep` runs, counted from the first
      // heartbeat (ensure returned once it was seen).
      const check = await stressCheck(sandboxRig(sandbox, docker), {
        seconds,
        submitters: SUBMITTERS,
      });
      const f = check.figures;
      assert.ok(f !== undefined, check.summary);
      console.log(
        `docker stress: ${check.summary} (${seconds} s asked; heartbeat seq step ` +
          `${f.heartbeat.maxSeqStep}, observer max sample interval ` +
          `${f.heartbeat.maxSampleIntervalMs} ms; same runner ${f.sameRunner}); docker server ` +
          `${server.Version} (API ${server.ApiVersion})`,
      );

      assert.deepEqual(f.firstErrors, [], `${f.errors} errors (${f.busyErrors} busy)`);
      assert.equal(f.errors, 0);
      assert.equal(f.busyErrors, 0, "lock timeouts");
      assert.deepEqual(f.firstMismatches, [], "outputs that do not match their request");
      assert.equal(f.mismatches, 0);
      assert.ok(f.results > 0, "nothing completed");
      assert.equal(f.distinctToolUseIds, f.requests, "tool-use ids were not unique");
      assert.equal(f.results, f.requests, "a request got no result");
      assert.ok(f.rowsCollected, "acknowledged rows were not collected");
      assert.equal(f.heartbeat.unreadable, 0, "the heartbeat was unreadable");
      assert.ok(f.heartbeat.beats > 0, "no heartbeat seen during the load");
      assert.ok(
        f.heartbeat.maxGapMs < MAX_HEARTBEAT_GAP_MS,
        `heartbeat gap ${f.heartbeat.maxGapMs} ms`,
      );
      assert.deepEqual(f.integrity, OK);
      assert.equal(f.containerRunning, true, "the container stopped during the load");
      assert.equal(f.restartCount, 0);
      assert.ok(f.sameRunner, "the runner restarted during the load");
      assert.equal(check.status, "passed", JSON.stringify(check.failures));
    });
  },
);

liveTest(
  "docker queue: a container SIGKILLed while its result write waits on a lock leaves intact files and an interrupted request",
  async (docker, t) => {
    await withSandbox(docker, "kill", {}, async (sandbox) => {
      await sandbox.ensure();
      const containerId = sandbox.lastEnsure?.containerId ?? "";
      // The harness `waffle doctor --deep` runs: lock, marker, no result, kill.
      const check = await killCheck(sandboxRig(sandbox, docker));
      const f = check.figures;
      assert.ok(f !== undefined, check.summary);
      const marker = join(sandbox.paths.workspace, f.marker);

      await sandbox.ensure();
      const ensured = sandbox.lastEnsure;
      const after = sandbox.queue.state(f.requestId);
      const collected = await sandbox.queue.collect(f.requestId);
      // The next request runs after recovery: the interrupted one was not re-run.
      const next = await sandbox.submit({ shell: `wc -l < ${f.marker}` });
      const nextResult = await sandbox.queue.collect(next);
      const lines = await linesOf(marker);
      const integrityAtEnd = integrityOfQueue(sandbox.queue.paths);
      console.log(
        `docker kill mid-write: ${check.summary}; command ${f.command}; runner main thread ` +
          `${f.runnerThread.describe}; container ${f.container.status} (OOMKilled ` +
          `${f.container.oomKilled}); ensure ${ensured?.action}; result ${
            JSON.stringify(after.result)
          }; marker lines ${lines.length}`,
      );

      assert.equal(
        f.resultsUnderLock,
        0,
        "a result was committed although the runner could not write",
      );
      if (f.runnerThread.inBusyWait === undefined) {
        await unverifiable(t, "the runner waits in SQLite's busy handler", f.runnerThread.describe);
      } else {
        assert.equal(
          f.runnerThread.inBusyWait,
          true,
          `runner not blocked on the lock: ${f.runnerThread.describe}`,
        );
      }
      assert.equal(f.container.running, false);
      assert.equal(f.container.exitCode, 137, "not killed by SIGKILL");
      assert.deepEqual(f.integrityAfterKill, OK);
      assert.equal(f.stateAfterKill, "started");
      assert.ok(f.journalUntouched, "the host touched the runner's journal");
      assert.equal(check.status, "passed", JSON.stringify(check.failures));
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
        await waitForCommandExit(docker, { containerId: containerOf(sandbox), needle: "line-$i" });
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
      const collected = await within(sandbox.queue.collect(id), { ms: 60_000, what: "the result" });
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
  const collected = await within(sandbox.queue.collect(id), {
    ms: 60_000,
    what: "the request's result",
  });
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
  const { result, stdout } = await within(sandbox.queue.collect(id), {
    ms: 60_000,
    what: "the follow-up",
  });
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
