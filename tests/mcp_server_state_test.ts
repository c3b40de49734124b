/**
 * Every MCP server's own writable state (`lib/mcp/server_state.ts`): where
 * it lives for each place a server executes, the variables that name it,
 * how a container makes it (the Deno preload, the `sh` step), and a real
 * host server that gets it (0700 under the waffle home), its `cwd`, the
 * config's literal and renamed variables, and a warning on stderr for a host
 * variable that is not set. The sandbox side runs live in
 * `tests/mcp_docker_test.ts`.
 */
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { fileURLToPath } from "node:url";
import {
  prepareHostState,
  serverState,
  stateDirectories,
  statePreload,
  withStateDirectories,
} from "../lib/mcp/server_state.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const MAIN = `${REPO}/main.ts`;
const FILES_SERVER = `${REPO}/tests/fixtures/files_server.js`;

// The SDK's StdioClientTransport leaves a timer and its child's pipes to
// settle after close(): the sanitizers would blame this test for them.
const SDK_CLIENT = { sanitizeOps: false, sanitizeResources: false };

Deno.test("serverState() puts HOME and the XDG directories under one root per place a server executes", () => {
  assert.deepEqual(serverState({ name: "notes", where: "sandbox" }), {
    root: "/workspace/.waffle/mcp/notes",
    env: {
      HOME: "/workspace/.waffle/mcp/notes",
      XDG_CONFIG_HOME: "/workspace/.waffle/mcp/notes/.config",
      XDG_DATA_HOME: "/workspace/.waffle/mcp/notes/.local/share",
      XDG_STATE_HOME: "/workspace/.waffle/mcp/notes/.local/state",
      XDG_CACHE_HOME: "/workspace/.waffle/mcp/notes/.cache",
      TMPDIR: "/workspace/.waffle/mcp/notes/tmp",
    },
  });
  assert.equal(
    serverState({ name: "jail", where: "restricted" }).env.HOME,
    "/home/sandbox/.waffle/mcp/jail",
  );
  assert.equal(
    serverState({ name: "local", where: "host" }, { home: "/var/lib/waffle" }).env.TMPDIR,
    "/var/lib/waffle/mcp-state/local/tmp",
  );
  // server-memory's graph goes to its data directory; other packages get no such setting.
  assert.equal(
    serverState({
      name: "m",
      where: "sandbox",
      package: "npm:@modelcontextprotocol/server-memory@2026.8.31",
    }).env.MEMORY_FILE_PATH,
    "/workspace/.waffle/mcp/m/.local/share/memory.jsonl",
  );
  assert.equal(
    serverState({
      name: "m",
      where: "sandbox",
      package: "npm:@modelcontextprotocol/server-everything@2026.8.31",
    }).env.MEMORY_FILE_PATH,
    undefined,
  );
  assert.deepEqual(stateDirectories(serverState({ name: "n", where: "sandbox" })), [
    "/workspace/.waffle/mcp/n",
    "/workspace/.waffle/mcp/n/.config",
    "/workspace/.waffle/mcp/n/.local/share",
    "/workspace/.waffle/mcp/n/.local/state",
    "/workspace/.waffle/mcp/n/.cache",
    "/workspace/.waffle/mcp/n/tmp",
  ]);
});

Deno.test("statePreload() is a data: module that makes the directories; withStateDirectories() makes them with sh, then execs", async () => {
  const root = await Deno.makeTempDir({ prefix: "waffle-state-" });
  try {
    const state = {
      root: `${root}/it's`,
      env: { HOME: `${root}/it's`, TMPDIR: `${root}/it's/tmp` },
    };
    // The preload, run by Deno as a server's package launch would.
    const preload = statePreload(state);
    assert.match(preload, /^data:text\/javascript,/);
    const ran = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--allow-all", "--no-config", "--quiet", `--preload=${preload}`, "data:,"],
      stdout: "null",
      stderr: "piped",
    }).output();
    assert.equal(ran.code, 0, new TextDecoder().decode(ran.stderr));
    assert.ok((await Deno.stat(`${root}/it's/tmp`)).isDirectory);
    // The sh step, for a command server: a quote in a path stays a quote.
    const argv = withStateDirectories(["/bin/sh", "-c", 'pwd; echo "$1"', "zero", "one"], {
      root: `${root}/cmd's`,
      env: { HOME: `${root}/cmd's`, XDG_CACHE_HOME: `${root}/cmd's/.cache` },
    });
    const out = await new Deno.Command(argv[0]!, { args: argv.slice(1), cwd: root }).output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    assert.equal(new TextDecoder().decode(out.stdout), `${root}\none\n`, "the program's own argv");
    assert.ok((await Deno.stat(`${root}/cmd's/.cache`)).isDirectory);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("prepareHostState() makes the directories 0700, narrows an existing root, and refuses a relative one", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-state-" });
  try {
    const state = serverState({ name: "local", where: "host" }, { home });
    await Deno.mkdir(state.root, { recursive: true, mode: 0o755 });
    await Deno.chmod(state.root, 0o755);
    prepareHostState(state);
    for (const dir of [`${home}/mcp-state`, ...stateDirectories(state)]) {
      assert.equal((await Deno.stat(dir)).mode! & 0o777, 0o700, dir);
    }
    assert.throws(
      () => prepareHostState(serverState({ name: "x", where: "host" })),
      /State directory '\$WAFFLE_HOME\/mcp-state\/x' is not an absolute path/,
    );
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

/** Starts `waffle mcp run NAME` with the SDK's client; `env` is the whole environment it gets. */
async function connect(
  name: string,
  env: Record<string, string>,
): Promise<{ client: Client; stderr: string[] }> {
  const transport = new StdioClientTransport({
    command: Deno.execPath(),
    args: ["run", "--allow-all", "--quiet", MAIN, "mcp", "run", name],
    env,
    stderr: "pipe",
  });
  const stderr: string[] = [];
  transport.stderr?.on("data", (chunk: Uint8Array) => stderr.push(new TextDecoder().decode(chunk)));
  const client = new Client({ name: "waffle-test", version: "1.0.0" });
  await client.connect(transport);
  return { client, stderr };
}

function textOf(result: unknown): string {
  const content = (result as { content?: { text?: string }[] }).content ?? [];
  return content.map((part) => part.text ?? "").join("");
}

Deno.test({
  name:
    "a host server gets its state under <home>/mcp-state (0700), its cwd, literal and renamed env, and a warning for an unset variable",
  ...SDK_CLIENT,
  fn: async () => {
    const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-state-" }));
    try {
      const server = (name: string, extra: string): string => `
[mcp.${name}]
command = ${JSON.stringify(Deno.execPath())}
args = ["run", "--allow-all", "--no-config", "--quiet", ${JSON.stringify(FILES_SERVER)}]
execution = "host"
authority = "host"
${extra}`;
      await Deno.writeTextFile(
        `${home}/waffle.toml`,
        `[sandbox]\nmode = "host"\n` +
          server(
            "local",
            `cwd = "work/dir"\nenv = { FIXED = "from the config", RENAMED = { host = "GREETING" }, TOKEN = { host = "WAFFLE_STATE_UNSET" } }\n`,
          ) +
          server("elsewhere", `cwd = "${home}/missing"\n`),
      );
      const env = {
        PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
        HOME: Deno.env.get("HOME") ?? "/root",
        WAFFLE_HOME: home,
        GREETING: "hello from the host",
      };
      const { client, stderr } = await connect("local", env);
      const root = `${home}/mcp-state/local`;
      try {
        const seen = JSON.parse(textOf(await client.callTool({ name: "env", arguments: {} })));
        assert.equal(seen.HOME, root);
        assert.equal(seen.XDG_DATA_HOME, `${root}/.local/share`);
        assert.equal(seen.TMPDIR, `${root}/tmp`);
        assert.equal(seen.CWD, `${root}/work/dir`);
        assert.equal(seen.FIXED, "from the config");
        assert.equal(seen.RENAMED, "hello from the host");
        assert.equal(seen.GREETING, undefined);
        assert.equal(seen.TOKEN, undefined);
        assert.equal(seen.WAFFLE_HOME, undefined);
        const wrote = await client.callTool({
          name: "write_file",
          arguments: { path: `${seen.XDG_STATE_HOME}/kept`, content: "x" },
        });
        assert.equal(textOf(wrote), "written");
      } finally {
        await client.close();
      }
      assert.equal((await Deno.stat(root)).mode! & 0o777, 0o700);
      assert.equal((await Deno.stat(`${home}/mcp-state`)).mode! & 0o777, 0o700);
      assert.match(
        stderr.join(""),
        /waffle: warning: server 'local': host variable 'WAFFLE_STATE_UNSET' \(for 'TOKEN'\) is not set \(mcp\.local\.env\); the server starts without it\n/,
      );
      // An absolute cwd on the host is the operator's: waffle does not create it.
      const refused = await new Deno.Command(Deno.execPath(), {
        args: ["run", "--allow-all", "--quiet", MAIN, "mcp", "run", "elsewhere"],
        env,
        clearEnv: true,
        stdin: "null",
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(refused.code, 125);
      assert.equal(
        new TextDecoder().decode(refused.stderr),
        `waffle: Working directory '${home}/missing' of server 'elsewhere' does not exist (mcp.elsewhere.cwd)\n`,
      );
      assert.ok(!(await exists(`${home}/missing`)));
    } finally {
      await Deno.remove(home, { recursive: true });
    }
  },
});

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}
