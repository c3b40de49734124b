/**
 * Helpers for attacks mounted from inside a real sandbox container: as the
 * commands' uid (what a prompt-injected agent's command is), and as the
 * runner's uid 0 inside the container (a compromised runner: the strongest
 * attacker the queue files can meet), plus victim files outside the queue
 * that must come through unchanged.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { Sandbox } from "../lib/lifecycle/sandbox.ts";
import { dockerCli } from "./_sandbox_helpers.ts";

/**
 * Runs a Deno script inside the container as its uid 0 (the runner's uid),
 * with the mounted Deno and `node:sqlite` at hand.
 *
 * @param containerId The sandbox container.
 * @param script TypeScript source, run with `--allow-all`.
 * @returns Exit code and output.
 */
export function asRunner(
  containerId: string,
  script: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  return dockerCli(
    ["exec", "-i", "-u", "0", containerId, "/opt/waffle/deno", "run", "-A", "--quiet", "-"],
    script,
  );
}

/**
 * Runs a shell command inside the container as the commands' uid, outside
 * any request (a process a command left behind).
 *
 * @param containerId The sandbox container.
 * @param shell The command line.
 * @returns Exit code and output.
 */
export function asCommand(
  containerId: string,
  shell: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  return dockerCli(["exec", "-u", "10001:10001", containerId, "/bin/sh", "-c", shell]);
}

/** A root-owned 0600 file outside every queue, whose bytes, mode and owner must not change. */
export interface Victim {
  /** Its host path (what an attacker would aim at). */
  path: string;
  /** Asserts that it still exists with the same content, mode and owner. */
  check(): void;
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Creates a victim file in a fresh directory outside the waffle home.
 *
 * @returns The victim.
 */
export async function victimFile(): Promise<Victim> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-victim-" });
  const path = join(dir, "secret");
  const content = `victim ${crypto.randomUUID()}\n`;
  await Deno.writeTextFile(path, content, { mode: 0o600 });
  await Deno.chmod(path, 0o600);
  const before = await Deno.lstat(path);
  return {
    path,
    check(): void {
      const info = Deno.lstatSync(path);
      assert.ok(info.isFile, `victim '${path}' is no longer a regular file`);
      assert.equal(Deno.readTextFileSync(path), content, `victim '${path}' changed`);
      assert.equal(info.mode! & 0o7777, 0o600, `victim '${path}' mode changed`);
      assert.equal(info.uid, before.uid, `victim '${path}' owner changed`);
      assert.equal(info.nlink, 1, `victim '${path}' gained a link`);
    },
    async [Symbol.asyncDispose](): Promise<void> {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
}

/**
 * The sandbox's container id (after an ensure).
 *
 * @param sandbox The sandbox.
 * @returns Its container id.
 */
export function containerOf(sandbox: Sandbox): string {
  const id = sandbox.lastEnsure?.containerId;
  assert.ok(id !== undefined, "ensure the sandbox first");
  return id;
}

/**
 * The host pid of the runner process in a container (not docker-init).
 *
 * @param containerId The container.
 * @returns The host pid.
 */
export async function runnerPid(containerId: string): Promise<number> {
  const top = await dockerCli(["top", containerId, "-o", "pid,args"]);
  const line = top.stdout.split("\n").find((l) =>
    l.includes(" runner --queue") && !l.includes("docker-init")
  );
  assert.ok(line !== undefined, `no runner in container '${containerId}': ${top.stdout}`);
  return Number(line.trim().split(/\s+/)[0]);
}

// ---------------------------------------------------------------------------
// Runner-side background attacks (hostile_runner_test.ts).

/** A process started inside a container that keeps running while the test goes on. */
export interface BackgroundAttack {
  /** Everything it printed so far (stdout then stderr). */
  output(): string;
  /** Whether its `docker exec` client has exited (the process inside is gone or detached). */
  readonly exited: boolean;
  /** Kills the `docker exec` client and waits for it; returns its exit code. */
  stop(): Promise<number>;
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Starts a Deno script inside the container as its uid 0 (like
 * {@linkcode asRunner}) without waiting for it to end: resolves once it has
 * printed the line `ready`. The script should bound its own lifetime (killing
 * the `docker exec` client does not kill the process inside; killing the
 * container does).
 *
 * @param containerId The sandbox container.
 * @param script TypeScript source, run with `--allow-all`.
 * @param ready The line that says the attack is in place.
 * @param timeoutMs How long to wait for `ready`.
 * @returns The running attack.
 */
export async function spawnAsRunner(
  containerId: string,
  script: string,
  ready: string,
  timeoutMs = 30_000,
): Promise<BackgroundAttack> {
  const child = new Deno.Command("docker", {
    args: ["exec", "-i", "-u", "0", containerId, "/opt/waffle/deno", "run", "-A", "--quiet", "-"],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
    env: { DOCKER_BUILDKIT: "0" },
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(script));
  await writer.close();
  let stdout = "";
  let stderr = "";
  let exited = false;
  let sawReady: () => void = () => {};
  const readyPromise = new Promise<void>((resolve) => (sawReady = resolve));
  const drain = async (
    stream: ReadableStream<Uint8Array>,
    append: (text: string) => void,
  ): Promise<void> => {
    const decoder = new TextDecoder();
    for await (const chunk of stream) append(decoder.decode(chunk, { stream: true }));
  };
  const drained = Promise.all([
    drain(child.stdout, (text) => {
      stdout += text;
      if (stdout.split("\n").includes(ready)) sawReady();
    }),
    drain(child.stderr, (text) => (stderr += text)),
  ]);
  const status = child.status.then(async (s) => {
    exited = true;
    await drained;
    return s.code;
  });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const outcome = await Promise.race([
    readyPromise.then(() => "ready" as const),
    status.then(() => "exited" as const),
    new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), timeoutMs))),
  ]);
  clearTimeout(timer);
  const stop = async (): Promise<number> => {
    if (!exited) {
      try {
        child.kill("SIGKILL");
      } catch {
        // Already gone.
      }
    }
    return await status;
  };
  if (outcome !== "ready") {
    await stop();
    throw new Error(
      `attack in '${
        containerId.slice(0, 12)
      }' did not print '${ready}' (${outcome}): ${stdout}${stderr}`,
    );
  }
  return {
    output: () => stdout + stderr,
    get exited(): boolean {
      return exited;
    },
    stop,
    [Symbol.asyncDispose]: async () => void (await stop()),
  };
}
