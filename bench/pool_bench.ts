/**
 * The warm pool section of `deno task bench`: a new user's first call as
 * the library runs it (`openSandbox(user).run(["true"])`, README), when the
 * home keeps a warm pool (`[templates.bench] warm = N`), beside a cold
 * `docker run` in the same loop:
 *
 * - `create_warm`: open a new user and get the result of its first command,
 *   pool of 4 (refilled, untimed, a second before each sample), against `docker_run_cold`
 *   (this section's own samples, interleaved: create + start + wait + remove
 *   of `true`);
 * - `create_burst20`: 20 new users' first commands at once from a pool of 20,
 *   each one's latency a sample (two bursts): its p99 against `docker_run_cold`.
 *
 * @module
 */
import { join } from "node:path";
import { sandboxToml } from "../lib/config/config.ts";
import { DockerClient } from "../lib/docker/mod.ts";
import { fillPool, type PoolTarget } from "../lib/sandbox/pool_fill.ts";
import { openSandbox, removeSandbox, type Sandbox } from "../lib/sandbox/mod.ts";
import { installedRunner } from "./cli_bench.ts";
import { runCold } from "./docker_bench.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const POOL_CASES = ["create_warm", "pool_docker_run_cold", "create_burst20"] as const;

const IMAGE = "waffle-runner:latest";
const WARM_MAX = 12;
const BURST = 20;
const BURSTS = 2;

/** The pool section. */
export const poolSection: Section = {
  name: "pool",
  cases: POOL_CASES,
  run: runPoolSection,
};

async function runPoolSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  const image = await docker.inspectImage(IMAGE).catch(() => null);
  if (image === null) return { results: [], ratios: [] };
  const home = join(context.root, "pool-home");
  await Deno.mkdir(home, { recursive: true });
  const configPath = join(home, "waffle.toml");
  // One file for the pool's members and for the users: one posture.
  await Deno.writeTextFile(
    configPath,
    sandboxToml({ runner: await installedRunner(context), idleSeconds: 600 }) +
      `\n[templates.bench]\nimage = "${IMAGE}"\nwarm = ${BURST}\n`,
  );
  const opened: Sandbox[] = [];
  context.cleanup.add(async () => {
    for (const sandbox of opened) {
      sandbox.close();
      await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true })
        .catch(() => false);
    }
    const { drainPool } = await import("../lib/sandbox/pool_fill.ts");
    await drainPool(home, "bench", { configPath, docker }).catch(() => 0);
  });
  const fill = async (warm: number): Promise<void> => {
    const target: PoolTarget = { template: "bench", image: IMAGE, warm };
    const report = await fillPool(home, target, { configPath, docker, parallel: 4 });
    if (report.ready !== warm) throw new Error(`Pool not filled: ${JSON.stringify(report)}`);
    // A pool is filled ahead of its users: the daemon's and the new runners'
    // start-up work is over by the time one comes.
    if (report.made > 0) await new Promise((resolve) => setTimeout(resolve, 1000));
  };
  // The library's first call for a new user; throws unless it came from the pool.
  const firstCall = async (user: string): Promise<number> => {
    const t0 = now();
    const sandbox = openSandbox(user, { config: { configPath, home }, docker });
    opened.push(sandbox);
    const result = await sandbox.run(["true"]);
    const ms = now() - t0;
    if (result.exitCode !== 0) throw new Error(`'true' exited ${result.exitCode}`);
    if (sandbox.pooled === undefined) throw new Error(`User '${user}' was not served by the pool`);
    return ms;
  };
  const samples = new Map<string, number[]>(POOL_CASES.map((name) => [name, []]));
  const add = (name: string, ms: number): void => void samples.get(name)!.push(ms);
  const warmRuns = Math.min(context.n, WARM_MAX);
  for (let i = 0; i < warmRuns && context.wants("create_warm"); i++) {
    await fill(4);
    add("create_warm", await firstCall(`bench-warm-${i}-${crypto.randomUUID().slice(0, 6)}`));
    add("pool_docker_run_cold", await runCold(docker, image.id, `waffle-bench-pool-${i}`));
    context.progress.step("create_warm + pool_docker_run_cold", i + 1, warmRuns);
  }
  for (let burst = 0; burst < BURSTS && context.wants("create_burst20"); burst++) {
    await fill(BURST);
    const users = Array.from({ length: BURST }, (_, i) => `bench-burst-${burst}-${i}`);
    for (const ms of await Promise.all(users.map(firstCall))) add("create_burst20", ms);
    context.progress.step("create_burst20", burst + 1, BURSTS);
  }
  const results: BenchResult[] = [];
  for (const [name, values] of samples) {
    if (values.length > 0) results.push(summarize(name, values));
  }
  const find = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
  const ratios = [
    ratioOf(
      "create_warm / pool_docker_run_cold",
      find("create_warm"),
      find("pool_docker_run_cold"),
    ),
    ratioOf(
      "create_burst20 / pool_docker_run_cold (p99)",
      find("create_burst20"),
      find("pool_docker_run_cold"),
      "p99_ms",
    ),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}
