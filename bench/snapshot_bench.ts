/**
 * The snapshot section of `deno task bench`: one sandbox whose workspace
 * holds 500 MiB of random bytes (written by a command), measured a few times
 * each, interleaved so every case sees the same machine:
 *
 * - `snapshot_save_500m`: `saveSnapshot` (the volume frozen while its image
 *   is copied sparse; the host's filesystem decides whether it is reflinked);
 * - `snapshot_restore_500m`: `restoreSnapshot` into a workspace a command
 *   emptied first (`rm -rf /workspace/*`): the container's stop and start
 *   included;
 * - `cp_sparse_500m`: the baseline, `cp --sparse=always` of the same 500 MiB
 *   file from the volume to the host's disk;
 * - `docker_cp_500m`: `docker cp` of the same file out of the container,
 *   when the docker CLI is installed.
 *
 * The host's page cache is as the previous step left it: the baselines read
 * bytes just written; a save first flushes the volume (the freeze) and reads
 * an image a restore just rewrote through the loop device.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import { DockerClient } from "../lib/docker/mod.ts";
import { removeSandbox } from "../lib/sandbox/remove.ts";
import { quotaSupport } from "../lib/lifecycle/quota.ts";
import { openSandbox, type Sandbox } from "../lib/sandbox/open.ts";
import { removeSnapshot, restoreSnapshot, saveSnapshot } from "../lib/lifecycle/snapshot.ts";
import { onPath } from "../lib/fs.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const SNAPSHOT_CASES = [
  "snapshot_save_500m",
  "snapshot_restore_500m",
  "cp_sparse_500m",
  "docker_cp_500m",
] as const;

/** The snapshot section. */
export const snapshotSection: Section = {
  name: "snapshot",
  cases: SNAPSHOT_CASES,
  run: runSnapshotSection,
};

const MIB = 1024 ** 2;
const WORKSPACE_MIB = 500;
/** Each run moves 500 MiB: a few samples. */
const RUNS_MAX = 5;

/**
 * Runs the wanted snapshot cases. Without Docker or the disk-quota volume
 * (root and loop devices) it says why on stderr and measures nothing.
 *
 * @param context Counts, root directory, filter, progress and cleanup.
 * @returns Results and the save and restore ratios to the `cp` baseline.
 */
export async function runSnapshotSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  const support = quotaSupport();
  try {
    await docker.ping();
    if (!support.supported) throw new Error(support.reason);
  } catch (error) {
    console.error(
      `bench: snapshot section skipped: ${error instanceof Error ? error.message : error}`,
    );
    return { results: [], ratios: [] };
  }
  const home = join(context.root, "snapshot-home");
  const config = { home, idleSeconds: 0, quotaBytes: 2048 * MIB };
  const sandbox = openSandbox("bench-snapshot", { config, docker });
  const release = context.cleanup.add(async () => {
    sandbox.close();
    await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true });
  });
  try {
    await command(sandbox, `head -c ${WORKSPACE_MIB * MIB} /dev/urandom > /workspace/big`);
    context.progress.note(`snapshot: ${WORKSPACE_MIB} MiB written in the workspace`);
    const samples = await measure(context, sandbox, docker);
    const note = `${WORKSPACE_MIB} MiB of random bytes in the workspace`;
    const results: BenchResult[] = [];
    for (const name of SNAPSHOT_CASES) {
      const list = samples.get(name) ?? [];
      if (list.length > 0) results.push(summarize(name, list, { note }));
    }
    const byName = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
    const ratios = [
      ratioOf("snapshot_save_vs_cp", byName("snapshot_save_500m"), byName("cp_sparse_500m")),
      ratioOf("snapshot_restore_vs_cp", byName("snapshot_restore_500m"), byName("cp_sparse_500m")),
    ].filter((ratio) => ratio !== undefined);
    return { results, ratios };
  } finally {
    await release();
  }
}

// Interleaved runs: a save, a restore into an emptied workspace, the baselines.
async function measure(
  context: BenchContext,
  sandbox: Sandbox,
  docker: DockerClient,
): Promise<Map<string, number[]>> {
  const samples = new Map<string, number[]>(SNAPSHOT_CASES.map((name) => [name, []]));
  const runs = Math.min(context.n, RUNS_MAX);
  const container = async (): Promise<string> => {
    await sandbox.ensure();
    return sandbox.lastEnsure!.containerId;
  };
  const timed = async (name: string, fn: () => Promise<unknown>): Promise<void> => {
    if (!context.wants(name)) return;
    const t0 = now();
    await fn();
    samples.get(name)!.push(now() - t0);
  };
  await saveSnapshot(sandbox, "bench-base");
  for (let i = 0; i < runs; i++) {
    await timed("snapshot_save_500m", () => saveSnapshot(sandbox, `bench-${i}`));
    if (context.wants("snapshot_save_500m")) await removeSnapshot(sandbox, `bench-${i}`);
    if (context.wants("snapshot_restore_500m")) {
      await command(sandbox, "rm -rf /workspace/*");
      await timed(
        "snapshot_restore_500m",
        () => restoreSnapshot(sandbox, "bench-base", { docker }),
      );
    }
    const target = join(context.root, "snapshot-baseline.img");
    await timed(
      "cp_sparse_500m",
      () => run("cp", ["--sparse=always", join(sandbox.paths.workspace, "big"), target]),
    );
    await Deno.remove(target).catch(() => {});
    if (onPath("docker")) {
      const id = await container();
      await timed("docker_cp_500m", () => run("docker", ["cp", `${id}:/workspace/big`, target]));
      await Deno.remove(target).catch(() => {});
    }
    context.progress.step("snapshot save + restore + baselines", i + 1, runs);
  }
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
    throw new Error(
      `'${program} ${args.join(" ")}' failed: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
}
