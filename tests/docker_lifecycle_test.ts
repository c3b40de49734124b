/**
 * The sandbox lifecycle, live: reuse and isolation, concurrent first calls,
 * per-user serialisation, recycling on an image change, restart after stop
 * or idle exit, sweep from a fresh process, host death mid-command, process
 * tree cleanup, and the fleet CLI (ps, stop, rm, doctor).
 *
 * Assertions are about behaviour (which container, what ran, in which
 * order), never about durations. Every test uses its own WAFFLE_HOME and
 * removes its containers in `finally` (via `await using`), and uses user ids
 * unique to the run, so concurrent runs on the same daemon do not meet.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { selfCommand } from "../lib/config/self.ts";
import { stopSandbox, sweep } from "../lib/lifecycle/fleet.ts";
import { removeSandbox } from "../lib/sandbox/remove.ts";
import { STALE_AFTER_MS } from "../lib/queue/liveness.ts";
import { statePaths } from "../lib/lifecycle/identity.ts";
import { sandboxKey } from "../lib/config/sandbox_key.ts";
import { containerSpec, LABELS } from "../lib/lifecycle/posture.ts";
import { resolveImage } from "../lib/lifecycle/ensure.ts";
import { removeVolume } from "../lib/lifecycle/quota.ts";
import { prepareState } from "../lib/lifecycle/state_dir.ts";
import { liveTest } from "./_docker_gate.ts";
import { delay, text, waitFor } from "./_helpers.ts";
import { recordDockerEvents, volumesMountedInto } from "./_docker_events.ts";
import type { DockerClient } from "../lib/docker/mod.ts";
import { EXIT_WAFFLE } from "../lib/exit_codes.ts";
import { SandboxPausedError } from "../lib/errors.ts";
import {
  dockerCli,
  homeContainers,
  removeHomeContainers,
  run,
  runOk,
  tempHome,
  TEST_IMAGE,
  underHome,
  uniqueUser,
  waitIdle,
} from "./_sandbox_helpers.ts";
import { onPath } from "../lib/fs.ts";

const START_TIMEOUT_MS = 60_000;

function lines(text: string): string[] {
  return text.split("\n").filter((line) => line !== "");
}

async function readLog(path: string): Promise<string[]> {
  return lines(await Deno.readTextFile(path).catch(() => ""));
}

// ---------------------------------------------------------------------------

const canDropPrivileges = Deno.uid() === 0 &&
  ["/usr/bin/setpriv", "/bin/setpriv"].some((path) => {
    try {
      return Deno.statSync(path).isFile;
    } catch {
      return false;
    }
  });

// Like the live tests: with WAFFLE_REQUIRE_DOCKER=1 it runs or fails, never ignored.
const mustRun = Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1";
const privilegesReason = "needs root and setpriv to drop privileges";

Deno.test({
  name: "stateExists: a state dir this user cannot look into is not mistaken for a gone one" +
    (canDropPrivileges || mustRun ? "" : ` [ignored: ${privilegesReason}]`),
  ignore: !canDropPrivileges && !mustRun,
  fn: async () => {
    if (!canDropPrivileges) {
      throw new Error(`Cannot run (WAFFLE_REQUIRE_DOCKER=1): ${privilegesReason}`);
    }
    // Sweep removes a container whose state is "gone": another local user's
    // home must not look gone just because it is unreadable.
    const root = await Deno.makeTempDir({ prefix: "waffle-perm-" });
    try {
      await Deno.chmod(root, 0o777);
      await Deno.mkdir(join(root, "private", "state"), { recursive: true });
      await Deno.chmod(join(root, "private"), 0o700);
      const script = join(root, "probe.ts");
      const module = new URL("../lib/lifecycle/state_dir.ts", import.meta.url).href;
      const probe = [join(root, "private", "state"), join(root, "missing")].map((path) =>
        `stateExists(${JSON.stringify(path)})`
      );
      await Deno.writeTextFile(
        script,
        `import { stateExists } from "${module}";\nconsole.log(JSON.stringify([${
          probe.join(", ")
        }]));\n`,
      );
      await Deno.chmod(script, 0o644);
      const out = await new Deno.Command("setpriv", {
        args: [
          "--reuid=65534",
          "--regid=65534",
          "--clear-groups",
          Deno.execPath(),
          "run",
          "-A",
          "--cached-only",
          "--node-modules-dir=manual",
          "--config",
          new URL("../deno.json", import.meta.url).pathname,
          script,
        ],
        env: { DENO_DIR: join(root, "deno-dir"), HOME: root, DENO_NO_UPDATE_CHECK: "1" },
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
      assert.deepEqual(JSON.parse(new TextDecoder().decode(out.stdout)), [true, false]);
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

liveTest(
  "reuse and isolation: one container per (tenant, user), state shared within it only",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 120 });
    const user = uniqueUser("reuse");
    const mine = home.open(user, { tenant: "t1" });
    const host1 =
      (await runOk(mine, "hostname; echo ws > /workspace/marker; echo tmp > /tmp/marker")).trim();
    const first = mine.lastEnsure!;
    assert.equal(first.action, "created");

    const host2 = (await runOk(mine, "hostname")).trim();
    // What the first call verified still holds: no container inspect.
    assert.equal(mine.lastEnsure!.action, "warm");
    assert.equal(mine.lastEnsure!.containerId, first.containerId);
    assert.equal(host2, host1);
    assert.equal(await runOk(mine, "cat /workspace/marker /tmp/marker"), "ws\ntmp\n");

    // A second handle (its own Queue) for the same user lands in the same container.
    const again = home.open(user, { tenant: "t1" });
    assert.equal(await runOk(again, "hostname; cat /tmp/marker"), `${host1}\ntmp\n`);
    assert.equal(again.lastEnsure!.containerId, first.containerId);
    assert.equal(again.lastEnsure!.action, "warm");

    for (
      const [what, other] of [
        ["another user", home.open(uniqueUser("other"), { tenant: "t1" })],
        ["the same user id in another tenant", home.open(user, { tenant: "t2" })],
      ] as const
    ) {
      const ran = await run(other, "hostname; cat /workspace/marker; cat /tmp/marker");
      assert.notEqual(ran.result.exitCode, 0, what);
      assert.equal(lines(ran.stdout).length, 1, `${what} sees no marker: ${ran.stdout}`);
      assert.notEqual(ran.stdout.trim(), host1, what);
      assert.equal(
        (ran.stderr.match(/No such file or directory/g) ?? []).length,
        2,
        `${what}: ${ran.stderr}`,
      );
      assert.notEqual(other.lastEnsure!.containerId, first.containerId, what);
      assert.notEqual(other.paths.root, mine.paths.root, what);
    }
    assert.equal((await home.containers()).length, 3);
  },
);

liveTest(
  "five concurrent first calls from separate processes make exactly one container",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 120 });
    const user = uniqueUser("race");
    const outs = await Promise.all(
      Array.from({ length: 5 }, () => home.cli(["exec", "--user", user, "--", "hostname"])),
    );
    for (const out of outs) assert.equal(out.code, 0, out.stderr);
    const hostnames = new Set(outs.map((out) => out.stdout.trim()));
    assert.equal(hostnames.size, 1, [...hostnames].join(", "));
    const key = sandboxKey("default", user, { home: home.home });
    const labelled = await docker.listContainers({
      all: true,
      labels: [`${LABELS.key}=${key.hash}`],
    });
    assert.equal(labelled.length, 1, labelled.map((c) => c.Names.join()).join("; "));
    assert.ok(underHome(labelled[0]!, home.home));
    assert.equal(labelled[0]!.State, "running");
    assert.equal([...hostnames][0], key.containerName.slice(0, 63));
  },
);

liveTest("a blocked user does not delay another user", async (docker) => {
  await using home = await tempHome(docker, { idleSeconds: 120 });
  const busy = home.open(uniqueUser("busy"));
  const free = home.open(uniqueUser("free"));
  const slow = await busy.submit({ shell: "sleep 30" });
  await waitFor(() => busy.queue.state(slow).state === "started", { timeoutMs: START_TIMEOUT_MS });
  const quick = await run(free, "echo hi");
  assert.equal(quick.stdout, "hi\n");
  assert.equal(quick.result.exitCode, 0);
  // B's answer arrived while A's command is still running.
  assert.equal(busy.queue.state(slow).state, "started");
  await busy.queue.cancel(slow);
  assert.equal((await busy.queue.wait(slow)).cancelled, true);
});

liveTest("same-user requests serialize across queue handles", async (docker) => {
  await using home = await tempHome(docker, { idleSeconds: 120 });
  const user = uniqueUser("serial");
  const one = home.open(user);
  const two = home.open(user);
  const step = (n: number): string =>
    `echo start${n} >> /workspace/log; sleep 1; echo end${n} >> /workspace/log`;
  const first = await one.submit({ shell: step(1) });
  await waitFor(() => one.queue.state(first).state === "started", { timeoutMs: START_TIMEOUT_MS });
  const second = await two.submit({ shell: step(2) });
  const [r1, r2] = await Promise.all([one.queue.wait(first), two.queue.wait(second)]);
  assert.equal(r1.exitCode, 0);
  assert.equal(r2.exitCode, 0);
  assert.deepEqual(await readLog(join(one.paths.workspace, "log")), [
    "start1",
    "end1",
    "start2",
    "end2",
  ]);
  assert.ok(r2.startedAt! >= r1.endedAt, "the second started after the first ended");
  assert.equal(one.lastEnsure!.containerId, two.lastEnsure!.containerId);
});

liveTest("same tag retargeted to another image: the container is recycled", async (docker) => {
  const suffix = crypto.randomUUID().slice(0, 8);
  const tag = `waffle-test-retarget-${suffix}:1`;
  const tagged = await dockerCli(["tag", TEST_IMAGE, tag]);
  assert.equal(tagged.code, 0, tagged.stderr);
  await using home = await tempHome(docker, { idleSeconds: 120, image: tag });
  try {
    const sandbox = home.open(uniqueUser("retarget"));
    await runOk(sandbox, "echo kept > /workspace/keep");
    const before = sandbox.lastEnsure!;
    assert.equal(before.action, "created");
    assert.equal(before.imageId, (await docker.inspectImage(TEST_IMAGE))!.id);

    const built = await dockerCli(
      ["build", "-q", "-t", tag, "-"],
      `FROM ${TEST_IMAGE}\nLABEL waffle.test.retarget=${suffix}\n`,
    );
    assert.equal(built.code, 0, built.stderr);
    const newId = (await docker.inspectImage(tag))!.id;
    assert.notEqual(newId, before.imageId);

    assert.equal(await runOk(sandbox, "cat /workspace/keep"), "kept\n");
    const after = sandbox.lastEnsure!;
    assert.equal(after.action, "recreated");
    assert.notEqual(after.containerId, before.containerId);
    assert.equal(after.imageId, newId);
    const container = (await docker.inspectContainer(after.containerId))!;
    assert.equal(container.Image, newId);
    assert.equal(container.Config.Labels[LABELS.image], newId);
    assert.equal(await docker.inspectContainer(before.containerId), null);
    assert.equal((await home.containers()).length, 1);
  } finally {
    await removeHomeContainers(docker, home.home);
    await dockerCli(["image", "rm", tag]);
  }
});

liveTest(
  "the warm path holds only while its facts do: a kill, a new posture, a pause and a lost record each end it",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 120 });
    const user = uniqueUser("warm");
    const sandbox = home.open(user);
    await sandbox.ensure();
    assert.equal(sandbox.lastEnsure!.action, "created");
    await sandbox.ensure();
    assert.equal(sandbox.lastEnsure!.action, "warm");
    const id = sandbox.lastEnsure!.containerId;
    const record = join(sandbox.paths.root, "warm.json");
    assert.equal(JSON.parse(await Deno.readTextFile(record)).containerId, id);

    // Killed outright (no "exited" beat): the init process is gone, so the
    // next ensure inspects and starts it at once rather than trusting the beat.
    await docker.killContainer(id);
    await docker.waitContainer(id, { timeoutMs: 30_000 });
    await sandbox.ensure();
    assert.equal(sandbox.lastEnsure!.action, "started");
    assert.equal(sandbox.lastEnsure!.containerId, id);
    await sandbox.ensure();
    assert.equal(sandbox.lastEnsure!.action, "warm");

    // A config change is a new posture: recycled, never warm.
    const changed = home.open(user, { config: { pidsLimit: 300 } });
    await changed.ensure();
    assert.equal(changed.lastEnsure!.action, "recreated");
    const recreated = changed.lastEnsure!.containerId;
    assert.equal((await docker.inspectContainer(recreated))!.HostConfig.PidsLimit, 300);

    // Paused (by hand, with no pause record): its runner stops beating, so
    // the record stops holding once the beat is stale (the inode change time
    // is read in whole seconds); the full ensure refuses the paused container
    // rather than replacing it, and it serves again once thawed.
    await docker.pauseContainer(recreated);
    await delay(STALE_AFTER_MS + 1500);
    await assert.rejects(changed.ensure(), SandboxPausedError);
    assert.equal((await docker.inspectContainer(recreated))!.State.Paused, true);
    await docker.unpauseContainer(recreated);
    await waitFor(() => changed.queue.liveness().state === "alive", { what: "a beat" });

    // A record that is not valid JSON is no record: the full ensure runs and rewrites it.
    await Deno.writeTextFile(record, "{not json");
    assert.equal(await runOk(changed, "echo ok"), "ok\n");
    assert.equal(changed.lastEnsure!.action, "reused");
    assert.equal(await runOk(changed, "echo ok"), "ok\n");
    assert.equal(changed.lastEnsure!.action, "warm");
  },
);

liveTest(
  "a host in another pid namespace than dockerd cannot see the init process: never warm, every call works",
  async (docker) => {
    // A harness in a container of its own, or rootless Docker: the pid Docker
    // reports means nothing here, so no record is kept and each call inspects.
    if (Deno.uid() !== 0 || !onPath("unshare")) {
      assert.ok(!mustRun, "needs root and util-linux unshare");
      return;
    }
    await using home = await tempHome(docker, { idleSeconds: 120 });
    const user = uniqueUser("pidns");
    // Made from this namespace: the volume's loop mount must be one dockerd sees.
    const sandbox = home.open(user);
    await sandbox.ensure();
    assert.ok((await Deno.stat(join(sandbox.paths.root, "warm.json"))).isFile);
    const self = selfCommand();
    for (let i = 0; i < 3; i++) {
      const out = await new Deno.Command("unshare", {
        args: [
          "--pid",
          "--fork",
          "--mount-proc",
          self.executable,
          ...self.prefix,
          "exec",
          "--user",
          user,
          "--",
          "echo",
          `call ${i}`,
        ],
        env: { WAFFLE_HOME: home.home },
        stdin: "null",
      }).output();
      const err = new TextDecoder().decode(out.stderr);
      assert.equal(out.code, 0, `call ${i}: ${err}`);
      assert.equal(new TextDecoder().decode(out.stdout), `call ${i}\n`);
    }
    assert.equal(
      await Deno.stat(join(sandbox.paths.root, "warm.json")).catch(() => undefined),
      undefined,
      "no warm record where the init process cannot be seen",
    );
  },
);

liveTest("a stopped container is started again: same container id", async (docker) => {
  await using home = await tempHome(docker, { idleSeconds: 120 });
  const sandbox = home.open(uniqueUser("stop"));
  await runOk(sandbox, "echo ws > /workspace/m; echo tmp > /tmp/m");
  const id = sandbox.lastEnsure!.containerId;
  assert.equal(await docker.stopContainer(id, { timeoutSeconds: 10 }), true);
  assert.equal((await docker.inspectContainer(id))!.State.Running, false);

  const ran = await run(sandbox, "cat /workspace/m; cat /tmp/m");
  assert.equal(sandbox.lastEnsure!.action, "started");
  assert.equal(sandbox.lastEnsure!.containerId, id);
  assert.equal(ran.stdout, "ws\n", "the workspace persists, /tmp is a fresh tmpfs per start");
  assert.equal((await docker.inspectContainer(id))!.State.Running, true);
});

liveTest(
  "a paused container is kept by sweep, even once its beat is stale; thawed, the same one serves",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 120 });
    const sandbox = home.open(uniqueUser("pause"));
    await runOk(sandbox, "echo ws > /workspace/m");
    const id = sandbox.lastEnsure!.containerId;
    await docker.pauseContainer(id);
    await waitFor(() => sandbox.queue.liveness().state === "stale", {
      timeoutMs: STALE_AFTER_MS + 10_000,
      what: "a stale beat",
    });

    const actions = await sweep(docker, { config: sandbox.config });
    const mine = actions.filter((action) => action.containerId === id);
    assert.deepEqual(mine.map(({ action, reason }) => ({ action, reason })), [{
      action: "kept",
      reason: "paused",
    }]);
    assert.equal((await docker.inspectContainer(id))!.State.Paused, true);

    await docker.unpauseContainer(id);
    await waitFor(() => sandbox.queue.liveness().state === "alive", { what: "a beat" });
    assert.equal(await runOk(sandbox, "cat /workspace/m"), "ws\n");
    assert.equal(sandbox.lastEnsure!.containerId, id);
  },
);

liveTest(
  "host SIGKILLed mid-command: the next request runs after it, never overlapping",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 120 });
    const user = uniqueUser("sigkill");
    const log = join(
      statePaths(home.home, sandboxKey("default", user, { home: home.home })).workspace,
      "log",
    );
    const self = selfCommand();
    const child = new Deno.Command(self.executable, {
      args: [
        ...self.prefix,
        "exec",
        "--user",
        user,
        "--",
        "sh",
        "-c",
        "echo start >> /workspace/log; sleep 2; echo end >> /workspace/log",
      ],
      env: { WAFFLE_HOME: home.home },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    let exited: Deno.CommandStatus | undefined;
    const output = child.output().then((out) => {
      exited = out;
      return new TextDecoder().decode(out.stderr);
    });
    try {
      await waitFor(async () => exited !== undefined || (await readLog(log)).includes("start"), {
        timeoutMs: START_TIMEOUT_MS,
        what: "'start' in the log",
      });
      // The host is to be killed mid-command: one that ended first says why.
      assert.equal(exited, undefined, `the first exec ended first: ${await output}`);
    } finally {
      if (exited === undefined) child.kill("SIGKILL");
      await output;
    }
    const second = await home.cli([
      "exec",
      "--user",
      user,
      "--",
      "sh",
      "-c",
      "echo second >> /workspace/log",
    ]);
    assert.equal(second.code, 0, second.stderr);
    assert.deepEqual(await readLog(log), ["start", "end", "second"]);
  },
);

liveTest(
  "idle exit stops the container by itself; the next call restarts it; 0 means never",
  async (docker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("idle"), { config: { idleSeconds: 1 } });
    await runOk(sandbox, "true");
    const id = sandbox.lastEnsure!.containerId;
    assert.equal(await docker.waitContainer(id, { timeoutMs: 60_000 }), 0);
    const stopped = (await docker.inspectContainer(id))!;
    assert.equal(stopped.State.Running, false);
    assert.equal(stopped.State.ExitCode, 0);
    assert.equal(sandbox.queue.heartbeat()?.state, "exited");

    assert.equal(await runOk(sandbox, "echo back"), "back\n");
    assert.equal(sandbox.lastEnsure!.action, "started");
    assert.equal(sandbox.lastEnsure!.containerId, id);

    const never = home.open(uniqueUser("never"), { config: { idleSeconds: 0 } });
    await runOk(never, "true");
    const neverId = never.lastEnsure!.containerId;
    await delay(3500);
    assert.equal((await docker.inspectContainer(neverId))!.State.Running, true);
    assert.equal(never.queue.heartbeat()?.state, "running");
    assert.equal(await runOk(never, "echo still"), "still\n");
    assert.equal(never.lastEnsure!.action, "warm");
  },
);

liveTest(
  "a fresh process's sweep stops an idle container and removes one whose state is gone",
  async (docker) => {
    // waffle.toml, so the CLI child computes the same posture (idleSeconds is part of it).
    await using home = await tempHome(docker, { idleSeconds: 0 });
    const idle = home.open(uniqueUser("swept"));
    await runOk(idle, "true");
    const idleId = idle.lastEnsure!.containerId;
    const orphan = home.open(uniqueUser("orphan"));
    await runOk(orphan, "true");
    const orphanId = orphan.lastEnsure!.containerId;
    // An operator deleting the state: the quota volume first (it is mounted).
    await removeVolume(orphan.paths.root);
    await Deno.remove(orphan.paths.root, { recursive: true });
    // Idle for more than a second, by the host's own record of use.
    await waitIdle(docker, idle, { ms: 1500 });

    const out = await home.cli(["sweep", "--idle-seconds", "1", "--json"]);
    assert.equal(out.code, 0, out.stderr);
    const actions = JSON.parse(out.stdout).actions as {
      containerId: string;
      action: string;
      reason: string;
    }[];
    const of = (id: string): { action: string; reason: string }[] =>
      actions.filter((a) => a.containerId === id).map(({ action, reason }) => ({ action, reason }));
    assert.equal(of(idleId).length, 1, out.stdout);
    assert.equal(of(idleId)[0]!.action, "stopped");
    assert.match(of(idleId)[0]!.reason, /^idle for/);
    assert.deepEqual(of(orphanId), [{ action: "removed", reason: "state directory is gone" }]);
    assert.equal((await docker.inspectContainer(idleId))!.State.Running, false);
    assert.equal(await docker.inspectContainer(orphanId), null);

    // The stopped one is adopted again, not replaced.
    assert.equal(await runOk(idle, "echo back"), "back\n");
    assert.equal(idle.lastEnsure!.action, "started");
    assert.equal(idle.lastEnsure!.containerId, idleId);
  },
);

liveTest(
  "sweep: the running cap stops the least recently used; a busy container is kept",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 0 });
    const older = home.open(uniqueUser("lru-old"));
    await runOk(older, "true");
    const newer = home.open(uniqueUser("lru-new"));
    await runOk(newer, "true");
    const busy = home.open(uniqueUser("lru-busy"));
    const slow = await busy.submit({ shell: "sleep 30" });
    await waitFor(() => busy.queue.state(slow).state === "started", {
      timeoutMs: START_TIMEOUT_MS,
    });
    const ids = [older, newer, busy].map((sandbox) => sandbox.lastEnsure!.containerId);

    const actions = await sweep(docker, { config: older.config, idleSeconds: 0, maxRunning: 1 });
    const mine = new Map(
      actions.filter((a) => ids.includes(a.containerId)).map((a) => [a.containerId, a]),
    );
    assert.equal(mine.get(ids[0]!)?.action, "stopped", JSON.stringify(actions));
    assert.match(mine.get(ids[0]!)!.reason, /over the cap of 1 running/);
    assert.equal(mine.get(ids[2]!)?.action, "kept");
    assert.equal(mine.get(ids[2]!)?.reason, "request in flight");
    const running = await Promise.all(
      ids.map(async (id) => (await docker.inspectContainer(id))!.State.Running),
    );
    assert.deepEqual(running, [false, true, true]);
    assert.equal(busy.queue.state(slow).state, "started");
    await busy.queue.cancel(slow);
    assert.equal((await busy.queue.wait(slow)).cancelled, true);
  },
);

liveTest("waffle ps --json, stop and rm --purge", async (docker) => {
  await using home = await tempHome(docker, { idleSeconds: 120 });
  const user = uniqueUser("fleet");
  const tenant = "acme";
  const sandbox = home.open(user, { tenant });
  await runOk(sandbox, "true");
  const { containerId, imageId } = sandbox.lastEnsure!;

  const ps = await home.cli(["ps", "--json"]);
  assert.equal(ps.code, 0, ps.stderr);
  const rows = (JSON.parse(ps.stdout).sandboxes as Record<string, unknown>[]).filter((row) =>
    row.containerId === containerId
  );
  assert.equal(rows.length, 1, ps.stdout);
  const row = rows[0]!;
  assert.equal(row.tenant, tenant);
  assert.equal(row.user, user);
  assert.equal(row.state, "running");
  assert.equal(row.imageId, imageId);
  assert.equal(row.name, sandbox.key.containerName);
  assert.equal(row.statePath, sandbox.paths.root);
  assert.equal(typeof row.lastHeartbeat, "number");
  assert.ok((row.lastHeartbeat as number) <= Date.now());
  assert.equal(typeof row.idleMs, "number");
  assert.ok((row.idleMs as number) >= 0);
  assert.equal(row.runner, "alive");
  assert.equal(row.openRequests, 0);
  assert.equal(row.problem, undefined);
  const table = await home.cli(["ps"]);
  assert.equal(table.code, 0);
  assert.match(
    table.stdout,
    /^TENANT\s+USER\s+CONTAINER\s+STATE\s+IMAGE\s+RUNNER\s+HEARTBEAT\s+OPEN\s+IDLE\s+SNAPS(\s+PROBLEM)?\n/,
  );
  assert.match(
    table.stdout,
    new RegExp(`acme\\s+${user}\\s+${containerId.slice(0, 12)}\\s+running\\s+\\S+\\s+alive\\s`),
  );

  const stop = await home.cli(["stop", "--user", user, "--tenant", tenant]);
  assert.equal(stop.code, 0, stop.stderr);
  assert.equal(stop.stdout, `stopped ${sandbox.key.containerName}\n`);
  assert.equal((await docker.inspectContainer(containerId))!.State.Running, false);
  const again = await home.cli(["stop", "--user", user, "--tenant", tenant]);
  assert.equal(again.stdout, `already stopped ${sandbox.key.containerName}\n`);

  const rm = await home.cli(["rm", "--user", user, "--tenant", tenant, "--purge"]);
  assert.equal(rm.code, 0, rm.stderr);
  assert.equal(rm.stdout, `removed ${sandbox.key.containerName} (state purged)\n`);
  assert.equal(await docker.inspectContainer(containerId), null);
  await assert.rejects(() => Deno.stat(sandbox.paths.root), Deno.errors.NotFound);
  const rmAgain = await home.cli(["rm", "--user", user, "--tenant", tenant]);
  assert.equal(rmAgain.stdout, `no container ${sandbox.key.containerName}\n`);
  const unknown = await home.cli(["stop", "--user", uniqueUser("nobody")]);
  assert.equal(unknown.code, 125);
  assert.match(unknown.stderr, /^waffle: No sandbox for user/);
  // In a home that never held a sandbox: still one line, no internal error.
  await using empty = await tempHome(docker);
  const stopEmpty = await empty.cli(["stop", "--user", user, "--tenant", tenant]);
  assert.equal(stopEmpty.code, 125, stopEmpty.stderr);
  assert.equal(stopEmpty.stderr, `waffle: No sandbox for user '${user}' of tenant '${tenant}'\n`);
  const rmEmpty = await empty.cli(["rm", "--user", user, "--tenant", tenant, "--purge"]);
  assert.equal(rmEmpty.code, 0, rmEmpty.stderr);
  const emptyName = sandboxKey(tenant, user, { home: empty.home }).containerName;
  assert.equal(rmEmpty.stdout, `no container ${emptyName} (state purged)\n`);
});

/** An image built offline from the local musl image, removed with its tag afterwards. */
interface TestImage {
  tag: string;
  [Symbol.asyncDispose](): Promise<void>;
}

// The musl image with `volume` made world-writable (so a command can fill
// it) and declared a VOLUME.
async function volumeImage(volume: string): Promise<TestImage> {
  const tag = `waffle-test-volume-${crypto.randomUUID().slice(0, 8)}:1`;
  const make = `mkdir -p ${volume} && chmod 1777 ${volume}`;
  const built = await dockerCli(
    ["build", "-q", "-t", tag, "-"],
    `FROM waffle-musl:latest\nRUN ["/bin/busybox", "sh", "-c", ${JSON.stringify(make)}]\n` +
      `VOLUME ${JSON.stringify([volume])}\n`,
  );
  assert.equal(built.code, 0, built.stderr);
  return {
    tag,
    [Symbol.asyncDispose]: async () => void await dockerCli(["image", "rm", "-f", tag]),
  };
}

// Each anonymous volume of the home's containers, with what is in it.
async function anonymousVolumes(docker: DockerClient, home: string): Promise<string[]> {
  const lines: string[] = [];
  for (const summary of await homeContainers(docker, home)) {
    for (const mount of (await docker.inspectContainer(summary.Id))?.Mounts ?? []) {
      if (mount.Type !== "volume") continue;
      const du = await new Deno.Command("du", { args: ["-sb", mount.Source], stdout: "piped" })
        .output();
      lines.push(`volume at ${mount.Destination}: ${text(du.stdout).split("\t")[0]} bytes`);
    }
  }
  return lines;
}

liveTest(
  "exec: an image whose VOLUME no capped tmpfs can cover (/etc, /workspace/x) is refused in one line, no container or volume made",
  async (docker) => {
    const cases: [string, string][] = [
      ["/etc", "a system directory"],
      ["/workspace/x", "under waffle's own mount '/workspace'"],
    ];
    for (const [volume, reason] of cases) {
      await using image = await volumeImage(volume);
      await using home = await tempHome(docker, { idleSeconds: 120, image: image.tag });
      const user = uniqueUser("uncoverable");
      const events = recordDockerEvents();
      // The attack: 8 MiB into the VOLUME, beyond any tmpfs's reach.
      const fill = `dd if=/dev/zero of=${volume}/big bs=1048576 count=8 2>/dev/null && echo wrote`;
      const exec = await home.cli(["exec", "--user", user, "--", "sh", "-c", fill]);
      const record = await events.stop();
      const written = await anonymousVolumes(docker, home.home);
      const created = record.filter((event) =>
        event.Type === "container" && event.Action === "create" &&
        underHome({ Labels: event.Actor.Attributes }, home.home)
      );
      const seen = `exit ${exec.code}, stdout '${exec.stdout}', stderr '${exec.stderr}'; ${
        written.join("; ") || "no anonymous volume"
      }`;
      assert.equal(exec.code, EXIT_WAFFLE, seen);
      assert.equal(
        exec.stderr,
        `waffle: Image '${image.tag}' declares VOLUME '${volume}', which waffle cannot cover ` +
          `with a capped tmpfs (${reason}): rebuild the image without it\n`,
      );
      assert.equal(exec.stdout, "");
      assert.deepEqual(created.map((event) => event.Actor.Attributes.name), [], seen);
      assert.deepEqual(
        volumesMountedInto(record, (labels) => underHome({ Labels: labels }, home.home)),
        [],
      );
      assert.deepEqual(await home.containers(), []);
    }
  },
);

liveTest(
  "rm and sweep: a container an older waffle made of an image now refused (VOLUME /etc) goes with its anonymous volume",
  async (docker) => {
    await using image = await volumeImage("/etc");
    await using home = await tempHome(docker, { idleSeconds: 120, image: image.tag });
    const facts = (await docker.inspectImage(image.tag))!;
    // A sandbox's state, and its container as a waffle that covered no /etc
    // made it: Docker gives the image's /etc an anonymous volume.
    const olderSandbox = async (user: string): Promise<{ id: string; volume: string }> => {
      const sandbox = home.open(user);
      await prepareState(sandbox.paths, { quotaBytes: sandbox.config.quotaBytes });
      const spec = containerSpec(sandbox.key, {
        config: sandbox.config,
        image: { ...facts, volumes: [] },
        paths: sandbox.paths,
      });
      const id = await docker.createContainer(spec.name, spec.body);
      const mounts = (await docker.inspectContainer(id))?.Mounts ?? [];
      const volumes = mounts.filter((m) => m.Type === "volume" && m.Destination === "/etc");
      assert.equal(volumes.length, 1, JSON.stringify(mounts));
      return { id, volume: volumes[0]!.Source.split("/").at(-2) ?? "?" };
    };
    const removed = uniqueUser("etc-rm");
    const swept = uniqueUser("etc-sweep");
    const made = [await olderSandbox(removed), await olderSandbox(swept)];
    try {
      const rm = await home.cli(["rm", "--user", removed]);
      assert.equal(rm.code, 0, rm.stderr);
      const sweep = await home.cli(["sweep", "--json"]);
      assert.equal(sweep.code, 0, sweep.stderr);
      const actions = JSON.parse(sweep.stdout).actions as {
        user: string;
        action: string;
        reason: string;
      }[];
      assert.deepEqual(
        actions.filter((a) => a.user === swept).map((a) => `${a.action}: ${a.reason}`),
        ["removed: image refused: VOLUME '/etc' is a system directory"],
        sweep.stdout,
      );
      for (const { id, volume } of made) {
        assert.equal(await docker.inspectContainer(id), null);
        assert.equal(await docker.inspectVolume(volume), null, `volume ${volume} was left`);
      }
    } finally {
      for (const { volume } of made) await docker.removeVolume(volume).catch(() => false);
    }
  },
);

liveTest(
  "setsid and double-forked descendants die with their request; the container stays usable",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 120 });
    const sandbox = home.open(uniqueUser("tree"));
    const bg = await run(sandbox, "setsid sleep 1000 & (setsid sh -c 'sleep 1001 &' &); echo $!");
    assert.equal(bg.result.exitCode, 0);
    assert.match(bg.stdout, /^\d+\n$/);
    const id = sandbox.lastEnsure!.containerId;
    const after = await runOk(sandbox, "ps -o pid,args");
    assert.doesNotMatch(after, /sleep 100[01]/);
    assert.doesNotMatch(after, new RegExp(`^\\s*${bg.stdout.trim()}\\s`, "m"));

    const timed = await run(sandbox, { shell: "setsid sleep 1002 & sleep 1003", timeoutMs: 500 });
    assert.equal(timed.result.timedOut, true);
    assert.doesNotMatch(await runOk(sandbox, "ps -o args"), /sleep 100[23]/);

    const own = await run(sandbox, "exit 124");
    assert.equal(own.result.exitCode, 124);
    assert.equal(own.result.timedOut, false);

    assert.equal(await runOk(sandbox, "echo still here"), "still here\n");
    assert.equal(sandbox.lastEnsure!.containerId, id);
    assert.equal(sandbox.lastEnsure!.action, "warm");
  },
);

liveTest(
  "CLI: exec --json exits with the command's status; doctor --json rows are ok",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 120 });
    const user = uniqueUser("cli");
    const out = await home.cli([
      "exec",
      "--user",
      user,
      "--json",
      "--",
      "sh",
      "-c",
      "echo out; echo err >&2; exit 3",
    ]);
    assert.equal(out.code, 3, out.stderr);
    const json = JSON.parse(out.stdout);
    assert.equal(json.exitCode, 3);
    assert.equal(json.stdout, "out\n");
    assert.equal(json.stderr, "err\n");
    assert.equal(json.timedOut, false);
    assert.equal((await home.containers()).length, 1);

    const doctor = await home.cli(["doctor", "--json"]);
    const report = JSON.parse(doctor.stdout) as {
      ok: boolean;
      checks: { name: string; ok: boolean; detail: string }[];
    };
    for (const name of ["docker daemon", "runner image", "sandbox start + bind mount"]) {
      const row = report.checks.find((check) => check.name === name);
      assert.ok(row, `doctor row '${name}': ${doctor.stdout}`);
      assert.equal(row.ok, true, `${name}: ${row.detail}`);
    }
    assert.equal(report.ok, true, doctor.stdout);
    assert.equal(doctor.code, 0);
  },
);

liveTest(
  "the same (tenant, user) under another WAFFLE_HOME never takes over this home's container",
  async (docker) => {
    await using homeA = await tempHome(docker, { idleSeconds: 120 });
    await using homeB = await tempHome(docker, { idleSeconds: 120 });
    const user = uniqueUser("twohomes");
    const a = homeA.open(user);
    const b = homeB.open(user);
    const running = await a.submit({ shell: "sleep 2; echo a-done" });
    await waitFor(() => a.queue.state(running).state === "started", {
      timeoutMs: START_TIMEOUT_MS,
    });
    const idA = a.lastEnsure!.containerId;

    // Each home has its own container: B's ensure, stop and rm never touch A's.
    assert.notEqual(b.key.containerName, a.key.containerName);
    assert.equal(await runOk(b, "echo b"), "b\n");
    assert.notEqual(b.lastEnsure!.containerId, idA);
    assert.equal(await stopSandbox(docker, b.key, { config: b.config }), true);
    assert.equal(await removeSandbox(docker, b.key, { config: b.config }), true);
    const result = await a.queue.collect(running);
    assert.equal(new TextDecoder().decode(result.stdout), "a-done\n");
    assert.equal(result.result.exitCode, 0);
    assert.equal((await docker.inspectContainer(idA))!.State.Running, true);
    assert.equal(await runOk(a, "echo a"), "a\n");
    assert.equal(a.lastEnsure!.containerId, idA);
    assert.equal(await runOk(b, "echo b again"), "b again\n");
    const owner =
      (await docker.inspectContainer(b.lastEnsure!.containerId))!.Config.Labels[LABELS.state];
    assert.equal(owner, b.paths.root);
  },
);

liveTest(
  "adoption compares the inspected config, not only the posture label",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 120 });
    const sandbox = home.open(uniqueUser("drift"));
    await sandbox.ensure();
    const first = sandbox.lastEnsure!.containerId;
    // A container under the sandbox's name carrying today's labels (posture
    // hash included) but a looser config, as a copied label would.
    const image = await resolveImage(docker, sandbox.config.image);
    const spec = containerSpec(sandbox.key, {
      config: sandbox.config,
      image,
      paths: sandbox.paths,
    });
    await docker.removeContainer(first, { force: true });
    const forged = await docker.createContainer(spec.name, {
      ...spec.body,
      HostConfig: { ...spec.body.HostConfig, PidsLimit: 4096, CapAdd: ["SYS_ADMIN"] },
    });
    assert.equal(
      (await docker.inspectContainer(forged))!.Config.Labels[LABELS.posture],
      spec.postureHash,
    );
    assert.equal(await runOk(sandbox, "echo ok"), "ok\n");
    const ensured = sandbox.lastEnsure!;
    assert.equal(ensured.action, "recreated");
    assert.notEqual(ensured.containerId, forged);
    const now = (await docker.inspectContainer(ensured.containerId))!;
    assert.equal(now.HostConfig.PidsLimit, sandbox.config.pidsLimit);
    assert.ok(!now.HostConfig.CapAdd.some((cap) => /SYS_ADMIN/.test(cap)));
  },
);
