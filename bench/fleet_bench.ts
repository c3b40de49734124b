/**
 * The fleet section of `deno task bench`: many users' warm sandboxes in one
 * waffle home, driven at once from this process through the library path
 * the README shows (`sandbox.submit` → `queue.collect` → `queue.ack`).
 *
 * - `fleet_1`, `fleet_10`, `fleet_50`: that many users, each running `true`
 *   one command at a time, all users concurrently, for `--seconds`. Latency
 *   is per command; `per_s` is the aggregate rate. Details: `cpu_ms_per_cmd`
 *   (this process's user + system CPU per command, `process.cpuUsage()`),
 *   `sandbox_cpu_ms_per_cmd` (the fleet's containers' CPU per command, from
 *   the cgroup, when readable), `rss_mib` (this process's RSS at the end),
 *   `sandbox_mib` (median of the containers' cgroup memory usage right after
 *   the run), `sandbox_anon_mib` (the same minus inactive file pages) and
 *   `errors` (failed commands; must be 0; a failure is counted, never thrown).
 *   Fleets grow: `fleet_10` reuses the sandbox of `fleet_1` and starts nine
 *   more, five at a time, each warmed with a few unmeasured commands.
 * - `idle_sandbox_memory`: after the largest fleet (50 when no fleet case is
 *   wanted, 1 with `--quick`) has sat idle for 5 s, the median of its containers' memory.
 *   `mib` is cgroup usage minus inactive file pages (page cache the kernel
 *   reclaims first: what a sandbox really holds); `usage_mib` is the raw
 *   `memory.usage_in_bytes` (what `docker stats` shows on cgroup v1 before
 *   its own cache adjustment).
 *
 * Memory comes from the cgroup files (v1 `memory/docker/<id>`, else the
 * systemd or v2 layouts), else from the Engine API's stats; the result's
 * note says which.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import process from "node:process";
import { DockerClient } from "../lib/docker/mod.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";
import { removeVolume } from "../lib/lifecycle/quota.ts";
import { openSandbox, type Sandbox } from "../lib/sandbox/open.ts";
import { installedRunner } from "./cli_bench.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const FLEET_CASES = ["fleet_1", "fleet_10", "fleet_50", "idle_sandbox_memory"] as const;

/** The fleet section. */
export const fleetSection: Section = {
  name: "fleet",
  cases: FLEET_CASES,
  run: runFleetSection,
};

const SIZES = [1, 10, 50] as const;
/** Sandboxes started at once: ensure is Docker- and CPU-heavy. */
const START_AT_ONCE = 5;
/** Unmeasured commands per new sandbox (runner JIT, page cache). */
const WARM_COMMANDS = 3;
/** How long the fleet sits idle before `idle_sandbox_memory` is read. */
const IDLE_MS = 5000;
/** Pause after a failed command, so a broken sandbox does not spin. */
const ERROR_PAUSE_MS = 50;
const MIB = 1024 * 1024;

/** One container's memory, in bytes. */
export interface SandboxMemory {
  /** Cgroup usage (v1 `memory.usage_in_bytes`, v2 `memory.current`, or the API's). */
  usage: number;
  /** Inactive file pages (reclaimable page cache); undefined from the API. */
  inactiveFile: number | undefined;
  /** Where the numbers came from, e.g. `cgroup v1`. */
  source: string;
}

/**
 * Runs the wanted fleet cases. Without a reachable daemon it says why on
 * stderr and measures nothing.
 *
 * @param context Counts, time budget, root directory, filter, progress and cleanup.
 * @returns Results and the 10-to-1 user scaling ratio.
 */
export async function runFleetSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  try {
    await docker.ping();
  } catch (error) {
    console.error(`bench: fleet section skipped: ${messageOf(error)}`);
    return { results: [], ratios: [] };
  }
  const home = await Deno.realPath(await makeDir(join(context.root, "fleet-home")));
  // The installed artefact as the runner, as an installed waffle has it.
  const config = { home, idleSeconds: 0, runner: await installedRunner(context) };
  const fleet: Sandbox[] = [];
  const release = context.cleanup.add(async () => {
    for (const sandbox of fleet.splice(0)) sandbox.close();
    context.progress.note("fleet: removing sandboxes");
    await removeHome(docker, home);
    await Deno.remove(home, { recursive: true });
  });
  const results: BenchResult[] = [];
  try {
    const sizes = SIZES.filter((size) => context.wants(`fleet_${size}`));
    let startErrors = 0;
    const grow = async (size: number): Promise<void> => {
      const target = size - fleet.length;
      if (target <= 0) return;
      const users = Array.from({ length: target }, (_, i) => `bench-fleet-${fleet.length + i}`);
      let started = 0;
      const t0 = now();
      const opened = await mapBounded(users, START_AT_ONCE, async (user) => {
        let sandbox: Sandbox | undefined;
        try {
          sandbox = openSandbox(user, { config, docker });
          await sandbox.ensure();
          for (let i = 0; i < WARM_COMMANDS; i++) await runTrue(sandbox);
        } catch (error) {
          startErrors++;
          context.progress.note(`fleet: starting '${user}' failed: ${messageOf(error)}`);
        }
        context.progress.step("fleet: start", ++started, target);
        return sandbox;
      });
      for (const sandbox of opened) if (sandbox !== undefined) fleet.push(sandbox);
      context.progress.note(
        `fleet: ${fleet.length} sandboxes warm (${target} started in ${
          ((now() - t0) / 1000).toFixed(1)
        } s)`,
      );
    };
    for (const size of sizes) {
      await grow(size);
      const name = `fleet_${size}`;
      const members = fleet.slice(0, size);
      const ids = containerIds(members);
      const cpuBefore = await sandboxCpuNs(ids);
      const run = await drive(
        members,
        context.seconds * 1000,
        (elapsed, total, done) =>
          context.progress.timed(name, elapsed, total, () => `${done()} commands`),
      );
      const cpuAfter = await sandboxCpuNs(ids);
      const memory = await fleetMemory(docker, containerIds(members));
      const completed = run.latencies.length;
      const details: Record<string, number> = {
        users: size,
        errors: run.errors + (size > members.length ? size - members.length : 0),
        cpu_ms_per_cmd: completed === 0 ? Number.NaN : run.cpuMs / completed,
        rss_mib: Deno.memoryUsage().rss / MIB,
        ...memoryDetails(memory, "sandbox_mib", "sandbox_anon_mib"),
      };
      if (cpuBefore !== undefined && cpuAfter !== undefined && completed > 0) {
        details.sandbox_cpu_ms_per_cmd = (cpuAfter - cpuBefore) / 1e6 / completed;
      }
      if (startErrors > 0) details.start_errors = startErrors;
      if (run.firstError !== undefined) {
        context.progress.note(`${name}: ${run.errors} errors, first: ${run.firstError}`);
      }
      const result = summarize(name, run.latencies, {
        per_s: completed / (run.elapsedMs / 1000),
        details,
        note: `${size} users × one \`true\` at a time, library submit; memory: ${sourceOf(memory)}`,
      });
      results.push(result);
      context.progress.done(
        name,
        `${result.per_s!.toFixed(1)}/s, p50 ${
          result.p50_ms.toFixed(1)
        } ms, ${details.errors} errors`,
      );
    }
    if (context.wants("idle_sandbox_memory")) {
      // --quick: one sandbox's memory, not the median of 50.
      const size = sizes.at(-1) ?? (context.quick ? 1 : SIZES.at(-1)!);
      await grow(size);
      const members = fleet.slice(0, size);
      context.progress.note(`idle_sandbox_memory: ${members.length} sandboxes idle for 5 s`);
      await new Promise((resolve) => setTimeout(resolve, IDLE_MS));
      const memory = await fleetMemory(docker, containerIds(members));
      const details = memoryDetails(memory, "usage_mib", "mib");
      details.idle_s = IDLE_MS / 1000;
      const anon = memory.filter((sample) => sample.inactiveFile !== undefined);
      if (anon.length > 0) {
        const values = anon.map((sample) => (sample.usage - sample.inactiveFile!) / MIB);
        details.min_mib = Math.min(...values);
        details.max_mib = Math.max(...values);
      } else {
        // The API gives usage only: report it as `mib` rather than nothing.
        details.mib = details.usage_mib ?? Number.NaN;
      }
      results.push({
        name: "idle_sandbox_memory",
        n: memory.length,
        p50_ms: Number.NaN,
        p99_ms: Number.NaN,
        mean_ms: Number.NaN,
        min_ms: Number.NaN,
        max_ms: Number.NaN,
        details,
        note: `median of ${memory.length} idle sandboxes: mib = usage − inactive file; ${
          sourceOf(memory)
        }`,
      });
      context.progress.done(
        "idle_sandbox_memory",
        `${details.mib?.toFixed(1)} MiB (usage ${details.usage_mib?.toFixed(1)} MiB)`,
      );
    }
  } finally {
    await release();
  }
  const find = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
  const ratios = [
    ratioOf("fleet_10 / fleet_1 (per_s)", find("fleet_10"), find("fleet_1"), "per_s"),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}

/** What {@linkcode drive} measured. */
interface DriveRun {
  /** Milliseconds of each successful command, submit to ack. */
  latencies: number[];
  /** Failed commands (exit code not 0, or a thrown error). */
  errors: number;
  /** The first failure's message. */
  firstError: string | undefined;
  /** Wall time of the whole run. */
  elapsedMs: number;
  /** This process's user + system CPU over the run. */
  cpuMs: number;
}

// Every sandbox runs `true` one command at a time until the time is up.
async function drive(
  fleet: readonly Sandbox[],
  durationMs: number,
  tick: (elapsedMs: number, totalMs: number, done: () => number) => void,
): Promise<DriveRun> {
  const latencies: number[] = [];
  let errors = 0;
  let firstError: string | undefined;
  const cpu0 = process.cpuUsage();
  const t0 = now();
  const deadline = t0 + durationMs;
  const ticker = setInterval(() => tick(now() - t0, durationMs, () => latencies.length), 1000);
  try {
    await Promise.all(fleet.map(async (sandbox) => {
      while (now() < deadline) {
        const s0 = now();
        try {
          const failure = await runTrue(sandbox);
          if (failure === undefined) {
            latencies.push(now() - s0);
            continue;
          }
          errors++;
          firstError ??= failure;
        } catch (error) {
          errors++;
          firstError ??= messageOf(error);
        }
        await new Promise((resolve) => setTimeout(resolve, ERROR_PAUSE_MS));
      }
    }));
  } finally {
    clearInterval(ticker);
  }
  const elapsedMs = now() - t0;
  const cpu = process.cpuUsage(cpu0);
  return { latencies, errors, firstError, elapsedMs, cpuMs: (cpu.user + cpu.system) / 1000 };
}

// One `true` as the README shows it; a description of the failure, or undefined.
async function runTrue(sandbox: Sandbox): Promise<string | undefined> {
  const id = await sandbox.submit({ argv: ["true"] });
  const { result } = await sandbox.queue.collect(id);
  await sandbox.queue.ack(id);
  if (result.exitCode === 0) return undefined;
  return `'true' ended ${JSON.stringify(result)}`;
}

function containerIds(fleet: readonly Sandbox[]): string[] {
  return fleet.flatMap((sandbox) => sandbox.lastEnsure?.containerId ?? []);
}

async function fleetMemory(docker: DockerClient, ids: readonly string[]): Promise<SandboxMemory[]> {
  const samples = await mapBounded(ids, 10, (id) => sandboxMemory(docker, id).catch(() => null));
  return samples.filter((sample) => sample !== null);
}

/**
 * A container's memory from its cgroup (v1 under `docker/` or
 * `system.slice/`, or v2), else from the Engine API's one-shot stats.
 *
 * @param docker The client (for the fallback).
 * @param id The container's full id.
 * @returns Usage and inactive file bytes, and their source.
 * @throws {Error} When neither the cgroup nor the API answers.
 */
export async function sandboxMemory(docker: DockerClient, id: string): Promise<SandboxMemory> {
  const layouts = [
    { dir: `/sys/fs/cgroup/memory/docker/${id}`, usage: "memory.usage_in_bytes", v: "v1" },
    {
      dir: `/sys/fs/cgroup/memory/system.slice/docker-${id}.scope`,
      usage: "memory.usage_in_bytes",
      v: "v1",
    },
    { dir: `/sys/fs/cgroup/system.slice/docker-${id}.scope`, usage: "memory.current", v: "v2" },
  ];
  for (const layout of layouts) {
    let usageText: string;
    try {
      usageText = await Deno.readTextFile(join(layout.dir, layout.usage));
    } catch {
      continue;
    }
    const stat = await Deno.readTextFile(join(layout.dir, "memory.stat")).catch(() => "");
    const inactive = statField(stat, layout.v === "v1" ? "total_inactive_file" : "inactive_file");
    return {
      usage: Number(usageText.trim()),
      inactiveFile: inactive,
      source: `cgroup ${layout.v} ${layout.usage}`,
    };
  }
  const stats = await docker.stats(id);
  return { usage: stats.memoryUsageBytes, inactiveFile: undefined, source: "Docker stats API" };
}

// The containers' total CPU time in nanoseconds (cgroup v1 cpuacct), if readable.
async function sandboxCpuNs(ids: readonly string[]): Promise<number | undefined> {
  let total = 0;
  for (const id of ids) {
    try {
      total += Number(
        (await Deno.readTextFile(`/sys/fs/cgroup/cpuacct/docker/${id}/cpuacct.usage`)).trim(),
      );
    } catch {
      return undefined;
    }
  }
  return total;
}

function statField(stat: string, key: string): number | undefined {
  for (const line of stat.split("\n")) {
    const [name, value] = line.split(" ");
    if (name === key && value !== undefined) return Number(value);
  }
  return undefined;
}

// Medians in MiB: usage under one key, usage minus inactive file under the other.
function memoryDetails(
  memory: readonly SandboxMemory[],
  usageKey: string,
  anonKey: string,
): Record<string, number> {
  const out: Record<string, number> = {};
  if (memory.length === 0) return out;
  out[usageKey] = median(memory.map((sample) => sample.usage / MIB));
  const anon = memory.filter((sample) => sample.inactiveFile !== undefined);
  if (anon.length > 0) {
    out[anonKey] = median(anon.map((sample) => (sample.usage - sample.inactiveFile!) / MIB));
  }
  return out;
}

function sourceOf(memory: readonly SandboxMemory[]): string {
  const sources = [...new Set(memory.map((sample) => sample.source))];
  return sources.length === 0 ? "not readable" : sources.join(" + ");
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  if (sorted.length === 0) return Number.NaN;
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

/**
 * Maps items with at most `limit` calls in flight, keeping the order.
 *
 * @param items Inputs.
 * @param limit Calls at once (≥ 1).
 * @param fn The call.
 * @returns The outputs, in the inputs' order.
 */
export async function mapBounded<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T) => Promise<R>,
): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const workers = Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) {
      const index = next++;
      out[index] = await fn(items[index]!);
    }
  });
  await Promise.all(workers);
  return out;
}

/**
 * Every container (running or not) labelled with a state path under `home`.
 *
 * @param docker The client.
 * @param home The waffle home (real path).
 * @returns Their ids and labels.
 */
export async function homeContainers(
  docker: DockerClient,
  home: string,
): Promise<{ Id: string; State: string; Labels: Record<string, string> }[]> {
  const all = await docker.listContainers({ all: true, labels: [LABELS.state] });
  return all.filter((summary) => (summary.Labels[LABELS.state] ?? "").startsWith(`${home}/`));
}

/**
 * Force-removes the home's containers (a few at a time), then unmounts its
 * sandboxes' volumes. Other homes' containers on the daemon are left alone.
 *
 * @param docker The client.
 * @param home The waffle home (real path).
 */
export async function removeHome(docker: DockerClient, home: string): Promise<void> {
  await mapBounded(
    await homeContainers(docker, home),
    START_AT_ONCE,
    (summary) => docker.removeContainer(summary.Id, { force: true }).catch(() => false),
  );
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(join(home, "sandboxes"))];
  } catch {
    return;
  }
  for (const entry of entries) {
    await removeVolume(join(home, "sandboxes", entry.name)).catch(() => {});
  }
}

async function makeDir(path: string): Promise<string> {
  await Deno.mkdir(path, { recursive: true });
  return path;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
