/**
 * Helpers for live sandbox tests: a temporary `WAFFLE_HOME` whose disposal
 * force-removes every container labelled with a state path under it (and
 * only those: other homes' containers on the same daemon are left alone),
 * plus small wrappers to run commands through a sandbox's queue and the CLI
 * as a child process.
 *
 * @module
 */
import { type SandboxConfig, sandboxToml } from "../lib/config/config.ts";
import { DatabaseSync } from "node:sqlite";
import type { DockerClient } from "../lib/docker/mod.ts";
import { listSandboxes } from "../lib/lifecycle/fleet.ts";
import type { ContainerSummary } from "../lib/docker/types.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";
import { removeVolume } from "../lib/lifecycle/quota.ts";
import { openSandbox, type Sandbox } from "../lib/sandbox/open.ts";
import { fillPool } from "../lib/sandbox/pool_fill.ts";
import { forkSandbox } from "../lib/lifecycle/fork.ts";
import { markReady } from "../lib/lifecycle/pool.ts";
import { POOL_TENANT } from "../lib/config/sandbox_key.ts";
import type { ExecResult } from "../lib/queue/protocol.ts";
import type { SubmitOptions } from "../lib/queue/queue.ts";
import { runCliProcess, text, waitFor } from "./_helpers.ts";

/** The runner image the live tests use (`WAFFLE_IMAGE` is honoured by the config too). */
export const TEST_IMAGE = Deno.env.get("WAFFLE_IMAGE") || "waffle-runner:latest";

/** The template of a test home's warm pool (`tempHome(…, { pool })`). */
export const TEST_POOL = "pooled";

/** The pool every `tempHome` of this test module fills when not told otherwise. */
let defaultPool: number | undefined;

/**
 * Makes every later `tempHome` of this test module (its own isolate) fill a
 * warm pool of `size`, so each sandbox it opens is taken from the pool while
 * it lasts: the hostile suites run again on pooled sandboxes this way
 * (`hostile_pooled_test.ts`).
 *
 * @param size The pool's count.
 */
export function poolEveryHome(size: number, options: { forked?: boolean } = {}): void {
  defaultPool = size;
  defaultForked = options.forked === true;
}

let defaultForked = false;

// Fills a home's pool with forks of one seed sandbox (a file in its
// workspace): each member's state is a fork's (a copied volume image, a
// fresh outbound/ and queue), so every sandbox the home opens is a fork.
async function fillWithForks(docker: DockerClient, home: string, size: number): Promise<void> {
  const config = { home, configPath: `${home}/waffle.toml` };
  const seed = openSandbox(`seed-${crypto.randomUUID().slice(0, 8)}`, { config, docker });
  try {
    const made = await seed.run(["sh", "-c", "echo seeded > /workspace/seed"]);
    if (made.exitCode !== 0) throw new Error("The fork seed's command failed");
    const members = Array.from({ length: size }, () => ({
      template: TEST_POOL,
      user: `p${crypto.randomUUID().replaceAll("-", "").slice(0, 20)}`,
      image: TEST_IMAGE,
    }));
    const targets = members.map((member) =>
      openSandbox(member.user, {
        tenant: POOL_TENANT,
        pool: TEST_POOL,
        fromPool: false,
        config: { ...config, image: TEST_IMAGE },
        docker,
      })
    );
    await forkSandbox(seed, targets, { docker, start: true });
    for (const [i, target] of targets.entries()) {
      const member = members[i]!;
      markReady(home, { ...member, quotaBytes: target.config.quotaBytes, readyAt: Date.now() });
      target.close();
    }
  } finally {
    seed.close();
  }
}

/** A command's outcome with its output as text. */
export interface Ran {
  result: ExecResult;
  stdout: string;
  stderr: string;
}

/** The settings a test home may set (written as `waffle.toml`'s `[sandbox]` table). */
export type HomeConfig = Partial<Omit<SandboxConfig, "home">>;

/** A temporary waffle home; `await using` it so its containers are removed. */
export interface TestHome {
  /** Absolute path of the home (a fresh temp dir). */
  readonly home: string;
  /** The client connected to the daemon that answered the gate. */
  readonly docker: DockerClient;
  /**
   * Opens a sandbox under this home (closed on disposal).
   *
   * @param user User id.
   * @param options Tenant and config overrides (home is always this one).
   */
  open(user: string, options?: { tenant?: string; config?: HomeConfig }): Sandbox;
  /**
   * Runs the CLI from source as a child process with `WAFFLE_HOME` set to this home.
   *
   * @param args CLI arguments.
   * @param env Extra environment.
   */
  cli(
    args: string[],
    env?: Record<string, string>,
  ): Promise<{ code: number; stdout: string; stderr: string }>;
  /** Every container (running or not) labelled with a state path under this home. */
  containers(): Promise<ContainerSummary[]>;
  /** Removes this home's containers and the directory. */
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * A user id unique to this test run, so concurrent test runs on the same
 * daemon (which share container names per (tenant, user)) never collide.
 *
 * @param prefix Readable part.
 * @returns `prefix-xxxxxxxx`.
 */
export function uniqueUser(prefix: string): string {
  return `${prefix}-${crypto.randomUUID().slice(0, 8)}`;
}

/**
 * Whether a container's `waffle.state` label lies under a home.
 *
 * @param summary The container.
 * @param home The waffle home.
 * @returns True when it belongs to that home.
 */
export function underHome(summary: { Labels: Record<string, string> }, home: string): boolean {
  return (summary.Labels[LABELS.state] ?? "").startsWith(`${home}/`);
}

/**
 * Every container labelled with a state path under `home`.
 *
 * @param docker The client.
 * @param home The waffle home.
 * @returns Their summaries.
 */
export async function homeContainers(
  docker: DockerClient,
  home: string,
): Promise<ContainerSummary[]> {
  const all = await docker.listContainers({ all: true, labels: [LABELS.state] });
  return all.filter((summary) => underHome(summary, home));
}

/**
 * Force-removes every container labelled with a state path under `home`.
 *
 * @param docker The client.
 * @param home The waffle home.
 * @returns How many were removed.
 */
export async function removeHomeContainers(docker: DockerClient, home: string): Promise<number> {
  let removed = 0;
  for (const summary of await homeContainers(docker, home)) {
    if (await docker.removeContainer(summary.Id, { force: true }).catch(() => false)) removed++;
  }
  return removed;
}

/**
 * Creates a temporary waffle home, optionally with a `waffle.toml` (which CLI
 * child processes read as well, so their posture matches the test's).
 *
 * @param docker The client.
 * @param config Written to `waffle.toml` (snake_case `[sandbox]` keys) when given.
 * @returns The home; dispose it in a `finally` (or `await using`).
 */
export async function tempHome(
  docker: DockerClient,
  config?: HomeConfig,
  options: { pool?: number | undefined; forked?: boolean } = {},
): Promise<TestHome> {
  options = { pool: defaultPool, ...options };
  const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-live-" }));
  if (config !== undefined || options.pool !== undefined) {
    const pool = options.pool === undefined
      ? ""
      : `\n[templates.${TEST_POOL}]\nimage = ${
        JSON.stringify(TEST_IMAGE)
      }\nwarm = ${options.pool}\n`;
    await Deno.writeTextFile(`${home}/waffle.toml`, sandboxToml(config ?? {}) + pool);
  }
  if (options.pool !== undefined && (options.forked ?? defaultForked)) {
    await fillWithForks(docker, home, options.pool);
  } else if (options.pool !== undefined) {
    // Every sandbox this home opens is then taken from the pool while it lasts.
    const report = await fillPool(home, {
      template: TEST_POOL,
      image: TEST_IMAGE,
      warm: options.pool,
    }, { configPath: `${home}/waffle.toml`, docker });
    if (report.ready !== options.pool) {
      throw new Error(`Pool not filled: ${JSON.stringify(report)}`);
    }
  }
  const opened: Sandbox[] = [];
  return {
    home,
    docker,
    open(user, options = {}): Sandbox {
      const sandbox = openSandbox(user, {
        ...(options.tenant === undefined ? {} : { tenant: options.tenant }),
        config: { ...config, ...options.config, home },
        docker,
      });
      opened.push(sandbox);
      return sandbox;
    },
    cli: (args, env = {}) => runCliProcess(args, { env: { WAFFLE_HOME: home, ...env } }),
    containers: () => homeContainers(docker, home),
    async [Symbol.asyncDispose](): Promise<void> {
      for (const sandbox of opened) {
        try {
          sandbox.close();
        } catch {
          // Already closed.
        }
      }
      try {
        await removeHomeContainers(docker, home);
        await removeHomeVolumes(home);
      } finally {
        await Deno.remove(home, { recursive: true }).catch(() => {});
      }
    },
  };
}

/**
 * Submits through the sandbox (ensure + submit under its lock) and collects,
 * reviving the runner as `waffle exec` does (a runner may idle-exit just as a
 * request lands).
 *
 * @param sandbox The sandbox.
 * @param request A shell command line or full submit options.
 * @returns Result and output text.
 */
export async function run(sandbox: Sandbox, request: string | SubmitOptions): Promise<Ran> {
  const id = await sandbox.submit(typeof request === "string" ? { shell: request } : request);
  const { result, stdout, stderr } = await sandbox.queue.collect(id, {
    revive: (trouble) => sandbox.ensure(trouble),
  });
  await sandbox.queue.ack(id);
  return { result, stdout: text(stdout), stderr: text(stderr) };
}

/**
 * Runs a command that must succeed and returns its stdout.
 *
 * @param sandbox The sandbox.
 * @param shell The command line.
 * @returns Its stdout.
 */
export async function runOk(sandbox: Sandbox, shell: string): Promise<string> {
  const ran = await run(sandbox, shell);
  if (ran.result.exitCode !== 0) {
    throw new Error(
      `'${shell}' failed: ${
        JSON.stringify(ran.result)
      }\nstdout: ${ran.stdout}\nstderr: ${ran.stderr}`,
    );
  }
  return ran.stdout;
}

/**
 * Runs the docker CLI (tests may; the product never does).
 *
 * @param args Arguments.
 * @param stdin Bytes for stdin.
 * @returns Exit code and output.
 */
export async function dockerCli(
  args: string[],
  stdin?: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const child = new Deno.Command("docker", {
    args,
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
    env: { DOCKER_BUILDKIT: "0" },
  }).spawn();
  if (stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(stdin));
    await writer.close();
  }
  const out = await child.output();
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

/**
 * Unmounts and deletes the disk-quota volume of every sandbox under a home
 * (after its containers are gone), so the home can be removed.
 *
 * @param home The waffle home.
 */
export async function removeHomeVolumes(home: string): Promise<void> {
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(`${home}/sandboxes`)];
  } catch {
    return;
  }
  for (const entry of entries) await removeVolume(`${home}/sandboxes/${entry.name}`);
}

/**
 * How many acknowledged requests the queue's housekeeping (`Queue.gc`) has
 * yet to delete from a host's inbound.db.
 *
 * @param inbound The inbound.db.
 * @returns The count.
 */
export function pendingAcks(inbound: string): number {
  const db = new DatabaseSync(inbound, { readOnly: true });
  try {
    return Number((db.prepare("SELECT count(*) AS n FROM acks").get() as { n: number }).n);
  } finally {
    db.close();
  }
}

/**
 * Waits until the host's record of use says a sandbox has been idle for more
 * than `ms` (the queue's housekeeping, whenever it runs, is no use).
 *
 * @param docker The daemon.
 * @param sandbox The sandbox.
 * @param options `ms`: the idle time to exceed.
 */
export async function waitIdle(
  docker: DockerClient,
  sandbox: Sandbox,
  options: { ms: number },
): Promise<void> {
  const containerId = sandbox.lastEnsure?.containerId;
  await waitFor(
    async () =>
      ((await listSandboxes(docker, { config: sandbox.config })).find((row) =>
        row.containerId === containerId
      )?.idleMs ?? 0) > options.ms,
    { timeoutMs: 30_000, what: "an idle sandbox" },
  );
}
