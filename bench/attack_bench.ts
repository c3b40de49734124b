/**
 * The attack section of `deno task bench`: one library process serving two
 * users, as a harness does (`openSandbox` as the README shows it). A
 * compromised runner (a script run with `docker exec -u 0` in user A's
 * container, the runner's uid and capabilities) attacks A's sandbox while
 * A's host calls meet the attack; meanwhile user B's calls (`true`) are
 * timed. Each `victim_during_<attack>` stands beside `victim_baseline`,
 * taken in the same run; the target is ≤ 2 ×.
 *
 * - `tree`: a directory tree 20,000 levels deep in `/queue/outbound`, then a
 *   damaged `outbound.db`, so A's host resets the directory;
 * - `churn`: the bell given 20,000 new inodes, old ones hard-linked, while
 *   A's host waits on a command;
 * - `frozen`: a beat forged a year ahead, then the runner SIGSTOPped: A's
 *   call waits until the runner is judged dead, then revives it;
 * - `big_outbound`: `outbound.db` grown past 140 MB with a valid schema;
 * - `cpu`, the control: A's container only burns its CPU limit. Each attack
 *   is also shown against it: what the host's work costs B beyond the
 *   machine's contention.
 *
 * Details per attack: A's calls that succeeded and failed (each attack ends
 * with one that succeeds: the sandbox healed), the most inotify watches this
 * process held, and how long the attack ran.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import { DockerClient } from "../lib/docker/mod.ts";
import { removeSandbox } from "../lib/sandbox/remove.ts";
import { openSandbox, type Sandbox } from "../lib/sandbox/open.ts";
import {
  CHURN_SCRIPT,
  DAMAGE_SCRIPT,
  deepTreeScript,
  FORGE_AND_FREEZE_SCRIPT,
  GROW_OUTBOUND_SCRIPT,
} from "../tests/_runner_attacks.ts";
import { kernelUse } from "../tests/_kernel_use.ts";
import { installedRunner } from "./cli_bench.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

interface Attack {
  /** Case suffix. */
  name: string;
  /** What runs in A's container as uid 0. */
  script: string;
  /** What A's host runs, again and again, while the attack goes on. */
  targetCommand: string[];
  note: string;
}

/**
 * The control: A's container only burns the CPU its limit gives it, for
 * about as long as the churn. What B loses then is the machine's contention
 * (2 cores here), not the host's work; each attack is shown against it too.
 */
const CPU_BURN: Attack = {
  name: "cpu",
  script: "const end = Date.now() + 10_000; while (Date.now() < end) Math.sqrt(Math.random());",
  targetCommand: ["true"],
  note: "B's `true` while A's container burns its CPU limit for 10 s (the control)",
};

const ATTACKS: readonly Attack[] = [
  CPU_BURN,
  {
    name: "tree",
    script: deepTreeScript("/queue/outbound") + DAMAGE_SCRIPT,
    targetCommand: ["true"],
    note: "B's `true` while A's runner plants a 20,000-level tree and damages outbound.db",
  },
  {
    name: "churn",
    script: CHURN_SCRIPT,
    targetCommand: ["sleep", "1"],
    note: "B's `true` while A's runner churns 20,000 bell inodes under a waiting host",
  },
  {
    name: "frozen",
    script: FORGE_AND_FREEZE_SCRIPT,
    targetCommand: ["true"],
    note: "B's `true` while A's runner forges a beat and freezes, until A's host revives it",
  },
  {
    name: "big_outbound",
    script: GROW_OUTBOUND_SCRIPT,
    targetCommand: ["true"],
    note: "B's `true` while A's runner grows outbound.db past 140 MB",
  },
];

/** Case names of this section. */
export const ATTACK_CASES: readonly string[] = [
  "victim_baseline",
  ...ATTACKS.map((attack) => `victim_during_${attack.name}`),
];

/** The attack section. */
export const attackSection: Section = {
  name: "attack",
  cases: ATTACK_CASES,
  run: runAttackSection,
};

/** Victim samples per attack window at least, and for the baseline. */
const MIN_SAMPLES = 20;
/** A's failed calls after which the section gives up (the sandbox never healed). */
const MAX_TARGET_FAILURES = 10;

/**
 * Runs the wanted attack cases; without a reachable daemon it says why and
 * measures nothing.
 *
 * @param context Counts, root directory, filter, progress and cleanup.
 * @returns Results and one ratio per attack.
 */
export async function runAttackSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  try {
    await docker.ping();
  } catch (error) {
    console.error(
      `bench: attack section skipped: ${error instanceof Error ? error.message : error}`,
    );
    return { results: [], ratios: [] };
  }
  const config = {
    home: join(context.root, "attack-home"),
    idleSeconds: 0,
    runner: await installedRunner(context),
  };
  const victim = openSandbox("bench-victim", { config, docker });
  const opened: Sandbox[] = [victim];
  const release = context.cleanup.add(async () => {
    for (const sandbox of opened) {
      sandbox.close();
      await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true });
    }
  });
  const results: BenchResult[] = [];
  try {
    for (let i = 0; i < context.warmup; i++) await call(victim, ["true"]);
    const baseline: number[] = [];
    const count = Math.max(MIN_SAMPLES, Math.min(context.n, 100));
    while (baseline.length < count) baseline.push(await call(victim, ["true"]));
    results.push(summarize("victim_baseline", baseline, { note: "B's `true`, nothing attacked" }));
    for (const attack of ATTACKS) {
      if (!context.wants(`victim_during_${attack.name}`)) continue;
      // A fresh target per attack: each starts from an honest, warm sandbox.
      const target = openSandbox(`bench-target-${attack.name}`, { config, docker });
      opened.push(target);
      await call(target, ["true"]);
      context.progress.note(`attack: ${attack.name}`);
      results.push(await underAttack(victim, target, attack));
    }
  } finally {
    await release();
  }
  const baseline = results.find((result) => result.name === "victim_baseline");
  const control = results.find((result) => result.name === `victim_during_${CPU_BURN.name}`);
  const attacks = results.filter((result) => result.name.startsWith("victim_during_"));
  const ratios = [
    ...attacks.map((result) =>
      ratioOf(`${result.name} / victim_baseline`, result, baseline, "p50_ms", "≤ 2")
    ),
    ...attacks.filter((result) => result !== control).map((result) =>
      ratioOf(`${result.name} / ${control?.name}`, result, control, "p50_ms")
    ),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}

// One call as a harness makes it: submit, collect (reviving the runner as
// `waffle exec` does), acknowledge. Milliseconds.
async function call(sandbox: Sandbox, argv: string[]): Promise<number> {
  const t0 = now();
  const id = await sandbox.submit({ argv, timeoutMs: 60_000 });
  const { result } = await sandbox.queue.collect(id, {
    revive: (trouble) => sandbox.ensure(trouble),
  });
  await sandbox.queue.ack(id);
  if (result.exitCode !== 0) {
    throw new Error(`'${argv.join(" ")}' ended ${JSON.stringify(result)}`);
  }
  return now() - t0;
}

async function underAttack(victim: Sandbox, target: Sandbox, attack: Attack): Promise<BenchResult> {
  const started = now();
  let attacking = true;
  const attackDone = runAsRunner(target.lastEnsure!.containerId, attack.script)
    .finally(() => (attacking = false));
  let targetOk = 0;
  let targetFailed = 0;
  let watches = 0;
  // A's host meets the attack until it is over and one more call succeeds.
  const targetLoop = (async (): Promise<void> => {
    for (let healed = false; !healed;) {
      const during = attacking;
      try {
        await call(target, attack.targetCommand);
        targetOk++;
        healed = !during;
      } catch (error) {
        // Interrupted by the attack (never re-run): the next call heals.
        if (++targetFailed > MAX_TARGET_FAILURES) {
          throw new Error(`User A's sandbox did not heal after '${attack.name}': ${error}`);
        }
      }
    }
  })();
  let targetDone = false;
  void targetLoop.finally(() => (targetDone = true));
  const samples: number[] = [];
  while (!targetDone || samples.length < MIN_SAMPLES) {
    samples.push(await call(victim, ["true"]));
    watches = Math.max(watches, kernelUse().watches);
  }
  const output = await attackDone;
  await targetLoop;
  return summarize(`victim_during_${attack.name}`, samples, {
    note: attack.note,
    details: {
      target_calls_ok: targetOk,
      target_calls_failed: targetFailed,
      host_inotify_watches_max: watches,
      attack_ms: now() - started,
      attack_exit: output.code,
    },
  });
}

// The attack inside A's container as its uid 0, as tests/_hostile_helpers.ts's
// asRunner does (the docker CLI here stands in for the attacker's shell).
async function runAsRunner(containerId: string, script: string): Promise<{ code: number }> {
  const child = new Deno.Command("docker", {
    args: ["exec", "-i", "-u", "0", containerId, "/opt/waffle/deno", "run", "-A", "--quiet", "-"],
    stdin: "piped",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(script));
  await writer.close();
  const out = await child.output();
  if (out.code !== 0) {
    console.error(`bench: attack exited ${out.code}: ${new TextDecoder().decode(out.stderr)}`);
  }
  return { code: out.code };
}
