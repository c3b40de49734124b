/**
 * The console at `/ui` in a real browser: Debian's Chromium driven by
 * playwright-core (tests/_browser.ts), against a real `waffle serve` (the
 * CLI from source) with real sandboxes of the `base` image made by the real
 * E2B SDK. One server (and one browser) serves the file's tests; its home's
 * `[sandbox] egress` list attaches every sandbox to the egress proxy, so a
 * refused connection reaches the audit. Each test opens its own browser
 * context, and checks at its end that the key never went into a URL, a
 * cookie, localStorage or the page's console. The last test stops the
 * server (and its egress proxy): a `--filter` should keep it
 * (`--filter "console browser"` selects them all).
 *
 * Ignored with the reason where Chromium, Docker or the `base` image is
 * missing; failing instead under `WAFFLE_REQUIRE_DOCKER=1`.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { Sandbox } from "e2b";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { DockerClient } from "../lib/docker/mod.ts";
import { waitFor } from "./_helpers.ts";
import { sdk, serve, type Served } from "./_serve_helpers.ts";
import {
  browserTest,
  launchChromium,
  type PageWatch,
  removeEgressProxy,
  signIn,
  terminalRows,
  watchPage,
} from "./_browser.ts";

/** Every sandbox goes through the proxy, which allows one name no test reaches. */
const EGRESS_TOML = `[sandbox]\negress = ["allowed.test:9"]\n`;
/** How long the page gets to show what the server has (it polls every 2 s). */
const SHOWN_MS = 30_000;

interface Rig {
  served: Served;
  browser: Browser;
}

let rigPromise: Promise<Rig> | undefined;

/** The file's server and browser, started by the first test that needs them. */
function rig(): Promise<Rig> {
  rigPromise ??= (async () => {
    const served = await serve({ toml: EGRESS_TOML, captureStderr: true });
    return { served, browser: await launchChromium() };
  })();
  return rigPromise;
}

/** A sandbox of tenant `a` through the SDK. */
async function sandboxOf(served: Served, metadata: Record<string, string> = {}): Promise<Sandbox> {
  return await Sandbox.create("base", {
    ...sdk(served, served.keys.a),
    timeoutMs: 600_000,
    metadata,
  });
}

interface Session {
  context: BrowserContext;
  page: Page;
  watch: PageWatch;
}

/**
 * Runs `fn` with a fresh browser context and page (recorded from the start),
 * then checks that tenant a's key stayed out of every URL, cookie,
 * localStorage and console line of it, and closes it.
 */
async function withPage(
  options: { viewport?: { width: number; height: number }; permissions?: string[] },
  fn: (session: Session, rig: Rig) => Promise<void>,
): Promise<void> {
  const started = await rig();
  const context = await started.browser.newContext({
    viewport: options.viewport ?? { width: 1280, height: 720 },
    acceptDownloads: true,
  });
  try {
    if (options.permissions !== undefined) {
      await context.grantPermissions(options.permissions, { origin: started.served.url });
    }
    const page = await context.newPage();
    const watch = await watchPage(page);
    await fn({ context, page, watch }, started);
    await assertKeyKept(started.served.keys.a, { context, page, watch });
  } finally {
    await context.close();
  }
}

/** The key is in no URL, cookie, localStorage value or console line (sessionStorage may hold it). */
async function assertKeyKept(key: string, session: Session): Promise<void> {
  const { context, page, watch } = session;
  assert.ok(watch.requests.length > 0, "the page made requests");
  for (const url of [...watch.requests, ...watch.navigations]) {
    assert.ok(
      !url.includes(key) && !url.includes(encodeURIComponent(key)),
      `the key is in the URL '${url.replace(key, "<key>")}'`,
    );
  }
  assert.deepEqual(await context.cookies(), [], "the console sets no cookie");
  const stored = await inPage<string[]>(
    page,
    "Object.keys(localStorage).map((name) => `${name}=${localStorage.getItem(name)}`)",
  );
  assert.ok(!stored.some((entry) => entry.includes(key)), "the key is not in localStorage");
  assert.ok(!watch.console.some((line) => line.includes(key)), "the key is not logged");
}

/**
 * Evaluates an expression in the page (a string: the tests are type-checked
 * without the DOM's types).
 */
function inPage<T>(page: Page, expression: string): Promise<T> {
  return page.evaluate(expression) as Promise<T>;
}

/**
 * A killed sandbox is gone, and stays gone: no container of it (waited for,
 * bounded), and still none a few seconds later; else the server's audit of it.
 */
async function assertGone(served: Served, id: string): Promise<void> {
  const docker = new DockerClient();
  const containers = async (): Promise<string[]> =>
    (await docker.listContainers({ all: true, labels: [`waffle.user=${id}`] }))
      .flatMap((one) => one.Names);
  let left = await containers();
  for (let i = 0; i < 60 && left.length > 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    left = await containers();
  }
  if (left.length === 0) {
    await new Promise((resolve) => setTimeout(resolve, 3000));
    left = await containers();
  }
  assert.deepEqual(
    left,
    [],
    `sandbox '${id}' killed, yet a container of it is there; the server's audit of it: ${await auditOf(
      served,
      id,
    )}`,
  );
}

/** The server's audit lines (`serve/audit.jsonl`) naming a sandbox: method and status, in order. */
async function auditOf(served: Served, id: string): Promise<string> {
  const text = await Deno.readTextFile(`${served.home}/serve/audit.jsonl`).catch(() => "");
  return text.split("\n").filter((line) => line.includes(id)).map((line) => {
    const entry = JSON.parse(line) as { time: string; method: string; status: number };
    return `${entry.time.slice(11, 23)} ${entry.method} ${entry.status}`;
  }).join("; ");
}

/** Signs in with tenant a's key and waits for the sandboxes table. */
async function signedIn(page: Page, served: Served): Promise<void> {
  await signIn(page, served.url, served.keys.a);
  await page.getByTestId("sandboxes").waitFor({ state: "visible", timeout: SHOWN_MS });
}

/** The row of a sandbox in the sandboxes table. */
function rowOf(page: Page, id: string): ReturnType<Page["locator"]> {
  return page.locator(`[data-testid=sandboxes] tr[data-sandbox-id="${id}"]`);
}

/** Waits until `read` gives `want` (trimmed text), saying what it last saw. */
async function untilText(
  read: () => Promise<string | null>,
  want: string | RegExp,
  what: string,
): Promise<string> {
  let seen: string | null = null;
  const ok = (): boolean =>
    seen !== null && (typeof want === "string" ? seen.trim() === want : want.test(seen));
  try {
    await waitFor(async () => {
      seen = await read().catch(() => null);
      return ok();
    }, { timeoutMs: SHOWN_MS, what });
  } catch {
    assert.fail(`${what}: want ${String(want)}, the page showed ${JSON.stringify(seen)}`);
  }
  return seen!;
}

/** Opens a sandbox's tab through its hash route (the page stays loaded). */
async function openTab(page: Page, id: string, tab: string): Promise<void> {
  await page.evaluate((hash) => (location.hash = hash), `#/sandbox/${id}/${tab}`);
}

/** Types a line into the page's terminal (focused by a click on it) and presses Enter. */
async function typeLine(page: Page, line: string): Promise<void> {
  await page.getByTestId("terminal").click();
  await page.keyboard.type(line);
  await page.keyboard.press("Enter");
}

/** Clicks where xterm drew a text (its screen takes the pointer events), then lets the page react. */
async function clickTerminalText(page: Page, text: string): Promise<void> {
  const box = await page.locator(".xterm-rows span", { hasText: text }).last().boundingBox();
  assert.ok(box !== null, `'${text}' is drawn in the terminal`);
  const [x, y] = [box.x + box.width / 2, box.y + box.height / 2];
  await page.mouse.move(x, y);
  await page.mouse.click(x, y);
  await page.waitForTimeout(500);
}

/** Types `echo <mark> $(stty size)` and reads back the rows and columns the shell's pty has. */
async function sttySize(page: Page, mark: string): Promise<string> {
  await typeLine(page, `echo ${mark} $(stty size)`);
  const pattern = new RegExp(`^${mark} (\\d+ \\d+)$`);
  let size: string | undefined;
  await waitFor(async () => {
    size = (await terminalRows(page)).map((row) => pattern.exec(row.trim())?.[1]).find(Boolean);
    return size !== undefined;
  }, { timeoutMs: SHOWN_MS, what: `'${mark} <rows> <cols>' in .xterm-rows` });
  return size!;
}

browserTest(
  "console browser: a wrong key shows the one-line error; a key signs in, stays out of URLs, cookies and localStorage, and signs out",
  async () => {
    await withPage({}, async ({ page, watch }, { served }) => {
      const response = await page.goto(`${served.url}/ui/`);
      assert.equal(response?.status(), 200);
      const input = page.getByLabel("API key");
      assert.equal(await input.getAttribute("type"), "password");
      assert.equal(await input.getAttribute("id"), "key");

      const wrong = `wfl_wrong_${crypto.randomUUID()}`;
      await input.fill(wrong);
      await page.getByTestId("login-submit").click();
      const alert = page.getByRole("alert");
      await alert.waitFor({ state: "visible", timeout: SHOWN_MS });
      // Its text, without the dismiss button's.
      const said = String(
        await alert.evaluate(
          `(alert) => { const copy = alert.cloneNode(true); ` +
            `copy.querySelectorAll("button").forEach((button) => button.remove()); ` +
            `return copy.textContent; }`,
        ),
      ).trim();
      assert.ok(said.length > 0, "the error says something");
      assert.ok(!said.includes("\n"), `the error is one line: ${JSON.stringify(said)}`);
      assert.ok(!said.includes(wrong), "the error does not repeat the key");
      assert.equal(await page.getByTestId("sandboxes").count(), 0, "no table for a wrong key");
      assert.ok(!watch.requests.some((url) => url.includes(wrong)), "the wrong key is in no URL");

      await page.getByLabel("API key").fill(served.keys.a);
      await page.getByTestId("login-submit").click();
      await page.getByTestId("sandboxes").waitFor({ state: "visible", timeout: SHOWN_MS });
      await untilText(
        () => page.getByTestId("whoami").textContent(),
        /\ba\b/,
        "whoami names tenant a",
      );
      assert.equal(
        await page.evaluate(() => sessionStorage.getItem("waffle.key")),
        served.keys.a,
        "the key is kept in sessionStorage",
      );
      // A reload keeps the session (sessionStorage), without asking again.
      await page.reload();
      await page.getByTestId("sandboxes").waitFor({ state: "visible", timeout: SHOWN_MS });

      await page.getByTestId("logout").click();
      await page.locator("#key").waitFor({ state: "visible", timeout: SHOWN_MS });
      assert.equal(await page.evaluate(() => sessionStorage.getItem("waffle.key")), null);
      assert.equal(await page.getByTestId("sandboxes").count(), 0);
    });
  },
);

browserTest(
  "console browser: a sandbox the E2B SDK creates appears in the table without a reload, and leaves it when killed",
  async () => {
    await withPage({}, async ({ page }, { served }) => {
      await signedIn(page, served);
      let loads = 0;
      page.on("load", () => loads++);
      const sandbox = await sandboxOf(served, { purpose: "live-table" });
      try {
        const row = rowOf(page, sandbox.sandboxId);
        await row.waitFor({ state: "visible", timeout: SHOWN_MS });
        await untilText(() => row.locator("td[data-col=state]").textContent(), "running", "state");
        await untilText(
          () => row.locator("td[data-col=template]").textContent(),
          "base",
          "template",
        );
        await untilText(() => row.locator("td[data-col=tenant]").textContent(), "a", "tenant");
        assert.equal(
          await row.locator("td[data-col=id] a").getAttribute("href"),
          `#/sandbox/${sandbox.sandboxId}`,
        );
        // The filter matches metadata.
        await page.getByTestId("filter").fill("live-table");
        await row.waitFor({ state: "visible" });
        await page.getByTestId("filter").fill("no-such-sandbox-anywhere");
        await row.waitFor({ state: "detached", timeout: SHOWN_MS });
        await page.getByTestId("filter").fill("");
        await row.waitFor({ state: "visible", timeout: SHOWN_MS });
      } finally {
        await sandbox.kill();
      }
      await rowOf(page, sandbox.sandboxId).waitFor({ state: "detached", timeout: SHOWN_MS });
      await assertGone(served, sandbox.sandboxId);
      assert.equal(loads, 0, "the page was never reloaded");
    });
  },
);

browserTest(
  "console browser: the terminal runs python3 typed into xterm, follows a resize (stty size), and shows the exit status",
  async () => {
    const { served } = await rig();
    const sandbox = await sandboxOf(served);
    try {
      await withPage({}, async ({ page }) => {
        await signedIn(page, served);
        const row = rowOf(page, sandbox.sandboxId);
        await row.locator("button[data-action=terminal]").click();
        await untilText(
          () => page.getByTestId("terminal-status").textContent(),
          "connected",
          "terminal-status",
        );
        assert.match(page.url(), new RegExp(`#/sandbox/${sandbox.sandboxId}/terminal$`));
        await typeLine(page, "python3 -c 'print(6*7)'");
        await waitFor(async () => (await terminalRows(page)).some((line) => line.trim() === "42"), {
          timeoutMs: SHOWN_MS,
          what: "python3's '42' in .xterm-rows",
        });

        const before = await sttySize(page, "SIZE1");
        await page.setViewportSize({ width: 760, height: 460 });
        let after = before;
        // The page refits after its debounce and tells the pty; ask until it has.
        for (let i = 2; after === before && i < 40; i++) {
          after = await sttySize(page, `SIZE${i}`);
          if (after === before) await new Promise((resolve) => setTimeout(resolve, 250));
        }
        assert.notEqual(after, before, `stty size stayed '${before}' after the viewport shrank`);
        const [rowsBefore, colsBefore] = before.split(" ").map(Number);
        const [rowsAfter, colsAfter] = after.split(" ").map(Number);
        assert.ok(colsAfter! < colsBefore! && rowsAfter! < rowsBefore!, `${before} → ${after}`);

        await typeLine(page, "exit 3");
        await untilText(
          () => page.getByTestId("terminal-status").textContent(),
          "exited 3",
          "terminal-status after 'exit 3'",
        );
      });
    } finally {
      await sandbox.kill().catch(() => false);
    }
    await assertGone(served, sandbox.sandboxId);
  },
);

browserTest(
  "console browser: a file uploaded through the page is the SDK's to read, and downloads byte for byte",
  async () => {
    const { served } = await rig();
    const sandbox = await sandboxOf(served);
    try {
      await withPage({}, async ({ page }) => {
        await signedIn(page, served);
        await openTab(page, sandbox.sandboxId, "files");
        const path = await untilText(
          () => page.getByTestId("path").textContent(),
          /^\/\S*$/,
          "the files tab's path",
        );
        const bytes = new Uint8Array(300 * 1024);
        for (let at = 0; at < bytes.byteLength; at += 65536) {
          crypto.getRandomValues(bytes.subarray(at, at + 65536));
        }
        bytes.set(Array.from({ length: 256 }, (_, i) => i)); // every byte value
        const name = "upload-test.bin";
        await page.getByTestId("upload").setInputFiles({
          name,
          mimeType: "application/octet-stream",
          buffer: Buffer.from(bytes),
        });
        const row = page.locator(`[data-testid=files] tr[data-name="${name}"]`);
        await row.waitFor({ state: "visible", timeout: SHOWN_MS });
        const full = `${path.trim().replace(/\/$/, "")}/${name}`;
        const read = await sandbox.files.read(full, { format: "bytes" });
        assert.equal(read.byteLength, bytes.byteLength);
        assert.deepEqual(read, bytes, "the SDK reads what the page uploaded");

        const [download] = await Promise.all([
          page.waitForEvent("download", { timeout: SHOWN_MS }),
          row.locator("button[data-action=download]").click(),
        ]);
        assert.equal(download.suggestedFilename(), name);
        const saved = await download.path();
        assert.deepEqual(await Deno.readFile(saved), bytes, "the download is the file");
      });
    } finally {
      await sandbox.kill().catch(() => false);
    }
    await assertGone(served, sandbox.sandboxId);
  },
);

browserTest(
  "console browser: a denied egress attempt appears in the audit view, searchable, with its destination counted",
  async () => {
    const { served } = await rig();
    const sandbox = await sandboxOf(served);
    try {
      const tried = await sandbox.commands.run(
        "curl -s -o /dev/null -w '%{http_code}' --max-time 10 http://denied.test/",
      );
      assert.equal(tried.stdout, "403", "the proxy refused it");
      await withPage({}, async ({ page }) => {
        await signedIn(page, served);
        await page.evaluate(() => (location.hash = "#/audit/egress"));
        const denied = page.locator("[data-testid=egress] tr[data-decision=denied]").filter({
          has: page.locator("td[data-col=destination]", { hasText: "denied.test" }),
        });
        await denied.first().waitFor({ state: "visible", timeout: SHOWN_MS });
        assert.equal(
          (await denied.first().locator("td[data-col=sandbox]").textContent())?.trim(),
          sandbox.sandboxId,
        );
        assert.match(
          (await denied.first().locator("td[data-col=reason]").textContent()) ?? "",
          /not in this sandbox's egress list/,
        );
        const counted = page.locator("[data-testid=egress-destinations] tr", {
          hasText: "denied.test",
        });
        await counted.first().waitFor({ state: "visible", timeout: SHOWN_MS });
        await page.getByTestId("egress-chart").waitFor({ state: "visible" });
        // Search narrows to it, and to nothing for a name no line has.
        await page.getByTestId("audit-search").fill("denied.test");
        await denied.first().waitFor({ state: "visible", timeout: SHOWN_MS });
        await page.getByTestId("audit-search").fill("nothing-matches-this.test");
        await denied.first().waitFor({ state: "detached", timeout: SHOWN_MS });
        await page.getByTestId("audit-search").fill("");
        await page.getByTestId("decision-filter").selectOption("allowed");
        await denied.first().waitFor({ state: "detached", timeout: SHOWN_MS });
        await page.getByTestId("decision-filter").selectOption("denied");
        await denied.first().waitFor({ state: "visible", timeout: SHOWN_MS });
      });
    } finally {
      await sandbox.kill().catch(() => false);
    }
    await assertGone(served, sandbox.sandboxId);
  },
);

browserTest(
  "console browser: pause and resume from the row's buttons, as the SDK and the page see it",
  async () => {
    const { served } = await rig();
    const options = sdk(served, served.keys.a);
    const sandbox = await sandboxOf(served);
    try {
      await withPage({}, async ({ page }) => {
        await signedIn(page, served);
        const row = rowOf(page, sandbox.sandboxId);
        const state = row.locator("td[data-col=state]");
        await untilText(() => state.textContent(), "running", "state before pausing");
        await row.locator("button[data-action=pause]").click();
        await untilText(() => state.textContent(), "paused", "state after Pause");
        assert.equal((await Sandbox.getInfo(sandbox.sandboxId, options)).state, "paused");
        const listed = await Sandbox.list({ ...options, query: { state: ["paused"] } }).nextItems();
        assert.ok(listed.some((info) => info.sandboxId === sandbox.sandboxId), "listed as paused");
        assert.equal(await row.locator("button[data-action=pause]").count(), 0);

        await row.locator("button[data-action=resume]").click();
        await untilText(() => state.textContent(), "running", "state after Resume");
        assert.equal((await Sandbox.getInfo(sandbox.sandboxId, options)).state, "running");
        assert.equal((await sandbox.commands.run("echo back")).stdout, "back\n");
      });
    } finally {
      await sandbox.kill().catch(() => false);
    }
    await assertGone(served, sandbox.sandboxId);
  },
);

// What a hostile sandbox plants: each must show as text and run nothing.
const FILE_MARKUP = `<img src=x onerror="window.__xss=1">`;
const OUTPUT_MARKUP = [`<script>window.__xss=2</script>`, `<img src=x onerror=window.__xss=5>`];
const CONNECT_MARKUP = `<svg/onload=window.__xss=3>`;
const HOST_MARKUP = `<img/src/onerror=window.__xss=7>`;
const META_MARKUP = `<img src=x onerror="window.__xss=4">`;
// A link whose target is script (OSC 8) and a clipboard write (OSC 52).
const ESCAPES = `\x1b]8;;javascript:window.__xss=6\x1b\\click-js-osc8\x1b]8;;\x1b\\\n` +
  `\x1b]8;;https://example.test/osc8\x1b\\click-https-osc8\x1b]8;;\x1b\\\n` +
  `\x1b]52;c;${btoa("pwned-by-osc52")}\x07\nescapes-done\n`;

/** Sends a CONNECT and an absolute-form GET whose names are markup, through the sandbox's proxy. */
const HOSTILE_PROXY_PY = `import socket
for head in [b"CONNECT ${CONNECT_MARKUP}:443 HTTP/1.1\\r\\n\\r\\n",
             b"GET http://denied.test/ HTTP/1.1\\r\\nHost: ${HOST_MARKUP}\\r\\n\\r\\n"]:
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(head)
    print(s.recv(4096).split(b"\\r\\n")[0].decode())
    s.close()
`;

browserTest(
  "console browser: markup a hostile sandbox plants in a file name, command output, egress audit, metadata and terminal escapes shows as text and runs nothing",
  async () => {
    const { served } = await rig();
    const sandbox = await sandboxOf(served, { note: META_MARKUP });
    try {
      await sandbox.files.write(`/workspace/${FILE_MARKUP}`, "planted");
      await sandbox.files.write("/workspace/escapes.txt", ESCAPES);
      await sandbox.files.write("/workspace/hostile_proxy.py", HOSTILE_PROXY_PY);
      const printed = await sandbox.commands.run(
        `printf '%s\\n' '${OUTPUT_MARKUP[0]}' '${OUTPUT_MARKUP[1]}'`,
      );
      assert.equal(printed.stdout, `${OUTPUT_MARKUP.join("\n")}\n`);
      const proxied = await sandbox.commands.run("python3 /workspace/hostile_proxy.py");
      assert.match(proxied.stdout, /^HTTP\/1\.1 400 .*\nHTTP\/1\.1 403 /);

      await withPage({ permissions: ["clipboard-read", "clipboard-write"] }, async (session) => {
        const { page, watch } = session;
        const response = await page.goto(`${served.url}/ui/`);
        const csp = response?.headers()["content-security-policy"] ?? "";
        const scriptSrc = csp.split(";").map((part) => part.trim()).find((part) =>
          part.startsWith("script-src ")
        );
        assert.equal(scriptSrc, "script-src 'self'", `scripts from this origin only: ${csp}`);
        await signedIn(page, served);
        await inPage(page, `navigator.clipboard.writeText("clipboard-before")`);

        // Metadata: the filter finds the sandbox by it; wherever shown, it is text.
        await page.getByTestId("filter").fill("__xss=4");
        await rowOf(page, sandbox.sandboxId).waitFor({ state: "visible", timeout: SHOWN_MS });
        await page.getByTestId("filter").fill("");

        await openTab(page, sandbox.sandboxId, "files");
        const file = page.locator("[data-testid=files] tr[data-name]").filter({
          hasText: FILE_MARKUP,
        });
        await file.waitFor({ state: "visible", timeout: SHOWN_MS });
        assert.equal(await file.getAttribute("data-name"), FILE_MARKUP);
        await page.getByText(FILE_MARKUP, { exact: true }).first().waitFor({ state: "visible" });

        await openTab(page, sandbox.sandboxId, "commands");
        const command = page.locator("[data-testid=commands] tr[data-command-id]").filter({
          hasText: "__xss=2",
        });
        await command.first().waitFor({ state: "visible", timeout: SHOWN_MS });
        await command.first().click();
        const output = page.getByTestId("output");
        await untilText(
          () => output.textContent(),
          new RegExp(
            OUTPUT_MARKUP.map((m) => m.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")).join("\\n"),
          ),
          "the command's output, literal",
        );

        await page.evaluate(() => (location.hash = "#/audit/egress"));
        for (const markup of [CONNECT_MARKUP, HOST_MARKUP]) {
          const line = page.locator("[data-testid=egress] tr[data-decision=denied]").filter({
            hasText: markup,
          });
          await line.first().waitFor({ state: "visible", timeout: SHOWN_MS });
        }

        await openTab(page, sandbox.sandboxId, "terminal");
        await untilText(
          () => page.getByTestId("terminal-status").textContent(),
          "connected",
          "terminal-status",
        );
        await typeLine(page, "cat /workspace/escapes.txt");
        await waitFor(
          async () => (await terminalRows(page)).some((line) => line.trim() === "escapes-done"),
          { timeoutMs: SHOWN_MS, what: "the escapes' last line in .xterm-rows" },
        );
        // A javascript: OSC 8 link, clicked, goes nowhere and asks nothing.
        await clickTerminalText(page, "click-js-osc8");
        assert.deepEqual(watch.popups, [], "the javascript: OSC 8 link opened nothing");
        assert.equal(
          await inPage(page, "navigator.clipboard.readText()"),
          "clipboard-before",
          "OSC 52 did not write the clipboard",
        );

        assert.equal(
          await inPage(page, "globalThis.__xss"),
          undefined,
          "no planted script ran",
        );
        assert.deepEqual(watch.dialogs, [], "no dialog opened");
        assert.deepEqual(watch.errors, [], "no page error");
        const violations = await watch.violations();
        const scripts = violations.filter((v) =>
          /script/.test(v.directive) || v.sample.includes("__xss")
        );
        assert.deepEqual(
          scripts,
          [],
          `no script (nor planted markup) was blocked by the CSP, none was ever inserted; all: ${
            JSON.stringify(violations)
          }`,
        );
        assert.ok(
          !watch.console.some((line) =>
            /Content Security Policy|Trusted Type/i.test(line) && /script|__xss/i.test(line)
          ),
          `no CSP script report in the console: ${watch.console.join(" | ")}`,
        );
        assert.ok(
          !watch.requests.some((url) => new URL(url).pathname.endsWith("/x")),
          "no planted <img src=x> was ever requested",
        );

        // An https: OSC 8 link, clicked, opens nothing without the operator's yes:
        // at most xterm's own confirm naming it (dismissed here).
        await clickTerminalText(page, "click-https-osc8");
        assert.deepEqual(watch.popups, [], "the https: OSC 8 link opened nothing");
        assert.ok(
          (watch.dialogs as string[]).every((dialog) =>
            dialog.startsWith("confirm: ") && dialog.includes("https://example.test/osc8")
          ),
          `only a confirm naming the link: ${JSON.stringify(watch.dialogs)}`,
        );
      });
    } finally {
      await sandbox.kill().catch(() => false);
    }
    await assertGone(served, sandbox.sandboxId);
  },
);

browserTest(
  "console browser: the keyboard reaches and operates a row's actions, the dialog closes on Escape, and a phone width has no horizontal page scroll",
  async () => {
    const { served } = await rig();
    const sandbox = await sandboxOf(served);
    try {
      await withPage({}, async ({ page }) => {
        await signedIn(page, served);
        const row = rowOf(page, sandbox.sandboxId);
        await row.waitFor({ state: "visible", timeout: SHOWN_MS });
        await untilText(() => row.locator("td[data-col=state]").textContent(), "running", "state");
        // Tab (from the top of the page) until the row's Kill button has focus.
        const focusedAction = (): Promise<string | null> =>
          inPage(
            page,
            `(document.activeElement?.closest('tr[data-sandbox-id="${sandbox.sandboxId}"]') ?? null)` +
              ` === null ? null : document.activeElement.getAttribute("data-action")`,
          );
        await page.locator("body").click({ position: { x: 1, y: 1 } });
        const seen: (string | null)[] = [];
        for (let i = 0; i < 200 && seen.at(-1) !== "kill"; i++) {
          await page.keyboard.press("Tab");
          seen.push(await focusedAction());
        }
        assert.equal(seen.at(-1), "kill", `Tab reached the row's buttons: ${seen.join(",")}`);
        assert.ok(
          await inPage(page, `document.activeElement?.matches(":focus-visible") ?? false`),
          "the focus is visible",
        );
        await page.keyboard.press("Enter");
        const dialog = page.locator("dialog[open]");
        await dialog.waitFor({ state: "visible", timeout: SHOWN_MS });
        assert.ok(
          await inPage(page, `(document.activeElement?.closest("dialog") ?? null) !== null`),
          "the focus is in the dialog",
        );
        await page.keyboard.press("Escape");
        await dialog.waitFor({ state: "detached", timeout: SHOWN_MS });
        assert.equal(
          (await Sandbox.getInfo(sandbox.sandboxId, sdk(served, served.keys.a))).state,
          "running",
        );

        // Shift+Tab back to the row's Terminal button and operate it with Enter.
        for (let i = 0; i < 20 && (await focusedAction()) !== "terminal"; i++) {
          await page.keyboard.press("Shift+Tab");
        }
        assert.equal(await focusedAction(), "terminal");
        await page.keyboard.press("Enter");
        await untilText(
          () => page.getByTestId("terminal-status").textContent(),
          "connected",
          "the terminal opened by Enter",
        );
        assert.match(page.url(), new RegExp(`#/sandbox/${sandbox.sandboxId}/terminal$`));

        // A phone: no view scrolls the page sideways.
        await page.setViewportSize({ width: 390, height: 844 });
        const wide: string[] = [];
        for (
          const hash of [
            "#/sandboxes",
            `#/sandbox/${sandbox.sandboxId}/commands`,
            `#/sandbox/${sandbox.sandboxId}/files`,
            `#/sandbox/${sandbox.sandboxId}/terminal`,
            "#/audit/egress",
          ]
        ) {
          await page.evaluate((to) => (location.hash = to), hash);
          await page.waitForTimeout(300);
          const widths = await inPage<{ scroll: number; inner: number }>(
            page,
            "({ scroll: document.scrollingElement.scrollWidth, inner: innerWidth })",
          );
          if (widths.scroll > widths.inner) wide.push(`${hash}: ${JSON.stringify(widths)}`);
        }
        assert.deepEqual(wide, [], "views wider than the phone's 390 px");
      });
    } finally {
      await sandbox.kill().catch(() => false);
    }
    await assertGone(served, sandbox.sandboxId);
  },
);

browserTest(
  "console browser: a sandbox killed (Kill, confirmed) while its terminal is open is gone, and stays gone after the page closes",
  async () => {
    const { served } = await rig();
    const sandbox = await sandboxOf(served);
    try {
      await withPage({}, async ({ page }) => {
        await signedIn(page, served);
        await openTab(page, sandbox.sandboxId, "terminal");
        await untilText(
          () => page.getByTestId("terminal-status").textContent(),
          "connected",
          "terminal-status",
        );
        await typeLine(page, "sleep 600");
        // The header's Kill, confirmed in the dialog.
        await page.locator("[data-testid=sandbox-header] button[data-action=kill]").click();
        await page.getByTestId("confirm").click();
        await untilText(
          () => page.getByTestId("terminal-status").textContent(),
          /^(exited|failed)/,
          "terminal-status once killed",
        );
        await assert.rejects(
          Sandbox.getInfo(sandbox.sandboxId, sdk(served, served.keys.a)),
          /not found/i,
        );
      });
      // The page (and its terminal's stream) is gone now: nothing brings the sandbox back.
      await assertGone(served, sandbox.sandboxId);
      assert.ok(!(await served.leftovers()).includes(sandbox.sandboxId), "not listed by waffle ps");
    } finally {
      await sandbox.kill().catch(() => false);
    }
  },
);

browserTest(
  "console browser: the shared server stops; no key went into its log, no sandbox was left",
  async () => {
    if (rigPromise === undefined) return;
    const { served, browser } = await rig();
    let left: string[] = [];
    let proxyGone = false;
    try {
      await browser.close();
      // A kill answers before the sandbox's record is gone: wait for it, bounded.
      left = await served.leftovers();
      for (let i = 0; i < 60 && left.length > 0; i++) {
        await new Promise((resolve) => setTimeout(resolve, 500));
        left = await served.leftovers();
      }
    } finally {
      await served.stop();
      // The home's egress proxy outlives the server: it is this file's to remove.
      proxyGone = await removeEgressProxy(served.home);
    }
    assert.deepEqual(
      { left, proxyGone },
      { left: [], proxyGone: true },
      "every test killed its sandboxes; the home's egress proxy is removed",
    );
    for (const key of [served.keys.a, served.keys.b]) {
      assert.ok(!served.stderr().includes(key), "the server never logs a key");
    }
  },
);
