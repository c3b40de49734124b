/**
 * Benchmark bookkeeping shared by every section: percentiles, result and
 * ratio records, progress lines on stderr, and the two renderings of a
 * report (a table for people, `--json` for machines).
 *
 * A section (queue, and later Docker) produces {@linkcode BenchResult}s and
 * {@linkcode BenchRatio}s; `main.ts` concatenates them into one
 * {@linkcode BenchReport} and renders it.
 *
 * @module
 */
// deno-lint-ignore-file no-console

/** One measured case. Times are milliseconds. */
export interface BenchResult {
  /** Stable name, e.g. `queue_roundtrip`. */
  name: string;
  /** Number of samples (or completed requests). */
  n: number;
  /** Median. */
  p50_ms: number;
  /** 99th percentile. */
  p99_ms: number;
  /** Arithmetic mean. */
  mean_ms: number;
  /** Fastest sample. */
  min_ms: number;
  /** Slowest sample. */
  max_ms: number;
  /** Operations per second, for throughput cases. */
  per_s?: number;
  /** Case-specific numbers (stage means, commits per request, …). */
  details?: Record<string, number>;
  /** A short human note shown in the table. */
  note?: string;
}

/** A derived ratio between results. */
export interface BenchRatio {
  /** Stable name, e.g. `queue_roundtrip_p50 / floor_p50`. */
  name: string;
  /** The ratio. */
  value: number;
  /** What the ratio should stay under (or over), for the table. */
  target?: string;
}

/** Everything one run measured. */
export interface BenchReport {
  results: BenchResult[];
  ratios: BenchRatio[];
}

/**
 * The `p`-th percentile of ascending samples, by linear interpolation
 * between closest ranks (the "type 7" estimator of R and NumPy).
 *
 * @param sorted Samples in ascending order.
 * @param p Percentile in [0, 100].
 * @returns The percentile, or NaN for no samples.
 */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = (Math.min(100, Math.max(0, p)) / 100) * (sorted.length - 1);
  const low = Math.floor(rank);
  const high = Math.min(sorted.length - 1, low + 1);
  const a = sorted[low]!;
  const b = sorted[high]!;
  return a + (b - a) * (rank - low);
}

/**
 * The arithmetic mean.
 *
 * @param samples Any samples.
 * @returns The mean, or NaN for no samples.
 */
export function mean(samples: readonly number[]): number {
  if (samples.length === 0) return Number.NaN;
  let sum = 0;
  for (const sample of samples) sum += sample;
  return sum / samples.length;
}

/** Optional parts of a result that {@linkcode summarize} passes through. */
export interface SummaryExtras {
  per_s?: number;
  details?: Record<string, number>;
  note?: string;
}

/**
 * Builds a result from raw samples.
 *
 * @param name The case name.
 * @param samples Durations in milliseconds (any order; not modified).
 * @param extras Throughput, details and a note.
 * @returns The result.
 */
export function summarize(
  name: string,
  samples: readonly number[],
  extras: SummaryExtras = {},
): BenchResult {
  const sorted = [...samples].sort((a, b) => a - b);
  return {
    name,
    n: sorted.length,
    p50_ms: percentile(sorted, 50),
    p99_ms: percentile(sorted, 99),
    mean_ms: mean(sorted),
    min_ms: sorted[0] ?? Number.NaN,
    max_ms: sorted.at(-1) ?? Number.NaN,
    ...extras,
  };
}

/**
 * The per-stage means of samples that each record several named stages.
 *
 * @param stages One record per sample, stage name to milliseconds.
 * @param prefix Prepended to each key, e.g. `mean_`.
 * @returns Stage name (prefixed) to mean milliseconds.
 */
export function stageMeans(
  stages: readonly Record<string, number>[],
  prefix = "",
): Record<string, number> {
  const keys = new Set(stages.flatMap((stage) => Object.keys(stage)));
  const out: Record<string, number> = {};
  for (const key of keys) {
    out[`${prefix}${key}`] = mean(stages.map((stage) => stage[key]).filter(isNumber));
  }
  return out;
}

/**
 * `a.p50_ms / b.p50_ms` (or another field) as a ratio record, when both
 * results exist.
 *
 * @param name The ratio's name.
 * @param a Numerator result.
 * @param b Denominator result.
 * @param field Which number of the results to divide.
 * @param target Shown in the table, e.g. `≤ 2`.
 * @returns The ratio, or undefined when a result is missing or the denominator is 0.
 */
export function ratioOf(
  name: string,
  a: BenchResult | undefined,
  b: BenchResult | undefined,
  field: "p50_ms" | "p99_ms" | "mean_ms" | "per_s" = "p50_ms",
  target?: string,
): BenchRatio | undefined {
  const top = a?.[field];
  const bottom = b?.[field];
  if (top === undefined || bottom === undefined || bottom === 0 || !Number.isFinite(bottom)) {
    return undefined;
  }
  return { name, value: top / bottom, ...(target === undefined ? {} : { target }) };
}

/**
 * The report as the `--json` document: `{"results":[…],"ratios":[…]}` (and
 * `"check":[…]` with `--check`), numbers rounded to microseconds.
 *
 * @param report The report, and the check's lines when there are some.
 * @returns One line of JSON.
 */
export function renderJson(report: BenchReport & { check?: unknown }): string {
  return JSON.stringify(report, (_key, value) => typeof value === "number" ? round(value) : value);
}

/**
 * The report as an aligned text table (results, then ratios, then details).
 *
 * @param report The report.
 * @returns Multi-line text ending in a newline.
 */
export function renderTable(report: BenchReport): string {
  const lines: string[] = [];
  const header = ["name", "n", "p50 ms", "p99 ms", "mean ms", "per s", "note"];
  const rows = report.results.map((result) => [
    result.name,
    String(result.n),
    fixed(result.p50_ms),
    fixed(result.p99_ms),
    fixed(result.mean_ms),
    result.per_s === undefined ? "" : result.per_s.toFixed(1),
    result.note ?? "",
  ]);
  lines.push(...align([header, ...rows], [false, true, true, true, true, true, false]));
  if (report.ratios.length > 0) {
    lines.push("");
    const ratioRows = report.ratios.map((ratio) => [
      ratio.name,
      ratio.value.toFixed(2),
      ratio.target === undefined ? "" : `target ${ratio.target}`,
    ]);
    lines.push(...align([["ratio", "value", ""], ...ratioRows], [false, true, false]));
  }
  const detailed = report.results.filter((result) =>
    result.details !== undefined && Object.keys(result.details).length > 0
  );
  if (detailed.length > 0) {
    lines.push("", "details (ms unless named otherwise)");
    for (const result of detailed) {
      const parts = Object.entries(result.details!).map(([key, value]) => `${key}=${fixed(value)}`);
      lines.push(`  ${result.name}: ${parts.join("  ")}`);
    }
  }
  return `${lines.map((line) => line.trimEnd()).join("\n")}\n`;
}

/**
 * Throttled progress lines on stderr: `bench: <case> <done>/<total> …`.
 * At most one line per `intervalMs` per case, plus the first and last.
 */
export class Progress {
  #intervalMs: number;
  #last = new Map<string, number>();
  #quiet: boolean;

  /**
   * @param options `quiet` silences every line; `intervalMs` throttles them.
   */
  constructor(options: { quiet?: boolean; intervalMs?: number } = {}) {
    this.#quiet = options.quiet ?? false;
    this.#intervalMs = options.intervalMs ?? 1000;
  }

  /**
   * Reports a count-based step.
   *
   * @param name The case.
   * @param done Completed units.
   * @param total Units planned.
   * @param detail Extra text, e.g. the running median; a function is only
   *   called when a line is printed.
   */
  step(name: string, done: number, total: number, detail: string | (() => string) = ""): void {
    this.#emit(name, () => `${done}/${total}${suffix(detail)}`, done >= total);
  }

  /**
   * Reports a time-based step (throttled; never the final line, see
   * {@linkcode Progress.done}).
   *
   * @param name The case.
   * @param elapsedMs Time spent so far.
   * @param totalMs Time planned.
   * @param detail Extra text, e.g. completed requests; a function is only
   *   called when a line is printed.
   */
  timed(
    name: string,
    elapsedMs: number,
    totalMs: number,
    detail: string | (() => string) = "",
  ): void {
    this.#emit(
      name,
      () => `${(elapsedMs / 1000).toFixed(1)}/${(totalMs / 1000).toFixed(1)} s${suffix(detail)}`,
      false,
    );
  }

  /**
   * Reports that a case finished (never throttled).
   *
   * @param name The case.
   * @param detail What it measured, e.g. `p50 3.1 ms`.
   */
  done(name: string, detail: string): void {
    this.#emit(name, () => `done${suffix(detail)}`, true);
  }

  /**
   * Prints a free-form line (never throttled).
   *
   * @param text The message.
   */
  note(text: string): void {
    if (!this.#quiet) console.error(`bench: ${text}`);
  }

  #emit(name: string, text: () => string, final: boolean): void {
    if (this.#quiet) return;
    const now = performance.now();
    const last = this.#last.get(name);
    if (!final && last !== undefined && now - last < this.#intervalMs) return;
    this.#last.set(name, now);
    console.error(`bench: ${name} ${text()}${final ? "" : " …"}`);
  }
}

/**
 * A monotonic clock in milliseconds with sub-millisecond resolution.
 *
 * @returns Milliseconds since the process started.
 */
export function now(): number {
  return performance.now();
}

/**
 * The 1-minute load average and CPU count, to judge how quiet the machine
 * was (benchmarks on a shared machine drift).
 *
 * @returns E.g. `load 0.42 on 2 CPUs`, or undefined where `/proc/loadavg` is missing.
 */
export function machineLoad(): string | undefined {
  try {
    const load = Deno.readTextFileSync("/proc/loadavg").split(" ")[0];
    return `load ${load} on ${navigator.hardwareConcurrency} CPUs`;
  } catch {
    return undefined;
  }
}

function suffix(detail: string | (() => string)): string {
  const text = typeof detail === "function" ? detail() : detail;
  return text === "" ? "" : ` ${text}`;
}

function isNumber(value: number | undefined): value is number {
  return value !== undefined && Number.isFinite(value);
}

function round(value: number): number {
  return Number.isFinite(value) ? Math.round(value * 1000) / 1000 : value;
}

function fixed(value: number): string {
  if (!Number.isFinite(value)) return "-";
  return value >= 100 ? value.toFixed(1) : value.toFixed(3);
}

function align(rows: string[][], right: boolean[]): string[] {
  const widths = rows[0]!.map((_, column) =>
    Math.max(...rows.map((row) => (row[column] ?? "").length))
  );
  return rows.map((row) =>
    row.map((cell, column) =>
      right[column] ? cell.padStart(widths[column]!) : cell.padEnd(widths[column]!)
    ).join("  ")
  );
}
