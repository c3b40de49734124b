/**
 * What a sandbox costs (`sandbox.stats()`, `lib/lifecycle/stats.ts`): the
 * figures agree with the cgroup's own files, read here independently, and
 * with `df` of the quota volume; a command and a compromised runner cannot
 * make them lie, hang or blow up. Live tests are registered ignored where
 * Docker is unusable and fail instead under `WAFFLE_REQUIRE_DOCKER=1`.
 *
 * @module
 */
import assert from "node:assert/strict";
import { CgroupReadError, findCgroup, readKernelFile } from "../lib/lifecycle/cgroup.ts";
import { sandboxStats } from "../lib/lifecycle/stats.ts";
import { quotaSupport } from "../lib/lifecycle/quota.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import { liveTest } from "./_docker_gate.ts";
import { asCommand, bothWays, containerOf } from "./_hostile_helpers.ts";
import { runOk, tempHome } from "./_sandbox_helpers.ts";
import { delay, text } from "./_helpers.ts";
import { egressHome, sh as egressSh } from "./_egress_sandbox.ts";
import { selfCommand } from "../lib/config/self.ts";

const MIB = 1024 ** 2;
const HOME_CONFIG = { memoryBytes: 512 * MIB, tmpBytes: 256 * MIB, pidsLimit: 64 };

/** The container's cgroup files, found here by Docker's own layout (not the code under test's way). */
function cgroupFile(containerId: string, controller: string, file: string): string {
  const candidates = [
    `/sys/fs/cgroup/${controller}/docker/${containerId}/${file}`,
    `/sys/fs/cgroup/${controller}/system.slice/docker-${containerId}.scope/${file}`,
  ];
  for (const path of candidates) {
    try {
      Deno.statSync(path);
      return path;
    } catch {
      // next layout
    }
  }
  throw new Error(`No cgroup v1 file '${file}' for container '${containerId}' on this host`);
}

function kernel(containerId: string, controller: string, file: string): number {
  return Number(Deno.readTextFileSync(cgroupFile(containerId, controller, file)).trim());
}

async function dfUsed(path: string): Promise<number> {
  const out = await new Deno.Command("df", { args: ["-B1", "--output=used", path] }).output();
  return Number(text(out.stdout).trim().split("\n")[1]);
}

async function ready(sandbox: Sandbox): Promise<string> {
  await runOk(sandbox, "true");
  return containerOf(sandbox);
}

Deno.test("readKernelFile() refuses a file over its cap without reading it whole", () => {
  const path = Deno.makeTempFileSync();
  try {
    Deno.writeFileSync(path, new Uint8Array(8 * MIB));
    assert.throws(() => readKernelFile(path), CgroupReadError);
  } finally {
    Deno.removeSync(path);
  }
});

Deno.test("findCgroup() refuses a pid whose cgroup names another container", () => {
  // This test's own process: in no container's cgroup, as a reused pid would be.
  assert.throws(() => findCgroup(Deno.pid, "a".repeat(64)), /in no cgroup of container/);
  assert.throws(() => findCgroup(Deno.pid, "../../x"), /Invalid container id/);
  assert.throws(() => findCgroup(0, "a".repeat(64)), /has no process/);
});

liveTest("stats() agrees with the cgroup's own files: CPU time, memory, tasks", async (docker) => {
  await using home = await tempHome(docker, HOME_CONFIG);
  const sandbox = home.open("stats-agree");
  const id = await ready(sandbox);

  // CPU: a busy second; the counter is monotone, so a reading lies between two of the file's.
  const before = await sandbox.stats();
  await runOk(sandbox, "timeout 1 sh -c 'while :; do :; done'; true");
  const cpuLow = kernel(id, "cpuacct", "cpuacct.usage");
  const busy = await sandbox.stats({ previous: before });
  const cpuHigh = kernel(id, "cpuacct", "cpuacct.usage");
  assert.ok(busy.cpu !== null && before.cpu !== null);
  assert.ok(cpuLow <= busy.cpu.usageNs && busy.cpu.usageNs <= cpuHigh);
  assert.ok(busy.cpu.usageNs - before.cpu.usageNs >= 0.2e9, "a busy loop used CPU time");
  assert.ok(busy.cpu.share !== null && busy.cpu.share > 0 && busy.cpu.share <= 1.1);
  assert.equal(busy.cgroup, 1);

  // Memory: 96 MiB written to /tmp (a tmpfs: charged to the sandbox's cgroup).
  const idle = await sandbox.stats();
  await runOk(sandbox, "dd if=/dev/zero of=/tmp/ballast bs=1M count=96 2>/dev/null");
  const full = await sandbox.stats();
  const usage = kernel(id, "memory", "memory.usage_in_bytes");
  assert.ok(full.memory !== null && idle.memory !== null);
  assert.ok(Math.abs(full.memory.currentBytes - usage) < 8 * MIB, "current agrees with the file");
  assert.ok(full.memory.currentBytes - idle.memory.currentBytes >= 90 * MIB);
  assert.ok(full.memory.peakBytes !== null);
  assert.ok(full.memory.peakBytes <= kernel(id, "memory", "memory.max_usage_in_bytes"));
  assert.equal(full.memory.limitBytes, kernel(id, "memory", "memory.limit_in_bytes"));
  assert.equal(full.memory.limitBytes, HOME_CONFIG.memoryBytes);

  // Tasks: six sleepers left behind by a command.
  const calm = await sandbox.stats();
  const left = await asCommand(id, "for i in 1 2 3 4 5 6; do sleep 300 >/dev/null 2>&1 & done");
  assert.equal(left.code, 0, left.stderr);
  const crowded = await sandbox.stats();
  assert.ok(crowded.pids !== null && calm.pids !== null);
  assert.ok(crowded.pids.current - calm.pids.current >= 6);
  assert.ok(Math.abs(crowded.pids.current - kernel(id, "pids", "pids.current")) <= 2);
  assert.equal(crowded.pids.limit, HOME_CONFIG.pidsLimit);
});

liveTest("stats() reports the disk used on the quota volume as df does", async (docker, t) => {
  const support = quotaSupport();
  if (!support.supported) {
    if (Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1") throw new Error(support.reason);
    await t.step({ name: `ignored: ${support.reason}`, ignore: true, fn: () => {} });
    return;
  }
  await using home = await tempHome(docker, HOME_CONFIG);
  const sandbox = home.open("stats-disk");
  await ready(sandbox);
  const empty = await sandbox.stats();
  await runOk(sandbox, "dd if=/dev/urandom of=/workspace/fifty bs=1M count=50 2>/dev/null; sync");
  const written = await sandbox.stats();
  const used = await dfUsed(sandbox.paths.volume);
  assert.ok(written.disk !== null && empty.disk !== null, written.problems.join("; "));
  assert.ok(written.disk.usedBytes - empty.disk.usedBytes >= 48 * MIB);
  assert.ok(Math.abs(written.disk.usedBytes - used) < 2 * MIB, "used agrees with df");
  assert.equal(written.disk.quotaBytes, sandbox.config.quotaBytes);
  assert.ok(written.disk.totalBytes > 0);
});

liveTest("stats() of a sandbox never started reads no container and says so", async (docker) => {
  await using home = await tempHome(docker, HOME_CONFIG);
  const sandbox = home.open("stats-never");
  const stats = await sandbox.stats();
  assert.equal(stats.state, "missing");
  assert.equal(stats.cpu, null);
  assert.equal(stats.memory, null);
  assert.equal(stats.network, null);
});

// Names the reader might be fooled into reading if it ever read a sandbox's files.
const DECOYS = [
  "memory.usage_in_bytes",
  "memory.max_usage_in_bytes",
  "cpuacct.usage",
  "pids.current",
  "cgroup",
];

bothWays("cannot make stats lie, hang or blow up", async (docker, attacker) => {
  await using home = await tempHome(docker, HOME_CONFIG);
  const sandbox = home.open(`stats-${attacker.kind}`);
  const id = await ready(sandbox);
  const dirs = ["/tmp", "/workspace", ...(attacker.kind === "runner" ? ["/queue/outbound"] : [])];
  const lies = DECOYS.flatMap((name) =>
    dirs.map((dir) => `echo 999999999999999 > ${dir}/${name} 2>/dev/null`)
  );
  // A FIFO nobody writes (a read would hang) and a huge sparse file (a read would blow up).
  const traps = dirs.map((dir) =>
    `mkfifo ${dir}/fifo 2>/dev/null; truncate -s 8G ${dir}/huge 2>/dev/null`
  );
  // What the runner's root could try against the counters themselves: the
  // cgroup file system is read-only in the container, and it cannot mount.
  const tamper = [
    "echo 1 > /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null",
    "mount -t tmpfs none /sys/fs/cgroup 2>/dev/null",
    "mount --bind /tmp /workspace 2>/dev/null",
  ];
  const attack = await attacker.sh(sandbox, [...lies, ...traps, ...tamper, "true"].join("; "));
  assert.equal(attack.code, 0, attack.stderr);
  const stats = await sandboxStats(docker, id, { volume: sandbox.paths.volume, sampleMs: 200 });
  assert.ok(stats.memory !== null && stats.cpu !== null && stats.pids !== null);
  assert.ok(stats.memory.currentBytes < HOME_CONFIG.memoryBytes);
  assert.ok(
    Math.abs(stats.memory.currentBytes - kernel(id, "memory", "memory.usage_in_bytes")) < 8 * MIB,
  );
  assert.ok(stats.cpu.usageNs <= kernel(id, "cpuacct", "cpuacct.usage"));
  assert.equal(stats.memory.limitBytes, HOME_CONFIG.memoryBytes);
  assert.ok(stats.pids.current < HOME_CONFIG.pidsLimit);
  if (stats.disk !== null) {
    // The 8 GiB sparse file takes no blocks: the disk figure is the file system's, not a size.
    assert.ok(stats.disk.usedBytes < 64 * MIB);
    assert.ok(Math.abs(stats.disk.usedBytes - await dfUsed(sandbox.paths.volume)) < 2 * MIB);
  }
  // The library's own path, with its egress record and ownership check, still answers.
  const again = await sandbox.stats();
  assert.equal(again.containerId, id);
  assert.ok(again.memory !== null && again.memory.currentBytes < HOME_CONFIG.memoryBytes);
});

liveTest("ps --stats and top --once --json report each sandbox's costs", async (docker) => {
  await using home = await tempHome(docker, HOME_CONFIG);
  const sandbox = home.open("stats-cli");
  const id = await ready(sandbox);
  const ps = await home.cli(["ps", "--stats", "--json"]);
  assert.equal(ps.code, 0, ps.stderr);
  const listed = JSON.parse(ps.stdout).sandboxes as { containerId: string; stats: unknown }[];
  const mine = listed.find((row) => row.containerId === id)?.stats as {
    memory: { currentBytes: number; limitBytes: number };
    cpu: { share: number | null };
  };
  assert.equal(mine.memory.limitBytes, HOME_CONFIG.memoryBytes);
  assert.ok(mine.memory.currentBytes > 0 && mine.cpu.share !== null);
  const top = await home.cli(["top", "--once", "--json"]);
  assert.equal(top.code, 0, top.stderr);
  assert.equal(top.stdout.trim().split("\n").length, 1, "one object with --once");
  const screen = JSON.parse(top.stdout) as { sandboxes: { stats: { pids: { limit: number } } }[] };
  assert.equal(screen.sandboxes[0]?.stats.pids.limit, HOME_CONFIG.pidsLimit);
  const table = await home.cli(["ps", "--stats"]);
  assert.match(table.stdout.split("\n")[0]!, /CPU%\s+CPU TIME\s+MEM\s+PEAK\s+PIDS\s+DISK/);
});

liveTest("top refreshes until Ctrl-C and then exits 0", async (docker) => {
  await using home = await tempHome(docker, HOME_CONFIG);
  const self = selfCommand();
  const child = new Deno.Command(self.executable, {
    args: [...self.prefix, "top", "--interval", "0.2"],
    env: { WAFFLE_HOME: home.home },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const reader = child.stdout.getReader();
  let seen = "";
  // Two screens: it refreshes.
  for (let reads = 0; reads < 200 && seen.split("TENANT").length < 3; reads++) {
    const chunk = await reader.read();
    if (chunk.done) break;
    seen += text(chunk.value);
  }
  assert.ok(seen.split("TENANT").length >= 3, seen);
  child.kill("SIGINT");
  reader.releaseLock();
  const out = await child.output();
  assert.equal(out.code, 0, text(out.stderr));
});

liveTest(
  "stats() of a sandbox attached to egress counts its connections and bytes",
  async (docker) => {
    await using world = await egressHome(docker, {
      config: (w) => ({ egress: [w.entry("api")] }),
    });
    const sandbox = world.home.open("stats-egress");
    const api = `https://${world.entry("api")}/bytes/30000`;
    const denied = `https://${world.entry("denied")}/`;
    const ok = await egressSh(sandbox, `curl -sf -o /dev/null ${api}`);
    assert.equal(ok.code, 0, ok.stderr);
    assert.notEqual((await egressSh(sandbox, `curl -sf -o /dev/null ${denied}`)).code, 0);
    // Counted when each connection closes, as its audit line is written.
    let stats = await sandbox.stats();
    for (let tries = 0; tries < 50 && (stats.network?.denied ?? 0) < 1; tries++) {
      await delay(100);
      stats = await sandbox.stats();
    }
    const lines = world.audit().filter((line) => line.user === "stats-egress");
    assert.ok(stats.network !== null, stats.problems.join("; "));
    assert.equal(stats.network.allowed, 1);
    assert.equal(stats.network.denied, 1);
    assert.equal(stats.network.bytesUp, lines.reduce((sum, line) => sum + line.bytesUp, 0));
    assert.equal(stats.network.bytesDown, lines.reduce((sum, line) => sum + line.bytesDown, 0));
    assert.ok(stats.network.bytesDown >= 30_000);
  },
);
