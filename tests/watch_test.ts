/**
 * The doorbell watcher (`lib/queue/watch.ts`): it wakes on a ring, and holds
 * one inotify descriptor and one watch per bell directory whatever the other
 * side does to the bell (new inodes by the thousand, a symlink, a FIFO, a
 * flood of events, its directory replaced), never opening the bell; close()
 * gives everything back. Live: the inode-churn attack on `outbound.bell`
 * mounted from inside a real container while a host waits on a command, as
 * a compromised runner (uid 0 via `docker exec -u 0`) and as a command (uid
 * 10001, which cannot reach `/queue` at all); the victim is the host
 * process's own descriptors and watches, counted from `/proc/self`.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import process from "node:process";
import { libc } from "../lib/libc.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import type { ExecResult } from "../lib/queue/protocol.ts";
import { Bell, ChangeWatcher, REWATCH_GAP_MS } from "../lib/queue/watch.ts";
import { liveTest } from "./_docker_gate.ts";
import { text, waitFor } from "./_helpers.ts";
import { asCommand, asRunner, containerOf } from "./_hostile_helpers.ts";
import { CHURN, CHURN_SCRIPT } from "./_runner_attacks.ts";
import { type KernelUse, kernelUse } from "./_kernel_use.ts";
import { runOk, tempHome, uniqueUser } from "./_sandbox_helpers.ts";

// Loaded before any test, so the resource sanitizer does not blame the first one.
const lib = libc();

// deno-lint-ignore no-console -- measured figures go in the closing note
const log = (...args: unknown[]): void => console.log(...args);

/** A poll interval no test waits out: a wait it ends was ended by something else. */
const NO_POLL_MS = 600_000;
/** How long a wait that must be woken may take before the test gives up on it. */
const WAKE_BOUND_MS = 10_000;
/** How long a wait that must not be woken is given to be woken anyway. */
const QUIET_MS = 300;

// ---------------------------------------------------------------------------
// Wakes.

/**
 * Waits once while `act` runs; true when a change ended the wait (the
 * watcher's wake count moved), false when the abort after `boundMs` did.
 */
async function woken(
  watcher: ChangeWatcher,
  act: () => void,
  boundMs = WAKE_BOUND_MS,
): Promise<boolean> {
  const before = watcher.wakes;
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), boundMs);
  const waited = watcher.wait(abort.signal);
  act();
  await waited;
  clearTimeout(timer);
  return watcher.wakes > before;
}

/** Whether a wait started after `act` is woken within QUIET_MS (it must not be). */
function wokenAnyway(watcher: ChangeWatcher, act: () => void = () => {}): Promise<boolean> {
  return woken(watcher, act, QUIET_MS);
}

async function tempDir(): Promise<AsyncDisposable & { path: string }> {
  const path = await Deno.makeTempDir({ prefix: "waffle-watch-" });
  return {
    path,
    [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }).catch(() => {}),
  };
}

/** A directory with an `outbound.bell`, as the runner makes it. */
function bellIn(dir: string): string {
  const path = join(dir, "outbound.bell");
  Deno.writeFileSync(path, new Uint8Array(1));
  return path;
}

/** Gives the bell's name a new inode, keeping the old one alive under `keep`. */
function replaceBell(path: string, keep: string): void {
  Deno.linkSync(path, keep);
  Deno.writeFileSync(`${path}.new`, new Uint8Array(1));
  Deno.renameSync(`${path}.new`, path);
}

/** Records IN_OPEN on some paths, by any process (the watcher must never open the bell). */
class OpenSpy {
  #fd: number;

  constructor(paths: string[]) {
    assert.ok(lib !== undefined, "libc is needed");
    this.#fd = lib.inotify_init1(0o4000 | 0o2000000);
    assert.ok(this.#fd >= 0, "inotify_init1 failed");
    for (const path of paths) {
      // IN_OPEN | IN_ACCESS | IN_DONT_FOLLOW: the spy opens nothing either.
      const wd = lib.inotify_add_watch(this.#fd, new TextEncoder().encode(`${path}\0`), 0x02000021);
      assert.ok(wd >= 0, `cannot watch '${path}'`);
    }
  }

  /** How many opens or reads happened since the last call. */
  opens(): number {
    let count = 0;
    const buffer = new Uint8Array(16 * 1024);
    while (true) {
      const got = Number(lib!.read(this.#fd, buffer, BigInt(buffer.length)));
      if (got <= 0) return count;
      const view = new DataView(buffer.buffer, 0, got);
      for (let at = 0; at + 16 <= got; at += 16 + view.getUint32(at + 12, true)) {
        if ((view.getUint32(at + 4, true) & 0x21) !== 0) count++;
      }
    }
  }

  [Symbol.dispose](): void {
    lib!.close(this.#fd);
  }
}

// ---------------------------------------------------------------------------
// Unit tests on real files.

Deno.test("ChangeWatcher wakes on a ring, not on other files in the directory, and holds one watch", async () => {
  await using dir = await tempDir();
  const path = bellIn(dir.path);
  const before = kernelUse();
  const watcher = new ChangeWatcher([path], { pollMs: NO_POLL_MS });
  const bell = new Bell(path);
  try {
    const watching = kernelUse();
    assert.equal(watching.inotifyFds, before.inotifyFds + 1, "one inotify descriptor");
    assert.equal(watching.watches, before.watches + 1, "one watch");
    // Anything may have happened before the watch: the first wait returns.
    assert.equal(await woken(watcher, () => {}), true);
    assert.equal(await woken(watcher, () => bell.ring()), true, "a ring wakes");
    // The database next to the bell is written inside the commit: not a ring.
    assert.equal(
      await wokenAnyway(watcher, () => Deno.writeTextFileSync(join(dir.path, "outbound.db"), "x")),
      false,
      "a write to another file woke the watcher",
    );
    assert.equal(await woken(watcher, () => bell.ring()), true, "the next ring wakes");
    assert.equal(await wokenAnyway(watcher), false, "woken with nothing rung");
  } finally {
    bell.close();
    watcher.close();
  }
  assert.deepEqual(kernelUse(), before, "close() gave back the descriptor and its watch");
});

Deno.test({
  name: "A bell owned by another uid rings by opening and closing it, its times untouched",
  // Only root can make a file another uid owns; CI runs as root.
  ignore: Deno.uid() !== 0,
  fn: async () => {
    await using dir = await tempDir();
    const path = bellIn(dir.path);
    Deno.chmodSync(dir.path, 0o755);
    Deno.chmodSync(path, 0o666); // writable by the ringer, owned by root
    const before = Deno.statSync(path).mtime?.getTime();
    const denoDir = await Deno.makeTempDir({ prefix: "waffle-watch-deno-" });
    Deno.chownSync(denoDir, 10001, 10001);
    const watcher = new ChangeWatcher([path], { pollMs: NO_POLL_MS });
    try {
      assert.equal(await woken(watcher, () => {}), true, "the first wait returns");
      const module = new URL("../lib/queue/watch.ts", import.meta.url).href;
      // The ringer stays alive (its descriptor open) until told to go: its
      // exit would close the bell, an IN_CLOSE_WRITE of its own.
      const ringer = new Deno.Command("setpriv", {
        args: ["--reuid=10001", "--regid=10001", "--clear-groups", Deno.execPath(), "eval"].concat(
          `const { Bell } = await import(${JSON.stringify(module)});` +
            `const bell = new Bell(${JSON.stringify(path)}); bell.ring();` +
            "for await (const _ of Deno.stdin.readable) break; bell.close();",
        ),
        env: { DENO_DIR: denoDir, HOME: denoDir, DENO_NO_UPDATE_CHECK: "1" },
        stdin: "piped",
        stdout: "null",
        stderr: "piped",
      }).spawn();
      const wakes = await woken(watcher, () => {});
      await ringer.stdin.close();
      const output = await ringer.output();
      assert.equal(output.code, 0, text(output.stderr));
      assert.equal(wakes, true, "the ring of a uid that may not set the bell's times woke no one");
      assert.equal(Deno.statSync(path).mtime?.getTime(), before, "the bell was written to");
    } finally {
      watcher.close();
      await Deno.remove(denoDir, { recursive: true });
    }
  },
});

Deno.test("ChangeWatcher survives 2,000 new inodes under the bell's name with one watch", async () => {
  await using dir = await tempDir();
  const path = bellIn(dir.path);
  const before = kernelUse();
  const watcher = new ChangeWatcher([path], { pollMs: NO_POLL_MS });
  const done = new AbortController();
  done.abort();
  try {
    await watcher.wait();
    let most = 0;
    for (let i = 0; i < 2000; i++) {
      replaceBell(path, join(dir.path, `old-${i}`));
      // A wait between each (as a host woken by every ring): where a watch
      // per inode would be added.
      await watcher.wait(done.signal);
      if (i % 100 === 0) most = Math.max(most, kernelUse().watches - before.watches);
    }
    const after = kernelUse();
    log(`2,000 inodes under the bell: at most ${most} watch(es) held, ${after.watches} at the end`);
    assert.equal(after.watches, before.watches + 1, "still one watch");
    assert.equal(most, 1, "one watch all along");
    assert.equal(after.inotifyFds, before.inotifyFds + 1);
    // The bell in place now is a new inode: its ring wakes.
    const bell = new Bell(path);
    try {
      await watcher.wait(); // the renames rang
      assert.equal(await woken(watcher, () => bell.ring()), true, "the new bell's ring wakes");
    } finally {
      bell.close();
    }
  } finally {
    watcher.close();
  }
  assert.deepEqual(kernelUse(), before);
});

Deno.test("ChangeWatcher never opens the bell's name: a symlink, then a FIFO put in its place", async () => {
  await using dir = await tempDir();
  await using outside = await tempDir();
  const path = bellIn(dir.path);
  const victim = join(outside.path, "victim");
  Deno.writeTextFileSync(victim, "victim\n");
  const fifo = join(outside.path, "fifo");
  const made = await new Deno.Command("mkfifo", { args: [fifo] }).output();
  assert.equal(made.code, 0, text(made.stderr));
  using spy = new OpenSpy([victim, fifo]);
  const watcher = new ChangeWatcher([path], { pollMs: 20 });
  try {
    await watcher.wait();
    Deno.symlinkSync(victim, `${path}.link`);
    assert.equal(await woken(watcher, () => Deno.renameSync(`${path}.link`, path)), true);
    // Waits that end on the poll interval look at the name again each time.
    for (let i = 0; i < 10; i++) await watcher.wait();
    assert.equal(spy.opens(), 0, "the watcher opened or read the symlink's target");

    // A FIFO: opening it would block (no writer), reading it would hang.
    Deno.linkSync(fifo, `${path}.fifo`);
    assert.equal(await woken(watcher, () => Deno.renameSync(`${path}.fifo`, path)), true);
    for (let i = 0; i < 10; i++) await watcher.wait();
    assert.equal(spy.opens(), 0, "the watcher opened the FIFO");
    assert.ok(Deno.lstatSync(path).isFifo, "the FIFO is still under the bell's name");
  } finally {
    watcher.close();
  }
});

Deno.test("ChangeWatcher.close() releases its descriptor and watch and ends a pending wait", async () => {
  await using dir = await tempDir();
  const path = bellIn(dir.path);
  const before = kernelUse();
  const watcher = new ChangeWatcher([path], { pollMs: NO_POLL_MS });
  await watcher.wait();
  assert.equal(kernelUse().inotifyFds, before.inotifyFds + 1);
  // Ended by close(), not by its (ten-minute) poll interval; the sanitizer
  // fails the test if a timer or a poll(2) is left behind.
  const pending = watcher.wait();
  watcher.close();
  await pending;
  assert.equal(watcher.wakes, 1, "close() is not a change");
  assert.deepEqual(kernelUse(), before);
  // Twice is harmless.
  watcher.close();
  assert.deepEqual(kernelUse(), before);
});

Deno.test("ChangeWatcher turns a flood of rings, or an event queue overflow, into one wake", async () => {
  await using dir = await tempDir();
  const path = bellIn(dir.path);
  const watcher = new ChangeWatcher([path], { pollMs: NO_POLL_MS });
  const bell = new Bell(path);
  try {
    await watcher.wait();
    for (let i = 0; i < 10_000; i++) bell.ring();
    assert.equal(await woken(watcher, () => {}), true, "10,000 rings wake");
    assert.equal(await wokenAnyway(watcher), false, "10,000 rings woke more than once");

    // More new files (an IN_CREATE each, and more) than the kernel queues
    // (16,384 by default): the ring after them is lost, and only the
    // overflow (as one ring) can wake the watcher.
    const queued = Number(Deno.readTextFileSync("/proc/sys/fs/inotify/max_queued_events"));
    for (let i = 0; i < queued + 1000; i++) {
      Deno.writeFileSync(join(dir.path, `noise-${i}`), new Uint8Array());
    }
    bell.ring();
    const wakes = watcher.wakes;
    assert.equal(await woken(watcher, () => {}), true, "the flood wakes");
    assert.equal(watcher.wakes, wakes + 1);
    assert.equal(await wokenAnyway(watcher), false, "the flood woke more than once");
    assert.equal(await woken(watcher, () => bell.ring()), true, "a ring after the flood wakes");
  } finally {
    bell.close();
    watcher.close();
  }
});

Deno.test("ChangeWatcher follows a replaced directory, removing the old watch first", async () => {
  await using root = await tempDir();
  const dir = join(root.path, "outbound");
  Deno.mkdirSync(dir);
  const path = bellIn(dir);
  const before = kernelUse();
  const watcher = new ChangeWatcher([path], { pollMs: 20 });
  try {
    await watcher.wait();
    const oldBell = new Bell(path);
    // Set aside and replaced, as the host resets a damaged outbound/.
    Deno.renameSync(dir, `${dir}.aside`);
    Deno.mkdirSync(dir);
    bellIn(dir);
    const newBell = new Bell(path);
    try {
      // Within REWATCH_GAP_MS of the first watch: the new directory is
      // watched once that much time has passed, on some wait.
      await waitFor(async () => {
        await watcher.wait();
        return kernelUse().watches === before.watches + 1 &&
          !(await wokenAnyway(watcher, () => oldBell.ring()));
      }, { timeoutMs: REWATCH_GAP_MS + WAKE_BOUND_MS, what: "the old directory's watch to go" });
      assert.equal(kernelUse().watches, before.watches + 1, "one watch, on the new directory");
      // Replaced again and again: never more than one watch.
      let most = 0;
      for (let i = 0; i < 20; i++) {
        Deno.renameSync(dir, `${dir}.aside-${i}`);
        Deno.mkdirSync(dir);
        bellIn(dir);
        await watcher.wait();
        most = Math.max(most, kernelUse().watches - before.watches);
      }
      assert.ok(most <= 1, `${most} watches held while the directory was replaced`);
    } finally {
      oldBell.close();
      newBell.close();
    }
    const bell = new Bell(path);
    try {
      await waitFor(async () => await woken(watcher, () => bell.ring(), QUIET_MS), {
        timeoutMs: REWATCH_GAP_MS + WAKE_BOUND_MS,
        what: "the last directory's ring to wake",
      });
    } finally {
      bell.close();
    }
    assert.equal(kernelUse().watches, before.watches + 1);
  } finally {
    watcher.close();
  }
  assert.deepEqual(kernelUse(), before);
});

// ---------------------------------------------------------------------------
// Live: the inode-churn attack while a host waits on a command.

/** As the commands' uid: the same churn, each step's outcome printed. */
const COMMAND_CHURN = `
b=/queue/outbound/outbound.bell
ls /queue/outbound >/dev/null && echo "ls: ok" || echo "ls: denied"
ln "$b" /queue/outbound/old-bell-cmd && echo "link: ok" || echo "link: denied"
touch /queue/outbound/outbound.bell.new && echo "create: ok" || echo "create: denied"
: > /tmp/new-bell; mv -f /tmp/new-bell "$b" && echo "rename: ok" || echo "rename: denied"
printf x >> "$b" && echo "ring: ok" || echo "ring: denied"
n=0; i=0
while [ $i -lt 200 ]; do
  ln "$b" /queue/outbound/old-bell-cmd-$i 2>/dev/null && n=$((n+1))
  i=$((i+1))
done
echo "links made: $n"
`;

/** What the host held while it waited on a command under an attack. */
interface UnderAttack {
  before: KernelUse;
  during: KernelUse[];
  after: KernelUse;
  result: ExecResult;
  stdout: string;
}

/**
 * Submits a command that runs until the test lets it finish, waits on it,
 * counts this process's descriptors and watches before, during (every
 * 20 ms) and after `attack`, then lets the command finish and collects it.
 */
async function waitUnderAttack(
  sandbox: Sandbox,
  attack: () => Promise<void>,
): Promise<UnderAttack> {
  const started = join(sandbox.paths.workspace, `started-${crypto.randomUUID()}`);
  const release = join(sandbox.paths.workspace, `release-${crypto.randomUUID()}`);
  const inside = (path: string): string => `/workspace/${path.slice(path.lastIndexOf("/") + 1)}`;
  const id = await sandbox.submit({
    shell: `: > ${inside(started)}; while [ ! -e ${inside(release)} ]; do sleep 0.05; done; ` +
      `echo finished`,
  });
  const collected = sandbox.queue.collect(id, { revive: (trouble) => sandbox.ensure(trouble) });
  await waitFor(() => {
    try {
      return Deno.statSync(started).isFile;
    } catch {
      return false;
    }
  }, { timeoutMs: 20_000, what: "the command to start" });
  const before = kernelUse();
  const during: KernelUse[] = [];
  const sampler = setInterval(() => during.push(kernelUse()), 20);
  try {
    await attack();
  } finally {
    clearInterval(sampler);
  }
  during.push(kernelUse());
  Deno.writeTextFileSync(release, "");
  const { result, stdout } = await collected;
  await sandbox.queue.ack(id);
  return { before, during, after: kernelUse(), result, stdout: text(stdout) };
}

function most(samples: KernelUse[], key: keyof KernelUse): number {
  return Math.max(...samples.map((sample) => sample[key]));
}

function describeUse(label: string, under: UnderAttack): string {
  const range = (key: keyof KernelUse): string =>
    `${under.before[key]} before, ${Math.min(...under.during.map((s) => s[key]))}..${
      most(under.during, key)
    } during (${under.during.length} samples), ${under.after[key]} after`;
  return `${label}: watches ${range("watches")}; inotify fds ${range("inotifyFds")}; ` +
    `fds ${range("fds")}; fds other than pipes, sockets, pidfds ${range("own")}`;
}

/** The resources the watcher and the queue hold did not move. */
function assertBounded(under: UnderAttack, queues: number): void {
  assert.ok(
    under.before.watches <= queues,
    `${under.before.watches} watches for ${queues} open queue(s)`,
  );
  for (const key of ["watches", "inotifyFds", "own"] as const) {
    assert.equal(most(under.during, key), under.before[key], `${key} grew during the attack`);
    assert.equal(Math.min(...under.during.map((s) => s[key])), under.before[key], `${key} fell`);
    assert.equal(under.after[key], under.before[key], `${key} changed after the attack`);
  }
  // Pipes, sockets and pidfds: at most one docker CLI child's more while it
  // attacks; none more after (idle Docker API connections may have closed).
  assert.ok(most(under.during, "fds") <= under.before.fds + 4, describeUse("fds", under));
  assert.ok(under.after.fds <= under.before.fds, describeUse("fds", under));
  assert.equal(under.result.exitCode, 0, JSON.stringify(under.result));
  assert.equal(under.stdout, "finished\n");
}

function outboundNames(sandbox: Sandbox): string[] {
  return [...Deno.readDirSync(sandbox.paths.outbound)].map((entry) => entry.name).sort();
}

liveTest(
  "inode churn on outbound.bell while a host waits: a command cannot reach it; a compromised runner's 20,000 inodes leave the host's watches and descriptors unchanged",
  async (docker, t) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const sandbox = home.open(uniqueUser("watch"));
    await runOk(sandbox, "true");
    const container = containerOf(sandbox);
    const bell = join(sandbox.paths.outbound, "outbound.bell");

    await t.step("as a command (uid 10001): /queue/outbound cannot be touched at all", async () => {
      const names = outboundNames(sandbox);
      const inode = Deno.lstatSync(bell).ino;
      let attack = { code: -1, stdout: "", stderr: "" };
      const under = await waitUnderAttack(sandbox, async () => {
        attack = await asCommand(container, COMMAND_CHURN);
      });
      log(describeUse("churn as a command", under));
      log(`churn as a command: ${attack.stdout.trim().split("\n").join(", ")}`);
      for (const step of ["ls", "link", "create", "rename", "ring"]) {
        assert.match(attack.stdout, new RegExp(`^${step}: denied$`, "m"), attack.stdout);
      }
      assert.match(attack.stdout, /^links made: 0$/m);
      assert.match(attack.stderr, /Permission denied/);
      assert.deepEqual(outboundNames(sandbox), names, "the command changed /queue/outbound");
      assert.equal(Deno.lstatSync(bell).ino, inode, "the bell has another inode");
      assertBounded(under, 1);
    });

    await t.step("as the runner (uid 0): 20,000 inodes, old ones hard-linked", async () => {
      const inode = Deno.lstatSync(bell).ino;
      let attack = { code: -1, stdout: "", stderr: "" };
      const cpu = process.cpuUsage();
      const wall = performance.now();
      const under = await waitUnderAttack(sandbox, async () => {
        attack = await asRunner(container, CHURN_SCRIPT);
      });
      log(describeUse("churn as the runner", under));
      const used = process.cpuUsage(cpu);
      log(
        `churn as the runner: ${attack.stdout.trim()}; host process CPU ${
          ((used.user + used.system) / 1000).toFixed(0)
        } ms over ${(performance.now() - wall).toFixed(0)} ms of wall time`,
      );
      assert.equal(attack.code, 0, attack.stderr);
      const report = JSON.parse(attack.stdout) as { tag: string; churned: number; inodes: number };
      assert.equal(report.inodes, CHURN, "every replacement was a new inode");
      // The host sees what the runner did: every old inode still linked.
      const kept = outboundNames(sandbox).filter((name) =>
        name.startsWith(`old-bell-${report.tag}-`)
      );
      assert.equal(kept.length, CHURN, "the old inodes are kept alive by hard links");
      assert.notEqual(Deno.lstatSync(bell).ino, inode, "the bell has a new inode");
      assertBounded(under, 1);
      // The sandbox still serves.
      assert.equal(await runOk(sandbox, "echo ok"), "ok\n");
    });

    await t.step("close() gives back the queue's inotify descriptor and its watch", () => {
      const open = kernelUse();
      sandbox.close();
      const closed = kernelUse();
      assert.equal(closed.inotifyFds, open.inotifyFds - 1);
      assert.equal(closed.watches, open.watches - 1);
    });
  },
);
