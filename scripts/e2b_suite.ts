/**
 * The parts of `scripts/e2b_suite.sh` that read JSON:
 *
 * - `overlay MAP SRC`: writes each `../src/…` source of an npm package's
 *   source map (its `sourcesContent`) into SRC, so E2B's tests import that
 *   version of the SDK.
 * - `deps SDK_MANIFEST CHECKOUT_MANIFEST`: prints the package.json of what the
 *   tests import: the SDK's dependencies and the checkout's test tools.
 * - `sandboxes`: reads `waffle ps --json` on stdin, prints `tenant user` lines.
 * - `summary REPORTS [--json]`: the vitest JSON reports in REPORTS as a list of
 *   the tests that did not pass with their reason, and the line
 *   `e2b suite: N passed, N failed, N skipped` (or one JSON object with every
 *   test); exits 1 when a test failed or none ran.
 *
 * @module
 */

const encoder = new TextEncoder();
const out = (line: string): void => void Deno.stdout.writeSync(encoder.encode(`${line}\n`));
const note = (line: string): void => void Deno.stderr.writeSync(encoder.encode(`${line}\n`));

// What the tests import besides the SDK's own dependencies.
const TEST_TOOLS = ["vitest", "dotenv", "msw", "error-stack-parser-es"];

/** One test of the suite as the summary reports it. */
export interface SuiteTest {
  /** The test file, relative to packages/js-sdk. */
  file: string;
  /** The describe blocks and the test's name. */
  name: string;
  status: "passed" | "failed" | "skipped";
  /** The first line of the failure. */
  reason?: string;
}

interface VitestReport {
  testResults: {
    name: string;
    status: string;
    message?: string;
    assertionResults: { fullName: string; status: string; failureMessages?: string[] }[];
  }[];
}

/**
 * The tests of vitest's JSON reports; a file that failed to load counts as
 * one failed test.
 *
 * @param reports The reports' contents.
 * @returns Every test, in report order.
 */
export function suiteTests(reports: VitestReport[]): SuiteTest[] {
  const tests: SuiteTest[] = [];
  for (const report of reports) {
    for (const file of report.testResults) {
      const name = file.name.replace(/^.*?\/(tests\/)/, "$1");
      if (file.assertionResults.length === 0 && file.status === "failed") {
        tests.push({
          file: name,
          name: "(file)",
          status: "failed",
          reason: firstLine(file.message),
        });
      }
      for (const test of file.assertionResults) {
        const status = test.status === "passed"
          ? "passed"
          : test.status === "failed"
          ? "failed"
          : "skipped";
        tests.push({
          file: name,
          name: test.fullName,
          status,
          ...(status === "failed" ? { reason: firstLine(test.failureMessages?.[0]) } : {}),
        });
      }
    }
  }
  return tests;
}

function firstLine(text: string | undefined): string {
  // deno-lint-ignore no-control-regex
  const plain = (text ?? "").replace(/\x1b\[[0-9;]*m/g, "").trim();
  const line = plain.split("\n")[0] ?? "";
  return line.length > 400 ? `${line.slice(0, 400)}…` : line;
}

function summary(dir: string, json: boolean): number {
  const reports = [...Deno.readDirSync(dir)]
    .filter((entry) => entry.name.endsWith(".json"))
    .map((entry) => entry.name)
    .sort()
    .map((name) => JSON.parse(Deno.readTextFileSync(`${dir}/${name}`)) as VitestReport);
  const tests = suiteTests(reports);
  const count = (status: SuiteTest["status"]): number =>
    tests.filter((test) => test.status === status).length;
  const counts = { passed: count("passed"), failed: count("failed"), skipped: count("skipped") };
  const ok = counts.failed === 0 && counts.passed > 0;
  if (json) out(JSON.stringify({ ...counts, ok, tests }));
  else {
    for (const test of tests.filter((test) => test.status !== "passed")) {
      const mark = test.status === "failed" ? "FAIL" : "SKIP";
      out(`${mark} ${test.file} > ${test.name}${test.reason ? `: ${test.reason}` : ""}`);
    }
    out(
      `e2b suite: ${counts.passed} passed, ${counts.failed} failed, ${counts.skipped} skipped`,
    );
  }
  return ok ? 0 : 1;
}

function overlay(map: string, src: string): void {
  const parsed = JSON.parse(Deno.readTextFileSync(map)) as {
    sources: string[];
    sourcesContent?: (string | null)[];
  };
  let written = 0;
  parsed.sources.forEach((source, index) => {
    const content = parsed.sourcesContent?.[index];
    if (!source.startsWith("../src/") || typeof content !== "string") return;
    const relative = source.slice("../src/".length);
    if (relative.split("/").includes("..")) throw new Error(`Source '${source}' leaves src/`);
    const target = `${src}/${relative}`;
    Deno.mkdirSync(target.slice(0, target.lastIndexOf("/")), { recursive: true });
    Deno.writeTextFileSync(target, content);
    written++;
  });
  if (written === 0) throw new Error(`Source map '${map}' has no sources of src/`);
  note(`e2b suite: ${written} SDK sources from '${map}'`);
}

function deps(sdkManifest: string, checkoutManifest: string): void {
  const sdk = JSON.parse(Deno.readTextFileSync(sdkManifest));
  const checkout = JSON.parse(Deno.readTextFileSync(checkoutManifest));
  const wanted: Record<string, string> = { ...sdk.dependencies };
  for (const name of TEST_TOOLS) {
    const version = checkout.devDependencies?.[name];
    if (version === undefined) {
      throw new Error(`'${checkoutManifest}' has no devDependency '${name}'`);
    }
    wanted[name] = version;
  }
  const sorted = Object.fromEntries(Object.entries(wanted).sort(([a], [b]) => a.localeCompare(b)));
  out(
    JSON.stringify({ name: "e2b-suite-deps", private: true, dependencies: sorted }, null, 2),
  );
}

async function sandboxes(): Promise<void> {
  const text = await new Response(Deno.stdin.readable).text();
  if (text.trim() === "") return;
  for (const row of JSON.parse(text).sandboxes as { tenant: string; user: string }[]) {
    out(`${row.tenant} ${row.user}`);
  }
}

if (import.meta.main) {
  const [command, first, second] = Deno.args;
  const rest = Deno.args.slice(1);
  if (command === "overlay" && first && second && rest.length === 2) overlay(first, second);
  else if (command === "deps" && first && second && rest.length === 2) deps(first, second);
  else if (command === "sandboxes") await sandboxes();
  else if (command === "summary" && first) {
    Deno.exit(summary(first, rest.includes("--json")));
  } else {
    note(
      "Usage: e2b_suite.ts overlay MAP SRC | deps SDK CHECKOUT | sandboxes | summary DIR [--json]",
    );
    Deno.exit(2);
  }
}
