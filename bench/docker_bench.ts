/**
 * The Docker section of `deno task bench`, all on one warm sandbox in one
 * run:
 *
 * - `queue_roundtrip_docker`: `true` through the queue into the container;
 * - `docker_exec_api`: the same `true` through Docker Exec (create + start +
 *   inspect over the Engine API), interleaved with the above in blocks so
 *   both see the same machine load;
 * - `docker_run_cold`: create + start + wait + remove of a container of the
 *   same image running `true` (what `docker run --rm` costs);
 * - `ensure_cold`: a first call for a new user: state directory, create,
 *   start, runner boot, first heartbeat. Interleaved with `docker_run_cold`.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import { DockerClient } from "../lib/docker/mod.ts";
import { removeSandbox } from "../lib/sandbox/remove.ts";
import { openSandbox, type Sandbox } from "../lib/sandbox/open.ts";
import { installedRunner } from "./cli_bench.ts";
import { roundtripIteration } from "./queue_bench.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const DOCKER_CASES = [
  "queue_roundtrip_docker",
  "docker_exec_api",
  "docker_run_cold",
  "ensure_cold",
] as const;

/** The Docker section. */
export const dockerSection: Section = {
  name: "docker",
  cases: DOCKER_CASES,
  run: runDockerSection,
};

const BLOCK = 10;
/** Cold cases cost ~0.5 s each: fewer samples. */
const COLD_MAX = 15;

/**
 * Runs the wanted Docker cases. Without a reachable daemon it reports why
 * on stderr and measures nothing (the rest of the bench still runs).
 *
 * @param context Counts, root directory, filter, progress and cleanup.
 * @returns Results and the two target ratios.
 */
export async function runDockerSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  try {
    await docker.ping();
  } catch (error) {
    console.error(
      `bench: docker section skipped: ${error instanceof Error ? error.message : error}`,
    );
    return { results: [], ratios: [] };
  }
  const home = join(context.root, "docker-home");
  // The installed artefact as the runner, as an installed waffle has it.
  const config = { home, idleSeconds: 0, runner: await installedRunner(context) };
  const results: BenchResult[] = [];
  const sandboxes: Sandbox[] = [];
  const release = context.cleanup.add(async () => {
    for (const sandbox of sandboxes) {
      sandbox.close();
      await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true });
    }
  });
  try {
    if (context.wants("queue_roundtrip_docker") || context.wants("docker_exec_api")) {
      const warm = openSandbox("bench-warm", { config, docker });
      sandboxes.push(warm);
      await warm.ensure();
      const containerId = warm.lastEnsure!.containerId;
      context.progress.note(`docker: warm sandbox ${containerId.slice(0, 12)} ready`);
      const queueSamples: number[] = [];
      const execSamples: number[] = [];
      for (let i = 0; i < context.warmup; i++) {
        await roundtripIteration(warm.queue);
        await docker.exec(containerId, ["true"]);
      }
      while (queueSamples.length < context.n) {
        for (let i = 0; i < BLOCK && queueSamples.length < context.n; i++) {
          queueSamples.push((await roundtripIteration(warm.queue)).total!);
        }
        for (let i = 0; i < BLOCK && execSamples.length < context.n; i++) {
          const t0 = now();
          const exec = await docker.exec(containerId, ["true"]);
          execSamples.push(now() - t0);
          if (exec.exitCode !== 0) throw new Error(`Docker Exec of 'true' exited ${exec.exitCode}`);
        }
        context.progress.step(
          "queue_roundtrip_docker + docker_exec_api",
          queueSamples.length,
          context.n,
        );
      }
      results.push(
        summarize("queue_roundtrip_docker", queueSamples, {
          note: "`true` via the queue into the warm container",
        }),
      );
      results.push(
        summarize("docker_exec_api", execSamples, {
          note: "`true` via Docker Exec: create + start + inspect",
        }),
      );
    }
    if (context.wants("docker_run_cold") || context.wants("ensure_cold")) {
      const image = await docker.inspectImage("waffle-runner:latest");
      if (image === null) throw new Error("Image 'waffle-runner:latest' not found");
      const runSamples: number[] = [];
      const ensureSamples: number[] = [];
      const cold = Math.min(context.n, COLD_MAX);
      for (let i = 0; i < cold; i++) {
        runSamples.push(
          await runCold(docker, image.id, `waffle-bench-run-${crypto.randomUUID().slice(0, 8)}`),
        );
        const sandbox = openSandbox(`bench-cold-${i}-${crypto.randomUUID().slice(0, 6)}`, {
          config,
          docker,
        });
        sandboxes.push(sandbox);
        const t0 = now();
        await sandbox.ensure();
        ensureSamples.push(now() - t0);
        // Not timed: keep the daemon's container count flat across samples.
        sandbox.close();
        await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true });
        sandboxes.pop();
        context.progress.step("docker_run_cold + ensure_cold", i + 1, cold);
      }
      results.push(
        summarize("docker_run_cold", runSamples, {
          note: "create + start + wait + remove, `true`",
        }),
      );
      results.push(
        summarize("ensure_cold", ensureSamples, {
          note: "first call for a new user, up to the first heartbeat",
        }),
      );
    }
  } finally {
    await release();
  }
  const find = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
  const ratios = [
    ratioOf(
      "docker_exec_api / queue_roundtrip_docker",
      find("docker_exec_api"),
      find("queue_roundtrip_docker"),
    ),
    ratioOf(
      "ensure_cold / docker_run_cold",
      find("ensure_cold"),
      find("docker_run_cold"),
    ),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}

/**
 * `docker run --rm IMAGE true` through the API, with the sandbox's flags:
 * the floor of a cold start.
 *
 * @param docker The client.
 * @param imageId The image.
 * @param name A unique container name.
 * @returns Milliseconds from create to removal.
 */
export async function runCold(
  docker: DockerClient,
  imageId: string,
  name: string,
): Promise<number> {
  const t0 = now();
  const id = await docker.createContainer(name, {
    Image: imageId,
    Cmd: ["true"],
    User: "10001:10001",
    HostConfig: { Init: true, ReadonlyRootfs: true, NetworkMode: "none", CapDrop: ["ALL"] },
  });
  try {
    await docker.startContainer(id);
    const code = await docker.waitContainer(id);
    if (code !== 0) throw new Error(`Cold 'true' exited ${code}`);
    await docker.removeContainer(id, { force: true });
    return now() - t0;
  } catch (error) {
    await docker.removeContainer(id, { force: true }).catch(() => false);
    throw error;
  }
}
