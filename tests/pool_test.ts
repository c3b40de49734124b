/**
 * Warm pools against a real Docker daemon: what a taken sandbox is (its
 * posture exactly a cold one's, nothing of the pool's other members), that
 * a member is taken once, that a pool refills after a burst and never holds
 * more than its count, and which members are passed over.
 *
 * @module
 */
import assert from "node:assert/strict";
import { POOL_TENANT } from "../lib/config/sandbox_key.ts";
import type { ContainerInspect, DockerClient } from "../lib/docker/mod.ts";
import { statePaths } from "../lib/lifecycle/identity.ts";
import { memberKey, readBinding, readyMembers } from "../lib/lifecycle/pool.ts";
import { containerSpec, LABELS, postureDrift } from "../lib/lifecycle/posture.ts";
import { fillPool, keepPools } from "../lib/sandbox/pool_fill.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import { liveTest } from "./_docker_gate.ts";
import { waitFor } from "./_helpers.ts";
import { asCommand, asRunner, containerOf } from "./_hostile_helpers.ts";
import {
  runOk,
  tempHome,
  TEST_IMAGE,
  TEST_POOL,
  type TestHome,
  underHome,
  uniqueUser,
} from "./_sandbox_helpers.ts";

const TARGET = (warm: number) => ({ template: TEST_POOL, image: TEST_IMAGE, warm });

// The container's settings with what names its owner (labels, name,
// hostname, where its own state and channel directory lie) taken out.
function postureView(container: ContainerInspect, sandbox: Sandbox): unknown {
  const own = [
    [Deno.realPathSync(sandbox.paths.root), "<state>"],
    [Deno.realPathSync(sandbox.paths.channel), "<channel>"],
  ] as const;
  const relative = (source: string): string => {
    for (const [dir, name] of own) {
      if (source === dir || source.startsWith(`${dir}/`)) return name + source.slice(dir.length);
    }
    return source;
  };
  const { Hostname: _h, Labels: _l, ...config } = container.Config;
  return {
    config,
    host: { ...container.HostConfig, Mounts: undefined, Binds: undefined },
    mounts: container.HostConfig.Mounts.map((m) => ({ ...m, Source: relative(m.Source ?? "") }))
      .sort((a, b) => a.Target.localeCompare(b.Target)),
    image: container.Image,
  };
}

// What a process inside sees of its own confinement (not of who it is).
const PROBE = `id; ulimit -a; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status
awk '{ for (i = 1; i <= NF; i++) if ($i == "-") { print $5, $6, $(i + 1); break } }' /proc/self/mountinfo | sort
ls -lan /workspace /queue /tmp | sed 's/ [A-Z][a-z][a-z] .* / /'`;

async function probe(container: string): Promise<{ command: string; root: string }> {
  const command = await asCommand(container, PROBE);
  const root = await asRunner(
    container,
    `const out = await new Deno.Command("/bin/sh", { args: ["-c", ${
      JSON.stringify(PROBE)
    }] }).output(); await Deno.stdout.write(out.stdout);`,
  );
  assert.equal(command.code, 0, command.stderr);
  assert.equal(root.code, 0, root.stderr);
  return { command: command.stdout, root: root.stdout };
}

async function inspect(docker: DockerClient, sandbox: Sandbox): Promise<ContainerInspect> {
  const found = await docker.inspectContainer(containerOf(sandbox));
  assert.ok(found !== null);
  return found;
}

// Ready members of the pool, and member containers no user took (being
// made or ready): what the cap bounds.
async function poolCount(home: TestHome): Promise<{ ready: number; members: number }> {
  const containers = await home.docker.listContainers({
    all: true,
    labels: [`${LABELS.pool}=${TEST_POOL}`],
  });
  const members = containers.filter((c) =>
    underHome(c, home.home) && readBinding(c.Labels[LABELS.state] ?? "/nonexistent") === undefined
  );
  return { ready: readyMembers(home.home, TEST_POOL).length, members: members.length };
}

liveTest(
  "a taken sandbox's posture is exactly a cold one's: the daemon's record, the ensure's check and what a command and the runner see inside",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 }, { pool: 1 });
    const taken = home.open(uniqueUser("taken"));
    assert.deepEqual(taken.pooled, { template: TEST_POOL });
    // It never served anyone: an empty workspace, the first request its own.
    assert.equal(await runOk(taken, "ls -A /workspace | wc -l"), "0\n");
    const cold = home.open(uniqueUser("cold"));
    assert.equal(cold.pooled, undefined, "the pool held one: the second user's is made cold");
    await runOk(cold, "true");
    assert.equal(taken.lastEnsure?.action, "warm", "taken without a Docker create or start");

    const [a, b] = [await inspect(docker, taken), await inspect(docker, cold)];
    assert.equal(a.Name, `/${taken.key.containerName}`, "renamed to the user's name");
    assert.equal(a.Config.Labels[LABELS.pool], TEST_POOL);
    assert.equal(b.Config.Labels[LABELS.pool], undefined);
    assert.equal(a.Config.Labels[LABELS.posture], b.Config.Labels[LABELS.posture]);
    assert.deepEqual(postureView(a, taken), postureView(b, cold));
    for (const [sandbox, container] of [[taken, a], [cold, b]] as const) {
      const spec = containerSpec(sandbox.key, {
        config: sandbox.config,
        image: sandbox.lastEnsure!.image,
        paths: sandbox.paths,
      });
      assert.equal(postureDrift(container, spec), undefined, sandbox.key.user);
      assert.equal(spec.postureHash, container.Config.Labels[LABELS.posture]);
    }
    assert.deepEqual(await probe(a.Id), await probe(b.Id));

    // The fleet knows it as the user's: ps, stop, and a start on its own mounts.
    const ps = await home.cli(["ps", "--json"]);
    const row = JSON.parse(ps.stdout).sandboxes.find((s: { containerId: string }) =>
      s.containerId === a.Id
    );
    assert.equal(row.user, taken.key.user);
    assert.deepEqual(row.pool, { template: TEST_POOL, taken: true });
    assert.equal((await home.cli(["stop", "--user", taken.key.user])).code, 0);
    assert.equal(await runOk(taken, "echo again"), "again\n");
    assert.equal(containerOf(taken), a.Id, "the same container, started again");
  },
);

liveTest(
  "a sandbox taken from a pool sees nothing of the pool's other members, as a command or as its runner",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 }, { pool: 2 });
    const taken = home.open(uniqueUser("isolated"));
    await runOk(taken, "true");
    const [other] = readyMembers(home.home, TEST_POOL);
    assert.ok(other !== undefined, "one member is still ready");
    const otherPaths = statePaths(home.home, memberKey(home.home, other));
    const canary = `canary-${crypto.randomUUID()}`;
    Deno.writeTextFileSync(`${otherPaths.workspace}/${canary}`, canary);
    const hostPaths = [otherPaths.root, Deno.realPathSync(otherPaths.channel), `${home.home}/pool`];
    const look =
      `grep -rls ${canary} /workspace /queue /tmp /run 2>/dev/null; cat /proc/self/mountinfo`;
    const container = containerOf(taken);
    for (
      const [who, out] of [["command", await asCommand(container, look)], [
        "runner",
        await asRunner(
          container,
          `const o = await new Deno.Command("/bin/sh", { args: ["-c", ${
            JSON.stringify(look)
          }] }).output(); await Deno.stdout.write(o.stdout);`,
        ),
      ]] as const
    ) {
      assert.ok(
        !out.stdout.includes(canary),
        `${who} found the other member's file: ${out.stdout}`,
      );
      for (const path of hostPaths) {
        assert.ok(!out.stdout.includes(path), `${who} has '${path}' mounted`);
      }
    }
    // Every mount of the taken container is its own state, or read-only and
    // no sandbox's (the program, the MCP package cache).
    const own = [Deno.realPathSync(taken.paths.root), Deno.realPathSync(taken.paths.channel)];
    for (const mount of (await inspect(docker, taken)).HostConfig.Mounts) {
      const source = mount.Source ?? "";
      if (own.some((dir) => source === dir || source.startsWith(`${dir}/`))) continue;
      assert.equal(mount.ReadOnly, true, `writable mount outside its state: ${source}`);
      for (const dir of ["sandboxes", "ch", "pool"]) {
        assert.ok(!source.startsWith(`${home.home}/${dir}/`), `another sandbox's mount: ${source}`);
      }
    }
  },
);

liveTest(
  "a member is taken once: two hosts opening one new user share one sandbox, four users from a pool of two get two",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 }, { pool: 3 });
    const user = uniqueUser("twice");
    const both = await Promise.all(
      [0, 1].map(() =>
        home.cli(["exec", "--user", user, "--", "sh", "-c", "cat /proc/sys/kernel/hostname"])
      ),
    );
    for (const out of both) assert.equal(out.code, 0, out.stderr);
    assert.equal(both[0]!.stdout, both[1]!.stdout, "one container answered both");
    assert.equal(readyMembers(home.home, TEST_POOL).length, 2, "one member taken");

    const users = [0, 1, 2, 3].map((i) => home.open(uniqueUser(`four-${i}`)));
    await Promise.all(users.map((sandbox) => runOk(sandbox, "true")));
    assert.equal(users.filter((sandbox) => sandbox.pooled !== undefined).length, 2);
    const containers = new Set(users.map(containerOf));
    assert.equal(containers.size, 4, "no container serves two users");
    assert.equal(readyMembers(home.home, TEST_POOL).length, 0);
  },
);

liveTest(
  "a pool refills after a burst and never holds more than its count; one filler at a time",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 }, { pool: 3 });
    const concurrent = await Promise.all(
      [0, 1].map(() =>
        fillPool(home.home, TARGET(3), { configPath: `${home.home}/waffle.toml`, docker })
      ),
    );
    assert.ok(concurrent.filter((report) => report.ran).length <= 1, JSON.stringify(concurrent));
    const keeper = keepPools(home.home, [TARGET(3)], {
      configPath: `${home.home}/waffle.toml`,
      docker,
      intervalMs: 200,
    });
    const samples: { ready: number; members: number }[] = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        samples.push(await poolCount(home));
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();
    try {
      const burst = [0, 1, 2, 3, 4].map((i) => home.open(uniqueUser(`burst-${i}`)));
      await Promise.all(burst.map((sandbox) => runOk(sandbox, "true")));
      assert.ok(
        burst.filter((s) => s.pooled !== undefined).length >= 3,
        "the pool served the burst",
      );
      keeper.poke();
      await waitFor(async () => (await poolCount(home)).ready === 3, {
        timeoutMs: 120_000,
        what: "the pool to refill",
      });
    } finally {
      sampling = false;
      await sampler;
      await keeper.stop();
    }
    assert.ok(samples.length > 5, `sampled ${samples.length} times`);
    const most = Math.max(...samples.map((s) => s.members));
    assert.ok(most <= 3, `the pool held ${most} members at once: ${JSON.stringify(samples)}`);
    assert.ok(samples.some((s) => s.ready < 3), "the burst emptied the pool for a while");
  },
);

liveTest(
  "members that do not fit or stopped serving are passed over; the filler replaces a dead one",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 }, { pool: 1 });
    // Another memory limit: another posture, so a cold sandbox of its own.
    const other = home.open(uniqueUser("bigger"), { config: { memoryBytes: 300 * 1024 * 1024 } });
    assert.equal(other.pooled, undefined);
    assert.equal(readyMembers(home.home, TEST_POOL).length, 1, "the member stays in the pool");
    const [member] = readyMembers(home.home, TEST_POOL);
    const key = memberKey(home.home, member!);
    await docker.killContainer(key.containerName);
    const next = home.open(uniqueUser("after-kill"));
    assert.equal(next.pooled, undefined, "a dead member is never taken");
    await runOk(next, "true");
    const report = await fillPool(home.home, TARGET(1), {
      configPath: `${home.home}/waffle.toml`,
      docker,
    });
    assert.equal(report.removed, 1);
    assert.equal(report.made, 1);
    assert.equal(await docker.inspectContainer(key.containerName), null, "the dead one is gone");
    // Reserved: no user of the pool's tenant, by any path.
    const refused = await home.cli([
      "exec",
      "--tenant",
      POOL_TENANT,
      "--user",
      member!.user,
      "--",
      "true",
    ]);
    assert.equal(refused.code, 125);
    assert.match(refused.stderr, /Tenant id 'waffle-pool' is reserved for warm pools/);
  },
);
