/**
 * What a test of waffle on Kubernetes needs, made once per test file: the
 * artefact installed into a temporary prefix (`scripts/install.sh
 * --no-docker`), the waffle image made from it (`buildWaffleImage`, as
 * `waffle k8s image` makes it), and the Kubernetes stand-in
 * (`_k8s_standin.ts`: a MOCK of the API server and kubelet, because no
 * cluster can run here; the pods it runs are real containers).
 *
 * @module
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { artefactCommand } from "../lib/config/self.ts";
import type { DockerClient } from "../lib/docker/mod.ts";
import { buildWaffleImage } from "../lib/k8s/image.ts";
import { runProcess } from "./_helpers.ts";
import { type StandIn, startStandIn } from "./_k8s_standin.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");

/** A stand-in cluster with waffle's image. */
export interface KubeRig {
  /** The stand-in. */
  standIn: StandIn;
  /** The waffle image's reference. */
  waffleImage: string;
  /** The `[backend]` table a server's `waffle.toml` needs to use it. */
  backendToml: string;
  /** Removes the stand-in's pods, network and files, and the install. */
  stop(): Promise<void>;
}

// Rigs not stopped by their file's last test (a run with --filter, a
// failure): removed as the test process ends, with the Docker CLI (an
// unload handler cannot wait for a promise).
const running = new Set<{ network: string; dirs: string[] }>();
globalThis.addEventListener("unload", () => {
  for (const rig of running) {
    const ids = new Deno.Command("docker", {
      args: ["ps", "-aq", "--filter", `name=^/${rig.network}-`],
      stdout: "piped",
      stderr: "null",
    }).outputSync();
    const list = new TextDecoder().decode(ids.stdout).split("\n").filter((id) => id !== "");
    if (list.length > 0) {
      new Deno.Command("docker", { args: ["rm", "-f", ...list], stdout: "null", stderr: "null" })
        .outputSync();
    }
    new Deno.Command("docker", {
      args: ["network", "rm", rig.network],
      stdout: "null",
      stderr: "null",
    })
      .outputSync();
    for (const dir of rig.dirs) {
      try {
        Deno.removeSync(dir, { recursive: true });
      } catch {
        // Gone already.
      }
    }
  }
});

/**
 * Installs the artefact, makes its image, starts the stand-in.
 *
 * @param docker The Docker client.
 * @returns The rig.
 */
export async function startKubeRig(docker: DockerClient): Promise<KubeRig> {
  const prefix = await Deno.makeTempDir({ prefix: "waffle-k8s-install-" });
  const installed = await runProcess("bash", [
    `${REPO}/scripts/install.sh`,
    "--prefix",
    prefix,
    "--no-docker",
  ]);
  assert.equal(installed.code, 0, installed.stderr);
  const image = await buildWaffleImage(docker, {
    self: artefactCommand(`${prefix}/lib/waffle/waffle.js`),
  });
  const standIn = await startStandIn(docker);
  const owned = { network: standIn.network, dirs: [standIn.root, prefix] };
  running.add(owned);
  return {
    standIn,
    waffleImage: image.ref,
    backendToml: `[backend]\nkind = "kubernetes"\nkubeconfig = ${
      JSON.stringify(standIn.kubeconfigPath)
    }\nwaffle_image = ${JSON.stringify(image.ref)}\nready_timeout = 90\n`,
    stop: async () => {
      await standIn.stop();
      await Deno.remove(prefix, { recursive: true }).catch(() => {});
      running.delete(owned);
    },
  };
}
