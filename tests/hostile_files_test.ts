// deno-lint-ignore-file no-console
/**
 * File-level attacks on the queue, mounted from inside a real sandbox
 * container: as the runner's uid 0 (a compromised runner, the strongest
 * attacker the queue files can meet: it owns `/queue/outbound`) and as the
 * commands' uid 10001 (what a prompt-injected agent's command is). Every
 * attack is registered twice ({@linkcode bothWays}): as a command it cannot
 * even start (uid 10001 cannot enter `/queue`), and that variant asserts the
 * exact refusal and an unharmed host; as the runner it is mounted. Each test
 * aims at the names the host opens (`outbound.db`, `outbound.db-journal`,
 * `outbound.bell`, and the read-only `/queue/inbound/*`) and proves the host
 * unharmed: victim files outside every queue keep their bytes, mode, owner and
 * link count, inotify sees the host neither open nor change them, the host's
 * calls return within bounds that express "never hangs", and a damaged queue
 * heals with the workspace kept and every command run at most once.
 *
 * Calls that a regression could turn into a blocking open (a FIFO or socket
 * under a queue name) run in child processes with a kill timer, so a hang
 * fails the test instead of freezing the run.
 *
 * Every test has its own temporary WAFFLE_HOME; its containers, then its
 * loop-mounted volumes, are removed on the way out.
 *
 * @module
 */
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import process from "node:process";
import type { DockerClient } from "../lib/docker/mod.ts";
import { selfCommand } from "../lib/config/self.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import type { ExecResult } from "../lib/queue/protocol.ts";
import { STALE_AFTER_MS } from "../lib/queue/liveness.ts";
import { LOCK_WAIT_MS, type WaitOptions } from "../lib/queue/queue.ts";
import { delay, text, waitFor } from "./_helpers.ts";
import {
  asRunner,
  bothWays,
  containerOf,
  mount,
  REFUSED_SIGNAL,
  refusedAsCommand,
  runnerStep,
  type Victim,
  victimFile,
} from "./_hostile_helpers.ts";
import {
  type HomeConfig,
  run,
  runOk,
  tempHome,
  type TestHome,
  uniqueUser,
} from "./_sandbox_helpers.ts";

const MiB = 1024 * 1024;
/** "The call that hits it, with healing" returns within this (the issue's bound). */
const HEAL_BOUND_MS = 15_000;
/** A host read that meets a hostile file returns within this: anything longer is a stall. */
const READ_BOUND_MS = 1000;
/** Child processes (CLI, library calls) are killed after this: a hang fails, never freezes. */
const CHILD_LIMIT_MS = 20_000;

// ---------------------------------------------------------------------------
// Homes whose volumes never outlive the test.

/**
 * {@linkcode tempHome} (whose disposal closes the sandboxes, removes the
 * containers and unmounts every volume), checked afterwards for loop devices
 * that outlived it.
 */
async function hostileHome(docker: DockerClient, config: HomeConfig = {}): Promise<TestHome> {
  const home = await tempHome(docker, { idleSeconds: 600, ...config });
  return {
    ...home,
    async [Symbol.asyncDispose](): Promise<void> {
      await home[Symbol.asyncDispose]();
      const leaked = loopBackingFiles().filter((file) => file.startsWith(`${home.home}/`));
      assert.deepEqual(leaked, [], "loop devices outlived the test");
    },
  };
}

/** The backing file of every attached loop device. */
function loopBackingFiles(): string[] {
  const files: string[] = [];
  for (const entry of Deno.readDirSync("/sys/block")) {
    if (!entry.name.startsWith("loop")) continue;
    try {
      files.push(Deno.readTextFileSync(`/sys/block/${entry.name}/loop/backing_file`).trim());
    } catch {
      // Not attached.
    }
  }
  return files;
}

// ---------------------------------------------------------------------------
// inotify: who opened, read or changed a file (the host side's own view).

const IN_NONBLOCK = 0o4000;
const IN_CLOEXEC = 0o2000000;
const IN_EVENTS: [number, string][] = [
  [0x1, "ACCESS"],
  [0x2, "MODIFY"],
  [0x4, "ATTRIB"],
  [0x8, "CLOSE_WRITE"],
  [0x20, "OPEN"],
  [0x400, "DELETE_SELF"],
  [0x800, "MOVE_SELF"],
];
const IN_WATCH = IN_EVENTS.reduce((mask, [bit]) => mask | bit, 0);

// Loaded once for the module (a library loaded inside a test counts as a leak).
const inotify = Deno.dlopen("libc.so.6", {
  inotify_init1: { parameters: ["i32"], result: "i32" },
  inotify_add_watch: { parameters: ["i32", "buffer", "u32"], result: "i32" },
  read: { parameters: ["i32", "buffer", "usize"], result: "isize" },
  close: { parameters: ["i32"], result: "i32" },
}).symbols;

/**
 * Records every open, read, write, attribute change, move or deletion of some
 * files, by any process on this kernel. The victims live outside every
 * container, so what it records is the host's doing (or this test's: drain it
 * before the test looks at a file itself).
 */
class FileSpy {
  #fd: number;
  #names = new Map<number, string>();

  constructor(paths: string[]) {
    this.#fd = inotify.inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    assert.ok(this.#fd >= 0, "inotify_init1 failed");
    for (const path of paths) {
      const wd = inotify.inotify_add_watch(
        this.#fd,
        new TextEncoder().encode(`${path}\0`),
        IN_WATCH,
      );
      assert.ok(wd >= 0, `cannot watch '${path}'`);
      this.#names.set(wd, path);
    }
  }

  /** The events since the last call, as `path: KIND|KIND (n×)`, in first-seen order. */
  events(): string[] {
    const counts = new Map<string, number>();
    const buffer = new Uint8Array(64 * 1024);
    while (true) {
      const got = Number(inotify.read(this.#fd, buffer, BigInt(buffer.length)));
      if (got <= 0) return [...counts].map(([event, n]) => `${event} (${n}×)`);
      const view = new DataView(buffer.buffer, 0, got);
      for (let at = 0; at + 16 <= got; at += 16 + view.getUint32(at + 12, true)) {
        const mask = view.getUint32(at + 4, true);
        const kinds = IN_EVENTS.filter(([bit]) => mask & bit).map(([, name]) => name);
        if (kinds.length === 0) continue;
        const event = `${this.#names.get(view.getInt32(at, true))}: ${kinds.join("|")}`;
        counts.set(event, (counts.get(event) ?? 0) + 1);
      }
    }
  }

  close(): void {
    inotify.close(this.#fd);
  }
}

// ---------------------------------------------------------------------------
// What the attacker runs inside the container as the runner's uid 0.

/** Deno source: `runnerPids()`, the runner's pids inside the container (not docker-init). */
const RUNNER_PIDS = `
function runnerPids(): number[] {
  const pids: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^[0-9]+$/.test(entry.name) || entry.name === "1") continue;
    try {
      const argv = Deno.readTextFileSync("/proc/" + entry.name + "/cmdline").split("\\0");
      if (!argv[0].includes("init") && argv.includes("runner") && argv.includes("--queue")) {
        pids.push(Number(entry.name));
      }
    } catch {
      // Gone meanwhile.
    }
  }
  if (pids.length === 0) throw new Error("no runner process in the container");
  return pids;
}
`;

/** Runs an attack script as the runner's uid and returns its stdout; a failed script fails the test. */
async function attack(container: string, script: string): Promise<string> {
  const out = await asRunner(container, script);
  assert.equal(out.code, 0, `attack script failed: ${out.stdout}${out.stderr}`);
  return out.stdout;
}

/** Deno source that stops the runner (a compromised runner may signal itself; a command may not). */
const STOP_RUNNER = `${RUNNER_PIDS} for (const pid of runnerPids()) Deno.kill(pid, "SIGSTOP");`;

/** Sends a signal to the runner, from inside its container (it may signal itself). */
async function signalRunner(container: string, signal: Deno.Signal): Promise<void> {
  await attack(
    container,
    `${RUNNER_PIDS} for (const pid of runnerPids()) Deno.kill(pid, "${signal}");`,
  );
}

/**
 * Deno source that writes a valid hot rollback journal for
 * `/queue/outbound/outbound.db`: a header with nRec 0 and the database's own
 * page count (so a rollback changes no page), and a super-journal record
 * naming `superJournal`. Any connection that may write the database and finds
 * the journal hot rolls it back and then deletes the super-journal (a file
 * whose child journals are gone is stale): this is how a crafted journal once
 * made a host delete a root-owned file.
 */
function hotJournalScript(superJournal: string): string {
  return `
const name = new TextEncoder().encode(${JSON.stringify(superJournal)});
const db = Deno.readFileSync("/queue/outbound/outbound.db");
const raw = (db[16] << 8) | db[17];
const pageSize = raw === 1 ? 65536 : raw;
const magic = [0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7];
const sector = 512;
const journal = new Uint8Array(sector + 4 + name.length + 16);
const view = new DataView(journal.buffer);
journal.set(magic, 0);
view.setUint32(8, 0); // nRec
view.setUint32(12, 0x5eed5eed); // checksum nonce
view.setUint32(16, db.length / pageSize); // pages before the "transaction": no truncation
view.setUint32(20, sector);
view.setUint32(24, pageSize);
// Super-journal record: lock-byte page number, name, length, checksum, magic.
view.setUint32(sector, Math.floor(0x40000000 / pageSize) + 1);
journal.set(name, sector + 4);
view.setUint32(sector + 4 + name.length, name.length);
let sum = 0;
for (const byte of name) sum = (sum + byte) >>> 0;
view.setUint32(sector + 8 + name.length, sum);
journal.set(magic, sector + 12 + name.length);
Deno.writeFileSync("/queue/outbound/outbound.db-journal", journal);
`;
}

/** Deno source: `sqlite(sql)` runs SQL on the live `outbound.db` as its owner would. */
const OUTBOUND_SQL = `
import { DatabaseSync } from "node:sqlite";
function sqlite(sql: string, ...params: (string | number)[]): void {
  const db = new DatabaseSync("/queue/outbound/outbound.db", { timeout: 20000 });
  try {
    if (params.length === 0) db.exec(sql);
    else db.prepare(sql).run(...params);
  } finally {
    db.close();
  }
}
`;

/** Deno source that creates empty files in `dir` until the volume has no inode left; prints how many. */
function fillInodesScript(dir: string): string {
  return `Deno.mkdirSync(${JSON.stringify(dir)});
let files = 0;
try {
  while (true) Deno.writeFileSync(${JSON.stringify(dir)} + "/" + files++, new Uint8Array());
} catch {
  files--;
}
console.log(files);
`;
}

/** Deno source that waits (in the container) until the runner committed a request's result. */
function awaitResultScript(id: string): string {
  return `
import { DatabaseSync as ResultDb } from "node:sqlite";
{
  const deadline = Date.now() + 20000;
  while (true) {
    const db = new ResultDb("/queue/outbound/outbound.db", { readOnly: true, timeout: 5000 });
    const done = db.prepare("SELECT 1 AS hit FROM results WHERE request_id = ?").get(${
    JSON.stringify(id)
  });
    db.close();
    if (done !== undefined) break;
    if (Date.now() > deadline) throw new Error("no result for ${id}");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
`;
}

// ---------------------------------------------------------------------------
// Host calls in child processes, killed when they overrun.

interface ChildOutcome {
  code: number;
  stdout: string;
  stderr: string;
  ms: number;
  /** Killed by the limit: the call hung. */
  killed: boolean;
}

async function childWithin(
  args: string[],
  options: { env: Record<string, string>; stdin?: string; limitMs?: number },
): Promise<ChildOutcome> {
  const started = performance.now();
  const child = new Deno.Command(Deno.execPath(), {
    args,
    env: options.env,
    stdin: options.stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let killed = false;
  const timer = setTimeout(() => {
    killed = true;
    try {
      child.kill("SIGKILL");
    } catch {
      // Already gone.
    }
  }, options.limitMs ?? CHILD_LIMIT_MS);
  if (options.stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(options.stdin));
    await writer.close();
  }
  const out = await child.output();
  clearTimeout(timer);
  return {
    code: out.code,
    stdout: text(out.stdout),
    stderr: text(out.stderr),
    ms: performance.now() - started,
    killed,
  };
}

/** `waffle exec` (or any subcommand) from source, as a user's shell script runs it. */
function cliWithin(home: TestHome, args: string[], limitMs?: number): Promise<ChildOutcome> {
  const self = selfCommand();
  return childWithin([...self.prefix, ...args], {
    env: { WAFFLE_HOME: home.home },
    ...(limitMs === undefined ? {} : { limitMs }),
  });
}

const PROJECT = new URL("../", import.meta.url);
const SANDBOX_MODULE = new URL("lib/sandbox/open.ts", PROJECT).href;
const HELPERS_MODULE = new URL("tests/_sandbox_helpers.ts", PROJECT).href;

/** What a library call in a child process reported. */
interface LibraryOutcome {
  /** How the child ended (killed: it hung). */
  child: ChildOutcome;
  /** `run()`: the result and stdout, or the error; `probe`: the liveness states seen. */
  report?: {
    ok: boolean;
    ms: number;
    result?: ExecResult;
    stdout?: string;
    error?: string;
    states?: Record<string, number>;
    maxReadMs?: number;
    reads?: number;
  };
}

/**
 * Runs the library in a child process against this home: `run` does
 * `run(sandbox, shell)` (submit, collect with revival, ack); `probe` calls
 * `queue.liveness()` back to back for `ms` milliseconds and reports the
 * states and the slowest call.
 */
async function libraryWithin(
  home: TestHome,
  user: string,
  call: { run: string } | { probeMs: number },
  limitMs?: number,
): Promise<LibraryOutcome> {
  const body = "run" in call
    ? `const ran = await run(sandbox, ${JSON.stringify(call.run)});
       report = { ok: true, ms: performance.now() - started, result: ran.result, stdout: ran.stdout };
       console.log("RAN " + JSON.stringify(report));`
    : `const states: Record<string, number> = {};
       let maxReadMs = 0;
       let reads = 0;
       while (performance.now() - started < ${call.probeMs}) {
         const t = performance.now();
         const state = sandbox.queue.liveness().state;
         maxReadMs = Math.max(maxReadMs, performance.now() - t);
         states[state] = (states[state] ?? 0) + 1;
         reads++;
         await new Promise((resolve) => setTimeout(resolve, 1));
       }
       report = { ok: true, ms: performance.now() - started, states, maxReadMs, reads };`;
  const script = `
import { openSandbox } from "${SANDBOX_MODULE}";
import { run } from "${HELPERS_MODULE}";
const sandbox = openSandbox(${JSON.stringify(user)});
const started = performance.now();
let report: Record<string, unknown> = {};
try {
  ${body}
} catch (error) {
  report = { ok: false, ms: performance.now() - started, error: String(error) };
} finally {
  sandbox.close();
}
// A host lives on after closing a sandbox: its event loop must still turn.
await new Promise((resolve) => setTimeout(resolve, 100));
console.log("REPORT " + JSON.stringify(report));
Deno.exit(0);
`;
  const child = await childWithin(
    [
      "run",
      "-A",
      "--quiet",
      "--no-prompt",
      "--config",
      new URL("deno.json", PROJECT).pathname,
      "-",
    ],
    {
      env: { WAFFLE_HOME: home.home },
      stdin: script,
      ...(limitMs === undefined ? {} : { limitMs }),
    },
  );
  const line = child.stdout.split("\n").find((l) => l.startsWith("REPORT "));
  return line === undefined ? { child } : { child, report: JSON.parse(line.slice(7)) };
}

function describeChild(outcome: ChildOutcome): string {
  return `${outcome.killed ? "KILLED (hung) " : ""}exit ${outcome.code} after ${
    Math.round(outcome.ms)
  } ms; stdout ${JSON.stringify(outcome.stdout.slice(0, 400))}; stderr ${
    JSON.stringify(outcome.stderr.slice(0, 400))
  }`;
}

// ---------------------------------------------------------------------------
// Small helpers.

/** Wall and CPU milliseconds of a (synchronous or not) host call. */
async function measured<T>(call: () => T | Promise<T>): Promise<{
  value?: T;
  error?: unknown;
  ms: number;
  cpuMs: number;
}> {
  const cpu = process.cpuUsage();
  const started = performance.now();
  try {
    const value = await call();
    return { value, ms: performance.now() - started, cpuMs: cpuMsSince(cpu) };
  } catch (error) {
    return { error, ms: performance.now() - started, cpuMs: cpuMsSince(cpu) };
  }
}

function cpuMsSince(before: ReturnType<typeof process.cpuUsage>): number {
  const used = process.cpuUsage(before);
  return (used.user + used.system) / 1000;
}

function fmt(ms: number): string {
  return `${Math.round(ms)} ms`;
}

/** What the host's library reports for a request whose queue was lost under it. */
function assertInterrupted(result: ExecResult, what: string): void {
  assert.equal(result.exitCode, null, `${what}: exitCode ${result.exitCode}`);
  assert.equal(result.interrupted, true, `${what}: ${JSON.stringify(result)}`);
}

/** The lines a command appended to a workspace file (host side view). */
function linesIn(sandbox: Sandbox, name: string): string[] {
  try {
    return Deno.readTextFileSync(join(sandbox.paths.workspace, name)).split("\n").filter((l) =>
      l !== ""
    );
  } catch {
    return [];
  }
}

async function waitForLine(sandbox: Sandbox, name: string): Promise<void> {
  await waitFor(() => linesIn(sandbox, name).length > 0, {
    timeoutMs: 20_000,
    what: `the command to write /workspace/${name}`,
  });
}

/** The outbound generation the host knows after a fresh look. */
async function generationOf(sandbox: Sandbox): Promise<string | undefined> {
  return await sandbox.queue.syncGeneration().catch(() => undefined);
}

function outboundEntries(sandbox: Sandbox): string[] {
  try {
    return [...Deno.readDirSync(sandbox.paths.outbound)].map((entry) =>
      `${entry.name}:${entry.isSymlink ? "symlink" : entry.isFile ? "file" : "other"}`
    ).sort();
  } catch (error) {
    return [`(unreadable: ${error instanceof Error ? error.message : String(error)})`];
  }
}

/** Checks every victim and that the spy saw nothing happen to them. */
function assertUntouched(victims: Victim[], spy: FileSpy | undefined, what: string): void {
  const events = spy?.events() ?? [];
  assert.deepEqual(events, [], `${what}: the host opened, read or changed a victim`);
  for (const victim of victims) victim.check();
  spy?.events(); // the checks' own reads
}

// ---------------------------------------------------------------------------
// 1. A crafted hot journal whose super-journal names a host file.

bothWays(
  "hostile files 1: a crafted hot journal naming a host file as super-journal: never opened by the host, recovered only inside the container",
  async (docker, attacker, t) => {
    await using home = await hostileHome(docker);
    await using victim = await victimFile();
    const user = uniqueUser("hf-journal");
    const sandbox = home.open(user);
    await sandbox.ensure();
    const container = containerOf(sandbox);
    const journal = join(sandbox.paths.outbound, "outbound.db-journal");

    await t.step("the host reads past the hot journal without opening it", async () => {
      // The compromised runner stops itself, so nothing in the container
      // recovers the journal while the host looks; a decoy at the victim's
      // path inside the container shows whose filesystem a rollback touches.
      // A command can neither stop the runner (EPERM) nor write the journal (EACCES).
      const stopped = await mount(attacker, sandbox, STOP_RUNNER, {
        refusal: REFUSED_SIGNAL,
        victims: [victim],
      });
      const planted = await mount(
        attacker,
        sandbox,
        `Deno.mkdirSync(${JSON.stringify(dirname(victim.path))}, { recursive: true });
         Deno.writeTextFileSync(${JSON.stringify(victim.path)}, "decoy inside the container");
         ${hotJournalScript(victim.path)}`,
        { victims: [victim] },
      );
      if (stopped === null || planted === null) return;
      const inJournal = Deno.readFileSync(journal);
      const spy = new FileSpy([journal, victim.path]);
      let slowest = 0;
      const states = new Set<string>();
      try {
        const calls: (() => unknown)[] = [
          () => states.add(sandbox.queue.liveness().state),
          () => sandbox.queue.inFlight(),
          () => sandbox.queue.syncGeneration().catch(() => undefined),
        ];
        for (let i = 0; i < 20; i++) {
          for (const call of calls) {
            const took = await measured(call);
            slowest = Math.max(slowest, took.ms);
          }
          await delay(25);
        }
      } finally {
        const events = spy.events();
        spy.close();
        console.log(
          `hot journal: 60 host reads, slowest ${slowest.toFixed(1)} ms, states ${[...states]}, ` +
            `inotify events on journal/victim: ${JSON.stringify(events)}`,
        );
        assert.deepEqual(events, [], "the host opened, read or changed the journal or the victim");
      }
      assert.deepEqual(Deno.readFileSync(journal), inJournal, "the host changed the journal");
      assert.ok(slowest < READ_BOUND_MS, `a host read took ${slowest} ms`);
      victim.check();
    });

    await t.step({
      name:
        "waffle exec succeeds once the runner recovers the journal: the super-journal it deletes is the container's",
      ignore: attacker.kind === "command",
      fn: async () => {
        // The runner is still stopped: whatever opens the journal or the
        // victim before it resumes is the waffle exec host.
        const spy = new FileSpy([journal, victim.path]);
        const exec = cliWithin(home, ["exec", "--user", user, "--", "sh", "-c", "echo ran-cli"]);
        await delay(1500);
        const hostEvents = spy.events();
        spy.close();
        await signalRunner(container, "SIGCONT");
        const cli = await exec;
        console.log(
          `hot journal: waffle exec ${
            describeChild(cli)
          }; inotify events while it faced the journal: ${JSON.stringify(hostEvents)}`,
        );
        assert.deepEqual(
          hostEvents,
          [],
          "waffle exec opened, read or changed the journal or victim",
        );
        assert.equal(cli.killed, false, `waffle exec hung: ${describeChild(cli)}`);
        assert.equal(cli.code, 0, describeChild(cli));
        assert.equal(cli.stdout, "ran-cli\n");
        assert.ok(cli.ms < HEAL_BOUND_MS, `waffle exec took ${fmt(cli.ms)}`);
        // The runner rolled the journal back and deleted the super-journal it
        // named: the decoy inside the container, never the host's file.
        const inside = await attack(
          container,
          `try { Deno.lstatSync(${JSON.stringify(victim.path)}); console.log("present"); }
           catch (error) { console.log(error instanceof Deno.errors.NotFound ? "deleted" : String(error)); }`,
        );
        console.log(
          `hot journal: decoy at the victim's path inside the container: ${inside.trim()}`,
        );
        assert.equal(inside.trim(), "deleted", "the runner never recovered the crafted journal");
        victim.check();
      },
    });

    await runnerStep(
      t,
      attacker,
      "library run() heals a runner that never recovers the journal (lock wait, then restart)",
      async () => {
        // A read that succeeds first: the host's lock clock starts at this attack.
        assert.equal(sandbox.queue.liveness().state, "alive");
        await signalRunner(container, "SIGSTOP");
        await attack(container, hotJournalScript(victim.path));
        // Until the host revives the runner, nothing in the container runs:
        // what the spy sees up to then is the host's doing.
        const spy = new FileSpy([journal, victim.path]);
        let beforeRevive: string[] | undefined;
        const took = await measured(async () => {
          const id = await sandbox.submit({ shell: "echo ran-lib" });
          const { result, stdout } = await sandbox.queue.collect(id, {
            revive: async (trouble) => {
              beforeRevive ??= spy.events();
              await sandbox.ensure(trouble);
            },
          });
          await sandbox.queue.ack(id);
          return { result, stdout: text(stdout) };
        });
        const afterwards = spy.events().filter((event) => event.startsWith(victim.path));
        spy.close();
        console.log(
          `hot journal, runner stopped for good: library run() ${fmt(took.ms)}: ${
            took.error === undefined ? JSON.stringify(took.value?.result) : String(took.error)
          }; inotify events before the revival: ${JSON.stringify(beforeRevive)}`,
        );
        assert.deepEqual(beforeRevive ?? [], [], "the host opened the journal or the victim");
        assert.deepEqual(afterwards, [], "the victim was opened after the revival");
        victim.check();
        assert.equal(took.error, undefined, String(took.error));
        assert.equal(took.value?.stdout, "ran-lib\n", JSON.stringify(took.value?.result));
        assert.ok(took.ms < LOCK_WAIT_MS + HEAL_BOUND_MS, `run() took ${fmt(took.ms)}`);
      },
    );
    victim.check();
  },
);

// ---------------------------------------------------------------------------
// 2. Symlinks under every name the host or the runner opens.

bothWays(
  "hostile files 2: symlinks to host files under outbound.db, its journal, the bell and the lock are never followed, and the queue heals",
  async (docker, attacker, t) => {
    await using home = await hostileHome(docker);
    await using secret = await victimFile();
    await using passwd = await victimFile(); // a stand-in for /etc/passwd: never the real one
    const victims = [secret, passwd];
    const spy = new FileSpy(victims.map((v) => v.path));
    try {
      const cases: { name: string; target: Victim; restart: boolean }[] = [
        { name: "outbound.db", target: secret, restart: false },
        { name: "outbound.db-journal", target: passwd, restart: false },
        // The live runner holds these open; its next start meets the link.
        { name: "outbound.bell", target: secret, restart: true },
        { name: "runner.lock", target: passwd, restart: true },
      ];
      for (const { name, target, restart } of cases) {
        await t.step(`${name} -> host file${restart ? " (runner restarts)" : ""}`, async () => {
          const user = uniqueUser("hf-link");
          const sandbox = home.open(user);
          await sandbox.ensure();
          const before = await generationOf(sandbox);
          await runOk(sandbox, "echo kept > /workspace/kept");
          const planted = await mount(
            attacker,
            sandbox,
            `const path = "/queue/outbound/${name}";
             try { Deno.renameSync(path, path + ".aside"); } catch { /* absent */ }
             Deno.symlinkSync(${JSON.stringify(target.path)}, path);
             ${
              restart
                // Killed once this script has exited: the container stops
                // with its runner, and an exec still running then is killed
                // with it (137), which is no failure of the attack.
                ? `${RUNNER_PIDS} new Deno.Command("/bin/sh", {
                     args: ["-c", "sleep 0.3; kill -TERM " + runnerPids().join(" ")],
                     stdin: "null", stdout: "null", stderr: "null",
                   }).spawn().unref();`
                : ""
            }`,
          );
          if (planted === null) {
            assertUntouched(victims, spy, `a command's symlink under ${name}`);
            return;
          }
          assert.ok(Deno.lstatSync(join(sandbox.paths.outbound, name)).isSymlink);
          if (restart) {
            // The runner (and so its container) is gone: the next start meets the link.
            const container = containerOf(sandbox);
            await waitFor(
              async () => (await docker.inspectContainer(container))?.State.Running !== true,
              {
                timeoutMs: 20_000,
                what: "the runner's container to stop",
              },
            );
          }
          // Every property is checked and all failures reported together.
          const problems: string[] = [];
          const touched = (when: string): void => {
            const events = spy.events();
            if (events.length > 0) {
              problems.push(`${when}: the host opened a victim through the link: ${events}`);
            }
          };
          const read = await measured(() => sandbox.queue.liveness());
          console.log(
            `symlink ${name}: liveness ${read.value?.state} in ${
              read.ms.toFixed(1)
            } ms (${read.value?.detail})`,
          );
          if (read.ms >= READ_BOUND_MS) problems.push(`liveness took ${fmt(read.ms)}`);
          if (name === "outbound.db" && read.value?.state !== "damaged") {
            problems.push(`a symlinked outbound.db was judged '${read.value?.state}'`);
          }
          touched("host read");
          const took = await measured(() => run(sandbox, "cat /workspace/kept"));
          console.log(
            `symlink ${name}: run() ${fmt(took.ms)}: ${
              took.error === undefined ? JSON.stringify(took.value?.result) : String(took.error)
            }; outbound now ${JSON.stringify(outboundEntries(sandbox))}`,
          );
          touched("run()");
          if (took.error !== undefined) {
            problems.push(`the queue did not heal: ${String(took.error).split("\n")[0]}`);
          } else if (took.ms >= HEAL_BOUND_MS) {
            problems.push(`run() took ${fmt(took.ms)}`);
          } else {
            // Healed: the next call works, with the workspace kept.
            const again = await measured(() => runOk(sandbox, "cat /workspace/kept"));
            if (again.value !== "kept\n") problems.push(`next call: ${String(again.error)}`);
            if (!Deno.lstatSync(join(sandbox.paths.outbound, "outbound.db")).isFile) {
              problems.push("outbound.db is not a regular file after healing");
            }
            if (name === "outbound.db" && await generationOf(sandbox) === before) {
              problems.push("no fresh outbound generation");
            }
          }
          touched("healing");
          try {
            sandbox.close();
          } catch {
            // Closed by the home.
          }
          touched("close");
          for (const victim of victims) victim.check();
          spy.events(); // the checks' own reads
          assert.deepEqual(problems, [], `symlink under ${name}`);
        });
      }
    } finally {
      assertUntouched(victims, spy, "symlinks, at the end");
      spy.close();
    }
  },
);

// ---------------------------------------------------------------------------
// 3. Hard links.

bothWays(
  "hostile files 3: hard links into /queue/outbound from other mounts fail; links to outbound.db inside it do not confuse the host",
  async (docker, attacker, t) => {
    await using home = await hostileHome(docker);
    await using victim = await victimFile();
    const spy = new FileSpy([victim.path]);
    try {
      const sandbox = home.open(uniqueUser("hf-hard"));
      await sandbox.ensure();
      await runOk(sandbox, "echo w > /workspace/w");

      await t.step(
        "link() from another mount fails (EXDEV / EPERM); a command cannot even reach the queue (EACCES)",
        async () => {
          const ran = await attacker.deno(
            sandbox,
            `Deno.writeTextFileSync("/tmp/runner-file", "r");
           const sources = ["/workspace/w", "/tmp/runner-file", "/opt/waffle/deno", "/etc/passwd",
             ${JSON.stringify(victim.path)}, "/queue/inbound/inbound.db"];
           const outcome: Record<string, string> = {};
           for (const [i, source] of sources.entries()) {
             try {
               Deno.linkSync(source, "/queue/outbound/linked-" + i);
               outcome[source] = "LINKED";
             } catch (error) {
               outcome[source] = (error as { code?: string }).code ?? String(error);
             }
           }
           try { Deno.linkSync("/queue/outbound/outbound.db", "/workspace/stolen"); outcome["outbound.db -> /workspace"] = "LINKED"; }
           catch (error) { outcome["outbound.db -> /workspace"] = (error as { code?: string }).code ?? String(error); }
           console.log(JSON.stringify(outcome));`,
          );
          assert.equal(ran.code, 0, `the link script failed: ${ran.stdout}${ran.stderr}`);
          const outcome = JSON.parse(ran.stdout) as Record<string, string>;
          console.log(`hard links as ${attacker.label}: ${JSON.stringify(outcome)}`);
          for (const [source, code] of Object.entries(outcome)) {
            assert.notEqual(code, "LINKED", `a hard link from '${source}' was made`);
          }
          if (attacker.kind === "runner") {
            assert.match(outcome["/workspace/w"]!, /EXDEV|EPERM/);
            assert.match(outcome["/tmp/runner-file"]!, /EXDEV/);
          } else {
            // The victim's host path does not exist in the container; every
            // other link fails at the queue's 0700 directories.
            for (const [source, code] of Object.entries(outcome)) {
              assert.equal(code, source === victim.path ? "ENOENT" : "EACCES", source);
            }
          }
          if (attacker.kind === "runner") return;
          const asCommandRan = await run(
            sandbox,
            "ln /workspace/w /queue/outbound/from-command; echo rc=$?; ln /workspace/w /queue/inbound/x; echo rc=$?",
          );
          console.log(
            `hard links as command: ${JSON.stringify(asCommandRan.stdout + asCommandRan.stderr)}`,
          );
          assert.doesNotMatch(asCommandRan.stdout, /rc=0/);
          assert.match(asCommandRan.stderr, /Permission denied|Invalid cross-device link/);
          assert.deepEqual(
            outboundEntries(sandbox).filter((e) => /linked|from-command/.test(e)),
            [],
          );
        },
      );

      await t.step("outbound.db hard-linked under another name: the host carries on", async () => {
        const linked = await mount(
          attacker,
          sandbox,
          `Deno.linkSync("/queue/outbound/outbound.db", "/queue/outbound/outbound.db.other");`,
        );
        if (linked === null) return;
        const read = await measured(() => sandbox.queue.liveness());
        assert.equal(read.value?.state, "alive", JSON.stringify(read.value));
        const took = await measured(() => runOk(sandbox, "echo linked-ok"));
        console.log(
          `outbound.db with a second link: liveness ${fmt(read.ms)}, run() ${fmt(took.ms)}`,
        );
        assert.equal(took.value, "linked-ok\n", String(took.error));
        assert.ok(took.ms < 5000, `run() took ${fmt(took.ms)}`);
      });

      await t.step(
        "outbound.db hard-linked as its own -wal: the runner spoils its own file, the host heals",
        async () => {
          await runOk(sandbox, "echo kept > /workspace/kept");
          const linked = await mount(
            attacker,
            sandbox,
            `Deno.linkSync("/queue/outbound/outbound.db", "/queue/outbound/outbound.db-wal");`,
          );
          if (linked === null) return;
          const took = await measured(() => run(sandbox, "cat /workspace/kept"));
          console.log(
            `outbound.db as its own -wal: run() ${fmt(took.ms)}: ${
              took.error === undefined ? JSON.stringify(took.value?.result) : String(took.error)
            }`,
          );
          assert.equal(took.error, undefined, String(took.error));
          const result = took.value!.result;
          // The call either ran or came back interrupted; never ran twice.
          if (result.exitCode !== 0) assertInterrupted(result, "-wal link");
          assert.ok(took.ms < HEAL_BOUND_MS, `run() took ${fmt(took.ms)}`);
          assert.equal(await runOk(sandbox, "cat /workspace/kept"), "kept\n");
        },
      );

      await t.step("outbound.db hard-linked as its own journal: the queue heals", async () => {
        await runOk(sandbox, "echo kept > /workspace/kept");
        const linked = await mount(
          attacker,
          sandbox,
          `try { Deno.removeSync("/queue/outbound/outbound.db-journal"); } catch { /* absent */ }
           Deno.linkSync("/queue/outbound/outbound.db", "/queue/outbound/outbound.db-journal");`,
        );
        if (linked === null) return;
        const took = await measured(() => run(sandbox, "cat /workspace/kept"));
        console.log(
          `outbound.db as its own journal: run() ${fmt(took.ms)}: ${
            took.error === undefined ? JSON.stringify(took.value?.result) : String(took.error)
          }`,
        );
        assert.equal(took.error, undefined, String(took.error));
        assert.ok(took.ms < LOCK_WAIT_MS + HEAL_BOUND_MS, `run() took ${fmt(took.ms)}`);
        assert.equal(await runOk(sandbox, "cat /workspace/kept"), "kept\n");
      });
    } finally {
      assertUntouched([victim], spy, "hard links");
      spy.close();
    }
  },
);

// ---------------------------------------------------------------------------
// 4. FIFOs, sockets and device nodes.

bothWays(
  "hostile files 4: a FIFO or socket under outbound.db, its journal or the bell never blocks the host or bricks the sandbox; mknod fails",
  async (docker, attacker, t) => {
    await using home = await hostileHome(docker);
    await using victim = await victimFile();
    const spy = new FileSpy([victim.path]);
    try {
      await t.step("mknod fails (no CAP_MKNOD) and the volume is nodev", async () => {
        const user = uniqueUser("hf-dev");
        const sandbox = home.open(user);
        await sandbox.ensure();
        // Each where it may create files: the runner in its queue, a command in the workspace.
        const at = attacker.kind === "runner" ? "/queue/outbound/null" : "/workspace/null";
        const made = await attacker.sh(sandbox, `mknod ${at} c 1 3; echo rc=$?`);
        const mounts = await attacker.sh(
          sandbox,
          "grep -E ' /(queue/outbound|workspace) ' /proc/mounts",
        );
        console.log(
          `mknod ${at} as ${attacker.label}: ${
            (made.stdout + made.stderr).trim()
          }; mounts: ${mounts.stdout.trim()}`,
        );
        assert.match(made.stdout, /^rc=1$/m);
        assert.match(made.stderr, /Operation not permitted/);
        assert.equal(mounts.stdout.trim().split("\n").length, 2, mounts.stdout);
        for (const line of mounts.stdout.trim().split("\n")) {
          assert.ok(line.split(" ")[3]!.split(",").includes("nodev"), line);
        }
        assert.deepEqual(outboundEntries(sandbox).filter((e) => e.startsWith("null")), []);
        assert.throws(
          () => Deno.lstatSync(join(sandbox.paths.workspace, "null")),
          Deno.errors.NotFound,
        );
      });

      const nodes: {
        label: string;
        name: string;
        make: string;
        via: "cli" | "library";
      }[] = [
        {
          label: "FIFO under outbound.db",
          name: "outbound.db",
          make: `await new Deno.Command("mkfifo", { args: [path] }).output();`,
          via: "cli",
        },
        {
          label: "socket under outbound.db",
          name: "outbound.db",
          // Bound under another name and renamed: exiting without close keeps the file.
          make: `Deno.listen({ transport: "unix", path: path + ".tmp" });
                 Deno.renameSync(path + ".tmp", path);`,
          via: "library",
        },
        {
          label: "FIFO under outbound.db-journal",
          name: "outbound.db-journal",
          make: `await new Deno.Command("mkfifo", { args: [path] }).output();`,
          // The live runner's main thread blocks opening the FIFO while its
          // heartbeat thread is up: the request it never takes (and the beats
          // that stop once the main thread stops ticking) get it restarted.
          via: "cli",
        },
      ];
      for (const { label, name, make, via } of nodes) {
        const step = `${label}: host reads and a ${via} call return in bounded time`;
        await t.step({
          name: step,
          fn: async () => {
            const user = uniqueUser("hf-node");
            const sandbox = home.open(user);
            await sandbox.ensure();
            await runOk(sandbox, "echo kept > /workspace/kept");
            const planted = await mount(
              attacker,
              sandbox,
              `const path = "/queue/outbound/${name}";
             try { Deno.renameSync(path, path + ".aside"); } catch { /* absent */ }
             ${make}
             const info = Deno.lstatSync(path);
             if (info.isFile || info.isSymlink) throw new Error("not a special file");
             Deno.exit(0);`,
            );
            if (planted === null) return;
            const probe = await libraryWithin(home, user, { probeMs: 1000 }, 10_000);
            console.log(
              `${label}: liveness probe ${JSON.stringify(probe.report)}; ${
                describeChild(probe.child)
              }`,
            );
            assert.equal(
              probe.child.killed,
              false,
              `host reads hung: ${describeChild(probe.child)}`,
            );
            assert.ok(
              (probe.report?.maxReadMs ?? Infinity) < READ_BOUND_MS,
              `a host read took ${probe.report?.maxReadMs} ms`,
            );
            let ms: number;
            if (via === "cli") {
              const cli = await cliWithin(home, [
                "exec",
                "--user",
                user,
                "--",
                "cat",
                "/workspace/kept",
              ]);
              console.log(`${label}: waffle exec ${describeChild(cli)}`);
              assert.equal(cli.killed, false, `waffle exec hung: ${describeChild(cli)}`);
              assert.equal(cli.code, 0, describeChild(cli));
              assert.equal(cli.stdout, "kept\n");
              ms = cli.ms;
            } else {
              const lib = await libraryWithin(home, user, { run: "cat /workspace/kept" });
              console.log(`${label}: library run() ${JSON.stringify(lib.report)}`);
              assert.equal(lib.child.killed, false, `run() hung: ${describeChild(lib.child)}`);
              assert.equal(lib.report?.ok, true, JSON.stringify(lib.report));
              assert.equal(lib.report?.stdout, "kept\n");
              ms = lib.report!.ms;
            }
            assert.ok(ms < HEAL_BOUND_MS, `the call that met the ${label} took ${fmt(ms)}`);
            // Healed for the next call, workspace kept.
            assert.equal(await runOk(sandbox, "cat /workspace/kept"), "kept\n");
          },
        });
      }

      await t.step(
        "FIFO swapped under outbound.bell while a library host waits: run() and close() return, the event loop lives",
        async () => {
          // Only child processes ever wait on this user's queue: this test
          // process must not watch a bell that may become a FIFO (its watcher
          // thread would block opening it and freeze this process on close).
          const user = uniqueUser("hf-bell");
          const setup = await cliWithin(home, [
            "exec",
            "--user",
            user,
            "--",
            "sh",
            "-c",
            "echo kept > /workspace/kept",
          ]);
          assert.equal(setup.code, 0, describeChild(setup));
          const container = (await home.containers()).find((c) => c.Labels[LABELS.user] === user)
            ?.Id;
          assert.ok(container !== undefined, "the CLI made the container");
          // The host watches the bell while it waits; the runner keeps ringing
          // the old bell (its open descriptor) after the name is swapped.
          const library = libraryWithin(home, user, { run: "sleep 3; cat /workspace/kept" });
          const exec = cliWithin(home, [
            "exec",
            "--user",
            user,
            "--",
            "sh",
            "-c",
            "sleep 3; echo cli",
          ]);
          await delay(2000);
          // (This process never waits on the user's queue as the runner, and
          // its watcher never opens the bell anyway: inotify, IN_DONT_FOLLOW.)
          await mount(
            attacker,
            home.open(user),
            `Deno.renameSync("/queue/outbound/outbound.bell", "/queue/outbound/outbound.bell.aside");
             await new Deno.Command("mkfifo", { args: ["/queue/outbound/outbound.bell"] }).output();`,
            { containerId: container },
          );
          const [lib, cli] = await Promise.all([library, exec]);
          console.log(
            `FIFO under outbound.bell: library run()+close() ${JSON.stringify(lib.report)}; ${
              describeChild(lib.child)
            }`,
          );
          console.log(`FIFO under outbound.bell: waffle exec ${describeChild(cli)}`);
          assert.equal(cli.killed, false, `waffle exec hung: ${describeChild(cli)}`);
          assert.equal(cli.code, 0, describeChild(cli));
          assert.equal(cli.stdout, "cli\n");
          assert.equal(
            lib.child.killed,
            false,
            `the library host froze (run(), then sandbox.close() and one timer tick): ${
              describeChild(lib.child)
            }`,
          );
          assert.equal(lib.report?.ok, true, JSON.stringify(lib.report));
          assert.equal(lib.report?.stdout, "kept\n");
          assert.ok(lib.report!.ms < HEAL_BOUND_MS, `run() took ${fmt(lib.report!.ms)}`);
        },
      );
    } finally {
      assertUntouched([victim], spy, "special files");
      spy.close();
    }
  },
);

// ---------------------------------------------------------------------------
// 5. A check/open race: outbound.db swapped with a symlink and a FIFO.

bothWays(
  "hostile files 5: outbound.db swapped thousands of times with a symlink to a host file and a FIFO: no host read, no stall",
  async (docker, attacker) => {
    await using home = await hostileHome(docker);
    await using victim = await victimFile();
    const user = uniqueUser("hf-race");
    const sandbox = home.open(user);
    await sandbox.ensure();
    await runOk(sandbox, "echo kept > /workspace/kept");
    const swapMs = 6000;
    const spy = new FileSpy([victim.path]);
    try {
      // renameat2(RENAME_EXCHANGE) keeps a name in place at every instant, so
      // the host meets each kind, never a missing file.
      const swapper = mount(
        attacker,
        sandbox,
        `const libc = Deno.dlopen("libc.so.6", {
           renameat2: { parameters: ["i32", "buffer", "i32", "buffer", "u32"], result: "i32" },
         }).symbols;
         const AT_FDCWD = -100;
         const RENAME_EXCHANGE = 2;
         const c = (s: string) => new TextEncoder().encode(s + "\\0");
         const db = c("/queue/outbound/outbound.db");
         const link = c("/queue/outbound/swap-link");
         const fifo = c("/queue/outbound/swap-fifo");
         Deno.symlinkSync(${JSON.stringify(victim.path)}, "/queue/outbound/swap-link");
         await new Deno.Command("mkfifo", { args: ["/queue/outbound/swap-fifo"] }).output();
         let swaps = 0;
         const deadline = Date.now() + ${swapMs};
         while (Date.now() < deadline) {
           for (const other of [link, fifo]) {
             if (libc.renameat2(AT_FDCWD, db, AT_FDCWD, other, RENAME_EXCHANGE) !== 0) throw new Error("exchange");
             swaps++;
             if (libc.renameat2(AT_FDCWD, db, AT_FDCWD, other, RENAME_EXCHANGE) !== 0) throw new Error("exchange back");
             swaps++;
           }
         }
         const info = Deno.lstatSync("/queue/outbound/outbound.db");
         console.log(JSON.stringify({ swaps, regularAtEnd: info.isFile }));`,
      );
      if (attacker.kind === "command") {
        assert.equal(await swapper, null);
        return;
      }
      await delay(1000); // the swapper's Deno is up and swapping
      const probe = await libraryWithin(home, user, { probeMs: swapMs - 2500 }, 20_000);
      const swapped = JSON.parse((await swapper)!) as { swaps: number; regularAtEnd: boolean };
      console.log(
        `race: ${swapped.swaps} swaps; host probe ${JSON.stringify(probe.report)}; ${
          describeChild(probe.child)
        }`,
      );
      assert.equal(probe.child.killed, false, `host reads hung: ${describeChild(probe.child)}`);
      assert.ok(swapped.swaps >= 1000, `only ${swapped.swaps} swaps`);
      assert.ok(swapped.regularAtEnd);
      assert.ok(
        (probe.report?.maxReadMs ?? Infinity) < READ_BOUND_MS,
        `a host read took ${probe.report?.maxReadMs} ms`,
      );
      assert.ok((probe.report?.reads ?? 0) >= 100, `only ${probe.report?.reads} host reads`);
      assertUntouched([victim], spy, "during the race");
      const took = await measured(() => runOk(sandbox, "cat /workspace/kept"));
      console.log(`race: run() afterwards ${fmt(took.ms)}`);
      assert.equal(took.value, "kept\n", String(took.error));
      assert.ok(took.ms < HEAL_BOUND_MS, `run() took ${fmt(took.ms)}`);
    } finally {
      assertUntouched([victim], spy, "race, at the end");
      spy.close();
    }
  },
);

// ---------------------------------------------------------------------------
// 6. A replaced, truncated or pruned database: exactly once across damage.

bothWays(
  "hostile files 6: outbound.db truncated, overwritten or pruned after a command ran: it ran once, comes back interrupted, and the queue heals",
  async (docker, attacker, t) => {
    await using home = await hostileHome(docker);
    await using victim = await victimFile();
    const user = uniqueUser("hf-damage");
    const sandbox = home.open(user);
    await sandbox.ensure();
    // A fresh options object per wait: the queue bounds revivals per wait.
    const revive = (): WaitOptions => ({ revive: (trouble) => sandbox.ensure(trouble) });

    const damages: { label: string; script: string }[] = [
      {
        label: "truncated to 0 bytes",
        script: `Deno.truncateSync("/queue/outbound/outbound.db", 0);`,
      },
      {
        label: "overwritten with random bytes",
        script: `const path = "/queue/outbound/outbound.db";
                 const size = Deno.statSync(path).size;
                 const bytes = new Uint8Array(size);
                 for (let at = 0; at < size; at += 65536) crypto.getRandomValues(bytes.subarray(at, at + 65536));
                 const file = Deno.openSync(path, { write: true });
                 file.writeSync(bytes);
                 file.close();`,
      },
      {
        label: "its states and results rows deleted, then the runner restarted",
        script: `${OUTBOUND_SQL} ${RUNNER_PIDS}
                 sqlite("DELETE FROM states; DELETE FROM results; DELETE FROM chunks;");
                 for (const pid of runnerPids()) Deno.kill(pid, "SIGTERM");`,
      },
    ];
    for (const [i, { label, script }] of damages.entries()) {
      await t.step(`library: ${label}`, async () => {
        const marker = `runs-${i}`;
        const before = await generationOf(sandbox);
        const id = await sandbox.submit({ shell: `echo ran >> /workspace/${marker}; echo out` });
        // The damage lands once the result is committed and before the host
        // asked for it. A command cannot even wait for the result (EACCES):
        // then the request's own result must come through.
        const damaged = await mount(attacker, sandbox, `${awaitResultScript(id)}\n${script}`, {
          victims: [victim],
        });
        const took = await measured(() => sandbox.queue.collect(id, revive()));
        assert.equal(took.error, undefined, String(took.error));
        const { result, stdout } = took.value!;
        console.log(`damage '${label}': collect ${fmt(took.ms)}: ${JSON.stringify(result)}`);
        // Interrupted, or the command's own result when the host's last
        // consistent snapshot (served while the file is locked) already held
        // it: never anything else, and never a second run (checked below).
        if (result.exitCode === null) assertInterrupted(result, label);
        else {
          assert.equal(result.exitCode, 0, JSON.stringify(result));
          assert.equal(text(stdout), "out\n");
        }
        assert.ok(took.ms < HEAL_BOUND_MS, `collect took ${fmt(took.ms)}`);
        await sandbox.queue.ack(id);
        // Healed: the next call works, the command ran exactly once, the workspace is kept.
        assert.equal(await runOk(sandbox, `cat /workspace/${marker}`), "ran\n");
        assert.deepEqual(linesIn(sandbox, marker), ["ran"]);
        if (damaged === null) {
          assert.equal(result.exitCode, 0, `a command's refused damage: ${JSON.stringify(result)}`);
          assert.equal(await generationOf(sandbox), before, "the outbound generation changed");
        } else if (i < 2) assert.notEqual(await generationOf(sandbox), before, "a fresh outbound");
        victim.check();
      });
    }

    await runnerStep(t, attacker, "waffle exec: overwritten while the command runs", async () => {
      const marker = "runs-cli";
      const exec = cliWithin(home, [
        "exec",
        "--user",
        user,
        "--",
        "sh",
        "-c",
        `echo ran >> /workspace/${marker}; sleep 2; echo after`,
      ]);
      await waitForLine(sandbox, marker);
      await mount(attacker, sandbox, damages[1]!.script);
      const cli = await exec;
      console.log(`damage during waffle exec: ${describeChild(cli)}`);
      assert.equal(cli.killed, false, describeChild(cli));
      assert.equal(cli.code, 125, describeChild(cli));
      const lines = cli.stderr.trim().split("\n");
      assert.equal(lines.length, 1, `stderr is one line: ${JSON.stringify(cli.stderr)}`);
      assert.match(lines[0]!, /interrupted|lost or replaced/i);
      assert.ok(cli.ms < HEAL_BOUND_MS + 5000, `waffle exec took ${fmt(cli.ms)}`);
      assert.equal(await runOk(sandbox, `cat /workspace/${marker}`), "ran\n");
      assert.deepEqual(linesIn(sandbox, marker), ["ran"]);
    });

    // The runner's variant: its reset renames the spare outbound/ into place,
    // which needs no inode on a volume whose every inode is taken.
    await t.step({
      name:
        "every inode of the volume used (a command: from /workspace; the runner: in outbound/, then damaged): the sandbox serves, healing does not stall the host's event loop",
      fn: async () => {
        if (attacker.kind === "command") {
          // A command can fill the volume it shares with outbound/, not reach outbound/.
          const filled = await attacker.deno(sandbox, fillInodesScript("/workspace/junk"));
          assert.equal(filled.code, 0, filled.stdout + filled.stderr);
          const files = Number(filled.stdout.trim());
          console.log(`a command used up the volume's inodes from /workspace: ${files} files`);
          assert.ok(files > 10_000, `only ${files} files`);
          const damage = `Deno.truncateSync("/queue/outbound/outbound.db", 0);`;
          assert.equal(await mount(attacker, sandbox, damage, { victims: [victim] }), null);
          assert.equal(await runOk(sandbox, "rm -rf /workspace/junk; echo freed"), "freed\n");
          return;
        }
        const id = await sandbox.submit({ shell: "sleep 60", timeoutMs: 90_000 });
        await waitFor(() => sandbox.queue.state(id).state === "started", {
          timeoutMs: 20_000,
          what: "the request to start",
        });
        // Every inode of the volume, as empty files the host removes when it
        // sets the damaged directory aside.
        const files = Number(
          await mount(
            attacker,
            sandbox,
            `${fillInodesScript("/queue/outbound/junk")}
             Deno.truncateSync("/queue/outbound/outbound.db", 0);`,
          ),
        );
        let maxLag = 0;
        let last = performance.now();
        const monitor = setInterval(() => {
          const now = performance.now();
          maxLag = Math.max(maxLag, now - last - 10);
          last = now;
        }, 10);
        const took = await measured(() => sandbox.queue.collect(id, revive()));
        clearInterval(monitor);
        console.log(
          `damage with ${files} files in outbound/: collect ${
            fmt(took.ms)
          }, longest event-loop stall ${fmt(maxLag)}: ${
            took.error === undefined ? JSON.stringify(took.value?.result) : String(took.error)
          }`,
        );
        assert.ok(files > 10_000, `only ${files} files`);
        assert.equal(took.error, undefined, String(took.error));
        assertInterrupted(took.value!.result, "stuffed outbound");
        await sandbox.queue.ack(id);
        assert.ok(maxLag < READ_BOUND_MS, `the host's event loop stalled for ${fmt(maxLag)}`);
        assert.equal(await runOk(sandbox, "echo healed"), "healed\n");
      },
    });
    victim.check();
  },
);

// ---------------------------------------------------------------------------
// 7. A hostile schema.

bothWays(
  "hostile files 7: a hostile schema (endless views, triggers, expression indexes, view-named tables, versions) is refused in bounded time without running its SQL",
  async (docker, attacker, t) => {
    await using home = await hostileHome(docker);
    await using victim = await victimFile();
    const sandbox = home.open(uniqueUser("hf-schema"));
    await sandbox.ensure();
    // A fresh options object per wait: the queue bounds revivals per wait.
    const revive = (): WaitOptions => ({ revive: (trouble) => sandbox.ensure(trouble) });
    const endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)";
    const schemas: { label: string; sql: string }[] = [
      {
        label: "results replaced by an endless recursive view",
        sql:
          `DROP TABLE results; CREATE VIEW results(request_id, body, created_at) AS ${endless} SELECT 'r', 'b', x FROM c;`,
      },
      {
        label: "the same, with schema_version forged back",
        sql:
          `DROP TABLE results; CREATE VIEW results(request_id, body, created_at) AS ${endless} SELECT 'r', 'b', x FROM c;`,
      },
      {
        label: "a BEFORE INSERT trigger",
        sql:
          `CREATE TRIGGER spin BEFORE INSERT ON results BEGIN SELECT count(*) FROM (${endless} SELECT x FROM c); END;`,
      },
      {
        label: "an index on an expression",
        sql: "CREATE INDEX expr ON chunks(length(data) * 2 + seq);",
      },
      {
        // (The heartbeat left outbound.db in schema version 4: a view under its old name.)
        label: "a view named like a table (heartbeat) added",
        sql:
          `CREATE VIEW heartbeat(id, runner_id, boot_id, seq, time, state, idle_since) AS ${endless} SELECT 1, 'r', 'b', x, x, 'running', NULL FROM c;`,
      },
      { label: "user_version changed", sql: "PRAGMA user_version = 99;" },
    ];
    for (const { label, sql } of schemas) {
      await t.step(label, async () => {
        const forge = label.includes("forged");
        const script = `import { DatabaseSync } from "node:sqlite";
           const db = new DatabaseSync("/queue/outbound/outbound.db", { timeout: 20000 });
           const cookie = Number(Object.values(db.prepare("PRAGMA schema_version").get()!)[0]);
           db.exec(${JSON.stringify(sql)});
           ${forge ? `db.exec("PRAGMA schema_version = " + cookie);` : ""}
           db.close();`;
        if (await refusedAsCommand(attacker, sandbox, script, { victims: [victim] })) return;
        const id = await sandbox.submit({ shell: "sleep 60", timeoutMs: 90_000 });
        await waitFor(() => sandbox.queue.state(id).state === "started", {
          timeoutMs: 20_000,
          what: "the request to start",
        });
        await mount(attacker, sandbox, script);
        const read = await measured(() => sandbox.queue.liveness());
        console.log(
          `schema '${label}': liveness ${read.value?.state} in ${read.ms.toFixed(1)} ms wall, ${
            read.cpuMs.toFixed(1)
          } ms CPU: ${read.value?.detail}`,
        );
        assert.ok(read.ms < READ_BOUND_MS, `liveness took ${fmt(read.ms)}`);
        assert.ok(read.cpuMs < READ_BOUND_MS, `liveness used ${fmt(read.cpuMs)} of CPU`);
        assert.equal(read.value?.state, "damaged", JSON.stringify(read.value));
        assert.doesNotMatch(read.value!.detail, /\n/, "one line");
        const took = await measured(() => sandbox.queue.collect(id, revive()));
        console.log(
          `schema '${label}': collect ${fmt(took.ms)} wall, ${fmt(took.cpuMs)} CPU: ${
            took.error === undefined ? JSON.stringify(took.value?.result) : String(took.error)
          }`,
        );
        assert.equal(took.error, undefined, String(took.error));
        assertInterrupted(took.value!.result, label);
        assert.ok(took.ms < HEAL_BOUND_MS, `collect took ${fmt(took.ms)}`);
        await sandbox.queue.ack(id);
        assert.equal(await runOk(sandbox, "echo healed"), "healed\n");
        victim.check();
      });
    }
  },
);

// ---------------------------------------------------------------------------
// 8. A gigantic value.

bothWays(
  "hostile files 8: ~1 GiB result bodies and text chunks (and a 120 MiB body under the file cap) are refused without being loaded",
  async (docker, attacker, t) => {
    await using home = await hostileHome(docker, {
      quotaBytes: 2 * 1024 ** 3,
      // The attacker materialises its 1 GB text in the container.
      memoryBytes: 4 * 1024 ** 3,
    });
    await using victim = await victimFile();
    const sandbox = home.open(uniqueUser("hf-huge"));
    await sandbox.ensure();
    // A fresh options object per wait: the queue bounds revivals per wait.
    const revive = (): WaitOptions => ({ revive: (trouble) => sandbox.ensure(trouble) });
    const values: { label: string; sql: string; bytes?: number }[] = [
      {
        label: "result row with a zeroblob body",
        sql: "INSERT INTO results (request_id, body, created_at) VALUES (?, zeroblob(?), 0)",
      },
      {
        label: "result row with a 120 MiB body (a file the host still copies)",
        sql: "INSERT INTO results (request_id, body, created_at) VALUES (?, zeroblob(?), 0)",
        bytes: 120 * MiB,
      },
      {
        label: "stdout chunk with a text value",
        sql:
          "INSERT INTO chunks (request_id, stream, seq, data) VALUES (?, 'stdout', 0, CAST(zeroblob(?) AS TEXT))",
      },
    ];
    for (const { label, sql, bytes } of values) {
      const script = (id: string): string =>
        `${OUTBOUND_SQL}
         import { DatabaseSync as Db } from "node:sqlite";
         // The largest value this SQLite builds (its SQLITE_MAX_LENGTH), up to 1 GiB.
         // (less a little: the whole record must fit in that limit).
         const max = ${
          bytes ?? 0
        } || Math.min(1024 ** 3, (new Db(":memory:") as unknown as { limits: { length: number } }).limits.length) - 1024;
         sqlite(${JSON.stringify(sql)}, ${JSON.stringify(id)}, max);
         console.log(JSON.stringify({ max, file: Deno.statSync("/queue/outbound/outbound.db").size }));`;
      await t.step(label, async () => {
        // A command cannot open the file to write the value (nor name a request of its own).
        const refused = await refusedAsCommand(attacker, sandbox, script("no-such-request"), {
          victims: [victim],
        });
        if (refused) return;
        const id = await sandbox.submit({ shell: "sleep 120", timeoutMs: 180_000 });
        try {
          await waitFor(() => sandbox.queue.state(id).state === "started", {
            timeoutMs: 20_000,
            what: "the request to start",
          });
          const written = await measured(() => mount(attacker, sandbox, script(id)));
          assert.equal(written.error, undefined, String(written.error));
          const { max, file } = JSON.parse(written.value!) as { max: number; file: number };
          assert.ok(max >= (bytes ?? 900 * MiB), `only a ${max}-byte value`);
          const rssBefore = Deno.memoryUsage().rss;
          // One synchronous host read of the file, as every liveness check does.
          const read = await measured(() => sandbox.queue.liveness().state);
          const took = await measured(() => sandbox.queue.collect(id, revive()));
          const rssAfter = Deno.memoryUsage().rss;
          const growth = rssAfter - rssBefore;
          console.log(
            `huge ${label}: ${(max / MiB).toFixed(0)} MiB value, outbound.db ${
              (file / MiB).toFixed(0)
            } MiB written in ${fmt(written.ms)}; one host read ${read.ms.toFixed(1)} ms (${
              read.cpuMs.toFixed(1)
            } ms CPU, ${read.value}); host collect ${fmt(took.ms)}: ${
              took.error === undefined ? JSON.stringify(took.value?.result) : String(took.error)
            }; host RSS ${(rssBefore / MiB).toFixed(1)} -> ${
              (rssAfter / MiB).toFixed(1)
            } MiB (growth ${(growth / MiB).toFixed(1)} MiB)`,
          );
          assert.ok(growth < 64 * MiB, `the host's RSS grew by ${(growth / MiB).toFixed(1)} MiB`);
          assert.ok(read.ms < READ_BOUND_MS, `one host read took ${fmt(read.ms)}`);
          assert.ok(took.ms < HEAL_BOUND_MS, `collect took ${fmt(took.ms)}`);
          // Either refused as a bad row (ProtocolError for this request) or the
          // file as damaged (the queue healed and the request came back interrupted).
          if (took.error === undefined) assertInterrupted(took.value!.result, label);
          else assert.match(String(took.error), /ProtocolError|bytes/);
        } finally {
          // Whatever happened, the next step needs the runner free.
          await sandbox.queue.cancel(id).catch(() => {});
          await sandbox.queue.ack(id).catch(() => {});
        }
        assert.equal(await runOk(sandbox, "echo healed"), "healed\n");
        victim.check();
      });
    }
  },
);

// ---------------------------------------------------------------------------
// 9. Reaching into the queue and signalling the runner.

/**
 * One attempt on the queue or the runner: the shell that makes it, and what
 * each attacker gets (a pattern its output must match, `rc` its exit status).
 */
interface ReachProbe {
  name: string;
  shell: string;
  command: { rc: "fails"; says: RegExp };
  runner: { rc: "fails"; says: RegExp } | { rc: 0 };
}

const EACCES = /Permission denied/;
const EPERM = /Operation not permitted/;
const EROFS = /Read-only file system/;

/**
 * The attempts, in order. The runner's last two stop and kill itself: the
 * container (and this script) ends there, so they come last.
 */
function reachProbes(victim: string): ReachProbe[] {
  // A fresh Deno cache: a command's attempt must fail at the queue, not at the cache.
  const deno = "DENO_DIR=/tmp/hf-reach-deno /opt/waffle/deno eval --quiet";
  return [
    { name: "list-inbound", shell: "ls /queue/inbound" },
    { name: "read-inbound", shell: "cat /queue/inbound/inbound.db > /dev/null" },
    { name: "read-bell", shell: "cat /queue/inbound/inbound.bell > /dev/null" },
    { name: "create-inbound", shell: "touch /queue/inbound/new", runner: EROFS },
    { name: "write-inbound", shell: "echo x >> /queue/inbound/inbound.db", runner: EROFS },
    { name: "list-outbound", shell: "ls /queue/outbound" },
    { name: "read-outbound", shell: "cat /queue/outbound/outbound.db > /dev/null" },
    { name: "create-outbound", shell: "touch /queue/outbound/new" },
    {
      name: "symlink-outbound",
      shell: `ln -sf ${victim} /queue/outbound/outbound.db-journal`,
    },
    {
      name: "fifo-outbound",
      shell: "rm -f /queue/outbound/outbound.bell && mkfifo /queue/outbound/outbound.bell",
    },
    {
      name: "chmod-queue",
      shell: "chmod 777 /queue/outbound /queue/inbound",
      command: EPERM,
      runner: EROFS,
    },
    {
      name: "sqlite-lock",
      // Prints what each open and lock gave; exits 0 only if every one worked.
      shell: `${deno} 'import { DatabaseSync } from "node:sqlite";
          let failed = 0;
          for (const p of ["/queue/inbound/inbound.db", "/queue/outbound/outbound.db"]) {
            try { const f = Deno.openSync(p); f.lockSync(true); console.log("LOCKED " + p); } catch (e) { failed++; console.log(String(e)); }
            try { new DatabaseSync(p, { readOnly: true }).exec("SELECT 1"); console.log("OPENED " + p); } catch (e) { failed++; console.log(String(e)); }
          }
          Deno.exit(failed === 0 ? 0 : 3);'`,
    },
    // Last of the file attempts: it destroys the database the lock attempt opens.
    { name: "write-outbound", shell: "echo x > /queue/outbound/outbound.db" },
    { name: "stop-init", shell: "kill -STOP 1", command: EPERM },
    { name: "stop-runner", shell: `kill -STOP "$runner"`, command: EPERM },
    { name: "kill-runner", shell: `kill -KILL "$runner"`, command: EPERM },
  ].map((probe) => ({
    name: probe.name,
    shell: probe.shell,
    command: { rc: "fails", says: probe.command ?? EACCES },
    runner: probe.runner === undefined ? { rc: 0 } : { rc: "fails", says: probe.runner },
  }));
}

/** The attempts as one shell script: one line `NAME rc=N OUTPUT` per attempt. */
function reachScript(probes: ReachProbe[]): string {
  return [
    // The runner is the Deno process started by docker-init (pid 1).
    `runner=$(for p in /proc/[0-9]*; do case "$(tr '\\000' ' ' < $p/cmdline 2>/dev/null)" in "/opt/waffle/"*" runner --queue "*) echo \${p#/proc/};; esac; done | head -n1)`,
    `echo "runner pid $runner"`,
    "set -f",
    ...probes.map(({ name, shell }) =>
      `out=$( { ${shell} ; } 2>&1 ); rc=$?; echo "${name} rc=$rc" $out`
    ),
  ].join("\n");
}

bothWays(
  "hostile files 9: reaching into /queue and signalling the runner: a command is refused every attempt and the same runner keeps serving; the runner makes them (it owns the queue) and the host heals with the workspace kept",
  async (docker, attacker) => {
    await using home = await hostileHome(docker);
    await using victim = await victimFile();
    const sandbox = home.open(uniqueUser("hf-reach"));
    await sandbox.ensure();
    await runOk(sandbox, "echo kept > /workspace/kept");
    const container = containerOf(sandbox);
    const beat = sandbox.queue.heartbeat();
    const probes = reachProbes(victim.path);
    const script = reachScript(probes);
    const spy = new FileSpy([victim.path]);
    try {
      // A command's attempts are a real request; the runner's, docker exec -u 0.
      const ran = attacker.kind === "command"
        ? await run(sandbox, { shell: script, timeoutMs: 60_000 })
        : { ...await attacker.sh(sandbox, script), result: undefined };
      console.log(`attempts as ${attacker.label}:\n${ran.stdout}${ran.stderr}`);
      const lines = ran.stdout.trim().split("\n");
      assert.match(lines[0] ?? "", /^runner pid \d+$/, "the attacker found the runner's pid");
      const problems: string[] = [];
      for (const { name, command, runner } of probes) {
        const line = lines.find((l) => l.startsWith(`${name} rc=`));
        const expected = attacker.kind === "command" ? command : runner;
        if (line === undefined) {
          // The runner's kill ends its container, and the script with it.
          if (!(attacker.kind === "runner" && name === "kill-runner")) {
            problems.push(`${name}: no outcome`);
          }
        } else if (expected.rc === 0) {
          if (!/ rc=0\b/.test(line)) problems.push(`${name} failed: ${line}`);
        } else if (/ rc=0\b/.test(line) || !expected.says.test(line)) {
          problems.push(`${name}: expected a failure matching ${expected.says}: ${line}`);
        }
      }
      assert.deepEqual(problems, [], `as ${attacker.label}`);
      if (attacker.kind === "command") {
        // Still the same runner, serving, heartbeat moving.
        const after = await measured(() => runOk(sandbox, "echo still-serving"));
        assert.equal(after.value, "still-serving\n", String(after.error));
        assert.ok(after.ms < 5000, `the next call took ${fmt(after.ms)}`);
        await waitFor(() => sandbox.queue.heartbeat()?.seq !== beat?.seq, {
          timeoutMs: 10_000,
          what: "the heartbeat to move",
        });
        assert.equal(sandbox.queue.heartbeat()?.bootId, beat?.bootId, "the runner was restarted");
      } else {
        // The runner wrecked its queue and killed itself: the next call heals,
        // the workspace kept, and the host never followed the link to the victim.
        const took = await measured(() => runOk(sandbox, "cat /workspace/kept"));
        console.log(
          `after the runner's attempts: run() ${fmt(took.ms)}, outbound now ${
            JSON.stringify(outboundEntries(sandbox))
          }`,
        );
        assert.equal(took.value, "kept\n", String(took.error));
        assert.ok(took.ms < HEAL_BOUND_MS, `the healing call took ${fmt(took.ms)}`);
        assert.notEqual(sandbox.queue.heartbeat()?.bootId, beat?.bootId, "a new runner serves");
      }
      assert.equal(sandbox.lastEnsure?.containerId, container);
    } finally {
      assertUntouched([victim], spy, `attempts as ${attacker.label}`);
      spy.close();
    }
  },
);

// ---------------------------------------------------------------------------
// 10. Every inode of the volume held for longer than the stale limit.

bothWays(
  "hostile files 10: every inode of the volume held past the stale limit (a command: from /workspace; the runner: in outbound/): the next call succeeds with the workspace kept",
  async (docker, attacker) => {
    await using home = await hostileHome(docker);
    await using victim = await victimFile();
    const sandbox = home.open(uniqueUser("hf-inodes"));
    await sandbox.ensure();
    await runOk(sandbox, "echo kept > /workspace/kept");
    // A command fills the volume it shares with outbound/ (there is no inode
    // reserve for root); the runner fills its own directory, damaging nothing.
    const dir = attacker.kind === "runner" ? "/queue/outbound/junk" : "/workspace/junk";
    const filled = await attacker.deno(sandbox, fillInodesScript(dir));
    assert.equal(filled.code, 0, filled.stdout + filled.stderr);
    const files = Number(filled.stdout.trim());
    assert.ok(files > 10_000, `only ${files} files`);
    // Longer than the host waits for a beat: whatever needs a new inode to
    // beat or to heal has had to do without.
    await delay(STALE_AFTER_MS + 2000);
    const took = await measured(() => run(sandbox, "cat /workspace/kept"));
    console.log(
      `${files} inodes held by ${attacker.label} in ${dir} for ${
        fmt(STALE_AFTER_MS + 2000)
      }: run() ${fmt(took.ms)}: ${
        took.error === undefined ? JSON.stringify(took.value?.result) : String(took.error)
      }; outbound now ${JSON.stringify(outboundEntries(sandbox))}`,
    );
    assert.equal(took.error, undefined, String(took.error));
    assert.equal(took.value?.stdout, "kept\n", JSON.stringify(took.value?.result));
    assert.ok(took.ms < HEAL_BOUND_MS, `run() took ${fmt(took.ms)}`);
    if (attacker.kind === "command") {
      assert.equal(await runOk(sandbox, "rm -rf /workspace/junk; echo freed"), "freed\n");
    }
    assert.equal(await runOk(sandbox, "cat /workspace/kept"), "kept\n");
    victim.check();
  },
);
