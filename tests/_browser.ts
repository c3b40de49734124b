/**
 * Shared by the browser tests and the console's screenshots and bench:
 * Debian's Chromium driven by `playwright-core` (no downloaded browser),
 * launched over Playwright's pipe transport (extra stdio fds, which Deno's
 * `node:child_process` supports), a gate that registers a browser test
 * ignored with its reason when Chromium (or Docker, or the `base` image) is
 * missing and failing instead under `WAFFLE_REQUIRE_DOCKER=1`, and a
 * {@linkcode PageWatch} that records what a page requests, navigates to,
 * logs and runs (dialogs, CSP violations, page errors).
 *
 * @module
 */
import assert from "node:assert/strict";
import { type Browser, chromium, type Page } from "playwright-core";
import { DockerClient } from "../lib/docker/mod.ts";
import { proxyContainerName } from "../lib/egress/proxy_container.ts";
import { baseTest } from "./_serve_helpers.ts";

/** Where Debian's `chromium` package puts its launcher (`WAFFLE_CHROMIUM` overrides). */
export const CHROMIUM_PATH = Deno.env.get("WAFFLE_CHROMIUM") ?? "/usr/bin/chromium";

/**
 * Chromium's flags: headless, no sandbox (the tests may run as root), no GPU,
 * and nothing that phones home or updates itself while a test runs.
 */
export const CHROMIUM_ARGS: readonly string[] = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-dev-shm-usage",
];

/** Why Chromium cannot run here, or undefined when `--version` answers. */
export const chromiumMissing: string | undefined = await probeChromium();

async function probeChromium(): Promise<string | undefined> {
  try {
    const out = await new Deno.Command(CHROMIUM_PATH, {
      args: ["--version"],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    const version = new TextDecoder().decode(out.stdout).trim();
    if (!out.success || !/^Chromium \d+/.test(version)) {
      return `'${CHROMIUM_PATH} --version' failed: ${version || "no output"}`;
    }
    return undefined;
  } catch (error) {
    return `no Chromium at '${CHROMIUM_PATH}' (apt-get install -y chromium, or scripts/setup.sh --browser): ${
      error instanceof Error ? error.message : String(error)
    }`;
  }
}

/**
 * Launches Debian's Chromium through playwright-core.
 *
 * @returns The browser; close it when done.
 */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: CHROMIUM_PATH, args: [...CHROMIUM_ARGS] });
}

/**
 * Registers a test that needs Chromium, Docker and the `base` image:
 * ignored with the reason where one is missing, failing instead under
 * `WAFFLE_REQUIRE_DOCKER=1`. Sanitizers are off (the browser's pipes and a
 * server shared by the file's tests outlive a test's ops).
 *
 * @param name The test's name.
 * @param fn The test.
 */
export function browserTest(name: string, fn: () => Promise<void>): void {
  if (chromiumMissing !== undefined) {
    if (Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1") {
      Deno.test({
        name,
        fn: () => assert.fail(`Required (WAFFLE_REQUIRE_DOCKER=1): ${chromiumMissing}`),
      });
    } else Deno.test({ name: `${name} [ignored: ${chromiumMissing}]`, ignore: true, fn: () => {} });
    return;
  }
  baseTest(name, fn, { sanitize: false });
}

/** A CSP violation as the page's `securitypolicyviolation` event saw it. */
export interface CspViolation {
  directive: string;
  blocked: string;
  sample: string;
}

// A string: this module is type-checked without the DOM's types.
const CSP_LISTENER = `
  globalThis.__cspViolations = [];
  document.addEventListener("securitypolicyviolation", (event) => {
    globalThis.__cspViolations.push({
      directive: event.violatedDirective,
      blocked: event.blockedURI,
      sample: event.sample,
    });
  });
`;

/** What a page did, recorded from the moment {@linkcode watchPage} was called. */
export interface PageWatch {
  /** Every request's URL (documents, scripts, fetches, WebSockets' upgrades). */
  requests: string[];
  /** Every URL a frame navigated to. */
  navigations: string[];
  /** Console messages, as `type: text`. */
  console: string[];
  /** Dialogs (alert, confirm, prompt, beforeunload) the page opened; each was dismissed. */
  dialogs: string[];
  /** Uncaught errors in the page. */
  errors: string[];
  /** Pages (popups, new tabs) the page opened. */
  popups: string[];
  /** CSP violations the page reported (read from the page). */
  violations(): Promise<CspViolation[]>;
}

/**
 * Records what a page requests, navigates to, logs and opens, and installs
 * (before any script of the page) a listener of its CSP violations.
 *
 * @param page A fresh page.
 * @returns The live record.
 */
export async function watchPage(page: Page): Promise<PageWatch> {
  const watch: PageWatch = {
    requests: [],
    navigations: [],
    console: [],
    dialogs: [],
    errors: [],
    popups: [],
    violations: async () => {
      const seen = await Promise.all(
        page.frames().map((frame) =>
          frame.evaluate(() =>
            (globalThis as unknown as { __cspViolations?: CspViolation[] }).__cspViolations ?? []
          ).catch(() => [])
        ),
      );
      return seen.flat();
    },
  };
  page.on("request", (request) => void watch.requests.push(request.url()));
  page.on("framenavigated", (frame) => void watch.navigations.push(frame.url()));
  page.on("console", (message) => void watch.console.push(`${message.type()}: ${message.text()}`));
  page.on("pageerror", (error) => void watch.errors.push(error.message));
  page.on("popup", (popup) => void watch.popups.push(popup.url()));
  page.on("dialog", (dialog) => {
    watch.dialogs.push(`${dialog.type()}: ${dialog.message()}`);
    void dialog.dismiss().catch(() => {});
  });
  // Runs in every document before its own scripts (Playwright injects it
  // over CDP, so the page's CSP does not apply to it).
  await page.addInitScript(CSP_LISTENER);
  return watch;
}

/**
 * Signs the page in with a key through the login form (`#key`,
 * `data-testid=login-submit`), from a fresh load of `/ui`.
 *
 * @param page The page.
 * @param url The server's base URL.
 * @param key The API key.
 */
export async function signIn(page: Page, url: string, key: string): Promise<void> {
  await page.goto(`${url}/ui/`);
  await page.locator("#key").fill(key);
  await page.getByTestId("login-submit").click();
}

/**
 * The text of xterm's rows, one string per row, its no-break spaces (the DOM
 * renderer's) made spaces and trailing blanks trimmed.
 *
 * @param page The page showing a terminal.
 * @returns The rows.
 */
export async function terminalRows(page: Page): Promise<string[]> {
  return await page.locator(".xterm-rows > div").evaluateAll((rows) =>
    rows.map((row) => (row.textContent ?? "").replaceAll("\u00a0", " ").replace(/\s+$/, ""))
  );
}

/**
 * Removes a stopped server's egress proxy (it outlives the server, and
 * restarts while its home is being removed), until Docker no longer knows it.
 *
 * @param home The server's home.
 * @returns Whether it is gone.
 */
export async function removeEgressProxy(home: string): Promise<boolean> {
  const docker = new DockerClient();
  const name = proxyContainerName(home);
  for (let i = 0; i < 40; i++) {
    await docker.removeContainer(name, { force: true }).catch(() => false);
    if (await docker.inspectContainer(name).catch(() => undefined) === null) return true;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return false;
}
