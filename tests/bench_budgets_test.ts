/**
 * The bench's budget judging (`bench/budgets.ts`), without Docker and
 * without timing anything: `bench/budgets.json` parses with its zod schema,
 * a bad file is refused with the offending path, a verdict allows the
 * recorded spread in the budget's direction and no further, unmeasured
 * figures are listed and never fail, and `--check` exits 1 only on a fail.
 *
 * @module
 */
import assert from "node:assert/strict";
import {
  applyTargets,
  type BudgetsFile,
  checkExitCode,
  judge,
  loadBudgets,
  parseBudgets,
  renderCheck,
  verdictOf,
} from "../bench/budgets.ts";
import { parseBenchArgs, QUICK_CASES } from "../bench/main.ts";
import type { BenchReport } from "../bench/stats.ts";

const FILE: BudgetsFile = {
  spread_runs: { command: "x", when: [], definition: "y" },
  budgets: [
    {
      name: "a / b",
      measure: { ratio: "a / b" },
      direction: "<=",
      target: 1.5,
      spread: 0.1,
    },
    {
      name: "c / d",
      measure: { ratio: "c / d" },
      direction: ">=",
      target: 0.8,
      spread: null,
    },
    {
      name: "idle",
      measure: { result: "idle", detail: "mib" },
      direction: "<=",
      target: 30,
      unit: "MiB",
      spread: 0.05,
    },
  ],
};

function report(ratios: Record<string, number>, idleMib?: number): BenchReport {
  return {
    results: idleMib === undefined ? [] : [{
      name: "idle",
      n: 1,
      p50_ms: Number.NaN,
      p99_ms: Number.NaN,
      mean_ms: Number.NaN,
      min_ms: Number.NaN,
      max_ms: Number.NaN,
      details: { mib: idleMib },
    }],
    ratios: Object.entries(ratios).map(([name, value]) => ({ name, value })),
  };
}

Deno.test("bench/budgets.json parses, names every figure once, and records its spread runs", async () => {
  const budgets = await loadBudgets();
  const names = budgets.budgets.map((budget) => budget.name);
  assert.equal(new Set(names).size, names.length);
  for (
    const name of [
      "cli_exec_warm / docker_exec_cli",
      "cli_version / deno_eval_0",
      "queue_roundtrip / floor",
      "library_submit_warm / floor",
      "idle_sandbox_memory",
      "mcp_session_start / mcp_session_start_direct",
    ]
  ) {
    assert.ok(names.includes(name), `no budget '${name}'`);
  }
  const measured = budgets.budgets.filter((budget) => budget.spread !== null);
  assert.ok(measured.length > 0, "no budget has a spread");
  for (const budget of measured) {
    assert.equal(budget.spread_samples?.length, 3, `'${budget.name}' spread is not from 3 runs`);
  }
  assert.equal(budgets.spread_runs.when.length, 3);
});

Deno.test("parseBudgets() refuses a bad direction, a missing spread and a repeated name", () => {
  const good = JSON.parse(JSON.stringify(FILE));
  assert.equal(parseBudgets(JSON.stringify(good)).budgets.length, 3);
  const badDirection = structuredClone(good);
  badDirection.budgets[0].direction = "<";
  assert.throws(() => parseBudgets(JSON.stringify(badDirection)), /budgets\.0\.direction/);
  const noSpread = structuredClone(good);
  delete noSpread.budgets[1].spread;
  assert.throws(() => parseBudgets(JSON.stringify(noSpread)), /budgets\.1\.spread/);
  const twice = structuredClone(good);
  twice.budgets[1].name = "a / b";
  assert.throws(() => parseBudgets(JSON.stringify(twice)), /Budget 'a \/ b' appears twice/);
  const unknownKey = structuredClone(good);
  unknownKey.budgets[0].targt = 1;
  assert.throws(() => parseBudgets(JSON.stringify(unknownKey)), /budgets\.0/);
});

Deno.test("verdictOf() allows the spread in the budget's direction and no further", () => {
  const atMost = { direction: "<=" as const, target: 1.5, spread: 0.1 };
  assert.equal(verdictOf(1.2, atMost), "pass");
  assert.equal(verdictOf(1.5, atMost), "pass");
  assert.equal(verdictOf(1.6, atMost), "noise");
  assert.equal(verdictOf(1.7, atMost), "fail");
  const atLeast = { direction: ">=" as const, target: 0.8, spread: 0.1 };
  assert.equal(verdictOf(0.9, atLeast), "pass");
  assert.equal(verdictOf(0.75, atLeast), "noise");
  assert.equal(verdictOf(0.7, atLeast), "fail");
  // No spread recorded: no allowance.
  assert.equal(verdictOf(1.51, { ...atMost, spread: null }), "fail");
  assert.equal(verdictOf(undefined, atMost), "not measured");
});

Deno.test("judge() reads ratios and result details, and lists what the run did not measure", () => {
  const lines = judge(report({ "a / b": 1.55 }, 40), FILE);
  assert.deepEqual(
    lines.map((line) => [line.name, line.measured, line.verdict]),
    [["a / b", 1.55, "noise"], ["c / d", null, "not measured"], ["idle", 40, "fail"]],
  );
  const table = renderCheck(lines);
  assert.match(table, /^ratio\s+measured\s+budget\s+spread\s+verdict$/m);
  assert.match(table, /^idle\s+40\.00 MiB\s+≤ 30 MiB\s+±5%\s+fail$/m);
  assert.match(table, /^c \/ d\s+-\s+≥ 0\.8\s+not measured yet\s+not measured$/m);
  assert.match(table, /check: 1 within budget, 1 over, 1 not measured/);
});

Deno.test("checkExitCode() is 1 on a fail only; noise and unmeasured figures pass", () => {
  assert.equal(checkExitCode(judge(report({ "a / b": 1.55, "c / d": 0.9 }, 29), FILE)), 0);
  assert.equal(checkExitCode(judge(report({}), FILE)), 0);
  assert.equal(checkExitCode(judge(report({ "a / b": 1.2, "c / d": 0.5 }, 29), FILE)), 1);
  assert.equal(checkExitCode(judge(report({ "a / b": 1.2 }, 31.6), FILE)), 1);
});

Deno.test("applyTargets() shows each budget's target beside its ratio", () => {
  const run = report({ "a / b": 1, "c / d": 1, "e / f": 1 });
  applyTargets(run, FILE);
  assert.deepEqual(run.ratios.map((ratio) => ratio.target), ["≤ 1.5", "≥ 0.8", undefined]);
});

Deno.test("parseBenchArgs() --quick runs the quick cases with fewer samples; --only and --n win", () => {
  const env = (): undefined => undefined;
  const quick = parseBenchArgs(["--quick", "--check"], env);
  assert.equal(quick.check, true);
  assert.equal(quick.quick, true);
  assert.deepEqual([...quick.only!].sort(), [...QUICK_CASES].sort());
  assert.equal(quick.n, 100);
  const narrowed = parseBenchArgs(["--quick", "--only", "floor", "--n", "7"], env);
  assert.deepEqual([...narrowed.only!], ["floor"]);
  assert.equal(narrowed.n, 7);
  const full = parseBenchArgs([], env);
  assert.equal(full.check, false);
  assert.equal(full.only, undefined);
  assert.equal(full.n, 300);
});
