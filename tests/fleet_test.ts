/**
 * `waffle ps` and `sweep` over a hostile fleet: they read what they need
 * (the heartbeat file, the host's own inbound.db), never a runner's
 * outbound.db however large, and one sandbox they cannot read is reported
 * while the others are judged as usual.
 *
 * @module
 */
import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { SCHEMA_VERSION } from "../lib/queue/version.ts";
import { selfCommand } from "../lib/config/self.ts";
import { liveTest } from "./_docker_gate.ts";
import { asCommand, asRunner, containerOf } from "./_hostile_helpers.ts";
import { GROW_OUTBOUND_SCRIPT } from "./_runner_attacks.ts";
import { runOk, tempHome, uniqueUser } from "./_sandbox_helpers.ts";
import { delay, waitFor } from "./_helpers.ts";
import { listSandboxes } from "../lib/lifecycle/fleet.ts";

/** A CLI run from source in a fresh process, with its peak resident memory. */
interface Measured {
  code: number;
  stdout: string;
  stderr: string;
  /** VmHWM read until the process exited, in MiB. */
  peakMiB: number;
}

async function measuredCli(home: string, args: string[]): Promise<Measured> {
  const self = selfCommand();
  const child = new Deno.Command(self.executable, {
    args: [...self.prefix, ...args],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    env: { WAFFLE_HOME: home },
  }).spawn();
  let peakKiB = 0;
  let done = false;
  const output = child.output().finally(() => (done = true));
  // VmHWM only grows: the last reading before exit is the peak.
  while (!done) {
    try {
      const status = await Deno.readTextFile(`/proc/${child.pid}/status`);
      const kib = Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0);
      peakKiB = Math.max(peakKiB, kib);
    } catch {
      break;
    }
    await delay(2);
  }
  const out = await output;
  const decoder = new TextDecoder();
  return {
    code: out.code,
    stdout: decoder.decode(out.stdout),
    stderr: decoder.decode(out.stderr),
    peakMiB: peakKiB / 1024,
  };
}

liveTest(
  "ps and sweep read a sandbox's heartbeat, not its outbound.db: a compromised runner's 140 MB one costs them nothing",
  async (docker, t) => {
    await using home = await tempHome(docker, { idleSeconds: 0 });
    const big = home.open(uniqueUser("bigout"));
    const small = home.open(uniqueUser("smallout"));
    await runOk(big, "true");
    await runOk(small, "true");
    const bigId = containerOf(big);
    const baseline = await measuredCli(home.home, ["ps", "--json"]);
    assert.equal(baseline.code, 0, baseline.stderr);

    await t.step("as a command (uid 10001): outbound.db cannot be written at all", async () => {
      const out = await asCommand(
        bigId,
        "head -c 1048576 /dev/zero >> /queue/outbound/outbound.db && echo grew; true",
      );
      assert.doesNotMatch(out.stdout, /grew/);
      assert.match(out.stderr, /Permission denied/);
    });

    await t.step("as the runner (uid 0): outbound.db grown to 140 MB", async () => {
      const grown = await asRunner(bigId, GROW_OUTBOUND_SCRIPT);
      assert.equal(grown.code, 0, grown.stderr);
      const bytes = (await Deno.stat(big.queue.paths.outbound)).size;
      assert.ok(bytes > 140_000_000, `outbound.db has ${bytes} bytes`);

      for (const args of [["ps", "--json"], ["sweep", "--json"]]) {
        const run = await measuredCli(home.home, args);
        assert.equal(run.code, 0, run.stderr);
        // A copy of the file alone would take 140 MB more than the baseline.
        assert.ok(
          run.peakMiB < baseline.peakMiB + 48,
          `${args[0]} peaked at ${run.peakMiB.toFixed(1)} MiB (baseline ${
            baseline.peakMiB.toFixed(1)
          })`,
        );
        // deno-lint-ignore no-console
        console.log(
          `${args[0]} with a ${(bytes / 1e6).toFixed(0)} MB outbound.db: peak ${
            run.peakMiB.toFixed(1)
          } MiB, baseline ps ${baseline.peakMiB.toFixed(1)} MiB`,
        );
      }
      const ps = await measuredCli(home.home, ["ps", "--json"]);
      const rows = JSON.parse(ps.stdout).sandboxes as { containerId: string; runner: string }[];
      assert.equal(rows.find((row) => row.containerId === bigId)?.runner, "alive");
      assert.equal(rows.find((row) => row.containerId === containerOf(small))?.runner, "alive");
    });
  },
);

liveTest(
  "one sandbox whose state cannot be read does not stop ps or sweep from judging the others",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 0 });
    const broken = home.open(uniqueUser("broken"));
    const idle = home.open(uniqueUser("idle"));
    await runOk(broken, "true");
    await runOk(idle, "true");
    const brokenId = containerOf(broken);
    const idleId = containerOf(idle);
    // The host's own file made unreadable (a disk error, an operator's slip).
    const inbound = broken.queue.paths.inbound;
    await Deno.rename(inbound, `${inbound}.aside`);
    await Deno.mkdir(inbound);
    try {
      const ps = await home.cli(["ps", "--json"]);
      assert.equal(ps.code, 0, ps.stderr);
      const rows = JSON.parse(ps.stdout).sandboxes as {
        containerId: string;
        runner: string;
        problem?: string;
      }[];
      assert.match(
        rows.find((row) => row.containerId === brokenId)?.problem ?? "",
        /^Cannot read '/,
      );
      const good = rows.find((row) => row.containerId === idleId);
      assert.equal(good?.runner, "alive");
      assert.equal(good?.problem, undefined);
      const table = await home.cli(["ps"]);
      assert.equal(table.code, 0, table.stderr);
      assert.match(table.stdout, /^TENANT .*\sIDLE\s+SNAPS\s+PROBLEM\n/);

      // Idle for more than a second by the host's record (the collection after the ack counts).
      await waitFor(
        async () =>
          ((await listSandboxes(docker, { config: idle.config })).find((row) =>
            row.containerId === idleId
          )?.idleMs ?? 0) > 1500,
        { timeoutMs: 30_000, what: "an idle sandbox" },
      );
      const swept = await home.cli(["sweep", "--idle-seconds", "1", "--json"]);
      assert.equal(swept.code, 0, swept.stderr);
      const actions = JSON.parse(swept.stdout).actions as {
        containerId: string;
        action: string;
        reason: string;
      }[];
      const mine = actions.find((action) => action.containerId === brokenId);
      assert.ok(mine !== undefined && mine.action !== "stopped", swept.stdout);
      assert.equal(actions.find((action) => action.containerId === idleId)?.action, "stopped");
    } finally {
      await Deno.remove(inbound);
      await Deno.rename(`${inbound}.aside`, inbound);
    }
  },
);

liveTest(
  "ps brings an older waffle's inbound.db to this schema instead of calling it a problem",
  async (docker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("oldschema"));
    await runOk(sandbox, "true");
    sandbox.close();
    // As a version 4 waffle left it: no tty table.
    const raw = new DatabaseSync(sandbox.paths.queue + "/inbound/inbound.db");
    raw.exec("DROP TABLE tty; PRAGMA user_version = 4");
    raw.close();
    const [status] = (await listSandboxes(docker, { config: sandbox.config }))
      .filter((s) => s.user === sandbox.key.user);
    assert.ok(status !== undefined);
    assert.equal(status.problem, undefined, status.problem);
    const upgraded = new DatabaseSync(sandbox.paths.queue + "/inbound/inbound.db", {
      readOnly: true,
    });
    try {
      const version = upgraded.prepare("PRAGMA user_version").get() as { user_version: number };
      assert.equal(version.user_version, SCHEMA_VERSION);
      assert.ok(upgraded.prepare("SELECT 1 FROM sqlite_schema WHERE name = 'tty'").get());
    } finally {
      upgraded.close();
    }
  },
);
