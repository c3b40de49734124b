/**
 * `deno task bench`: waffle's benchmarks.
 *
 * ```sh
 * deno task bench                       # table on stdout, progress on stderr
 * deno task bench --json                # only {"results":[…],"ratios":[…]} on stdout
 * deno task bench --n 500 --seconds 10  # more samples, longer throughput runs
 * deno task bench --only floor,queue_roundtrip
 * deno task bench --quick --check       # a subset in under a minute, judged against bench/budgets.json
 * deno task bench --check --json        # {"results","ratios","check":[…]}; exit 1 when over a budget
 * ```
 *
 * Flags (environment defaults in brackets): `--n` measured iterations of
 * count-based cases [WAFFLE_BENCH_N, 300]; `--warmup` unmeasured ones first
 * [WAFFLE_BENCH_WARMUP, 20]; `--seconds` per throughput case
 * [WAFFLE_BENCH_SECONDS, 5]; `--only` comma-separated case names; `--dir`
 * parent directory of the temp root (choose the filesystem) [TMPDIR];
 * `--quiet` no progress lines; `--quick` only {@linkcode QUICK_CASES} with
 * fewer samples (unless `--only`/`--n` say otherwise); `--check` judges the
 * run against `bench/budgets.json` (see `budgets.ts`) and exits 1 when a
 * figure is worse than its budget by more than its recorded spread.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { parseArgs } from "node:util";
import { attackSection } from "./attack_bench.ts";
import { cliSection } from "./cli_bench.ts";
import { consoleSection } from "./console_bench.ts";
import { cpSection } from "./cp_bench.ts";
import { dockerSection } from "./docker_bench.ts";
import { egressSection } from "./egress_bench.ts";
import { fleetSection } from "./fleet_bench.ts";
import { forkSection } from "./fork_bench.ts";
import { imageSection } from "./image_bench.ts";
import { mcpSection } from "./mcp_bench.ts";
import { queueSection } from "./queue_bench.ts";
import { serveSection } from "./serve_bench.ts";
import { k8sSection } from "./k8s_bench.ts";
import { poolSection } from "./pool_bench.ts";
import { snapshotSection } from "./snapshot_bench.ts";
import { applyTargets, checkExitCode, judge, loadBudgets, renderCheck } from "./budgets.ts";
import { type BenchContext, Cleanup, type Section } from "./section.ts";
import { type BenchReport, machineLoad, Progress, renderJson, renderTable } from "./stats.ts";

/** Every section, in run order. Append new sections (e.g. Docker) here. */
export const SECTIONS: readonly Section[] = [
  queueSection,
  dockerSection,
  mcpSection,
  cliSection,
  fleetSection,
  attackSection,
  snapshotSection,
  forkSection,
  cpSection,
  imageSection,
  egressSection,
  serveSection,
  k8sSection,
  poolSection,
  consoleSection,
];

/**
 * What `--quick` runs: CLI start, `waffle exec` warm, queue and library
 * against the floor, one idle sandbox's memory.
 */
export const QUICK_CASES: readonly string[] = [
  "floor",
  "queue_roundtrip",
  "cli_version",
  "deno_eval_0",
  "cli_exec_warm",
  "docker_exec_cli",
  "library_submit_warm",
  "idle_sandbox_memory",
];

/** `--quick`'s sample count, unless `--n` or WAFFLE_BENCH_N says otherwise. */
const QUICK_N = "100";
/** `--quick`'s warm-up count, unless `--warmup` or WAFFLE_BENCH_WARMUP says otherwise. */
const QUICK_WARMUP = "5";

/** Parsed command line. */
export interface BenchOptions {
  json: boolean;
  /** Judge the run against the budgets. */
  check: boolean;
  /** The quick subset, fewer samples. */
  quick: boolean;
  quiet: boolean;
  n: number;
  warmup: number;
  seconds: number;
  /** Wanted case names; undefined means all. */
  only: ReadonlySet<string> | undefined;
  /** Parent of the temp root; undefined means the system temp dir. */
  dir: string | undefined;
  help: boolean;
}

const HELP = `Usage: deno task bench [--json] [--n N] [--warmup N] [--seconds S]
                       [--only NAME,NAME] [--dir DIR] [--quiet] [--quick] [--check]

--quick   only ${QUICK_CASES.join(", ")}, fewer samples (under a minute)
--check   judge the run against bench/budgets.json; exit 1 when one is over

Cases: ${SECTIONS.flatMap((section) => section.cases).join(", ")}
`;

/**
 * Parses the benchmark's flags, with environment defaults.
 *
 * @param args Command-line arguments.
 * @param env Reads an environment variable.
 * @returns The options.
 * @throws {Error} On an unknown flag, a bad number or an unknown case name.
 */
export function parseBenchArgs(
  args: string[],
  env: (name: string) => string | undefined = (name) => Deno.env.get(name),
): BenchOptions {
  const { values, positionals } = parseArgs({
    args,
    options: {
      json: { type: "boolean", default: false },
      check: { type: "boolean", default: false },
      quick: { type: "boolean", default: false },
      quiet: { type: "boolean", default: false },
      n: { type: "string" },
      warmup: { type: "string" },
      seconds: { type: "string" },
      only: { type: "string" },
      dir: { type: "string" },
      help: { type: "boolean", short: "h", default: false },
    },
    strict: true,
    allowPositionals: true,
  });
  if (positionals.length > 0) throw new Error(`Unexpected argument '${positionals[0]}'`);
  const known = new Set(SECTIONS.flatMap((section) => section.cases));
  const quick = values.quick ?? false;
  let only: Set<string> | undefined = quick ? new Set(QUICK_CASES) : undefined;
  if (values.only !== undefined) {
    only = new Set(values.only.split(",").map((name) => name.trim()).filter((name) => name));
    const unknown = [...only].filter((name) => !known.has(name));
    if (unknown.length > 0) {
      throw new Error(`Unknown case '${unknown.join(", ")}'; known: ${[...known].join(", ")}`);
    }
  }
  return {
    json: values.json ?? false,
    check: values.check ?? false,
    quick,
    quiet: values.quiet ?? false,
    n: positive("n", values.n ?? env("WAFFLE_BENCH_N") ?? (quick ? QUICK_N : "300"), true),
    warmup: positive(
      "warmup",
      values.warmup ?? env("WAFFLE_BENCH_WARMUP") ?? (quick ? QUICK_WARMUP : "20"),
      true,
      true,
    ),
    seconds: positive("seconds", values.seconds ?? env("WAFFLE_BENCH_SECONDS") ?? "5", false),
    only,
    dir: values.dir,
    help: values.help ?? false,
  };
}

/**
 * Runs every wanted case of every section under one fresh temp root, and
 * removes it (and stops every runner) afterwards, also on SIGINT/SIGTERM.
 *
 * @param options Parsed flags.
 * @returns The report.
 * @throws {BenchInterrupted} After cleaning up, when a signal stopped the run.
 */
export async function runBench(options: BenchOptions): Promise<BenchReport> {
  const progress = new Progress({ quiet: options.quiet });
  const cleanup = new Cleanup();
  const root = await Deno.makeTempDir({
    prefix: "waffle-bench-",
    ...(options.dir === undefined ? {} : { dir: options.dir }),
  });
  cleanup.add(() => Deno.remove(root, { recursive: true }));
  // On a signal, release everything at once; the measurement in flight then
  // fails (its queue is closed) and runBench reports the interruption.
  let stopping: Promise<void> | undefined;
  const onSignal = (): void => {
    if (stopping !== undefined) return;
    progress.note("interrupted: cleaning up");
    stopping = cleanup.runAll();
    // Should the measurement in flight hang instead of failing, exit anyway.
    void stopping.finally(() => setTimeout(() => Deno.exit(130), 2000));
  };
  const signals: Deno.Signal[] = ["SIGINT", "SIGTERM"];
  for (const signal of signals) Deno.addSignalListener(signal, onSignal);
  const report: BenchReport = { results: [], ratios: [] };
  try {
    progress.note(`working under ${root}`);
    for (const section of SECTIONS) {
      const wanted = section.cases.filter((name) => options.only?.has(name) ?? true);
      if (wanted.length === 0) continue;
      const context: BenchContext = {
        n: options.n,
        warmup: options.warmup,
        seconds: options.seconds,
        quick: options.quick,
        root,
        progress,
        results: report.results,
        cleanup,
        wants: (name) => options.only?.has(name) ?? true,
      };
      const part = await section.run(context);
      report.results.push(...part.results);
      report.ratios.push(...part.ratios);
    }
  } catch (error) {
    if (stopping === undefined) throw error;
  } finally {
    await (stopping ?? cleanup.runAll());
    for (const signal of signals) Deno.removeSignalListener(signal, onSignal);
  }
  if (stopping !== undefined) throw new BenchInterrupted();
  return report;
}

/** Thrown by {@linkcode runBench} when SIGINT/SIGTERM stopped it (after cleaning up). */
export class BenchInterrupted extends Error {
  /** @param message Why. */
  constructor(message = "Interrupted") {
    super(message);
    this.name = "BenchInterrupted";
  }
}

function positive(name: string, text: string, integer: boolean, allowZero = false): number {
  const value = Number(text);
  const ok = Number.isFinite(value) && (allowZero ? value >= 0 : value > 0) &&
    (!integer || Number.isInteger(value));
  if (!ok) {
    throw new Error(
      `--${name} must be a ${integer ? "whole " : ""}number ${
        allowZero ? "≥ 0" : "> 0"
      }, got '${text}'`,
    );
  }
  return value;
}

if (import.meta.main) {
  let options: BenchOptions;
  try {
    options = parseBenchArgs(Deno.args);
  } catch (error) {
    console.error(`bench: ${error instanceof Error ? error.message : String(error)}\n\n${HELP}`);
    Deno.exit(2);
  }
  if (options.help) {
    console.log(HELP);
    Deno.exit(0);
  }
  try {
    // Read first: a broken budgets file should not cost a whole run.
    const budgets = await loadBudgets();
    const before = machineLoad();
    const report = await runBench(options);
    const after = machineLoad();
    applyTargets(report, budgets);
    const check = options.check ? judge(report, budgets) : undefined;
    if (options.json) {
      console.log(renderJson(check === undefined ? report : { ...report, check }));
    } else {
      console.log(renderTable(report).trimEnd());
      if (before !== undefined) console.log(`\nmachine: ${before} before, ${after} after`);
      if (check !== undefined) console.log(`\n${renderCheck(check).trimEnd()}`);
    }
    if (check !== undefined) Deno.exit(checkExitCode(check));
  } catch (error) {
    if (error instanceof BenchInterrupted) Deno.exit(130);
    console.error(`bench: failed: ${error instanceof Error ? error.stack : String(error)}`);
    Deno.exit(1);
  }
}
