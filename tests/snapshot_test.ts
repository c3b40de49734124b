/**
 * Workspace snapshots on the real Docker daemon and real loop volumes: save
 * and restore through the CLI and the library, names, limits, running
 * commands, a host killed at every step, the sandbox's identity, and a
 * hostile sandbox planting links and special files before a save.
 *
 * @module
 */
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { loadConfig } from "../lib/config/config.ts";
import { UsageError } from "../lib/errors.ts";
import { onPath } from "../lib/fs.ts";
import { settleRemovals } from "../lib/lifecycle/remove_tree.ts";
import { openRestricted } from "../lib/sandbox/restricted.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import {
  listSnapshots,
  removeSnapshot,
  restoreSnapshot,
  saveSnapshot,
} from "../lib/lifecycle/snapshot.ts";
import { SNAPSHOT_KILL_ENV } from "../lib/lifecycle/snapshot_copy.ts";
import { checkSnapshotName, storeDir } from "../lib/lifecycle/snapshot_store.ts";
import { liveTest } from "./_docker_gate.ts";
import { asCommand, bothWays, victimFile } from "./_hostile_helpers.ts";
import { run, runOk, tempHome, type TestHome, uniqueUser } from "./_sandbox_helpers.ts";
import { text, waitFor } from "./_helpers.ts";

/** A one-line error on stderr: `waffle: <Capital>…` with no trailing period. */
function assertOneLine(stderr: string, pattern: RegExp): void {
  assert.match(stderr, /^waffle: [A-Z][^\n]*[^.\n]\n$/, stderr);
  assert.match(stderr, pattern);
}

/** Names in a directory (none when it is missing). */
function names(dir: string): string[] {
  try {
    return [...Deno.readDirSync(dir)].map((entry) => entry.name).sort();
  } catch {
    return [];
  }
}

/** Runs a program, never throwing on its exit status. */
async function sh(program: string, args: string[]): Promise<{ code: number; stdout: string }> {
  const out = await new Deno.Command(program, { args, stdout: "piped", stderr: "piped" }).output();
  return { code: out.code, stdout: text(out.stdout) };
}

/** The files of the workspace, as `find` lists them inside (sorted). */
async function workspaceFiles(sandbox: Sandbox): Promise<string[]> {
  const out = await runOk(sandbox, "cd /workspace && find . -mindepth 1 | sort");
  return out.split("\n").filter((line) => line !== "");
}

/** A request's state, or undefined while the runner's file cannot be read. */
function stateOf(sandbox: Sandbox, id: string): string | undefined {
  try {
    return sandbox.queue.state(id).state;
  } catch {
    return undefined;
  }
}

/** Opens a sandbox and waits for it to be up, returning its container id. */
async function started(home: TestHome, sandbox: Sandbox): Promise<string> {
  await runOk(sandbox, "true");
  const id = sandbox.lastEnsure?.containerId;
  assert.ok(id !== undefined);
  assert.ok((await home.containers()).some((c) => c.Id === id));
  return id;
}

liveTest(
  "snapshot: the CLI restores a workspace after rm -rf /workspace/*, same container and queue",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("snap-cli");
    const cli = (args: string[]) => home.cli(args);
    const exec = (shell: string) => cli(["exec", "--user", user, "--", "sh", "-c", shell]);
    const wrote = await exec(
      "mkdir -p /workspace/src/deep && echo main > /workspace/src/main.py && " +
        "echo deep > /workspace/src/deep/x && ln -s main.py /workspace/src/link && echo top > /workspace/top",
    );
    assert.equal(wrote.code, 0, wrote.stderr);
    const before = await exec("cd /workspace && find . | sort && cat src/main.py");
    const containerBefore = (await home.containers()).map((c) => c.Id);
    assert.equal(containerBefore.length, 1);

    const saved = await cli(["snapshot", "save", "--user", user, "--json", "good"]);
    assert.equal(saved.code, 0, saved.stderr);
    const savedJson = JSON.parse(saved.stdout);
    assert.equal(savedJson.action, "saved");
    assert.equal(savedJson.snapshot.name, "good");
    assert.ok(savedJson.snapshot.bytes > 0 && savedJson.snapshot.volumeBytes > 0);
    assert.ok(Date.parse(savedJson.snapshot.createdAt) > Date.now() - 120_000);
    assert.equal(typeof savedJson.snapshot.saveMs, "number");

    const wiped = await exec("rm -rf /workspace/* && ls -A /workspace | wc -l");
    assert.equal(wiped.stdout.trim(), "0");
    // A result the host has not collected yet, from before the restore.
    const detached = await cli(["exec", "--user", user, "--detach", "--", "echo", "kept"]);
    assert.equal(detached.code, 0, detached.stderr);
    const sandbox = home.open(user);
    const id = detached.stdout.trim();
    await waitFor(() => stateOf(sandbox, id) === "done", { what: "the detached request" });
    const inbound = Deno.statSync(join(sandbox.paths.queue, "inbound", "inbound.db")).ino;
    const outbound = Deno.statSync(sandbox.paths.outbound).ino;

    const restored = await cli(["snapshot", "restore", "--user", user, "--json", "good"]);
    assert.equal(restored.code, 0, restored.stderr);
    const restoredJson = JSON.parse(restored.stdout);
    assert.equal(restoredJson.restarted, true);
    assert.equal(restoredJson.containerId, containerBefore[0]);

    assert.deepEqual(await exec("cd /workspace && find . | sort && cat src/main.py"), before);
    // Identity: the same container, the same queue files, the uncollected result.
    assert.deepEqual((await home.containers()).map((c) => c.Id), containerBefore);
    assert.equal(Deno.statSync(join(sandbox.paths.queue, "inbound", "inbound.db")).ino, inbound);
    assert.equal(Deno.statSync(sandbox.paths.outbound).ino, outbound);
    const waited = await cli(["wait", "--user", user, id]);
    assert.equal(waited.code, 0, waited.stderr);
    assert.equal(waited.stdout, "kept\n");

    const ls = await cli(["snapshot", "ls", "--user", user, "--json"]);
    assert.equal(ls.code, 0, ls.stderr);
    const listed = JSON.parse(ls.stdout);
    assert.deepEqual(listed.snapshots.map((s: { name: string }) => s.name), ["good"]);
    assert.equal(listed.maxSnapshots, 8);
    const table = await cli(["snapshot", "ls", "--user", user]);
    assert.match(table.stdout, /^NAME +CREATED +SIZE +VOLUME +SAVE\ngood +\d{4}-/);
    const ps = await cli(["ps", "--json"]);
    const row = JSON.parse(ps.stdout).sandboxes.find((s: { user: string }) => s.user === user);
    assert.equal(row.snapshots, 1);
    assert.match((await cli(["ps"])).stdout, /SNAPS/);

    const removed = await cli(["snapshot", "rm", "--user", user, "good"]);
    assert.equal(removed.code, 0, removed.stderr);
    assert.equal(removed.stdout, "removed 'good'\n");
    assert.deepEqual(await listSnapshots(sandbox), []);
    await settleRemovals();
  },
);

Deno.test("snapshot: names are checked, with one-line errors quoting the value", () => {
  for (const good of ["a", "before-migration", "v1.2_3", "A".repeat(64)]) checkSnapshotName(good);
  for (const bad of ["", ".hidden", "-x", "a/b", "..", "a b", "é", "A".repeat(65), "x\n"]) {
    assert.throws(
      () => checkSnapshotName(bad),
      (error: unknown) =>
        error instanceof UsageError &&
        error.message.startsWith(`Invalid snapshot name '${bad.slice(0, 80)}'`) &&
        !error.message.endsWith("."),
    );
  }
});

Deno.test("snapshot: [sandbox] max_snapshots and snapshot_bytes are read and checked", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-snapcfg-" });
  try {
    assert.equal(loadConfig({ home }).maxSnapshots, 8);
    assert.equal(loadConfig({ home }).snapshotBytes, 0);
    await Deno.writeTextFile(
      join(home, "waffle.toml"),
      "[sandbox]\nmax_snapshots = 3\nsnapshot_bytes = 1000000\n",
    );
    const config = loadConfig({ home });
    assert.equal(config.maxSnapshots, 3);
    assert.equal(config.snapshotBytes, 1_000_000);
    await Deno.writeTextFile(join(home, "waffle.toml"), "[sandbox]\nmax_snapshots = -1\n");
    assert.throws(() => loadConfig({ home }), /'sandbox\.max_snapshots'/);
    await Deno.writeTextFile(join(home, "waffle.toml"), "[sandbox]\nmax_snapshot = 1\n");
    assert.throws(() => loadConfig({ home }), /max_snapshot/);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test({
  name: "snapshot: a host that cannot mount the quota volume (not root) is told why in one line",
  ignore: Deno.uid() !== 0 || !onPath("setpriv"),
  fn: async () => {
    const dir = await Deno.makeTempDir({ prefix: "waffle-snap-nonroot-" });
    try {
      await Deno.chown(dir, 65534, 65534);
      const out = await new Deno.Command("setpriv", {
        args: [
          ...["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"],
          ...[Deno.execPath(), "run", "-A", "--cached-only", "main.ts"],
          ...["snapshot", "save", "--user", "u", "s"],
        ],
        cwd: new URL("..", import.meta.url).pathname,
        env: { HOME: dir, WAFFLE_HOME: join(dir, "home"), DENO_DIR: join(dir, "deno") },
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(out.code, 125);
      assertOneLine(
        text(out.stderr),
        /^waffle: Snapshots need the sandbox's disk-quota volume, which this host cannot mount: Loop mounts need root: running as uid '65534'\n$/,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

liveTest(
  "snapshot: a taken name needs --force, a missing one is an error, nothing is half-made",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("snap-names");
    const sandbox = home.open(user);
    await runOk(sandbox, "echo one > /workspace/f");
    const first = await saveSnapshot(sandbox, "s");
    const taken = await home.cli(["snapshot", "save", "--user", user, "s"]);
    assert.equal(taken.code, 125);
    assertOneLine(taken.stderr, /Snapshot 's' of user '[^']+' already exists: pass --force/);
    const badName = await home.cli(["snapshot", "save", "--user", user, "../x"]);
    assertOneLine(badName.stderr, /Invalid snapshot name '\.\.\/x'/);
    const missing = await home.cli(["snapshot", "restore", "--user", user, "nope"]);
    assert.equal(missing.code, 125);
    assertOneLine(missing.stderr, /No snapshot 'nope' of user '[^']+'/);
    await assert.rejects(removeSnapshot(sandbox, "nope"), /No snapshot 'nope'/);
    const noName = await home.cli(["snapshot", "save", "--user", user]);
    assertOneLine(noName.stderr, /Missing snapshot name/);

    await runOk(sandbox, "echo two > /workspace/f");
    const forced = await saveSnapshot(sandbox, "s", { force: true });
    assert.ok(forced.createdAt >= first.createdAt);
    await runOk(sandbox, "echo three > /workspace/f");
    await restoreSnapshot(sandbox, "s", { docker });
    assert.equal(await runOk(sandbox, "cat /workspace/f"), "two\n");
    assert.deepEqual(names(storeDir(sandbox.paths.root)), ["s"]);
    await settleRemovals();
  },
);

liveTest(
  "snapshot: max_snapshots and snapshot_bytes are enforced with one-line errors",
  async (docker) => {
    await using home = await tempHome(docker, { maxSnapshots: 2 });
    const user = uniqueUser("snap-limit");
    const sandbox = home.open(user);
    await runOk(sandbox, "head -c 3000000 /dev/urandom > /workspace/r");
    await saveSnapshot(sandbox, "a");
    await saveSnapshot(sandbox, "b");
    const over = await home.cli(["snapshot", "save", "--user", user, "c"]);
    assert.equal(over.code, 125);
    assertOneLine(
      over.stderr,
      /Snapshot limit reached: user '[^']+' has 2 of the 2 snapshots \[sandbox\] max_snapshots allows/,
    );
    // Replacing one does not add one.
    await saveSnapshot(sandbox, "b", { force: true });
    await removeSnapshot(sandbox, "a");
    await saveSnapshot(sandbox, "c");
    assert.deepEqual((await listSnapshots(sandbox)).map((s) => s.name), ["b", "c"]);

    const small = home.open(user, { config: { maxSnapshots: 8, snapshotBytes: 1024 * 1024 } });
    await assert.rejects(
      saveSnapshot(small, "d"),
      (error: unknown) =>
        error instanceof UsageError &&
        /^Snapshot limit reached: the snapshots of user '[^']+' would take \d+ bytes, over the 1048576 of \[sandbox\] snapshot_bytes$/
          .test(error.message),
    );
    const none = home.open(user, { config: { maxSnapshots: 0 } });
    await assert.rejects(saveSnapshot(none, "e"), /max_snapshots/);
    assert.deepEqual(names(storeDir(sandbox.paths.root)), ["b", "c"]);
  },
);

liveTest(
  "snapshot: save and restore refuse while a command runs and wait for it with --wait",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("snap-busy");
    const sandbox = home.open(user);
    await runOk(sandbox, "echo base > /workspace/f");
    await saveSnapshot(sandbox, "base");
    const id = await sandbox.submit({ shell: "sleep 3; echo late > /workspace/g" });
    await waitFor(() => stateOf(sandbox, id) === "started", { what: "the command" });
    await assert.rejects(
      saveSnapshot(sandbox, "during"),
      (error: unknown) =>
        error instanceof UsageError &&
        /^Cannot save snapshot 'during': 1 request is running in the sandbox of user '[^']+' \(first '[^']+'\); pass --wait to wait for them$/
          .test(error.message),
    );
    const refused = await home.cli(["snapshot", "restore", "--user", user, "base"]);
    assert.equal(refused.code, 125);
    assertOneLine(refused.stderr, /Cannot restore snapshot 'base': 1 request is running/);
    // Refusing stopped nothing: the command goes on. Waiting lets it finish first.
    const t0 = Date.now();
    const restored = await restoreSnapshot(sandbox, "base", { docker, waitMs: 30_000 });
    const { result } = await sandbox.queue.collect(id);
    assert.equal(result.exitCode, 0, JSON.stringify(result));
    assert.ok(Date.now() - t0 >= 1000, "the restore did not wait");
    assert.equal(restored.restarted, true);
    assert.deepEqual(await workspaceFiles(sandbox), ["./f"]);
    await sandbox.queue.ack(id);

    // The CLI's --wait, for a save; a finished request nobody collected does not count.
    await sandbox.submit({ shell: "true" });
    const slow = await sandbox.submit({ shell: "sleep 2; echo more > /workspace/h" });
    await waitFor(() => stateOf(sandbox, slow) === "started", { what: "the command" });
    const saved = await home.cli(["snapshot", "save", "--user", user, "--wait", "--json", "after"]);
    assert.equal(saved.code, 0, saved.stderr);
    await restoreSnapshot(sandbox, "after", { docker });
    assert.deepEqual(await workspaceFiles(sandbox), ["./f", "./h"]);
    const timedOut = await sandbox.submit({ shell: "sleep 5" });
    await waitFor(() => stateOf(sandbox, timedOut) === "started", { what: "the command" });
    await assert.rejects(
      saveSnapshot(sandbox, "x", { waitMs: 500 }),
      /Cannot save snapshot 'x': after waiting 0.5 s, 1 request is running in the sandbox of user '[^']+' \(first '[^']+'\)$/,
    );
    await sandbox.queue.collect(timedOut);

    // A restricted session mounts the workspace itself: a restore waits for it too.
    const session = await openRestricted(user, { config: { home: home.home }, docker });
    try {
      await assert.rejects(
        restoreSnapshot(sandbox, "base", { docker }),
        /Cannot restore snapshot 'base': 1 restricted session reads the workspace of user '[^']+'; pass --wait/,
      );
    } finally {
      await session.dispose();
    }
    await restoreSnapshot(sandbox, "base", { docker });
    assert.deepEqual(await workspaceFiles(sandbox), ["./f"]);
    await settleRemovals();
  },
);

liveTest(
  "snapshot: a host killed at any step leaves the old workspace or the new one, never a mix",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("snap-kill");
    const sandbox = home.open(user);
    const container = await started(home, sandbox);
    const OLD = ["./old-1", "./old-2"];
    const NEW = ["./new-1", "./new-2", "./new-dir"];
    await runOk(sandbox, "cd /workspace && touch new-1 new-2 && mkdir new-dir");
    await saveSnapshot(sandbox, "new");
    await runOk(sandbox, "cd /workspace && rm -rf ./* && touch old-1 old-2");
    const killedAt = (step: string, args: string[]) =>
      home.cli(["snapshot", ...args, "--user", user], { [SNAPSHOT_KILL_ENV]: step });

    const seen = new Set<string>();
    for (
      const [step, expected] of [["stopped", OLD], ["copied", OLD], ["exchanged", NEW]] as const
    ) {
      const killed = await killedAt(step, ["restore", "new"]);
      assert.equal(killed.code, 137, `killed at '${step}': ${killed.stderr}`);
      const left = names(sandbox.paths.volume).filter((n) =>
        n.startsWith(".restore-") && !seen.has(n)
      );
      left.forEach((name) => seen.add(name));
      assert.equal(left.length, step === "stopped" ? 0 : 1, `after '${step}'`);
      // The next call heals: the same container, one of the two workspaces.
      assert.deepEqual(await workspaceFiles(sandbox), expected, `after '${step}'`);
      assert.equal(sandbox.lastEnsure?.containerId, container);
    }
    // The next snapshot call removes what the killed ones left.
    const killedSave = await killedAt("saved", ["save", "half"]);
    assert.equal(killedSave.code, 137, killedSave.stderr);
    assert.deepEqual((await listSnapshots(sandbox)).map((s) => s.name), ["new"]);
    assert.ok(names(storeDir(sandbox.paths.root)).some((name) => name.startsWith(".saving-")));
    await restoreSnapshot(sandbox, "new", { docker });
    await settleRemovals();
    assert.deepEqual(names(storeDir(sandbox.paths.root)), ["new"]);
    assert.deepEqual(
      names(sandbox.paths.volume).filter((name) => name.startsWith(".")),
      [],
      "leftovers in the volume",
    );

    // A volume left frozen (a save's child killed with it frozen) is thawed first.
    const volume = Deno.realPathSync(sandbox.paths.volume);
    assert.equal((await sh("fsfreeze", ["-f", volume])).code, 0);
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      const saved = await Promise.race([
        saveSnapshot(sandbox, "after-freeze"),
        new Promise<never>((_, reject) =>
          timer = setTimeout(() => reject(new Error("hung")), 30_000)
        ),
      ]);
      assert.equal(saved.name, "after-freeze");
    } finally {
      clearTimeout(timer);
      await sh("fsfreeze", ["-u", volume]);
    }
    assert.deepEqual(await workspaceFiles(sandbox), NEW);
  },
);

liveTest(
  "snapshot: a save ends what a command left running and copies the volume frozen; a restore too",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("snap-bg");
    const sandbox = home.open(user);
    await runOk(sandbox, "echo base > /workspace/base");
    // A process a command left behind (outside any request: the runner ends
    // what a request leaves), writing all the time.
    const writer = await asCommand(
      await started(home, sandbox),
      "sh -c 'i=0; while :; do i=$((i+1)); echo $i >> /workspace/log; done' </dev/null >/dev/null 2>&1 &",
    );
    assert.equal(writer.code, 0, writer.stderr);
    await waitFor(async () => (await runOk(sandbox, "wc -l < /workspace/log")).trim() !== "0");
    const snapshot = await saveSnapshot(sandbox, "busy-fs");
    const image = join(storeDir(sandbox.paths.root), "busy-fs", "volume.img");
    // Copied frozen: the journal was flushed (a copy of the live image, with
    // writes under way, has 'needs_recovery' set), and the check finds nothing.
    const header = await sh("dumpe2fs", ["-h", image]);
    assert.match(header.stdout, /^Filesystem features:/m);
    assert.doesNotMatch(header.stdout, /needs_recovery/);
    const fsck = await sh("e2fsck", ["-fn", image]);
    assert.equal(fsck.code, 0, `the snapshot's filesystem is not clean: ${fsck.stdout}`);
    assert.ok(snapshot.saveMs < 30_000);
    await restoreSnapshot(sandbox, "busy-fs", { docker });
    // The writer ended with the container; its log is whole lines as frozen.
    const lines = (await runOk(sandbox, "cat /workspace/log")).split("\n").filter((l) => l);
    assert.ok(lines.length > 0);
    lines.forEach((line, i) => assert.equal(line, String(i + 1)));
    const count = lines.length;
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal((await runOk(sandbox, "wc -l < /workspace/log")).trim(), String(count));
    await settleRemovals();
  },
);

bothWays(
  "snapshot: links, FIFOs, sockets, hard links and setuid files planted before a save are restored inert, never followed on the host",
  async (docker, attacker) => {
    await using home = await tempHome(docker);
    await using victim = await victimFile();
    const user = uniqueUser("snap-hostile");
    const sandbox = home.open(user);
    // A directory the runner can write in too: a command shares it.
    await runOk(sandbox, "mkdir -m 0777 /workspace/shared && echo keep > /workspace/keep");
    const v = victim.path;
    const planted = await attacker.sh(
      sandbox,
      `cd /workspace/shared && ln -s ${v} abs && ln -s ../../../../../../../../..${v} rel && ` +
        `ln -s / root && ln -s ${dirname(v)} dir && ln -s . self && mkfifo fifo && ` +
        `echo data > file && ln file hard && cp /bin/sh suid && chmod 4755 suid && ` +
        `mkdir -p deep/a/b && ln -s ${v} deep/a/b/abs && (mknod dev c 1 3 2>/dev/null; true)`,
    );
    assert.equal(planted.code, 0, planted.stderr);
    const socket = await attacker.deno(
      sandbox,
      `Deno.listen({ transport: "unix", path: "/workspace/shared/sock" }); Deno.exit(0);`,
    );
    assert.equal(socket.code, 0, socket.stderr);
    if (attacker.kind === "runner") {
      // A link into the runner's own directory (a hard one is refused: another mount).
      const linked = await attacker.sh(
        sandbox,
        "ln -s /queue/outbound/outbound.db /workspace/shared/db",
      );
      assert.equal(linked.code, 0, linked.stderr);
    }
    const inventory =
      "cd /workspace/shared && for f in $(ls -A | sort); do stat -c '%n %F %a %u' \"$f\"; done; " +
      'for l in abs rel root dir self deep/a/b/abs; do echo "$l -> $(readlink $l)"; done';
    const before = await runOk(sandbox, inventory);
    assert.match(before, /^fifo fifo 644 /m);
    assert.match(before, /^sock socket /m);
    assert.match(before, /^suid regular file 4755 /m);
    await saveSnapshot(sandbox, "planted");

    // After the save, the links are aimed at the victim's directory and the
    // shared directory itself becomes a link into the queue.
    const outboundBefore = names(sandbox.paths.outbound);
    await runOk(
      sandbox,
      `rm -f /workspace/keep && mv /workspace/shared /workspace/gone && ln -s ${
        dirname(v)
      } /workspace/shared`,
    );
    await restoreSnapshot(sandbox, "planted", { docker });
    await settleRemovals();

    victim.check();
    assert.deepEqual(names(dirname(v)), ["secret"]);
    assert.equal(await runOk(sandbox, inventory), before);
    assert.equal(
      await runOk(sandbox, "cat /workspace/keep /workspace/shared/hard"),
      "keep\ndata\n",
    );
    assert.deepEqual(names(sandbox.paths.outbound).filter((n) => !outboundBefore.includes(n)), []);
    // The setuid file stays inert: the volume is mounted nosuid and nodev.
    const options = await sh("findmnt", [
      "-n",
      "-o",
      "OPTIONS",
      "--mountpoint",
      sandbox.paths.volume,
    ]);
    assert.match(options.stdout, /nosuid/);
    assert.match(options.stdout, /nodev/);
    assert.notEqual(
      (await run(sandbox, "/workspace/shared/suid -c 'id -u'")).stdout.trim(),
      "0",
      "a setuid file gave a command root",
    );
    // Nothing of the snapshot stays mounted or attached.
    const image = join(storeDir(sandbox.paths.root), "planted", "volume.img");
    await waitFor(async () => (await sh("losetup", ["-j", image])).stdout === "", {
      what: "the snapshot's loop device to go",
    });
    assert.deepEqual(names(storeDir(sandbox.paths.root)), ["planted"]);
  },
);

/**
 * Parked in a splice from a pipe it holds into a file on the volume: the
 * kernel holds the filesystem's write reference, so `fsfreeze` of a volume
 * with this process alive would wait for ever (in D state, unkillable).
 */
const SPLICER = `
const lib = Deno.dlopen("libc.so.6", {
  pipe: { parameters: ["buffer"], result: "i32" },
  open: { parameters: ["buffer", "i32", "i32"], result: "i32" },
  splice: {
    parameters: ["i32", "pointer", "i32", "pointer", "usize", "u32"],
    result: "isize",
    nonblocking: true,
  },
});
const fds = new Int32Array(2);
lib.symbols.pipe(fds);
const fd = lib.symbols.open(new TextEncoder().encode("/workspace/spliced\\0"), 0o101, 0o644);
Deno.writeTextFileSync("/workspace/splicing", String(fd));
await lib.symbols.splice(fds[0], null, fd, null, 1n << 20n, 0);
`;

bothWays(
  "snapshot: a process parked in a splice into the volume cannot hold a save (and the lock) for ever",
  async (docker, attacker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("snap-splice"));
    await runOk(sandbox, "echo keep > /workspace/keep && chmod 0777 /workspace");
    const id = await started(home, sandbox);
    await Deno.writeTextFile(join(sandbox.paths.workspace, "splice.js"), SPLICER);
    const planted = await attacker.sh(
      sandbox,
      "(setsid sh -c 'DENO_DIR=/tmp/splice-deno /opt/waffle/deno run -A --quiet " +
        "/workspace/splice.js' </dev/null >/dev/null 2>&1 &)",
      id,
    );
    assert.equal(planted.code, 0, planted.stderr);
    await waitFor(() => {
      try {
        return Deno.statSync(join(sandbox.paths.workspace, "splicing")).isFile;
      } catch {
        return false;
      }
    }, { timeoutMs: 30_000, what: "the splicer to park" });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const saved = await Promise.race([
      saveSnapshot(sandbox, "spliced", { docker }),
      new Promise<undefined>((resolve) => timer = setTimeout(() => resolve(undefined), 90_000)),
    ]).finally(() => clearTimeout(timer));
    assert.ok(saved !== undefined, "the save did not finish within 90 s");
    // Not left frozen, and the sandbox serves again (the save stopped and restarted it).
    assert.equal(
      await runOk(sandbox, "echo after > /workspace/after && cat /workspace/keep"),
      "keep\n",
    );
  },
);
