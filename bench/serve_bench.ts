/**
 * The `waffle serve` section of `deno task bench`: E2B's SDK (`npm:e2b`, as
 * its users call it, in this process) against a `waffle serve` of the
 * installed launcher, each figure beside its baseline in the same loop:
 *
 * - `e2b_create`: `Sandbox.create("base")` to the first `commands.run("true")`
 *   result, against `e2b_docker_run_cold`: create + start + wait + remove of
 *   `true` in the same image through the Engine API (as `docker_run_cold`);
 * - `e2b_create_warm`: the same from template `warm`, whose warm pool of 4
 *   the server refills (waited for, untimed, before each sample), against
 *   the same `e2b_docker_run_cold`;
 * - `e2b_run`: `commands.run("true")` on a live sandbox, against
 *   `e2b_docker_exec_cli`: `docker exec C true` into that sandbox's container
 *   with the docker CLI, and against the CLI section's `library_submit_warm`
 *   when it ran;
 * - `e2b_files_64m`: `files.write` then `files.read` of 64 MiB, against
 *   `e2b_docker_cp_64m`: `docker cp` in then out of the same file.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import { Sandbox } from "e2b";
import { sandboxKey } from "../lib/config/sandbox_key.ts";
import { DockerClient } from "../lib/docker/mod.ts";
import { readyMembers } from "../lib/lifecycle/pool.ts";
import { installedWaffle } from "./cli_bench.ts";
import { runCold } from "./docker_bench.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const SERVE_CASES = [
  "e2b_create",
  "e2b_create_warm",
  "e2b_docker_run_cold",
  "e2b_run",
  "e2b_docker_exec_cli",
  "e2b_files_64m",
  "e2b_docker_cp_64m",
] as const;

const BASE = "waffle-base:bookworm";
const FILE_BYTES = 64 * 1024 * 1024;
// Cold starts vary by about 10% between runs: nine make a steadier p50 than five.
const CREATES_MAX = 9;
const FILES_MAX = 3;
const WARM_POOL = 4;

/** The serve section. */
export const serveSection: Section = {
  name: "serve",
  cases: SERVE_CASES,
  run: runServeSection,
};

async function runServeSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  const image = await docker.inspectImage(BASE).catch(() => null);
  if (image === null) {
    console.error(
      `bench: serve section skipped: no image '${BASE}' (scripts/build_images.sh base)`,
    );
    return { results: [], ratios: [] };
  }
  const waffle = await installedWaffle(context);
  const home = join(context.root, "serve-home");
  await Deno.mkdir(home, { recursive: true });
  const env = { ...Deno.env.toObject(), WAFFLE_HOME: home };
  const options = await serveFor(context, waffle, env);
  const made: Sandbox[] = [];
  context.cleanup.add(async () => {
    for (const sandbox of made) await sandbox.kill().catch(() => false);
  });
  const samples = new Map<string, number[]>(SERVE_CASES.map((name) => [name, []]));
  const add = (name: string, ms: number): void => void samples.get(name)!.push(ms);

  const creates = Math.min(context.n, CREATES_MAX);
  for (
    let i = 0;
    i < creates && (context.wants("e2b_create") || context.wants("e2b_docker_run_cold"));
    i++
  ) {
    const t0 = now();
    const sandbox = await Sandbox.create("base", options);
    await sandbox.commands.run("true");
    add("e2b_create", now() - t0);
    made.push(sandbox);
    add(
      "e2b_docker_run_cold",
      await runCold(docker, image.id, `waffle-bench-e2b-${i}-${Date.now()}`),
    );
    context.progress.step("e2b_create + e2b_docker_run_cold", i + 1, creates);
  }
  // Another server and home, whose template `warm` keeps a pool: no pool
  // may serve the cold creates above.
  const poolHome = join(context.root, "serve-pool-home");
  await Deno.mkdir(poolHome, { recursive: true });
  await Deno.writeTextFile(
    join(poolHome, "waffle.toml"),
    `[templates.warm]\nimage = "${BASE}"\nwarm = ${WARM_POOL}\n`,
  );
  const poolEnv = { ...Deno.env.toObject(), WAFFLE_HOME: poolHome };
  // Registered first, so it runs after the server (which refills) has stopped.
  context.cleanup.add(() => output(waffle, ["pool", "drain"], poolEnv).then(() => {}));
  const pooled = context.wants("e2b_create_warm")
    ? await serveFor(context, waffle, poolEnv)
    : undefined;
  for (let i = 0; i < creates && pooled !== undefined; i++) {
    await untilReady(poolHome, "warm", WARM_POOL);
    const t0 = now();
    const sandbox = await Sandbox.create("warm", pooled);
    await sandbox.commands.run("true");
    add("e2b_create_warm", now() - t0);
    await sandbox.kill();
    context.progress.step("e2b_create_warm", i + 1, creates);
  }
  if (made.length === 0) made.push(await Sandbox.create("base", options));
  const live = made[0]!;
  const container = sandboxKey("bench", live.sandboxId, { home }).containerName;
  if (context.wants("e2b_run") || context.wants("e2b_docker_exec_cli")) {
    for (let i = 0; i < context.warmup; i++) await live.commands.run("true");
    for (let i = 0; i < context.n; i++) {
      let t0 = now();
      await live.commands.run("true");
      add("e2b_run", now() - t0);
      t0 = now();
      await output("docker", ["exec", container, "true"], env);
      add("e2b_docker_exec_cli", now() - t0);
      if ((i + 1) % 10 === 0) context.progress.step("e2b_run + docker exec", i + 1, context.n);
    }
  }
  if (context.wants("e2b_files_64m") || context.wants("e2b_docker_cp_64m")) {
    const data = crypto.getRandomValues(new Uint8Array(65536));
    const file = new Uint8Array(FILE_BYTES);
    for (let at = 0; at < FILE_BYTES; at += data.byteLength) file.set(data, at);
    const local = join(context.root, "e2b-64m");
    await Deno.writeFile(local, file);
    for (let i = 0; i < Math.min(context.n, FILES_MAX); i++) {
      let t0 = now();
      await live.files.write("bench-64m", file.buffer);
      const back = await live.files.read("bench-64m", { format: "bytes" });
      add("e2b_files_64m", now() - t0);
      if (back.byteLength !== FILE_BYTES) throw new Error(`Read back ${back.byteLength} bytes`);
      t0 = now();
      await output("docker", ["cp", local, `${container}:/workspace/cp-64m`], env);
      await output("docker", ["cp", `${container}:/workspace/cp-64m`, `${local}.out`], env);
      add("e2b_docker_cp_64m", now() - t0);
      context.progress.step("e2b_files_64m + docker cp", i + 1, Math.min(context.n, FILES_MAX));
    }
  }
  const results: BenchResult[] = [];
  for (const [name, values] of samples) {
    if (values.length > 0) results.push(summarize(name, values));
  }
  const find = (name: string): BenchResult | undefined =>
    results.find((r) => r.name === name) ?? context.results.find((r) => r.name === name);
  const ratios = [
    ratioOf("e2b_create / e2b_docker_run_cold", find("e2b_create"), find("e2b_docker_run_cold")),
    ratioOf(
      "e2b_create_warm / e2b_docker_run_cold",
      find("e2b_create_warm"),
      find("e2b_docker_run_cold"),
    ),
    ratioOf("e2b_run / e2b_docker_exec_cli", find("e2b_run"), find("e2b_docker_exec_cli")),
    ratioOf("e2b_run / library_submit_warm", find("e2b_run"), find("library_submit_warm")),
    // Throughput against docker cp's: the time ratio the other way round.
    ratioOf("e2b_docker_cp_64m / e2b_files_64m", find("e2b_docker_cp_64m"), find("e2b_files_64m")),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}

async function output(
  program: string,
  args: string[],
  env: Record<string, string>,
): Promise<string> {
  const out = await new Deno.Command(program, { args, env, stdin: "null" }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (!out.success) {
    throw new Error(`${program} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
  return text;
}

async function startServe(
  waffle: string,
  env: Record<string, string>,
): Promise<{ url: string; child: Deno.ChildProcess }> {
  const child = new Deno.Command(waffle, {
    args: ["serve", "--listen", "127.0.0.1:0", "--json"],
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (!text.includes("\n")) {
    const next = await reader.read();
    if (next.done) throw new Error(`waffle serve exited before listening: ${text}`);
    text += next.value;
  }
  reader.releaseLock();
  return { url: JSON.parse(text.slice(0, text.indexOf("\n"))).url, child };
}

// Waits (bounded) until the server's keeper has refilled a pool.
async function untilReady(home: string, template: string, count: number): Promise<void> {
  const deadline = Date.now() + 120_000;
  while (readyMembers(home, template).length < count) {
    if (Date.now() > deadline) throw new Error(`Pool '${template}' did not refill to ${count}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/**
 * Starts `waffle serve` (the installed CLI, as a process) on a home with a
 * key of tenant `bench`; stopped by the context's cleanup.
 *
 * @param context The bench context.
 * @param waffle The installed launcher.
 * @param env Its environment (`WAFFLE_HOME`).
 * @returns The SDK's options for the key.
 */
export async function serveFor(
  context: BenchContext,
  waffle: string,
  env: Record<string, string>,
): Promise<{ apiKey: string; apiUrl: string; sandboxUrl: string }> {
  const key = await output(waffle, ["serve", "key", "create", "--tenant", "bench"], env);
  const server = await startServe(waffle, env);
  context.cleanup.add(async () => {
    server.child.kill("SIGTERM");
    await server.child.status;
  });
  return { apiKey: key.trim(), apiUrl: server.url, sandboxUrl: server.url };
}
