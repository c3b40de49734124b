/**
 * Turns a `deno test --junit-path` report into one line,
 * `tests: N passed, N failed, N skipped`, and an exit status for CI.
 *
 * Counting (checked against Deno 2.9.6's junit reporter):
 * - a test is a top-level `Deno.test`; steps (`t.step`) appear in the report as
 *   extra testcases named `parent > step` (possibly in another testsuite than
 *   their parent) and are reported apart (`--json`), so the numbers match
 *   Deno's own `ok | N passed | N failed | N ignored` line (a mismatch is noted);
 * - a testcase with `<failure>` or `<error>` (e.g. cancelled) failed, one with
 *   `<skipped/>` and a `time` attribute (`ignore: true`) is skipped, any other passed;
 * - a `<skipped/>` testcase without `time` was filtered out (`--filter`): it is
 *   not counted (only in `--json`, as `filtered`), as in Deno's own summary;
 * - an uncaught error from a test module (top-level throw, dangling promise) is
 *   missing from the junit report altogether; it is taken from the console log
 *   (`./x_test.ts (uncaught error)` under FAILURES) and counted as one failure.
 *
 * Usage: deno run --allow-read scripts/test_summary.ts --junit FILE
 *          [--log FILE] [--deno-status N] [--json]
 *   --junit FILE      the junit XML written by `deno test --junit-path`
 *   --log FILE        the captured console output of that run (for uncaught errors)
 *   --deno-status N   exit status of `deno test`; non-zero fails the run
 *   --json            print the counts as one JSON object instead of the line
 * The last line on stdout is the summary; notes go to stderr before it.
 * Exit status: 0 when something ran, nothing failed and `deno test` succeeded; 1 otherwise;
 * 2 on bad usage.
 *
 * @module
 */
import { parseArgs } from "node:util";

/** Counts of one kind of testcase. */
export interface Tally {
  passed: number;
  failed: number;
  skipped: number;
}

/** What a junit report says. */
export interface JunitCounts {
  /** Top-level tests. */
  tests: Tally;
  /** Test steps (`t.step`). */
  steps: Tally;
  /** Top-level tests not run because of `--filter`. */
  filtered: number;
}

/** The numbers printed at the end of a run. */
export interface Summary extends Tally {
  steps: Tally;
  /** Tests not run because of `--filter` (not in the other counts). */
  filtered: number;
  /** Modules with an uncaught error (included in `failed`). */
  uncaughtErrors: string[];
  /** Exit status of `deno test`, or null when unknown. */
  denoStatus: number | null;
  /** Whether the junit report was there. */
  junitFound: boolean;
  /** The run passed: something ran, nothing failed, deno test succeeded. */
  ok: boolean;
}

// deno-lint-ignore no-control-regex -- strips the colour codes deno test writes
const ANSI = /\x1b\[[0-9;]*[A-Za-z]/g;

function unescapeXml(text: string): string {
  return text.replace(/&(lt|gt|quot|apos|amp|#\d+|#x[0-9a-fA-F]+);/g, (_, entity: string) => {
    switch (entity) {
      case "lt":
        return "<";
      case "gt":
        return ">";
      case "quot":
        return '"';
      case "apos":
        return "'";
      case "amp":
        return "&";
      default:
        return String.fromCodePoint(
          entity.startsWith("#x") ? parseInt(entity.slice(2), 16) : parseInt(entity.slice(1), 10),
        );
    }
  });
}

function attribute(tag: string, name: string): string | undefined {
  const match = new RegExp(`\\s${name}="([^"]*)"`).exec(tag);
  return match === null ? undefined : unescapeXml(match[1] ?? "");
}

/**
 * Whether a testcase is a step: Deno names it "<parent> > <step>", and the
 * parent is another testcase of the report (listed before or after it).
 *
 * @param name The testcase's name.
 * @param names All testcase names of the report.
 * @returns True for a step.
 */
function isStep(name: string, names: Set<string>): boolean {
  for (let cut = name.indexOf(" > "); cut > 0; cut = name.indexOf(" > ", cut + 1)) {
    if (names.has(name.slice(0, cut))) return true;
  }
  return false;
}

/**
 * Counts a junit report's testcases by outcome, top-level tests and steps apart.
 *
 * @param xml The report.
 * @returns The counts.
 */
export function countJunit(xml: string): JunitCounts {
  const counts: JunitCounts = {
    tests: { passed: 0, failed: 0, skipped: 0 },
    steps: { passed: 0, failed: 0, skipped: 0 },
    filtered: 0,
  };
  const cases = [...xml.matchAll(/<testcase\b([^>]*?)(\/>|>([\s\S]*?)<\/testcase>)/g)].map(
    (match) => {
      const attributes = match[1] ?? "";
      return { attributes, name: attribute(attributes, "name") ?? "", body: match[3] ?? "" };
    },
  );
  // All names, not per suite: Deno files a test under the module that called
  // Deno.test (a helper, say) and its steps under the module of the step.
  const names = new Set(cases.map((testcase) => testcase.name));
  for (const { attributes, name, body } of cases) {
    const tally = isStep(name, names) ? counts.steps : counts.tests;
    if (/<(failure|error)\b/.test(body)) {
      tally.failed++;
    } else if (!/<skipped\b/.test(body)) {
      tally.passed++;
    } else if (attribute(attributes, "time") !== undefined) {
      tally.skipped++; // ignored: Deno reported it, in 0 ms
    } else if (tally === counts.tests) {
      counts.filtered++; // never reported: filtered out
    }
  }
  return counts;
}

/**
 * Finds the modules Deno reports as failed by an uncaught error (not in junit).
 *
 * @param log The console output of `deno test`.
 * @returns Module specifiers, each once.
 */
export function uncaughtErrors(log: string): string[] {
  const lines = log.replace(ANSI, "").split("\n").map((line) => line.trimEnd());
  const start = lines.findIndex((line) => line.trim() === "FAILURES");
  if (start < 0) return [];
  const found = new Set<string>();
  for (const line of lines.slice(start + 1)) {
    if (/^(ok|FAILED) \|/.test(line)) break;
    const match = /^(\S.*) \(uncaught error\)$/.exec(line);
    if (match !== null) found.add(match[1] ?? "");
  }
  return [...found];
}

/**
 * Reads Deno's own summary line (`FAILED | 3 passed (2 steps) | 2 failed | 1 ignored (5ms)`).
 *
 * @param log The console output of `deno test`.
 * @returns Its top-level counts, or undefined when there is none.
 */
export function denoSummary(log: string): Tally | undefined {
  const lines = log.replace(ANSI, "").split("\n").filter((line) => /^(ok|FAILED) \|/.test(line));
  const line = lines.at(-1);
  if (line === undefined) return undefined;
  const count = (word: string): number => {
    const match = new RegExp(`\\| (\\d+) ${word}\\b`).exec(line);
    return match === null ? 0 : Number(match[1]);
  };
  return { passed: count("passed"), failed: count("failed"), skipped: count("ignored") };
}

/**
 * Combines the junit counts, the log and deno's exit status.
 *
 * @param junit The junit report's text, or undefined when it is missing.
 * @param log The console output, or "" when not captured.
 * @param denoStatus Exit status of `deno test`, or null when unknown.
 * @returns The summary.
 */
export function summarize(
  junit: string | undefined,
  log: string,
  denoStatus: number | null,
): Summary {
  const counts = countJunit(junit ?? "");
  const uncaught = uncaughtErrors(log);
  const failed = counts.tests.failed + uncaught.length;
  const { passed, skipped } = counts.tests;
  return {
    passed,
    failed,
    skipped,
    steps: counts.steps,
    filtered: counts.filtered,
    uncaughtErrors: uncaught,
    denoStatus,
    junitFound: junit !== undefined,
    ok: failed === 0 && passed + failed > 0 && (denoStatus === null || denoStatus === 0),
  };
}

/**
 * The one summary line.
 *
 * @param summary The summary.
 * @returns `tests: N passed, N failed, N skipped`.
 */
export function summaryLine(summary: Tally): string {
  return `tests: ${summary.passed} passed, ${summary.failed} failed, ${summary.skipped} skipped`;
}

/**
 * Why a run did not pass, one line each (empty when it passed).
 *
 * @param summary The summary.
 * @param log The console output, for a cross-check with Deno's own counts.
 * @returns Explanatory notes.
 */
export function notesOf(summary: Summary, log: string): string[] {
  const notes: string[] = [];
  if (!summary.junitFound) {
    notes.push(
      "no junit report: deno test stopped before running tests (type error? bad argument?)",
    );
  }
  for (const module of summary.uncaughtErrors) {
    notes.push(`uncaught error in ${module} (counted as 1 failed; missing from the junit report)`);
  }
  if (summary.passed + summary.failed === 0) notes.push("no test ran");
  if (summary.denoStatus !== null && summary.denoStatus !== 0) {
    notes.push(`deno test exited with status ${summary.denoStatus}`);
  }
  const deno = denoSummary(log);
  if (
    deno !== undefined &&
    (deno.passed !== summary.passed || deno.failed !== summary.failed ||
      deno.skipped !== summary.skipped)
  ) {
    notes.push(`warning: deno's own summary differs: ${summaryLine(deno)}`);
  }
  return notes;
}

function readOptional(path: string | undefined): string | undefined {
  if (path === undefined) return undefined;
  try {
    const text = Deno.readTextFileSync(path);
    return text.trim() === "" ? undefined : text;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return undefined;
    throw error;
  }
}

function main(args: string[]): number {
  const encoder = new TextEncoder();
  const err = (line: string): void => {
    Deno.stderr.writeSync(encoder.encode(`test: ${line}\n`));
  };
  let parsed;
  try {
    parsed = parseArgs({
      args,
      options: {
        junit: { type: "string" },
        log: { type: "string" },
        "deno-status": { type: "string" },
        json: { type: "boolean" },
      },
    });
  } catch (error) {
    err(`error: ${error instanceof Error ? error.message : String(error)}`);
    return 2;
  }
  const { values } = parsed;
  if (values.junit === undefined) {
    err("error: --junit FILE is required");
    return 2;
  }
  const rawStatus = values["deno-status"];
  if (rawStatus !== undefined && !/^\d+$/.test(rawStatus)) {
    err(`error: --deno-status expects a number, got '${rawStatus}'`);
    return 2;
  }
  const log = readOptional(values.log) ?? "";
  const summary = summarize(
    readOptional(values.junit),
    log,
    rawStatus === undefined ? null : Number(rawStatus),
  );
  for (const note of notesOf(summary, log)) err(note);
  const last = values.json ? JSON.stringify(summary) : summaryLine(summary);
  Deno.stdout.writeSync(encoder.encode(`${last}\n`));
  return summary.ok ? 0 : 1;
}

if (import.meta.main) {
  Deno.exit(main(Deno.args));
}
