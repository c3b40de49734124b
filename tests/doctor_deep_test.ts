/**
 * `waffle doctor --deep` as a whole process: the evidence header, every
 * check passed with its figures and the verdict (bind mounts, and with
 * `--volume` named volumes), nothing left behind (no container or volume of
 * the run, no temporary directory), a Ctrl-C in the middle that still cleans
 * up and exits 130, the skip without a daemon, and the same run from the
 * installed artefact (`scripts/install.sh`). An image whose `/bin/sh` fills
 * its VOLUME gets a tmpfs there, never a volume on the host's disk; one
 * that declares a VOLUME no tmpfs may cover (`/etc`) is not supported, with
 * the reason, before anything is made; and a run killed outright is swept,
 * with its containers' volumes, by the next.
 *
 * Each child gets its own TMPDIR (where the run makes its throwaway homes)
 * and WAFFLE_HOME, so "nothing left" is checked on what this test owns.
 *
 * @module
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import {
  CERTIFY_LABEL,
  type CertifyReport,
  checkLabel,
  describeMount,
  formatReport,
  hostMountOf,
  type MountEntry,
  verdictOf,
} from "../lib/certify/mod.ts";
import { skippedCheck } from "../lib/certify/check.ts";
import { CERTIFY_OWNER_LABEL } from "../lib/certify/owner.ts";
import { stressFailures, type StressFigures } from "../lib/certify/stress.ts";
import { selfCommand } from "../lib/config/self.ts";
import { sha256Hex } from "../lib/digest.ts";
import type { DockerClient } from "../lib/docker/mod.ts";
import { EXIT_CANCELLED, EXIT_FAILURE, EXIT_WAFFLE } from "../lib/exit_codes.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";
import { liveTest } from "./_docker_gate.ts";
import { recordDockerEvents, type VolumeMount, volumesMountedInto } from "./_docker_events.ts";
import { text, waitFor } from "./_helpers.ts";
import { dockerCli, removeHomeVolumes } from "./_sandbox_helpers.ts";

const INSTALL = fileURLToPath(new URL("../scripts/install.sh", import.meta.url));

/** A child's own TMPDIR and WAFFLE_HOME, removed afterwards. */
interface Scratch {
  tmp: string;
  home: string;
  env: Record<string, string>;
  [Symbol.asyncDispose](): Promise<void>;
}

async function scratch(): Promise<Scratch> {
  const tmp = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-deep-tmp-" }));
  const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-deep-home-" }));
  return {
    tmp,
    home,
    env: { TMPDIR: tmp, WAFFLE_HOME: home, NO_COLOR: "1", DENO_NO_UPDATE_CHECK: "1" },
    [Symbol.asyncDispose]: async () => {
      for (const dir of [tmp, home]) await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
}

function spawn(
  argv: string[],
  env: Record<string, string>,
): Deno.ChildProcess {
  return new Deno.Command(argv[0]!, {
    args: argv.slice(1),
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

/** `waffle` from this checkout. */
function sourceWaffle(): string[] {
  const self = selfCommand();
  return [self.executable, ...self.prefix];
}

async function run(
  argv: string[],
  env: Record<string, string>,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await spawn(argv, env).output();
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

// What the run may have left: its containers (by label, or by a state root
// under the child's TMPDIR), its volumes, and files in the TMPDIR.
async function leftovers(
  docker: DockerClient,
  options: { tmp: string; runId: string | undefined },
): Promise<string[]> {
  const containers = await docker.listContainers({ all: true });
  const ours = containers.filter((c) =>
    (options.runId !== undefined && c.Labels[CERTIFY_LABEL] === options.runId) ||
    (c.Labels[LABELS.state] ?? "").startsWith(`${options.tmp}/`)
  ).map((c) => `container ${c.Names.join(",")}`);
  const volumes = options.runId === undefined
    ? []
    : (await docker.listVolumes({ labels: [`${CERTIFY_LABEL}=${options.runId}`] }))
      .map((v) => `volume ${v.Name}`);
  const files = [...Deno.readDirSync(options.tmp)].map((entry) => `file ${entry.name}`);
  const mounts = Deno.readTextFileSync("/proc/self/mounts").split("\n")
    .filter((line) => line.includes(options.tmp)).map((line) => `mount ${line}`);
  return [...ours, ...volumes, ...files, ...mounts];
}

function parseReport(stdout: string): CertifyReport {
  return JSON.parse(stdout) as CertifyReport;
}

function assertSupported(report: CertifyReport, mounts: string[]): void {
  const header = report.header;
  assert.ok(header.docker !== null, "no daemon facts");
  for (const key of ["server", "api", "operatingSystem", "architecture", "kernel"] as const) {
    assert.ok(header.docker[key] !== "", `header.docker.${key} is empty`);
  }
  assert.ok(header.docker.storageDriver !== "" && header.docker.cgroupDriver !== "");
  assert.match(header.waffle.version, /^\d+\.\d+\.\d+/);
  assert.ok(header.image.id?.startsWith("sha256:"), JSON.stringify(header.image));
  for (const mount of mounts) {
    assert.ok(
      header.queueMounts[mount as keyof typeof header.queueMounts] !== undefined,
      `no mount type for ${mount}: ${JSON.stringify(header.queueMounts)}`,
    );
  }
  const expected = [
    ...mounts.flatMap((mount) => [`stress (${mount})`, `kill mid-write (${mount})`]),
    "fork bomb",
  ].sort();
  const labels = report.checks.map((c) =>
    c.mount === undefined ? c.name : `${c.name} (${c.mount})`
  );
  assert.deepEqual([...labels].sort(), expected);
  for (const check of report.checks) {
    assert.equal(check.status, "passed", `${check.name}: ${check.summary}`);
    assert.ok(check.figures !== undefined && check.figures !== null, `${check.name}: no figures`);
  }
  const stress = report.checks.find((c) => c.name === "stress")?.figures as StressFigures;
  assert.ok(stress.results > 0 && stress.results === stress.requests);
  assert.equal(report.verdict.status, "supported", report.verdict.line);
  assert.deepEqual(report.cleanup.problems, []);
  assert.ok(report.cleanup.containers.length >= 1, JSON.stringify(report.cleanup));
  assert.ok(report.cleanup.dirs.length >= 1, JSON.stringify(report.cleanup));
}

liveTest(
  "doctor --deep --seconds 5 --json: the header, every check passed with figures, supported, nothing left",
  async (docker) => {
    await using dirs = await scratch();
    const out = await run(
      [...sourceWaffle(), "doctor", "--deep", "--seconds", "5", "--json"],
      dirs.env,
    );
    assert.equal(out.code, 0, `${out.stdout}\n${out.stderr}`);
    const report = parseReport(out.stdout);
    assertSupported(report, ["bind mount"]);
    assert.match(report.header.queueMounts["bind mount"] ?? "", /^bind mount \(host filesystem/);
    assert.match(out.stderr, /doctor --deep: stress \(bind mount\) \d+\/5 s, \d+ results/);
    assert.deepEqual(await leftovers(docker, { tmp: dirs.tmp, runId: report.runId }), []);
  },
);

liveTest(
  "doctor --deep --volume: the stress and the kill check also pass with the queue on named volumes",
  async (docker) => {
    await using dirs = await scratch();
    const out = await run(
      [...sourceWaffle(), "doctor", "--deep", "--seconds", "5", "--volume", "--json"],
      dirs.env,
    );
    assert.equal(out.code, 0, `${out.stdout}\n${out.stderr}`);
    const report = parseReport(out.stdout);
    assertSupported(report, ["bind mount", "volume"]);
    assert.match(report.header.queueMounts.volume ?? "", /^Docker named volume/);
    assert.equal(report.cleanup.volumes.length, 2, JSON.stringify(report.cleanup));
    assert.deepEqual(await leftovers(docker, { tmp: dirs.tmp, runId: report.runId }), []);
  },
);

liveTest(
  "doctor --deep: Ctrl-C in the middle of the stress removes everything and exits 130",
  async (docker) => {
    await using dirs = await scratch();
    const child = spawn(
      [...sourceWaffle(), "doctor", "--deep", "--seconds", "60", "--volume"],
      dirs.env,
    );
    const stdout = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    const stderr = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
    let seen = "";
    // Until the stress has started: the sandbox's container exists.
    while (!/stress \(bind mount\) \d+\/60 s/.test(seen)) {
      const { value, done } = await stderr.read();
      assert.ok(!done, `the run ended before the stress: ${seen}`);
      seen += value;
    }
    const runId = /run ([0-9a-f-]+) /.exec(seen)?.[1];
    assert.ok(runId !== undefined, seen);
    assert.ok((await leftovers(docker, { tmp: dirs.tmp, runId })).length > 0, "nothing to clean");
    child.kill("SIGINT");
    const drain = async (reader: ReadableStreamDefaultReader<string>): Promise<string> => {
      let all = "";
      for (let next = await reader.read(); !next.done; next = await reader.read()) {
        all += next.value;
      }
      return all;
    };
    const [status, rest, printed] = await Promise.all([child.status, drain(stderr), drain(stdout)]);
    assert.equal(status.code, EXIT_CANCELLED, `${seen}${rest}`);
    assert.match(rest, /interrupted: removing/);
    assert.match(rest, /removed [1-9]\d* containers/);
    assert.equal(printed, "", "no report after an interrupt");
    assert.deepEqual(await leftovers(docker, { tmp: dirs.tmp, runId }), []);
  },
);

/** The musl image `scripts/build_images.sh` builds: a static busybox is its `/bin/sh`. */
const MUSL = "waffle-musl:latest";
/** What the hostile `/bin/sh` writes into `/data`. */
const FILL_BYTES = 100 * 1024 * 1024;
// Fills /data once per container, then does what it was asked.
const FILLING_SH = "#!/bin/busybox sh\n" +
  `[ -e /data/fill ] || /bin/busybox dd if=/dev/zero of=/data/fill bs=1048576 count=${
    FILL_BYTES / 1048576
  } 2>/dev/null\n` +
  'exec /bin/busybox sh "$@"\n';

/** A test image, removed with its tag afterwards. */
interface TestImage {
  tag: string;
  [Symbol.asyncDispose](): Promise<void>;
}

// The musl image with FILLING_SH as /bin/sh, a world-writable /data, and
// `volumes` declared; built offline (FROM a local image, no registry).
async function fillingImage(volumes: string[]): Promise<TestImage> {
  const tag = `waffle-test-fill-${crypto.randomUUID().slice(0, 8)}:latest`;
  const install =
    'rm /bin/sh && printf %s "$0" > /bin/sh && chmod 755 /bin/sh && mkdir -m 777 /data';
  const dockerfile = `FROM ${MUSL}\n` +
    `RUN ${JSON.stringify(["/bin/busybox", "sh", "-c", install, FILLING_SH])}\n` +
    `VOLUME ${JSON.stringify(volumes)}\n`;
  const built = await dockerCli(["build", "-q", "-t", tag, "-"], dockerfile);
  assert.equal(built.code, 0, built.stderr);
  // The image does what it claims: its sh leaves FILL_BYTES in /data (a volume `--rm` removes).
  const probe = await dockerCli([
    "run",
    "--rm",
    "--user",
    "10001:10001",
    "--entrypoint",
    "/bin/sh",
    tag,
    "-c",
    "/bin/busybox stat -c %s /data/fill",
  ]);
  assert.equal(probe.stdout.trim(), String(FILL_BYTES), probe.stderr);
  return {
    tag,
    [Symbol.asyncDispose]: async () => void await dockerCli(["image", "rm", "-f", tag]),
  };
}

// The musl image declaring VOLUME /etc, which no capped tmpfs may cover:
// waffle refuses it, an older waffle gave each container an anonymous volume.
async function etcVolumeImage(): Promise<TestImage> {
  const tag = `waffle-test-etc-${crypto.randomUUID().slice(0, 8)}:latest`;
  const built = await dockerCli(["build", "-q", "-t", tag, "-"], `FROM ${MUSL}\nVOLUME /etc\n`);
  assert.equal(built.code, 0, built.stderr);
  return {
    tag,
    [Symbol.asyncDispose]: async () => void await dockerCli(["image", "rm", "-f", tag]),
  };
}

// The anonymous volumes mounted into a container.
async function anonymousVolumesOf(id: string): Promise<string[]> {
  const mounts = await dockerCli(["inspect", "--format", "{{json .Mounts}}", id]);
  const list = JSON.parse(mounts.stdout) as { Type: string; Name?: string }[];
  return list.filter((m) => m.Type === "volume").map((m) => m.Name ?? "?");
}

// Which containers are the run's: its label, or a state root under the child's TMPDIR.
function ofRun(
  options: { tmp: string; runId: string },
): (labels: Record<string, string>) => boolean {
  return (labels) =>
    labels[CERTIFY_LABEL] === options.runId ||
    (labels[LABELS.state] ?? "").startsWith(`${options.tmp}/`);
}

// One line per volume Docker gave the run's containers: where, and whether
// (with how many bytes) it is still on the host.
async function describeVolumes(docker: DockerClient, mounts: VolumeMount[]): Promise<string[]> {
  const lines: string[] = [];
  for (const mount of mounts) {
    const volume = await docker.inspectVolume(mount.volume);
    const du = volume === null
      ? undefined
      : await new Deno.Command("du", { args: ["-sb", volume.Mountpoint], stdout: "piped" })
        .output();
    const left = du === undefined
      ? "removed"
      : `left behind, ${text(du.stdout).split("\t")[0]} bytes`;
    lines.push(`volume ${mount.volume} at ${mount.destination} of ${mount.container}: ${left}`);
  }
  return lines;
}

// SIGKILL, unless it has exited already.
function stop(child: Deno.ChildProcess): void {
  try {
    child.kill("SIGKILL");
  } catch {
    // Gone already.
  }
}

// What a failed run of these tests must not leave on the shared daemon: the
// run's containers with their volumes, the rigs' quota mounts, and `volumes`.
async function removeRun(
  docker: DockerClient,
  options: { tmp: string; runId: string | undefined; volumes: string[] },
): Promise<void> {
  const ours = ofRun({ tmp: options.tmp, runId: options.runId ?? "-" });
  for (const container of await docker.listContainers({ all: true })) {
    if (ours(container.Labels)) {
      await docker.removeContainer(container.Id, { force: true, volumes: true });
    }
  }
  for (const entry of Deno.readDirSync(options.tmp)) {
    if (entry.name.startsWith("waffle-certify-")) {
      await removeHomeVolumes(`${options.tmp}/${entry.name}`);
    }
  }
  for (const name of options.volumes) await docker.removeVolume(name).catch(() => false);
}

liveTest(
  "doctor --deep with an image whose /bin/sh fills its VOLUME: a tmpfs there, no volume made or left",
  async (docker) => {
    await using image = await fillingImage(["/data"]);
    await using dirs = await scratch();
    await Deno.writeTextFile(`${dirs.home}/waffle.toml`, `[sandbox]\nimage = "${image.tag}"\n`);
    const before = new Set((await docker.listVolumes()).map((v) => v.Name));
    const events = recordDockerEvents();
    const out = await run(
      [...sourceWaffle(), "doctor", "--deep", "--seconds", "1", "--json"],
      dirs.env,
    );
    const record = await events.stop();
    const report = parseReport(out.stdout);
    const ours = ofRun({ tmp: dirs.tmp, runId: report.runId });
    const mounts = volumesMountedInto(record, ours);
    try {
      // Every container of the run was seen: the sandbox and both fork bomb phases.
      const created = record.filter((e) =>
        e.Type === "container" && e.Action === "create" && ours(e.Actor.Attributes)
      );
      assert.ok(created.length >= 3, `${created.length} containers of the run`);
      assert.deepEqual(await describeVolumes(docker, mounts), []);
      const left = (await docker.listVolumes()).filter((v) => !before.has(v.Name))
        .filter((v) => mounts.some((m) => m.volume === v.Name));
      assert.deepEqual(left, []);
      assert.equal(out.code, 0, `${out.stdout}\n${out.stderr}`);
      assert.equal(report.verdict.status, "supported", report.verdict.line);
      assert.deepEqual(await leftovers(docker, { tmp: dirs.tmp, runId: report.runId }), []);
    } finally {
      await removeRun(docker, {
        ...dirs,
        runId: report.runId,
        volumes: mounts.map((m) => m.volume),
      });
    }
  },
);

liveTest(
  "doctor --deep killed outright: the next run removes its containers and sandbox, and an older run's container with its volume",
  async (docker) => {
    await using image = await fillingImage(["/data"]);
    await using legacy = await etcVolumeImage();
    await using dirs = await scratch();
    await Deno.writeTextFile(`${dirs.home}/waffle.toml`, `[sandbox]\nimage = "${image.tag}"\n`);
    const child = spawn([...sourceWaffle(), "doctor", "--deep", "--seconds", "1"], dirs.env);
    const stderr = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
    let seen = "";
    let runId: string | undefined;
    const volumes: string[] = [];
    try {
      while (!/fork bomb: a bounded loop/.test(seen)) {
        const { value, done } = await stderr.read();
        assert.ok(!done, `the run ended before the fork bomb: ${seen}`);
        seen += value;
      }
      runId = /run ([0-9a-f-]+) /.exec(seen)?.[1];
      assert.ok(runId !== undefined, seen);
      const label = `${CERTIFY_LABEL}=${runId}`;
      await waitFor(
        async () => (await docker.listContainers({ all: true, labels: [label] })).length > 0,
        { timeoutMs: 60_000, what: "the fork bomb's container" },
      );
      stop(child);
      await child.status;
      const dead = await leftovers(docker, { tmp: dirs.tmp, runId });
      let owner: string | undefined;
      const killed: string[] = [];
      for (const container of await docker.listContainers({ all: true })) {
        if (!ofRun({ tmp: dirs.tmp, runId })(container.Labels)) continue;
        owner ??= container.Labels[CERTIFY_OWNER_LABEL];
        killed.push(...await anonymousVolumesOf(container.Id));
      }
      volumes.push(...killed);
      assert.ok(dead.some((line) => line.startsWith("container ")), dead.join("\n"));
      // Its VOLUME was a tmpfs: the killed run's containers hold no volume.
      assert.deepEqual(killed, [], "volumes of the killed run's containers");
      // What a run of an older waffle, which gave an image's /etc an
      // anonymous volume, left under the same dead owner.
      assert.ok(owner !== undefined, "the killed run's containers name no owner");
      const planted = await dockerCli([
        "create",
        "--label",
        label,
        "--label",
        `${CERTIFY_OWNER_LABEL}=${owner}`,
        legacy.tag,
        "true",
      ]);
      assert.equal(planted.code, 0, planted.stderr);
      volumes.push(...await anonymousVolumesOf(planted.stdout.trim()));
      assert.equal(volumes.length, 1, "the older run's container has no volume");

      const events = recordDockerEvents();
      const next = await run(
        [...sourceWaffle(), "doctor", "--deep", "--seconds", "1", "--json"],
        dirs.env,
      );
      const record = await events.stop();
      const report = parseReport(next.stdout);
      const own = volumesMountedInto(record, ofRun({ tmp: dirs.tmp, runId: report.runId }));
      volumes.push(...own.map((m) => m.volume));
      assert.deepEqual(await leftovers(docker, { tmp: dirs.tmp, runId }), []);
      const kept: string[] = [];
      for (const name of volumes) if (await docker.inspectVolume(name) !== null) kept.push(name);
      assert.deepEqual(kept, [], "the older run's volume, or one of the next run's");
      assert.deepEqual(own, [], "the next run's containers got volumes");
      assert.match(next.stderr, new RegExp(`removed what runs that died left \\(.*${runId}`));
      assert.deepEqual(await leftovers(docker, { tmp: dirs.tmp, runId: report.runId }), []);
    } finally {
      stop(child);
      await child.status;
      await stderr.cancel();
      await child.stdout.cancel();
      await removeRun(docker, { ...dirs, runId, volumes });
    }
  },
);

liveTest(
  "doctor --deep with an image that declares VOLUME /etc: not supported, the reason named, no container made; doctor names it too",
  async (docker) => {
    await using image = await etcVolumeImage();
    await using dirs = await scratch();
    await Deno.writeTextFile(`${dirs.home}/waffle.toml`, `[sandbox]\nimage = "${image.tag}"\n`);
    const events = recordDockerEvents();
    const out = await run(
      [...sourceWaffle(), "doctor", "--deep", "--seconds", "1", "--json"],
      dirs.env,
    );
    const plain = await run([...sourceWaffle(), "doctor"], dirs.env);
    const record = await events.stop();
    const report = parseReport(out.stdout);
    const ours = ofRun({ tmp: dirs.tmp, runId: report.runId });
    const mounts = volumesMountedInto(record, ours);
    const reason = `Image '${image.tag}' declares VOLUME '/etc', which waffle cannot cover ` +
      "with a capped tmpfs (a system directory): rebuild the image without it";
    try {
      assert.equal(
        report.verdict.status,
        "not supported",
        `${report.verdict.line}; ${(await describeVolumes(docker, mounts)).join("; ")}`,
      );
      assert.equal(out.code, EXIT_FAILURE, out.stderr);
      assert.ok(report.verdict.line.includes(reason), report.verdict.line);
      assert.deepEqual(report.checks.map(checkLabel), [
        "stress (bind mount)",
        "kill mid-write (bind mount)",
        "fork bomb",
      ]);
      for (const check of report.checks) {
        assert.equal(check.status, "failed", check.name);
        assert.deepEqual(check.failures, [{ mode: "image", detail: reason }]);
      }
      const created = record.filter((e) =>
        e.Type === "container" && e.Action === "create" && ours(e.Actor.Attributes)
      );
      assert.deepEqual(created.map((e) => e.Actor.Attributes.name), []);
      assert.deepEqual(mounts, []);
      // `waffle doctor`'s image row fails with the same line.
      assert.equal(plain.code, EXIT_FAILURE, plain.stdout);
      const row = plain.stdout.split("\n").find((line) => /^FAIL\s+runner image\s/.test(line));
      assert.ok(row?.endsWith(` ${reason}`), plain.stdout);
      assert.deepEqual(await leftovers(docker, { tmp: dirs.tmp, runId: report.runId }), []);
    } finally {
      await removeRun(docker, {
        ...dirs,
        runId: report.runId,
        volumes: mounts.map((m) => m.volume),
      });
    }
  },
);

Deno.test("doctor --deep without a daemon: every check skipped, not certified, exit 125", async () => {
  await using dirs = await scratch();
  const env = { ...dirs.env, DOCKER_HOST: "unix:///nonexistent.sock" };
  const json = await run([...sourceWaffle(), "doctor", "--deep", "--seconds", "5", "--json"], env);
  assert.equal(json.code, EXIT_WAFFLE, json.stderr);
  const report = parseReport(json.stdout);
  assert.equal(report.header.docker, null);
  assert.match(report.header.dockerUnavailable ?? "", /nonexistent\.sock/);
  assert.ok(report.checks.length >= 3);
  for (const check of report.checks) {
    assert.equal(check.status, "skipped", check.name);
    assert.match(check.summary, /^skipped: no Docker daemon/);
  }
  assert.equal(report.verdict.status, "not certified");
  assert.match(report.verdict.line, /^not certified: no Docker daemon/);
  const plain = await run([...sourceWaffle(), "doctor", "--deep"], env);
  assert.equal(plain.code, EXIT_WAFFLE);
  assert.match(plain.stdout, /^docker\s+unavailable: /m);
  assert.match(plain.stdout, /^SKIP\s+stress \(bind mount\)/m);
  assert.match(plain.stdout, /^verdict: not certified: no Docker daemon/m);
  assert.ok(!/^PASS/m.test(plain.stdout), plain.stdout);
});

Deno.test("doctor --deep --seconds: a value that is not a whole number of seconds is refused", async () => {
  for (const bad of ["0", "-3", "1.5", "soon", "99999"]) {
    const out = await run([...sourceWaffle(), "doctor", "--deep", `--seconds=${bad}`], {});
    assert.equal(out.code, EXIT_WAFFLE, bad);
    assert.equal(out.stderr.trim().split("\n").length, 1, out.stderr);
    assert.ok(out.stderr.includes(`'${bad}'`), out.stderr);
  }
  const alone = await run([...sourceWaffle(), "doctor", "--seconds", "5"], {});
  assert.equal(alone.code, EXIT_WAFFLE);
  assert.match(alone.stderr, /'--seconds' needs '--deep'/);
});

Deno.test("doctor --deep verdict: a failure names its mode, a skip is never a pass", () => {
  const header: CertifyReport["header"] = {
    docker: {
      endpoint: "/var/run/docker.sock",
      server: "27.0.0",
      api: "1.46",
      operatingSystem: "Docker Desktop",
      osType: "linux",
      architecture: "aarch64",
      kernel: "6.10.0-linuxkit",
      storageDriver: "overlayfs",
      cgroupDriver: "cgroupfs",
      cgroupVersion: "2",
      desktop: true,
      rootless: false,
    },
    dockerUnavailable: null,
    endpoint: "/var/run/docker.sock",
    host: { os: "darwin", arch: "aarch64", kernel: "24.0.0" },
    queueMounts: { "bind mount": "VirtioFS (Docker Desktop file sharing)" },
    image: { ref: "waffle-runner:latest", id: "sha256:abc" },
    waffle: { version: "0.1.0", kind: "source checkout", path: "/src", digest: undefined },
  };
  const figures: StressFigures = {
    seconds: 30,
    elapsedMs: 30_000,
    submitters: 8,
    requests: 100,
    distinctToolUseIds: 100,
    results: 100,
    perSecond: 3,
    errors: 3,
    busyErrors: 3,
    firstErrors: ["d0-1: database is locked"],
    mismatches: 0,
    firstMismatches: [],
    heartbeat: {
      samples: 300,
      beats: 10,
      maxGapMs: 6000,
      maxSeqStep: 3,
      unreadable: 0,
      maxSampleIntervalMs: 100,
    },
    rowsCollected: true,
    integrity: { inbound: "ok", outbound: "ok" },
    containerRunning: true,
    restartCount: 0,
    sameRunner: true,
  };
  const failures = stressFailures(figures);
  assert.deepEqual(failures.map((f) => f.mode), ["busy", "heartbeat"]);
  const failed = {
    name: "stress",
    mount: "bind mount" as const,
    status: "failed" as const,
    ms: 30_000,
    summary: "…",
    failures,
    figures,
  };
  const verdict = verdictOf([failed], header);
  assert.equal(verdict.status, "not supported");
  assert.match(verdict.line, /lock exclusion \/ SQLITE_BUSY storm in stress \(bind mount\)/);
  assert.match(verdict.line, /stale page cache \/ missed heartbeats/);
  const skipped = verdictOf(
    [skippedCheck("stress", { mount: "volume", reason: "unreachable" })],
    header,
  );
  assert.equal(skipped.status, "not certified");
  const report: CertifyReport = {
    runId: "r",
    header,
    checks: [failed],
    verdict,
    cleanup: { containers: [], volumes: [], dirs: [], problems: [] },
  };
  const lines = formatReport(report);
  assert.match(
    lines,
    /^docker\s+server 27\.0\.0 \(API 1\.46\), aarch64, overlayfs, cgroup cgroupfs v2/m,
  );
  assert.match(lines, /^docker os\s+Docker Desktop \(linux\), kernel 6\.10\.0-linuxkit/m);
  assert.match(lines, /^queue \(bind mount\)\s+VirtioFS/m);
  assert.match(lines, /^FAIL\s+stress \(bind mount\)/m);
  assert.match(lines, /^verdict: not supported: /m);
});

Deno.test("doctor --deep mount type: Docker Desktop's file sharing by its filesystem, else the host's", () => {
  const entry = (fsType: string, source: string): MountEntry => ({
    mountPoint: "/queue/outbound",
    fsType,
    source,
  });
  const inside = (fsType: string, source = "x") => ({
    inbound: entry(fsType, source),
    outbound: entry(fsType, source),
  });
  const none = { inbound: undefined, outbound: undefined };
  for (
    const [fsType, named] of [["virtiofs", "VirtioFS"], ["fakeowner", "VirtioFS"], [
      "fuse.grpcfuse",
      "gRPC-FUSE",
    ]]
  ) {
    assert.equal(
      describeMount("bind mount", { inside: inside(fsType!), host: none }),
      `${named} (Docker Desktop file sharing)`,
    );
  }
  const host = { inbound: entry("ext4", "/dev/vda"), outbound: entry("xfs", "/dev/loop3") };
  assert.equal(
    describeMount("bind mount", { inside: inside("ext4", "/dev/vda"), host }),
    "bind mount (host filesystem: inbound ext4 on /dev/vda, outbound xfs on /dev/loop3)",
  );
  assert.equal(
    describeMount("volume", { inside: inside("ext4", "/dev/vda"), host: none }),
    "Docker named volume (ext4 on /dev/vda in the daemon's filesystem)",
  );
  // This host's own mount table answers for a directory on it.
  assert.ok(hostMountOf(Deno.cwd())?.fsType);
});

liveTest(
  "doctor --deep from the installed artefact: the header names it and every check passes",
  async (docker) => {
    await using dirs = await scratch();
    const prefix = await Deno.makeTempDir({ prefix: "waffle-deep-prefix-" });
    try {
      const installed = await run(["bash", INSTALL, "--prefix", prefix, "--no-docker"], {
        WAFFLE_INSTALL_BUNDLE: "1",
      });
      assert.equal(installed.code, 0, installed.stderr);
      // The header names the build's entry and its digest (over SHA256SUMS: every file).
      const build = `${prefix}/lib/waffle/${
        (await Deno.readTextFile(`${prefix}/lib/waffle/artefact`)).trim()
      }`;
      const artefact = `${build}/waffle.js`;
      const digest = sha256Hex(await Deno.readFile(`${build}/SHA256SUMS`));
      const env = { ...dirs.env, PATH: `${prefix}/bin:/usr/bin:/bin` };
      const out = await run(["waffle", "doctor", "--deep", "--seconds", "5"], env);
      assert.equal(out.code, 0, `${out.stdout}\n${out.stderr}`);
      assert.match(out.stdout, /^docker\s+server .*\(API [\d.]+\), \S+, \S+, cgroup /m);
      assert.match(out.stdout, /^docker os\s+.+, kernel \S+/m);
      assert.match(out.stdout, /^queue \(bind mount\)\s+bind mount/m);
      assert.ok(
        out.stdout.includes(`bundled artefact ${artefact}, sha256 ${digest}`),
        out.stdout,
      );
      for (const check of ["stress (bind mount)", "kill mid-write (bind mount)", "fork bomb"]) {
        assert.match(out.stdout, new RegExp(`^PASS\\s+${check.replace(/[()]/g, "\\$&")}`, "m"));
      }
      assert.match(out.stdout, /^verdict: supported/m);
      const runId = /run ([0-9a-f-]+) /.exec(out.stderr)?.[1];
      assert.deepEqual(await leftovers(docker, { tmp: dirs.tmp, runId }), []);
    } finally {
      await Deno.remove(prefix, { recursive: true }).catch(() => {});
    }
  },
);
