/**
 * The MCP section of `deno task bench`: `tools/call echo` of
 * `@modelcontextprotocol/server-everything` with the official SDK client,
 * three ways, plus the start of a session:
 *
 * - `mcp_call_direct`: the server on the host over stdio (the floor);
 * - `mcp_call_waffle`: through `waffle mcp run everything` (a whole CLI
 *   process, the installed launcher as users run it) into a warm sandbox; interleaved with the above in blocks so
 *   both see the same machine load;
 * - `mcp_call_docker_run`: a fresh `docker run --rm -i` per call (the Docker
 *   MCP gateway's default): spawn, initialize, call, close, all timed;
 * - `mcp_calls_20_inflight_direct` and `mcp_calls_20_inflight`: 20 calls
 *   kept in flight at once on one session, directly and through waffle
 *   (calls per second over the whole run; each sample is one call's latency);
 * - `mcp_session_start`: from launching `waffle mcp run` to the `initialize`
 *   result, with the user's sandbox stopped (`waffle stop` before each);
 * - `mcp_session_start_direct`: the floor of a session start: `docker start
 *   -ai` of a stopped container of the same image (deno and the package
 *   cache mounted as `mcp_call_docker_run` has them) whose command is the
 *   same server, to its `initialize` result; closing the session ends the
 *   server and so stops the container for the next sample;
 * - `mcp_docker_run_cold`: the Docker section's `docker_run_cold` (create +
 *   start + wait + remove of `true`), measured here when that section did not
 *   run, as the denominator of `mcp_session_start`'s ratio.
 *
 * Every server runs from the package cache (`WAFFLE_MCP_CACHE`, else the
 * repository's `.tools/mcp-cache`), filled first when it lacks the package.
 * The docker CLI is used only by the benchmark; the product never runs it.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { DockerClient } from "../lib/docker/mod.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";
import { fetchPackage, isCached } from "../lib/mcp/package_cache.ts";
import { installedWaffle } from "./cli_bench.ts";
import { runCold } from "./docker_bench.ts";
import { homeContainers, removeHome } from "./fleet_bench.ts";
import type { BenchContext, Section } from "./section.ts";
import {
  type BenchReport,
  type BenchResult,
  mean,
  now,
  ratioOf,
  stageMeans,
  summarize,
} from "./stats.ts";

/** Case names of this section. */
export const MCP_CASES = [
  "mcp_call_direct",
  "mcp_call_waffle",
  "mcp_call_docker_run",
  "mcp_calls_20_inflight_direct",
  "mcp_calls_20_inflight",
  "mcp_session_start",
  "mcp_session_start_direct",
  "mcp_docker_run_cold",
] as const;

/** The MCP section. */
export const mcpSection: Section = {
  name: "mcp",
  cases: MCP_CASES,
  run: runMcpSection,
};

/** The server every case calls. */
export const EVERYTHING = "npm:@modelcontextprotocol/server-everything@2026.8.31";

const IMAGE = "waffle-runner:latest";
/** Warm calls are ~1 ms each: more than this adds little. */
const CALL_MAX = 200;
const BLOCK = 10;
/** Calls kept in flight at once by the throughput cases. */
const IN_FLIGHT = 20;
/** Calls of one throughput run. */
const INFLIGHT_CALLS = 2000;
/** A `docker run` per call costs ~1 s: fewer samples. */
const DOCKER_RUN_MAX = 10;
/** A cold session start costs ~1 s plus a `waffle stop`. */
const SESSION_MAX = 5;
/** `mcp_docker_run_cold` samples. */
const COLD_MAX = 10;
/** The server's own flags, after the package. */
const SERVER_ARGS = ["stdio"];
const RUN_FLAGS = ["run", "-A", "--cached-only", "--no-config", "--quiet", "--no-prompt"];
const WARM_USER = "bench-mcp";
const COLD_USER = "bench-mcp-cold";

/** A connected SDK client and the stderr its process wrote so far. */
interface Session {
  client: Client;
  stderr: string[];
  close(): Promise<void>;
}

/**
 * Runs the wanted MCP cases. Without a reachable daemon only
 * `mcp_call_direct` is measured (the reason goes to stderr).
 *
 * @param context Counts, root directory, filter, progress and cleanup.
 * @returns Results and the three target ratios.
 */
export async function runMcpSection(context: BenchContext): Promise<BenchReport> {
  const cache = mcpCache();
  await ensureCached(cache, context);
  const docker = new DockerClient();
  let dockerUp = true;
  try {
    await docker.ping();
  } catch (error) {
    dockerUp = false;
    console.error(
      `bench: mcp docker cases skipped: ${error instanceof Error ? error.message : error}`,
    );
  }
  const results: BenchResult[] = [];
  const home = await Deno.realPath(await makeDir(join(context.root, "mcp-home")));
  await Deno.writeTextFile(join(home, "waffle.toml"), waffleToml(cache));
  const sessions: Session[] = [];
  const release = context.cleanup.add(async () => {
    for (const session of sessions.splice(0)) await session.close().catch(() => {});
    if (dockerUp) await removeHome(docker, home);
    await Deno.remove(home, { recursive: true });
  });
  try {
    const calls = Math.min(context.n, CALL_MAX);
    const wantDirect = context.wants("mcp_call_direct");
    const wantWaffle = dockerUp && context.wants("mcp_call_waffle");
    if (wantDirect || wantWaffle) {
      const direct = wantDirect ? await track(sessions, connectDirect(cache)) : undefined;
      const viaWaffle = wantWaffle
        ? await track(sessions, connectWaffle(await installedWaffle(context), home, WARM_USER))
        : undefined;
      if (viaWaffle !== undefined) context.progress.note(`mcp: waffle session for ${WARM_USER}`);
      for (let i = 0; i < context.warmup; i++) {
        if (direct !== undefined) await echo(direct);
        if (viaWaffle !== undefined) await echo(viaWaffle);
      }
      const directSamples: number[] = [];
      const waffleSamples: number[] = [];
      const total = (wantDirect ? calls : 0) + (wantWaffle ? calls : 0);
      const label = [wantDirect ? "mcp_call_direct" : "", wantWaffle ? "mcp_call_waffle" : ""]
        .filter((name) => name !== "").join(" + ");
      while (
        (direct !== undefined && directSamples.length < calls) ||
        (viaWaffle !== undefined && waffleSamples.length < calls)
      ) {
        for (let i = 0; i < BLOCK && direct !== undefined && directSamples.length < calls; i++) {
          directSamples.push(await timedEcho(direct));
        }
        for (
          let i = 0;
          i < BLOCK && viaWaffle !== undefined && waffleSamples.length < calls;
          i++
        ) {
          waffleSamples.push(await timedEcho(viaWaffle));
        }
        context.progress.step(label, directSamples.length + waffleSamples.length, total);
      }
      for (const session of [direct, viaWaffle]) {
        if (session === undefined) continue;
        sessions.splice(sessions.indexOf(session), 1);
        await session.close();
      }
      if (direct !== undefined) {
        results.push(
          summarize("mcp_call_direct", directSamples, {
            note: "tools/call echo, server on the host over stdio",
          }),
        );
      }
      if (viaWaffle !== undefined) {
        results.push(
          summarize("mcp_call_waffle", waffleSamples, {
            note: "tools/call echo via `waffle mcp run`, warm sandbox",
          }),
        );
      }
    }
    for (
      const [name, viaWaffle] of [["mcp_calls_20_inflight_direct", false], [
        "mcp_calls_20_inflight",
        true,
      ]] as const
    ) {
      if (!context.wants(name) || (viaWaffle && !dockerUp)) continue;
      const session = await track(
        sessions,
        viaWaffle
          ? connectWaffle(await installedWaffle(context), home, WARM_USER)
          : connectDirect(cache),
      );
      for (let i = 0; i < context.warmup * IN_FLIGHT; i++) await echo(session);
      const { samples, perSecond } = await inFlight(
        session,
        (done) => context.progress.step(name, done, INFLIGHT_CALLS),
      );
      sessions.splice(sessions.indexOf(session), 1);
      await session.close();
      results.push(
        summarize(name, samples, {
          per_s: perSecond,
          note: `${IN_FLIGHT} tools/call echo in flight on one session, ${
            viaWaffle ? "through `waffle mcp run`" : "server on the host"
          }`,
        }),
      );
    }
    if (dockerUp && context.wants("mcp_call_docker_run")) {
      const image = await docker.inspectImage(IMAGE);
      if (image === null) throw new Error(`Image '${IMAGE}' not found`);
      const deno = await Deno.realPath(Deno.execPath());
      const stages: Record<string, number>[] = [];
      const count = Math.min(context.n, DOCKER_RUN_MAX);
      // One unmeasured run: the first one pays for the page cache.
      await dockerRunCall(deno, cache, image.id);
      for (let i = 0; i < count; i++) {
        stages.push(await dockerRunCall(deno, cache, image.id));
        context.progress.step("mcp_call_docker_run", i + 1, count);
      }
      results.push(
        summarize("mcp_call_docker_run", stages.map((stage) => stage.total!), {
          details: stageMeans(stages.map(({ total: _, ...rest }) => rest), "mean_"),
          note: "`docker run --rm -i` per call: spawn + initialize + call + close",
        }),
      );
    }
    const haveDockerCold = context.results.some((result) => result.name === "docker_run_cold");
    if (
      dockerUp &&
      (context.wants("mcp_docker_run_cold") ||
        (context.wants("mcp_session_start") && !haveDockerCold))
    ) {
      const image = await docker.inspectImage(IMAGE);
      if (image === null) throw new Error(`Image '${IMAGE}' not found`);
      const samples: number[] = [];
      const count = Math.min(context.n, COLD_MAX);
      for (let i = 0; i < count; i++) {
        samples.push(
          await runCold(docker, image.id, `waffle-bench-mcp-${crypto.randomUUID().slice(0, 8)}`),
        );
        context.progress.step("mcp_docker_run_cold", i + 1, count);
      }
      results.push(
        summarize("mcp_docker_run_cold", samples, {
          note: "as docker_run_cold: create + start + wait + remove, `true`",
        }),
      );
    }
    if (dockerUp && context.wants("mcp_session_start_direct")) {
      results.push(await sessionStartDirect(context, docker, cache, sessions));
    }
    if (dockerUp && context.wants("mcp_session_start")) {
      // Create the user's sandbox (and pay the first-run costs) once.
      const first = await track(
        sessions,
        connectWaffle(await installedWaffle(context), home, COLD_USER),
      );
      await echo(first);
      sessions.splice(sessions.indexOf(first), 1);
      await first.close();
      const samples: number[] = [];
      const firstCalls: number[] = [];
      const stops: number[] = [];
      const count = Math.min(context.n, SESSION_MAX);
      for (let i = 0; i < count; i++) {
        const s0 = now();
        await waffleStop(await installedWaffle(context), home, COLD_USER);
        stops.push(now() - s0);
        await assertStopped(docker, home, COLD_USER);
        const t0 = now();
        const session = await track(
          sessions,
          connectWaffle(await installedWaffle(context), home, COLD_USER),
        );
        samples.push(now() - t0);
        // Not part of the sample: the session works, and its first call's cost.
        firstCalls.push(await timedEcho(session));
        sessions.splice(sessions.indexOf(session), 1);
        await session.close();
        context.progress.step("mcp_session_start", i + 1, count);
      }
      results.push(
        summarize("mcp_session_start", samples, {
          details: { mean_first_call: mean(firstCalls), mean_waffle_stop: mean(stops) },
          note: "launch `waffle mcp run` to initialize, sandbox stopped",
        }),
      );
    }
  } finally {
    await release();
  }
  const find = (name: string): BenchResult | undefined =>
    results.find((r) => r.name === name) ?? context.results.find((r) => r.name === name);
  const coldName = find("docker_run_cold") === undefined
    ? "mcp_docker_run_cold"
    : "docker_run_cold";
  const ratios = [
    ratioOf("mcp_call_waffle / mcp_call_direct", find("mcp_call_waffle"), find("mcp_call_direct")),
    ratioOf(
      "mcp_calls_20_inflight / mcp_calls_20_inflight_direct",
      find("mcp_calls_20_inflight"),
      find("mcp_calls_20_inflight_direct"),
      "per_s",
    ),
    ratioOf(
      "mcp_call_docker_run / mcp_call_waffle",
      find("mcp_call_docker_run"),
      find("mcp_call_waffle"),
    ),
    ratioOf(`mcp_session_start / ${coldName}`, find("mcp_session_start"), find(coldName)),
    ratioOf(
      "mcp_session_start / mcp_session_start_direct",
      find("mcp_session_start"),
      find("mcp_session_start_direct"),
    ),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}

// The floor of mcp_session_start: `docker start -ai` of one stopped container
// whose command is the server, to its initialize result, per sample.
async function sessionStartDirect(
  context: BenchContext,
  docker: DockerClient,
  cache: string,
  sessions: Session[],
): Promise<BenchResult> {
  const image = await docker.inspectImage(IMAGE);
  if (image === null) throw new Error(`Image '${IMAGE}' not found`);
  const deno = await Deno.realPath(Deno.execPath());
  const name = `waffle-bench-mcp-start-${crypto.randomUUID().slice(0, 8)}`;
  const id = (await dockerCli([
    "create",
    "-i",
    "--name",
    name,
    ...serverContainer({ deno, cache, image: image.id }),
  ])).trim();
  const remove = context.cleanup.add(() => dockerCli(["rm", "-f", id]));
  try {
    const samples: number[] = [];
    const count = Math.min(context.n, SESSION_MAX);
    // One unmeasured start: the first one pays for the page cache.
    for (let i = -1; i < count; i++) {
      await dockerCli(["wait", id]);
      const t0 = now();
      const session = await track(
        sessions,
        connect({ command: "docker", args: ["start", "-ai", id], env: baseEnv() }),
      );
      if (i >= 0) samples.push(now() - t0);
      await echo(session);
      sessions.splice(sessions.indexOf(session), 1);
      await session.close();
      if (i >= 0) context.progress.step("mcp_session_start_direct", i + 1, count);
    }
    return summarize("mcp_session_start_direct", samples, {
      note: "`docker start -ai` of a stopped container running the server, to initialize",
    });
  } finally {
    await remove();
  }
}

async function dockerCli(args: string[]): Promise<string> {
  const out = await new Deno.Command("docker", {
    args,
    env: baseEnv(),
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(
      `'docker ${args.join(" ")}' exited ${out.code}: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
  return new TextDecoder().decode(out.stdout);
}

// INFLIGHT_CALLS calls, IN_FLIGHT at a time: each call's latency, and the
// calls per second of the whole run.
async function inFlight(
  session: Session,
  progress: (done: number) => void,
): Promise<{ samples: number[]; perSecond: number }> {
  const samples: number[] = [];
  let started = 0;
  const worker = async (): Promise<void> => {
    while (started < INFLIGHT_CALLS) {
      started++;
      samples.push(await timedEcho(session));
      if (samples.length % 200 === 0) progress(samples.length);
    }
  };
  const t0 = now();
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  return { samples, perSecond: samples.length / ((now() - t0) / 1000) };
}

/**
 * The package cache: `WAFFLE_MCP_CACHE`, else the repository's
 * `.tools/mcp-cache`.
 *
 * @returns An absolute path.
 */
export function mcpCache(): string {
  return Deno.env.get("WAFFLE_MCP_CACHE") ||
    fileURLToPath(new URL("../.tools/mcp-cache", import.meta.url));
}

/**
 * The `waffle.toml` of the benchmark's home: the cache and the one server,
 * run in the user's sandbox with its authority.
 *
 * @param cache The package cache.
 * @returns The file's text.
 */
export function waffleToml(cache: string): string {
  return `[sandbox]
mcp_cache = ${JSON.stringify(cache)}

[mcp.everything]
package = ${JSON.stringify(EVERYTHING)}
args = ["stdio"]
execution = "sandbox"
authority = "sandbox"
`;
}

async function ensureCached(cache: string, context: BenchContext): Promise<void> {
  if (isCached(EVERYTHING, cache)) return;
  context.progress.note(`mcp: fetching '${EVERYTHING}' into ${cache}`);
  await fetchPackage(EVERYTHING, { cacheDir: cache });
}

async function makeDir(path: string): Promise<string> {
  await Deno.mkdir(path, { recursive: true });
  return path;
}

async function track(sessions: Session[], opening: Promise<Session>): Promise<Session> {
  const session = await opening;
  sessions.push(session);
  return session;
}

// What every child gets: PATH, HOME and the daemon's address when set.
function baseEnv(): Record<string, string> {
  const dockerHost = Deno.env.get("DOCKER_HOST");
  return {
    PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
    HOME: Deno.env.get("HOME") ?? "/",
    ...(dockerHost === undefined ? {} : { DOCKER_HOST: dockerHost }),
  };
}

function connectDirect(cache: string): Promise<Session> {
  return connect({
    command: Deno.execPath(),
    args: [...RUN_FLAGS, EVERYTHING, ...SERVER_ARGS],
    env: { ...baseEnv(), DENO_DIR: cache },
  });
}

// The installed launcher, as users run it: its sandboxes run the installed
// artefact's runner (with its cache), not the source tree's.
function connectWaffle(waffle: string, home: string, user: string): Promise<Session> {
  return connect({
    command: waffle,
    args: ["mcp", "run", "everything", "--user", user],
    env: { ...baseEnv(), WAFFLE_HOME: home },
  });
}

// Spawns a server process and initializes a session with it.
async function connect(
  spawn: { command: string; args: string[]; env: Record<string, string> },
): Promise<Session> {
  const transport = new StdioClientTransport({ ...spawn, stderr: "pipe" });
  const stderr: string[] = [];
  transport.stderr?.on("data", (chunk: Uint8Array) => {
    stderr.push(new TextDecoder().decode(chunk));
    if (stderr.length > 50) stderr.shift();
  });
  const client = new Client({ name: "waffle-bench", version: "1.0.0" });
  try {
    await client.connect(transport);
  } catch (error) {
    await transport.close().catch(() => {});
    throw new Error(
      `Cannot start MCP session '${spawn.args.join(" ")}': ${
        error instanceof Error ? error.message : error
      }\n${stderr.join("").trim()}`,
    );
  }
  return { client, stderr, close: () => client.close() };
}

async function echo(session: Session): Promise<void> {
  const result = await session.client.callTool({
    name: "echo",
    arguments: { message: "bench" },
  });
  const content = (result as { content?: { text?: string }[] }).content ?? [];
  if (result.isError === true || !content.some((part) => part.text?.includes("bench"))) {
    throw new Error(
      `echo failed: ${JSON.stringify(result)}\n${session.stderr.join("").trim()}`,
    );
  }
}

async function timedEcho(session: Session): Promise<number> {
  const t0 = now();
  await echo(session);
  return now() - t0;
}

// One call the Docker MCP gateway's default way: a fresh container per call.
async function dockerRunCall(
  deno: string,
  cache: string,
  imageId: string,
): Promise<Record<string, number>> {
  const t0 = now();
  const session = await connect({
    command: "docker",
    args: [
      "run",
      "--rm",
      "-i",
      ...serverContainer({ deno, cache, image: imageId }),
    ],
    env: baseEnv(),
  });
  const t1 = now();
  let t2 = t1;
  try {
    await echo(session);
    t2 = now();
  } finally {
    await session.close();
  }
  const t3 = now();
  return { total: t3 - t0, initialize: t1 - t0, call: t2 - t1, close: t3 - t2 };
}

async function waffleStop(waffle: string, home: string, user: string): Promise<void> {
  const out = await new Deno.Command(waffle, {
    args: ["stop", "--user", user],
    env: { ...baseEnv(), WAFFLE_HOME: home },
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(
      `'waffle stop --user ${user}' exited ${out.code}: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
}

async function assertStopped(docker: DockerClient, home: string, user: string): Promise<void> {
  const running = (await homeContainers(docker, home)).filter((summary) =>
    summary.Labels[LABELS.user] === user && summary.State === "running"
  );
  if (running.length > 0) {
    throw new Error(`Sandbox of '${user}' still running after 'waffle stop'`);
  }
}

// The `docker create`/`docker run` arguments after `-i`: the server in a
// container of `image`, no network, Deno and its cache mounted read-only.
function serverContainer(options: { deno: string; cache: string; image: string }): string[] {
  return [
    "--network",
    "none",
    "-v",
    `${options.deno}:/opt/deno:ro`,
    "-v",
    `${options.cache}:/cache:ro`,
    "-e",
    "DENO_DIR=/cache",
    options.image,
    "/opt/deno",
    ...RUN_FLAGS,
    EVERYTHING,
    ...SERVER_ARGS,
  ];
}
