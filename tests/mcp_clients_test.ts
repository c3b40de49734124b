/**
 * The README's MCP client configurations (Claude Desktop, Cursor, Claude
 * Code, the MCP Inspector's CLI mode), read out of README.md and launched as
 * a client launches them: through the MCP SDK's default
 * `StdioClientTransport` with no `env`, so the server gets only the SDK's
 * stripped environment (HOME, LOGNAME, PATH, SHELL, TERM, USER) and no
 * `WAFFLE_HOME`. waffle must find its config in the default place.
 *
 * What stands in for the real thing, and why: the snippets name the
 * installed launcher (`/usr/local/bin/waffle`, which runs
 * `deno run … waffle.js "$@"`); the test runs the checkout's CLI with the
 * snippet's own arguments instead, so it tests this tree. `HOME` is a
 * temporary directory (the test never touches /etc or /root), so the config
 * is found at `~/.config/waffle/waffle.toml` by the same search a root or
 * non-root user gets; its `~/.cache/deno` links to the Deno cache this run
 * already uses, so that Deno loads waffle's modules without the network. The
 * server is server-memory executed on the host (no Docker needed); its graph
 * lives in its host state directory and must survive from one client's
 * session to the next.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { isCached } from "../lib/mcp/package_cache.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const MAIN = `${REPO}/main.ts`;
const CACHE = Deno.env.get("WAFFLE_MCP_CACHE") || `${REPO}/.tools/mcp-cache`;
const MEMORY = "npm:@modelcontextprotocol/server-memory@2026.8.31";
const README = await Deno.readTextFile(`${REPO}/README.md`);
const INSTALL = await Deno.readTextFile(`${REPO}/scripts/install.sh`);
/** Where `scripts/install.sh` puts the launcher by default. */
const INSTALLED = `${/^PREFIX=(\S+)$/m.exec(INSTALL)?.[1]}/bin/waffle`;
/** Every client snippet of the README, by its marker. */
const CLIENTS = ["claude-desktop", "cursor", "claude-code", "claude-code-cli", "inspector-cli"];

// The SDK's StdioClientTransport leaves a timer and its child's pipes to
// settle after close(): the sanitizers would blame this test for them.
const SDK_CLIENT = { sanitizeOps: false, sanitizeResources: false };

/** The fenced block after `<!-- mcp-client: ID -->`. */
function snippet(id: string): { lang: string; text: string } {
  const marker = `<!-- mcp-client: ${id} -->`;
  const at = README.indexOf(marker);
  assert.ok(at >= 0, `README.md has no ${marker}`);
  const block = /```(\w+)\n([\s\S]*?)\n```/.exec(README.slice(at + marker.length));
  assert.ok(block !== null, `no code block after ${marker}`);
  return { lang: block[1]!, text: block[2]! };
}

/** The command and arguments a snippet makes its client start, for server `memory`. */
function commandLine(id: string): { command: string; args: string[] } {
  const { lang, text } = snippet(id);
  if (lang === "json") {
    const entry = JSON.parse(text).mcpServers?.memory;
    assert.ok(entry !== undefined, `${id}: no mcpServers.memory`);
    assert.ok(entry.type === undefined || entry.type === "stdio", `${id}: type ${entry.type}`);
    assert.equal(entry.env, undefined, `${id}: the snippet needs no env`);
    return { command: entry.command, args: entry.args };
  }
  assert.equal(lang, "sh", id);
  // One line, no quoting: what follows the client's own "--" is the server's command line.
  const words = text.trim().split(/\s+/);
  const dashes = words.indexOf("--");
  assert.ok(dashes > 0, `${id}: no '--' before the server's command line`);
  const [command, ...args] = words.slice(dashes + 1);
  return { command: command!, args };
}

Deno.test("README client snippets name the installed launcher and 'mcp run memory --user alice'", () => {
  assert.equal(INSTALLED, "/usr/local/bin/waffle");
  for (const id of CLIENTS) {
    const { command, args } = commandLine(id);
    assert.equal(command, INSTALLED, id);
    assert.deepEqual(args, ["mcp", "run", "memory", "--user", "alice"], id);
  }
  // The Inspector's own options come before its "--", the server's after it.
  assert.match(
    snippet("inspector-cli").text,
    /^npx @modelcontextprotocol\/inspector --cli --method tools\/list -- /,
  );
  assert.match(snippet("claude-code-cli").text, /^claude mcp add --transport stdio memory -- /);
});

Deno.test({
  name: ignoredUnless(
    "README client snippets launch through the SDK's default StdioClientTransport, find ~/.config/waffle/waffle.toml, and server-memory keeps its graph",
    isCached(MEMORY, CACHE),
    `${MEMORY} is not in '${CACHE}' (scripts/setup.sh caches it)`,
  ),
  ignore: !isCached(MEMORY, CACHE),
  ...SDK_CLIENT,
  fn: async () => {
    const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-clients-" }));
    const saved = ["HOME", "WAFFLE_HOME", "WAFFLE_CONFIG"].map((
      name,
    ) => [name, Deno.env.get(name)]);
    try {
      await Deno.mkdir(`${home}/.config/waffle`, { recursive: true });
      await Deno.writeTextFile(
        `${home}/.config/waffle/waffle.toml`,
        `[sandbox]
home = "${home}/state"
mcp_cache = "${CACHE}"

[groups.default]
mode = "host"

[mcp.memory]
package = "${MEMORY}"
execution = "host"
authority = "host"
`,
      );
      await Deno.mkdir(`${home}/.cache`, { recursive: true });
      await Deno.symlink(await denoDir(), `${home}/.cache/deno`);
      // The SDK's default environment is read from this process's. The other
      // two would break every launch if anything but that environment went through.
      Deno.env.set("HOME", home);
      Deno.env.set("WAFFLE_HOME", "/nonexistent/waffle-home");
      Deno.env.set("WAFFLE_CONFIG", "/nonexistent/waffle.toml");
      const seen: string[] = [];
      for (const id of CLIENTS) {
        const { args } = commandLine(id);
        const transport = new StdioClientTransport({
          command: Deno.execPath(),
          args: ["run", "--allow-all", "--quiet", MAIN, ...args],
          stderr: "pipe",
        });
        const stderr: string[] = [];
        transport.stderr?.on(
          "data",
          (chunk: Uint8Array) => stderr.push(new TextDecoder().decode(chunk)),
        );
        const client = new Client({ name: `waffle-test-${id}`, version: "1.0.0" });
        try {
          await client.connect(transport);
          const tools = (await client.listTools()).tools.map((tool) => tool.name);
          assert.ok(
            tools.includes("create_entities") && tools.includes("read_graph"),
            tools.join(),
          );
          await client.callTool({
            name: "create_entities",
            arguments: {
              entities: [{ name: id, entityType: "client", observations: ["launched"] }],
            },
          });
          seen.push(id);
          const graph = await client.callTool({ name: "read_graph", arguments: {} });
          const names = (graph.structuredContent as { entities: { name: string }[] }).entities
            .map((entity) => entity.name);
          assert.deepEqual(
            names.sort(),
            [...seen].sort(),
            "every earlier session's entity is kept",
          );
        } catch (error) {
          throw new Error(
            `${id}: ${error instanceof Error ? error.message : error}\n${stderr.join("")}`,
          );
        } finally {
          await client.close();
        }
      }
      // Where it kept them: its host state directory, private to the host user.
      const state = `${home}/state/mcp-state/memory`;
      assert.equal((await Deno.stat(state)).mode! & 0o777, 0o700);
      const graph = await Deno.readTextFile(`${state}/.local/share/memory.jsonl`);
      for (const id of CLIENTS) assert.match(graph, new RegExp(`"name":"${id}"`));
      // The audit log is in the config's home too, not in a default one.
      const audit = (await Deno.readTextFile(`${home}/state/audit.jsonl`)).trim().split("\n");
      assert.ok(audit.length >= CLIENTS.length * 2, audit.join("\n"));
    } finally {
      for (const [name, value] of saved) {
        if (value === undefined) Deno.env.delete(name!);
        else Deno.env.set(name!, value);
      }
      await Deno.remove(home, { recursive: true });
    }
  },
});

/** The Deno cache this test run uses (`deno info --json`'s `denoDir`). */
async function denoDir(): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json"],
    stdout: "piped",
    stderr: "null",
  }).output();
  return JSON.parse(new TextDecoder().decode(out.stdout)).denoDir;
}

/** A test's name, with why it is ignored when it cannot run. */
function ignoredUnless(name: string, runs: boolean, reason: string): string {
  return runs ? name : `${name} [ignored: ${reason}]`;
}
