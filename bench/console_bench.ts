/**
 * The console section of `deno task bench` (issue 27): the page at `/ui` of
 * a `waffle serve` of the installed launcher, in Debian's Chromium through
 * playwright-core (tests/_browser.ts), each figure beside its baseline:
 *
 * - `console_first_load`: a fresh browser context (its session already
 *   holding the key, as after a sign-in) loading `/ui/` until the sandboxes
 *   table shows the one sandbox: the page's own clock, from the navigation's
 *   start to the frame the row appeared in. Against `console_api_list`: the
 *   `GET /waffle/v1/sandboxes` call alone, from this process. Its details
 *   give the console's asset size: the sum of the assets module's bodies
 *   (`lib/serve/console/assets.gen.ts`), raw and gzipped (level 6).
 * - `console_keystroke`: a key typed into the terminal's xterm (a real key
 *   event) until its echo by the sandbox's shell is in the page's DOM, on
 *   the page's clock (keydown to the mutation of `.xterm-rows`). Against
 *   `console_keystroke_sdk`: the same round trip through the E2B SDK,
 *   `pty.sendInput` of the key until `onData` brings its echo, on the same
 *   kind of shell (`bash -i -l` in a pty).
 *
 * @module
 */
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { Sandbox } from "e2b";
import type { Browser, Page } from "playwright-core";
import { installedWaffle } from "./cli_bench.ts";
import { serveFor } from "./serve_bench.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, now, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const CONSOLE_CASES = [
  "console_first_load",
  "console_api_list",
  "console_keystroke",
  "console_keystroke_sdk",
] as const;

// A fresh context per load costs ~0.3 s of browser work beside it.
const LOADS_MAX = 30;
const LIST_CALLS_PER_LOAD = 5;
const KEYS_MAX = 200;
// Keys typed on one line before it is cleared (untimed), so no line wraps.
const KEYS_PER_LINE = 25;
const SHOWN_MS = 30_000;

/** The console section. */
export const consoleSection: Section = {
  name: "console",
  cases: CONSOLE_CASES,
  run: runConsoleSection,
};

async function runConsoleSection(context: BenchContext): Promise<BenchReport> {
  // Loaded here: the browser's helpers probe Docker and Chromium as they load.
  const { chromiumMissing, launchChromium } = await import("../tests/_browser.ts");
  if (chromiumMissing !== undefined) {
    context.progress.note(`console section skipped: ${chromiumMissing}`);
    return { results: [], ratios: [] };
  }
  const waffle = await installedWaffle(context);
  const home = join(context.root, "console-home");
  await Deno.mkdir(home, { recursive: true });
  const options = await serveFor(context, waffle, { ...Deno.env.toObject(), WAFFLE_HOME: home });
  const page = await fetch(`${options.apiUrl}/ui/`);
  await page.body?.cancel();
  if (page.status !== 200) {
    throw new Error(`The installed waffle serves no console: GET /ui/ answered ${page.status}`);
  }
  const sandbox = await Sandbox.create("base", { ...options, timeoutMs: 3_600_000 });
  context.cleanup.add(() => sandbox.kill());
  const browser = await launchChromium();
  context.cleanup.add(() => browser.close());
  const results: BenchResult[] = [];
  if (context.wants("console_first_load") || context.wants("console_api_list")) {
    results.push(...await measureLoads(context, browser, options, sandbox.sandboxId));
  }
  if (context.wants("console_keystroke") || context.wants("console_keystroke_sdk")) {
    results.push(...await measureKeys(context, browser, options, sandbox));
  }
  const find = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
  const ratios = [
    ratioOf(
      "console_first_load / console_api_list",
      find("console_first_load"),
      find("console_api_list"),
    ),
    ratioOf(
      "console_keystroke / console_keystroke_sdk",
      find("console_keystroke"),
      find("console_keystroke_sdk"),
    ),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}

type Options = { apiKey: string; apiUrl: string };

/** What the page's functions read (typed here without the DOM's types). */
interface InPage {
  document: { querySelector(selector: string): unknown };
  /** Set by KEY_PROBE: the last keydown's time, and the echo's. */
  __key: number;
  __echo: number | null;
}

async function measureLoads(
  context: BenchContext,
  browser: Browser,
  options: Options,
  sandboxId: string,
): Promise<BenchResult[]> {
  const loads: number[] = [];
  const lists: number[] = [];
  const list = async (): Promise<void> => {
    const t0 = now();
    const response = await fetch(`${options.apiUrl}/waffle/v1/sandboxes`, {
      headers: { "x-api-key": options.apiKey },
    });
    const body = await response.json() as { sandboxes: { sandboxID: string }[] };
    lists.push(now() - t0);
    if (!body.sandboxes.some((one) => one.sandboxID === sandboxId)) {
      throw new Error(`GET /waffle/v1/sandboxes lacks '${sandboxId}'`);
    }
  };
  const runs = Math.min(context.n, LOADS_MAX);
  for (let i = 0; i < Math.min(context.warmup, 3) + runs; i++) {
    const ms = await firstLoad(browser, options, sandboxId);
    if (i < Math.min(context.warmup, 3)) continue;
    loads.push(ms);
    for (let j = 0; j < LIST_CALLS_PER_LOAD; j++) await list();
    context.progress.step("console_first_load + console_api_list", loads.length, runs);
  }
  return [
    summarize("console_first_load", loads, { details: await assetSizes() }),
    summarize("console_api_list", lists),
  ];
}

/** One fresh context's load of /ui/ to the sandbox's row, on the page's clock (ms). */
async function firstLoad(browser: Browser, options: Options, sandboxId: string): Promise<number> {
  const context = await browser.newContext({ viewport: { width: 1280, height: 720 } });
  try {
    // The session a sign-in leaves: the key in sessionStorage.
    await context.addInitScript(
      `sessionStorage.setItem("waffle.key", ${JSON.stringify(options.apiKey)})`,
    );
    const page = await context.newPage();
    await page.goto(`${options.apiUrl}/ui/`, { waitUntil: "commit" });
    // A function, not a string: the page's CSP forbids eval.
    const shown = await page.waitForFunction(
      (id) =>
        (globalThis as unknown as InPage).document.querySelector(
            `[data-testid=sandboxes] tr[data-sandbox-id="${id}"]`,
          ) === null
          ? false
          : performance.now(),
      sandboxId,
      { polling: "raf", timeout: SHOWN_MS },
    );
    return Number(await shown.jsonValue());
  } finally {
    await context.close();
  }
}

/** The console's assets as built: the sum of their bodies, raw and gzipped. */
async function assetSizes(): Promise<Record<string, number>> {
  const { CONSOLE_ASSETS } = await import("../lib/serve/console/assets.gen.ts");
  let raw = 0;
  let gzip = 0;
  for (const asset of Object.values(CONSOLE_ASSETS)) {
    const bytes = new TextEncoder().encode(asset.body);
    raw += bytes.byteLength;
    gzip += gzipSync(bytes, { level: 6 }).byteLength;
  }
  return { assets_raw_bytes: raw, assets_gzip_bytes: gzip };
}

// In the page: the time of the last keydown, and of the first mutation of
// the terminal's rows after which they hold the text waited for.
const KEY_PROBE = `(() => {
  const rows = document.querySelector(".xterm-rows");
  globalThis.__want = null;
  globalThis.__echo = null;
  document.addEventListener("keydown", () => { globalThis.__key = performance.now(); }, true);
  new MutationObserver(() => {
    if (globalThis.__want === null || globalThis.__echo !== null) return;
    if (rows.textContent.replaceAll("\\u00a0", " ").includes(globalThis.__want)) {
      globalThis.__echo = performance.now();
    }
  }).observe(rows, { subtree: true, childList: true, characterData: true });
})()`;

async function measureKeys(
  context: BenchContext,
  browser: Browser,
  options: Options,
  sandbox: Sandbox,
): Promise<BenchResult[]> {
  const count = Math.min(context.n, KEYS_MAX);
  const warm = Math.min(context.warmup, 10);
  const browserContext = await browser.newContext({ viewport: { width: 1280, height: 720 } });
  context.cleanup.add(() => browserContext.close());
  await browserContext.addInitScript(
    `sessionStorage.setItem("waffle.key", ${JSON.stringify(options.apiKey)})`,
  );
  const page = await browserContext.newPage();
  await page.goto(`${options.apiUrl}/ui/#/sandbox/${sandbox.sandboxId}/terminal`);
  await page.getByTestId("terminal-status").filter({ hasText: "connected" }).waitFor({
    timeout: SHOWN_MS,
  });
  await page.getByTestId("terminal").click();
  await page.evaluate(KEY_PROBE);
  const typed: number[] = [];
  const line = { typed: "" };
  for (let i = 0; i < warm + count; i++) {
    if (i % KEYS_PER_LINE === 0) await newLine(page, line);
    const key = letter();
    line.typed += key;
    await page.evaluate(
      `globalThis.__echo = null; globalThis.__want = ${JSON.stringify(line.typed)}`,
    );
    await page.keyboard.press(key);
    const took = await page.waitForFunction(
      () => {
        const probe = globalThis as unknown as InPage;
        return probe.__echo === null ? false : probe.__echo - probe.__key;
      },
      undefined,
      { polling: "raf", timeout: SHOWN_MS },
    );
    if (i >= warm) typed.push(Number(await took.jsonValue()));
  }
  context.progress.note(`console_keystroke: ${count} keys`);
  await browserContext.close();

  const sdk: number[] = [];
  let output = "";
  let wake: (() => void) | undefined;
  const pty = await sandbox.pty.create({
    cols: 120,
    rows: 30,
    timeoutMs: 0,
    onData: (data) => {
      output += new TextDecoder().decode(data);
      wake?.();
    },
  });
  const echoOf = (text: string): Promise<void> =>
    new Promise((resolve) => {
      wake = () => {
        if (output.includes(text)) resolve();
      };
      wake();
    });
  try {
    for (let i = 0; i < warm + count; i++) {
      if (i % KEYS_PER_LINE === 0) {
        // Ctrl-U clears readline's line, a new mark starts the next.
        output = "";
        const mark = `#${letter().toUpperCase()}${letter().toUpperCase()}${i}`;
        await sandbox.pty.sendInput(pty.pid, new TextEncoder().encode(`\x15${mark}`));
        await echoOf(mark);
        line.typed = mark;
      }
      const key = letter();
      line.typed += key;
      const t0 = now();
      await sandbox.pty.sendInput(pty.pid, new TextEncoder().encode(key));
      await echoOf(line.typed);
      if (i >= warm) sdk.push(now() - t0);
    }
  } finally {
    await sandbox.pty.kill(pty.pid).catch(() => false);
  }
  context.progress.note(`console_keystroke_sdk: ${count} keys`);
  return [summarize("console_keystroke", typed), summarize("console_keystroke_sdk", sdk)];
}

/** Clears the terminal's line (Ctrl-U, untimed) and types a fresh mark the next keys follow. */
async function newLine(page: Page, line: { typed: string }): Promise<void> {
  await page.keyboard.press("Control+U");
  const mark = `#${letter().toUpperCase()}${letter().toUpperCase()}${Date.now() % 1000}`;
  line.typed = mark;
  await page.evaluate(`globalThis.__echo = null; globalThis.__want = ${JSON.stringify(mark)}`);
  await page.keyboard.type(mark);
  await page.waitForFunction(() => (globalThis as unknown as InPage).__echo !== null, undefined, {
    polling: "raf",
    timeout: SHOWN_MS,
  });
}

function letter(): string {
  return String.fromCharCode(97 + Math.floor(Math.random() * 26));
}
