/**
 * Pause and resume (`waffle pause`, `waffle resume`, `pauseSandbox`,
 * `resumeSandbox`): a paused sandbox's processes stop where they are and
 * use no CPU, commands fail at once with one line saying how to resume,
 * nothing judges the silent runner dead (a waiting host, `sweep`), and a
 * resume goes on where it stopped: the same process, not a new one.
 *
 * @module
 */
import assert from "node:assert/strict";
import { SandboxPausedError } from "../lib/errors.ts";
import { EXIT_WAFFLE } from "../lib/exit_codes.ts";
import { STALE_AFTER_MS } from "../lib/queue/liveness.ts";
import { pauseSandbox, resumeSandbox } from "../lib/lifecycle/pause.ts";
import { liveTest } from "./_docker_gate.ts";
import { runOk, tempHome, uniqueUser } from "./_sandbox_helpers.ts";
import { delay, waitFor } from "./_helpers.ts";

const COUNTER = "i=0; while true; do echo $((i+=1)) > /workspace/c; sleep 0.2; done";
// Counts processes whose command line is the counter's (the pattern itself
// is spelled so that this command's own line does not match it).
const COUNT_COUNTERS =
  "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'i[+]=1'";

liveTest(
  "pause freezes a running counter and its CPU, commands fail at once, resume goes on from where it was",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("pause");
    const sandbox = home.open(user);
    const counterFile = `${sandbox.paths.workspace}/c`;
    const count = (): number => Number(Deno.readTextFileSync(counterFile).trim() || "0");
    const counter = await sandbox.spawn(["sh", "-c", COUNTER]);
    const output = Promise.all([counter.stdout.cancel(), counter.stderr.cancel()]);
    await waitFor(() => {
      try {
        return count() >= 3;
      } catch {
        return false;
      }
    }, { what: "the counter to count" });
    const containerId = sandbox.lastEnsure!.containerId;

    const paused = await home.cli(["pause", "--user", user, "--json"]);
    assert.equal(paused.code, 0, paused.stderr);
    assert.deepEqual(JSON.parse(paused.stdout), {
      user,
      tenant: "default",
      container: sandbox.key.containerName,
      paused: true,
    });
    const frozenAt = count();
    const cpuBefore = (await docker.stats(containerId)).cpuTotalNs;
    await delay(1500);
    assert.equal(count(), frozenAt, "the counter stopped while paused");
    const cpuUsed = ((await docker.stats(containerId)).cpuTotalNs) - cpuBefore;
    assert.ok(cpuUsed < 5_000_000, `no CPU while paused (used ${cpuUsed} ns)`);

    // Pausing again says so; ps shows it.
    const again = await home.cli(["pause", "--user", user]);
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stdout, /^already paused /);
    const ps = await home.cli(["ps", "--json"]);
    assert.equal(ps.code, 0, ps.stderr);
    const row = (JSON.parse(ps.stdout).sandboxes as { user: string; state: string }[])
      .find((entry) => entry.user === user);
    assert.equal(row?.state, "paused");

    // A command fails at once, one line, and is never queued.
    const refused = await home.cli(["exec", "--user", user, "--", "touch", "/workspace/late"]);
    assert.equal(refused.code, EXIT_WAFFLE);
    assert.equal(
      refused.stderr.trim(),
      `waffle: Sandbox '${user}' of tenant 'default' is paused; resume it with 'waffle resume --user ${user} --tenant default'`,
    );
    await assert.rejects(sandbox.run(["true"]), SandboxPausedError);

    // Long enough for the waiting host (the counter's spawn) to judge the
    // runner stale: it must keep waiting, and nothing may recycle the sandbox.
    await waitFor(() => sandbox.queue.liveness().state === "stale", {
      timeoutMs: STALE_AFTER_MS + 10_000,
      what: "the paused runner to look stale",
    });
    await delay(1000);
    const swept = await home.cli(["sweep", "--json"]);
    assert.equal(swept.code, 0, swept.stderr);
    const action = (JSON.parse(swept.stdout).actions as { user: string; action: string }[])
      .find((entry) => entry.user === user);
    assert.equal(action?.action, "kept");
    const inspected = await docker.inspectContainer(containerId);
    assert.equal(inspected?.State.Paused, true, "still the same, paused container");
    assert.equal(count(), frozenAt);

    const resumed = await home.cli(["resume", "--user", user, "--json"]);
    assert.equal(resumed.code, 0, resumed.stderr);
    assert.equal(JSON.parse(resumed.stdout).resumed, true);
    await waitFor(() => count() !== frozenAt, { what: "the counter to go on" });
    // Restarted, it would count from 1 again.
    assert.ok(count() > frozenAt, `went on from ${frozenAt}, not from 1 (now ${count()})`);
    assert.equal((await runOk(sandbox, COUNT_COUNTERS)).trim(), "1", "exactly one counter");
    await assert.rejects(Deno.stat(`${sandbox.paths.workspace}/late`), Deno.errors.NotFound);

    const notPaused = await home.cli(["resume", "--user", user]);
    assert.match(notPaused.stdout, /^not paused /);
    await counter.kill();
    const status = await counter.status;
    assert.equal(status.cancelled, true);
    assert.equal(status.interrupted, false, "the counter's runner was never restarted");
    await output;
  },
);

liveTest(
  "pauseSandbox and resumeSandbox from the library; a paused sandbox can be stopped and removed",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("pauselib");
    const sandbox = home.open(user);
    await runOk(sandbox, "true");
    const options = { config: sandbox.config };
    assert.equal(await pauseSandbox(docker, sandbox.key, options), true);
    assert.equal(await pauseSandbox(docker, sandbox.key, options), false);
    await assert.rejects(sandbox.run(["true"]), SandboxPausedError);
    assert.equal(await resumeSandbox(docker, sandbox.key, options), true);
    assert.equal(await resumeSandbox(docker, sandbox.key, options), false);
    assert.equal((await runOk(sandbox, "echo back")).trim(), "back");

    // Stop thaws first; the next call starts it again.
    await pauseSandbox(docker, sandbox.key, options);
    const stopped = await home.cli(["stop", "--user", user]);
    assert.equal(stopped.code, 0, stopped.stderr);
    assert.equal((await runOk(sandbox, "echo again")).trim(), "again");

    // Removal takes a paused container too, and forgets the pause.
    await pauseSandbox(docker, sandbox.key, options);
    const removed = await home.cli(["rm", "--user", user]);
    assert.equal(removed.code, 0, removed.stderr);
    assert.match(removed.stdout, /^removed /);
    assert.equal((await runOk(sandbox, "echo anew")).trim(), "anew");
  },
);
