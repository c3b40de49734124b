/**
 * Tests of lib/docker: pure helpers always; the client against a live daemon
 * through {@linkcode liveTest} (ignored with a reason when Docker is unusable,
 * failing when `WAFFLE_REQUIRE_DOCKER=1`).
 *
 * @module
 */
import {
  type ContainerCreateBody,
  demuxDockerStream,
  DockerClient,
  DockerConflictError,
  DockerNotFoundError,
  parseDockerHost,
} from "../lib/docker/mod.ts";
import { DockerError } from "../lib/errors.ts";
import { EXIT_WAFFLE } from "../lib/exit_codes.ts";
import { liveTest } from "./_docker_gate.ts";

const IMAGE = Deno.env.get("WAFFLE_IMAGE") ?? "waffle-runner:latest";
const TEST_LABEL = "waffle.test";
const decoder = new TextDecoder();

function assert(condition: unknown, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

function assertEquals(actual: unknown, expected: unknown, what: string): void {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`${what}: expected ${e}, got ${a}`);
}

async function assertRejects<E extends Error>(
  fn: () => Promise<unknown>,
  type: new (...args: never[]) => E,
): Promise<E> {
  try {
    await fn();
  } catch (err) {
    if (err instanceof type) return err;
    throw new Error(`Expected ${type.name}, got ${String(err)}`);
  }
  throw new Error(`Expected ${type.name}, but the call resolved`);
}

function uniqueName(prefix: string): string {
  return `${prefix}-${crypto.randomUUID().slice(0, 8)}`;
}

/** A container shaped like a waffle runner: hardened, idle until exec'd into. */
function runnerBody(): ContainerCreateBody {
  return {
    Image: IMAGE,
    Cmd: ["sleep", "300"],
    Labels: { [TEST_LABEL]: "docker_client_test" },
    StopSignal: "SIGTERM",
    HostConfig: {
      Init: true,
      ReadonlyRootfs: true,
      CapDrop: ["ALL"],
      SecurityOpt: ["no-new-privileges"],
      NetworkMode: "none",
      PidsLimit: 64,
      Memory: 128 * 1024 * 1024,
      Tmpfs: { "/tmp": "rw,noexec,nosuid,size=16m" },
    },
  };
}

Deno.test("demuxDockerStream splits stdout and stderr frames", () => {
  const frame = (kind: number, text: string): number[] => {
    const bytes = [...new TextEncoder().encode(text)];
    const n = bytes.length;
    return [kind, 0, 0, 0, (n >>> 24) & 255, (n >>> 16) & 255, (n >>> 8) & 255, n & 255, ...bytes];
  };
  const data = new Uint8Array([
    ...frame(1, "a"),
    ...frame(2, "bc"),
    ...frame(1, "d"),
    ...frame(2, ""),
  ]);
  const { stdout, stderr } = demuxDockerStream(data);
  assertEquals(decoder.decode(stdout), "ad", "stdout");
  assertEquals(decoder.decode(stderr), "bc", "stderr");
  const raw = demuxDockerStream(new TextEncoder().encode("plain tty output"));
  assertEquals(decoder.decode(raw.stdout), "plain tty output", "tty passthrough");
  assertEquals(demuxDockerStream(new Uint8Array()).stdout.length, 0, "empty stream");
});

Deno.test("parseDockerHost accepts unix paths and tcp, rejects ssh", () => {
  assertEquals(parseDockerHost(undefined), {
    kind: "unix",
    socketPath: "/var/run/docker.sock",
  }, "default");
  assertEquals(parseDockerHost("unix:///run/x.sock"), {
    kind: "unix",
    socketPath: "/run/x.sock",
  }, "unix://");
  assertEquals(parseDockerHost("tcp://10.0.0.1:2375"), {
    kind: "tcp",
    host: "10.0.0.1",
    port: 2375,
    protocol: "http",
  }, "tcp://");
  let threw = false;
  try {
    parseDockerHost("ssh://me@host");
  } catch (err) {
    threw = err instanceof DockerError && err.message === "Unsupported Docker host 'ssh://me@host'";
  }
  assert(threw, "ssh:// should be rejected with a DockerError");
});

Deno.test("a client on a missing socket reports the daemon unavailable", async () => {
  const path = `/tmp/waffle-no-such-docker-${crypto.randomUUID()}.sock`;
  const docker = new DockerClient({ host: `unix://${path}`, timeoutMs: 5000 });
  const err = await assertRejects(() => docker.ping(), DockerError);
  assert(
    err.message.startsWith(`Docker daemon unavailable at '${path}': `),
    `unexpected message: ${err.message}`,
  );
  assertEquals(err.exitCode, EXIT_WAFFLE, "exit code");
  assertEquals(err.status, undefined, "status");
  assert(!err.message.includes("\n") && !err.message.endsWith("."), "one line, no period");
});

Deno.test("a daemon that never answers times out", async () => {
  const dir = await Deno.makeTempDir({ prefix: "waffle-docker-test-" });
  const path = `${dir}/stalled.sock`;
  const listener = Deno.listen({ transport: "unix", path });
  const held: Deno.Conn[] = [];
  const accepting = (async () => {
    for await (const conn of listener) held.push(conn);
  })();
  try {
    const docker = new DockerClient({ host: path, timeoutMs: 200 });
    const err = await assertRejects(() => docker.version(), DockerError);
    assertEquals(
      err.message,
      `Docker GET /version timed out after 200 ms at '${path}'`,
      "timeout message",
    );
  } finally {
    listener.close();
    await accepting;
    for (const conn of held) conn.close();
    await Deno.remove(dir, { recursive: true });
  }
});

liveTest("docker: ping, version and info", async (docker) => {
  await docker.ping();
  const version = await docker.version();
  assert(version.Version !== "", "Version is empty");
  assert(/^\d+\.\d+$/.test(version.ApiVersion), `odd ApiVersion '${version.ApiVersion}'`);
  assert(
    version.Arch !== "" && version.Os === "linux",
    `odd Arch/Os ${version.Arch}/${version.Os}`,
  );
  const info = await docker.info();
  assert(info.ServerVersion === version.Version, "info and version disagree on the version");
  assert(info.Driver !== "", "storage Driver is empty");
  assert(["cgroupfs", "systemd", "none"].includes(info.CgroupDriver), info.CgroupDriver);
  assert(info.Architecture !== "", "Architecture is empty");
});

liveTest(
  "docker: a named volume is created with labels, listed by them, inspected and removed",
  async (docker) => {
    const name = `waffle-test-volume-${crypto.randomUUID().slice(0, 8)}`;
    const run = crypto.randomUUID();
    try {
      const created = await docker.createVolume(name, { labels: { [TEST_LABEL]: run } });
      assertEquals(created.Name, name, "Name");
      assertEquals(created.Driver, "local", "Driver");
      assert(created.Mountpoint.startsWith("/"), `odd Mountpoint '${created.Mountpoint}'`);
      const listed = await docker.listVolumes({ labels: [`${TEST_LABEL}=${run}`] });
      assertEquals(listed.map((v) => v.Name), [name], "listed by label");
      assertEquals((await docker.inspectVolume(name))?.Labels[TEST_LABEL], run, "label");
    } finally {
      assertEquals(await docker.removeVolume(name), true, "removed");
    }
    assertEquals(await docker.inspectVolume(name), null, "inspect after removal");
    assertEquals(await docker.removeVolume(name), false, "a second removal");
  },
);

liveTest(
  "docker: inspectImage finds the runner image and returns null for a missing one",
  async (docker) => {
    const image = await docker.inspectImage(IMAGE);
    assert(image !== null, `Image '${IMAGE}' not found: run scripts/build_image.sh`);
    assert(image.id.startsWith("sha256:"), `odd image id '${image.id}'`);
    assertEquals(image.labels["waffle.image.contract"], "1", "contract label");
    assertEquals(
      await docker.inspectImage(`waffle-missing-${crypto.randomUUID()}:none`),
      null,
      "missing",
    );
  },
);

liveTest(
  "docker: create, start, inspect, exec, pause, stop and remove a container",
  async (docker) => {
    const name = uniqueName("waffle-test-lifecycle");
    let id = "";
    try {
      id = await docker.createContainer(name, runnerBody());
      assert(/^[0-9a-f]{64}$/.test(id), `odd container id '${id}'`);
      assertEquals(await docker.startContainer(id), true, "first start");
      assertEquals(await docker.startContainer(id), false, "second start is a 304");

      const info = await docker.inspectContainer(name);
      assert(info !== null, "inspect by name returned null");
      assertEquals(info.Id, id, "Id");
      assertEquals(info.Name, `/${name}`, "Name");
      assertEquals(info.State.Status, "running", "State.Status");
      assert(info.State.Running && info.State.Pid > 0, "not running");
      assertEquals(info.Config.Labels[TEST_LABEL], "docker_client_test", "label");
      assertEquals(info.Config.User, "10001:10001", "image USER");
      assertEquals(info.Image, (await docker.inspectImage(IMAGE))?.id, "image id");
      assertEquals(info.HostConfig.ReadonlyRootfs, true, "ReadonlyRootfs");
      assertEquals(info.HostConfig.CapDrop, ["ALL"], "CapDrop");
      assertEquals(info.HostConfig.SecurityOpt, ["no-new-privileges"], "SecurityOpt");
      assertEquals(info.HostConfig.NetworkMode, "none", "NetworkMode");
      assertEquals(info.HostConfig.PidsLimit, 64, "PidsLimit");
      assertEquals(info.HostConfig.Memory, 128 * 1024 * 1024, "Memory");
      assertEquals(info.HostConfig.Init, true, "Init");
      assertEquals(info.HostConfig.Tmpfs, { "/tmp": "rw,noexec,nosuid,size=16m" }, "Tmpfs");

      const result = await docker.exec(id, ["sh", "-c", "echo hi; echo err >&2; exit 3"]);
      assertEquals(result.exitCode, 3, "exit code");
      assertEquals(decoder.decode(result.stdout), "hi\n", "stdout");
      assertEquals(decoder.decode(result.stderr), "err\n", "stderr");

      const opts = await docker.exec(id, ["sh", "-c", "id -u; echo $FOO; pwd"], {
        user: "65534",
        env: ["FOO=bar"],
        workdir: "/tmp",
      });
      assertEquals(decoder.decode(opts.stdout), "65534\nbar\n/tmp\n", "user/env/workdir");

      const big = await docker.exec(id, [
        "sh",
        "-c",
        "head -c 300000 /dev/zero; head -c 70000 /dev/zero >&2",
      ]);
      assertEquals(
        [big.exitCode, big.stdout.length, big.stderr.length],
        [0, 300000, 70000],
        "sizes",
      );

      const listed = await docker.listContainers({ labels: [`${TEST_LABEL}=docker_client_test`] });
      assert(
        listed.some((c) => c.Id === id && c.Names.includes(`/${name}`)),
        "not listed by label",
      );
      const none = await docker.listContainers({
        labels: [`${TEST_LABEL}=${crypto.randomUUID()}`],
      });
      assertEquals(none.length, 0, "unmatched label filter");

      const top = await docker.top(id);
      assert(top.Processes.some((row) => row.join(" ").includes("sleep 300")), "sleep not in top");
      const stats = await docker.stats(id);
      assert(stats.pids >= 1, `pids ${stats.pids}`);

      await docker.pauseContainer(id);
      assertEquals((await docker.inspectContainer(id))?.State.Paused, true, "paused");
      await docker.unpauseContainer(id);
      assertEquals((await docker.inspectContainer(id))?.State.Paused, false, "unpaused");

      assertEquals(await docker.stopContainer(id, { timeoutSeconds: 2 }), true, "stop");
      assertEquals(
        await docker.stopContainer(id, { timeoutSeconds: 2 }),
        false,
        "second stop is a 304",
      );
      const exitCode = await docker.waitContainer(id);
      assertEquals(exitCode, (await docker.inspectContainer(id))?.State.ExitCode, "wait exit code");
      const stopped = await docker.inspectContainer(id);
      assertEquals(stopped?.State.Running, false, "running after stop");

      const notRunning = await assertRejects(() => docker.exec(id, ["true"]), DockerConflictError);
      assertEquals(notRunning.status, 409, "exec in a stopped container");

      assertEquals(await docker.removeContainer(id), true, "remove");
      assertEquals(await docker.removeContainer(id), false, "second remove is a 404");
      assertEquals(await docker.inspectContainer(id), null, "inspect after remove");
    } finally {
      if (id !== "") await docker.removeContainer(id, { force: true });
    }
  },
);

liveTest(
  "docker: removeContainer() takes the anonymous volume of an image's VOLUME with it, unless told not to",
  async (docker) => {
    // waffle-noshell declares VOLUME /data: Docker makes an anonymous volume at create.
    const body: ContainerCreateBody = {
      Image: "waffle-noshell:latest",
      Labels: { [TEST_LABEL]: "docker_client_test" },
      HostConfig: { NetworkMode: "none" },
    };
    const volumeOf = async (id: string): Promise<string> => {
      const mounts = (await docker.inspectContainer(id))?.Mounts ?? [];
      const source = mounts.find((m) => m.Type === "volume" && m.Destination === "/data")?.Source;
      assert(source !== undefined, `no volume at /data: ${JSON.stringify(mounts)}`);
      return source.split("/").at(-2) ?? "";
    };
    const ids: string[] = [];
    const volumes: string[] = [];
    try {
      ids.push(await docker.createContainer(uniqueName("waffle-test-volume"), body));
      volumes.push(await volumeOf(ids[0]!));
      assert((await docker.inspectVolume(volumes[0]!)) !== null, "the volume exists");
      assertEquals(await docker.removeContainer(ids[0]!), true, "remove");
      assertEquals(await docker.inspectVolume(volumes[0]!), null, "the volume after remove");

      ids.push(await docker.createContainer(uniqueName("waffle-test-volume"), body));
      volumes.push(await volumeOf(ids[1]!));
      assertEquals(await docker.removeContainer(ids[1]!, { volumes: false }), true, "remove");
      assert((await docker.inspectVolume(volumes[1]!)) !== null, "volumes: false keeps it");
    } finally {
      for (const id of ids) await docker.removeContainer(id, { force: true });
      for (const name of volumes) await docker.removeVolume(name);
    }
  },
);

liveTest(
  "docker: creating a container with a taken name is a typed 409 conflict",
  async (docker) => {
    const name = uniqueName("waffle-test-conflict");
    let id = "";
    try {
      id = await docker.createContainer(name, runnerBody());
      const err = await assertRejects(
        () => docker.createContainer(name, runnerBody()),
        DockerConflictError,
      );
      assertEquals(err.status, 409, "status");
      assertEquals(err.message, `Container name '${name}' is already in use`, "message");
      assertEquals(err.exitCode, EXIT_WAFFLE, "exit code");
    } finally {
      if (id !== "") await docker.removeContainer(id, { force: true });
    }
  },
);

liveTest("docker: missing images and containers are typed 404s", async (docker) => {
  const image = `waffle-missing-${crypto.randomUUID().slice(0, 8)}:none`;
  const name = uniqueName("waffle-test-missing");
  const err = await assertRejects(
    () => docker.createContainer(name, { Image: image }),
    DockerNotFoundError,
  );
  assertEquals(err.message, `Image '${image}' not found`, "image message");
  assertEquals(err.status, 404, "status");
  assertEquals(await docker.inspectContainer(name), null, "nothing was created");

  const gone = await assertRejects(() => docker.stopContainer(name), DockerNotFoundError);
  assertEquals(gone.message, `Container '${name}' not found`, "container message");
  await assertRejects(() => docker.exec(name, ["true"]), DockerNotFoundError);
  assertEquals(await docker.removeContainer(name, { force: true }), false, "remove missing");
});
