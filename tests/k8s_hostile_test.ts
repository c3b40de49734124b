/**
 * The hostile suites' queue attacks (`hostile_runner_test.ts`,
 * `_runner_attacks.ts`) mounted from inside a real sandbox pod against its
 * AGENT (`waffle agent`, the host side of the queue inside the pod), on the
 * Kubernetes stand-in (`_k8s_standin.ts`: a MOCK of the API server and the
 * kubelet; the pods are real Docker containers), behind a real `waffle
 * serve` with `[backend] kind = "kubernetes"`.
 *
 * Each attack is registered twice ({@linkcode podBothWays}): as a command
 * (uid 10001, no groups, no capabilities: the kit's spawn helper, as the
 * runner drops a command) and as a compromised runner (`docker exec -u 0`
 * into the runner container: its uid 0 with the runner's capabilities).
 * After each, the victims are checked ({@linkcode assertVictims}): the
 * agent's container was neither restarted nor crashed (same pid, restart
 * count 0) and its memory stayed bounded, `waffle serve` is alive, another
 * tenant's sandbox (another pod) ran commands with exact output during and
 * after the attack, and the attacked sandbox's next call either works or
 * fails with one clear line, bounded in time, never running a command twice
 * (each call appends to a file; the count is read back).
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import { SANDBOX_DENO_ARGV } from "../lib/lifecycle/posture.ts";
import { SANDBOX_SPAWN_HELPER } from "../lib/config/sandbox_paths.ts";
import { AGENT_PORT, AGENT_SECRETS_DIR, SECRET_KEYS } from "../lib/k8s/sandbox_object.ts";
import { sandboxObjectName, sandboxSecretName } from "../lib/k8s/names.ts";
import { alive, delay } from "./_helpers.ts";
import { dockerCli } from "./_sandbox_helpers.ts";
import {
  CHURN,
  CHURN_SCRIPT,
  DAMAGE_SCRIPT,
  FIFO_SCRIPT,
  FORGE_AND_FREEZE_SCRIPT,
  GROW_OUTBOUND_SCRIPT,
  LOCK_SCRIPT,
} from "./_runner_attacks.ts";
import { POD_PIDS_LIMIT } from "./_k8s_standin.ts";
import { RESOURCES } from "./_k8s_api.ts";
import {
  baseTest,
  sdk,
  type Served,
  serveForFile,
  serveOnKubernetes,
  stopRigTest,
} from "./_serve_helpers.ts";

const SECRETS = RESOURCES.find((resource) => resource.plural === "secrets")!;
const MiB = 1024 ** 2;
/** Any one call of a sandbox must end (a result or one clear line) within this. */
const CALL_BOUND_MS = 100_000;
/** The agent's memory limit is 256Mi: its RSS must stay well inside it. */
const AGENT_RSS_BOUND = 200 * MiB;
/** How long the fork bomb's processes live (they end by themselves if nothing kills them). */
const BOMB_SECONDS = 40;

// deno-lint-ignore no-console -- measured figures go in the test's output
const log = (...args: unknown[]): void => console.log(...args);

// ---------------------------------------------------------------------------
// The rig: one stand-in, one server, a victim of another tenant, an attacked sandbox.

const stopRig = serveOnKubernetes({});

interface Pod {
  id: string;
  sandbox: Sandbox;
  runner: string;
  agent: string;
  /** The agent's host pid when the pod was first seen. */
  agentPid: number;
}

interface Stage {
  served: Served;
  /** Tenant a's sandbox, the one attacked (unless an attack ruins it: then a fresh one). */
  a: Pod;
  /** Tenant b's sandbox: must serve on, untouched. */
  b: Pod;
}

let stage: Promise<Stage> | undefined;

async function openPod(served: Served, tenant: "a" | "b"): Promise<Pod> {
  const sandbox = await Sandbox.create("base", {
    ...sdk(served, served.keys[tenant]),
    timeoutMs: 3_600_000,
  });
  const containers = served.kube!.standIn.podContainers(
    `waffle-${tenant}`,
    sandboxObjectName(sandbox.sandboxId),
  );
  assert.ok(containers?.runner !== undefined && containers["waffle-agent"] !== undefined);
  const agent = containers["waffle-agent"];
  return {
    id: sandbox.sandboxId,
    sandbox,
    runner: containers.runner,
    agent,
    agentPid: (await inspect(agent)).pid,
  };
}

function stageOnce(): Promise<Stage> {
  return stage ??= (async () => {
    const served = await serveForFile();
    const [a, b] = [await openPod(served, "a"), await openPod(served, "b")];
    return { served, a, b };
  })();
}

async function inspect(
  container: string,
): Promise<{ pid: number; restarts: number; running: boolean }> {
  const out = await dockerCli([
    "inspect",
    "-f",
    "{{.State.Pid}} {{.RestartCount}} {{.State.Running}}",
    container,
  ]);
  assert.equal(out.code, 0, out.stderr);
  const [pid, restarts, running] = out.stdout.trim().split(" ");
  return { pid: Number(pid), restarts: Number(restarts), running: running === "true" };
}

/** The agent's resident memory, read on the host from its process (the agent's image has no shell). */
function rssOf(pid: number): number {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  return Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)![1]) * 1024;
}

// ---------------------------------------------------------------------------
// The attackers.

interface Exec {
  code: number;
  stdout: string;
  stderr: string;
}

interface PodAttacker {
  readonly kind: "command" | "runner";
  readonly label: string;
  /** Runs a shell command line as this attacker in the runner container. */
  sh(runner: string, shell: string): Promise<Exec>;
  /** Runs a Deno script (the kit's Deno, `node:sqlite` at hand) likewise. */
  deno(runner: string, script: string): Promise<Exec>;
}

// The kit's Deno through the kit's loader, with a cache of the attacker's own.
const denoLine = (cache: string): string =>
  `DENO_DIR=${cache} DENO_NO_UPDATE_CHECK=1 exec ${SANDBOX_DENO_ARGV.join(" ")} run -A --quiet -`;

// As the runner drops a command: the spawn helper (uid and gid 10001, no
// groups, no capabilities, its own session; its setsid needs a shell above it).
const asCommand = (runner: string, shell: string, stdin?: string): Promise<Exec> =>
  dockerCli([
    "exec",
    ...(stdin === undefined ? [] : ["-i"]),
    "-u",
    "0",
    runner,
    "/bin/sh",
    "-c",
    `${SANDBOX_SPAWN_HELPER} 10001 10001 /bin/sh -c "$1"; exit $?`,
    "waffle-command",
    shell,
  ], stdin);

const COMMAND: PodAttacker = {
  kind: "command",
  label: "a command",
  sh: (runner, shell) => asCommand(runner, shell),
  deno: (runner, script) => asCommand(runner, denoLine("/tmp/.waffle-attack-deno"), script),
};

const RUNNER: PodAttacker = {
  kind: "runner",
  label: "the runner",
  sh: (runner, shell) => dockerCli(["exec", "-u", "0", runner, "/bin/sh", "-c", shell]),
  deno: (runner, script) =>
    dockerCli(
      ["exec", "-i", "-u", "0", runner, "/bin/sh", "-c", denoLine("/tmp/.waffle-attack-root")],
      script,
    ),
};

type AttackFn = (stage: Stage, attacker: PodAttacker) => Promise<void>;

/** Registers an attack twice: `<name> [as a command]`, `<name> [as the runner]`. */
function podBothWays(name: string, fn: AttackFn): void {
  for (const attacker of [COMMAND, RUNNER]) {
    baseTest(
      `kubernetes hostile: ${name} [as ${attacker.label}]`,
      async () => await fn(await stageOnce(), attacker),
      { sanitize: false },
    );
  }
}

/** A command's reach into the queue: EACCES (the agent made both directories 0700). */
const REFUSED_QUEUE =
  /PermissionDenied: Permission denied \(os error 13\)|unable to open database file: \/queue\//;

/** Asserts a command's run of a queue attack script was refused, and nothing else. */
function assertRefused(what: string, out: Exec): void {
  assert.notEqual(out.code, 0, `${what} succeeded as a command: ${out.stdout}`);
  assert.match(out.stderr, REFUSED_QUEUE, `${what} as a command: ${out.stderr}`);
}

// ---------------------------------------------------------------------------
// The victims.

interface CallOutcome {
  ms: number;
  stdout?: string;
  exitCode?: number;
  error?: string;
}

/** One bounded call; never throws. */
async function call(pod: Pod, command: string): Promise<CallOutcome> {
  const started = performance.now();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const bound = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer in ${CALL_BOUND_MS} ms`)), CALL_BOUND_MS);
  });
  try {
    const ran = await Promise.race([
      pod.sandbox.commands.run(command, {
        timeoutMs: CALL_BOUND_MS - 10_000,
        requestTimeoutMs: CALL_BOUND_MS - 5_000,
      }),
      bound,
    ]);
    return { ms: performance.now() - started, stdout: ran.stdout, exitCode: ran.exitCode };
  } catch (error) {
    const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    return { ms: performance.now() - started, error: message };
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The attacked sandbox's next call: a counted command (it appends a line to
 * a file) that either ran once with exact output, or failed with one clear
 * line within the bound; either way it ran at most once.
 *
 * @returns Whether it ran.
 */
async function nextCall(pod: Pod, what: string): Promise<boolean> {
  const tag = crypto.randomUUID().slice(0, 8);
  const runs = `/tmp/waffle-runs-${tag}`;
  const outcome = await call(pod, `echo ran >> ${runs}; echo next-${tag}`);
  log(
    `[${what}] the attacked sandbox's next call: ${
      outcome.error ?? `exit ${outcome.exitCode}, ${JSON.stringify(outcome.stdout)}`
    } after ${(outcome.ms / 1000).toFixed(1)} s`,
  );
  assert.ok(outcome.ms < CALL_BOUND_MS, `[${what}] the next call hung`);
  // Read back in the runner container (as its uid 0): how often it ran.
  const count = await dockerCli(["exec", "-u", "0", pod.runner, "/bin/sh", "-c", `cat ${runs}`]);
  const ran = count.code === 0 ? count.stdout.split("\n").filter((l) => l === "ran").length : 0;
  assert.ok(ran <= 1, `[${what}] the next call ran ${ran} times`);
  if (outcome.error !== undefined) {
    assert.ok(outcome.error.trim() !== "", `[${what}] an empty error`);
    assert.ok(!outcome.error.trim().includes("\n"), `[${what}] not one line: ${outcome.error}`);
    return false;
  }
  assert.equal(outcome.exitCode, 0, `[${what}] exit ${outcome.exitCode}`);
  assert.equal(outcome.stdout, `next-${tag}\n`, `[${what}] the next call's output`);
  assert.equal(ran, 1, `[${what}] said it ran, but the file says ${ran}`);
  return true;
}

/** B runs numbered commands with exact output until `attack` ends (at least one). */
async function whileBServes<T>(b: Pod, what: string, attack: Promise<T>): Promise<T> {
  let done = false;
  const finished = attack.finally(() => (done = true));
  let n = 0;
  do {
    const tag = `b-${n++}-${crypto.randomUUID().slice(0, 6)}`;
    const outcome = await call(b, `echo ${tag}`);
    assert.equal(
      outcome.stdout,
      `${tag}\n`,
      `[${what}] B during the attack: ${outcome.error ?? JSON.stringify(outcome)}`,
    );
  } while (!done && n < 1000);
  log(`[${what}] B ran ${n} command(s) with exact output during the attack`);
  return await finished;
}

/**
 * What must hold after every attack: each agent the same process, never
 * restarted, its memory bounded; `waffle serve` alive; B serves with exact
 * output; the attacked sandbox's next call works or fails in one line.
 *
 * @returns Whether the attacked sandbox's next call ran.
 */
async function assertVictims(stage: Stage, target: Pod, what: string): Promise<boolean> {
  await assertAgents(stage, target, what);
  const tag = crypto.randomUUID().slice(0, 8);
  const b = await call(stage.b, `echo b-after-${tag}`);
  assert.equal(b.stdout, `b-after-${tag}\n`, `[${what}] B after: ${b.error}`);
  return await nextCall(target, what);
}

/** Each agent the same process, never restarted, its memory bounded; `waffle serve` alive. */
async function assertAgents(stage: Stage, target: Pod, what: string): Promise<void> {
  for (const pod of new Set([target, stage.a, stage.b])) {
    const state = await inspect(pod.agent);
    const rss = state.running ? rssOf(state.pid) : NaN;
    log(
      `[${what}] agent of ${pod.id}: pid ${state.pid}, restarts ${state.restarts}, RSS ${
        (rss / MiB).toFixed(1)
      } MiB`,
    );
    assert.equal(state.running, true, `[${what}] the agent of ${pod.id} is not running`);
    assert.equal(state.restarts, 0, `[${what}] the agent of ${pod.id} was restarted`);
    assert.equal(state.pid, pod.agentPid, `[${what}] the agent of ${pod.id} is another process`);
    assert.ok(rss < AGENT_RSS_BOUND, `[${what}] the agent's RSS is ${(rss / MiB).toFixed(1)} MiB`);
  }
  assert.ok(alive(stage.served.pid), `[${what}] waffle serve died`);
}

/**
 * A pod whose queue a broken-into runner ruined is replaced: the attacked
 * sandbox's first call fails in one line saying so, its agent is unharmed
 * until then, and within the bound a new pod (another runner, another
 * agent) serves it again, with the workspace it had and the command run once.
 */
async function assertReplaced(stage: Stage, pod: Pod, what: string): Promise<void> {
  await assertAgents(stage, pod, what);
  const marker = `kept-${crypto.randomUUID().slice(0, 8)}`;
  await dockerCli([
    "exec",
    "-u",
    "0",
    pod.runner,
    "/bin/sh",
    "-c",
    `echo ${marker} > /workspace/.marker`,
  ]);
  const first = await call(pod, "true");
  assert.match(
    first.error ?? "",
    /its pod is being replaced/,
    `[${what}] ${JSON.stringify(first)}`,
  );
  assert.ok(!first.error!.trim().includes("\n"), `[${what}] not one line: ${first.error}`);
  assert.ok(alive(stage.served.pid), `[${what}] waffle serve died`);
  const name = sandboxObjectName(pod.id);
  const deadline = Date.now() + 120_000;
  let containers = stage.served.kube!.standIn.podContainers("waffle-a", name);
  while (Date.now() < deadline && (containers === undefined || containers.runner === pod.runner)) {
    await delay(250);
    containers = stage.served.kube!.standIn.podContainers("waffle-a", name);
  }
  assert.ok(
    containers?.runner !== undefined && containers.runner !== pod.runner,
    `[${what}] not replaced`,
  );
  const tag = crypto.randomUUID().slice(0, 8);
  let outcome = await call(pod, `echo ran >> /tmp/runs-${tag}; cat /workspace/.marker`);
  while (outcome.error !== undefined && Date.now() < deadline) {
    await delay(500);
    outcome = await call(pod, `echo ran >> /tmp/runs-${tag}; cat /workspace/.marker`);
  }
  log(`[${what}] replaced pod serves: ${outcome.error ?? JSON.stringify(outcome.stdout)}`);
  assert.equal(outcome.stdout, `${marker}\n`, `[${what}] after the replacement: ${outcome.error}`);
  const runs = await dockerCli([
    "exec",
    "-u",
    "0",
    containers.runner,
    "/bin/sh",
    "-c",
    `cat /tmp/runs-${tag}`,
  ]);
  assert.equal(runs.stdout, "ran\n", `[${what}] the command ran more than once`);
}

/** A sandbox of tenant a of its own, for an attack that ruins it; killed after. */
async function withFreshA(stage: Stage, fn: (pod: Pod) => Promise<void>): Promise<void> {
  const pod = await openPod(stage.served, "a");
  try {
    await fn(pod);
  } finally {
    await pod.sandbox.kill().catch(() => {});
  }
}

// ---------------------------------------------------------------------------
// Attacks on the agent's own surface (the pod's).

podBothWays(
  "the agent's port on 127.0.0.1 refuses a caller without the agent token, or with a guessed one (401)",
  async (stage, attacker) => {
    const url = `http://127.0.0.1:${AGENT_PORT}`;
    const curl = (args: string): string => `curl -s -m 5 -o /dev/null -w '%{http_code}\\n' ${args}`;
    const guessed = "X-Waffle-Agent-Token: " + "guessedguessedguessed";
    const rpc =
      `-X POST -H 'content-type: application/json' --data '{}' ${url}/process.Process/List`;
    const out = await whileBServes(
      stage.b,
      "agent port",
      attacker.sh(
        stage.a.runner,
        [
          curl(`${url}/health`),
          curl(`-H '${guessed}' ${url}/health`),
          curl(`-H '${guessed}' ${rpc}`),
          curl(rpc),
          // 200 guesses in a row: each refused, none slows anyone.
          `i=0; while [ $i -lt 200 ]; do ${
            curl(`-H "X-Waffle-Agent-Token: guess-$i-guessedguessed" ${url}/health`)
          }; i=$((i+1)); done | sort | uniq -c`,
        ].join("; "),
      ),
    );
    log(`[agent port as ${attacker.label}] ${out.stdout.trim().split("\n").join(", ")}`);
    assert.equal(out.code, 0, out.stderr);
    const lines = out.stdout.trim().split("\n").map((line) => line.trim());
    assert.deepEqual(lines, ["401", "401", "401", "401", "200 401"]);
    await assertVictims(stage, stage.a, "agent port");
  },
);

podBothWays(
  "the agent's Secret is nowhere in the runner container (not mounted, not in its env, not in its files)",
  async (stage, attacker) => {
    const secret = stage.served.kube!.standIn.objects.find(
      SECRETS,
      "waffle-a",
      sandboxSecretName(sandboxObjectName(stage.a.id)),
    );
    assert.ok(secret !== undefined, "the Secret exists");
    const token = atob(String(secret.data[SECRET_KEYS.agentToken]));
    const access = atob(String(secret.data[SECRET_KEYS.accessToken]));
    assert.ok(token.length >= 16 && access.length >= 16);
    // /var/run is /run in the image: /var/run/waffle is the runner's own
    // scratch (RUNNER_DIR), not the agent's Secret.
    const out = await attacker.sh(
      stage.a.runner,
      `ls -a ${AGENT_SECRETS_DIR}/ 2>&1; echo "--"; ` +
        `for f in ${SECRET_KEYS.agentToken} ${SECRET_KEYS.accessToken}; do ` +
        `find / -xdev -name "$f" 2>/dev/null; done; echo "--"; ` +
        `cat /proc/1/environ 2>&1 | tr '\\000' '\\n' | grep -c . ; echo "--"; ` +
        `grep -rlsF -e '${token}' -e '${access}' /proc/1/environ /proc/self/environ /run /tmp /workspace /queue /etc 2>/dev/null; echo "grep=$?"`,
    );
    log(`[secret as ${attacker.label}] ${out.stdout.trim().split("\n").join(" | ")}`);
    const [listing, found, environ, grepped] = out.stdout.split("--\n");
    assert.doesNotMatch(listing!, /access-token|agent-token|env-vars/, "the Secret is mounted");
    assert.equal(found!.trim(), "", `a Secret's file is in the runner container: ${found}`);
    if (attacker.kind === "runner") assert.ok(Number(environ!.trim()) > 0, "pid 1's env read");
    // grep: 1 when nothing matched, 2 when a file could not be read too (a
    // command cannot read pid 1's env); never 0, and no file named.
    assert.match(
      grepped!.trim(),
      /^grep=[12]$/,
      `a token found in the runner container: ${grepped}`,
    );
    await assertVictims(stage, stage.a, "secret");
  },
);

podBothWays(
  "the runner's scratch is its own and /tmp is sticky, as a Docker sandbox's tmpfs mounts are (an emptyDir comes 0777)",
  async (stage, attacker) => {
    const out = await attacker.sh(
      stage.a.runner,
      `stat -c '%a %U' /run/waffle /tmp; touch /run/waffle/planted 2>&1 && echo planted; echo end`,
    );
    const [scratch, tmp, ...rest] = out.stdout.trim().split("\n");
    assert.equal(scratch, "700 root");
    assert.equal(tmp, "1777 root");
    if (attacker.kind === "command") {
      assert.match(rest.join("\n"), /Permission denied/);
      assert.ok(!rest.includes("planted"), "a command wrote into the runner's scratch");
    }
    await attacker.sh(stage.a.runner, "rm -f /run/waffle/planted");
    await assertVictims(stage, stage.a, "scratch");
  },
);

podBothWays(
  "the agent's processes are not visible from the runner container (no shared pid namespace)",
  async (stage, attacker) => {
    const out = await attacker.sh(
      stage.a.runner,
      `for p in /proc/[0-9]*; do tr '\\000' ' ' < "$p/cmdline" 2>/dev/null; echo; done; ` +
        `echo "pid1=$(tr '\\000' ' ' < /proc/1/cmdline)"`,
    );
    assert.equal(out.code, 0, out.stderr);
    assert.doesNotMatch(out.stdout, / agent --queue/, "the agent is visible");
    assert.match(out.stdout, /^pid1=.* runner --queue /m, "pid 1 is the runner");
    // And signals by a guessed pid meet nothing of the agent's.
    const agentPid = (await inspect(stage.a.agent)).pid;
    const kill = await attacker.sh(
      stage.a.runner,
      `for p in $(seq 2 64); do kill -STOP $p 2>/dev/null; done; echo done`,
    );
    assert.equal(kill.stdout.trim(), "done");
    const state = Deno.readTextFileSync(`/proc/${agentPid}/status`);
    assert.doesNotMatch(state, /^State:\s+T/m, "the agent was stopped");
    await assertVictims(stage, stage.a, "processes");
  },
);

podBothWays(
  "the queue from the runner container: /queue/inbound is read-only to the runner and closed to a command (0700), as is /queue/outbound",
  async (stage, attacker) => {
    const out = await attacker.sh(
      stage.a.runner,
      `(echo x > /queue/inbound/planted) 2>&1; echo "plant=$?"; ` +
        `(echo x >> /queue/inbound/inbound.db) 2>&1; echo "append=$?"; ` +
        `(ls /queue/inbound > /dev/null) 2>&1; echo "list=$?"; ` +
        `(ls /queue/outbound > /dev/null) 2>&1; echo "outbound=$?"; ` +
        `stat -c '%a %u' /queue/inbound /queue/outbound`,
    );
    log(`[queue as ${attacker.label}] ${out.stdout.trim().split("\n").join(" | ")}`);
    const field = (name: string): string | undefined =>
      new RegExp(`^${name}=(\\d+)$`, "m").exec(out.stdout)?.[1];
    assert.notEqual(field("plant"), "0", "a file was planted in /queue/inbound");
    assert.notEqual(field("append"), "0", "inbound.db was appended to");
    assert.match(out.stdout, /^700 0\n700 0$/m, "the agent's modes");
    if (attacker.kind === "command") {
      assert.match(out.stdout, /Permission denied/);
      assert.notEqual(field("list"), "0");
      assert.notEqual(field("outbound"), "0");
    } else {
      assert.match(out.stdout, /Read-only file system/);
      assert.equal(field("outbound"), "0", "the runner owns /queue/outbound");
    }
    // A command through the agent, the honest way, cannot reach it either.
    const through = await call(stage.a, "ls /queue/inbound /queue/outbound 2>&1; echo x");
    assert.match(through.stdout ?? "", /Permission denied/);
    await assertVictims(stage, stage.a, "queue");
  },
);

podBothWays(
  "a fork bomb (processes until fork fails) stops at the pod's pids limit; the agent and B serve on, A serves again once they are gone",
  async (stage, attacker) => {
    // dash gives up at the first fork that fails; what follows forks nothing
    // (builtins and a glob), so it runs with every pid taken.
    const err = `/tmp/waffle-bomb-${attacker.kind}`;
    const bomb = `(n=0; while [ $n -lt ${POD_PIDS_LIMIT + 500} ]; do sleep ${BOMB_SECONDS} & ` +
      `n=$((n+1)); done) 2>${err}; set -- /proc/[0-9]*; echo "live=$#"; ` +
      `f=0; while read -r line; do case $line in *ork*) f=$((f+1));; esac; done < ${err}; ` +
      `echo "forkfailed=$f"`;
    const out = await whileBServes(stage.b, "fork bomb", attacker.sh(stage.a.runner, bomb));
    log(`[fork bomb as ${attacker.label}] ${out.stdout.trim().split("\n").join(", ")}`);
    const live = Number(/^live=(\d+)$/m.exec(out.stdout)?.[1]);
    assert.ok(live > POD_PIDS_LIMIT / 2 && live <= POD_PIDS_LIMIT, `${live} processes`);
    assert.ok(Number(/^forkfailed=(\d+)$/m.exec(out.stdout)?.[1]) > 0, "fork never failed");
    // While the pids are taken, A's call ends by itself (or runs): never hangs.
    const during = await call(stage.a, "echo during");
    log(
      `[fork bomb as ${attacker.label}] A's call while exhausted: ${
        during.error ?? JSON.stringify(during.stdout)
      } after ${(during.ms / 1000).toFixed(1)} s`,
    );
    assert.ok(during.error === undefined || !during.error.includes("\n"), during.error);
    // kill(-1) spares the caller and the namespace's init (the runner); an
    // exec may itself find no pid until then, and the sleeps end anyway.
    for (let i = 0; i < 40; i++) {
      const killed = await attacker.sh(stage.a.runner, "kill -9 -1; set -- /proc/[0-9]*; echo $#");
      if (killed.code === 0 && Number(killed.stdout.trim()) < 10) break;
      await delay(1000);
    }
    assert.equal(await assertVictims(stage, stage.a, "fork bomb"), true, "A serves again");
  },
);

// ---------------------------------------------------------------------------
// The queue attacks of the hostile suites (`_runner_attacks.ts`), against the agent.

podBothWays(
  "outbound.db's header overwritten (DAMAGE_SCRIPT): the agent is unharmed, A's call ends in one line and its pod is replaced",
  async (stage, attacker) => {
    if (attacker.kind === "command") {
      assertRefused("DAMAGE_SCRIPT", await attacker.deno(stage.a.runner, DAMAGE_SCRIPT));
      assert.equal(await assertVictims(stage, stage.a, "damage"), true);
      return;
    }
    await withFreshA(stage, async (pod) => {
      const out = await whileBServes(stage.b, "damage", attacker.deno(pod.runner, DAMAGE_SCRIPT));
      assert.equal(out.code, 0, out.stderr);
      assert.equal(out.stdout.trim(), "damaged");
      // The agent can neither set outbound/ aside (an emptyDir mount) nor
      // restart the runner: it says so, and the server replaces the pod.
      await assertReplaced(stage, pod, "damage");
    });
  },
);

podBothWays(
  "outbound.bell's inode churned (CHURN_SCRIPT): the agent's watch stays bounded and A serves on",
  async (stage, attacker) => {
    const out = await whileBServes(
      stage.b,
      "churn",
      attacker.deno(stage.a.runner, CHURN_SCRIPT),
    );
    try {
      if (attacker.kind === "command") return assertRefused("CHURN_SCRIPT", out);
      assert.equal(out.code, 0, out.stderr);
      const churned = JSON.parse(out.stdout) as { churned: number; inodes: number };
      log(`[churn] ${out.stdout.trim()}`);
      assert.equal(churned.churned, CHURN);
    } finally {
      if (attacker.kind === "runner") {
        await attacker.sh(stage.a.runner, "rm -f /queue/outbound/old-bell-*");
      }
    }
    assert.equal(await assertVictims(stage, stage.a, "churn"), true);
  },
);

podBothWays(
  "a heartbeat from the future, then a freeze (FORGE_AND_FREEZE_SCRIPT): nothing in the container can stop the runner (pid 1); A serves on",
  async (stage, attacker) => {
    const out = await attacker.deno(stage.a.runner, FORGE_AND_FREEZE_SCRIPT);
    if (attacker.kind === "command") {
      assertRefused("FORGE_AND_FREEZE_SCRIPT", out);
    } else {
      assert.equal(out.code, 0, out.stderr);
      log(`[forge] ${out.stdout.trim()}`);
    }
    // The freeze the script skips: pid 1 itself, stopped and killed outright.
    const signals = await attacker.sh(
      stage.a.runner,
      `kill -STOP 1; echo "stop=$?"; kill -KILL 1; echo "kill=$?"; sleep 0.5; grep ^State /proc/1/status`,
    );
    log(`[forge] signals to pid 1: ${signals.stdout.trim().split("\n").join(", ")}`);
    assert.doesNotMatch(signals.stdout, /State:\s+T/, "the runner was stopped");
    assert.equal((await inspect(stage.a.runner)).restarts, 0, "the runner was killed");
    assert.equal(await assertVictims(stage, stage.a, "forge"), true);
  },
);

podBothWays(
  "outbound.db grown past 140 MB (GROW_OUTBOUND_SCRIPT): the agent's memory stays bounded and A's pod is replaced",
  async (stage, attacker) => {
    if (attacker.kind === "command") {
      assertRefused(
        "GROW_OUTBOUND_SCRIPT",
        await attacker.deno(stage.a.runner, GROW_OUTBOUND_SCRIPT),
      );
      assert.equal(await assertVictims(stage, stage.a, "grow"), true);
      return;
    }
    await withFreshA(stage, async (pod) => {
      const out = await whileBServes(
        stage.b,
        "grow",
        attacker.deno(pod.runner, GROW_OUTBOUND_SCRIPT),
      );
      assert.equal(out.code, 0, out.stderr);
      const { bytes } = JSON.parse(out.stdout) as { bytes: number };
      log(`[grow] outbound.db ${(bytes / MiB).toFixed(0)} MiB`);
      assert.ok(bytes > 140e6);
      // Refused as damaged (over the size the agent will copy): the pod is replaced.
      await assertReplaced(stage, pod, "grow");
    });
  },
);

/**
 * Starts a Deno script as the runner's uid in the background; resolves once
 * it printed `ready`. Returns what stops it (its process inside the
 * container, found by its command line: killing `docker exec` would not).
 */
async function holdAsRunner(
  runner: string,
  script: string,
  ready: string,
): Promise<{ stop(): Promise<void> }> {
  const marker = `waffle-hold-${crypto.randomUUID().slice(0, 8)}`;
  const child = new Deno.Command("docker", {
    args: [
      "exec",
      "-i",
      "-u",
      "0",
      "-e",
      `WAFFLE_HOLD=${marker}`,
      runner,
      "/bin/sh",
      "-c",
      denoLine("/tmp/.waffle-attack-root"),
    ],
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(script));
  await writer.close();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let seen = "";
  while (!seen.split("\n").includes(ready)) {
    const next = await reader.read();
    assert.ok(!next.done, `the holder ended before '${ready}': ${seen}`);
    seen += next.value;
  }
  const drained = (async () => {
    while (!(await reader.read()).done) { /* drain */ }
  })();
  return {
    async stop(): Promise<void> {
      await dockerCli([
        "exec",
        "-u",
        "0",
        runner,
        "/bin/sh",
        "-c",
        `for p in /proc/[0-9]*; do
        if tr '\\000' '\\n' < "$p/environ" 2>/dev/null | grep -qx 'WAFFLE_HOLD=${marker}'; then kill -9 "\${p#/proc/}"; fi
      done`,
      ]);
      await child.status;
      await drained;
    },
  };
}

podBothWays(
  "an EXCLUSIVE lock held on outbound.db (LOCK_SCRIPT): A's call ends by itself, B serves on, A serves again once it is released",
  async (stage, attacker) => {
    if (attacker.kind === "command") {
      assertRefused("LOCK_SCRIPT", await attacker.deno(stage.a.runner, LOCK_SCRIPT));
      assert.equal(await assertVictims(stage, stage.a, "lock"), true);
      return;
    }
    const holder = await holdAsRunner(stage.a.runner, LOCK_SCRIPT, "locked");
    try {
      const runs = `/tmp/waffle-runs-lock-${crypto.randomUUID().slice(0, 8)}`;
      const during = await whileBServes(
        stage.b,
        "lock",
        call(stage.a, `echo ran >> ${runs}; echo under-lock`),
      );
      const count = await RUNNER.sh(stage.a.runner, `cat ${runs} 2>/dev/null; true`);
      assert.ok(count.stdout.split("\n").filter((l) => l === "ran").length <= 1, "ran twice");
      log(
        `[lock] A's call under the lock: ${during.error ?? JSON.stringify(during.stdout)} after ${
          (during.ms / 1000).toFixed(1)
        } s`,
      );
      assert.ok(during.ms < CALL_BOUND_MS, "A's call hung under the lock");
      assert.ok(during.error === undefined || !during.error.includes("\n"), during.error);
    } finally {
      await holder.stop();
    }
    assert.equal(await assertVictims(stage, stage.a, "lock"), true, "A serves again");
  },
);

podBothWays(
  "outbound.db replaced by a FIFO (FIFO_SCRIPT): the agent never blocks on it, and A's pod is replaced",
  async (stage, attacker) => {
    if (attacker.kind === "command") {
      assertRefused("FIFO_SCRIPT", await attacker.deno(stage.a.runner, FIFO_SCRIPT));
      assert.equal(await assertVictims(stage, stage.a, "fifo"), true);
      return;
    }
    await withFreshA(stage, async (pod) => {
      const out = await attacker.deno(pod.runner, FIFO_SCRIPT);
      assert.equal(out.code, 0, out.stderr);
      const kind = await attacker.sh(pod.runner, "stat -c %F /queue/outbound/outbound.db");
      assert.equal(kind.stdout.trim(), "fifo");
      // Like DAMAGE_SCRIPT: refused, never blocked on, and the pod replaced.
      await whileBServes(stage.b, "fifo", assertReplaced(stage, pod, "fifo"));
    });
  },
);

stopRigTest(stopRig, {
  name: "kubernetes hostile: the stand-in stops, leaving no container or network of its own",
  before: async () => {
    if (stage === undefined) return;
    const { served, a, b } = await stage;
    for (const pod of [a, b]) await pod.sandbox.kill().catch(() => {});
    await served.stop();
  },
});
