/**
 * The one liveness judgement (`lib/queue/liveness.ts`): a runner is alive
 * while its heartbeat file changes by the host's clock, whatever it writes.
 * Unit tests on real files, then live attacks: a compromised runner that
 * forges a beat and freezes itself is dead to `ps`, `sweep` and the warm
 * path, from fresh processes; a command can neither forge nor freeze.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { HEARTBEAT_FILE_BYTES, writeHeartbeatFile } from "../lib/queue/heartbeat_file.ts";
import {
  judgeProgress,
  judgeRunner,
  RESULT_GRACE_MS,
  STALE_AFTER_MS,
  TAKE_WITHIN_MS,
} from "../lib/queue/liveness.ts";
import type { Heartbeat } from "../lib/queue/protocol.ts";
import { liveTest } from "./_docker_gate.ts";
import { delay, waitFor } from "./_helpers.ts";
import { asCommand, asRunner, containerOf } from "./_hostile_helpers.ts";
import { FORGE_AND_FREEZE_SCRIPT } from "./_runner_attacks.ts";
import { runOk, tempHome, uniqueUser } from "./_sandbox_helpers.ts";

const BEAT: Heartbeat = { runnerId: "r", bootId: "b", seq: 1, time: 0, state: "running" };

async function beatDir(): Promise<{ path: string; [Symbol.asyncDispose](): Promise<void> }> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-liveness-" });
  return {
    path: join(dir, "heartbeat.json"),
    [Symbol.asyncDispose]: () => Deno.remove(dir, { recursive: true }),
  };
}

Deno.test("judgeRunner() is alive while the file changes and stale after three beats by the host's clock, whatever time the beat states", async () => {
  await using dir = await beatDir();
  assert.equal(judgeRunner(dir.path, { queue: "q" }).state, "none");
  for (const time of [0, Date.now(), Date.now() + 365 * 86_400_000]) {
    writeHeartbeatFile(dir.path, { ...BEAT, time });
    const now = judgeRunner(dir.path, { queue: "q" });
    assert.equal(now.state, "alive", `time ${time}`);
    assert.equal(now.beat?.time, time);
    assert.ok(now.changedAt! >= Date.now() - 1000, "changedAt is the host's clock");
    const later = judgeRunner(dir.path, { queue: "q", now: Date.now() + STALE_AFTER_MS + 1500 });
    assert.equal(later.state, "stale", `time ${time}`);
    assert.match(later.detail, /^The runner of queue 'q' stopped beating: no heartbeat for \d+ s$/);
  }
  writeHeartbeatFile(dir.path, { ...BEAT, state: "exited" });
  assert.equal(judgeRunner(dir.path, { queue: "q" }).state, "exited");
});

Deno.test("judgeRunner() takes no beat through a link or a FIFO, and judges a file it cannot parse by its change time alone", async () => {
  await using dir = await beatDir();
  const elsewhere = `${dir.path}.elsewhere`;
  writeHeartbeatFile(elsewhere, BEAT);
  await Deno.symlink(elsewhere, dir.path);
  const linked = judgeRunner(dir.path, { queue: "q" });
  assert.equal(linked.state, "none");
  assert.equal(linked.detail, "The runner of queue 'q' left no valid heartbeat");
  await Deno.remove(dir.path);
  // A FIFO with no writer would block an open without O_NONBLOCK forever.
  const mkfifo = await new Deno.Command("mkfifo", { args: [dir.path] }).output();
  assert.ok(mkfifo.success);
  assert.equal(judgeRunner(dir.path, { queue: "q" }).state, "none");
  await Deno.remove(dir.path);
  const padded = JSON.stringify({ ...BEAT, runnerId: "r".repeat(100) }).padEnd(
    HEARTBEAT_FILE_BYTES + 1,
  );
  // A half-written or forged beat never makes an honest runner look dead, nor a frozen one alive.
  for (const content of ["{", "[]", '{"state":"running"}', padded]) {
    await Deno.writeTextFile(dir.path, content);
    const now = judgeRunner(dir.path, { queue: "q" });
    assert.equal(now.state, "alive", content.slice(0, 20));
    assert.equal(now.beat, undefined, content.slice(0, 20));
    const later = judgeRunner(dir.path, { queue: "q", now: Date.now() + STALE_AFTER_MS + 1500 });
    assert.equal(later.state, "stale", content.slice(0, 20));
  }
});

Deno.test("writeHeartbeatFile() rewrites one inode at one size, and the change time still moves", async () => {
  await using dir = await beatDir();
  writeHeartbeatFile(dir.path, BEAT);
  const first = await Deno.stat(dir.path);
  await delay(1100);
  writeHeartbeatFile(dir.path, { ...BEAT, runnerId: "a-longer-runner-id", seq: 123456789 });
  const second = await Deno.stat(dir.path);
  assert.equal(second.ino, first.ino, "no new inode");
  assert.equal(second.size, first.size, "no new size");
  assert.ok(second.ctime!.getTime() > first.ctime!.getTime(), "the kernel moved the change time");
  assert.equal(judgeRunner(dir.path, { queue: "q" }).beat?.seq, 123456789);
});

Deno.test("judgeProgress() calls a beating runner dead when it leaves a request untaken, or started past its own limit, and never judges a started request without one", () => {
  const now = 1_000_000;
  const at = (ms: number): number => now - ms;
  const judge = (progress: Parameters<typeof judgeProgress>[0]) =>
    judgeProgress(progress, { queue: "q", now })?.state;
  assert.equal(
    judge({ id: "r", state: "queued", takeableSince: at(TAKE_WITHIN_MS - 1) }),
    undefined,
  );
  assert.equal(judge({ id: "r", state: "queued", takeableSince: at(TAKE_WITHIN_MS + 1) }), "stale");
  assert.match(
    judgeProgress({ id: "r", state: "queued", takeableSince: at(TAKE_WITHIN_MS + 1000) }, {
      queue: "q",
      now,
    })!.detail,
    /^The runner of queue 'q' beats but has not taken request 'r' in \d+ s$/,
  );
  // Taken (accepted, queued behind others) is progress.
  assert.equal(judge({ id: "r", state: "accepted", takeableSince: at(3_600_000) }), undefined);
  const started = { id: "r", state: "started" as const, takeableSince: at(3_600_000) };
  assert.equal(judge({ ...started, startedSeenAt: at(3_600_000) }), undefined, "no limit");
  assert.equal(
    judge({ ...started, startedSeenAt: at(60_000 + RESULT_GRACE_MS - 1), timeoutMs: 60_000 }),
    undefined,
  );
  assert.equal(
    judge({ ...started, startedSeenAt: at(60_000 + RESULT_GRACE_MS + 1), timeoutMs: 60_000 }),
    "stale",
  );
});

liveTest(
  "a compromised runner that forges a beat and freezes itself is dead to ps, sweep and the warm path; an honest idle sandbox is only idle",
  async (docker, t) => {
    await using home = await tempHome(docker, { idleSeconds: 0 });
    const honest = home.open(uniqueUser("honest"));
    const forger = home.open(uniqueUser("forger"));
    await runOk(honest, "true");
    await runOk(forger, "echo kept > /workspace/m");
    const honestId = containerOf(honest);
    const forgerId = containerOf(forger);

    await t.step(
      "as a command (uid 10001): it can neither write the beat nor signal the runner",
      async () => {
        const out = await asCommand(
          forgerId,
          "echo '{}' > /queue/outbound/heartbeat.json && echo wrote; " +
            "for p in $(ls /proc | grep -E '^[0-9]+$'); do " +
            // The bracket keeps this shell's own command line from matching.
            "grep -q 'runner --que[u]e' /proc/$p/cmdline 2>/dev/null && kill -STOP $p && echo stopped; done; true",
        );
        assert.doesNotMatch(out.stdout, /wrote|stopped/, out.stdout);
        assert.match(out.stderr, /Permission denied|Operation not permitted/, out.stderr);
        const before = forger.queue.liveness().beat?.seq ?? -1;
        await waitFor(() => (forger.queue.liveness().beat?.seq ?? -1) > before, {
          timeoutMs: 10_000,
          what: "the runner to beat on",
        });
        assert.equal(forger.queue.liveness().state, "alive");
      },
    );

    await t.step("as the runner (uid 0): forged beat a year ahead, then SIGSTOP", async () => {
      const attack = await asRunner(forgerId, FORGE_AND_FREEZE_SCRIPT);
      assert.equal(attack.code, 0, attack.stderr);
      assert.deepEqual(JSON.parse(attack.stdout.trim()), { frozen: 1 });
      await delay(STALE_AFTER_MS + 1500);

      // Fresh processes, which never saw the runner beat, judge it at once.
      const ps = await home.cli(["ps", "--json"]);
      assert.equal(ps.code, 0, ps.stderr);
      const rows = JSON.parse(ps.stdout).sandboxes as { containerId: string; runner: string }[];
      assert.equal(rows.find((row) => row.containerId === forgerId)?.runner, "stale", ps.stdout);
      assert.equal(rows.find((row) => row.containerId === honestId)?.runner, "alive", ps.stdout);

      const swept = await home.cli(["sweep", "--idle-seconds", "1", "--json"]);
      assert.equal(swept.code, 0, swept.stderr);
      const actions = JSON.parse(swept.stdout).actions as {
        containerId: string;
        action: string;
        reason: string;
      }[];
      const of = (id: string) => actions.find((action) => action.containerId === id);
      assert.equal(of(forgerId)?.action, "stopped", swept.stdout);
      assert.match(of(forgerId)!.reason, /^runner stale: /);
      assert.equal(of(honestId)?.action, "stopped", swept.stdout);
      assert.match(of(honestId)!.reason, /^idle for \d+ s$/);
      assert.equal((await docker.inspectContainer(forgerId))?.State.Running, false);

      // The user's next call: a fresh runner in the same container, workspace kept.
      const next = await home.cli(["exec", "--user", forger.key.user, "--", "cat", "/workspace/m"]);
      assert.equal(next.code, 0, next.stderr);
      assert.equal(next.stdout, "kept\n");
    });
  },
);

liveTest(
  "a frozen runner's forged beat never puts a call on the warm path: a fresh exec revives it, workspace kept",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 0 });
    const forger = home.open(uniqueUser("warmforger"));
    await runOk(forger, "echo kept > /workspace/m");
    const id = containerOf(forger);
    const bootBefore = forger.queue.liveness().beat?.bootId;
    const attack = await asRunner(id, FORGE_AND_FREEZE_SCRIPT);
    assert.equal(attack.code, 0, attack.stderr);
    await delay(STALE_AFTER_MS + 1500);
    const next = await home.cli(["exec", "--user", forger.key.user, "--", "cat", "/workspace/m"]);
    assert.equal(next.code, 0, next.stderr);
    assert.equal(next.stdout, "kept\n");
    const after = forger.queue.liveness();
    assert.equal(after.state, "alive");
    assert.notEqual(after.beat?.bootId, bootBefore, "a new runner serves");
    assert.notEqual(after.beat?.bootId, "forged");
  },
);
