/**
 * The image and stream section of `deno task bench`, on the path users run
 * (the installed `waffle` launcher as a whole process), interleaved so every
 * case sees the same machine:
 *
 * - `python_cold_waffle`: `waffle exec --image waffle-python:bookworm` for a
 *   user with no container yet (create, start, runner ready, the command);
 * - `python_cold_docker_run`: the baseline, `docker run --rm --network none`
 *   of the same image and command;
 * - `python_warm_waffle`: the same `waffle exec` again, container warm;
 * - `python_pooled_waffle`: `waffle exec` for a new user of a home that keeps
 *   a warm pool of the image (`[templates.py] warm = 1`, refilled by
 *   `waffle pool fill`, untimed, before each sample);
 * - `stdin_stream_64m_waffle`: 64 MiB piped through `waffle exec -i -- sha256sum`;
 * - `stdin_stream_64m_docker_exec`: the baseline, `docker exec -i` of the same
 *   into the same container.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import { DockerClient } from "../lib/docker/mod.ts";
import { removeSandbox } from "../lib/sandbox/remove.ts";
import { openSandbox } from "../lib/sandbox/open.ts";
import { installedWaffle } from "./cli_bench.ts";
import { sandboxKey } from "../lib/config/sandbox_key.ts";
import { statePaths } from "../lib/lifecycle/identity.ts";
import { readBinding } from "../lib/lifecycle/pool.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const IMAGE_CASES = [
  "python_cold_waffle",
  "python_cold_docker_run",
  "python_warm_waffle",
  "python_pooled_waffle",
  "stdin_stream_64m_waffle",
  "stdin_stream_64m_docker_exec",
] as const;

/** The image and stream section. */
export const imageSection: Section = {
  name: "image",
  cases: IMAGE_CASES,
  run: runImageSection,
};

const PYTHON = "waffle-python:bookworm";
const RUNS_MAX = 5;
const STREAM_BYTES = 64 * 1024 ** 2;

/**
 * Runs the wanted cases. Without Docker or the python image it says why on
 * stderr and measures nothing.
 *
 * @param context Counts, root directory, filter, progress and cleanup.
 * @returns Results and the cold-start and stream ratios to their baselines.
 */
export async function runImageSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  try {
    await docker.ping();
    if (await docker.inspectImage(PYTHON) === null) {
      throw new Error(`no image '${PYTHON}' (bash scripts/build_images.sh python)`);
    }
  } catch (error) {
    console.error(
      `bench: image section skipped: ${error instanceof Error ? error.message : error}`,
    );
    return { results: [], ratios: [] };
  }
  const waffle = await installedWaffle(context);
  const home = join(context.root, "image-home");
  await Deno.mkdir(home, { recursive: true });
  const env = { WAFFLE_HOME: home, WAFFLE_IMAGE: PYTHON };
  const users: string[] = [];
  context.cleanup.add(async () => {
    for (const user of users) {
      const sandbox = openSandbox(user, { config: { home, image: PYTHON }, docker });
      sandbox.close();
      await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true });
    }
  });
  const pooledHome = join(context.root, "image-pool-home");
  await Deno.mkdir(pooledHome, { recursive: true });
  await Deno.writeTextFile(
    join(pooledHome, "waffle.toml"),
    `[templates.py]\nimage = "${PYTHON}"\nwarm = 1\n`,
  );
  const pooledEnv = { WAFFLE_HOME: pooledHome, WAFFLE_IMAGE: PYTHON };
  context.cleanup.add(async () => {
    for (const user of users) {
      await run(waffle, ["rm", "--purge", "--user", `${user}-pooled`], { env: pooledEnv })
        .catch(() => {});
    }
    await run(waffle, ["pool", "drain"], { env: pooledEnv }).catch(() => {});
  });
  const data = join(context.root, "stream-64m");
  await run("head", ["-c", String(STREAM_BYTES), "/dev/urandom"], { stdoutTo: data });
  const samples = new Map<string, number[]>(IMAGE_CASES.map((name) => [name, []]));
  const timed = async (name: string, fn: () => Promise<unknown>): Promise<void> => {
    if (!context.wants(name)) return;
    const t0 = now();
    await fn();
    samples.get(name)!.push(now() - t0);
  };
  const python = ["python3", "-c", "print(1)"];
  const runs = Math.min(context.n, RUNS_MAX);
  for (let i = 0; i < runs; i++) {
    const user = `bench-image-${i}`;
    users.push(user);
    const exec = ["exec", "--user", user, "--"];
    await timed("python_cold_waffle", () => run(waffle, [...exec, ...python], { env }));
    await timed(
      "python_cold_docker_run",
      () => run("docker", ["run", "--rm", "--network", "none", PYTHON, ...python]),
    );
    await timed("python_warm_waffle", () => run(waffle, [...exec, ...python], { env }));
    if (context.wants("python_pooled_waffle")) {
      // The installed waffle fills it: its members run the same artefact as its users.
      await run(waffle, ["pool", "fill"], { env: pooledEnv });
      await timed(
        "python_pooled_waffle",
        () =>
          run(waffle, ["exec", "--user", `${user}-pooled`, "--", ...python], { env: pooledEnv }),
      );
      const key = sandboxKey("default", `${user}-pooled`, { home: pooledHome });
      if (readBinding(statePaths(pooledHome, key).root) === undefined) {
        throw new Error(`User '${user}-pooled' was not served by the pool`);
      }
    }
    await timed(
      "stdin_stream_64m_waffle",
      () => run(waffle, ["exec", "-i", "--user", user, "--", "sha256sum"], { env, stdin: data }),
    );
    const container = openSandbox(user, { config: { home, image: PYTHON }, docker });
    const id = container.key.containerName;
    container.close();
    await timed(
      "stdin_stream_64m_docker_exec",
      () => run("docker", ["exec", "-i", "-u", "10001", id, "sha256sum"], { stdin: data }),
    );
    context.progress.step("image: cold, warm, stdin stream", i + 1, runs);
  }
  const results: BenchResult[] = [];
  for (const name of IMAGE_CASES) {
    const list = samples.get(name) ?? [];
    const note = name.startsWith("stdin") ? "64 MiB of random bytes" : `${PYTHON}, python3 -c`;
    if (list.length > 0) results.push(summarize(name, list, { note }));
  }
  const byName = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
  const ratios = [
    ratioOf(
      "python_cold_waffle / python_cold_docker_run",
      byName("python_cold_waffle"),
      byName("python_cold_docker_run"),
    ),
    ratioOf(
      "python_pooled_waffle / python_cold_docker_run",
      byName("python_pooled_waffle"),
      byName("python_cold_docker_run"),
    ),
    ratioOf(
      "python_warm_waffle / python_cold_docker_run",
      byName("python_warm_waffle"),
      byName("python_cold_docker_run"),
    ),
    ratioOf(
      "stdin_stream_64m_waffle / stdin_stream_64m_docker_exec",
      byName("stdin_stream_64m_waffle"),
      byName("stdin_stream_64m_docker_exec"),
    ),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}

async function run(
  program: string,
  args: string[],
  options: { env?: Record<string, string>; stdin?: string; stdoutTo?: string } = {},
): Promise<void> {
  const child = new Deno.Command(program, {
    args,
    stdin: options.stdin === undefined ? "null" : "piped",
    stdout: options.stdoutTo === undefined ? "null" : "piped",
    stderr: "piped",
    ...(options.env === undefined ? {} : { env: options.env }),
  }).spawn();
  const feeding = options.stdin === undefined
    ? Promise.resolve()
    : Deno.open(options.stdin).then((file) => file.readable.pipeTo(child.stdin));
  const writing = options.stdoutTo === undefined
    ? Promise.resolve()
    : Deno.open(options.stdoutTo, { write: true, create: true, truncate: true })
      .then((file) => child.stdout.pipeTo(file.writable));
  const [status, stderr] = await Promise.all([
    child.status,
    new Response(child.stderr).text(),
    feeding,
    writing,
  ]);
  if (status.code !== 0) {
    throw new Error(`'${program} ${args.join(" ")}' failed (${status.code}): ${stderr.trim()}`);
  }
}
