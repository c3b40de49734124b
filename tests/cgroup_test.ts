/**
 * The cgroup reader (`lib/lifecycle/cgroup.ts`) on the layouts it must
 * know, given as text and temporary directories: cgroup v1 and v2,
 * cgroupfs and systemd drivers, a cgroup namespace's mount root, and what
 * it refuses (another container's cgroup, `..`, a counter that is not a
 * whole number, a file over its cap).
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { cgroupDirs, CgroupReadError, readCgroup } from "../lib/lifecycle/cgroup.ts";

const ID = "3f".repeat(32);
const OTHER = "a1".repeat(32);

/** A mountinfo line: id parent major:minor root mountpoint options - type source superoptions. */
function mount(root: string, at: string, type: string, options: string): string {
  return `30 1 0:26 ${root} ${at} rw,nosuid - ${type} ${type} ${options}`;
}

const V1_MOUNTS = [
  mount("/", "/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
  mount("/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
  mount("/", "/sys/fs/cgroup/pids", "cgroup", "rw,pids"),
  mount("/", "/sys/fs/cgroup/unified", "cgroup2", "rw"),
  "31 1 8:1 / / rw - ext4 /dev/sda1 rw",
].join("\n");

const V2_MOUNTS = mount("/", "/sys/fs/cgroup", "cgroup2", "rw,nsdelegate").concat("\n");

Deno.test("cgroupDirs() finds a v1 container's controllers, cpu and cpuacct mounted together", () => {
  const membership = [
    `9:name=systemd:/docker/${ID}`,
    `5:pids:/docker/${ID}`,
    `4:memory:/docker/${ID}`,
    `2:cpu,cpuacct:/docker/${ID}`,
    `0::/docker/${ID}`,
  ].join("\n");
  assert.deepEqual(cgroupDirs({ membership, mounts: V1_MOUNTS, containerId: ID }), {
    cpuacct: `/sys/fs/cgroup/cpu,cpuacct/docker/${ID}`,
    memory: `/sys/fs/cgroup/memory/docker/${ID}`,
    pids: `/sys/fs/cgroup/pids/docker/${ID}`,
  });
});

Deno.test("cgroupDirs() finds a v2 container under the systemd driver, and its own cgroup for a child", () => {
  const scope = `/system.slice/docker-${ID}.scope`;
  for (const path of [scope, `${scope}/init`]) {
    assert.deepEqual(
      cgroupDirs({ membership: `0::${path}\n`, mounts: V2_MOUNTS, containerId: ID }),
      { unified: `/sys/fs/cgroup${scope}` },
    );
  }
});

Deno.test("cgroupDirs() maps a path through a mount whose root is a namespace's cgroup", () => {
  const mounts = mount(`/docker/${ID}`, "/sys/fs/cgroup", "cgroup2", "rw");
  assert.deepEqual(
    cgroupDirs({ membership: `0::/docker/${ID}\n`, mounts, containerId: ID }),
    { unified: "/sys/fs/cgroup" },
  );
  // A path outside the mount's root is not visible through it.
  assert.equal(
    cgroupDirs({ membership: `0::/other/${ID}\n`, mounts, containerId: ID }),
    undefined,
  );
});

Deno.test("cgroupDirs() refuses another container's cgroup and a path with '..'", () => {
  const other = `0::/system.slice/docker-${OTHER}.scope\n`;
  assert.equal(cgroupDirs({ membership: other, mounts: V2_MOUNTS, containerId: ID }), undefined);
  const climbing = `0::/docker/${ID}/../../init.scope\n`;
  assert.equal(cgroupDirs({ membership: climbing, mounts: V2_MOUNTS, containerId: ID }), undefined);
  // A process of the host, in no container.
  assert.equal(
    cgroupDirs({
      membership: "0::/user.slice/session-1.scope\n",
      mounts: V2_MOUNTS,
      containerId: ID,
    }),
    undefined,
  );
});

function writeFiles(dir: string, files: Record<string, string>): void {
  for (const [name, text] of Object.entries(files)) Deno.writeTextFileSync(join(dir, name), text);
}

Deno.test("readCgroup() reads v2 counters, 'max' as no limit", () => {
  const dir = Deno.makeTempDirSync();
  try {
    writeFiles(dir, {
      "cpu.stat": "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
      "memory.current": "1048576\n",
      "memory.peak": "2097152\n",
      "memory.max": "max\n",
      "pids.current": "7\n",
      "pids.max": "64\n",
    });
    const reading = readCgroup({ unified: dir });
    assert.equal(reading.version, 2);
    assert.equal(reading.cpuNs, 1_500_000);
    assert.deepEqual(
      [reading.memoryBytes, reading.memoryPeakBytes, reading.memoryLimitBytes],
      [1048576, 2097152, null],
    );
    assert.deepEqual([reading.pids, reading.pidsLimit], [7, 64]);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("readCgroup() reads v1 counters, the kernel's near-2^63 limit as none, and a missing peak as null", () => {
  const dir = Deno.makeTempDirSync();
  try {
    writeFiles(dir, {
      "cpuacct.usage": "123456789\n",
      "memory.usage_in_bytes": "4096\n",
      "memory.limit_in_bytes": "9223372036854771712\n",
      "pids.current": "3\n",
      "pids.max": "max\n",
    });
    const reading = readCgroup({ cpuacct: dir, memory: dir, pids: dir });
    assert.equal(reading.version, 1);
    assert.equal(reading.cpuNs, 123456789);
    assert.deepEqual(
      [reading.memoryBytes, reading.memoryPeakBytes, reading.memoryLimitBytes],
      [4096, null, null],
    );
    assert.deepEqual([reading.pids, reading.pidsLimit], [3, null]);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("readCgroup() refuses a counter that is not a whole number, or too big to be one", () => {
  for (const text of ["12abc\n", "-5\n", "1e9\n", "99999999999999999999999\n", "\n"]) {
    const dir = Deno.makeTempDirSync();
    try {
      writeFiles(dir, { "memory.current": text });
      assert.throws(() => readCgroup({ unified: dir }), CgroupReadError, JSON.stringify(text));
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  }
});
