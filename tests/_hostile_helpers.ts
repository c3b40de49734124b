/**
 * Helpers for attacks mounted from inside a real sandbox container: as the
 * commands' uid (what a prompt-injected agent's command is), and as the
 * runner's uid 0 inside the container (a compromised runner: the strongest
 * attacker the queue files can meet), plus victim files outside the queue
 * that must come through unchanged.
 *
 * {@linkcode bothWays} registers one attack twice, once per
 * {@linkcode Attacker}; {@linkcode mount} runs an attack script as either,
 * and for a command (which cannot even enter `/queue`) asserts the exact
 * refusal and that the queue, the runner, the victims and the next call came
 * through unharmed.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { Sandbox } from "../lib/sandbox/open.ts";
import { liveTest, type LiveTestFn, type LiveTestOptions } from "./_docker_gate.ts";
import { dockerCli, runOk } from "./_sandbox_helpers.ts";

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

/** The image's spawn helper: the runner drops every command's uid through it. */
const SPAWN_HELPER = "/usr/libexec/waffle/spawn";

/**
 * Runs a shell command inside the container as the commands' uid, outside
 * any request (a process a command left behind). It is dropped by the image's
 * spawn helper, as the runner drops a command: uid and gid 10001, no
 * supplementary groups, no capabilities, its own session (`docker exec -u
 * 10001` would keep group 10001 as a supplementary group). The helper's
 * setsid needs a caller that leads no process group: a shell in between.
 *
 * @param containerId The sandbox container.
 * @param shell The command line.
 * @returns Exit code and output.
 */
export function asCommand(
  containerId: string,
  shell: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  return dockerCli([
    "exec",
    "-u",
    "0",
    containerId,
    "/bin/sh",
    "-c",
    `${SPAWN_HELPER} 10001 10001 /bin/sh -c "$1"; exit $?`,
    "waffle-command",
    shell,
  ]);
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

// ---------------------------------------------------------------------------
// One attack, two attackers.

/** How an attacker's script or command line ended, and what it printed. */
export interface Exec {
  code: number;
  stdout: string;
  stderr: string;
}

/** Who mounts an attack from inside the container. */
export interface Attacker {
  /**
   * `command`: uid 10001, no groups, no capabilities; it cannot even enter
   * `/queue`. `runner`: the container's uid 0 with the runner's capabilities
   * (`SETUID`, `SETGID`, `KILL`); it owns `/queue/outbound`.
   */
  readonly kind: "command" | "runner";
  /** How a test name says it: `a command`, `the runner`. */
  readonly label: string;
  /**
   * Runs a shell command line as this attacker, inside the sandbox's
   * container: a command through the image's spawn helper (uid 10001, no
   * groups, no capabilities), the runner through `docker exec -u 0`.
   *
   * @param sandbox The sandbox (ensured).
   * @param shell The command line.
   * @param containerId Its container, when not `sandbox.lastEnsure`'s.
   * @returns How it ended.
   */
  sh(sandbox: Sandbox, shell: string, containerId?: string): Promise<Exec>;
  /**
   * Runs a Deno script (`--allow-all`, `node:sqlite` at hand) likewise.
   *
   * @param sandbox The sandbox (ensured).
   * @param script TypeScript source.
   * @param containerId Its container, when not `sandbox.lastEnsure`'s.
   * @returns How it ended.
   */
  deno(sandbox: Sandbox, script: string, containerId?: string): Promise<Exec>;
}

/** A command's scripts get a Deno cache of their own (the runner's is not theirs to write). */
const COMMAND_DENO = "DENO_DIR=/tmp/waffle-attack-deno DENO_NO_UPDATE_CHECK=1 " +
  "exec /opt/waffle/deno run -A --quiet -";

/**
 * The commands' uid, as a process a command left behind (see
 * {@linkcode asCommand}): exactly a command's credentials, and, unlike a
 * request, never queued behind the request an attack aims at.
 */
export const COMMAND: Attacker = {
  kind: "command",
  label: "a command",
  sh: (sandbox, shell, containerId) => asCommand(containerId ?? containerOf(sandbox), shell),
  deno: (sandbox, script, containerId) =>
    dockerCli([
      "exec",
      "-i",
      "-u",
      "0",
      containerId ?? containerOf(sandbox),
      "/bin/sh",
      "-c",
      `${SPAWN_HELPER} 10001 10001 /bin/sh -c "$1"; exit $?`,
      "waffle-command",
      COMMAND_DENO,
    ], script),
};

/** The runner's uid 0 and capabilities (a compromised runner), through `docker exec -u 0`. */
export const RUNNER: Attacker = {
  kind: "runner",
  label: "the runner",
  sh: (sandbox, shell, containerId) =>
    dockerCli(["exec", "-u", "0", containerId ?? containerOf(sandbox), "/bin/sh", "-c", shell]),
  deno: (sandbox, script, containerId) => asRunner(containerId ?? containerOf(sandbox), script),
};

/** Both attackers, the command first (its variant is the quick one). */
export const ATTACKERS: readonly Attacker[] = [COMMAND, RUNNER];

/** A test body that mounts its attack as `attacker`. */
export type AttackFn = (
  docker: Parameters<LiveTestFn>[0],
  attacker: Attacker,
  t: Deno.TestContext,
) => void | Promise<void>;

/**
 * Registers one attack as two live tests, `<name> [as a command]` and
 * `<name> [as the runner]`, so each attack is written once and run by both
 * attackers.
 *
 * @param name The attack (what it does and what must hold).
 * @param fn The test body.
 * @param options Sanitizer options for both tests; variants to ignore.
 */
export function bothWays(name: string, fn: AttackFn, options: BothWaysOptions = {}): void {
  const { ignore = [], ...live } = options;
  for (const attacker of ATTACKERS) {
    const full = `${name} [as ${attacker.label}]`;
    if (ignore.includes(attacker.kind) && !RUN_FINDINGS) {
      Deno.test({ name: full, ignore: true, fn: () => {} });
    } else liveTest(full, (docker, t) => fn(docker, attacker, t), live);
  }
}

/** Options of {@linkcode bothWays}. */
export interface BothWaysOptions extends LiveTestOptions {
  /**
   * Variants registered as ignored: a host bug they reveal is not fixed yet
   * (the test says which, in a comment). `WAFFLE_RUN_FINDINGS=1` runs them.
   */
  ignore?: readonly Attacker["kind"][];
}

/**
 * Whether tests and steps ignored as findings (host bugs not fixed yet) run
 * anyway: `WAFFLE_RUN_FINDINGS=1`.
 */
export const RUN_FINDINGS = Deno.env.get("WAFFLE_RUN_FINDINGS") === "1";

/**
 * A test step that carries on an attack only the runner could mount: for a
 * command (refused earlier in the same test, with the refusal asserted) it is
 * registered as ignored, and its name says why.
 *
 * @param t The test context.
 * @param attacker Who mounts the attack.
 * @param name The step's name.
 * @param fn The step.
 * @returns Whether the step passed (or was ignored).
 */
export function runnerStep(
  t: Deno.TestContext,
  attacker: Attacker,
  name: string,
  fn: (t: Deno.TestContext) => void | Promise<void>,
): Promise<boolean> {
  if (attacker.kind === "runner") return t.step(name, fn);
  return t.step({ name: `${name} [only the runner can mount this]`, ignore: true, fn });
}

/**
 * A command's access to the runner's queue: EACCES, as Deno (which names the
 * path except for a socket's bind) or SQLite reports it.
 */
export const REFUSED_QUEUE =
  /PermissionDenied: Permission denied \(os error 13\)(: [^\n]*'\/queue\/|\n)|unable to open database file: \/queue\//;
/** A command's signal to the runner (another uid): EPERM. */
export const REFUSED_SIGNAL = /PermissionDenied: EPERM: Operation not permitted/;

/** Options of {@linkcode mount}. */
export interface MountOptions {
  /** What a command's attempt must fail with; default {@linkcode REFUSED_QUEUE}. */
  refusal?: RegExp;
  /** Victims that a command's attempt must leave unchanged. */
  victims?: readonly Victim[];
  /** The container, when the sandbox was not ensured in this process. */
  containerId?: string;
}

/** The first line of every attack script: can this attacker look into `/queue/outbound`? */
const QUEUE_PROBE = `{
  try {
    Deno.lstatSync("/queue/outbound/outbound.db");
    console.log("waffle-attack: queue reachable");
  } catch (error) {
    console.log("waffle-attack: queue refused " + ((error as { code?: string }).code ?? String(error)));
  }
}
`;
const PROBE_LINE = /^waffle-attack: queue (reachable|refused \S+)\n/m;

/**
 * Mounts an attack script (Deno source) as `attacker`.
 *
 * As the runner, the script must reach `/queue/outbound` (its privileges make
 * the attack possible) and succeed; its stdout is returned for the caller to
 * check the host's defence.
 *
 * As a command, the same script runs as uid 10001 and must be refused:
 * `/queue/outbound` gives EACCES, and the script fails with exactly
 * `options.refusal`. Then the host is checked unharmed: no name under the
 * queue was added, removed or replaced, the same runner is alive, every
 * victim is unchanged and the next call succeeds. Returns null: the caller
 * has nothing left to check.
 *
 * @param attacker Who mounts it.
 * @param sandbox The sandbox attacked (ensured).
 * @param script TypeScript source.
 * @param options Refusal, victims, container.
 * @returns The runner's stdout, or null for a refused command.
 */
export async function mount(
  attacker: Attacker,
  sandbox: Sandbox,
  script: string,
  options: MountOptions = {},
): Promise<string | null> {
  if (attacker.kind === "runner") {
    const out = await attacker.deno(sandbox, QUEUE_PROBE + script, options.containerId);
    assert.equal(out.code, 0, `the attack as the runner failed: ${out.stdout}${out.stderr}`);
    assert.equal(PROBE_LINE.exec(out.stdout)?.[1], "reachable", out.stdout);
    return out.stdout.replace(PROBE_LINE, "");
  }
  const before = queueEntries(sandbox);
  const bootId = sandbox.queue.heartbeat()?.bootId;
  const out = await attacker.deno(sandbox, QUEUE_PROBE + script, options.containerId);
  const said = `${out.stdout}${out.stderr}`;
  assert.equal(PROBE_LINE.exec(out.stdout)?.[1], "refused EACCES", `the command: ${said}`);
  assert.notEqual(out.code, 0, `the attack succeeded as a command: ${said}`);
  assert.match(out.stderr, options.refusal ?? REFUSED_QUEUE, `the command's refusal: ${said}`);
  await assertUnharmed(sandbox, { entries: before, bootId, victims: options.victims ?? [] });
  return null;
}

/**
 * Like {@linkcode mount}, for an attack that keeps running (a held lock, a
 * forger): as the runner it is started in the background and returned once
 * it printed `ready`; as a command it must be refused (then null).
 *
 * @param attacker Who mounts it.
 * @param sandbox The sandbox attacked (ensured).
 * @param script TypeScript source that prints `ready` once in place.
 * @param ready The line.
 * @param options Refusal, victims, container.
 * @returns The running attack, or null for a refused command.
 */
export async function mountInBackground(
  attacker: Attacker,
  sandbox: Sandbox,
  script: string,
  ready: string,
  options: MountOptions = {},
): Promise<BackgroundAttack | null> {
  if (attacker.kind === "command") {
    assert.equal(await mount(attacker, sandbox, script, options), null);
    return null;
  }
  return await spawnAsRunner(
    options.containerId ?? containerOf(sandbox),
    QUEUE_PROBE + script,
    ready,
  );
}

/**
 * For an attack whose runner variant needs the sandbox busy first (a request
 * in flight): as a command, mounts it at once, where it is refused (see
 * {@linkcode mount}), and returns true; the test step is then done. As the
 * runner returns false without mounting anything.
 *
 * @param attacker Who mounts it.
 * @param sandbox The sandbox attacked (ensured, idle).
 * @param script TypeScript source.
 * @param options Refusal, victims, container.
 * @returns Whether a command's attempt was refused (always, for a command).
 */
export async function refusedAsCommand(
  attacker: Attacker,
  sandbox: Sandbox,
  script: string,
  options: MountOptions = {},
): Promise<boolean> {
  if (attacker.kind === "runner") return false;
  assert.equal(await mount(attacker, sandbox, script, options), null);
  return true;
}

/** Names the runner itself replaces (rename over) on every beat: their inodes change. */
const REPLACED_EVERY_BEAT = /^heartbeat\.json(\.tmp)?$/;

/** Every name under the sandbox's queue directories, with its kind, inode and link count. */
function queueEntries(sandbox: Sandbox): string[] {
  const entries: string[] = [];
  for (const dir of [join(sandbox.paths.queue, "inbound"), sandbox.paths.outbound]) {
    for (const entry of Deno.readDirSync(dir)) {
      if (REPLACED_EVERY_BEAT.test(entry.name)) continue;
      const info = Deno.lstatSync(join(dir, entry.name));
      const kind = info.isFile
        ? "file"
        : info.isSymlink
        ? "symlink"
        : info.isDirectory
        ? "dir"
        : "special";
      entries.push(`${dir}/${entry.name} ${kind} ino=${info.ino} links=${info.nlink}`);
    }
  }
  return entries.sort();
}

/**
 * After a command's refused attack: the queue's names are as before, the same
 * runner serves, the victims are unchanged and a call succeeds.
 */
async function assertUnharmed(
  sandbox: Sandbox,
  before: { entries: string[]; bootId: string | undefined; victims: readonly Victim[] },
): Promise<void> {
  assert.deepEqual(queueEntries(sandbox), before.entries, "a command changed the queue");
  const judged = sandbox.queue.liveness();
  assert.equal(judged.state, "alive", `after a command's attack: ${judged.detail}`);
  if (before.bootId !== undefined) {
    assert.equal(judged.beat?.bootId, before.bootId, "the runner was restarted");
  }
  for (const victim of before.victims) victim.check();
  assert.equal(await runOk(sandbox, "echo unharmed"), "unharmed\n");
}
