/**
 * The cp section of `deno task bench`: `waffle cp` of one random file (1 GiB;
 * `WAFFLE_BENCH_CP_MIB` for another size) into and out of one sandbox,
 * against `docker cp` of the same file into and out of the same container,
 * interleaved in the same run (at most 2 runs each: every run moves the whole
 * file; `docker cp` goes to the workspace volume: the rootfs is read-only). Each `waffle cp` is the CLI as a child process; its peak RSS (VmHWM)
 * goes into the case's details.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import { sandboxToml } from "../lib/config/config.ts";
import { selfCommand } from "../lib/config/self.ts";
import { DockerClient } from "../lib/docker/mod.ts";
import { onPath } from "../lib/fs.ts";
import { removeSandbox } from "../lib/sandbox/remove.ts";
import { quotaSupport } from "../lib/lifecycle/quota.ts";
import { openSandbox } from "../lib/sandbox/open.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const CP_CASES = ["waffle_cp_in", "waffle_cp_out", "docker_cp_in", "docker_cp_out"] as const;

/** The cp section. */
export const cpSection: Section = { name: "cp", cases: CP_CASES, run: runCpSection };

const MIB = 1024 ** 2;

async function run(program: string, args: string[], env?: Record<string, string>): Promise<string> {
  const child = new Deno.Command(program, {
    args,
    stdout: "null",
    stderr: "piped",
    ...(env === undefined ? {} : { env }),
  }).spawn();
  let peak = 0;
  const timer = setInterval(() => {
    try {
      const status = Deno.readTextFileSync(`/proc/${child.pid}/status`);
      peak = Math.max(peak, Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0));
    } catch {
      // gone
    }
  }, 100);
  const out = await child.output();
  clearInterval(timer);
  if (out.code !== 0) {
    throw new Error(
      `'${program} ${args.join(" ")}' failed: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
  return String(peak);
}

/**
 * Runs the wanted cp cases.
 *
 * @param context Counts, root directory, filter, progress and cleanup.
 * @returns Results (with MB/s as `per_s`) and the ratios to `docker cp`.
 */
export async function runCpSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  try {
    await docker.ping();
  } catch (error) {
    console.error(`bench: cp section skipped: ${error instanceof Error ? error.message : error}`);
    return { results: [], ratios: [] };
  }
  const mib = Number(Deno.env.get("WAFFLE_BENCH_CP_MIB") ?? 1024);
  const home = join(context.root, "cp-home");
  Deno.mkdirSync(home, { recursive: true });
  const quota = quotaSupport().supported ? { quotaBytes: (3 * mib + 512) * MIB } : {};
  Deno.writeTextFileSync(join(home, "waffle.toml"), sandboxToml(quota));
  const sandbox = openSandbox("bench-cp", { config: { home, ...quota }, docker });
  const release = context.cleanup.add(async () => {
    sandbox.close();
    await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true });
  });
  try {
    await sandbox.ensure();
    const container = sandbox.lastEnsure!.containerId;
    const file = join(context.root, "cp-big.bin");
    await run("dd", ["if=/dev/urandom", `of=${file}`, "bs=1M", `count=${mib}`, "status=none"]);
    const back = join(context.root, "cp-back.bin");
    const self = selfCommand();
    const env = { WAFFLE_HOME: home, PATH: Deno.env.get("PATH") ?? "" };
    const samples = new Map<string, number[]>(CP_CASES.map((name) => [name, []]));
    const peaks = new Map<string, number>();
    const timed = async (name: string, fn: () => Promise<string | void>): Promise<void> => {
      if (!context.wants(name)) return;
      const t0 = now();
      const peak = await fn();
      samples.get(name)!.push(now() - t0);
      if (typeof peak === "string") peaks.set(name, Math.max(peaks.get(name) ?? 0, Number(peak)));
    };
    const runs = Math.max(2, Math.min(context.n, 2));
    for (let i = 0; i < runs; i++) {
      await timed(
        "waffle_cp_in",
        () => run(self.executable, [...self.prefix, "cp", file, "bench-cp:big.bin"], env),
      );
      await Deno.remove(back).catch(() => {});
      await timed(
        "waffle_cp_out",
        () => run(self.executable, [...self.prefix, "cp", "bench-cp:big.bin", back], env),
      );
      await Deno.remove(back).catch(() => {});
      if (onPath("docker")) {
        await timed(
          "docker_cp_in",
          () => run("docker", ["cp", file, `${container}:/workspace/docker-big.bin`]),
        );
        await timed(
          "docker_cp_out",
          () => run("docker", ["cp", `${container}:/workspace/docker-big.bin`, back]),
        );
        await Deno.remove(back).catch(() => {});
        await sandbox.files.remove("docker-big.bin");
      }
      context.progress.step("cp in + out, docker cp in + out", i + 1, runs);
    }
    await Deno.remove(file).catch(() => {});
    const results: BenchResult[] = [];
    for (const name of CP_CASES) {
      const list = samples.get(name) ?? [];
      if (list.length === 0) continue;
      const summary = summarize(name, list, {
        note: `${mib} MiB random file, MB/s as per_s`,
        ...(peaks.has(name) ? { details: { peak_rss_mib: peaks.get(name)! / 1024 } } : {}),
      });
      results.push({ ...summary, per_s: (mib * MIB) / 1e6 / (summary.p50_ms / 1000) });
    }
    const by = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
    const ratios = [
      ratioOf(
        "waffle_cp_in / docker_cp_in (per_s)",
        by("waffle_cp_in"),
        by("docker_cp_in"),
        "per_s",
      ),
      ratioOf(
        "waffle_cp_out / docker_cp_out (per_s)",
        by("waffle_cp_out"),
        by("docker_cp_out"),
        "per_s",
      ),
    ].filter((ratio) => ratio !== undefined);
    return { results, ratios };
  } finally {
    await release();
  }
}
