/**
 * MCP servers in the sandbox, live: the official SDK client talks to
 * `waffle mcp run` (a real process), which relays to a server running in a
 * real container through the queue. Nothing is mocked.
 */
import { INITIALIZE_REQUEST } from "./_mcp_client.ts";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { liveTest } from "./_docker_gate.ts";
import { run, runOk, tempHome, type TestHome, uniqueUser } from "./_sandbox_helpers.ts";
import { delay } from "./_helpers.ts";
import { SANDBOX_UID } from "../lib/lifecycle/posture.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const MAIN = `${REPO}/main.ts`;
const CACHE = Deno.env.get("WAFFLE_MCP_CACHE") || `${REPO}/.tools/mcp-cache`;
const EVERYTHING = "npm:@modelcontextprotocol/server-everything@2026.8.31";
const MEMORY = "npm:@modelcontextprotocol/server-memory@2026.8.31";
const FILESYSTEM = "npm:@modelcontextprotocol/server-filesystem@2026.8.31";
const FILES_SERVER = await Deno.readTextFile(
  new URL("./fixtures/files_server.js", import.meta.url),
);

const CONFIG = `
[sandbox]
image = "${Deno.env.get("WAFFLE_IMAGE") || "waffle-runner:latest"}"
mcp_cache = "${CACHE}"

[mcp.everything]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "sandbox"
authority = "sandbox"
groups = ["main"]
env = ["GREETING"]
tools = ["echo", "get-env"]

[mcp.files]
command = "/opt/waffle/deno"
args = ["run", "--allow-all", "--no-config", "--quiet", "/workspace/files_server.js"]
execution = "sandbox"
authority = "sandbox"

[mcp.memory]
package = "${MEMORY}"
execution = "sandbox"
authority = "sandbox"

[mcp.filesystem]
package = "${FILESYSTEM}"
args = ["/workspace"]
execution = "sandbox"
authority = "sandbox"

[mcp.kept]
command = "/opt/waffle/deno"
args = ["run", "--allow-all", "--no-config", "--quiet", "/workspace/files_server.js"]
execution = "sandbox"
authority = "sandbox"
cwd = "/workspace/data/./kept/"
env = { FIXED = "from the config", RENAMED = { host = "GREETING" } }

[mcp.locked]
command = "/opt/waffle/deno"
args = ["run", "--allow-all", "--no-config", "--quiet", "/workspace/files_server.js"]
execution = "sandbox"
authority = "restricted"
env = ["GREETING"]

[mcp.local]
command = "/bin/cat"
execution = "host"
authority = "host"

[groups.main]
mode = "docker"

[cron.nightly]
group = "main"
mcp = ["everything", "local"]
network = "none"
workdir = "jobs/nightly"
env = ["GREETING"]
`;

// The SDK's StdioClientTransport leaves a timer and its child's pipes to
// settle after close(): the sanitizers would blame this test for them.
const SDK_CLIENT = { sanitizeOps: false, sanitizeResources: false };

/** The environment `waffle mcp run` gets: a host secret that must not reach any server. */
function clientEnv(home: string): Record<string, string> {
  return {
    PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
    HOME: home,
    WAFFLE_HOME: home,
    WAFFLE_MCP_CACHE: CACHE,
    GREETING: "hello from the host",
    SECRET_TOKEN: "must-not-leak",
    NO_COLOR: "1",
  };
}

async function withHome(docker: Parameters<typeof tempHome>[0]): Promise<TestHome> {
  const home = await tempHome(docker);
  await Deno.writeTextFile(`${home.home}/waffle.toml`, CONFIG);
  return home;
}

async function connect(
  home: TestHome,
  server: string,
  flags: string[],
): Promise<{ client: Client; transport: StdioClientTransport; stderr: string[] }> {
  const transport = new StdioClientTransport({
    command: Deno.execPath(),
    args: ["run", "--allow-all", "--quiet", MAIN, "mcp", "run", server, ...flags],
    env: clientEnv(home.home),
    stderr: "pipe",
  });
  const stderr: string[] = [];
  transport.stderr?.on("data", (chunk: Uint8Array) => stderr.push(new TextDecoder().decode(chunk)));
  const client = new Client({ name: "waffle-test", version: "1.0.0" });
  await client.connect(transport);
  return { client, transport, stderr };
}

/** Starts `waffle mcp run SERVER --user U` as a raw stdio client and waits for its `initialize` answer. */
async function startInitialized(
  home: TestHome,
  server: string,
  user: string,
): Promise<Deno.ChildProcess> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", "--quiet", MAIN, "mcp", "run", server, "--user", user],
    env: clientEnv(home.home),
    clearEnv: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(
    JSON.stringify(INITIALIZE_REQUEST) + "\n",
  ));
  writer.releaseLock();
  const reader = child.stdout.getReader();
  assert.match(new TextDecoder().decode((await reader.read()).value), /"serverInfo"/);
  reader.releaseLock();
  return child;
}

/** Kills a raw client and releases its pipes. */
async function killClient(child: Deno.ChildProcess): Promise<void> {
  child.kill("SIGKILL");
  await child.status;
  await child.stdin.close().catch(() => {});
  await child.stdout.cancel().catch(() => {});
}

function textOf(result: unknown): string {
  const content = (result as { content?: { type: string; text?: string }[] }).content ?? [];
  return content.map((part) => part.text ?? "").join("");
}

async function putServer(home: TestHome, user: string): Promise<void> {
  const ran = await run(home.open(user), {
    argv: ["sh", "-c", "cat > /workspace/files_server.js"],
    stdin: new TextEncoder().encode(FILES_SERVER),
  });
  assert.equal(ran.result.exitCode, 0, ran.stderr);
}

liveTest(
  "mcp run: server-everything in the sandbox, env allowlist, tools allowlist, audit",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("mcp");
    const { client, stderr } = await connect(home, "everything", [
      "--user",
      user,
      "--group",
      "main",
    ]);
    try {
      const listed = await client.listTools();
      assert.deepEqual(listed.tools.map((tool) => tool.name).sort(), ["echo", "get-env"]);
      const echoed = await client.callTool({ name: "echo", arguments: { message: "hi there" } });
      assert.match(textOf(echoed), /hi there/);
      const env = textOf(await client.callTool({ name: "get-env", arguments: {} }));
      assert.match(env, /hello from the host/, "the allowlisted GREETING is inside");
      assert.doesNotMatch(
        env,
        /must-not-leak|SECRET_TOKEN/,
        "a host variable outside the allowlist is absent",
      );
      assert.doesNotMatch(env, /WAFFLE_HOME/);
      // A tool the policy leaves out is neither listed nor callable.
      await assert.rejects(
        client.callTool({ name: "get-sum", arguments: { a: 1, b: 2 } }),
        /not allowed/,
      );
      // It ran in the container: the server's process lives there, not on the host.
      const containers = await home.containers();
      assert.equal(containers.length, 1);
      const inside = await run(
        home.open(user),
        "grep -l [s]erver-everything /proc/[0-9]*/cmdline | wc -l",
      );
      assert.ok(
        Number(inside.stdout.trim()) >= 1,
        `no server process in the container: ${stderr.join("")}`,
      );
    } finally {
      await client.close();
    }
    const audit = (await Deno.readTextFile(`${home.home}/audit.jsonl`)).trim().split("\n").map((
      line,
    ) => JSON.parse(line));
    const calls = audit.map((entry) => `${entry.tool}:${entry.outcome}`);
    assert.ok(calls.includes("echo:ok"), calls.join(","));
    assert.ok(calls.includes("get-sum:denied"), calls.join(","));
    const echo = audit.find((entry) => entry.tool === "echo");
    assert.deepEqual(echo.arguments, ["message"]);
    assert.equal(echo.user, user);
    assert.equal(echo.server, "everything");
    assert.doesNotMatch(JSON.stringify(audit), /hi there/, "argument values are never logged");
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: files persist for the user's next session and are absent for another user",
  async (docker) => {
    await using home = await withHome(docker);
    const alice = uniqueUser("alice");
    const bob = uniqueUser("bob");
    await putServer(home, alice);
    await putServer(home, bob);
    const first = await connect(home, "files", ["--user", alice]);
    const wrote = await first.client.callTool({
      name: "write_file",
      arguments: { path: "/workspace/notes.txt", content: "kept" },
    });
    assert.equal(textOf(wrote), "written");
    await first.client.close();

    const second = await connect(home, "files", ["--user", alice]);
    assert.equal(
      textOf(
        await second.client.callTool({
          name: "read_file",
          arguments: { path: "/workspace/notes.txt" },
        }),
      ),
      "kept",
    );
    await second.client.close();

    const other = await connect(home, "files", ["--user", bob]);
    const read = await other.client.callTool({
      name: "read_file",
      arguments: { path: "/workspace/notes.txt" },
    });
    assert.equal(read.isError, true);
    assert.match(textOf(read), /NotFound|No such file/);
    await other.client.close();
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: a restricted server cannot write the workspace or reach a network",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("restricted");
    await putServer(home, user);
    await runOk(home.open(user), "echo visible > /workspace/seen.txt");
    const { client } = await connect(home, "locked", ["--user", user]);
    try {
      const wrote = await client.callTool({
        name: "write_file",
        arguments: { path: "/workspace/forbidden.txt", content: "x" },
      });
      assert.equal(wrote.isError, true, textOf(wrote));
      assert.match(textOf(wrote), /Read-only file system|read-only/i);
      assert.equal(
        textOf(
          await client.callTool({ name: "read_file", arguments: { path: "/workspace/seen.txt" } }),
        ),
        "visible\n",
      );
      assert.deepEqual(
        JSON.parse(textOf(await client.callTool({ name: "interfaces", arguments: {} }))),
        ["lo"],
      );
      const env = JSON.parse(textOf(await client.callTool({ name: "env", arguments: {} })));
      // Its state lives in the session's tmpfs home: writable, although the workspace is not.
      assert.equal(env.HOME, "/home/sandbox/.waffle/mcp/locked");
      assert.equal(env.XDG_STATE_HOME, "/home/sandbox/.waffle/mcp/locked/.local/state");
      assert.equal(env.TMPDIR, "/home/sandbox/.waffle/mcp/locked/tmp");
      assert.equal(env.GREETING, "hello from the host");
      assert.equal(env.SECRET_TOKEN, undefined);
      for (const dir of [env.XDG_STATE_HOME, env.TMPDIR, "/home/sandbox"]) {
        const wrote_ = await client.callTool({
          name: "write_file",
          arguments: { path: `${dir}/scratch`, content: "ok" },
        });
        assert.equal(textOf(wrote_), "written", dir);
      }
      // A separate container, not the user's sandbox; its queue on the user's
      // quota volume (not the host's disk); none of the commands' env in it.
      const restricted = (await home.containers()).find((c) => /-r-/.test(c.Names[0] ?? ""));
      assert.ok(restricted !== undefined);
      const inspected = (await docker.inspectContainer(restricted.Id))!;
      const outbound = inspected.HostConfig.Mounts.find((m) => m.Target === "/queue/outbound");
      assert.match(outbound?.Source ?? "", /\/volume\/restricted\/[0-9a-f-]{12}\/outbound$/);
      assert.ok(inspected.Config.Env.includes("WAFFLE_PASS_ENV="), inspected.Config.Env.join(" "));
    } finally {
      await client.close();
    }
    const left = (await home.containers()).filter((c) => /-r-/.test(c.Names[0] ?? ""));
    assert.equal(left.length, 0, "the restricted container is removed with its session");
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: a SIGKILLed client leaves no server process in the container within the lease",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("kill");
    await putServer(home, user);
    const child = await startInitialized(home, "files", user);
    const count = async (): Promise<number> =>
      Number(
        (await run(home.open(user), "grep -l [f]iles_server /proc/[0-9]*/cmdline | wc -l")).stdout
          .trim(),
      );
    assert.ok(await count() >= 1);
    await killClient(child);
    const killed = Date.now();
    while ((await count()) > 0) {
      assert.ok(Date.now() - killed < 15_000, "the server outlived its lease");
      await delay(500);
    }
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: a session and a stream of waffle exec calls run side by side",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("side");
    const { client } = await connect(home, "everything", ["--user", user, "--group", "main"]);
    try {
      const execs = (async () => {
        const times: number[] = [];
        for (let i = 0; i < 5; i++) {
          const ran = await home.cli(["exec", "--user", user, "--", "echo", `exec ${i}`], {
            WAFFLE_MCP_CACHE: CACHE,
          });
          assert.equal(ran.code, 0, ran.stderr);
          assert.equal(ran.stdout, `exec ${i}\n`);
          times.push(Date.now());
        }
        return times;
      })();
      let calls = 0;
      const deadline = Date.now() + 60_000;
      let done = false;
      execs.finally(() => (done = true));
      while (!done && Date.now() < deadline) {
        const echoed = await client.callTool({
          name: "echo",
          arguments: { message: `call ${calls}` },
        });
        assert.match(textOf(echoed), new RegExp(`call ${calls}`));
        calls++;
      }
      await execs;
      assert.ok(calls >= 5, `only ${calls} calls while the execs ran`);
    } finally {
      await client.close();
    }
  },
  SDK_CLIENT,
);

liveTest(
  "mcp cron: the nightly job's plan filters a denied server, and its server initializes in the container",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("cron");
    const planned = await home.cli(["mcp", "plan", "--cron", "nightly", "--json"], {
      WAFFLE_MCP_CACHE: CACHE,
    });
    assert.equal(planned.code, 0, planned.stderr);
    const plan = JSON.parse(planned.stdout);
    const byName = Object.fromEntries(plan.servers.map((s: { name: string }) => [s.name, s]));
    assert.equal(byName.local.decision, "denied");
    assert.equal(byName.everything.decision, "launch");
    assert.equal(byName.everything.where, "sandbox");
    assert.equal(byName.everything.cwd, "/workspace/jobs/nightly");
    assert.equal(byName.everything.network, "none");
    assert.deepEqual(byName.everything.env, ["GREETING"]);
    assert.equal(byName.files?.decision ?? "denied", "denied");

    // The denied server is refused before anything starts.
    const refused = await home.cli(["mcp", "run", "local", "--cron", "nightly", "--user", user], {
      WAFFLE_MCP_CACHE: CACHE,
    });
    assert.equal(refused.code, 125);
    assert.match(refused.stderr, /local/);
    assert.equal((await home.containers()).length, 0, "nothing was started for a denied server");

    const { client } = await connect(home, "everything", ["--user", user, "--cron", "nightly"]);
    try {
      const listed = await client.listTools();
      assert.deepEqual(listed.tools.map((tool) => tool.name).sort(), ["echo", "get-env"]);
      const env = textOf(await client.callTool({ name: "get-env", arguments: {} }));
      assert.match(env, /hello from the host/);
    } finally {
      await client.close();
    }
    await runOk(home.open(user), "test -d /workspace/jobs/nightly");
  },
  SDK_CLIENT,
);

liveTest(
  "doctor: one authority row per server, and an initialize + tools/list probe of each sandboxed one",
  async (docker) => {
    await using home = await tempHome(docker);
    await Deno.writeTextFile(
      `${home.home}/waffle.toml`,
      `
[sandbox]
image = "${Deno.env.get("WAFFLE_IMAGE") || "waffle-runner:latest"}"
mcp_cache = "${CACHE}"

[mcp.on-host]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "host"
authority = "host"
env = ["GREETING"]

[mcp.in-sandbox]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "sandbox"
authority = "sandbox"
groups = ["main"]
tools = ["echo", "ehco"]

[mcp.restricted]
package = "${EVERYTHING}"
args = ["stdio"]
execution = "sandbox"
authority = "restricted"

[groups.main]
mode = "docker"
`,
    );
    const doctor = await home.cli(["doctor", "--json"]);
    const report = JSON.parse(doctor.stdout) as {
      checks: { name: string; ok: boolean; warning: boolean; detail: string }[];
    };
    const rows = Object.fromEntries(report.checks.map((check) => [check.name, check]));
    assert.equal(
      rows["mcp on-host authority"]?.detail,
      "execution=host authority=host groups=all env=GREETING tools=all",
    );
    assert.equal(
      rows["mcp in-sandbox authority"]?.detail,
      "execution=sandbox authority=sandbox groups=main env=none tools=echo,ehco",
    );
    // The config read, and a host variable the env names that is not set here.
    assert.equal(rows["mcp config"]?.detail, `'${home.home}/waffle.toml'`);
    assert.equal(rows["mcp on-host env"]?.warning, true);
    assert.equal(
      rows["mcp on-host env"]?.detail,
      "server 'on-host': host variable 'GREETING' is not set (mcp.on-host.env); the server starts without it",
    );
    assert.match(rows["mcp restricted authority"]?.detail ?? "", /authority=restricted/);
    // Host servers are not probed; both sandboxed ones are, for real.
    assert.equal(rows["mcp on-host probe"], undefined);
    for (const name of ["in-sandbox", "restricted"]) {
      const probe = rows[`mcp ${name} probe`];
      assert.equal(probe?.ok, true, JSON.stringify(probe));
      assert.match(probe?.detail ?? "", /\d+ tools \((\d+|all) allowed\), initialize \d+ ms/);
    }
    assert.match(rows["mcp restricted probe"]!.detail, /^restricted: \d+ tools \(all allowed\)/);
    assert.equal(rows["mcp restricted probe"]!.warning, false);
    // A misspelt tool in the allowlist: the probe says so, as a warning.
    assert.match(rows["mcp in-sandbox probe"]!.detail, /^sandbox: \d+ tools \(1 allowed\)/);
    assert.equal(rows["mcp in-sandbox probe"]!.warning, true);
    assert.match(
      rows["mcp in-sandbox probe"]!.detail,
      /; server 'in-sandbox' does not offer 'ehco', which mcp\.in-sandbox\.tools allows \(misspelt, or removed\?\)$/,
    );
    assert.equal(doctor.code, 0, doctor.stdout);
    // mcp plan --probe finds the same, as a field of --json.
    const probed = await home.cli(["mcp", "plan", "--group", "main", "--probe", "--json"]);
    assert.equal(probed.code, 0, probed.stderr);
    const plan = JSON.parse(probed.stdout) as {
      warnings: { server: string; kind: string; tools?: string[] }[];
      probes: { server: string; tools: string[] }[];
    };
    assert.deepEqual(
      plan.warnings.filter((w) => w.kind !== "env-unset").map(({ server, kind, tools }) => ({
        server,
        kind,
        tools,
      })),
      [{ server: "in-sandbox", kind: "tool-not-offered", tools: ["ehco"] }],
    );
    assert.deepEqual(plan.probes.map((p) => p.server), ["in-sandbox", "restricted"]);
    assert.ok(plan.probes[0]!.tools.includes("echo"));
    assert.equal((await home.containers()).length, 0, "the probes' throwaway sandboxes are gone");
  },
);

liveTest(
  "mcp run: a restricted container whose host died is removed by the user's next restricted session",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("orphan");
    await putServer(home, user);
    const restricted = async (): Promise<string[]> =>
      (await home.containers()).filter((c) => /-r-/.test(c.Names[0] ?? "")).map((c) => c.Id);
    const first = await startInitialized(home, "locked", user);
    const [orphan] = await restricted();
    assert.ok(orphan !== undefined);
    // The host dies without a word: its container outlives it (a hostile
    // runner could keep it up for good).
    await killClient(first);
    assert.ok((await restricted()).includes(orphan));
    const second = await startInitialized(home, "locked", user);
    const now = await restricted();
    assert.ok(!now.includes(orphan), "the dead host's restricted container was removed");
    assert.equal(now.length, 1);
    await second.stdin.close();
    await second.status;
    await second.stdout.cancel().catch(() => {});
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: server-filesystem reads a 3,000,000-byte file (a 6 MB answer) and the session goes on",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("fsread");
    await runOk(home.open(user), "head -c 3000000 /dev/zero | tr '\\0' a > /workspace/big.txt");
    const session = await connect(home, "filesystem", ["--user", user]);
    try {
      const read = await session.client.callTool({
        name: "read_text_file",
        arguments: { path: "/workspace/big.txt" },
      });
      // The text comes twice (content and structuredContent): ~6 MB in one message.
      assert.equal(textOf(read), "a".repeat(3_000_000), session.stderr.join(""));
      assert.ok(JSON.stringify(read).length > 6_000_000);
      const next = await session.client.callTool({
        name: "list_allowed_directories",
        arguments: {},
      });
      assert.match(textOf(next), /\/workspace/);
    } finally {
      await session.client.close();
    }
    const outcomes = (await Deno.readTextFile(`${home.home}/audit.jsonl`)).trim().split("\n")
      .map((line) => JSON.parse(line)).filter((line) => line.server === "filesystem")
      .map((line) => [line.tool, line.outcome]);
    assert.deepEqual(outcomes, [["read_text_file", "ok"], ["list_allowed_directories", "ok"]]);
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: server-memory saves its graph in the user's workspace and finds it in the next session, with no setting",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("memory");
    const first = await connect(home, "memory", ["--user", user]);
    try {
      const made = await first.client.callTool({
        name: "create_entities",
        arguments: {
          entities: [{ name: "waffle", entityType: "project", observations: ["saves its graph"] }],
        },
      });
      assert.notEqual(made.isError, true, `${textOf(made)}\n${first.stderr.join("")}`);
    } finally {
      await first.client.close();
    }
    const second = await connect(home, "memory", ["--user", user]);
    try {
      const graph = await second.client.callTool({ name: "read_graph", arguments: {} });
      assert.deepEqual(graph.structuredContent, {
        entities: [{ name: "waffle", entityType: "project", observations: ["saves its graph"] }],
        relations: [],
      });
    } finally {
      await second.client.close();
    }
    // Where: the server's data directory in the user's workspace, written as the sandbox's uid.
    const file = "/workspace/.waffle/mcp/memory/.local/share/memory.jsonl";
    assert.match(await runOk(home.open(user), `cat ${file}`), /"name":"waffle"/);
    assert.equal((await runOk(home.open(user), `stat -c %u ${file}`)).trim(), String(SANDBOX_UID));
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: a server's HOME, XDG directories and TMPDIR are its own and kept; its cwd is made; literal and renamed env reach it",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("state");
    await putServer(home, user);
    const root = "/workspace/.waffle/mcp/kept";
    const first = await connect(home, "kept", ["--user", user]);
    let env: Record<string, string>;
    try {
      env = JSON.parse(textOf(await first.client.callTool({ name: "env", arguments: {} })));
      assert.deepEqual(
        {
          HOME: env.HOME,
          XDG_CONFIG_HOME: env.XDG_CONFIG_HOME,
          XDG_DATA_HOME: env.XDG_DATA_HOME,
          XDG_STATE_HOME: env.XDG_STATE_HOME,
          XDG_CACHE_HOME: env.XDG_CACHE_HOME,
          TMPDIR: env.TMPDIR,
          CWD: env.CWD,
          FIXED: env.FIXED,
          RENAMED: env.RENAMED,
          GREETING: env.GREETING,
        },
        {
          HOME: root,
          XDG_CONFIG_HOME: `${root}/.config`,
          XDG_DATA_HOME: `${root}/.local/share`,
          XDG_STATE_HOME: `${root}/.local/state`,
          XDG_CACHE_HOME: `${root}/.cache`,
          TMPDIR: `${root}/tmp`,
          CWD: "/workspace/data/kept",
          FIXED: "from the config",
          RENAMED: "hello from the host",
          GREETING: undefined, // the host variable went in under the name the table gave it
        },
      );
      for (
        const name of [
          "XDG_CONFIG_HOME",
          "XDG_DATA_HOME",
          "XDG_STATE_HOME",
          "XDG_CACHE_HOME",
          "TMPDIR",
        ]
      ) {
        const wrote = await first.client.callTool({
          name: "write_file",
          arguments: { path: `${env[name]}/kept.txt`, content: name },
        });
        assert.equal(textOf(wrote), "written", name);
      }
    } finally {
      await first.client.close();
    }
    // The next session finds what the last one wrote.
    const second = await connect(home, "kept", ["--user", user]);
    try {
      for (const name of ["XDG_CONFIG_HOME", "XDG_DATA_HOME", "TMPDIR"]) {
        assert.equal(
          textOf(
            await second.client.callTool({
              name: "read_file",
              arguments: { path: `${env[name]}/kept.txt` },
            }),
          ),
          name,
        );
      }
    } finally {
      await second.client.close();
    }
    // Made inside the sandbox, as its uid: never by the host.
    const owners = await runOk(
      home.open(user),
      `stat -c %u ${root} ${root}/.local/share ${root}/tmp /workspace/data/kept | sort -u`,
    );
    assert.equal(owners.trim(), String(SANDBOX_UID));
  },
  SDK_CLIENT,
);
