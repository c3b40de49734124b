/**
 * The fork section of `deno task bench`: one sandbox whose workspace holds
 * 1 GiB of random bytes (written by a command), measured a few times each,
 * interleaved so every case sees the same machine:
 *
 * - `fork_1g`: `forkSandbox(source, [openSandbox(new user)])` as the README
 *   shows it: the source frozen while its volume image is copied (sparse,
 *   reflinked where the host's filesystem can), the target's volume mounted
 *   and its state made (its container starts on its first command);
 * - `cp_reflink_1g`: the baseline, `cp --reflink=auto` of a 1 GiB file on
 *   the same host filesystem (the file the workspace holds, copied there once);
 * - `fork_floor_1g`: what any fork that copies the volume must do where the
 *   filesystem has no reflink: `cp --sparse=always --reflink=auto` of the
 *   source's volume image, then `sync` of the copy (a volume's loop device
 *   does direct I/O, so the copy must reach the disk before it is mounted).
 *
 * Each fork's target is removed after its sample (not timed).
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import type { SandboxConfig } from "../lib/config/config.ts";
import { DockerClient } from "../lib/docker/mod.ts";
import { removeSandbox } from "../lib/sandbox/remove.ts";
import { quotaSupport } from "../lib/lifecycle/quota.ts";
import { forkSandbox } from "../lib/lifecycle/fork.ts";
import { openSandbox, type Sandbox } from "../lib/sandbox/open.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const FORK_CASES = ["fork_1g", "cp_reflink_1g", "fork_floor_1g"] as const;

/** The fork section. */
export const forkSection: Section = {
  name: "fork",
  cases: FORK_CASES,
  run: runForkSection,
};

const MIB = 1024 ** 2;
const WORKSPACE_MIB = 1024;
/** Each run moves 1 GiB: a few samples. */
const RUNS_MAX = 3;

/**
 * Runs the wanted fork cases. Without Docker or the disk-quota volume (root
 * and loop devices) it says why on stderr and measures nothing.
 *
 * @param context Counts, root directory, filter, progress and cleanup.
 * @returns Results and the fork's ratio to the `cp` baseline.
 */
export async function runForkSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  const support = quotaSupport();
  try {
    await docker.ping();
    if (!support.supported) throw new Error(support.reason);
  } catch (error) {
    console.error(`bench: fork section skipped: ${error instanceof Error ? error.message : error}`);
    return { results: [], ratios: [] };
  }
  const home = join(context.root, "fork-home");
  const config = { home, idleSeconds: 0, quotaBytes: 2048 * MIB };
  const source = openSandbox("bench-fork", { config, docker });
  const release = context.cleanup.add(async () => {
    source.close();
    await removeSandbox(docker, source.key, { config: source.config, purge: true });
  });
  try {
    await command(source, `head -c ${WORKSPACE_MIB * MIB} /dev/urandom > /workspace/big`);
    context.progress.note(`fork: ${WORKSPACE_MIB} MiB written in the workspace`);
    const samples = await measure(context, { source, docker, config });
    const note =
      `${WORKSPACE_MIB} MiB of random bytes in the workspace; the target starts on its first command`;
    const results: BenchResult[] = [];
    for (const name of FORK_CASES) {
      const list = samples.get(name) ?? [];
      if (list.length > 0) results.push(summarize(name, list, { note }));
    }
    const byName = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
    const ratios = [
      ratioOf("fork_1g / cp_reflink_1g", byName("fork_1g"), byName("cp_reflink_1g")),
      // The target's floor here: above 2, the target is out of reach on this filesystem.
      ratioOf("fork_floor_1g / cp_reflink_1g", byName("fork_floor_1g"), byName("cp_reflink_1g")),
      ratioOf("fork_1g / fork_floor_1g", byName("fork_1g"), byName("fork_floor_1g")),
    ].filter((ratio) => ratio !== undefined);
    return { results, ratios };
  } finally {
    await release();
  }
}

// Interleaved runs: a fork to a new user (removed after), then the baseline.
async function measure(
  context: BenchContext,
  options: { source: Sandbox; docker: DockerClient; config: Partial<SandboxConfig> },
): Promise<Map<string, number[]>> {
  const { source, docker, config } = options;
  const samples = new Map<string, number[]>(FORK_CASES.map((name) => [name, []]));
  const runs = Math.min(context.n, RUNS_MAX);
  const file = join(context.root, "fork-baseline.bin");
  const copy = join(context.root, "fork-baseline.copy");
  if (context.wants("cp_reflink_1g")) {
    await run("cp", ["--sparse=always", join(source.paths.workspace, "big"), file]);
  }
  for (let i = 0; i < runs; i++) {
    if (context.wants("fork_1g")) {
      const target = openSandbox(`bench-fork-${i}`, { config, docker, fromPool: false });
      try {
        const t0 = now();
        await forkSandbox(source, [target], { docker });
        samples.get("fork_1g")!.push(now() - t0);
      } finally {
        target.close();
        await removeSandbox(docker, target.key, { config: target.config, purge: true });
      }
    }
    if (context.wants("cp_reflink_1g")) {
      const t0 = now();
      await run("cp", ["--reflink=auto", file, copy]);
      samples.get("cp_reflink_1g")!.push(now() - t0);
      await Deno.remove(copy).catch(() => {});
    }
    if (context.wants("fork_floor_1g")) {
      const image = join(Deno.realPathSync(source.paths.root), "volume.img");
      const t0 = now();
      await run("cp", ["--sparse=always", "--reflink=auto", image, copy]);
      await run("sync", [copy]);
      samples.get("fork_floor_1g")!.push(now() - t0);
      await Deno.remove(copy).catch(() => {});
    }
    context.progress.step("fork + cp baseline + floor", i + 1, runs);
  }
  await Deno.remove(file).catch(() => {});
  return samples;
}

async function command(sandbox: Sandbox, shell: string): Promise<void> {
  const id = await sandbox.submit({ shell, timeoutMs: 300_000 });
  const { result } = await sandbox.queue.collect(id, { revive: (t) => sandbox.ensure(t) });
  await sandbox.queue.ack(id);
  if (result.exitCode !== 0) throw new Error(`'${shell}' failed: ${JSON.stringify(result)}`);
}

async function run(program: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(program, { args, stdout: "null", stderr: "piped" }).output();
  if (out.code !== 0) {
    throw new Error(`${program} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
}
