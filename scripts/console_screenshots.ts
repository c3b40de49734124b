/**
 * Screenshots of every view of the console (`/ui`) at 1280×720, from a real
 * run: a `waffle serve` (the CLI from source) in a fresh home whose
 * `[sandbox] egress` list attaches sandboxes to the egress proxy, sandboxes
 * made with the E2B SDK, a few commands (one refused by the proxy), a
 * snapshot taken from the page, and Debian's Chromium through
 * playwright-core (tests/_browser.ts). Writes docs/console/*.png.
 *
 * Usage: deno run -A scripts/console_screenshots.ts [--json] [--out DIR]
 *   --json  print what it wrote as one JSON object ({"files":[{"view","path","bytes"}]})
 *   --out   the directory (default docs/console)
 *
 * Needs Docker, the `base` image (scripts/build_images.sh base) and Chromium
 * (scripts/setup.sh --browser).
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Sandbox } from "e2b";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { selfCommand } from "../lib/config/self.ts";
import type { Page } from "playwright-core";
import {
  chromiumMissing,
  launchChromium,
  removeEgressProxy,
  signIn,
  terminalRows,
} from "../tests/_browser.ts";
import { sdk, serve, type Served } from "../tests/_serve_helpers.ts";

/** The views, in the order they are taken. */
export const VIEWS = [
  "login",
  "sandboxes",
  "sandbox_commands",
  "sandbox_files",
  "terminal",
  "snapshots",
  "metrics",
  "audit_egress",
  "audit_mcp",
] as const;

/** One screenshot written. */
export interface Shot {
  view: (typeof VIEWS)[number];
  path: string;
  bytes: number;
}

const SHOWN_MS = 60_000;
const REPO = new URL("..", import.meta.url).pathname;
const MCP_CACHE = Deno.env.get("WAFFLE_MCP_CACHE") || join(REPO, ".tools", "mcp-cache");

// Sandboxes reach only pypi.org (a refused attempt makes the egress audit);
// an MCP server in a sandbox of its own makes the MCP audit.
const CONFIG = `
[sandbox]
egress = ["pypi.org:443"]
mcp_cache = "${MCP_CACHE}"

[mcp.everything]
package = "npm:@modelcontextprotocol/server-everything@2026.8.31"
args = ["stdio"]
execution = "sandbox"
authority = "sandbox"
tools = ["echo", "get-env"]
`;

/**
 * Runs the scene and writes one PNG per view.
 *
 * @param options The output directory.
 * @returns What was written.
 */
export async function takeScreenshots(options: { out: string }): Promise<Shot[]> {
  if (chromiumMissing !== undefined) throw new Error(chromiumMissing);
  await Deno.mkdir(options.out, { recursive: true });
  const served = await serve({ toml: CONFIG });
  const browser = await launchChromium();
  const made: Sandbox[] = [];
  try {
    const scene = await stage(served, made);
    await mcpCalls(served, scene.main);
    const context = await browser.newContext({ viewport: { width: 1280, height: 720 } });
    const page = await context.newPage();
    const shots: Shot[] = [];
    const shoot = async (view: Shot["view"]): Promise<void> => {
      const path = join(options.out, `${view}.png`);
      await page.screenshot({ path });
      shots.push({ view, path, bytes: (await Deno.stat(path)).size });
    };
    await page.goto(`${served.url}/ui/`);
    await page.locator("#key").waitFor({ state: "visible", timeout: SHOWN_MS });
    await shoot("login");
    await signIn(page, served.url, served.keys.a);
    for (const sandbox of made) {
      await page.locator(`tr[data-sandbox-id="${sandbox.sandboxId}"]`).waitFor({
        timeout: SHOWN_MS,
      });
    }
    await page.locator(`tr[data-sandbox-id="${scene.paused}"] td[data-col=state]`, {
      hasText: "paused",
    }).waitFor({ timeout: SHOWN_MS });
    await settle(page);
    await shoot("sandboxes");
    await sandboxViews(page, scene.main, shoot);
    await go(page, "#/audit/egress");
    await page.locator("[data-testid=egress] tr[data-decision=denied]").first().waitFor({
      timeout: SHOWN_MS,
    });
    await settle(page);
    await shoot("audit_egress");
    await go(page, "#/audit/mcp");
    await page.locator("[data-testid=mcp] tbody tr").first().waitFor({ timeout: SHOWN_MS });
    await settle(page);
    await shoot("audit_mcp");
    await context.close();
    return shots;
  } finally {
    await browser.close();
    for (const sandbox of made) await sandbox.kill().catch(() => false);
    await served.stop();
    // The home's egress proxy outlives the server.
    await removeEgressProxy(served.home);
  }
}

/** Three sandboxes: one with commands, files and a refused connection; one idle; one paused. */
async function stage(
  served: Served,
  made: Sandbox[],
): Promise<{ main: string; paused: string }> {
  const options = { ...sdk(served, served.keys.a), timeoutMs: 600_000 };
  const main = await Sandbox.create("base", { ...options, metadata: { agent: "reviewer" } });
  made.push(main);
  const idle = await Sandbox.create("base", { ...options, metadata: { agent: "planner" } });
  made.push(idle);
  const paused = await Sandbox.create("base", { ...options, metadata: { agent: "tester" } });
  made.push(paused);
  await main.files.write("/workspace/notes.md", "# Notes\n\nThe agent's scratch file.\n");
  await main.files.write("/workspace/data.csv", "id,value\n1,42\n2,7\n");
  await main.commands.run(
    "mkdir -p /workspace/src && printf 'print(6*7)\\n' > /workspace/src/main.py",
  );
  await main.commands.run("python3 /workspace/src/main.py");
  await main.commands.run("ls -la /workspace");
  await main.commands.run("python3 -c 'import sys; sys.exit(2)'").catch(() => undefined);
  await main.commands.run(
    "curl -s -o /dev/null -w '%{http_code}\\n' --max-time 10 http://example.com/",
  );
  // A few seconds of work, so the metrics charts have something to draw.
  await main.commands.run("timeout 8 sh -c 'while :; do :; done' || true");
  await idle.commands.run("uname -a");
  await Sandbox.pause(paused.sandboxId, options);
  return { main: main.sandboxId, paused: paused.sandboxId };
}

/**
 * A few MCP tool calls (one outside the allowlist) through `waffle mcp run`
 * in tenant a's sandbox `user` (a tenant key sees its own sandboxes' MCP lines only).
 */
async function mcpCalls(served: Served, user: string): Promise<void> {
  const self = selfCommand();
  const transport = new StdioClientTransport({
    command: self.executable,
    args: [...self.prefix, "mcp", "run", "everything", "--user", user, "--tenant", "a"],
    env: {
      PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
      HOME: served.home,
      WAFFLE_HOME: served.home,
      WAFFLE_MCP_CACHE: MCP_CACHE,
    },
    stderr: "inherit",
  });
  const client = new Client({ name: "console-screenshots", version: "1.0.0" });
  await client.connect(transport);
  try {
    await client.listTools();
    await client.callTool({ name: "echo", arguments: { message: "hello" } });
    await client.callTool({ name: "echo", arguments: { message: "again" } });
    await client.callTool({ name: "get-sum", arguments: { a: 1, b: 2 } }).catch(() => undefined);
  } finally {
    await client.close();
  }
}

async function sandboxViews(
  page: Page,
  id: string,
  shoot: (view: Shot["view"]) => Promise<void>,
): Promise<void> {
  await go(page, `#/sandbox/${id}/commands`);
  const command = page.locator("[data-testid=commands] tr[data-command-id]", {
    hasText: "main.py",
  }).first();
  await command.waitFor({ timeout: SHOWN_MS });
  await command.click();
  await page.getByTestId("output").waitFor({ timeout: SHOWN_MS });
  await settle(page);
  await shoot("sandbox_commands");

  await go(page, `#/sandbox/${id}/files`);
  await page.locator(`[data-testid=files] tr[data-name="notes.md"]`).waitFor({
    timeout: SHOWN_MS,
  });
  await settle(page);
  await shoot("sandbox_files");

  await go(page, `#/sandbox/${id}/terminal`);
  await page.getByTestId("terminal-status").filter({ hasText: "connected" }).waitFor({
    timeout: SHOWN_MS,
  });
  await page.getByTestId("terminal").click();
  for (const line of ["ls", "python3 src/main.py", "stty size"]) {
    await page.keyboard.type(line);
    await page.keyboard.press("Enter");
  }
  const until = Date.now() + SHOWN_MS;
  while (!(await terminalRows(page)).some((row) => /^\d+ \d+$/.test(row.trim()))) {
    if (Date.now() > until) throw new Error("The terminal never showed 'stty size'");
    await page.waitForTimeout(100);
  }
  await settle(page);
  await shoot("terminal");

  await go(page, `#/sandbox/${id}/snapshots`);
  await page.getByRole("button", { name: "Take a snapshot" }).click();
  await page.locator("[data-testid=snapshots] tr[data-snapshot-id]").first().waitFor({
    timeout: SHOWN_MS,
  });
  await settle(page);
  await shoot("snapshots");

  await go(page, `#/sandbox/${id}/metrics`);
  await page.getByTestId("cpu-chart").waitFor({ timeout: SHOWN_MS });
  await page.getByTestId("mem-chart").waitFor({ timeout: SHOWN_MS });
  await settle(page, 2500);
  await shoot("metrics");
}

async function go(page: Page, hash: string): Promise<void> {
  await page.evaluate(`location.hash = ${JSON.stringify(hash)}`);
}

// Lets the page's polls and fonts settle before a shot.
async function settle(page: Page, ms = 800): Promise<void> {
  await page.waitForTimeout(ms);
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      json: { type: "boolean", default: false },
      out: { type: "string", default: join(REPO, "docs", "console") },
    },
    strict: true,
  });
  try {
    const shots = await takeScreenshots({ out: values.out! });
    if (values.json) console.log(JSON.stringify({ files: shots }));
    else for (const shot of shots) console.log(`${shot.path} (${shot.bytes} bytes)`);
  } catch (error) {
    console.error(
      `console_screenshots: ${error instanceof Error ? error.stack ?? error.message : error}`,
    );
    Deno.exit(1);
  }
}
