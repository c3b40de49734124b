/**
 * The Kubernetes section of `deno task bench`: a sandbox made through
 * `waffle serve` with `[backend] kind = "kubernetes"`, as E2B's SDK users
 * call it (`Sandbox.create("base")` to the first `commands.run("true")`
 * result), against a cold `docker run` in the same loop:
 *
 * - `k8s_create`: through the Kubernetes stand-in (`tests/_k8s_standin.ts`:
 *   a mock API server and a Docker kubelet, since no cluster runs here; the
 *   pod's containers are real: a holder, the kit's init container, the
 *   runner and the agent), its details the agent's resident memory per
 *   sandbox (MiB);
 * - `k8s_docker_run_cold`: create + start + wait + remove of `true`.
 *
 * What a real cluster adds (scheduling, image pulls, PVC binding, CNI) is
 * not in these figures: see docs/kubernetes.md.
 *
 * @module
 */
import { join } from "node:path";
import { Sandbox } from "e2b";
import { DockerClient } from "../lib/docker/mod.ts";
import { artefactCommand } from "../lib/config/self.ts";
import { buildWaffleImage } from "../lib/k8s/image.ts";
import { startStandIn } from "../tests/_k8s_standin.ts";
import { installedRunner, installedWaffle } from "./cli_bench.ts";
import { runCold } from "./docker_bench.ts";
import { serveFor } from "./serve_bench.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const K8S_CASES = ["k8s_create", "k8s_docker_run_cold"] as const;

const BASE = "waffle-base:bookworm";
const CREATES_MAX = 8;

/** The Kubernetes section. */
export const k8sSection: Section = {
  name: "k8s",
  cases: K8S_CASES,
  run: runK8sSection,
};

async function runK8sSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  const image = await docker.inspectImage(BASE).catch(() => null);
  if (image === null) return { results: [], ratios: [] };
  const waffle = await installedWaffle(context);
  const built = await buildWaffleImage(docker, {
    self: artefactCommand(await installedRunner(context)),
  });
  const standIn = await startStandIn(docker, { prefix: "wfl-bench" });
  context.cleanup.add(() => standIn.stop());
  const home = join(context.root, "k8s-home");
  await Deno.mkdir(home, { recursive: true });
  await Deno.writeTextFile(
    join(home, "waffle.toml"),
    `[backend]\nkind = "kubernetes"\nkubeconfig = ${JSON.stringify(standIn.kubeconfigPath)}\n` +
      `waffle_image = ${JSON.stringify(built.ref)}\n`,
  );
  const options = await serveFor(context, waffle, { ...Deno.env.toObject(), WAFFLE_HOME: home });
  const made: Sandbox[] = [];
  context.cleanup.add(async () => {
    for (const sandbox of made) await sandbox.kill().catch(() => false);
  });
  const creates: number[] = [];
  const cold: number[] = [];
  const rss: number[] = [];
  const runs = Math.min(context.n, CREATES_MAX);
  for (let i = 0; i < runs && context.wants("k8s_create"); i++) {
    const t0 = now();
    const sandbox = await Sandbox.create("base", options);
    await sandbox.commands.run("true");
    creates.push(now() - t0);
    made.push(sandbox);
    rss.push(
      await agentRss(docker, standIn.podContainers(`waffle-bench`, `wfl-${sandbox.sandboxId}`)),
    );
    cold.push(await runCold(docker, image.id, `waffle-bench-k8s-${i}-${Date.now()}`));
    context.progress.step("k8s_create + k8s_docker_run_cold", i + 1, runs);
  }
  const results: BenchResult[] = [];
  if (creates.length > 0) {
    const mib = rss.map((bytes) => bytes / 2 ** 20);
    results.push(summarize("k8s_create", creates, {
      details: {
        agent_rss_mib_mean: mib.reduce((a, b) => a + b, 0) / mib.length,
        agent_rss_mib_max: Math.max(...mib),
      },
      note: `agent ${Math.round(Math.max(...mib))} MiB RSS per sandbox (max)`,
    }));
    results.push(summarize("k8s_docker_run_cold", cold));
  }
  const find = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
  const ratio = ratioOf(
    "k8s_create / k8s_docker_run_cold",
    find("k8s_create"),
    find("k8s_docker_run_cold"),
  );
  return { results, ratios: ratio === undefined ? [] : [ratio] };
}

// The agent's resident memory, read on the host from its process.
async function agentRss(
  docker: DockerClient,
  containers: Record<string, string> | undefined,
): Promise<number> {
  const id = containers?.["waffle-agent"];
  if (id === undefined) throw new Error("The sandbox's pod has no waffle-agent container");
  const pid = (await docker.inspectContainer(id))?.State?.Pid;
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  return Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)![1]) * 1024;
}
