/**
 * The official MCP conformance suite (`@modelcontextprotocol/conformance`,
 * installed by `scripts/setup.sh --conformance` into `.tools/conformance`
 * with the Node.js >= 22 it needs), run against a server URL: one
 * `conformance server --scenario S` process per scenario, so a scenario
 * whose client leaks its connection (the suite's failing paths do not close
 * theirs) leaves nothing open for the next one.
 *
 * @module
 */
import { fileURLToPath } from "node:url";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const BIN = `${REPO}/.tools/conformance/node_modules/.bin`;
/** Node.js from the npm package `node` (the machine's own may be older than 22). */
const NODE = `${BIN}/node`;
const CONFORMANCE = `${BIN}/conformance`;

/** One scenario's outcome: its checks' counts by status. */
export interface ScenarioResult {
  /** The scenario's name. */
  scenario: string;
  /** Checks that succeeded. */
  passed: number;
  /** Checks that failed. */
  failed: number;
  /** Checks that warned. */
  warnings: number;
  /** Each failed check: `id: message`. */
  failures: string[];
}

/**
 * Whether the suite is installed; the reason when not.
 *
 * @returns Null when it can run, else why not.
 */
export function conformanceMissing(): string | null {
  for (const path of [NODE, CONFORMANCE]) {
    try {
      Deno.statSync(path);
    } catch {
      return `conformance suite not installed ('${path}' missing; run bash scripts/setup.sh --conformance)`;
    }
  }
  return null;
}

/**
 * Whether a scenario passed: no check failed, and at least one ran.
 *
 * @param result The scenario's result.
 * @returns Whether it passed.
 */
export function scenarioPassed(result: ScenarioResult): boolean {
  return result.failed === 0 && result.passed + result.warnings > 0;
}

/**
 * The server scenarios the suite knows (`conformance list --server`).
 *
 * @returns Their names.
 */
export async function serverScenarios(): Promise<string[]> {
  const listed = await conformance(["list", "--server"]);
  return [...listed.stdout.matchAll(/^\s+- (\S+)/gm)].map((match) => match[1]!);
}

/**
 * Runs every scenario against a URL, one process each, in order.
 *
 * @param url The server's MCP endpoint.
 * @param scenarios The scenarios to run.
 * @returns One result per scenario.
 */
export async function runConformance(url: string, scenarios: string[]): Promise<ScenarioResult[]> {
  const results: ScenarioResult[] = [];
  for (const scenario of scenarios) {
    const dir = await Deno.makeTempDir({ prefix: "waffle-conformance-" });
    try {
      const ran = await conformance(["server", "--url", url, "--scenario", scenario, "-o", dir]);
      results.push(await readResult(dir, scenario, ran));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
  return results;
}

/**
 * Both runs side by side, one scenario a line.
 *
 * @param title The table's heading.
 * @param columns Each run's name and results.
 * @returns The table.
 */
export function resultTable(
  title: string,
  columns: { name: string; results: ScenarioResult[] }[],
): string {
  const scenarios = [...new Set(columns.flatMap((c) => c.results.map((r) => r.scenario)))];
  const width = Math.max(...scenarios.map((s) => s.length), 8);
  const cell = (result: ScenarioResult | undefined): string =>
    result === undefined
      ? "-".padEnd(20)
      : `${scenarioPassed(result) ? "PASS" : "FAIL"} ${result.passed}/${
        result.passed + result.failed
      }${result.warnings > 0 ? ` (${result.warnings} warn)` : ""}`.padEnd(20);
  const lines = [
    title,
    `${"scenario".padEnd(width)}  ${columns.map((c) => c.name.padEnd(20)).join(" ")}`,
    ...scenarios.map((scenario) =>
      `${scenario.padEnd(width)}  ${
        columns.map((c) => cell(c.results.find((r) => r.scenario === scenario))).join(" ")
      }`
    ),
    `${"passed".padEnd(width)}  ${
      columns.map((c) =>
        `${c.results.filter(scenarioPassed).length}/${c.results.length} scenarios`.padEnd(20)
      ).join(" ")
    }`,
  ];
  return lines.join("\n");
}

async function readResult(
  dir: string,
  scenario: string,
  ran: { code: number; stdout: string; stderr: string },
): Promise<ScenarioResult> {
  const result: ScenarioResult = { scenario, passed: 0, failed: 0, warnings: 0, failures: [] };
  const checks: { id: string; status: string; errorMessage?: string }[] = [];
  for await (const entry of Deno.readDir(dir)) {
    if (!entry.isDirectory) continue;
    try {
      checks.push(...JSON.parse(await Deno.readTextFile(`${dir}/${entry.name}/checks.json`)));
    } catch {
      // A scenario that crashed writes no checks: counted below.
    }
  }
  for (const check of checks) {
    if (check.status === "SUCCESS") result.passed++;
    else if (check.status === "WARNING") result.warnings++;
    else if (check.status === "FAILURE") {
      result.failed++;
      result.failures.push(`${check.id}: ${(check.errorMessage ?? "").slice(0, 300)}`);
    }
  }
  if (checks.length === 0) {
    result.failed++;
    result.failures.push(`no checks (exit ${ran.code}): ${ran.stderr.slice(-300)}`);
  }
  return result;
}

async function conformance(
  args: string[],
): Promise<{ code: number; stdout: string; stderr: string }> {
  const output = await new Deno.Command(NODE, {
    args: [CONFORMANCE, ...args],
    env: { NO_COLOR: "1", FORCE_COLOR: "0" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return {
    code: output.code,
    stdout: decoder.decode(output.stdout),
    stderr: decoder.decode(output.stderr),
  };
}
