/**
 * Hostile runner tests, live: attacks mounted from inside real sandbox
 * containers against liveness (locks, FIFOs, hostile schema, a stopped
 * runner, a heartbeat from the future, forged in-flight rows), cross-user
 * isolation (another user's round trip in the same host process), the disk
 * quota, and a host that is not root.
 *
 * Each attack is registered twice ({@linkcode bothWays}): as a command (uid
 * 10001, through a request or a process it left behind) and as a compromised
 * runner (the container's uid 0 with the runner's capabilities, through
 * `docker exec -u 0`). Where a command cannot mount the attack at all, its
 * variant asserts the exact refusal and an unharmed host. Victims are outside
 * the container: the host process (bounded times), other users (their round
 * trip), the host's disk.
 *
 * Timings are asserted only as generous bounds that express a property
 * ("recovers within 25 s", "B never stalls for 5 s"); every figure measured
 * is printed with `console.log`. How much an attack slows another user (a
 * ratio of p50s, which the machine's own load moves) is the bench's figure
 * (`deno task bench --only attack`), never a test's verdict.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import type { DockerClient } from "../lib/docker/mod.ts";
import { libc } from "../lib/libc.ts";
import { ensureContainer, type Ensured } from "../lib/lifecycle/ensure.ts";
import { withLock } from "../lib/lifecycle/lock.ts";
import { removeVolume } from "../lib/lifecycle/quota.ts";
import { openSandbox, type Sandbox } from "../lib/sandbox/open.ts";
import type { ExecResult } from "../lib/queue/protocol.ts";
import { LOCK_WAIT_MS } from "../lib/queue/queue.ts";
import { type RunnerTrouble, STALE_AFTER_MS } from "../lib/queue/liveness.ts";
import { liveTest } from "./_docker_gate.ts";
import { alive, runCliProcess, waitFor } from "./_helpers.ts";
import { FIFO_SCRIPT, LOCK_SCRIPT } from "./_runner_attacks.ts";
import {
  type Attacker,
  bothWays,
  containerOf,
  mount,
  mountInBackground,
  runnerPid,
} from "./_hostile_helpers.ts";
import {
  dockerCli,
  type HomeConfig,
  homeContainers,
  removeHomeContainers,
  removeHomeVolumes,
  run,
  runOk,
  tempHome,
  type TestHome,
  uniqueUser,
} from "./_sandbox_helpers.ts";

// The host's safe reads of outbound.db load libc once per process; loaded
// here, before any test, so the resource sanitizer does not blame the first one.
libc();

const MiB = 1024 ** 2;
/** A wait that the host must end by itself (revive or a clear error). */
const CALL_BOUND_MS = 30_000;
/** The host's judgement of a stopped runner: STALE_AFTER_MS plus a restart, generously. */
const STALE_BOUND_MS = 25_000;
/** Fleet commands must answer within this while a sandbox holds its lock. */
const CLI_BOUND_MS = 15_000;

// deno-lint-ignore no-console -- measured figures go in the closing note
const log = (...args: unknown[]): void => console.log(...args);

// ---------------------------------------------------------------------------
// Small helpers.

interface Rtt {
  p50: number;
  p90: number;
  max: number;
  n: number;
}

function percentile(samples: number[], p: number): number {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.max(0, Math.ceil(p * sorted.length) - 1)] ?? NaN;
}

function summary(samples: number[]): Rtt {
  return {
    p50: percentile(samples, 0.5),
    p90: percentile(samples, 0.9),
    max: Math.max(...samples),
    n: samples.length,
  };
}

function fmt(ms: number): string {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
}

/** B's round trip: `run(b, "true")`, `samples` times after `warmups` warm-ups. */
async function roundTrips(sandbox: Sandbox, samples = 30, warmups = 3): Promise<Rtt> {
  for (let i = 0; i < warmups; i++) await runOk(sandbox, "true");
  const times: number[] = [];
  for (let i = 0; i < samples; i++) {
    const started = performance.now();
    const ran = await run(sandbox, "true");
    times.push(performance.now() - started);
    assert.equal(ran.result.exitCode, 0, `'true' failed: ${JSON.stringify(ran.result)}`);
  }
  return summary(times);
}

function outcomeOf(result: ExecResult): string {
  if (result.interrupted) return "interrupted";
  if (result.exitCode !== null) return `exit ${result.exitCode}`;
  if (result.signal !== null) return `signal ${result.signal}`;
  return `error: ${result.error}`;
}

interface CallOutcome {
  ms: number;
  outcome: string;
  result?: ExecResult;
  stdout?: string;
  error?: string;
}

/**
 * One call of a sandbox (submit, collect reviving as `run` does, ack), timed,
 * with the troubles its revivals were called for; never throws.
 */
async function timedCall(sandbox: Sandbox, shell: string): Promise<CallOutcome> {
  const started = performance.now();
  const troubles: string[] = [];
  const revive = (trouble: RunnerTrouble): Promise<void | false> => {
    troubles.push(`${trouble}@${fmt(performance.now() - started)}`);
    return sandbox.ensure(trouble);
  };
  try {
    const id = await sandbox.submit({ shell });
    const { result, stdout } = await sandbox.queue.collect(id, { revive });
    await sandbox.queue.ack(id);
    return {
      ms: performance.now() - started,
      outcome: `${outcomeOf(result)}${
        troubles.length > 0 ? ` (revived: ${troubles.join(", ")})` : ""
      }`,
      result,
      stdout: new TextDecoder().decode(stdout),
    };
  } catch (error) {
    const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    return { ms: performance.now() - started, outcome: `error: ${message}`, error: message };
  }
}

/** Asserts that a call ended with a result, or with a clear one-line error. */
function assertEnded(what: string, call: CallOutcome): void {
  if (call.error !== undefined) {
    assert.ok(
      call.error.trim() !== "" && !call.error.trim().includes("\n"),
      `${what}: the error is not one clear line: ${JSON.stringify(call.error)}`,
    );
  } else {
    assert.ok(call.result !== undefined, `${what}: neither a result nor an error`);
  }
  assert.ok(
    call.ms < CALL_BOUND_MS,
    `${what}: took ${fmt(call.ms)} (bound ${CALL_BOUND_MS / 1000} s): ${call.outcome}`,
  );
}

async function startedAt(docker: DockerClient, id: string): Promise<string> {
  const container = await docker.inspectContainer(id);
  assert.ok(container !== null, `container ${id} exists`);
  return container.State.StartedAt;
}

/** The CLI from source, timed. */
async function timedCli(
  home: TestHome,
  args: string[],
): Promise<{ code: number; stdout: string; stderr: string; ms: number }> {
  const started = performance.now();
  const out = await home.cli(args);
  return { ...out, ms: performance.now() - started };
}

/**
 * Prints the runner's pid inside its container, found by its command line
 * (the bracket keeps grep from matching itself).
 */
const FIND_RUNNER = `runner=""
for p in /proc/[0-9]*; do
  if tr '\\000' ' ' < "$p/cmdline" 2>/dev/null | grep -q ' [r]unner --queue'; then runner="\${p#/proc/}"; fi
done
echo "runner=$runner"`;

/** What a command tries against the runner: kill init, stop and kill the runner. */
const SIGNAL_RUNNER = `${FIND_RUNNER}
kill -9 1; echo "init=$?"
kill -STOP "$runner"; echo "stop=$?"
kill -9 "$runner"; echo "kill=$?"
grep CapEff /proc/self/status`;

function field(stdout: string, name: string): string | undefined {
  return stdout.split("\n").find((line) => line.startsWith(`${name}=`))?.slice(name.length + 1);
}

// ---------------------------------------------------------------------------
// 1. One user cannot slow another.

/** Replaces the results table (what every wait reads) with a view over an endless recursive CTE. */
const ENDLESS_VIEW_SCRIPT = `
import { DatabaseSync } from "node:sqlite";
const db = new DatabaseSync("/queue/outbound/outbound.db");
db.exec("PRAGMA busy_timeout = 10000");
db.exec(\`BEGIN IMMEDIATE;
DROP TABLE results;
CREATE VIEW results(request_id, body, created_at) AS
  WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)
  SELECT 'forged', '{}', n FROM r;
COMMIT;\`);
console.log(JSON.stringify(db.prepare("SELECT type FROM sqlite_schema WHERE name = 'results'").get()));
`;

/**
 * Whether the sandbox's outbound.db still holds the endless view, read from
 * a copy (the test, like the host, never lets SQLite open the sandbox's file).
 */
function viewInPlace(a: Sandbox): boolean {
  const copy = Deno.makeTempFileSync({ prefix: "waffle-view-" });
  try {
    Deno.writeFileSync(copy, Deno.readFileSync(join(a.paths.outbound, "outbound.db")));
    const db = new DatabaseSync(copy, { readOnly: true });
    try {
      const row = db.prepare("SELECT type FROM sqlite_schema WHERE name = 'results'").get();
      return row?.type === "view";
    } finally {
      db.close();
    }
  } catch {
    return false;
  } finally {
    Deno.removeSync(copy);
  }
}

interface Attack {
  name: string;
  /**
   * Puts the attack in place on A; returns what undoes the test's side of it,
   * or null when `attacker` (a command) was refused.
   */
  mount(
    attacker: Attacker,
    a: Sandbox,
  ): Promise<{ inPlace(): boolean; release(): Promise<void> } | null>;
  /** Run the fleet CLI while this attack is in place. */
  fleetCli?: boolean;
}

const ATTACKS: Attack[] = [
  {
    name: "EXCLUSIVE lock on outbound.db",
    fleetCli: true,
    mount: async (attacker, a) => {
      const holder = await mountInBackground(attacker, a, LOCK_SCRIPT, "locked");
      if (holder === null) return null;
      return {
        inPlace: () => !holder.exited,
        release: async () => void (await holder.stop()),
      };
    },
  },
  {
    name: "outbound.db replaced by a FIFO",
    mount: async (attacker, a) => {
      if (await mount(attacker, a, FIFO_SCRIPT) === null) return null;
      const fifo = join(a.paths.outbound, "outbound.db");
      assert.ok(Deno.lstatSync(fifo).isFifo, "outbound.db is a FIFO now");
      return {
        inPlace: () => {
          try {
            return Deno.lstatSync(fifo).isFifo === true;
          } catch {
            return false;
          }
        },
        release: () => Promise.resolve(),
      };
    },
  },
  {
    name: "results = endless recursive view",
    mount: async (attacker, a) => {
      const out = await mount(attacker, a, ENDLESS_VIEW_SCRIPT);
      if (out === null) return null;
      assert.match(out, /"type":"view"/);
      return {
        inPlace: () => viewInPlace(a),
        release: () => Promise.resolve(),
      };
    },
  },
];

/** B's single round trip while A's sandbox is revived: A's recovery must not stall B. */
const B_STALL_BOUND_MS = 5_000;

/**
 * `waffle ps`, `sweep` and `doctor --json` while an attack is in place: each
 * must finish within CLI_BOUND_MS and exit 0.
 *
 * @returns What went wrong.
 */
async function fleetUnderAttack(
  home: TestHome,
  attack: Attack,
  mounted: { inPlace(): boolean },
): Promise<string[]> {
  const [ps, sweep, doctor] = await Promise.all([
    timedCli(home, ["ps"]),
    timedCli(home, ["sweep", "--idle-seconds", "100000"]),
    timedCli(home, ["doctor", "--json"]),
  ]);
  const held = mounted.inPlace();
  const failures: string[] = [];
  let report: { ok: boolean; checks: { name: string; ok: boolean; detail: string }[] } = {
    ok: false,
    checks: [],
  };
  try {
    report = JSON.parse(doctor.stdout);
  } catch {
    failures.push(`doctor --json printed no JSON: ${doctor.stdout}${doctor.stderr}`);
  }
  log(
    `[${attack.name}] fleet CLI: ps ${fmt(ps.ms)} (exit ${ps.code}), sweep ${
      fmt(sweep.ms)
    } (exit ${sweep.code}), doctor ${fmt(doctor.ms)} (exit ${doctor.code}, ${
      report.checks.filter((c) => !c.ok).map((c) => `${c.name}: ${c.detail}`).join("; ") ||
      "all rows ok"
    }); attack still in place when they finished: ${held}`,
  );
  for (const [name, out] of [["ps", ps], ["sweep", sweep], ["doctor", doctor]] as const) {
    if (out.ms >= CLI_BOUND_MS) failures.push(`waffle ${name} took ${fmt(out.ms)} under attack`);
    if (out.code !== 0) failures.push(`waffle ${name} exited ${out.code}: ${out.stderr.trim()}`);
  }
  if (!held) failures.push("the attack was gone before the fleet CLI finished: not a test of it");
  return failures;
}

bothWays(
  "1. one user cannot slow another: B's round trip while A's sandbox locks, FIFOs and poisons its queue",
  async (docker, attacker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const a = home.open(uniqueUser("slow-a"));
    const b = home.open(uniqueUser("slow-b"));
    await Promise.all([runOk(a, "true"), runOk(b, "true")]);
    const bContainer = containerOf(b);
    const bStarted = await startedAt(docker, bContainer);

    const rows: string[][] = [];
    const failures: string[] = [];
    for (const attack of ATTACKS) {
      if (attacker.kind === "command") {
        // Refused (EACCES) before anything is in place: A and B unharmed.
        assert.equal(await attack.mount(attacker, a), null, attack.name);
        continue;
      }
      // B's baseline just before each attack: the machine's load drifts (other
      // suites may run on it), and the ratio is about A's attack alone.
      const baseline = await roundTrips(b);
      log(
        `[${attack.name}] B baseline: p50 ${fmt(baseline.p50)}, p90 ${fmt(baseline.p90)}, max ${
          fmt(baseline.max)
        } (n=${baseline.n})`,
      );
      const mounted = (await attack.mount(attacker, a))!;
      // The fleet CLI first: nothing revives A before A's own call notices the attack.
      if (attack.fleetCli) failures.push(...await fleetUnderAttack(home, attack, mounted));
      const aCall = timedCall(a, "echo a-call");
      let aDone = false;
      void aCall.then(() => (aDone = true));
      let under: Rtt;
      let stillInPlace: boolean;
      let aOutcome: CallOutcome;
      const recovering: number[] = [];
      try {
        under = await roundTrips(b);
        stillInPlace = mounted.inPlace() && !aDone;
        log(
          `[${attack.name}] B under attack: p50 ${fmt(under.p50)}, p90 ${fmt(under.p90)}, max ${
            fmt(under.max)
          } (n=${under.n}); attack still in place after sampling: ${stillInPlace}`,
        );
        // B keeps going while A's host judges, kills and restarts A's sandbox.
        while (!aDone) {
          const started = performance.now();
          await run(b, "true");
          recovering.push(performance.now() - started);
        }
      } finally {
        aOutcome = await aCall;
        await mounted.release();
      }
      const during = summary(recovering);
      log(
        `[${attack.name}] A's concurrent call: ${aOutcome.outcome} after ${fmt(aOutcome.ms)} ` +
          `(host bounds: LOCK_WAIT_MS ${LOCK_WAIT_MS} ms, STALE_AFTER_MS ${STALE_AFTER_MS} ms); ` +
          (during.n === 0
            ? "B's samples outlasted it"
            : `B meanwhile: p50 ${fmt(during.p50)}, max ${fmt(during.max)} (n=${during.n})`),
      );
      assertEnded(`A's call under '${attack.name}'`, aOutcome);
      assert.equal(await runOk(a, "echo ok"), "ok\n", `A works again after '${attack.name}'`);

      const ratio = under.p50 / baseline.p50;
      rows.push([
        attack.name,
        fmt(baseline.p50),
        fmt(under.p50),
        ratio.toFixed(2),
        fmt(aOutcome.ms),
        aOutcome.outcome,
      ]);
      assert.ok(stillInPlace, `'${attack.name}' was gone before B's samples were done`);
      if (under.max > B_STALL_BOUND_MS) {
        failures.push(`B stalled for ${fmt(under.max)} under '${attack.name}'`);
      }
      if (during.n > 0 && during.max > B_STALL_BOUND_MS) {
        failures.push(
          `B stalled for ${fmt(during.max)} while A's sandbox was revived after '${attack.name}'`,
        );
      }
    }

    const header = [
      "attack",
      "B p50 baseline",
      "B p50 under attack",
      "ratio",
      "A call",
      "A outcome",
    ];
    const table = [header, ...rows];
    const widths = header.map((_, i) => Math.max(...table.map((row) => row[i]!.length)));
    log(table.map((row) => row.map((cell, i) => cell.padEnd(widths[i]!)).join(" | ")).join("\n"));

    // B was never touched by what happened to A.
    assert.equal(containerOf(b), bContainer, "B's container is the same");
    assert.equal(await startedAt(docker, bContainer), bStarted, "B's container was not restarted");
    assert.deepEqual(failures, []);
  },
);

// ---------------------------------------------------------------------------
// 2. Liveness is the host's judgement.

liveTest(
  "2a. a runner SIGSTOPped from the host: the wait returns interrupted, the container restarts, the command is gone",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const a = home.open(uniqueUser("stop-host"));
    await runOk(a, "true");
    const container = containerOf(a);
    const pidBefore = await runnerPid(container);
    const startedBefore = await startedAt(docker, container);

    const pidFile = join(a.paths.workspace, "pid");
    const id = await a.submit({ shell: "echo $$ > /workspace/pid; sleep 1000" });
    await waitFor(() => {
      try {
        return Deno.readTextFileSync(pidFile).trim() !== "";
      } catch {
        return false;
      }
    }, { timeoutMs: 20_000, what: "the command to start" });
    const top = await dockerCli(["top", container, "-o", "pid,args"]);
    const sleepLine = top.stdout.split("\n").find((line) => line.includes("sleep 1000"));
    assert.ok(sleepLine !== undefined, `sleep runs: ${top.stdout}`);
    const sleepHostPid = Number(sleepLine.trim().split(/\s+/)[0]);

    Deno.kill(pidBefore, "SIGSTOP");
    const stoppedAt = performance.now();
    try {
      const { result } = await a.queue.collect(id, { revive: (trouble) => a.ensure(trouble) });
      const ms = performance.now() - stoppedAt;
      await a.queue.ack(id);
      log(
        `SIGSTOP from the host: wait returned '${outcomeOf(result)}' after ${fmt(ms)} ` +
          `(STALE_AFTER_MS ${STALE_AFTER_MS} ms)`,
      );
      assert.equal(result.interrupted, true, JSON.stringify(result));
      assert.ok(ms < STALE_BOUND_MS, `the host took ${fmt(ms)} to call the runner dead`);
    } finally {
      try {
        Deno.kill(pidBefore, "SIGCONT");
      } catch {
        // Gone with the container, as it should be.
      }
    }
    assert.equal(containerOf(a), container, "the same container was restarted");
    const pidAfter = await runnerPid(container);
    assert.notEqual(pidAfter, pidBefore, "a new runner process");
    assert.equal(alive(pidBefore), false, "the stopped runner is dead");
    assert.notEqual(await startedAt(docker, container), startedBefore, "StartedAt changed");
    const after = await dockerCli(["top", container, "-o", "pid,args"]);
    assert.ok(!after.stdout.includes("sleep 1000"), `the sleep survived: ${after.stdout}`);
    assert.equal(alive(sleepHostPid), false, "the sleep's host pid is gone");
    assert.equal(await runOk(a, "echo ok"), "ok\n");
  },
);

bothWays(
  "2b. signalling the runner: a command cannot kill or stop it (EPERM) and the same runner keeps serving; the runner can, and the host calls it dead, restarts it and keeps the workspace",
  async (docker, attacker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const a = home.open(uniqueUser("kill-runner"));
    await runOk(a, "true");
    const container = containerOf(a);
    const pidBefore = await runnerPid(container);
    const startedBefore = await startedAt(docker, container);
    const bootBefore = a.queue.heartbeat()?.bootId;
    if (attacker.kind === "runner") return await runnerSignalsItself(attacker, a, bootBefore);

    for (
      const [how, attempt] of [
        ["a request", () => run(a, SIGNAL_RUNNER)],
        ["a leftover process", () => attacker.sh(a, SIGNAL_RUNNER)],
      ] as const
    ) {
      const out = await attempt();
      const stdout = out.stdout;
      log(
        `${how}: ${stdout.trim().split("\n").join(", ")}; stderr: ${
          out.stderr.trim().split("\n").join(" / ")
        }`,
      );
      const runner = field(stdout, "runner");
      assert.ok(runner !== undefined && /^\d+$/.test(runner), `${how} found the runner: ${stdout}`);
      for (const name of ["init", "stop", "kill"]) {
        assert.notEqual(field(stdout, name), "0", `${how}: '${name}' succeeded`);
      }
      assert.match(out.stderr, /not permitted/i, `${how}: EPERM`);
      assert.match(stdout, /CapEff:\s+0000000000000000/, `${how}: the command has no capabilities`);
    }
    // kill(-1) signals everything the caller may signal (Linux spares the
    // caller): its own background child dies, the runner does not.
    const everything = await run(
      a,
      'sleep 100 & kill -9 -1; echo "kill=$?"; wait $!; echo "bg=$?"',
    );
    log(
      `kill -9 -1: ${outcomeOf(everything.result)}, ${
        everything.stdout.trim().split("\n").join(", ")
      }`,
    );
    assert.equal(
      field(everything.stdout, "bg"),
      "137",
      "kill -9 -1 reached the command's own child",
    );
    assert.equal(await runnerPid(container), pidBefore, "the runner is the same process");
    assert.equal(
      await startedAt(docker, container),
      startedBefore,
      "the container never restarted",
    );
    assert.equal(a.queue.heartbeat()?.bootId, bootBefore, "same runner boot");
    assert.equal(a.queue.liveness().state, "alive");
    assert.equal(await runOk(a, "echo still serving"), "still serving\n");
  },
);

/**
 * The runner's uid stops the runner while a command runs, then kills it: the
 * host calls it dead by its own clock (the wait returns interrupted), starts
 * a new runner, and the next call runs with the workspace kept. A command
 * cannot do either (the other variant).
 */
async function runnerSignalsItself(
  attacker: Attacker,
  a: Sandbox,
  bootBefore: string | undefined,
): Promise<void> {
  await runOk(a, "echo kept > /workspace/kept");
  const id = await a.submit({ shell: "echo started > /workspace/started; sleep 1000" });
  await waitFor(() => {
    try {
      return Deno.readTextFileSync(join(a.paths.workspace, "started")) === "started\n";
    } catch {
      return false;
    }
  }, { timeoutMs: 20_000, what: "the command to start" });
  const stop = await attacker.sh(a, `${FIND_RUNNER}\nkill -STOP "$runner"; echo "stop=$?"`);
  assert.equal(
    field(stop.stdout, "stop"),
    "0",
    `the runner's uid stops the runner: ${stop.stderr}`,
  );
  const stoppedAt = performance.now();
  const { result } = await a.queue.collect(id, { revive: (trouble) => a.ensure(trouble) });
  const ms = performance.now() - stoppedAt;
  await a.queue.ack(id);
  const bootAfterStop = a.queue.heartbeat()?.bootId;
  log(`runner stopped by its own uid: wait returned '${outcomeOf(result)}' after ${fmt(ms)}`);
  assert.equal(result.interrupted, true, JSON.stringify(result));
  assert.ok(ms < STALE_BOUND_MS, `the host took ${fmt(ms)} to call the runner dead`);
  assert.ok(bootAfterStop !== undefined && bootAfterStop !== bootBefore, "a new runner beats");

  // Killed outright: docker-init, and the container, end with it.
  const kill = await attacker.sh(a, `${FIND_RUNNER}\nkill -KILL "$runner"; echo "kill=$?"`);
  assert.match(kill.stdout, /^runner=\d+$/m, kill.stdout);
  const started = performance.now();
  const after = await timedCall(a, "cat /workspace/kept");
  log(
    `runner killed by its own uid (exec exit ${kill.code}): the next call ${after.outcome} ` +
      `after ${fmt(performance.now() - started)}`,
  );
  assert.equal(after.stdout, "kept\n", after.outcome);
  assert.ok(after.ms < CALL_BOUND_MS, `the next call took ${fmt(after.ms)}`);
  assert.notEqual(a.queue.heartbeat()?.bootId, bootAfterStop, "a new runner after the kill");
}

/**
 * Replaces the heartbeat file (as the runner does, written aside and renamed
 * over) with the last beat, same boot id and seq, its time a year ahead.
 */
const FUTURE_HEARTBEAT_SCRIPT = `
const path = "/queue/outbound/heartbeat.json";
const beat = JSON.parse(Deno.readTextFileSync(path));
beat.time = Date.now() + 365 * 24 * 3600 * 1000;
Deno.writeTextFileSync(path + ".forged", JSON.stringify(beat));
Deno.renameSync(path + ".forged", path);
console.log(JSON.stringify(beat));
`;

/** A command's attempt to forge a heartbeat: the file, the database, a real SQLite client. */
const COMMAND_FORGE_SCRIPT = `
ls /queue/outbound > /dev/null; echo "ls=$?"
(echo '{"runnerId":"forged","bootId":"forged","seq":1,"time":1,"state":"running"}' > /queue/outbound/heartbeat.json); echo "beat=$?"
(echo forged >> /queue/outbound/outbound.db); echo "append=$?"
DENO_DIR=/tmp/forge-deno /opt/waffle/deno eval '
import { DatabaseSync } from "node:sqlite";
try {
  const db = new DatabaseSync("/queue/outbound/outbound.db");
  db.exec("UPDATE meta SET max_started_seq = max_started_seq + 1");
  console.log("sqlite=FORGED");
} catch (error) {
  console.log("sqlite=denied: " + (error instanceof Error ? error.message : String(error)));
}'`;

bothWays(
  "2c. a heartbeat from the future: a command cannot write one at all; the runner's does not keep a stopped runner alive",
  async (docker, attacker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const a = home.open(uniqueUser("future"));
    await runOk(a, "true");
    const bootBefore = a.queue.heartbeat()?.bootId;
    assert.ok(bootBefore !== undefined);

    if (attacker.kind === "command") {
      // A command (uid 10001), through a real request, cannot even open the runner's directory.
      const forged = await run(a, COMMAND_FORGE_SCRIPT);
      log(`command forging a heartbeat: ${forged.stdout.trim().split("\n").join(", ")}`);
      for (const name of ["ls", "beat", "append"]) {
        assert.equal(field(forged.stdout, name), "1", `the command's '${name}': ${forged.stdout}`);
      }
      assert.match(forged.stderr, /Permission denied/);
      const sqlite = field(forged.stdout, "sqlite");
      assert.ok(sqlite !== undefined, `the SQLite attempt ran: ${forged.stdout}${forged.stderr}`);
      assert.match(sqlite, /^denied: unable to open database file/);
      assert.equal(a.queue.heartbeat()?.bootId, bootBefore, "the runner was restarted");
      assert.equal(a.queue.liveness().state, "alive");
      return;
    }

    // The runner's uid stops the runner, then rewrites its beat a year ahead.
    const pidFile = join(a.paths.workspace, "pid");
    const id = await a.submit({ shell: "echo $$ > /workspace/pid; sleep 1000" });
    await waitFor(() => {
      try {
        return Deno.readTextFileSync(pidFile).trim() !== "";
      } catch {
        return false;
      }
    }, { timeoutMs: 20_000, what: "the command to start" });
    const stop = await attacker.sh(a, `${FIND_RUNNER}\nkill -STOP "$runner"; echo "stop=$?"`);
    assert.equal(field(stop.stdout, "stop"), "0", `kill -STOP as the runner's uid: ${stop.stderr}`);
    const stoppedAt = performance.now();
    const written = await mount(attacker, a, FUTURE_HEARTBEAT_SCRIPT);
    const forgedBeat = JSON.parse(written!) as { time: number; bootId: string };
    assert.equal(forgedBeat.bootId, bootBefore);

    const collected = a.queue.collect(id, { revive: (trouble) => a.ensure(trouble) });
    // The host reads the forged beat (a year ahead) and still calls the runner dead.
    let sawFuture = 0;
    let done = false;
    const watch = (async () => {
      while (!done && performance.now() - stoppedAt < STALE_BOUND_MS) {
        const beat = a.queue.liveness().beat;
        if (beat !== undefined && beat.bootId === bootBefore) {
          sawFuture = Math.max(sawFuture, beat.time - Date.now());
        }
        await new Promise((resolve) => setTimeout(resolve, 250));
      }
    })();
    const { result } = await collected;
    const ms = performance.now() - stoppedAt;
    done = true;
    await watch;
    await a.queue.ack(id);
    log(
      `heartbeat from the future (${(sawFuture / 86_400_000).toFixed(0)} days ahead, same seq): ` +
        `wait returned '${outcomeOf(result)}' after ${fmt(ms)}`,
    );
    assert.ok(sawFuture > 300 * 86_400_000, "the host read the forged future time");
    assert.equal(result.interrupted, true, JSON.stringify(result));
    assert.ok(ms < STALE_BOUND_MS, `the host took ${fmt(ms)} to call the runner dead`);
    const beat = a.queue.heartbeat();
    assert.ok(beat !== undefined && beat.bootId !== bootBefore, "a new runner beats");
    assert.equal(await runOk(a, "echo ok"), "ok\n");
  },
);

/**
 * A forger beside the stopped runner: rewrites the heartbeat file as the
 * runner would (seq and time moving, written aside and renamed over) every
 * 500 ms, for at most 90 s.
 */
const FORGER_SCRIPT = `
const path = "/queue/outbound/heartbeat.json";
const beat = JSON.parse(Deno.readTextFileSync(path));
const until = Date.now() + 90_000;
let ready = false;
while (Date.now() < until) {
  beat.seq++;
  beat.time = Date.now();
  Deno.writeTextFileSync(path + ".forged", JSON.stringify(beat));
  Deno.renameSync(path + ".forged", path);
  if (!ready) console.log("forging");
  ready = true;
  await new Promise((resolve) => setTimeout(resolve, 500));
}
`;

/** How long 2f gives the host's wait to end by itself. */
const BEATING_BOUND_MS = 45_000;

bothWays(
  "2f. a runner that keeps beating but never serves (stopped, its heartbeat forged on): the host's wait still ends, and the next call is served",
  async (docker, attacker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const a = home.open(uniqueUser("beating"));
    await runOk(a, "echo kept > /workspace/kept");
    const forger = await mountInBackground(attacker, a, FORGER_SCRIPT, "forging");
    if (forger === null) return; // a command cannot write the heartbeat (EACCES)
    await using _forger = forger;
    const stop = await attacker.sh(a, `${FIND_RUNNER}\nkill -STOP "$runner"; echo "stop=$?"`);
    assert.equal(field(stop.stdout, "stop"), "0", stop.stderr);
    const call = timedCall(a, "cat /workspace/kept");
    const ended = await Promise.race([
      call.then((outcome) => outcome),
      new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), BEATING_BOUND_MS)),
    ]);
    log(
      `a stopped runner with a forged, moving heartbeat: the call ${
        ended === undefined ? `had not ended after ${fmt(BEATING_BOUND_MS)}` : ended.outcome
      }; liveness ${a.queue.liveness().state}`,
    );
    assert.ok(ended !== undefined, `the host's wait did not end within ${fmt(BEATING_BOUND_MS)}`);
    assertEnded("the call to a beating, stopped runner", ended);
    await forger.stop();
    assert.equal(await runOk(a, "cat /workspace/kept"), "kept\n");
  },
  {
    sanitizeOps: false,
    sanitizeResources: false,
  },
);

/**
 * Marks a request id no host ever submitted as started (with no result): the
 * runner's word that something is in flight. As the runner's uid it lands
 * (true); a command is refused (EACCES, checked unharmed) and false.
 */
async function forgeStarted(attacker: Attacker, a: Sandbox, id: string): Promise<boolean> {
  const planted = await mount(
    attacker,
    a,
    `import { DatabaseSync } from "node:sqlite";
     const db = new DatabaseSync("/queue/outbound/outbound.db");
     db.exec("PRAGMA busy_timeout = 10000");
     const id = ${JSON.stringify(id)};
     db.prepare("INSERT INTO states (request_id, state, boot_id, accepted_at, started_at) VALUES (?, 'started', 'forged', ?, ?)").run(id, Date.now(), Date.now());
     console.log(JSON.stringify(db.prepare("SELECT request_id, state FROM states WHERE request_id = ?").get(id)));`,
  );
  if (planted === null) return false;
  assert.deepEqual(JSON.parse(planted), { request_id: id, state: "started" });
  return true;
}

/** How long 2d lets the forged in-flight row delay a recycle (the library's default is 60 s). */
const GRACE_MS = 8_000;
const FULL_GRACE = Deno.env.get("WAFFLE_HOSTILE_FULL_GRACE") === "1";

bothWays(
  "2d. a forged in-flight row delays a recycle by at most the drain grace",
  async (docker, attacker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const user = uniqueUser("forged-busy");
    const a = home.open(user);
    await runOk(a, "true");
    const container = containerOf(a);
    const forgedId = `forged-${crypto.randomUUID()}`;
    if (!await forgeStarted(attacker, a, forgedId)) return;
    log(
      `forged in-flight row: the host lists it in flight: ${a.queue.inFlight().includes(forgedId)}`,
    );

    // Another posture (pidsLimit): the next ensure must recycle the container.
    const recycled = home.open(user, { config: { pidsLimit: 300 } });
    const started = performance.now();
    let ensured: Ensured;
    if (FULL_GRACE) {
      await recycled.ensure();
      ensured = recycled.lastEnsure!;
    } else {
      ensured = await withLock(recycled.paths.lock, () =>
        ensureContainer(docker, recycled.key, {
          config: recycled.config,
          paths: recycled.paths,
          queue: recycled.queue,
          drainTimeoutMs: GRACE_MS,
        }));
    }
    const ms = performance.now() - started;
    const grace = FULL_GRACE ? 60_000 : GRACE_MS;
    log(
      `forged in-flight row: recycle ${ensured.action} after ${fmt(ms)} (drain grace ${
        grace / 1000
      } s${
        FULL_GRACE ? ", the default, through sandbox.ensure()" : ", through ensureContainer()"
      }); forged row still listed after the recycle: ${
        recycled.queue.inFlight().includes(forgedId)
      }`,
    );
    assert.equal(ensured.action, "recreated");
    assert.notEqual(ensured.containerId, container);
    assert.ok(ms < grace + 15_000, `the recycle took ${fmt(ms)} with a ${grace / 1000} s grace`);
    assert.equal(
      (await runOk(
        recycled,
        "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max",
      )).trim(),
      "300",
    );
  },
);

bothWays(
  "2e. a forged in-flight row does not exempt a sandbox from sweep's running cap",
  async (docker, attacker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const a = home.open(uniqueUser("cap-a"));
    const b = home.open(uniqueUser("cap-b"));
    await Promise.all([runOk(a, "true"), runOk(b, "true")]);
    if (!await forgeStarted(attacker, a, "forged-cap")) return;
    const out = await home.cli(["sweep", "--max-running", "1", "--idle-seconds", "0", "--json"]);
    assert.equal(out.code, 0, out.stderr);
    const actions = (JSON.parse(out.stdout) as {
      actions: { user: string; action: string; reason: string }[];
    }).actions.filter((action) => action.user === a.key.user || action.user === b.key.user);
    const running = (await homeContainers(docker, home.home)).filter((c) => c.State === "running");
    log(
      `sweep --max-running 1 with a forged in-flight row in A: ${
        actions.map((x) => `${x.user}: ${x.action} (${x.reason})`).join("; ")
      }; running afterwards: ${running.length}`,
    );
    assert.ok(
      running.length <= 1,
      `${running.length} containers still run under a cap of 1: sweep believed a 'started' ` +
        "row the sandbox wrote for a request no host ever submitted, and left that container " +
        "out of the cap",
    );
  },
);

// ---------------------------------------------------------------------------
// 3. Disk quota.

/** Free bytes of the filesystem holding `path`, after writing back every dirty page. */
function dfAvail(path: string): number {
  // All of them: the volume's own page cache first reaches its image, then the host's disk.
  new Deno.Command("sync").outputSync();
  const out = new Deno.Command("df", { args: ["-B1", "--output=avail", path] }).outputSync();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  return Number(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1));
}

async function sh(program: string, args: string[]): Promise<{ code: number; output: string }> {
  const out = await new Deno.Command(program, { args, stdout: "piped", stderr: "piped" }).output();
  const decoder = new TextDecoder();
  return { code: out.code, output: decoder.decode(out.stdout) + decoder.decode(out.stderr) };
}

const QUOTA = 256 * MiB;
/**
 * What the host may lose beyond the quota: the host's own half of the state
 * (inbound.db and its journal, the bell, the lock file) outside the volume;
 * a few hundred KiB on a tmpfs that counts 4 KiB pages. The volume image is
 * sparse and exactly QUOTA bytes long, so it cannot hold more.
 */
const QUOTA_SLACK = 1 * MiB;

bothWays(
  "3. disk quota: 1 GiB written into the volume (a command: /workspace; the runner: /queue/outbound, reserve included) gets ENOSPC, the host loses at most the quota, the sandbox serves on with the workspace kept",
  async (docker, attacker) => {
    // A filesystem of its own for this home, so the free-space figure is this
    // sandbox's alone (other tests on the machine write to /tmp meanwhile).
    const base = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-quota-fs-" }));
    const mounted = await sh("mount", ["-t", "tmpfs", "-o", "size=1536m,mode=0700", "tmpfs", base]);
    assert.equal(mounted.code, 0, mounted.output);
    const home = join(base, "home");
    await Deno.mkdir(home, { mode: 0o700 });
    let sandbox: Sandbox | undefined;
    try {
      const before = dfAvail(home);
      sandbox = openSandbox(uniqueUser("quota"), {
        config: { home, quotaBytes: QUOTA, idleSeconds: 600 },
        docker,
      });
      await runOk(sandbox, "echo kept > /workspace/kept");
      assert.ok(sandbox.volume?.enforced, `quota not enforced: ${sandbox.volume?.reason}`);
      const afterStart = dfAvail(home);

      // Each where it may write: a command in the workspace (its share of the
      // volume), the runner in its queue (uid 0: the reserve as well).
      const runner = attacker.kind === "runner";
      const [inside, onHost] = runner
        ? ["/queue/outbound/big", join(sandbox.paths.outbound, "big")]
        : ["/workspace/big", join(sandbox.paths.workspace, "big")];
      const started = performance.now();
      // 1 GiB (busybox's head has no "1G", and reports any write error as "I/O error").
      const fill = `dd if=/dev/zero of=${inside} bs=1M count=1024`;
      const filled = runner
        ? { ...await attacker.sh(sandbox, fill), result: undefined }
        : await run(sandbox, fill);
      const fillMs = performance.now() - started;
      const afterFill = dfAvail(home);
      const bigBytes = Deno.statSync(onHost).size;
      const image = Deno.statSync(join(sandbox.paths.root, "volume.img"));
      const drop = before - afterFill;
      log(
        `disk quota ${QUOTA / MiB} MiB: write of 1 GiB into ${inside} as ${attacker.label} ended '${
          filled.result === undefined ? `exit ${filled.code}` : outcomeOf(filled.result)
        }' after ${fmt(fillMs)} with stderr '${
          filled.stderr.trim().split("\n").join(" / ")
        }'; ${inside} ${(bigBytes / MiB).toFixed(1)} MiB; ` +
          `host free space dropped ${(drop / MiB).toFixed(1)} MiB (start ${
            ((before - afterStart) / MiB).toFixed(1)
          } MiB); volume.img ${(image.size / MiB).toFixed(0)} MiB long, ${
            ((image.blocks ?? 0) * 512 / MiB).toFixed(1)
          } MiB allocated`,
      );
      if (filled.result === undefined) assert.notEqual(filled.code, 0, "the write succeeded");
      else {
        // The runner still recorded the command's result (its reserve).
        assert.notEqual(filled.result.exitCode, 0, "the write succeeded past the quota");
        assert.equal(filled.result.interrupted, false, JSON.stringify(filled.result));
      }
      assert.match(filled.stderr, /No space left/);
      assert.ok(bigBytes < QUOTA, `the command wrote ${bigBytes} bytes`);
      assert.ok(
        drop <= QUOTA + QUOTA_SLACK,
        `host free space dropped ${drop} bytes, more than the quota ${QUOTA} + ${QUOTA_SLACK}`,
      );

      // A full volume, reserve and all, must not brick the sandbox: the next
      // call runs (healing as it must) with the workspace kept.
      const next = await timedCall(sandbox, "cat /workspace/kept");
      log(`the next call on the full volume: ${next.outcome} after ${fmt(next.ms)}`);
      assert.equal(next.stdout, "kept\n", `the next call on the full volume: ${next.outcome}`);
      assert.ok(next.ms < CALL_BOUND_MS, `the next call took ${fmt(next.ms)}`);
      if (!runner) assert.equal(await runOk(sandbox, "rm /workspace/big; echo ok"), "ok\n");
      const afterRm = dfAvail(home);
      log(
        `after the next call${runner ? "" : " and 'rm /workspace/big'"}: host free space ${
          ((before - afterRm) / MiB).toFixed(1)
        } MiB below the start`,
      );
    } finally {
      sandbox?.close();
      await removeHomeContainers(docker, home);
      if (sandbox !== undefined) await removeVolume(sandbox.paths.root);
      const unmounted = await sh("umount", [base]);
      if (unmounted.code !== 0) await sh("umount", ["-l", base]);
      await Deno.remove(base, { recursive: true }).catch(() => {});
    }
  },
);

liveTest("3b. waffle doctor reports the disk quota", async (docker) => {
  await using home = await tempHome(docker, { quotaBytes: QUOTA });
  const out = await runCliProcess(["doctor", "--json"], { env: { WAFFLE_HOME: home.home } });
  const report = JSON.parse(out.stdout) as {
    ok: boolean;
    checks: { name: string; ok: boolean; detail: string }[];
  };
  log(
    `doctor rows: ${report.checks.map((c) => `${c.ok ? "ok" : "FAIL"} ${c.name}`).join("; ")}`,
  );
  const row = report.checks.find((check) => /quota|disk/i.test(check.name));
  assert.ok(row !== undefined, "doctor has no row about the disk quota");
  log(`doctor's disk quota row: ${JSON.stringify(row)}`);
  assert.ok(row.ok, `doctor's disk quota row fails: ${row.detail}`);
  // The configured quota (256 MiB), however it is spelled.
  assert.match(row.detail, /268435456|256 ?MiB|256 ?M\b/);
});

// ---------------------------------------------------------------------------
// 4. A non-root host.

const NONROOT_USER = "waffle-nonroot";

async function ensureNonrootUser(): Promise<{ uid: number; gid: number; created: boolean }> {
  let created = false;
  if ((await sh("id", ["-u", NONROOT_USER])).code !== 0) {
    const add = await sh("useradd", [
      "--system",
      "--no-create-home",
      "--shell",
      "/usr/sbin/nologin",
      "-G",
      "docker",
      NONROOT_USER,
    ]);
    assert.equal(add.code, 0, add.output);
    created = true;
  }
  const groups = (await sh("id", ["-Gn", NONROOT_USER])).output.trim().split(/\s+/);
  if (!groups.includes("docker")) {
    const mod = await sh("usermod", ["-aG", "docker", NONROOT_USER]);
    assert.equal(mod.code, 0, mod.output);
  }
  const uid = Number((await sh("id", ["-u", NONROOT_USER])).output.trim());
  const gid = Number((await sh("id", ["-g", NONROOT_USER])).output.trim());
  return { uid, gid, created };
}

interface Cli {
  code: number;
  stdout: string;
  stderr: string;
}

/** A waffle home owned by the non-root user, and the CLI from source run as that user. */
interface NonrootHost {
  who: { uid: number; gid: number; created: boolean };
  /** A temp dir the user owns (its HOME and DENO_DIR live there). */
  root: string;
  /** Its WAFFLE_HOME. */
  home: string;
  cli(args: string[]): Promise<Cli>;
  [Symbol.asyncDispose](): Promise<void>;
}

async function nonrootHost(docker: DockerClient, config?: HomeConfig): Promise<NonrootHost> {
  assert.equal(Deno.uid(), 0, "this test creates a user and switches to it: run it as root");
  const who = await ensureNonrootUser();
  const root = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-nonroot-" }));
  await Deno.chown(root, who.uid, who.gid);
  await Deno.chmod(root, 0o700);
  const home = join(root, "home");
  if (config !== undefined) {
    await Deno.mkdir(home, { mode: 0o700 });
    const { sandboxToml } = await import("../lib/config/config.ts");
    await Deno.writeTextFile(join(home, "waffle.toml"), sandboxToml(config));
    await Deno.chown(home, who.uid, who.gid);
    await Deno.chown(join(home, "waffle.toml"), who.uid, who.gid);
  }
  const repo = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
  return {
    who,
    root,
    home,
    async cli(args: string[]): Promise<Cli> {
      const out = await new Deno.Command("setpriv", {
        args: [
          `--reuid=${who.uid}`,
          `--regid=${who.gid}`,
          "--init-groups",
          "--",
          Deno.execPath(),
          "run",
          "--allow-all",
          "--quiet",
          "--no-prompt",
          "--cached-only",
          "--node-modules-dir=manual",
          "--config",
          join(repo, "deno.json"),
          join(repo, "main.ts"),
          ...args,
        ],
        clearEnv: true,
        env: {
          PATH: "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
          HOME: root,
          DENO_DIR: join(root, "deno"),
          DENO_NO_UPDATE_CHECK: "1",
          NO_COLOR: "1",
          WAFFLE_HOME: home,
          WAFFLE_IDLE_SECONDS: "600",
        },
        stdout: "piped",
        stderr: "piped",
      }).output();
      const decoder = new TextDecoder();
      return {
        code: out.code,
        stdout: decoder.decode(out.stdout),
        stderr: decoder.decode(out.stderr),
      };
    },
    async [Symbol.asyncDispose](): Promise<void> {
      await removeHomeContainers(docker, home);
      await removeHomeVolumes(home);
      await Deno.remove(root, { recursive: true }).catch(() => {});
    },
  };
}

function oneLine(text: string): string {
  return text.trim().split("\n").join(" / ");
}

liveTest("4. a non-root host (docker group) is as safe as a root host", async (docker) => {
  await using host = await nonrootHost(docker);
  const { who, home } = host;
  const user = uniqueUser("nonroot");
  const exec = (...command: string[]): Promise<Cli> =>
    host.cli(["exec", "--user", user, "--", ...command]);
  log(
    `non-root host: ${NONROOT_USER} uid ${who.uid} gid ${who.gid} (created now: ${who.created})`,
  );

  const uid = await exec("id", "-u");
  log(
    `waffle exec -- id -u as ${NONROOT_USER}: exit ${uid.code}, stdout '${uid.stdout.trim()}', ` +
      `stderr '${oneLine(uid.stderr)}'`,
  );
  assert.equal(uid.code, 0, `waffle exec as a non-root host failed: ${uid.stderr}`);
  assert.equal(uid.stdout.trim(), "10001");
  assert.notEqual(Number(uid.stdout.trim()), who.uid);

  const id = await exec("id");
  log(`command identity: ${id.stdout.trim()}`);
  assert.equal(id.code, 0, id.stderr);
  assert.match(id.stdout, /^uid=10001\b.* gid=10001\b/);
  assert.doesNotMatch(
    id.stdout,
    new RegExp(`\\b${who.gid}\\b`),
    "the command has the host's group",
  );

  const [container] = await homeContainers(docker, home);
  assert.ok(container !== undefined, "the sandbox's container exists");
  const pid = await runnerPid(container.Id);
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  const runnerUid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
  const runnerGroups = /^Groups:\s*(.*)$/m.exec(status)?.[1]?.trim() ?? "";
  log(`container runner: host uid ${runnerUid}, groups '${runnerGroups}'`);
  assert.notEqual(runnerUid, who.uid, "the runner runs as the host user's uid");

  const inbound = await exec(
    "sh",
    "-c",
    "ls /queue/inbound; cat /queue/inbound/inbound.db > /dev/null",
  );
  log(`command reading /queue/inbound: exit ${inbound.code}, stderr '${oneLine(inbound.stderr)}'`);
  assert.notEqual(inbound.code, 0, "the command read /queue/inbound");
  assert.match(inbound.stderr, /Permission denied/);

  const outbound = await exec(
    "sh",
    "-c",
    "touch /queue/outbound/planted; echo x >> /queue/outbound/outbound.db",
  );
  log(
    `command writing /queue/outbound: exit ${outbound.code}, stderr '${oneLine(outbound.stderr)}'`,
  );
  assert.notEqual(outbound.code, 0, "the command wrote into /queue/outbound");
  assert.match(outbound.stderr, /Permission denied/);

  const result = await host.cli([
    "exec",
    "--user",
    user,
    "--json",
    "--",
    "sh",
    "-c",
    "echo out; echo err >&2; exit 7",
  ]);
  log(`waffle exec --json as ${NONROOT_USER}: exit ${result.code}, ${result.stdout.trim()}`);
  const parsed = JSON.parse(result.stdout) as { exitCode: number; stdout: string; stderr: string };
  assert.equal(result.code, 7);
  assert.equal(parsed.exitCode, 7);
  assert.equal(parsed.stdout, "out\n");
  assert.equal(parsed.stderr, "err\n");
});

liveTest(
  "4b. a non-root host's 'rm --purge' removes what its commands wrote, or says it could not",
  async (docker) => {
    await using host = await nonrootHost(docker);
    const user = uniqueUser("nonroot-purge");
    // An ordinary build output: a directory (0755, the command's uid) with a file in it.
    const planted = await host.cli([
      "exec",
      "--user",
      user,
      "--",
      "sh",
      "-c",
      "mkdir -p /workspace/build && echo x > /workspace/build/out",
    ]);
    assert.equal(planted.code, 0, planted.stderr);
    const purge = await host.cli(["rm", "--user", user, "--purge"]);
    const left = [...Deno.readDirSync(join(host.home, "sandboxes"))].map((entry) => entry.name);
    log(
      `waffle rm --purge as ${NONROOT_USER}: exit ${purge.code}, stdout '${
        oneLine(purge.stdout)
      }', stderr '${oneLine(purge.stderr)}'; state dirs left: ${left.length}`,
    );
    // Either the state is gone, or waffle says it is not (never "purged" when it was not).
    if (purge.code === 0) {
      assert.deepEqual(
        left,
        [],
        `'waffle rm --purge' said '${oneLine(purge.stdout)}' but left the sandbox's state, ` +
          "which the host user cannot delete (files of uid 10001)",
      );
    } else {
      assert.match(purge.stderr.trim(), /^waffle: [^\n]+$/, "one clear line");
    }
  },
);

liveTest(
  "4c. a non-root host cannot bound the sandbox's disk, and says so",
  async (docker) => {
    await using host = await nonrootHost(docker, { quotaBytes: QUOTA });
    const user = uniqueUser("nonroot-disk");
    // What the command sees: the size of the filesystem behind /workspace.
    const df = await host.cli(["exec", "--user", user, "--", "df", "-k", "/workspace"]);
    assert.equal(df.code, 0, df.stderr);
    const totalKiB = Number(df.stdout.trim().split("\n").at(-1)?.trim().split(/\s+/)[1]);
    const doctor = await host.cli(["doctor", "--json", "--no-docker"]);
    const quotaRow = (JSON.parse(doctor.stdout) as {
      checks: { name: string; ok: boolean; warning?: boolean; detail: string }[];
    }).checks.find((check) => /quota/i.test(check.name));
    log(
      `non-root host, quotaBytes ${QUOTA / MiB} MiB: /workspace is a ${
        (totalKiB / 1024).toFixed(0)
      } MiB filesystem; exec's stderr '${oneLine(df.stderr)}'; doctor's disk quota row ${
        JSON.stringify(quotaRow)
      }`,
    );
    if (totalKiB * 1024 <= QUOTA + 16 * MiB) return; // bounded after all: nothing to say
    // README, known limits: "a host in the docker group only runs unbounded, and doctor says so".
    assert.ok(quotaRow !== undefined, "doctor has no disk quota row");
    assert.equal(quotaRow.warning, true, `doctor does not warn: ${quotaRow.detail}`);
    assert.match(quotaRow.detail, /not enforced/i);
  },
);

bothWays(
  "a FIFO swapped in under a command's name while the runner checks it never wedges the runner",
  async (docker, attacker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const sandbox = home.open(uniqueUser("fifo-race"));
    await runOk(
      sandbox,
      "mkdir -p /workspace/race && printf '#!/bin/sh\\nexit 0\\n' > /workspace/race/f && " +
        "chmod 755 /workspace/race/f && mkfifo /workspace/race/p && cp /workspace/race/f /workspace/race/x",
    );
    // A process a command left behind (here: started beside the runner as the
    // commands' uid) swaps a FIFO and a script under the name, atomically, as
    // fast as Deno can, for at most a minute or until told to stop.
    await runOk(
      sandbox,
      `cat > /workspace/race/racer.js <<'JS'
const d = "/workspace/race";
const end = Date.now() + 60_000;
while (Date.now() < end) {
  try { Deno.statSync(d + "/stop"); break; } catch { /* not yet */ }
  for (let i = 0; i < 500; i++) {
    Deno.linkSync(d + "/p", d + "/t"); Deno.renameSync(d + "/t", d + "/x");
    Deno.linkSync(d + "/f", d + "/t"); Deno.renameSync(d + "/t", d + "/x");
  }
}
JS`,
    );
    const racer = attacker.sh(
      sandbox,
      "DENO_DIR=/tmp/racer HOME=/tmp /opt/waffle/deno run -A --quiet /workspace/race/racer.js",
    );
    if (attacker.kind === "runner") {
      // The runner's uid 0 has neither CAP_DAC_OVERRIDE nor CAP_FOWNER: it
      // can neither write the command's directory (EACCES) nor hard-link the
      // command's files (EPERM where fs.protected_hardlinks is on), so to race
      // there it must become a command: the other variant. A runner that
      // wedges itself is a stopped runner (2b).
      const refused = await racer;
      log(`the racer as the runner: exit ${refused.code}, ${refused.stderr.split("\n")[0]}`);
      assert.notEqual(refused.code, 0, "the runner's uid wrote the command's directory");
      assert.match(
        refused.stderr,
        /(Operation not permitted \(os error 1\)|Permission denied \(os error 13\)): link '\/workspace\/race\//,
      );
      assert.equal(await runOk(sandbox, "echo still serving"), "still serving\n");
      return;
    }
    try {
      let ran = 0;
      for (let i = 0; i < 40; i++) {
        // Each call ends (run, refused or not found), within a bound: a runner
        // blocked opening the FIFO would hold this and every later call.
        const call = run(sandbox, { argv: ["/workspace/race/x"], timeoutMs: 3000 });
        const ended = await Promise.race([
          call.then(() => true),
          new Promise<false>((resolve) => setTimeout(() => resolve(false), CALL_BOUND_MS)),
        ]);
        assert.ok(ended, `call ${i + 1} did not end within ${CALL_BOUND_MS} ms`);
        ran++;
      }
      assert.equal(ran, 40);
    } finally {
      await attacker.sh(sandbox, "touch /workspace/race/stop");
      await racer;
    }
    assert.equal(await runOk(sandbox, "echo still serving"), "still serving\n");
  },
  { sanitizeOps: false, sanitizeResources: false },
);
