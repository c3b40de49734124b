/**
 * The bench's budgets: `bench/budgets.json` (the one owner of every target),
 * read with zod, and the verdicts `deno task bench --check` prints.
 *
 * A budget names one measured figure (a ratio of the report, or a number in
 * a result's details), a direction and a target. A figure worse than its
 * target by no more than the recorded spread (the machine's noise, relative)
 * is `noise`, not `fail`: a budget is never tighter than the machine.
 *
 * @module
 */
import { fileURLToPath } from "node:url";
import { z } from "zod";
import type { BenchReport } from "./stats.ts";

const Measure = z.union([
  z.strictObject({ ratio: z.string().min(1) }),
  z.strictObject({ result: z.string().min(1), detail: z.string().min(1) }),
]);

const Budget = z.strictObject({
  /** What the table shows, e.g. `cli_exec_warm / docker_exec_cli`. */
  name: z.string().min(1),
  measure: Measure,
  direction: z.enum(["<=", ">="]),
  target: z.number().positive(),
  unit: z.string().optional(),
  /** Max relative deviation from the median over the spread runs; null: not measured yet. */
  spread: z.number().nonnegative().nullable(),
  spread_samples: z.array(z.number()).optional(),
  note: z.string().optional(),
  history: z.strictObject({
    turn_before: z.number().nullable(),
    now: z.number().nullable(),
    source: z.string(),
  }).optional(),
});

/** The whole of `bench/budgets.json`. */
export const BudgetsFile = z.strictObject({
  $comment: z.string().optional(),
  spread_runs: z.strictObject({
    command: z.string(),
    when: z.array(z.string()),
    definition: z.string(),
  }),
  budgets: z.array(Budget).min(1),
});

/** One budget of `bench/budgets.json`. */
export type Budget = z.infer<typeof Budget>;
/** The parsed `bench/budgets.json`. */
export type BudgetsFile = z.infer<typeof BudgetsFile>;

/** Where the budgets live. */
export const BUDGETS_PATH = fileURLToPath(new URL("./budgets.json", import.meta.url));

/**
 * Parses the budgets' text.
 *
 * @param text JSON text.
 * @returns The budgets, names unique.
 * @throws {Error} On bad JSON, a shape zod refuses or a repeated name.
 */
export function parseBudgets(text: string): BudgetsFile {
  const parsed = BudgetsFile.safeParse(JSON.parse(text));
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new Error(`Bad budgets at '${issue.path.join(".")}': ${issue.message}`);
  }
  const seen = new Set<string>();
  for (const budget of parsed.data.budgets) {
    if (seen.has(budget.name)) throw new Error(`Budget '${budget.name}' appears twice`);
    seen.add(budget.name);
  }
  return parsed.data;
}

/**
 * Reads and parses `bench/budgets.json` (or another file).
 *
 * @param path The file.
 * @returns The budgets.
 * @throws {Error} As {@linkcode parseBudgets}, or when the file cannot be read.
 */
export async function loadBudgets(path: string = BUDGETS_PATH): Promise<BudgetsFile> {
  return parseBudgets(await Deno.readTextFile(path));
}

/** `pass`: meets the target; `noise`: worse, but within the spread; `fail`; `not measured`. */
export type Verdict = "pass" | "noise" | "fail" | "not measured";

/** One line of the check. */
export interface Judged {
  name: string;
  /** Null when this run did not measure it (null, not absent, in `--json`). */
  measured: number | null;
  direction: "<=" | ">=";
  target: number;
  unit: string | undefined;
  spread: number | null;
  verdict: Verdict;
}

/**
 * The figure a budget names, from a report.
 *
 * @param report One run's report.
 * @param budget The budget.
 * @returns The value, or undefined when this run did not measure it.
 */
export function measuredValue(report: BenchReport, budget: Budget): number | undefined {
  const measure = budget.measure;
  const value = "ratio" in measure
    ? report.ratios.find((ratio) => ratio.name === measure.ratio)?.value
    : report.results.find((result) => result.name === measure.result)?.details?.[measure.detail];
  return value !== undefined && Number.isFinite(value) ? value : undefined;
}

/**
 * The verdict of one value against one budget: worse than the target by at
 * most `spread` (relative) is `noise`.
 *
 * @param value The measured value, or undefined.
 * @param budget Direction, target and spread.
 * @returns The verdict.
 */
export function verdictOf(
  value: number | undefined,
  budget: Pick<Budget, "direction" | "target" | "spread">,
): Verdict {
  if (value === undefined) return "not measured";
  const slack = budget.spread ?? 0;
  if (budget.direction === "<=") {
    if (value <= budget.target) return "pass";
    return value <= budget.target * (1 + slack) ? "noise" : "fail";
  }
  if (value >= budget.target) return "pass";
  return value >= budget.target * (1 - slack) ? "noise" : "fail";
}

/**
 * Every budget judged against one report, in the file's order.
 *
 * @param report One run's report.
 * @param budgets The parsed budgets.
 * @returns One line per budget.
 */
export function judge(report: BenchReport, budgets: BudgetsFile): Judged[] {
  return budgets.budgets.map((budget) => {
    const measured = measuredValue(report, budget);
    return {
      name: budget.name,
      measured: measured ?? null,
      direction: budget.direction,
      target: budget.target,
      unit: budget.unit,
      spread: budget.spread,
      verdict: verdictOf(measured, budget),
    };
  });
}

/**
 * The check's exit code: 1 when any budget failed, else 0 (`not measured`
 * and `noise` do not fail).
 *
 * @param judged The check's lines.
 * @returns 0 or 1.
 */
export function checkExitCode(judged: readonly Judged[]): 0 | 1 {
  return judged.some((line) => line.verdict === "fail") ? 1 : 0;
}

/**
 * The check as an aligned table: ratio, measured, budget, spread, verdict.
 *
 * @param judged The check's lines.
 * @returns Multi-line text ending in a newline.
 */
export function renderCheck(judged: readonly Judged[]): string {
  const rows = judged.map((line) => [
    line.name,
    line.measured === null ? "-" : `${line.measured.toFixed(2)}${unitOf(line)}`,
    `${line.direction === "<=" ? "≤" : "≥"} ${line.target}${unitOf(line)}`,
    line.spread === null ? "not measured yet" : `±${(line.spread * 100).toFixed(0)}%`,
    line.verdict,
  ]);
  const table = [["ratio", "measured", "budget", "spread", "verdict"], ...rows];
  const widths = table[0]!.map((_, column) =>
    Math.max(...table.map((row) => (row[column] ?? "").length))
  );
  const lines = table.map((row) =>
    row.map((cell, column) =>
      column === 1 ? cell.padStart(widths[column]!) : cell.padEnd(widths[column]!)
    ).join("  ").trimEnd()
  );
  const failed = judged.filter((line) => line.verdict === "fail").length;
  const unmeasured = judged.filter((line) => line.verdict === "not measured").length;
  lines.push(
    "",
    `check: ${
      judged.length - failed - unmeasured
    } within budget, ${failed} over, ${unmeasured} not measured`,
  );
  return `${lines.join("\n")}\n`;
}

/**
 * Sets each ratio's `target` (for the plain table) from its budget, so the
 * targets have one owner, this file's.
 *
 * @param report One run's report; its ratios are changed in place.
 * @param budgets The parsed budgets.
 */
export function applyTargets(report: BenchReport, budgets: BudgetsFile): void {
  for (const ratio of report.ratios) {
    const budget = budgets.budgets.find((entry) =>
      "ratio" in entry.measure && entry.measure.ratio === ratio.name
    );
    if (budget !== undefined) {
      ratio.target = `${budget.direction === "<=" ? "≤" : "≥"} ${budget.target}`;
    }
  }
}

function unitOf(line: Judged): string {
  return line.unit === undefined ? "" : ` ${line.unit}`;
}
