/**
 * A differential test of `waffle mcp run`: one client script
 * (tests/_mcp_script.ts, the official SDK client over stdio) runs against
 * `@modelcontextprotocol/server-everything` twice, once started directly on
 * the host by waffle's Deno from the package cache (as the benchmark's
 * `mcp_call_direct` does) and once through `waffle mcp run` into a real
 * sandbox, with a policy that allows every tool and every request the
 * server makes of the client. The two transcripts must be equal, feature by
 * feature: whatever the relay changes, drops or cannot carry shows as the
 * step of that feature failing.
 *
 * The direct run is checked on its own first (it needs no Docker), so a
 * difference is waffle's, not the script's.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { liveTest } from "./_docker_gate.ts";
import {
  FEATURES,
  LARGE_RESULT_TEXT,
  normalize,
  runScript,
  type ScriptRun,
  type ServerCommand,
} from "./_mcp_script.ts";
import { tempHome, TEST_IMAGE, uniqueUser } from "./_sandbox_helpers.ts";
import { fetchPackage, isCached, packageLaunch } from "../lib/mcp/package_cache.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const MAIN = `${REPO}/main.ts`;
const CACHE = Deno.env.get("WAFFLE_MCP_CACHE") || `${REPO}/.tools/mcp-cache`;
const EVERYTHING = "npm:@modelcontextprotocol/server-everything@2026.8.31";

/** Every tool allowed, and every request server-everything makes of a client. */
const CONFIG = `[sandbox]
image = "${TEST_IMAGE}"
mcp_cache = "${CACHE}"

[mcp.everything]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "sandbox"
authority = "sandbox"
client_requests = ["sampling/createMessage", "elicitation/create", "roots/list", "ping"]
`;

// The SDK's StdioClientTransport leaves a timer and its child's pipes to
// settle after close(): the sanitizers would blame this test for them.
const SDK_CLIENT = { sanitizeOps: false, sanitizeResources: false };

function baseEnv(): Record<string, string> {
  const dockerHost = Deno.env.get("DOCKER_HOST");
  return {
    PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
    HOME: Deno.env.get("HOME") ?? "/",
    NO_COLOR: "1",
    DENO_NO_UPDATE_CHECK: "1",
    ...(dockerHost === undefined ? {} : { DOCKER_HOST: dockerHost }),
  };
}

/** The server on the host, as `mcp_call_direct` runs it: waffle's Deno, the package cache, offline. */
const DIRECT: ServerCommand = (() => {
  const launch = packageLaunch(EVERYTHING, ["stdio"], { deno: [Deno.execPath()], cacheDir: CACHE });
  return {
    command: launch.argv[0]!,
    args: launch.argv.slice(1),
    env: { ...baseEnv(), ...launch.env },
  };
})();

function throughWaffle(home: string, user: string): ServerCommand {
  return {
    command: Deno.execPath(),
    args: ["run", "--allow-all", "--quiet", MAIN, "mcp", "run", "everything", "--user", user],
    env: { ...baseEnv(), WAFFLE_HOME: home, WAFFLE_MCP_CACHE: CACHE },
  };
}

let directRun: Promise<ScriptRun> | undefined;
/**
 * The direct run, once per test module (both tests use it). scripts/setup.sh
 * fills the package cache; without the package there it is fetched first
 * (network).
 */
function direct(): Promise<ScriptRun> {
  directRun ??= (async () => {
    if (!isCached(EVERYTHING, CACHE)) await fetchPackage(EVERYTHING, { cacheDir: CACHE });
    return await runScript(DIRECT);
  })();
  return directRun;
}

/** One line: how long each feature took (printed, never compared). */
function timings(run: ScriptRun): string {
  return FEATURES.map((feature) => `${feature} ${run.elapsedMs[feature]}`).join(", ");
}

function toolNames(run: ScriptRun): string[] {
  const listing = run.transcript.listing as { tools?: { name: string }[] };
  return (listing.tools ?? []).map((tool) => tool.name);
}

function errorOf(entry: unknown): string | undefined {
  const error = (entry as { error?: unknown } | undefined)?.error;
  return typeof error === "string" ? error : undefined;
}

Deno.test({
  name: "mcp differential: the script passes against server-everything run directly",
  ...SDK_CLIENT,
  async fn(t): Promise<void> {
    const run = await direct();
    const { transcript } = run;
    const listing = transcript.listing as {
      resources?: { uri: string }[];
      resourceTemplates?: { uriTemplate: string }[];
      prompts?: { name: string }[];
    };
    // deno-lint-ignore no-console -- which features the script covered, in the test's output
    console.error(
      `server-everything: tools ${toolNames(run).join(", ")}; ` +
        `resources ${(listing.resources ?? []).map((r) => r.uri).join(", ")}; ` +
        `templates ${(listing.resourceTemplates ?? []).map((r) => r.uriTemplate).join(", ")}; ` +
        `prompts ${(listing.prompts ?? []).map((p) => p.name).join(", ")}\n` +
        `direct, ms per feature: ${timings(run)}`,
    );
    for (const feature of FEATURES) {
      await t.step(feature, () => {
        const error = errorOf(transcript[feature]);
        assert.equal(error, undefined, `${feature}: ${error}\n${run.stderr}`);
      });
    }
    await t.step("every listed tool is called", () => {
      const listed = toolNames(run);
      // 19 in this version, the 7 that depend on the client's capabilities included.
      assert.equal(listed.length, 19, listed.join(", "));
      assert.deepEqual(listed.filter((name) => !run.called.includes(name)), []);
    });
    await t.step("what the server answered is what it was asked", () => {
      const large = transcript.large_result as { length: number; sha256: string };
      assert.deepEqual(
        { sha256: large.sha256, length: large.length },
        normalize(LARGE_RESULT_TEXT),
        "the 10 MiB result is not the message echoed",
      );
      const sampling = JSON.stringify(transcript.sampling);
      assert.match(sampling, /42, says the fixed reply/);
      assert.match(JSON.stringify(transcript.elicitation), /Ada Lovelace/);
      assert.match(JSON.stringify(transcript.roots), /file:\/\/\/work\/differential\/second/);
      const progress = transcript.progress as { progress: { progress: number }[] };
      assert.deepEqual(progress.progress.map((p) => p.progress), [1, 2, 3, 4]);
      const cancellation = transcript.cancellation as Record<string, unknown>;
      assert.equal(cancellation.answeredAfterCancel, false, "the server answered a cancelled call");
      assert.match(JSON.stringify(cancellation.cancelled), /differential: the client cancelled/);
      assert.match(JSON.stringify(transcript.tasks), /"status":"completed"/);
    });
  },
});

liveTest(
  "mcp differential: server-everything through `waffle mcp run` answers the script as directly",
  async (docker, t) => {
    const expected = await direct();
    await using home = await tempHome(docker);
    await Deno.writeTextFile(`${home.home}/waffle.toml`, CONFIG);
    const actual = await runScript(throughWaffle(home.home, uniqueUser("differential")));
    // deno-lint-ignore no-console -- where the time went, in the test's output
    console.error(`through waffle, ms per feature: ${timings(actual)}`);
    let failed = false;
    for (const feature of FEATURES) {
      const passed = await t.step(feature, () => {
        assert.deepEqual(actual.transcript[feature], expected.transcript[feature]);
      });
      failed ||= !passed;
    }
    await t.step("the same tools are called", () => {
      assert.deepEqual(actual.called, expected.called);
    });
    await t.step("the server ran in the user's sandbox", async () => {
      assert.equal((await home.containers()).length, 1);
    });
    if (failed) {
      // deno-lint-ignore no-console -- what waffle said, for the failing steps above
      console.error(`waffle mcp run stderr (tail):\n${actual.stderr}`);
    }
  },
  SDK_CLIENT,
);
