/**
 * `waffle k8s image` and `waffle k8s kit`: the waffle image made from a real
 * install (`scripts/install.sh --no-docker` into a temporary prefix) runs
 * waffle from /opt/waffle, and its kit copies into a volume as the pod's init
 * container copies it. Live where Docker is (see tests/_docker_gate.ts).
 *
 * @module
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { liveTest } from "./_docker_gate.ts";
import { runProcess } from "./_helpers.ts";
import { artefactCommand, selfCommand } from "../lib/config/self.ts";
import {
  RUNNER_CACHE,
  RUNNER_CAPS,
  SANDBOX_ARTEFACT_ARGV,
  SANDBOX_DENO_ARGV,
} from "../lib/lifecycle/posture.ts";
import { type KubeObject, startStandIn } from "./_k8s_standin.ts";
import { RESOURCES } from "./_k8s_api.ts";
import { UsageError } from "../lib/errors.ts";
import { buildWaffleImage, copyKit, KIT_ENTRIES } from "../lib/k8s/mod.ts";
import { K8S_IMAGE_HELP, k8sImageCommand, k8sKitCommand } from "../lib/cli/k8s_image.ts";
import type { CliIo } from "../lib/cli/io.ts";
import type { DockerClient } from "../lib/docker/mod.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const PREFIX = "waffle-h2img";
const SANDBOXES = RESOURCES.find((resource) => resource.plural === "sandboxes")!;
// How the image's Deno runs this checkout's sources mounted at /src.
const FROM_SOURCE = [
  "run",
  "--allow-all",
  "--quiet",
  "--cached-only",
  "--node-modules-dir=manual",
  "--config",
  "/src/deno.json",
];

Deno.test("buildWaffleImage() from a source checkout is a one-line error naming scripts/install.sh", async () => {
  const docker = {} as DockerClient; // never reached
  await assert.rejects(
    () => buildWaffleImage(docker, { self: selfCommand() }),
    (error: Error) =>
      error instanceof UsageError && error.message.includes("run scripts/install.sh") &&
      !error.message.includes("\n"),
  );
});

Deno.test("k8sImageCommand() and k8sKitCommand(): help, and one-line errors for what is missing", async () => {
  let out = "";
  const io: CliIo = {
    stdout: (d) => {
      out += String(d);
      return Promise.resolve();
    },
    stderr: () => Promise.resolve(),
    stdin: null,
  };
  assert.equal(await k8sImageCommand(["--help"], io), 0);
  assert.equal(out, K8S_IMAGE_HELP);
  const oneLine = (text: string) => (error: Error) =>
    error instanceof UsageError && error.message.includes(text) && !error.message.includes("\n");
  await assert.rejects(() => k8sImageCommand([], io), oneLine("run scripts/install.sh"));
  await assert.rejects(
    () => k8sImageCommand(["extra"], io),
    oneLine("Unexpected argument 'extra'"),
  );
  await assert.rejects(() => k8sKitCommand([], io), oneLine("Missing --to DIR"));
  // Outside the waffle image there is no /opt/waffle kit to copy.
  await using dir = await tempDir();
  await assert.rejects(
    () => k8sKitCommand(["--to", `${dir.path}/kit`], io),
    oneLine("is missing: is this the waffle image?"),
  );
});

Deno.test("copyKit() copies the kit with its modes and links, and again over its own copy", async () => {
  await using dir = await tempDir();
  const from = `${dir.path}/opt`;
  await Deno.mkdir(`${from}/rt`, { recursive: true });
  await Deno.mkdir(`${from}/app/chunks`, { recursive: true });
  await Deno.mkdir(`${from}/cache`);
  await Deno.writeTextFile(`${from}/deno`, "binary", { mode: 0o755 });
  await Deno.writeTextFile(`${from}/rt/ld.so`, "loader", { mode: 0o755 });
  await Deno.symlink("ld.so", `${from}/rt/ld-linux.so`);
  await Deno.writeTextFile(`${from}/app/waffle.js`, "entry", { mode: 0o644 });
  await Deno.writeTextFile(`${from}/app/chunks/a.js`, "chunk", { mode: 0o600 });
  await Deno.writeFile(`${from}/empty`, new Uint8Array());
  const to = `${dir.path}/kit`;
  for (let round = 0; round < 2; round++) {
    assert.deepEqual(await copyKit(to, { from }), [...KIT_ENTRIES]);
    assert.deepEqual((await Deno.stat(`${to}/deno`)).mode! & 0o777, 0o755);
    assert.deepEqual((await Deno.stat(`${to}/app/chunks/a.js`)).mode! & 0o777, 0o600);
    assert.deepEqual(await Deno.readLink(`${to}/rt/ld-linux.so`), "ld.so");
    assert.deepEqual(await Deno.readTextFile(`${to}/app/chunks/a.js`), "chunk");
    assert.deepEqual((await Deno.stat(`${to}/empty`)).size, 0);
  }
  const names = [];
  for await (const entry of Deno.readDir(to)) names.push(entry.name);
  assert.deepEqual(names.sort(), [...KIT_ENTRIES].sort(), "no temporary names left");
});

Deno.test("copyKit() from a directory without the kit is a one-line error, nothing copied", async () => {
  await using dir = await tempDir();
  await Deno.writeTextFile(`${dir.path}/deno`, "binary");
  await assert.rejects(
    () => copyKit(`${dir.path}/kit`, { from: dir.path }),
    (error: Error) =>
      error instanceof UsageError && error.message.includes(`'${dir.path}/rt'`) &&
      !error.message.includes("\n"),
  );
  const names = [];
  for await (const entry of Deno.readDir(`${dir.path}/kit`)) names.push(entry.name);
  assert.deepEqual(names, []);
});

liveTest(
  "waffle k8s image: an installed artefact's image runs waffle, and its kit copies out",
  async (docker) => {
    await using dir = await tempDir();
    const install = await runProcess("bash", [
      `${REPO}/scripts/install.sh`,
      "--prefix",
      dir.path,
      "--no-docker",
    ]);
    assert.deepEqual(install.code, 0, install.stderr);
    const self = artefactCommand(`${dir.path}/lib/waffle/waffle.js`);
    const tag = `${PREFIX}:${crypto.randomUUID().slice(0, 8)}`;
    const image = await buildWaffleImage(docker, { self, tag });
    try {
      assert(image.built);
      assert.deepEqual(image.entrypoint, [...SANDBOX_ARTEFACT_ARGV]);
      const again = await buildWaffleImage(docker, { self, tag });
      assert.deepEqual({ built: again.built, id: again.id }, { built: false, id: image.id });
      const inspected = await docker.inspectImage(tag);
      assert(inspected?.env.includes("DENO_DIR=/opt/waffle/cache"), String(inspected?.env));
      // The image runs waffle: `help` exits 0, an unknown command does not.
      assert.deepEqual(await runIn(docker, tag, { cmd: ["help"] }), 0);
      assert((await runIn(docker, tag, { cmd: ["no-such-command"] })) !== 0);
      // The kit, copied by the image's own Deno from its /opt/waffle into a volume.
      const kit = `${dir.path}/kit`;
      await Deno.mkdir(kit);
      await Deno.writeTextFile(`${dir.path}/kit_main.ts`, KIT_MAIN);
      const code = await runIn(docker, tag, {
        entrypoint: [...SANDBOX_DENO_ARGV, ...FROM_SOURCE, "/probe/kit_main.ts"],
        cmd: ["--to", "/kit"],
        binds: [`${REPO}:/src:ro`, `${dir.path}/kit_main.ts:/probe/kit_main.ts:ro`, `${kit}:/kit`],
        env: ["DENO_DIR=/tmp/deno"],
      });
      assert.deepEqual(code, 0);
      const build = self.artefact!.slice(0, self.artefact!.lastIndexOf("/"));
      assert.deepEqual(
        await Deno.readTextFile(`${kit}/app/waffle.js`),
        await Deno.readTextFile(`${build}/waffle.js`),
      );
      assert.deepEqual((await Deno.stat(`${kit}/deno`)).mode! & 0o777, 0o755);
      assert.deepEqual((await Deno.stat(`${kit}/rt/ld.so`)).isFile, true);
      assert.deepEqual((await Deno.stat(`${kit}/empty`)).size, 0);
      // In a pod (the stand-in, a mock of Kubernetes): the image's init
      // container copies the kit into an emptyDir, and waffle runs from it,
      // mounted by subPath, in an image without glibc, root read-only.
      const standIn = await startStandIn(docker, { prefix: "wfl-h2img" });
      try {
        standIn.objects.create(SANDBOXES, "default", kitSandbox(tag, dir.path));
        await standIn.settled(180_000);
      } finally {
        await standIn.stop();
      }
    } finally {
      await docker.removeImage(tag, { force: true });
    }
  },
  { sanitizeResources: false, sanitizeOps: false },
);

// A Sandbox whose pod copies the kit (init container `waffle-kit`, the
// waffle image) and runs `waffle help` from it in waffle-musl:latest with the
// runner's posture (init container `check`: the pod is ready only when it
// exited 0).
function kitSandbox(tag: string, probeDir: string): KubeObject {
  const kitMounts = [
    { name: "waffle-kit", mountPath: "/opt/waffle/deno", subPath: "deno", readOnly: true },
    { name: "waffle-kit", mountPath: "/opt/waffle/rt", subPath: "rt", readOnly: true },
    { name: "waffle-kit", mountPath: "/opt/waffle/app", subPath: "app", readOnly: true },
    { name: "waffle-kit", mountPath: RUNNER_CACHE, subPath: "cache", readOnly: true },
    { name: "waffle-kit", mountPath: "/etc/ld.so.preload", subPath: "empty", readOnly: true },
    { name: "waffle-tmp", mountPath: "/tmp" },
  ];
  const locked = {
    runAsUser: 0,
    runAsGroup: 0,
    readOnlyRootFilesystem: true,
    allowPrivilegeEscalation: false,
    privileged: false,
  };
  return {
    apiVersion: "agents.x-k8s.io/v1beta1",
    kind: "Sandbox",
    metadata: { name: "kit-check" },
    spec: {
      podTemplate: {
        spec: {
          terminationGracePeriodSeconds: 1,
          initContainers: [
            {
              name: "waffle-kit",
              image: tag,
              command: [...SANDBOX_DENO_ARGV, ...FROM_SOURCE, "/probe/kit_main.ts"],
              args: ["--to", "/kit"],
              env: [{ name: "DENO_DIR", value: "/tmp/deno" }],
              securityContext: { ...locked, capabilities: { drop: ["ALL"] } },
              volumeMounts: [
                { name: "waffle-kit", mountPath: "/kit" },
                { name: "src", mountPath: "/src", readOnly: true },
                { name: "probe", mountPath: "/probe", readOnly: true },
                { name: "waffle-tmp", mountPath: "/tmp" },
              ],
            },
            {
              name: "check",
              image: "waffle-musl:latest",
              command: [...SANDBOX_ARTEFACT_ARGV, "help"],
              env: [{ name: "DENO_DIR", value: RUNNER_CACHE }, { name: "HOME", value: "/tmp" }],
              securityContext: {
                ...locked,
                capabilities: { drop: ["ALL"], add: [...RUNNER_CAPS] },
              },
              volumeMounts: kitMounts,
            },
          ],
          containers: [{
            name: "main",
            image: "waffle-runner:latest",
            command: ["sleep", "infinity"],
          }],
          volumes: [
            { name: "waffle-kit", emptyDir: {} },
            { name: "waffle-tmp", emptyDir: { medium: "Memory", sizeLimit: "256Mi" } },
            { name: "src", hostPath: { path: REPO } },
            { name: "probe", hostPath: { path: probeDir } },
          ],
        },
      },
    },
  };
}

// Runs `waffle k8s kit` from this checkout's sources (the dispatcher that
// names it is wired elsewhere).
const KIT_MAIN = `import { k8sKitCommand } from "/src/lib/cli/k8s_image.ts";
Deno.exit(await k8sKitCommand(Deno.args));
`;

// Runs a container of `image` to its end (read-only root, no network) and removes it.
async function runIn(
  docker: DockerClient,
  image: string,
  options: { cmd: string[]; entrypoint?: string[]; binds?: string[]; env?: string[] },
): Promise<number> {
  const name = `${PREFIX}-${crypto.randomUUID().slice(0, 8)}`;
  const id = await docker.createContainer(name, {
    Image: image,
    Cmd: options.cmd,
    ...(options.entrypoint === undefined ? {} : { Entrypoint: options.entrypoint }),
    ...(options.env === undefined ? {} : { Env: options.env }),
    Labels: { [PREFIX]: "1" },
    HostConfig: {
      NetworkMode: "none",
      ReadonlyRootfs: true,
      Tmpfs: { "/tmp": "rw,size=256m" },
      Binds: options.binds ?? [],
    },
  });
  try {
    await docker.startContainer(id);
    return await docker.waitContainer(id, { timeoutMs: 120_000 });
  } finally {
    await docker.removeContainer(id, { force: true });
  }
}

async function tempDir(): Promise<{ path: string } & AsyncDisposable> {
  const path = await Deno.makeTempDir({ prefix: `${PREFIX}-` });
  return {
    path,
    [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }).catch(() => {}),
  };
}
