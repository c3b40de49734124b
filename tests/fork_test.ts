/**
 * Fork on the real Docker daemon and real loop volumes: a writer running in
 * the source during the fork leaves each fork a state it passed through,
 * never a mix, and keeps running; source and forks are independent
 * afterwards (files, queue, quota); the CLI's refusals; a hostile source.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { forkSandbox } from "../lib/lifecycle/fork.ts";
import { UsageError } from "../lib/errors.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import { liveTest } from "./_docker_gate.ts";
import { run, runOk, tempHome, uniqueUser } from "./_sandbox_helpers.ts";
import { waitFor } from "./_helpers.ts";
import { asCommand, containerOf, spawnAsRunner, victimFile } from "./_hostile_helpers.ts";

/** A file of the workspace as the host reads it on the mounted volume. */
function hostRead(sandbox: Sandbox, name: string): string {
  return Deno.readTextFileSync(join(sandbox.paths.workspace, name)).trim();
}

/** The request ids in a sandbox's `outbound.db` (its runner's states and results). */
function outboundIds(sandbox: Sandbox): string[] {
  const db = new DatabaseSync(join(sandbox.paths.outbound, "outbound.db"), { readOnly: true });
  try {
    return (db.prepare("SELECT request_id FROM states UNION SELECT request_id FROM results")
      .all() as { request_id: string }[]).map((row) => row.request_id);
  } finally {
    db.close();
  }
}

/** KiB used on a sandbox's /workspace filesystem. */
async function usedKiB(sandbox: Sandbox): Promise<number> {
  const out = await runOk(sandbox, "df -k /workspace | tail -1 | awk '{print $3}'");
  return Number(out.trim());
}

// Updates a then b by atomic renames: at any instant a == b or a == b + 1.
const WRITER = "i=0; while [ ! -e /workspace/stop ] && [ $i -lt 200000 ]; do i=$((i+1)); " +
  "echo $i > /workspace/a.t && mv /workspace/a.t /workspace/a; " +
  "echo $i > /workspace/b.t && mv /workspace/b.t /workspace/b; done; echo $i";

liveTest(
  "fork: a writer running during the fork leaves each fork a state it passed through, and keeps running",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("fork-src");
    const source = home.open(user);
    await runOk(
      source,
      "echo 0 > /workspace/a; echo 0 > /workspace/b; echo kept > /workspace/keep",
    );
    const earlier = await source.submit({ shell: "echo earlier" });
    await source.queue.collect(earlier);
    const containerBefore = source.lastEnsure?.containerId;
    const writer = await source.submit({ shell: WRITER });
    await waitFor(() => Number(hostRead(source, "a")) > 20, { what: "the writer's first rounds" });

    const targets = [1, 2, 3].map((n) => home.open(`${user}-${n}`));
    const forked = await forkSandbox(source, targets, { docker, start: true });
    const atFork = Number(hostRead(source, "a"));
    assert.equal(forked.processesForked, false);
    assert.deepEqual(forked.targets.map((t) => t.user), targets.map((t) => t.key.user));
    assert.ok(forked.targets.every((t) => t.containerId !== undefined));

    const states: [number, number][] = [];
    for (const target of targets) {
      const [a, b] = (await runOk(target, "cat /workspace/a /workspace/b")).trim().split("\n")
        .map(Number);
      states.push([a!, b!]);
      assert.ok(a! > 0 && (a === b || a === b! + 1), `a mix in a fork: a=${a} b=${b}`);
      assert.equal(await runOk(target, "cat /workspace/keep"), "kept\n");
    }
    // One instant: every fork holds the same state.
    assert.ok(states.every(([a, b]) => a === states[0]![0] && b === states[0]![1]));

    // The source's writer was frozen and thawed, never stopped: it goes on.
    await waitFor(() => Number(hostRead(source, "a")) > atFork + 20, {
      what: "the source's writer after the fork",
    });
    assert.equal(source.queue.state(writer).state, "started");
    assert.equal(source.lastEnsure?.containerId, containerBefore);
    assert.ok((await home.containers()).some((c) => c.Id === containerBefore));
    // Stopped through the host's mount: the source's next command would queue behind it.
    Deno.writeTextFileSync(join(source.paths.workspace, "stop"), "");
    const done = await source.queue.collect(writer);
    assert.equal(done.result.exitCode, 0);
    assert.ok(Number(new TextDecoder().decode(done.stdout).trim()) > atFork);
    // Independent: each one's writes are its own.
    await runOk(source, "echo s > /workspace/only-source");
    await runOk(targets[0]!, "echo f > /workspace/only-fork");
    for (const other of [targets[1]!, targets[2]!, source]) {
      assert.equal((await run(other, "test -e /workspace/only-fork")).result.exitCode, 1);
    }
    for (const target of targets) {
      assert.equal((await run(target, "test -e /workspace/only-source")).result.exitCode, 1);
    }

    // Each fork's queue is its own, empty of the source's requests.
    const sourceIds = outboundIds(source);
    assert.ok(sourceIds.includes(earlier) && sourceIds.includes(writer));
    for (const target of targets) {
      assert.throws(() => target.queue.state(earlier));
      const ids = outboundIds(target);
      assert.ok(!ids.includes(earlier) && !ids.includes(writer), `source ids in a fork: ${ids}`);
      assert.notEqual(target.paths.outbound, source.paths.outbound);
    }
    // Each fork's quota is its own filesystem.
    const sourceUsed = await usedKiB(source);
    const forkUsed = await usedKiB(targets[1]!);
    await runOk(
      targets[1]!,
      "dd if=/dev/urandom of=/workspace/big bs=1M count=64 2>/dev/null && sync",
    );
    assert.ok((await usedKiB(targets[1]!)) - forkUsed >= 60_000);
    assert.ok(Math.abs((await usedKiB(source)) - sourceUsed) < 30_000);
  },
);

liveTest(
  "fork: the library refuses an existing target, itself, twice, nothing made",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("fork-lib");
    const source = home.open(user);
    const existing = home.open(`${user}-old`);
    await runOk(source, "echo x > /workspace/x");
    await runOk(existing, "echo mine > /workspace/mine");
    const fresh = home.open(`${user}-new`);
    const cases: [Sandbox[], RegExp][] = [
      [[fresh, existing], /exists already/],
      [[source], /to itself/],
      [[fresh, fresh], /twice/],
    ];
    for (const [targets, pattern] of cases) {
      await assert.rejects(
        forkSandbox(source, targets, { docker, start: true }),
        (error: Error) => {
          assert.ok(error instanceof UsageError);
          assert.match(error.message, pattern);
          return true;
        },
      );
    }
    assert.equal(await runOk(existing, "cat /workspace/mine"), "mine\n");
    assert.throws(() => Deno.statSync(join(fresh.paths.root, "volume.img")));
    assert.deepEqual(
      [...Deno.readDirSync(fresh.paths.root)].filter((e) => e.name.startsWith("volume")),
      [],
    );
  },
);

/** A one-line error on stderr: `waffle: <Capital>…` with no trailing period. */
function assertOneLine(stderr: string, pattern: RegExp): void {
  assert.match(stderr, /^waffle: [A-Z][^\n]*[^.\n]\n$/, stderr);
  assert.match(stderr, pattern);
}

liveTest(
  "fork: waffle fork --count makes V-1..V-N; its refusals are one line, exit 125, nothing made",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("fork-cli");
    const wrote = await home.cli([
      "exec",
      "--user",
      user,
      "--",
      "sh",
      "-c",
      "echo hi > /workspace/f",
    ]);
    assert.equal(wrote.code, 0, wrote.stderr);
    const sandboxes = () => [...Deno.readDirSync(join(home.home, "sandboxes"))].length;
    const containers = async () => (await home.containers()).length;

    const forked = await home.cli([
      "fork",
      "--user",
      user,
      "--to",
      `${user}-f`,
      "--count",
      "2",
      "--json",
    ]);
    assert.equal(forked.code, 0, forked.stderr);
    const json = JSON.parse(forked.stdout);
    assert.deepEqual(json.targets.map((t: { user: string }) => t.user), [
      `${user}-f-1`,
      `${user}-f-2`,
    ]);
    assert.equal(json.processesForked, false);
    for (const target of [`${user}-f-1`, `${user}-f-2`]) {
      const read = await home.cli(["exec", "--user", target, "--", "cat", "/workspace/f"]);
      assert.equal(read.stdout, "hi\n");
    }
    const before = { roots: sandboxes(), containers: await containers() };
    const refusals: [string[], RegExp][] = [
      [["--to", `${user}-f-1`], /exists already/],
      [["--to", `${user}-f`, "--count", "3"], /'.*-f-1'.*exists already/],
      [["--to", "Bad Id!"], /Invalid user id 'Bad Id!'/i],
    ];
    for (const [flags, pattern] of refusals) {
      const refused = await home.cli(["fork", "--user", user, ...flags]);
      assert.equal(refused.code, 125, refused.stderr);
      assertOneLine(refused.stderr, pattern);
    }
    const unknown = await home.cli(["fork", "--user", "nobody-here", "--to", `${user}-g`]);
    assert.equal(unknown.code, 125);
    assertOneLine(unknown.stderr, /No sandbox for user 'nobody-here'/);
    assert.deepEqual({ roots: sandboxes(), containers: await containers() }, before);
  },
);

liveTest(
  "fork: a hostile command and runner in the source neither stall the fork nor reach beyond the target",
  async (docker) => {
    await using home = await tempHome(docker);
    await using victim = await victimFile();
    const user = uniqueUser("fork-hostile");
    const source = home.open(user);
    await runOk(source, "true");
    const container = containerOf(source);
    // The command: a link to a host file, a huge sparse file, many files.
    const planted = await asCommand(
      container,
      `ln -s ${victim.path} /workspace/link && truncate -s 100G /workspace/sparse && ` +
        "mkdir /workspace/many && cd /workspace/many && seq 1 3000 | xargs touch",
    );
    assert.equal(planted.code, 0, planted.stderr);
    // …and a request that keeps a file open, rewriting it with fsync.
    const writer = await source.submit({
      shell: "exec 3<>/workspace/held; i=0; while [ $i -lt 100000 ] && [ ! -e /workspace/stop ]; " +
        "do i=$((i+1)); dd if=/dev/zero of=/workspace/held bs=1M count=1 conv=notrunc,fsync " +
        "2>/dev/null; done",
    });
    // The runner (uid 0): a link, a sparse file and a writer held open in its outbound/.
    const attack = await spawnAsRunner(
      container,
      `Deno.symlinkSync(${JSON.stringify(victim.path)}, "/queue/outbound/evil");
       const f = Deno.openSync("/queue/outbound/sparse", { write: true, create: true });
       f.truncateSync(50 * 1024 ** 3);
       console.log("ready");
       for (let i = 0; i < 1e6; i++) {
         f.seekSync(0, Deno.SeekMode.Start); f.writeSync(new Uint8Array(4096)); f.syncSync();
       }`,
      "ready",
    );
    await waitFor(() => {
      try {
        return Deno.statSync(join(source.paths.workspace, "held")).size > 0;
      } catch {
        return false;
      }
    }, { what: "the held file" });
    const target = home.open(`${user}-t`);
    const rootsBefore = [...Deno.readDirSync(join(home.home, "sandboxes"))].map((e) => e.name);

    let timer: ReturnType<typeof setTimeout> | undefined;
    const bound = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error("The fork did not end within 120 s")), 120_000);
    });
    try {
      await Promise.race([forkSandbox(source, [target], { docker, start: true }), bound]);
    } finally {
      clearTimeout(timer);
    }

    // The target has the files, inert; none of the runner's outbound/.
    assert.equal(await runOk(target, "readlink /workspace/link"), `${victim.path}\n`);
    assert.equal(await runOk(target, "stat -c %s /workspace/sparse"), `${100 * 1024 ** 3}\n`);
    assert.equal(await runOk(target, "ls /workspace/many | wc -l"), "3000\n");
    const outbound = [...Deno.readDirSync(target.paths.outbound)].map((e) => e.name);
    assert.ok(!outbound.includes("evil") && !outbound.includes("sparse"), `${outbound}`);
    // Nothing beyond the target's own state: no new root, the host file intact.
    const rootsAfter = [...Deno.readDirSync(join(home.home, "sandboxes"))].map((e) => e.name);
    assert.deepEqual(rootsAfter.sort(), rootsBefore.sort());
    victim.check();
    // The source's processes were frozen and thawed, not stopped.
    assert.equal(attack.exited, false);
    assert.equal(source.queue.state(writer).state, "started");
    Deno.writeTextFileSync(join(source.paths.workspace, "stop"), "");
    assert.equal((await source.queue.collect(writer)).result.exitCode, 0);
    await attack.stop();
  },
);
