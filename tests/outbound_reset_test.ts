// deno-lint-ignore-file no-console -- measured figures go in the closing note
/**
 * Host work on trees the sandbox shapes is bounded and crash-proof: the
 * reset of a damaged `outbound/` (`resetOutbound`), `rm --purge`, and what
 * a host killed midway leaves for the next call (issue 13, deliverable 2).
 *
 * The attack: a directory tree 20,000 levels deep, built by a compromised
 * runner in `/queue/outbound` (then `outbound.db` damaged, so the host sets
 * the directory aside and removes it), or by a command in `/workspace` (which
 * `rm --purge` removes). A recursive delete in the host process aborted it
 * (exit 134, the stack overflowed): every test runs the host side as a real
 * process (`waffle exec`, `waffle rm`, a library process serving two users)
 * and checks that it ended by itself, that the next call succeeds with the
 * workspace kept, that the tree is eventually gone, and that no link in it
 * was followed (victim files outside the home stay as they were).
 *
 * Timings are printed for the closing note, never asserted; waits for "gone"
 * or "healed" have deadlines only so that a regression fails instead of
 * hanging.
 *
 * @module
 */
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import type { DockerClient } from "../lib/docker/mod.ts";
import { selfCommand } from "../lib/config/self.ts";
import { libc } from "../lib/libc.ts";
import { outboundReplaced } from "../lib/lifecycle/outbound_in_place.ts";
import { removeTree } from "../lib/lifecycle/remove_tree.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import { inspectState, RESET_KILL_ENV, type ResetStep } from "../lib/lifecycle/state_dir.ts";
import { readWarm } from "../lib/lifecycle/warm.ts";
import { liveTest } from "./_docker_gate.ts";
import { runCliProcess, text, waitFor } from "./_helpers.ts";
import {
  asRunner,
  COMMAND,
  mount,
  spawnAsRunner,
  type Victim,
  victimFile,
} from "./_hostile_helpers.ts";
import {
  DAMAGE_SCRIPT,
  deepTreeScript,
  LOCKED_DAMAGE_SCRIPT,
  TREE_DEPTH,
} from "./_runner_attacks.ts";
import {
  removeHomeContainers,
  removeHomeVolumes,
  tempHome,
  type TestHome,
  uniqueUser,
} from "./_sandbox_helpers.ts";

// The host's safe reads load libc once per process: here, before any test.
libc();

/** The depth that overflowed the host's stack. */
const DEPTH = TREE_DEPTH;
/** How long a removal may take before the test calls it stuck. */
const GONE_DEADLINE_MS = 90_000;
/** What an abort (SIGABRT) exits with. */
const ABORTED = 134;

const log = (...args: unknown[]): void => console.log(...args);

function fmt(ms: number): string {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
}

function p50(samples: number[]): number {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.max(0, Math.ceil(0.5 * sorted.length) - 1)] ?? NaN;
}

// ---------------------------------------------------------------------------
// Homes, attacks and real host processes.

/**
 * A temp home whose disposal never recurses in this process over a tree a
 * sandbox left (the helper's own removal is `Deno.remove`, which a deep tree
 * aborts): containers, then volumes, then the home through `removeTree`.
 */
async function resetHome(docker: DockerClient): Promise<TestHome> {
  const home = await tempHome(docker, { idleSeconds: 600 });
  return {
    ...home,
    async [Symbol.asyncDispose](): Promise<void> {
      try {
        await removeHomeContainers(docker, home.home);
        await removeHomeVolumes(home.home);
        await removeTree(home.home);
      } finally {
        await home[Symbol.asyncDispose]();
      }
    },
  };
}

function deepTree(dir: string, victim?: Victim): string {
  return deepTreeScript(
    dir,
    victim === undefined ? undefined : { file: victim.path, dir: dirname(victim.path) },
  );
}

/** A deep tree in /queue/outbound, then the damage, as the compromised runner. */
async function treeThenDamage(sandbox: Sandbox, victim?: Victim): Promise<void> {
  const name = sandbox.key.containerName;
  const built = await asRunner(name, deepTree("/queue/outbound", victim));
  assert.equal(built.code, 0, `the tree as the runner: ${built.stdout}${built.stderr}`);
  assert.match(built.stdout, new RegExp(`depth ${DEPTH}`));
  const damaged = await asRunner(name, DAMAGE_SCRIPT);
  assert.equal(damaged.code, 0, `the damage as the runner: ${damaged.stdout}${damaged.stderr}`);
}

/** How a host process ended. */
interface Ended {
  code: number;
  signal: Deno.Signal | null;
  stdout: string;
  stderr: string;
  ms: number;
}

/** Runs the CLI from source as a child process of this home, timed. */
async function cli(
  home: TestHome,
  args: string[],
  env: Record<string, string> = {},
): Promise<Ended> {
  const self = selfCommand();
  const started = performance.now();
  const out = await new Deno.Command(self.executable, {
    args: [...self.prefix, ...args],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    env: { WAFFLE_HOME: home.home, ...env },
  }).output();
  return {
    code: out.code,
    signal: out.signal,
    stdout: text(out.stdout),
    stderr: text(out.stderr),
    ms: performance.now() - started,
  };
}

function exec(
  home: TestHome,
  user: string,
  shell: string,
  env?: Record<string, string>,
): Promise<Ended> {
  return cli(home, ["exec", "--user", user, "--", "sh", "-c", shell], env);
}

function said(ended: Ended): string {
  const signal = ended.signal === null ? "" : ` (${ended.signal})`;
  return `exit ${ended.code}${signal} in ${fmt(ended.ms)}: ${ended.stderr.trim().slice(0, 300)}`;
}

/** Asserts that a host process ended by itself: no abort, no signal, no overflow. */
function assertSurvived(what: string, ended: Ended): void {
  assert.notEqual(ended.code, ABORTED, `${what} aborted: ${said(ended)}`);
  assert.equal(ended.signal, null, `${what} died of a signal: ${said(ended)}`);
  assert.doesNotMatch(ended.stderr, /overflowed its stack|fatal runtime error/, said(ended));
}

/** A call is waiting on the runner: its command runs and the runner has said so. */
async function started(sandbox: Sandbox): Promise<void> {
  const marker = join(sandbox.paths.workspace, "started");
  await waitFor(() => lexists(marker) && sandbox.queue.inFlight().length > 0, {
    timeoutMs: 30_000,
    what: "the call to start",
  });
}

function lexists(path: string): boolean {
  try {
    Deno.lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Which directory is at `path`: its inode and birth time. The inode alone
 * is not enough: a volume reuses a removed directory's inode for the next
 * one made (the spare a second reset puts in place).
 */
function identity(path: string): string {
  const info = Deno.lstatSync(path);
  return `${info.ino}@${info.birthtime?.getTime() ?? "?"}`;
}

/** Waits until no set-aside tree is left beside outbound/; returns how long it took. */
async function treesGone(sandbox: Sandbox): Promise<number> {
  const started = performance.now();
  await waitFor(() => inspectState(sandbox.paths).setAside === 0, {
    timeoutMs: GONE_DEADLINE_MS,
    what: "the set-aside trees to be removed",
  });
  return performance.now() - started;
}

/** The first call of a sandbox: a file in the workspace that every heal must keep. */
async function keepFile(home: TestHome, user: string): Promise<void> {
  const first = await exec(home, user, "echo kept > /workspace/keep");
  assert.equal(first.code, 0, said(first));
}

/** The call after the attack: it succeeds and finds the workspace file. */
async function assertHealed(home: TestHome, user: string, what: string): Promise<Ended> {
  const next = await cli(home, ["exec", "--user", user, "--", "cat", "/workspace/keep"]);
  log(`[${what}] next call: ${said(next)}`);
  assert.equal(next.code, 0, `${what}: the next call failed: ${said(next)}`);
  assert.equal(next.stdout, "kept\n", `${what}: the workspace was not kept`);
  return next;
}

// ---------------------------------------------------------------------------
// a. A compromised runner's deep tree, then a damaged outbound.db.

liveTest(
  "reset a1: a 20,000-level tree in /queue/outbound, then a damaged outbound.db [as the runner]: waffle exec ends by itself, the next call succeeds with the workspace kept, the tree goes without a link followed",
  async (docker) => {
    await using home = await resetHome(docker);
    await using victim = await victimFile();
    const user = uniqueUser("reset-cli");
    const sandbox = home.open(user);
    await keepFile(home, user);
    const before = identity(sandbox.paths.outbound);
    const call = exec(home, user, "touch /workspace/started; sleep 60");
    await started(sandbox);
    await treeThenDamage(sandbox, victim);
    const attacked = await call;
    log(`[a1] waffle exec hit by the reset: ${said(attacked)}`);
    assertSurvived("waffle exec", attacked);
    assert.notEqual(identity(sandbox.paths.outbound), before, "the host did not replace outbound/");
    assert.ok(!lexists(join(sandbox.paths.outbound, "deep")), "the tree is in the new outbound/");
    await assertHealed(home, user, "a1");
    const goneMs = await treesGone(sandbox);
    log(`[a1] set-aside tree gone ${fmt(goneMs)} after the next call`);
    victim.check();
  },
);

liveTest(
  "reset a3: outbound.db damaged behind a lock the compromised runner holds [as the runner]: the host kills the wedged container, finds the damage once the lock is gone and replaces outbound/; waffle exec ends by itself, the next call heals with the workspace kept",
  async (docker) => {
    await using home = await resetHome(docker);
    const user = uniqueUser("reset-lock");
    const sandbox = home.open(user);
    await keepFile(home, user);
    const before = identity(sandbox.paths.outbound);
    const call = exec(home, user, "touch /workspace/started; sleep 60");
    await started(sandbox);
    // The host meets the lock and serves its last copy: it sees a silent
    // heartbeat (or a lock held too long), never the damage, until it kills
    // the container, and the lock holder with it.
    await using attack = await spawnAsRunner(
      sandbox.key.containerName,
      LOCKED_DAMAGE_SCRIPT(120),
      "ready",
    );
    const attacked = await call;
    log(`[a3] waffle exec hit by the damage behind a lock: ${said(attacked)}`);
    assertSurvived("waffle exec", attacked);
    assert.match(attacked.stderr, /was interrupted: .*it was not re-run/, said(attacked));
    assert.notEqual(
      identity(sandbox.paths.outbound),
      before,
      "the host left the damaged outbound/ for the restarted runner to deal with",
    );
    await waitFor(() => attack.exited, { timeoutMs: 30_000, what: "the lock holder to die" });
    await assertHealed(home, user, "a3");
    const names = [...Deno.readDirSync(sandbox.paths.outbound)].map((entry) => entry.name);
    assert.deepEqual(names.filter((name) => name.includes("damaged")), [], names.join(", "));
  },
);

/** A library process serving two users; driven over stdin, reporting JSON lines. */
const TWO_USERS = (modules: { sandbox: string; removals: string }): string => `
import { openSandbox } from ${JSON.stringify(modules.sandbox)};
import { settleRemovals } from ${JSON.stringify(modules.removals)};
const [home, victimUser, otherUser] = Deno.args;
const open = (user) => openSandbox(user, { config: { home, idleSeconds: 600 } });
const a = open(victimUser);
const b = open(otherUser);
const say = (event) => console.log(JSON.stringify(event));
const input = Deno.stdin.readable.pipeThrough(new TextDecoderStream()).getReader();
let buffered = "";
async function line() {
  while (!buffered.includes("\\n")) {
    const { value, done } = await input.read();
    if (done) return "";
    buffered += value;
  }
  const end = buffered.indexOf("\\n");
  const got = buffered.slice(0, end);
  buffered = buffered.slice(end + 1);
  return got;
}
async function call(sandbox, shell) {
  const at = Date.now();
  const started = performance.now();
  try {
    const id = await sandbox.submit({ shell });
    const { result, stdout } = await sandbox.queue.collect(id, {
      revive: (trouble) => sandbox.ensure(trouble),
    });
    await sandbox.queue.ack(id);
    return {
      at, ms: performance.now() - started, exitCode: result.exitCode,
      interrupted: result.interrupted, error: result.error ?? null,
      stdout: new TextDecoder().decode(stdout),
    };
  } catch (error) {
    return { at, ms: performance.now() - started, exitCode: null, error: String(error) };
  }
}
await call(a, "echo kept > /workspace/keep");
for (let i = 0; i < 3; i++) await call(b, "true");
const baseline = [];
for (let i = 0; i < 30; i++) baseline.push(await call(b, "true"));
say({ event: "ready", baseline });
await line();
let stop = false;
const during = [];
const loop = (async () => {
  while (!stop) during.push(await call(b, "true"));
})();
say({ event: "a-long", ...(await call(a, "touch /workspace/started; sleep 60")) });
await line();
say({ event: "a-heal", ...(await call(a, "cat /workspace/keep")) });
await line();
stop = true;
await loop;
say({ event: "b", during });
await settleRemovals();
a.close();
b.close();
`;

interface Sample {
  at: number;
  ms: number;
  exitCode: number | null;
  interrupted?: boolean;
  error: string | null;
  stdout?: string;
}

/** Reads JSON lines from a child's stdout, one event at a time. */
function events(stream: ReadableStream<Uint8Array>): () => Promise<Record<string, unknown>> {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  return async () => {
    while (!buffered.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`the library process ended; it printed: ${buffered}`);
      buffered += value;
    }
    const end = buffered.indexOf("\n");
    const line = buffered.slice(0, end);
    buffered = buffered.slice(end + 1);
    return JSON.parse(line);
  };
}

liveTest(
  "reset a2: a library process serving two users survives the deep-tree reset of one [as the runner]; the other user's calls go on",
  async (docker) => {
    await using home = await resetHome(docker);
    await using victim = await victimFile();
    const [userA, userB] = [uniqueUser("reset-lib-a"), uniqueUser("reset-lib-b")];
    const script = await Deno.makeTempFile({ prefix: "waffle-two-users-", suffix: ".ts" });
    await Deno.writeTextFile(
      script,
      TWO_USERS({
        sandbox: new URL("../lib/sandbox/open.ts", import.meta.url).href,
        removals: new URL("../lib/lifecycle/remove_tree.ts", import.meta.url).href,
      }),
    );
    const config = new URL("../deno.json", import.meta.url).pathname;
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "--allow-all", "--quiet", "--config", config, script, home.home, userA, userB],
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const stderr = new Response(child.stderr).text();
    const writer = child.stdin.getWriter();
    const tell = (line: string): Promise<void> =>
      writer.write(new TextEncoder().encode(`${line}\n`));
    const next = events(child.stdout);
    try {
      const ready = await next();
      const baseline = (ready.baseline as Sample[]).map((s) => s.ms);
      const a = home.open(userA);
      await tell("start");
      await started(a);
      const attackedAt = Date.now();
      await treeThenDamage(a, victim);
      const long = await next() as unknown as Sample;
      log(`[a2] A's call hit by the reset: ${JSON.stringify({ ...long, stdout: undefined })}`);
      await tell("heal");
      const heal = await next() as unknown as Sample;
      log(`[a2] A's next call: exit ${heal.exitCode} in ${fmt(heal.ms)}: ${heal.error ?? ""}`);
      assert.equal(heal.exitCode, 0, JSON.stringify(heal));
      assert.equal(heal.stdout, "kept\n", "A's workspace was not kept");
      const goneMs = await treesGone(a);
      const goneAt = Date.now();
      await tell("stop");
      const b = (await next()).during as Sample[];
      await writer.close();
      const status = await child.status;
      log(`[a2] library process: exit ${status.code}, signal ${status.signal}`);
      assert.equal(status.code, 0, `the library process: ${await stderr}`);
      const window = b.filter((s) => s.at >= attackedAt && s.at <= goneAt);
      const failed = b.filter((s) => s.exitCode !== 0);
      log(
        `[a2] B's p50: baseline ${fmt(p50(baseline))} (n=${baseline.length}); during A's attack, ` +
          `reset and removal ${fmt(p50(window.map((s) => s.ms)))} (n=${window.length}, max ${
            fmt(Math.max(...window.map((s) => s.ms)))
          }); A's tree gone ${fmt(goneMs)} after its next call`,
      );
      assert.deepEqual(failed, [], "B's calls failed during A's reset");
      assert.ok(window.length > 0, "B made no call while A was attacked");
      victim.check();
    } finally {
      try {
        child.kill("SIGKILL");
      } catch {
        // Already gone.
      }
      await child.status;
      await stderr;
      await Deno.remove(script);
    }
  },
);

// ---------------------------------------------------------------------------
// b. A command's deep tree in /workspace.

liveTest(
  "reset b: a 20,000-level tree in /workspace [as a command]: it cannot reach /queue/outbound, a reset leaves the tree alone, rm --purge removes it without an abort, with and without a quota volume",
  async (docker, t) => {
    await using home = await resetHome(docker);
    await using victim = await victimFile();
    for (const plain of [false, true]) {
      await t.step(plain ? "plain volume (data from before quotas)" : "quota volume", async () => {
        const user = uniqueUser("reset-cmd");
        const sandbox = home.open(user);
        if (plain) {
          // Data written before quotas existed: the host keeps a plain directory.
          Deno.mkdirSync(sandbox.paths.volume, { recursive: true });
          Deno.writeTextFileSync(join(sandbox.paths.volume, "from-before-quotas"), "x");
        }
        await sandbox.ensure();
        log(`[b] volume: ${JSON.stringify(sandbox.volume)}`);
        if (plain) assert.equal(sandbox.volume?.enforced, false);
        // The runner's directory is out of a command's reach: refused, host unharmed.
        assert.equal(await mount(COMMAND, sandbox, deepTree("/queue/outbound")), null);
        const built = await COMMAND.deno(sandbox, deepTree("/workspace", victim));
        assert.equal(built.code, 0, `the tree as a command: ${built.stdout}${built.stderr}`);
        assert.match(built.stdout, new RegExp(`depth ${DEPTH}`));
        await keepFile(home, user);
        // A reset (the runner's damage while a call waits) never touches the workspace.
        const before = identity(sandbox.paths.outbound);
        const call = exec(home, user, "touch /workspace/started; sleep 60");
        await started(sandbox);
        const damaged = await asRunner(sandbox.key.containerName, DAMAGE_SCRIPT);
        assert.equal(damaged.code, 0, damaged.stderr);
        const attacked = await call;
        log(`[b] waffle exec hit by the reset: ${said(attacked)}`);
        assertSurvived("waffle exec", attacked);
        assert.notEqual(
          identity(sandbox.paths.outbound),
          before,
          "the host did not reset outbound/",
        );
        await assertHealed(home, user, "b");
        assert.ok(
          lexists(join(sandbox.paths.workspace, "deep", "d")),
          "the reset touched /workspace",
        );
        sandbox.close();
        const purge = await cli(home, ["rm", "--user", user, "--purge"]);
        log(`[b ${plain ? "plain" : "quota"}] waffle rm --purge: ${said(purge)}`);
        assertSurvived("waffle rm --purge", purge);
        assert.equal(purge.code, 0, said(purge));
        assert.ok(!lexists(sandbox.paths.root), "the state root is still there");
        const left = [...Deno.readDirSync(dirname(sandbox.paths.root))].map((e) => e.name)
          .filter((name) => name.startsWith(".purged-"));
        assert.deepEqual(left, [], "a purge left part of the state");
        victim.check();
      });
    }
  },
);

// ---------------------------------------------------------------------------
// c. A host killed between any two steps of a reset.

const STEPS: ResetStep[] = ["invalidated", "set-aside", "replaced", "removing"];

liveTest(
  "reset c: a host killed after each step of a reset leaves a sandbox the next call heals with the workspace kept; what it left is removed later",
  async (docker, t) => {
    await using home = await resetHome(docker);
    await using victim = await victimFile();
    for (const step of STEPS) {
      await t.step(`killed after '${step}'`, async () => {
        const user = uniqueUser("reset-kill");
        const sandbox = home.open(user);
        await keepFile(home, user);
        assert.ok(readWarm(sandbox.paths.root) !== undefined, "no warm record to go stale");
        const before = identity(sandbox.paths.outbound);
        const call = exec(home, user, "touch /workspace/started; sleep 60", {
          [RESET_KILL_ENV]: step,
        });
        await started(sandbox);
        await treeThenDamage(sandbox, victim);
        const killed = await call;
        assert.equal(
          killed.signal,
          "SIGKILL",
          `the host did not die at '${step}': ${said(killed)}`,
        );
        const left = inspectState(sandbox.paths);
        log(
          `[c ${step}] left: ${JSON.stringify(left)}, warm.json ${
            readWarm(sandbox.paths.root) === undefined ? "gone" : "there"
          }`,
        );
        assert.equal(
          readWarm(sandbox.paths.root),
          undefined,
          "warm.json outlived the reset's start",
        );
        assert.ok(left.replaced, "no mark that outbound/ is being replaced");
        if (step === "invalidated") {
          assert.equal(identity(sandbox.paths.outbound), before, "outbound/ moved before its step");
        } else if (step === "set-aside") {
          assert.equal(left.outbound, "missing");
          assert.equal(left.setAside, 1);
        } else {
          assert.equal(left.outbound, "directory");
          assert.notEqual(identity(sandbox.paths.outbound), before);
        }
        const doctor = await cli(home, ["doctor", "--json", "--no-docker"]);
        assertSurvived("waffle doctor", doctor);
        const row = (JSON.parse(doctor.stdout) as { checks: DoctorRow[] }).checks
          .find((check) => check.name === `sandbox ${sandbox.key.hash.slice(0, 12)}`);
        log(`[c ${step}] doctor: exit ${doctor.code}, row ${JSON.stringify(row)}`);
        assert.ok(row?.ok && row.warning, `doctor's row: ${JSON.stringify(row)}`);
        await assertHealed(home, user, `c ${step}`);
        assert.equal(outboundReplaced(sandbox.paths), false, "the mark outlived the restart");
        assert.ok(readWarm(sandbox.paths.root) !== undefined, "the warm path did not come back");
        const goneMs = await treesGone(sandbox);
        log(`[c ${step}] set-aside trees gone ${fmt(goneMs)} after the next call`);
        victim.check();
      });
    }
  },
);

// ---------------------------------------------------------------------------
// d. What the old crash left: outbound/ renamed away, warm.json still there.

/** How the old crash left a sandbox: its outbound/ set aside and never made again. */
async function crashLeft(sandbox: Sandbox, options: { running: boolean }): Promise<void> {
  assert.ok(readWarm(sandbox.paths.root) !== undefined, "no warm record to go stale");
  if (!options.running) {
    const killed = await new Deno.Command("docker", {
      args: ["kill", sandbox.key.containerName],
      stdout: "null",
      stderr: "piped",
    }).output();
    assert.equal(killed.code, 0, text(killed.stderr));
  }
  Deno.renameSync(sandbox.paths.outbound, `${sandbox.paths.outbound}.damaged-${Date.now()}`);
}

liveTest(
  "reset d: a stale warm.json and a missing outbound/ heal on the next call, the workspace kept, also after waffle rm and waffle sweep",
  async (docker, t) => {
    await using home = await resetHome(docker);
    const variants: { name: string; running: boolean; first?: string[] }[] = [
      { name: "container stopped", running: false },
      { name: "container still running", running: true },
      { name: "then waffle rm (no purge)", running: false, first: ["rm"] },
      { name: "then waffle sweep", running: false, first: ["sweep", "--idle-seconds", "100000"] },
    ];
    for (const variant of variants) {
      await t.step(variant.name, async () => {
        const user = uniqueUser("reset-stale");
        const sandbox = home.open(user);
        await keepFile(home, user);
        await crashLeft(sandbox, { running: variant.running });
        if (variant.first !== undefined) {
          const args = variant.first[0] === "rm" ? ["rm", "--user", user] : variant.first;
          const first = await cli(home, args);
          log(
            `[d ${variant.name}] waffle ${args.join(" ")}: ${said(first)} ${first.stdout.trim()}`,
          );
          assertSurvived(`waffle ${args[0]}`, first);
          if (variant.first[0] === "rm") assert.equal(first.code, 0, said(first));
        }
        await assertHealed(home, user, `d ${variant.name}`);
        assert.equal(inspectState(sandbox.paths).outbound, "directory");
        const goneMs = await treesGone(sandbox);
        log(`[d ${variant.name}] the old outbound/ gone ${fmt(goneMs)} after the next call`);
      });
    }
  },
);

// ---------------------------------------------------------------------------
// e. doctor: one broken sandbox never stops it reporting the rest.

interface DoctorRow {
  name: string;
  ok: boolean;
  warning: boolean;
  detail: string;
}

/** A tree DEPTH levels deep at `path`, built without ever naming a long path (rename, not chdir). */
function deepTreeOnHost(path: string): void {
  const stage = `${path}.stage`;
  Deno.mkdirSync(path);
  for (let i = 0; i < DEPTH; i++) {
    Deno.mkdirSync(stage);
    Deno.renameSync(path, join(stage, "d"));
    Deno.renameSync(stage, path);
  }
  assert.ok(lexists(join(path, "d", "d")) && !lexists(stage));
}

Deno.test(
  "reset e: waffle doctor reports every sandbox; broken ones (missing or replaced outbound/, a deep set-aside tree, a FIFO heartbeat, a file for a volume) are WARN rows and never stop the rest",
  async () => {
    const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-doctor-rows-" }));
    try {
      const make = (name: string, build: (root: string) => void): string => {
        const root = join(home, "sandboxes", name.padEnd(64, "0"));
        Deno.mkdirSync(join(root, "queue", "inbound"), { recursive: true });
        build(root);
        return name.padEnd(64, "0").slice(0, 12);
      };
      const dirs = (root: string): void => {
        Deno.mkdirSync(join(root, "volume", "outbound"), { recursive: true });
        Deno.mkdirSync(join(root, "volume", "workspace"));
      };
      const warm = {
        containerId: "c",
        image: { id: "i", env: [], workingDir: "", volumes: [] },
        postureHash: "p",
        process: "1 1",
        bootId: "b",
        volume: { enforced: false, bytes: 1, mountPoint: "/nowhere" },
      };
      const healthy = make("aaaa", dirs);
      const missing = make("bbbb", (root) => {
        dirs(root);
        Deno.removeSync(join(root, "volume", "outbound"));
        Deno.writeTextFileSync(join(root, "warm.json"), JSON.stringify(warm));
        deepTreeOnHost(join(root, "volume", "outbound.damaged-1"));
      });
      const fifo = make("cccc", (root) => {
        dirs(root);
        const made = new Deno.Command("mkfifo", {
          args: [join(root, "volume", "outbound", "heartbeat.json")],
        }).outputSync();
        assert.equal(made.code, 0);
      });
      const notDir = make("dddd", (root) => Deno.writeTextFileSync(join(root, "volume"), "x"));
      const replaced = make("eeee", (root) => {
        dirs(root);
        Deno.writeTextFileSync(join(root, "outbound.replaced"), "");
      });
      const out = await runCliProcess(["doctor", "--json", "--no-docker"], {
        env: { WAFFLE_HOME: home },
      });
      assert.notEqual(out.code, ABORTED, out.stderr);
      const rows = (JSON.parse(out.stdout) as { checks: DoctorRow[] }).checks;
      const row = (hash: string): DoctorRow => {
        const found = rows.find((r) => r.name === `sandbox ${hash}`);
        assert.ok(found !== undefined, `no row for ${hash}: ${out.stdout}`);
        log(
          `[e] ${
            found.ok ? (found.warning ? "WARN" : "ok") : "FAIL"
          } ${found.name}: ${found.detail}`,
        );
        return found;
      };
      const ok = row(healthy);
      assert.ok(ok.ok && !ok.warning, ok.detail);
      const gone = row(missing);
      assert.ok(gone.ok && gone.warning);
      assert.match(gone.detail, /outbound\/ is missing/);
      assert.match(gone.detail, /1 set-aside outbound\/ tree/);
      assert.match(gone.detail, /warm\.json is stale/);
      const beat = row(fifo);
      assert.ok(beat.ok, beat.detail);
      const file = row(notDir);
      assert.ok(file.ok && file.warning, file.detail);
      assert.match(file.detail, /outbound\/ is not a directory|outbound\/ is missing/);
      const swapped = row(replaced);
      assert.ok(swapped.ok && swapped.warning);
      assert.match(swapped.detail, /outbound\/ was reset/);
      assert.equal(out.code, 0, `doctor: ${out.stdout}${out.stderr}`);
    } finally {
      assert.ok(await removeTree(home), "the test home is still there");
    }
  },
);

// ---------------------------------------------------------------------------
// f. removeTree itself, in this very process.

Deno.test(
  "reset f: removeTree removes a 20,000-level tree without recursing in this process, never follows a link, stays in its parent, and a killed removal is finished by the next",
  async () => {
    await using victim = await victimFile();
    const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-remove-tree-" }));
    try {
      const sibling = join(dir, "sibling");
      Deno.writeTextFileSync(sibling, "stays");
      const tree = join(dir, "outbound.damaged-1");
      deepTreeOnHost(tree);
      // Links to the victim at the top, and a link standing for a whole tree.
      Deno.symlinkSync(victim.path, join(tree, "to-victim"));
      Deno.symlinkSync(dirname(victim.path), join(tree, "to-victim-dir"));
      Deno.symlinkSync(dirname(victim.path), join(dir, "link-as-tree"));
      await assert.rejects(removeTree(`${join(dir, "link-as-tree")}/`), /trailing slash/);
      await assert.rejects(removeTree(`${dir}/../x`), /normalized/);
      assert.equal(await removeTree(join(dir, "link-as-tree")), true);
      victim.check();
      // A removal cut short by its bound leaves a tree the next removal finishes.
      const bounded = await removeTree(tree, { timeoutMs: 100 });
      log(`[f] a 20,000-level tree with a 0.1 s bound: ${bounded ? "gone" : "cut short"}`);
      assert.equal(bounded, !lexists(tree));
      const started = performance.now();
      assert.equal(await removeTree(tree), true);
      log(`[f] the rest removed in ${fmt(performance.now() - started)}`);
      assert.ok(!lexists(tree));
      assert.equal(Deno.readTextFileSync(sibling), "stays");
      victim.check();
    } finally {
      await removeTree(dir);
    }
  },
);
