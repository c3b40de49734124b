/**
 * `waffle ps` and `sweep` over a hostile fleet: they read what they need
 * (the heartbeat file, the host's own inbound.db and record of use), never a runner's
 * outbound.db however large, and one sandbox they cannot read is reported
 * while the others are judged as usual. They act on this home's sandboxes
 * (by the home each container's `waffle.state` label names) unless given
 * `--all`; labels that name no home never crash them.
 *
 * @module
 */
import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { SCHEMA_VERSION } from "../lib/queue/version.ts";
import { selfCommand } from "../lib/config/self.ts";
import { DockerClient, type ListOptions } from "../lib/docker/mod.ts";
import type { ContainerSummary } from "../lib/docker/types.ts";
import { sha256Hex } from "../lib/digest.ts";
import { liveTest } from "./_docker_gate.ts";
import { asCommand, asRunner, containerOf } from "./_hostile_helpers.ts";
import { GROW_OUTBOUND_SCRIPT } from "./_runner_attacks.ts";
import {
  pendingAcks,
  runOk,
  tempHome,
  TEST_IMAGE,
  uniqueUser,
  waitIdle,
} from "./_sandbox_helpers.ts";
import { delay, waitFor } from "./_helpers.ts";
import {
  listSandboxes,
  type SandboxStatus,
  sweep,
  type SweepAction,
} from "../lib/lifecycle/fleet.ts";
import { containerHome, homeMatcher } from "../lib/lifecycle/container_home.ts";
import { sandboxKey } from "../lib/config/sandbox_key.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";

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

      // Idle for more than a second by the host's record.
      await waitIdle(docker, idle, { ms: 1500 });
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
    // The running runner reads inbound.db: wait out its read lock, as waffle does.
    raw.exec("PRAGMA busy_timeout = 10000");
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

liveTest(
  "a sandbox's last use is the host's record of use, never the queue's housekeeping after it",
  async (docker, t) => {
    await using home = await tempHome(docker, { idleSeconds: 0 });
    const user = uniqueUser("lastuse");
    // One use by a CLI process: it submits, collects, acknowledges and exits
    // before its housekeeping is due, as every `waffle exec` does.
    const ran = await home.cli(["exec", "--user", user, "--", "true"]);
    assert.equal(ran.code, 0, ran.stderr);
    const sandbox = home.open(user);
    const inbound = sandbox.queue.paths.inbound;
    assert.ok(pendingAcks(inbound) > 0, "the exec left its acknowledged rows to housekeeping");
    const rowOf = async (): Promise<SandboxStatus | undefined> =>
      (await listSandboxes(docker, { config: sandbox.config }))
        .find((row) => row.statePath === sandbox.paths.root);
    const lastUsed = async (): Promise<number | null | undefined> => (await rowOf())?.lastUsed;
    const container = (await rowOf())?.containerId ?? "";
    const used = await lastUsed();
    assert.equal(typeof used, "number");
    const written = (await Deno.stat(inbound)).mtime?.getTime();

    await t.step("as the runner (uid 0): the record is out of reach", async () => {
      const out = await asRunner(
        container,
        `for (const path of ["/queue/inbound/inbound.db", "/queue/inbound/last_use", "/queue/last_use"]) {
  try { Deno.utimeSync(path, new Date(), new Date()); console.log("touched " + path); }
  catch (error) { console.log(path + ": " + error.name); }
}`,
      );
      assert.equal(out.code, 0, out.stderr);
      assert.doesNotMatch(out.stdout, /touched/);
      assert.equal(await lastUsed(), used);
    });

    await t.step("the host's later housekeeping writes inbound.db and is no use", async () => {
      // Another host deletes the acknowledged rows once the runner dropped
      // its own (when the runner chooses): a write of inbound.db.
      await waitFor(async () => (await sandbox.queue.gc(), pendingAcks(inbound) === 0), {
        timeoutMs: 30_000,
        what: "the acknowledged rows deleted",
      });
      assert.notEqual((await Deno.stat(inbound)).mtime?.getTime(), written);
      assert.equal(await lastUsed(), used);
    });

    await t.step("a use moves it", async () => {
      await runOk(sandbox, "true");
      const now = await lastUsed();
      assert.ok(typeof now === "number" && now > used!, `${now} after ${used}`);
    });
  },
);

/**
 * A client that sees only the given containers: a library `sweep({ all })`
 * in a test must never touch the containers of other tests (other homes)
 * sharing the daemon.
 */
class OnlyThese extends DockerClient {
  readonly #keep: (summary: ContainerSummary) => boolean;
  constructor(keep: (summary: ContainerSummary) => boolean) {
    super();
    this.#keep = keep;
  }
  override async listContainers(options: ListOptions = {}): Promise<ContainerSummary[]> {
    return (await super.listContainers(options)).filter(this.#keep);
  }
}

Deno.test("containerHome() reads the home from the state label only when the labels are waffle's own", () => {
  const key = sandboxKey("acme", "bob", { home: "/srv/w" });
  const labels = (state: string | undefined, extra: Record<string, string> = {}) => ({
    [LABELS.key]: key.hash,
    [LABELS.tenant]: "acme",
    [LABELS.user]: "bob",
    ...(state === undefined ? {} : { [LABELS.state]: state }),
    ...extra,
  });
  const placed = containerHome(labels(`/srv/w/sandboxes/${key.hash}`));
  assert.equal(placed.home, "/srv/w");
  assert.equal(placed.home !== null && placed.key.hash, key.hash);
  assert.equal(containerHome(labels(`/sandboxes/${key.hash}`)).home, "/");
  for (
    const [state, extra, problem] of [
      [undefined, {}, /^No 'waffle\.state' label$/],
      ["", {}, /^No 'waffle\.state' label$/],
      ["relative/sandboxes/x", {}, /is not a waffle state root$/],
      [`/srv/w//sandboxes/${key.hash}`, {}, /is not a waffle state root$/],
      [`/srv/w/sandboxes/${key.hash}/`, {}, /is not a waffle state root$/],
      [`/srv/w/other/${key.hash}`, {}, /is not a waffle state root$/],
      [
        `/srv/w/sandboxes/${"0".repeat(64)}`,
        {},
        /is not the state root of user 'bob' of tenant 'acme'$/,
      ],
      [
        `/srv/w/sandboxes/${key.hash}`,
        { [LABELS.user]: "bad user" },
        /name no valid tenant and user$/,
      ],
    ] as const
  ) {
    const got = containerHome(labels(state, extra));
    assert.equal(got.home, null, String(state));
    assert.match(got.home === null ? got.problem : "", problem);
  }
});

Deno.test("homeMatcher() compares homes as directories: never by prefix, the same through a trailing slash or a symlink", async () => {
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-homes-" }));
  try {
    await Deno.mkdir(`${dir}/home`);
    await Deno.mkdir(`${dir}/home2`);
    await Deno.symlink(`${dir}/home`, `${dir}/link`);
    const ours = homeMatcher(`${dir}/home`);
    assert.equal(ours(`${dir}/home`), true);
    assert.equal(ours(`${dir}/link`), true);
    assert.equal(ours(`${dir}/home2`), false);
    assert.equal(ours(dir), false);
    assert.equal(ours(`${dir}/gone`), false);
    assert.equal(ours(null), false);
    assert.equal(homeMatcher(`${dir}/home/`)(`${dir}/home`), true);
    assert.equal(homeMatcher(`${dir}/link`)(`${dir}/home`), true);
    // A home that is gone is still itself by its spelling.
    assert.equal(homeMatcher(`${dir}/gone`)(`${dir}/gone`), true);
    assert.equal(homeMatcher(`${dir}/gone`)(`${dir}/gone2`), false);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

type PsRow = Pick<SandboxStatus, "home" | "thisHome" | "containerId" | "user">;

liveTest(
  "two homes on one daemon: ps and sweep act on this home's sandboxes, --all on both with each one's HOME",
  async (docker) => {
    await using homeA = await tempHome(docker, { idleSeconds: 0 });
    await using homeB = await tempHome(docker, { idleSeconds: 0 });
    const a = homeA.open(uniqueUser("home-a"));
    const b = homeB.open(uniqueUser("home-b"));
    await Promise.all([runOk(a, "true"), runOk(b, "true")]);
    const aId = containerOf(a);
    const bId = containerOf(b);
    const ps = async (args: string[], env?: Record<string, string>): Promise<PsRow[]> => {
      const out = await homeA.cli(["ps", "--json", ...args], env);
      assert.equal(out.code, 0, out.stderr);
      return JSON.parse(out.stdout).sandboxes as PsRow[];
    };

    // This home's only, each row naming it.
    const mine = await ps([]);
    assert.deepEqual(
      mine.map(({ home, thisHome, containerId }) => ({ home, thisHome, containerId })),
      [{ home: homeA.home, thisHome: true, containerId: aId }],
    );
    // The same home however WAFFLE_HOME spells it.
    const link = `${homeB.home}-link-to-a`;
    await Deno.symlink(homeA.home, link);
    try {
      for (const spelling of [`${homeA.home}/`, link]) {
        const rows = await ps([], { WAFFLE_HOME: spelling });
        assert.deepEqual(
          rows.map((row) => [row.containerId, row.thisHome]),
          [[aId, true]],
          spelling,
        );
      }
    } finally {
      await Deno.remove(link);
    }

    // --all: both, each with its home (other homes of other tests may be listed too).
    const all = await ps(["--all"]);
    assert.ok(all.every((row) => "home" in row && typeof row.thisHome === "boolean"));
    const rowOf = (id: string) => all.find((row) => row.containerId === id);
    assert.deepEqual(
      [rowOf(aId)?.home, rowOf(aId)?.thisHome, rowOf(bId)?.home, rowOf(bId)?.thisHome],
      [homeA.home, true, homeB.home, false],
    );
    assert.ok(all.filter((row) => row.thisHome).every((row) => row.home === homeA.home));

    const table = await homeA.cli(["ps", "--all"]);
    assert.equal(table.code, 0, table.stderr);
    assert.match(table.stdout, /^HOME\s+TENANT\s+USER\s+CONTAINER\s/);
    const lineOf = (id: string) =>
      table.stdout.split("\n").find((l) => l.includes(id.slice(0, 12)));
    assert.ok(lineOf(aId)?.startsWith(`${homeA.home} `), table.stdout);
    assert.ok(lineOf(bId)?.startsWith(`${homeB.home} `), table.stdout);
    const plain = await homeA.cli(["ps"]);
    assert.match(plain.stdout, /^TENANT\s/);
    assert.doesNotMatch(plain.stdout, new RegExp(bId.slice(0, 12)));

    const running = async (id: string): Promise<boolean> =>
      (await docker.inspectContainer(id))?.State.Running ?? false;
    const sweepA = async (args: string[]): Promise<SweepAction[]> => {
      const out = await homeA.cli(["sweep", "--json", ...args]);
      assert.equal(out.code, 0, out.stderr);
      return JSON.parse(out.stdout).actions as SweepAction[];
    };

    // The running cap counts this home's running sandboxes: A has one, so a
    // cap of 1 stops nothing (B's and other homes' do not count).
    const capped = await sweepA(["--idle-seconds", "0", "--max-running", "1"]);
    assert.deepEqual(capped.filter((x) => x.action === "stopped"), []);
    assert.deepEqual([await running(aId), await running(bId)], [true, true]);

    // Under --all the cap counts every home's: one of the two stops, named by its home.
    const both = new OnlyThese((c) => c.Id === aId || c.Id === bId);
    const overAll = await sweep(both, {
      config: a.config,
      all: true,
      idleSeconds: 0,
      maxRunning: 1,
    });
    const stoppedOne = overAll.filter((x) => x.action === "stopped");
    assert.equal(stoppedOne.length, 1, JSON.stringify(overAll));
    const [first] = stoppedOne;
    assert.match(first!.reason, /^over the cap of 1 running on this daemon$/);
    assert.equal(first!.home, first!.containerId === aId ? homeA.home : homeB.home);
    assert.equal(first!.thisHome, first!.containerId === aId);
    // Back up, for the idle sweeps.
    await runOk(first!.containerId === aId ? a : b, "true");

    // Idle: A's sweep stops A's sandbox and never B's.
    await waitFor(
      async () =>
        (await listSandboxes(both, { config: a.config, all: true }))
          .every((row) => (row.idleMs ?? 0) > 1500),
      { timeoutMs: 30_000, what: "two idle sandboxes" },
    );
    const idle = await sweepA(["--idle-seconds", "1"]);
    assert.equal(idle.find((x) => x.containerId === aId)?.action, "stopped", JSON.stringify(idle));
    assert.equal(idle.find((x) => x.containerId === bId), undefined);
    assert.ok(idle.every((x) => x.thisHome && x.home === homeA.home), JSON.stringify(idle));
    assert.deepEqual([await running(aId), await running(bId)], [false, true]);

    // --all, asked for: B's idle sandbox is stopped too, the action naming B's home.
    const swept = await sweep(both, { config: a.config, all: true, idleSeconds: 1 });
    const ofB = swept.find((x) => x.containerId === bId);
    assert.deepEqual(
      ofB && { home: ofB.home, thisHome: ofB.thisHome, action: ofB.action },
      { home: homeB.home, thisHome: false, action: "stopped" },
    );
    assert.match(ofB!.reason, /^idle for/);
    assert.equal(await running(bId), false);
  },
);

liveTest(
  "a container whose labels name no home is never this home's, is listed under --all with an unknown home, and is kept by sweep",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 0 });
    const sandbox = home.open(uniqueUser("placed"));
    await runOk(sandbox, "true");
    const key = sandbox.key;
    const base = { [LABELS.key]: key.hash, [LABELS.tenant]: key.tenant, [LABELS.user]: key.user };
    // None of these is started: only their labels matter.
    const forged: Record<string, Record<string, string>> = {
      "no state label": base,
      "a relative state": { ...base, [LABELS.state]: "relative/sandboxes/x" },
      "another pair's root in this home": {
        ...base,
        [LABELS.state]: `${home.home}/sandboxes/${sha256Hex("someone else")}`,
      },
      "no tenant or user": { [LABELS.key]: "x", [LABELS.state]: sandbox.paths.root },
    };
    const ids = new Map<string, string>();
    try {
      for (const [what, labels] of Object.entries(forged)) {
        const id = await docker.createContainer(
          `waffle-test-unplaced-${crypto.randomUUID().slice(0, 8)}`,
          {
            Image: TEST_IMAGE,
            Entrypoint: ["/bin/true"],
            Labels: labels,
          },
        );
        ids.set(id, what);
      }
      const ps = async (args: string[]): Promise<SandboxStatus[]> => {
        const out = await home.cli(["ps", "--json", ...args]);
        assert.equal(out.code, 0, out.stderr);
        return JSON.parse(out.stdout).sandboxes as SandboxStatus[];
      };
      assert.deepEqual((await ps([])).map((row) => row.containerId), [containerOf(sandbox)]);
      const all = await ps(["--all"]);
      for (const [id, what] of ids) {
        const row = all.find((r) => r.containerId === id);
        assert.ok(row !== undefined, what);
        assert.deepEqual([row.home, row.thisHome, row.runner], [null, false, "unknown"], what);
        assert.match(row.problem ?? "", /waffle\.(state|tenant)/, what);
      }
      const table = await home.cli(["ps", "--all"]);
      assert.equal(table.code, 0, table.stderr);
      for (const id of ids.keys()) {
        const line = table.stdout.split("\n").find((l) => l.includes(id.slice(0, 12)));
        assert.match(line ?? "", /^\?\s/, table.stdout);
      }

      const these = new OnlyThese((c) => ids.has(c.Id));
      const actions = await sweep(these, { config: sandbox.config, all: true, idleSeconds: 1 });
      assert.equal(actions.length, ids.size, JSON.stringify(actions));
      for (const action of actions) {
        assert.deepEqual([action.action, action.home], ["kept", null], JSON.stringify(action));
        assert.match(action.reason, /^labels name no home: /);
      }
      for (const id of ids.keys()) assert.ok(await docker.inspectContainer(id) !== null);
    } finally {
      for (const id of ids.keys()) await docker.removeContainer(id, { force: true });
    }
  },
);
