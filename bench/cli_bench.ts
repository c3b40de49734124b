/**
 * The CLI section of `deno task bench`: what users run, side by side.
 *
 * - `cli_exec_warm`: `waffle exec --user u -- true` as a whole process, the
 *   installed `waffle` (from `scripts/install.sh`) started from `/` with a
 *   warm sandbox; exit code 0 or it counts as an error;
 * - `docker_exec_cli`: `docker exec C true` with the docker CLI on that same
 *   user's container, interleaved with the above in blocks so both see the
 *   same machine load;
 * - `cli_version`: `waffle --version` as a whole process (the CLI's start);
 * - `deno_eval_0`: `deno eval 0` with the install's Deno (its floor),
 *   interleaved with the above in blocks;
 * - `library_submit_warm`: in this process, as the README shows:
 *   `openSandbox("u2", …)` once, then `sandbox.submit({argv: ["true"]})` →
 *   `sandbox.queue.collect(id)` → `sandbox.queue.ack(id)` per sample.
 *
 * Ratios: `cli_exec_warm / docker_exec_cli`, `cli_version / deno_eval_0`
 * and `library_submit_warm / floor`, the latter with the queue section's `floor` of the same run (no
 * ratio, and a note saying so, when `--only` left `floor` out); and
 * `(deno_eval_0 + library_submit_warm) / docker_exec_cli`, the CLI's floor
 * (Deno's start plus the library's warm call) against `docker exec`.
 *
 * `waffle` is installed into a prefix under the temp root with
 * `scripts/install.sh --no-docker` (idempotent, a few seconds), unless
 * `WAFFLE_BENCH_PREFIX` names an existing installation to use as it is.
 * The docker CLI is used only by the benchmark; the product never runs it.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { DockerClient } from "../lib/docker/mod.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";
import { openSandbox, type Sandbox } from "../lib/mod.ts";
import { homeContainers, removeHome } from "./fleet_bench.ts";
import type { BenchContext, Section } from "./section.ts";
import {
  type BenchRatio,
  type BenchReport,
  type BenchResult,
  now,
  ratioOf,
  summarize,
} from "./stats.ts";

/** Case names of this section. */
export const CLI_CASES = [
  "cli_version",
  "deno_eval_0",
  "cli_exec_warm",
  "docker_exec_cli",
  "library_submit_warm",
] as const;

/** The CLI section. */
export const cliSection: Section = {
  name: "cli",
  cases: CLI_CASES,
  run: runCliSection,
};

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const CLI_USER = "u";
const LIBRARY_USER = "u2";
const BLOCK = 10;
/** Whole processes cost ~0.1 s each: fewer samples. */
const PROCESS_MAX = 50;
/** With `--quick`. */
const QUICK_PROCESS_MAX = 20;
/** Unmeasured process runs first (page cache, the sandbox's runner JIT). */
const PROCESS_WARMUP = 5;

/** A child process's outcome. */
interface Ran {
  ms: number;
  code: number;
  stderr: string;
}

/**
 * Runs the wanted CLI cases. Without a reachable daemon it says why on
 * stderr and measures nothing.
 *
 * @param context Counts, root directory, filter, progress, cleanup and the
 *   earlier sections' results (for `floor`).
 * @returns Results and the two target ratios.
 */
export async function runCliSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  try {
    await docker.ping();
  } catch (error) {
    console.error(`bench: cli section skipped: ${messageOf(error)}`);
    return { results: [], ratios: [] };
  }
  const home = await Deno.realPath(await makeDir(join(context.root, "cli-home")));
  const sandboxes: Sandbox[] = [];
  const release = context.cleanup.add(async () => {
    for (const sandbox of sandboxes.splice(0)) sandbox.close();
    await removeHome(docker, home);
    await Deno.remove(home, { recursive: true });
  });
  const results: BenchResult[] = [];
  try {
    if (context.wants("cli_version") || context.wants("deno_eval_0")) {
      results.push(...await measureStart(context, await installedWaffle(context), home));
    }
    if (context.wants("cli_exec_warm") || context.wants("docker_exec_cli")) {
      const waffle = await installedWaffle(context);
      const env = childEnv(home, waffle);
      const exec = (): Promise<Ran> =>
        timedRun(waffle, ["exec", "--user", CLI_USER, "--", "true"], env);
      const first = await exec();
      if (first.code !== 0) {
        throw new Error(
          `'waffle exec --user ${CLI_USER} -- true' exited ${first.code}: ${first.stderr}`,
        );
      }
      const container = (await homeContainers(docker, home)).find((summary) =>
        summary.Labels[LABELS.user] === CLI_USER && summary.State === "running"
      );
      if (container === undefined) throw new Error(`No running container of '${CLI_USER}'`);
      context.progress.note(
        `cli: sandbox of '${CLI_USER}' is ${container.Id.slice(0, 12)} (first exec ${
          first.ms.toFixed(0)
        } ms)`,
      );
      const dockerExec = (): Promise<Ran> =>
        timedRun("docker", ["exec", container.Id, "true"], env);
      for (let i = 0; i < Math.min(context.warmup, PROCESS_WARMUP); i++) {
        await exec();
        await dockerExec();
      }
      const wantCli = context.wants("cli_exec_warm");
      const wantDocker = context.wants("docker_exec_cli");
      const count = processCount(context);
      const cli: Samples = { ms: [], errors: 0 };
      const cliDocker: Samples = { ms: [], errors: 0 };
      const label = [wantCli ? "cli_exec_warm" : "", wantDocker ? "docker_exec_cli" : ""]
        .filter((name) => name !== "").join(" + ");
      const total = (wantCli ? count : 0) + (wantDocker ? count : 0);
      const pending = (samples: Samples): boolean => samples.ms.length + samples.errors < count;
      while ((wantCli && pending(cli)) || (wantDocker && pending(cliDocker))) {
        for (let i = 0; i < BLOCK && wantCli && pending(cli); i++) record(cli, await exec());
        for (let i = 0; i < BLOCK && wantDocker && pending(cliDocker); i++) {
          record(cliDocker, await dockerExec());
        }
        const done = cli.ms.length + cli.errors + cliDocker.ms.length + cliDocker.errors;
        context.progress.step(label, done, total);
      }
      for (
        const [name, samples] of [["cli_exec_warm", cli], ["docker_exec_cli", cliDocker]] as const
      ) {
        if (samples.firstError !== undefined) {
          context.progress.note(`${name}: ${samples.errors} errors, first: ${samples.firstError}`);
        }
      }
      if (wantCli) {
        results.push(
          summarize("cli_exec_warm", cli.ms, {
            details: { errors: cli.errors, first_exec: first.ms },
            note: "`waffle exec --user u -- true`, installed launcher, from /",
          }),
        );
      }
      if (wantDocker) {
        results.push(
          summarize("docker_exec_cli", cliDocker.ms, {
            details: { errors: cliDocker.errors },
            note: "`docker exec C true` (CLI), same container",
          }),
        );
      }
    }
    if (context.wants("library_submit_warm")) {
      const runner = await installedRunner(context);
      const sandbox = openSandbox(LIBRARY_USER, { config: { home, runner } });
      sandboxes.push(sandbox);
      const submit = async (): Promise<string | undefined> => {
        const id = await sandbox.submit({ argv: ["true"] });
        const { result } = await sandbox.queue.collect(id);
        await sandbox.queue.ack(id);
        return result.exitCode === 0 ? undefined : `'true' ended ${JSON.stringify(result)}`;
      };
      // The first call creates the container; then warm up.
      await submit();
      for (let i = 0; i < context.warmup; i++) await submit();
      const samples: Samples = { ms: [], errors: 0 };
      while (samples.ms.length + samples.errors < context.n) {
        const t0 = now();
        let failure: string | undefined;
        try {
          failure = await submit();
        } catch (error) {
          failure = messageOf(error);
        }
        record(samples, {
          ms: now() - t0,
          code: failure === undefined ? 0 : 1,
          stderr: failure ?? "",
        });
        context.progress.step("library_submit_warm", samples.ms.length + samples.errors, context.n);
      }
      if (samples.firstError !== undefined) {
        context.progress.note(
          `library_submit_warm: ${samples.errors} errors, first: ${samples.firstError}`,
        );
      }
      const haveFloor = context.results.some((result) => result.name === "floor");
      if (!haveFloor) {
        context.progress.note("library_submit_warm: no `floor` in this run, so no ratio to it");
      }
      results.push(
        summarize("library_submit_warm", samples.ms, {
          details: { errors: samples.errors },
          note: `sandbox.submit → collect → ack, in process${
            haveFloor ? "" : "; no floor this run (--only)"
          }`,
        }),
      );
    }
  } finally {
    await release();
  }
  const find = (name: string): BenchResult | undefined =>
    results.find((r) => r.name === name) ?? context.results.find((r) => r.name === name);
  const ratios = [
    ratioOf(
      "cli_exec_warm / docker_exec_cli",
      find("cli_exec_warm"),
      find("docker_exec_cli"),
    ),
    ratioOf("cli_version / deno_eval_0", find("cli_version"), find("deno_eval_0")),
    ratioOf("library_submit_warm / floor", find("library_submit_warm"), find("floor")),
    cliExecFloor(find),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}

// The least a `waffle exec` process can cost, in this run: Deno's own start
// plus what the library pays for the same call in a warm process. Beside
// `cli_exec_warm / docker_exec_cli`, it says how much of that ratio is the
// CLI's own and how much no CLI built on a Deno process could avoid.
function cliExecFloor(find: (name: string) => BenchResult | undefined): BenchRatio | undefined {
  const start = find("deno_eval_0")?.p50_ms;
  const library = find("library_submit_warm")?.p50_ms;
  const docker = find("docker_exec_cli")?.p50_ms;
  if (start === undefined || library === undefined || docker === undefined || docker === 0) {
    return undefined;
  }
  return {
    name: "(deno_eval_0 + library_submit_warm) / docker_exec_cli",
    value: (start + library) / docker,
  };
}

function processCount(context: BenchContext): number {
  return Math.min(context.n, context.quick ? QUICK_PROCESS_MAX : PROCESS_MAX);
}

// `waffle --version` and `deno eval 0` (the install's Deno, else this one),
// interleaved in blocks so both see the same load.
async function measureStart(
  context: BenchContext,
  waffle: string,
  home: string,
): Promise<BenchResult[]> {
  const env = childEnv(home, waffle);
  let deno = join(waffle, "..", "..", "lib", "waffle", "deno");
  try {
    await Deno.stat(deno);
  } catch {
    deno = Deno.execPath();
  }
  const cases = [
    { name: "cli_version", run: () => timedRun(waffle, ["--version"], env) },
    { name: "deno_eval_0", run: () => timedRun(deno, ["eval", "0"], env) },
  ].filter((entry) => context.wants(entry.name));
  const count = processCount(context);
  const samples = cases.map((): Samples => ({ ms: [], errors: 0 }));
  for (let i = 0; i < Math.min(context.warmup, PROCESS_WARMUP); i++) {
    for (const entry of cases) await entry.run();
  }
  const label = cases.map((entry) => entry.name).join(" + ");
  for (let done = 0; done < count; done += BLOCK) {
    for (const [index, entry] of cases.entries()) {
      for (let i = done; i < Math.min(count, done + BLOCK); i++) {
        record(samples[index]!, await entry.run());
      }
    }
    context.progress.step(
      label,
      Math.min(count, done + BLOCK) * cases.length,
      count * cases.length,
    );
  }
  return cases.map((entry, index) => {
    const taken = samples[index]!;
    if (taken.firstError !== undefined) {
      context.progress.note(`${entry.name}: ${taken.errors} errors, first: ${taken.firstError}`);
    }
    return summarize(entry.name, taken.ms, {
      details: { errors: taken.errors },
      note: entry.name === "cli_version"
        ? "`waffle --version`, installed launcher, whole process"
        : `\`deno eval 0\`, ${deno === Deno.execPath() ? "this" : "the install's"} Deno`,
    });
  });
}

/** Successful samples' milliseconds, and the failures. */
interface Samples {
  ms: number[];
  errors: number;
  firstError?: string;
}

function record(samples: Samples, ran: Ran): void {
  if (ran.code === 0) {
    samples.ms.push(ran.ms);
    return;
  }
  samples.errors++;
  samples.firstError ??= `exit ${ran.code}: ${ran.stderr.trim().slice(0, 500)}`;
}

/**
 * The installed `waffle` launcher: `WAFFLE_BENCH_PREFIX/bin/waffle` when
 * that variable is set and the file exists, else a fresh install into a
 * prefix under the temp root.
 *
 * @param context For the root and progress lines.
 * @returns The launcher's absolute path.
 * @throws {Error} When the install fails.
 */
export function installedWaffle(context: BenchContext): Promise<string> {
  // One install per run, whichever section asks first.
  let launcher = installs.get(context.root);
  if (launcher === undefined) {
    launcher = install(context);
    installs.set(context.root, launcher);
  }
  return launcher;
}

const installs = new Map<string, Promise<string>>();

/**
 * The installed artefact (`PREFIX/lib/waffle/waffle.js`, the install's name
 * for its current build directory) that the benchmark's
 * sandboxes run as their runner, as an installed `waffle` does: sections
 * that drive the library pass it as the `runner` setting.
 *
 * @param context For the root and progress lines.
 * @returns The artefact's absolute path.
 */
export async function installedRunner(context: BenchContext): Promise<string> {
  const launcher = await installedWaffle(context);
  return join(launcher, "..", "..", "lib", "waffle", "waffle.js");
}

async function install(context: BenchContext): Promise<string> {
  const given = Deno.env.get("WAFFLE_BENCH_PREFIX");
  if (given) {
    const launcher = join(given, "bin", "waffle");
    try {
      await Deno.stat(launcher);
      context.progress.note(`cli: using ${launcher} (WAFFLE_BENCH_PREFIX)`);
      return launcher;
    } catch {
      context.progress.note(`cli: no ${launcher}; installing into ${given}`);
    }
  }
  const prefix = given || join(context.root, "prefix");
  const t0 = now();
  const out = await new Deno.Command("bash", {
    args: [join(REPO, "scripts", "install.sh"), "--prefix", prefix, "--no-docker"],
    cwd: REPO,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    const tail = new TextDecoder().decode(out.stderr).trim().split("\n").slice(-20).join("\n");
    throw new Error(`scripts/install.sh --prefix ${prefix} exited ${out.code}:\n${tail}`);
  }
  const launcher = join(prefix, "bin", "waffle");
  context.progress.note(`cli: installed ${launcher} in ${((now() - t0) / 1000).toFixed(1)} s`);
  return launcher;
}

// What every child gets: PATH (the install's bin first), HOME, the home, and
// the daemon's address and image override when set.
function childEnv(home: string, waffle: string): Record<string, string> {
  const env: Record<string, string> = {
    PATH: `${join(waffle, "..")}:${Deno.env.get("PATH") ?? "/usr/bin:/bin"}`,
    HOME: Deno.env.get("HOME") ?? "/",
    WAFFLE_HOME: home,
  };
  for (const name of ["DOCKER_HOST", "WAFFLE_IMAGE"]) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  return env;
}

// Runs a whole process from `/`, timing spawn to exit.
async function timedRun(
  command: string,
  args: string[],
  env: Record<string, string>,
): Promise<Ran> {
  const t0 = now();
  const out = await new Deno.Command(command, {
    args,
    cwd: "/",
    env,
    clearEnv: true,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).output();
  const ms = now() - t0;
  return { ms, code: out.code, stderr: new TextDecoder().decode(out.stderr) };
}

async function makeDir(path: string): Promise<string> {
  await Deno.mkdir(path, { recursive: true });
  return path;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
