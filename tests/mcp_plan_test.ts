/**
 * `waffle.toml`'s MCP policy and launch planning: parsing, contradictions,
 * composition of group and cron policy, filtering and environment names.
 * Deterministic: no Docker, nothing is started.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  configCandidates,
  defaultHome,
  loadWaffleConfig,
  SYSTEM_CONFIG,
  type WaffleConfig,
} from "../lib/config/config.ts";
import { UnpinnedPackageError, UsageError } from "../lib/errors.ts";
import { exists } from "../lib/fs.ts";
import {
  launchable,
  type LaunchPlan,
  planLaunch,
  resolveEnv,
  unsetHostEnv,
} from "../lib/mcp/plan.ts";
import { DEFAULT_MAX_MESSAGE_BYTES, type EnvSource } from "../lib/config/mcp_types.ts";
import { runCli } from "../lib/cli/mod.ts";
import type { CliIo } from "../lib/cli/io.ts";

/** The issue's example, verbatim. */
const EXAMPLE = `[sandbox]
mode = "docker"              # "docker" (default) | "host" (no isolation; only when written explicitly)
image = "waffle-runner:latest"
env = ["LANG"]               # host variables passed to every command; nothing else reaches it

[mcp.everything]
package = "npm:@modelcontextprotocol/server-everything@2026.8.31"  # run by waffle's own Deno
args = ["stdio"]
execution = "sandbox"        # "host" | "sandbox"
authority = "sandbox"        # "host" | "sandbox" | "restricted"
groups = ["main"]            # groups that may use it; absent = every group
env = ["GREETING"]           # host variables passed to this server; nothing else reaches it
tools = ["echo", "get-env"]  # optional: only these tools are listed and callable

[mcp.local]
command = "/usr/local/bin/some-server"   # a program: on the host for execution = "host", in the image for "sandbox"
args = []
execution = "host"
authority = "host"

[groups.main]
mode = "docker"              # a group may require docker; a host-executed server is then denied to it

[cron.nightly]
group = "main"               # the base policy
mcp = ["everything"]         # the servers this job may use, a subset of its group's
network = "none"
workdir = "jobs/nightly"     # under /workspace
env = []                     # narrows the allowlists further
`;

/** More servers, groups and jobs for composition tests. */
const EXTRA = `
[mcp.jail]
package = "npm:jail-server@1.0.0"
execution = "sandbox"
authority = "restricted"
env = ["GREETING", "SECRET"]

[groups.ops]
mode = "host"

[cron.greet]
group = "main"
env = ["GREETING"]

[cron.open]
group = "main"
`;

async function withConfig<T>(
  toml: string,
  fn: (config: WaffleConfig, paths: { home: string; file: string }) => T | Promise<T>,
): Promise<T> {
  const home = await Deno.makeTempDir({ prefix: "waffle-plan-" });
  try {
    const file = join(home, "waffle.toml");
    await Deno.writeTextFile(file, toml);
    return await fn(loadWaffleConfig({ configPath: file, overrides: { home } }), { home, file });
  } finally {
    await Deno.remove(home, { recursive: true });
  }
}

function server(plan: LaunchPlan, name: string): LaunchPlan["servers"][number] {
  const found = plan.servers.find((s) => s.name === name);
  assert.ok(found, `server ${name} is in the plan`);
  return found;
}

Deno.test("loadWaffleConfig() parses the issue's example", async () => {
  await withConfig(EXAMPLE, (config, { file }) => {
    assert.equal(config.path, file);
    assert.equal(config.sandbox.mode, "docker");
    assert.deepEqual(config.sandbox.envAllowlist, ["LANG"]);
    assert.deepEqual(config.policy.servers.everything, {
      name: "everything",
      package: "npm:@modelcontextprotocol/server-everything@2026.8.31",
      args: ["stdio"],
      execution: "sandbox",
      authority: "sandbox",
      groups: ["main"],
      env: ["GREETING"],
      envSources: [{ name: "GREETING", host: "GREETING" }],
      maxMessageBytes: 64 * 1024 * 1024,
      tools: ["echo", "get-env"],
      clientRequests: ["roots/list", "ping"],
    });
    assert.deepEqual(config.policy.servers.local, {
      name: "local",
      command: "/usr/local/bin/some-server",
      args: [],
      execution: "host",
      authority: "host",
      env: [],
      envSources: [],
      maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
      clientRequests: ["roots/list", "ping"],
    });
    assert.deepEqual(config.policy.groups, { main: { name: "main", mode: "docker" } });
    assert.deepEqual(config.policy.cron.nightly, {
      name: "nightly",
      group: "main",
      mcp: ["everything"],
      network: "none",
      workdir: "jobs/nightly",
      env: [],
    });
  });
});

Deno.test("planLaunch() for cron nightly: the planned cwd, network and env, and a fully denied server filtered out", async () => {
  await withConfig(EXAMPLE, (config) => {
    const plan = planLaunch(config, { cron: "nightly" });
    assert.deepEqual(plan.subject, { kind: "cron", name: "nightly" });
    assert.equal(plan.group, "main");
    assert.deepEqual(plan.servers.map((s) => s.name), ["everything", "local"]);
    assert.deepEqual(server(plan, "everything"), {
      name: "everything",
      decision: "launch",
      reasons: [],
      where: "sandbox",
      program: {
        package: "npm:@modelcontextprotocol/server-everything@2026.8.31",
        args: ["stdio"],
      },
      cwd: "/workspace/jobs/nightly",
      state: {
        root: "/workspace/.waffle/mcp/everything",
        env: {
          HOME: "/workspace/.waffle/mcp/everything",
          XDG_CONFIG_HOME: "/workspace/.waffle/mcp/everything/.config",
          XDG_DATA_HOME: "/workspace/.waffle/mcp/everything/.local/share",
          XDG_STATE_HOME: "/workspace/.waffle/mcp/everything/.local/state",
          XDG_CACHE_HOME: "/workspace/.waffle/mcp/everything/.cache",
          TMPDIR: "/workspace/.waffle/mcp/everything/tmp",
        },
      },
      network: "none",
      egress: "none",
      workspace: "rw",
      tools: ["echo", "get-env"],
      clientRequests: ["roots/list", "ping"],
      env: [], // cron env = [] narrows GREETING away
      envSources: [],
      maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
    });
    const local = server(plan, "local");
    assert.equal(local.decision, "denied");
    assert.equal(local.where, undefined);
    assert.ok(
      local.reasons.includes(`cron 'nightly' allows only mcp ["everything"] (cron.nightly.mcp)`),
      local.reasons.join("\n"),
    );
    assert.ok(
      local.reasons.includes(
        `group 'main' requires docker (groups.main.mode); execution "host" is not allowed`,
      ),
      local.reasons.join("\n"),
    );
    for (const reason of local.reasons) assert.ok(!reason.includes("\n") && reason.length > 0);
    assert.deepEqual(launchable(plan).map((s) => s.name), ["everything"]);
  });
});

Deno.test("planLaunch() composes group and cron policy by intersection", async () => {
  await withConfig(EXAMPLE + EXTRA, (config) => {
    // Group main: local is denied by the group's docker mode alone.
    const main = planLaunch(config, { group: "main" });
    assert.deepEqual(launchable(main).map((s) => s.name), ["everything", "jail"]);
    assert.deepEqual(server(main, "local").reasons, [
      `group 'main' requires docker (groups.main.mode); execution "host" is not allowed`,
    ]);
    // Cron nightly narrows group main further: jail is allowed by the group, not by the job.
    const nightly = planLaunch(config, { cron: "nightly" });
    assert.deepEqual(launchable(nightly).map((s) => s.name), ["everything"]);
    assert.deepEqual(server(nightly, "jail").reasons, [
      `cron 'nightly' allows only mcp ["everything"] (cron.nightly.mcp)`,
    ]);
    // A cron job without mcp keeps its group's servers, never more.
    assert.deepEqual(
      launchable(planLaunch(config, { cron: "open" })).map((s) => s.name),
      ["everything", "jail"],
    );
    // Group ops (mode host): local may run on the host; everything is not in its groups.
    const ops = planLaunch(config, { group: "ops" });
    assert.deepEqual(launchable(ops).map((s) => s.name), ["local", "jail"]);
    assert.deepEqual(server(ops, "everything").reasons, [
      `group 'ops' is not in mcp.everything.groups ["main"]`,
    ]);
    const local = server(ops, "local");
    assert.equal(local.where, "host");
    assert.equal(local.network, "host");
    assert.equal(local.workspace, "none");
    assert.equal(local.cwd, `${config.sandbox.home}/mcp-state/local`, "its own state directory");
    assert.equal(local.state.root, local.cwd);
    assert.equal(local.state.env.HOME, local.cwd);
    assert.equal(local.tools, "all");
    // No subject: group "default", undeclared, so docker (sandbox.mode).
    const byDefault = planLaunch(config);
    assert.deepEqual(byDefault.subject, { kind: "group", name: "default" });
    assert.deepEqual(launchable(byDefault).map((s) => s.name), ["jail"]);
    assert.match(server(byDefault, "local").reasons.join("\n"), /requires docker \(sandbox\.mode/);
  });
});

Deno.test("planLaunch() narrows env names by the cron job's env", async () => {
  await withConfig(EXAMPLE + EXTRA, (config) => {
    assert.deepEqual(server(planLaunch(config, { cron: "nightly" }), "everything").env, []);
    assert.deepEqual(server(planLaunch(config, { cron: "greet" }), "everything").env, ["GREETING"]);
    assert.deepEqual(server(planLaunch(config, { cron: "greet" }), "jail").env, ["GREETING"]);
    // No cron env: the server's own allowlist, sorted.
    assert.deepEqual(server(planLaunch(config, { cron: "open" }), "jail").env, [
      "GREETING",
      "SECRET",
    ]);
    assert.deepEqual(server(planLaunch(config, { group: "main" }), "everything").env, ["GREETING"]);
  });
});

Deno.test("planLaunch() gives restricted servers no network and a read-only workspace", async () => {
  const bridge = EXAMPLE.replace(
    'mode = "docker"              # "docker"',
    'network = "bridge"\nmode = "docker" #',
  );
  await withConfig(bridge + EXTRA, (config) => {
    assert.equal(config.sandbox.network, "bridge");
    const open = planLaunch(config, { cron: "open" });
    const jail = server(open, "jail");
    assert.equal(jail.decision, "launch");
    assert.equal(jail.where, "restricted");
    assert.equal(jail.network, "none");
    assert.equal(jail.workspace, "ro");
    assert.equal(jail.cwd, "/workspace");
    assert.equal(server(open, "everything").network, "bridge");
    assert.equal(server(open, "everything").workspace, "rw");
    // Cron network "none" with a bridged user sandbox: the sandbox server is denied.
    const nightly = planLaunch(config, { cron: "nightly" });
    assert.equal(server(nightly, "everything").decision, "denied");
    assert.deepEqual(server(nightly, "everything").reasons, [
      `cron 'nightly' requires network "none" (cron.nightly.network) but the user sandbox has network "bridge" (sandbox.network)`,
    ]);
    assert.deepEqual(launchable(nightly), []);
  });
});

Deno.test("planLaunch() with sandbox mode host denies sandbox-executed servers and never plans them on the host", async () => {
  const host = EXAMPLE.replace('mode = "docker"              # "docker"', 'mode = "host" #');
  await withConfig(host + EXTRA, (config) => {
    assert.equal(config.sandbox.mode, "host");
    for (
      const subject of [{}, { group: "main" }, { group: "ops" }, { cron: "open" }, {
        cron: "nightly",
      }]
    ) {
      const plan = planLaunch(config, subject);
      for (const name of ["everything", "jail"]) {
        const s = server(plan, name);
        assert.equal(s.decision, "denied", `${name} ${JSON.stringify(subject)}`);
        assert.notEqual(s.where, "host");
        assert.ok(
          s.reasons.some((r) => r.includes(`sandbox.mode is "host"`)),
          s.reasons.join("\n"),
        );
      }
      for (const s of launchable(plan)) assert.equal(s.where, "host");
    }
    // The group still decides host execution: main requires docker, ops allows the host.
    assert.equal(server(planLaunch(config, { group: "main" }), "local").decision, "denied");
    assert.equal(server(planLaunch(config, { group: "ops" }), "local").decision, "launch");
  });
});

Deno.test("planLaunch() rejects an unknown group or cron job, and both at once", async () => {
  await withConfig(EXAMPLE, (config) => {
    assert.throws(() => planLaunch(config, { group: "nope" }), UsageError);
    assert.throws(() => planLaunch(config, { group: "nope" }), /Unknown group 'nope'/);
    assert.throws(
      () => planLaunch(config, { cron: "weekly" }),
      /Unknown cron job 'weekly'; configured: 'nightly'/,
    );
    assert.throws(() => planLaunch(config, { group: "main", cron: "nightly" }), UsageError);
    assert.equal(planLaunch(config, { group: "default" }).group, "default");
  });
});

const hostVars = (...names: string[]): EnvSource[] => names.map((name) => ({ name, host: name }));

Deno.test("resolveEnv() reads only the host variables named, omits missing ones and takes literals as written", () => {
  const asked: string[] = [];
  const source = (name: string): string | undefined => {
    asked.push(name);
    const values = new Map([["GREETING", "hi"], ["SECRET", "s"], ["HOST_TOKEN", "t"]]);
    return values.get(name);
  };
  assert.deepEqual(resolveEnv(hostVars("GREETING", "MISSING"), source), { GREETING: "hi" });
  assert.deepEqual(asked, ["GREETING", "MISSING"]);
  assert.deepEqual(resolveEnv([], source), {});
  asked.length = 0;
  assert.deepEqual(
    resolveEnv(
      [{ name: "TOKEN", host: "HOST_TOKEN" }, { name: "SECRET", value: "literal" }],
      source,
    ),
    { TOKEN: "t", SECRET: "literal" },
  );
  assert.deepEqual(asked, ["HOST_TOKEN"], "a literal reads no host variable, even of its name");
  const proto = resolveEnv(hostVars("__proto__"), () => "x");
  assert.equal(Object.getPrototypeOf(proto), Object.prototype);
  assert.deepEqual(Object.keys(proto), ["__proto__"]);
  assert.deepEqual(
    unsetHostEnv([{ name: "A", host: "GREETING" }, { name: "B", host: "NOPE" }, {
      name: "C",
      value: "",
    }], source),
    [{ name: "B", host: "NOPE" }],
  );
  Deno.env.set("WAFFLE_PLAN_TEST_VAR", "v");
  try {
    assert.deepEqual(resolveEnv(hostVars("WAFFLE_PLAN_TEST_VAR")), { WAFFLE_PLAN_TEST_VAR: "v" });
  } finally {
    Deno.env.delete("WAFFLE_PLAN_TEST_VAR");
  }
});

const SERVER = `execution = "sandbox"\nauthority = "sandbox"\n`;

Deno.test("loadWaffleConfig() names the key of every contradiction or bad value in one line", async () => {
  const cases: [string, string, RegExp?][] = [
    [
      `[mcp.e]\ncommand = "/x"\nexecution = "docker"\nauthority = "sandbox"\n`,
      "mcp.e.execution",
      /must be "host" or "sandbox", found "docker"/,
    ],
    [
      `[mcp.e]\ncommand = "/x"\nexecution = "sandbox"\nauthority = "host"\n`,
      "mcp.e.execution",
      /must be "host" when authority is "host", found "sandbox"/,
    ],
    [
      `[mcp.e]\ncommand = "/x"\nexecution = "host"\nauthority = "sandbox"\n`,
      "mcp.e.execution",
      /must be "sandbox" when authority is "sandbox"/,
    ],
    [
      `[mcp.e]\ncommand = "/x"\nexecution = "host"\nauthority = "restricted"\n`,
      "mcp.e.execution",
      /must be "sandbox" when authority is "restricted"/,
    ],
    [
      `[mcp.e]\ncommand = "/x"\npackage = "npm:a@1"\n${SERVER}`,
      "mcp.e.command",
      /exactly one of package or command/,
    ],
    [`[mcp.e]\n${SERVER}`, "mcp.e.package", /found neither/],
    [`[mcp.e]\npackage = "npm:a"\n${SERVER}`, "mcp.e.package", /exact version .*, found "npm:a"$/],
    [`[mcp.e]\npackage = "a@1"\n${SERVER}`, "mcp.e.package"],
    [`[mcp.e]\ncommand = "bin/x"\n${SERVER}`, "mcp.e.command", /absolute path, found "bin\/x"/],
    [`[mcp.e]\ncommand = "/x"\nauthority = "sandbox"\n`, "mcp.e.execution", /found nothing/],
    [`[mcp.e]\ncommand = "/x"\nenv = ["A-B"]\n${SERVER}`, "mcp.e.env[0]", /variable name/],
    [`[mcp.e]\ncommand = "/x"\ntools = ["a b"]\n${SERVER}`, "mcp.e.tools[0]", /tool name/],
    [`[mcp.e]\ncommand = "/x"\ngroups = ["-x"]\n${SERVER}`, "mcp.e.groups[0]"],
    [
      `[mcp.e]\ncommand = "/x"\nclient_requests = ["ping", "sampling/create"]\n${SERVER}`,
      "mcp.e.client_requests[1]",
      /must be "ping" or "roots\/list" or "sampling\/createMessage" or "elicitation\/create", found "sampling\/create"$/,
    ],
    [
      `[mcp.e]\ncommand = "/x"\nclient_requests = "ping"\n${SERVER}`,
      "mcp.e.client_requests",
      /must be an array, found "ping"/,
    ],
    [
      `[mcp.e]\ncommand = "/x"\nargs = "stdio"\n${SERVER}`,
      "mcp.e.args",
      /must be an array, found "stdio"/,
    ],
    [`[mcp."bad name"]\ncommand = "/x"\n${SERVER}`, "mcp.bad name", /found "bad name"/],
    [`[groups.main]\nmode = "vm"\n`, "groups.main.mode", /must be "docker" or "host", found "vm"/],
    [`[groups."a.b"]\n`, "groups.a.b"],
    [
      `[cron.nightly]\ngroup = "nope"\n`,
      "cron.nightly.group",
      /declared \[groups.<name>\] table, found "nope"/,
    ],
    [
      `[groups.main]\n[cron.nightly]\ngroup = "main"\nmcp = ["ghost"]\n`,
      "cron.nightly.mcp[0]",
      /configured \[mcp.<name>\] server, found "ghost"/,
    ],
    [
      `[groups.main]\n[cron.nightly]\ngroup = "main"\nworkdir = "/abs"\n`,
      "cron.nightly.workdir",
      /relative path/,
    ],
    [
      `[groups.main]\n[cron.nightly]\ngroup = "main"\nworkdir = "a/../../b"\n`,
      "cron.nightly.workdir",
    ],
    [
      `[groups.main]\n[cron.nightly]\ngroup = "main"\nworkdir = "a\\u0000b"\n`,
      "cron.nightly.workdir",
    ],
    [`[groups.main]\n[cron.nightly]\ngroup = "main"\nenv = ["1X"]\n`, "cron.nightly.env[0]"],
    [
      `[groups.main]\n[cron.nightly]\ngroup = "main"\nnetwork = "host"\n`,
      "cron.nightly.network",
      /must be "none" or "bridge", found "host"/,
    ],
    [`[groups.main]\n[cron.nightly]\nmcp = []\n`, "cron.nightly.group", /found nothing/],
    [`[groups.main]\n[cron.x_]\ngroup = "main"\n[cron."-x"]\ngroup = "main"\n`, "cron.-x"],
    [`[mcp.__proto__]\ncommand = "/x"\n${SERVER}`, "mcp.__proto__", /found "__proto__"/],
    [`[groups.main]\n[cron.__proto__]\ngroup = "main"\n`, "cron.__proto__"],
    // Unknown keys, at every level.
    [
      `[mcp.e]\ncommand = "/x"\nimage = "i"\n${SERVER}`,
      "mcp.e.image",
      /is not a known key \(expected one of: package, command/,
    ],
    [
      `[groups.main]\nmode = "docker"\nnetwork = "none"\n`,
      "groups.main.network",
      /is not a known key/,
    ],
    [
      `[groups.main]\n[cron.nightly]\ngroup = "main"\ntools = []\n`,
      "cron.nightly.tools",
      /is not a known key/,
    ],
    [`[servers.e]\n`, "servers", /is not a known key/],
  ];
  for (const [toml, key, detail] of cases) {
    const home = await Deno.makeTempDir({ prefix: "waffle-plan-" });
    try {
      const file = join(home, "waffle.toml");
      await Deno.writeTextFile(file, toml);
      assert.throws(
        () => loadWaffleConfig({ configPath: file, overrides: { home } }),
        (error: unknown) => {
          assert.ok(error instanceof UsageError, String(error));
          assert.ok(
            error.message.startsWith(`Config file '${file}': '${key}' `),
            `${key}: ${error.message}`,
          );
          assert.ok(!error.message.includes("\n"), error.message);
          if (detail !== undefined) assert.match(error.message, detail);
          return true;
        },
        key,
      );
    } finally {
      await Deno.remove(home, { recursive: true });
    }
  }
});

Deno.test("loadWaffleConfig() reports a TOML syntax error with the file, line and column", async () => {
  await assert.rejects(
    withConfig(`[sandbox]\nimage = "x"\n\n[mcp.e\ncommand = "/x"\n`, () => {}),
    (error: unknown) => {
      assert.ok(error instanceof UsageError);
      assert.match(
        error.message,
        /^Config file '.*waffle\.toml' is not valid TOML: line 4, column \d+: /,
      );
      assert.ok(!error.message.includes("\n"));
      return true;
    },
  );
});

Deno.test("loadWaffleConfig() refuses a home with only config.json", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-plan-" });
  try {
    await Deno.writeTextFile(join(home, "config.json"), "{}");
    assert.throws(
      () => loadWaffleConfig({ overrides: { home } }),
      /config\.json' is no longer read: move its settings to '.*waffle\.toml' under \[sandbox\] with snake_case keys/,
    );
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("loadWaffleConfig() without a file: defaults and an empty policy", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-plan-" });
  try {
    const config = loadWaffleConfig({ overrides: { home } });
    assert.equal(config.path, undefined);
    assert.equal(config.sandbox.mode, "docker");
    assert.deepEqual(config.policy, { servers: {}, groups: {}, cron: {}, secrets: {}, users: {} });
    assert.deepEqual(planLaunch(config).servers, []);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

function captureIo(): CliIo & { out: () => string; err: () => string } {
  let out = "";
  let err = "";
  const decode = (data: Uint8Array | string): string =>
    typeof data === "string" ? data : new TextDecoder().decode(data);
  return {
    stdout: (data) => {
      out += decode(data);
      return Promise.resolve();
    },
    stderr: (data) => {
      err += decode(data);
      return Promise.resolve();
    },
    stdin: null,
    out: () => out,
    err: () => err,
  };
}

Deno.test("waffle mcp plan --cron nightly --json prints the plan; the table shows the denied server's reasons", async () => {
  await withConfig(EXAMPLE, async (config, { file, home }) => {
    const io = captureIo();
    const saved = Deno.env.get("WAFFLE_HOME");
    Deno.env.set("WAFFLE_HOME", home);
    try {
      assert.equal(
        await runCli(["mcp", "plan", "--cron", "nightly", "--json", "--config", file], io),
        0,
        io.err(),
      );
    } finally {
      if (saved === undefined) Deno.env.delete("WAFFLE_HOME");
      else Deno.env.set("WAFFLE_HOME", saved);
    }
    const { config: read, searched, warnings, ...plan } = JSON.parse(io.out()) as LaunchPlan & {
      config: string;
      searched: string[];
      warnings: unknown[];
    };
    assert.deepEqual(plan, JSON.parse(JSON.stringify(planLaunch(config, { cron: "nightly" }))));
    assert.equal(read, file);
    assert.deepEqual(searched, [file]);
    assert.deepEqual(warnings, [], "cron nightly narrows GREETING away: nothing unset to warn of");
    assert.equal(server(plan, "local").decision, "denied");
    assert.equal(server(plan, "everything").cwd, "/workspace/jobs/nightly");
    const text = captureIo();
    assert.equal(
      await runCli(["mcp", "plan", "--cron", "nightly", "--config", file], text),
      0,
      text.err(),
    );
    assert.match(text.out(), /^Plan for cron 'nightly' \(group 'main'\)/);
    assert.match(
      text.out(),
      /everything\s+launch\s+sandbox\s+\/workspace\/jobs\/nightly\s+\/workspace\/\.waffle\/mcp\/everything\s+none\s+none\s+rw\s+echo,get-env\s+-\s+roots\/list,ping\n/,
    );
    assert.match(text.out(), /local\s+denied\s+-/);
    assert.match(text.out(), /denied: group 'main' requires docker \(groups\.main\.mode\)/);
    const both = captureIo();
    assert.equal(
      await runCli(["mcp", "plan", "--cron", "nightly", "--group", "main", "--config", file], both),
      125,
    );
    assert.match(both.err(), /^waffle: Give --group G or --cron J, not both\n$/);
    const unknown = captureIo();
    assert.equal(await runCli(["mcp", "plan", "--group", "nope", "--config", file], unknown), 125);
    assert.match(unknown.err(), /Unknown group 'nope'/);
  });
});

Deno.test("waffle mcp ls --json lists the servers and their policy", async () => {
  await withConfig(EXAMPLE, async (_config, { file }) => {
    const io = captureIo();
    assert.equal(await runCli(["mcp", "ls", "--json", "--config", file], io), 0, io.err());
    assert.deepEqual(JSON.parse(io.out()), {
      config: file,
      searched: [file],
      servers: [
        {
          name: "everything",
          execution: "sandbox",
          authority: "sandbox",
          groups: ["main"],
          env: ["GREETING"],
          envSources: [{ name: "GREETING", host: "GREETING" }],
          maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
          tools: ["echo", "get-env"],
          clientRequests: ["roots/list", "ping"],
          program: {
            package: "npm:@modelcontextprotocol/server-everything@2026.8.31",
            args: ["stdio"],
          },
        },
        {
          name: "local",
          execution: "host",
          authority: "host",
          groups: "all",
          env: [],
          envSources: [],
          maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
          tools: "all",
          clientRequests: ["roots/list", "ping"],
          program: { command: "/usr/local/bin/some-server", args: [] },
        },
      ],
    });
    const text = captureIo();
    assert.equal(await runCli(["mcp", "ls", "--config", file], text), 0, text.err());
    assert.match(
      text.out(),
      /^SERVER\s+EXECUTION\s+AUTHORITY\s+GROUPS\s+ENV\s+TOOLS\s+CLIENT REQUESTS\s+PROGRAM\n/,
    );
    assert.match(
      text.out(),
      /local\s+host\s+host\s+all\s+-\s+all\s+roots\/list,ping\s+\/usr\/local\/bin\/some-server/,
    );
    const bad = captureIo();
    assert.equal(await runCli(["mcp", "ls", "--config", join(file, "..", "nope.toml")], bad), 125);
    assert.match(bad.err(), /Config file '.*nope\.toml' does not exist/);
  });
});

Deno.test("client_requests: the default, a listed set (deduplicated, in order) and [] reach the plan and mcp ls", async () => {
  const toml = `[sandbox]
mode = "host"

[mcp.plain]
command = "/x"
execution = "host"
authority = "host"

[mcp.llm]
command = "/x"
execution = "host"
authority = "host"
client_requests = ["sampling/createMessage", "elicitation/create", "sampling/createMessage", "ping"]

[mcp.mute]
command = "/x"
execution = "host"
authority = "host"
client_requests = []
`;
  await withConfig(toml, async (config, { file }) => {
    const plan = planLaunch(config);
    assert.deepEqual(server(plan, "plain").clientRequests, ["roots/list", "ping"]);
    assert.deepEqual(server(plan, "llm").clientRequests, [
      "sampling/createMessage",
      "elicitation/create",
      "ping",
    ]);
    assert.deepEqual(server(plan, "mute").clientRequests, []);
    const json = captureIo();
    assert.equal(await runCli(["mcp", "plan", "--json", "--config", file], json), 0, json.err());
    const printed = JSON.parse(json.out()) as LaunchPlan;
    assert.deepEqual(server(printed, "llm").clientRequests, server(plan, "llm").clientRequests);
    const text = captureIo();
    assert.equal(await runCli(["mcp", "plan", "--config", file], text), 0, text.err());
    assert.match(text.out(), /\bCLIENT REQUESTS\n/);
    assert.match(text.out(), /llm\s.*\ssampling\/createMessage,elicitation\/create,ping\n/);
    const ls = captureIo();
    assert.equal(await runCli(["mcp", "ls", "--json", "--config", file], ls), 0, ls.err());
    const listed = JSON.parse(ls.out()).servers as { name: string; clientRequests: string[] }[];
    assert.deepEqual(
      Object.fromEntries(listed.map((s) => [s.name, s.clientRequests])),
      {
        plain: ["roots/list", "ping"],
        llm: ["sampling/createMessage", "elicitation/create", "ping"],
        mute: [],
      },
    );
  });
});

/** Runs `fn` with process variables set (undefined: unset), then puts them back. */
async function withEnv<T>(
  vars: Record<string, string | undefined>,
  fn: () => T | Promise<T>,
): Promise<T> {
  const saved = Object.fromEntries(Object.keys(vars).map((name) => [name, Deno.env.get(name)]));
  const apply = (values: Record<string, string | undefined>): void => {
    for (const [name, value] of Object.entries(values)) {
      if (value === undefined) Deno.env.delete(name);
      else Deno.env.set(name, value);
    }
  };
  apply(vars);
  try {
    return await fn();
  } finally {
    apply(saved);
  }
}

const STATE_CONFIG = `[sandbox]
mode = "docker"

[mcp.memory]
package = "npm:@modelcontextprotocol/server-memory@2026.8.31"
execution = "sandbox"
authority = "sandbox"
cwd = "/workspace/notes/./graph/"
env = { LOG_LEVEL = "info", API_TOKEN = { host = "WAFFLE_PLAN_TOKEN" }, PLAIN = { host = "PLAIN" } }
max_message_bytes = 1048576

[mcp.jail]
command = "/srv/jail"
execution = "sandbox"
authority = "restricted"
env = ["WAFFLE_PLAN_UNSET_VAR"]

[mcp.local]
command = "/bin/cat"
execution = "host"
authority = "host"
cwd = "work/dir"

[mcp.pinned-host]
command = "/bin/cat"
execution = "host"
authority = "host"
cwd = "/srv/data/"

[groups.ops]
mode = "host"

[cron.nightly]
group = "ops"
workdir = "jobs/nightly"
env = ["API_TOKEN", "WAFFLE_PLAN_UNSET_VAR"]
`;

Deno.test("loadWaffleConfig() reads env as a table of literals and renamed host variables, cwd and max_message_bytes", async () => {
  await withConfig(STATE_CONFIG, (config) => {
    const memory = config.policy.servers.memory!;
    assert.deepEqual(memory.env, ["LOG_LEVEL", "API_TOKEN", "PLAIN"]);
    assert.deepEqual(memory.envSources, [
      { name: "LOG_LEVEL", value: "info" },
      { name: "API_TOKEN", host: "WAFFLE_PLAN_TOKEN" },
      { name: "PLAIN", host: "PLAIN" },
    ]);
    assert.equal(memory.cwd, "notes/graph", "absolute under /workspace, normalized, made relative");
    assert.equal(memory.maxMessageBytes, 1024 * 1024);
    assert.deepEqual(config.policy.servers.jail!.envSources, [
      { name: "WAFFLE_PLAN_UNSET_VAR", host: "WAFFLE_PLAN_UNSET_VAR" },
    ]);
    assert.equal(config.policy.servers.jail!.maxMessageBytes, DEFAULT_MAX_MESSAGE_BYTES);
    assert.equal(DEFAULT_MAX_MESSAGE_BYTES, 67108864);
    assert.equal(config.policy.servers.local!.cwd, "work/dir");
    assert.equal(config.policy.servers["pinned-host"]!.cwd, "/srv/data");
  });
});

Deno.test("planLaunch() gives each server its state directory, its cwd over the cron workdir, and narrows env tables by name", async () => {
  await withConfig(STATE_CONFIG, (config, { home }) => {
    const plan = planLaunch(config, { group: "ops" });
    const memory = server(plan, "memory");
    assert.equal(memory.cwd, "/workspace/notes/graph");
    assert.equal(memory.maxMessageBytes, 1024 * 1024);
    assert.deepEqual(memory.env, ["API_TOKEN", "LOG_LEVEL", "PLAIN"], "sorted");
    assert.deepEqual(memory.envSources.map((e) => e.name), memory.env);
    assert.equal(memory.state.root, "/workspace/.waffle/mcp/memory");
    assert.equal(
      memory.state.env.MEMORY_FILE_PATH,
      "/workspace/.waffle/mcp/memory/.local/share/memory.jsonl",
      "server-memory's graph goes to its data directory with no setting",
    );
    const jail = server(plan, "jail");
    assert.equal(
      jail.state.root,
      "/home/sandbox/.waffle/mcp/jail",
      "a restricted server's tmpfs home",
    );
    assert.equal(jail.state.env.TMPDIR, "/home/sandbox/.waffle/mcp/jail/tmp");
    assert.equal(jail.state.env.MEMORY_FILE_PATH, undefined);
    const local = server(plan, "local");
    assert.equal(local.state.root, `${home}/mcp-state/local`);
    assert.equal(local.cwd, `${home}/mcp-state/local/work/dir`, "relative to its state directory");
    assert.equal(local.state.env.XDG_CONFIG_HOME, `${home}/mcp-state/local/.config`);
    assert.equal(server(plan, "pinned-host").cwd, "/srv/data");
    // The cron job: its workdir yields to a server's own cwd; its env narrows tables by name.
    const nightly = planLaunch(config, { cron: "nightly" });
    assert.equal(server(nightly, "memory").cwd, "/workspace/notes/graph");
    assert.deepEqual(server(nightly, "memory").envSources, [
      { name: "API_TOKEN", host: "WAFFLE_PLAN_TOKEN" },
    ]);
    assert.equal(server(nightly, "jail").cwd, "/workspace/jobs/nightly");
    // Without a home, a host server's state is shown under $WAFFLE_HOME.
    const bare = planLaunch({ sandbox: { mode: "host", network: "none" }, policy: config.policy });
    assert.equal(server(bare, "local").state.root, "$WAFFLE_HOME/mcp-state/local");
  });
});

Deno.test("waffle mcp plan shows literal values only in --json, host values never, and warns of unset host variables", async () => {
  await withConfig(STATE_CONFIG, async (_config, { file }) => {
    await withEnv({
      WAFFLE_PLAN_TOKEN: "host-secret-value",
      PLAIN: "plain-host-value",
      WAFFLE_PLAN_UNSET_VAR: undefined,
    }, async () => {
      const json = captureIo();
      assert.equal(
        await runCli(["mcp", "plan", "--group", "ops", "--json", "--config", file], json),
        0,
        json.err(),
      );
      assert.doesNotMatch(json.out(), /host-secret-value|plain-host-value/);
      const printed = JSON.parse(json.out()) as LaunchPlan & {
        warnings: { server: string; kind: string; variable: string; host: string }[];
      };
      assert.deepEqual(server(printed, "memory").envSources, [
        { name: "API_TOKEN", host: "WAFFLE_PLAN_TOKEN" },
        { name: "LOG_LEVEL", value: "info" },
        { name: "PLAIN", host: "PLAIN" },
      ]);
      assert.deepEqual(
        printed.warnings.map(({ server, kind, variable, host }) => ({
          server,
          kind,
          variable,
          host,
        })),
        [{
          server: "jail",
          kind: "env-unset",
          variable: "WAFFLE_PLAN_UNSET_VAR",
          host: "WAFFLE_PLAN_UNSET_VAR",
        }],
      );
      const text = captureIo();
      assert.equal(
        await runCli(["mcp", "plan", "--group", "ops", "--config", file], text),
        0,
        text.err(),
      );
      assert.doesNotMatch(text.out(), /host-secret-value|plain-host-value|"info"/);
      assert.match(
        text.out(),
        /memory\s+launch\s+sandbox\s+\/workspace\/notes\/graph\s+\/workspace\/\.waffle\/mcp\/memory\s/,
      );
      assert.match(text.out(), /\bAPI_TOKEN,LOG_LEVEL,PLAIN\b/);
      assert.match(
        text.out(),
        /\nwarning: server 'jail': host variable 'WAFFLE_PLAN_UNSET_VAR' is not set \(mcp\.jail\.env\); the server starts without it\n$/,
      );
    });
  });
});

Deno.test("loadWaffleConfig() names the file, key and value of a bad env table, cwd, max_message_bytes or package", async () => {
  const base = `execution = "sandbox"\nauthority = "sandbox"\ncommand = "/x"\n`;
  const host = `execution = "host"\nauthority = "host"\ncommand = "/x"\n`;
  const cases: [string, string, RegExp][] = [
    [`${base}env = 5`, "mcp.e.env", /must be an array or a table, found 5$/],
    [`${base}env = { A = 5 }`, "mcp.e.env.A", /must be a string or a table, found 5$/],
    [
      `${base}env = { a-b = "x" }`,
      "mcp.e.env.a-b",
      /name must be a variable name .*, found "a-b"$/,
    ],
    [`${base}env = { A = { hos = "X" } }`, "mcp.e.env.A.host", /must be a string, found nothing$/],
    [
      `${base}env = { A = { host = "X", y = 1 } }`,
      "mcp.e.env.A.y",
      /not a known key \(expected one of: host\)/,
    ],
    [`${base}env = { A = { host = "1X" } }`, "mcp.e.env.A.host", /variable name .*, found "1X"$/],
    [`${base}env = { A = "a\\u0000b" }`, "mcp.e.env.A", /must not contain NUL, found "a\\u0000b"$/],
    [
      `${base}env = { A = "${"x".repeat(32 * 1024 + 1)}" }`,
      "mcp.e.env.A",
      /must have <= 32768 characters/,
    ],
    [`${base}env = { __proto__ = "x" }`, "mcp.e.env.__proto__", /found "__proto__"$/],
    [`${base}env = ["A", 3]`, "mcp.e.env[1]", /must be a string, found 3$/],
    [`${base}cwd = "../x"`, "mcp.e.cwd", /must stay under \/workspace .*, found "\.\.\/x"$/],
    [`${base}cwd = "a/../../x"`, "mcp.e.cwd", /must stay under \/workspace/],
    [`${base}cwd = "/etc"`, "mcp.e.cwd", /must be under \/workspace .*, found "\/etc"$/],
    [`${base}cwd = "/workspace/../etc"`, "mcp.e.cwd", /found "\/workspace\/\.\.\/etc"$/],
    [`${base}cwd = ""`, "mcp.e.cwd", /must not be empty/],
    [
      `${host}cwd = "/srv/../etc"`,
      "mcp.e.cwd",
      /must not contain '\.\.' on the host, found "\/srv\/\.\.\/etc"$/,
    ],
    [
      `${base}max_message_bytes = 1048575`,
      "mcp.e.max_message_bytes",
      /must be >= 1048576, found 1048575$/,
    ],
    [
      `${base}max_message_bytes = 1073741825`,
      "mcp.e.max_message_bytes",
      /must be <= 1073741824, found 1073741825$/,
    ],
    [
      `${base}max_message_bytes = "64M"`,
      "mcp.e.max_message_bytes",
      /must be a number, found "64M"$/,
    ],
    [
      `execution = "sandbox"\nauthority = "sandbox"\npackage = "a@1.0.0"`,
      "mcp.e.package",
      /must be "npm:<name>@<version>" with an exact version, found "a@1\.0\.0"$/,
    ],
  ];
  for (const [body, key, detail] of cases) {
    const home = await Deno.makeTempDir({ prefix: "waffle-plan-" });
    try {
      const file = join(home, "waffle.toml");
      await Deno.writeTextFile(file, `[mcp.e]\n${body}\n`);
      assert.throws(
        () => loadWaffleConfig({ configPath: file, overrides: { home } }),
        (error: unknown) => {
          assert.ok(error instanceof UsageError, String(error));
          assert.ok(error.message.startsWith(`Config file '${file}': '${key}' `), error.message);
          assert.ok(!error.message.includes("\n"), error.message);
          assert.match(error.message, detail);
          return true;
        },
        key,
      );
    } finally {
      await Deno.remove(home, { recursive: true });
    }
  }
});

Deno.test("loadWaffleConfig() refuses @latest, a dist-tag, no version and ranges as UnpinnedPackageError, at once and offline", async () => {
  const specs = [
    [
      "npm:@modelcontextprotocol/server-memory@latest",
      "@modelcontextprotocol/server-memory",
      "latest",
    ],
    ["npm:some-server@next", "some-server", "next"],
    ["npm:some-server", "some-server", ""],
    ["npm:some-server@^1", "some-server", "^1"],
    ["npm:some-server@1.x", "some-server", "1.x"],
    ["npm:some-server@>=1", "some-server", ">=1"],
    ["npm:some-server@1.2", "some-server", "1.2"],
  ];
  for (const [spec, packageName, requested] of specs) {
    await withConfig(`[mcp.p]\n${SERVER}package = "${spec}"\n`, () => {}).then(
      () => assert.fail(`${spec} was accepted`),
      (error: unknown) => {
        assert.ok(error instanceof UnpinnedPackageError, String(error));
        assert.match(
          error.message,
          /^Config file '.*waffle\.toml': 'mcp\.p\.package' must pin an exact version/,
        );
        assert.ok(error.message.endsWith(`found ${JSON.stringify(spec)}`), error.message);
        assert.equal(error.packageName, packageName);
        assert.equal(error.requested, requested);
      },
    );
  }
  for (
    const spec of ["npm:s@1.2.3", "npm:@s/p@1.2.3-rc.1", "npm:s@1.0.0+build.7", "npm:s@2026.8.31"]
  ) {
    await withConfig(`[mcp.p]\n${SERVER}package = "${spec}"\n`, (config) => {
      assert.equal(config.policy.servers.p!.package, spec);
    });
  }
});

Deno.test("configCandidates() lists the user's file, /etc/waffle's and the default home's, in that order", async () => {
  await withEnv({ HOME: "/home/ann", XDG_CONFIG_HOME: undefined, WAFFLE_HOME: undefined }, () => {
    const candidates = configCandidates();
    assert.equal(candidates[0], "/home/ann/.config/waffle/waffle.toml");
    assert.equal(candidates[1], SYSTEM_CONFIG);
    assert.equal(SYSTEM_CONFIG, "/etc/waffle/waffle.toml");
    assert.equal(candidates[2], join(defaultHome(), "waffle.toml"));
    assert.equal(candidates.length, 3);
  });
  await withEnv({ HOME: "/home/ann", XDG_CONFIG_HOME: "/cfg", WAFFLE_HOME: undefined }, () => {
    assert.equal(configCandidates()[0], "/cfg/waffle/waffle.toml");
  });
  // A relative XDG_CONFIG_HOME is not one (the XDG rule): ~/.config is.
  await withEnv({ HOME: "/home/ann", XDG_CONFIG_HOME: "cfg" }, () => {
    assert.equal(configCandidates()[0], "/home/ann/.config/waffle/waffle.toml");
  });
});

Deno.test("loadWaffleConfig() without WAFFLE_HOME reads ~/.config/waffle/waffle.toml, whose [sandbox] home WAFFLE_HOME overrides", async () => {
  const user = await Deno.makeTempDir({ prefix: "waffle-user-" });
  try {
    const file = join(user, ".config", "waffle", "waffle.toml");
    await Deno.mkdir(join(user, ".config", "waffle"), { recursive: true });
    await Deno.writeTextFile(
      file,
      `[sandbox]\nhome = "${user}/state"\nidle_seconds = 7\n\n[mcp.m]\n${SERVER}command = "/x"\n`,
    );
    const vars = {
      HOME: user,
      XDG_CONFIG_HOME: undefined,
      WAFFLE_HOME: undefined,
      WAFFLE_CONFIG: undefined,
    };
    await withEnv(vars, () => {
      const config = loadWaffleConfig();
      assert.equal(config.path, file);
      assert.deepEqual(config.searched, [file]);
      assert.equal(config.sandbox.home, `${user}/state`);
      assert.equal(config.sandbox.mcpCache, `${user}/state/mcp-cache`);
      assert.equal(config.sandbox.idleSeconds, 7);
      assert.deepEqual(Object.keys(config.policy.servers), ["m"]);
      // Settings passed on (as every later load in the process does) read the same file.
      assert.equal(
        loadWaffleConfig({ overrides: { configPath: config.path } }).sandbox.home,
        `${user}/state`,
      );
    });
    await withEnv({ ...vars, WAFFLE_HOME: `${user}/other` }, () => {
      const config = loadWaffleConfig();
      assert.equal(config.path, undefined, "WAFFLE_HOME names its own waffle.toml, not the user's");
      assert.deepEqual(config.searched, [`${user}/other/waffle.toml`]);
      assert.equal(config.sandbox.home, `${user}/other`);
    });
    await withEnv({ ...vars, WAFFLE_HOME: `${user}/other` }, () => {
      const config = loadWaffleConfig({ configPath: file });
      assert.equal(config.sandbox.home, `${user}/other`, "WAFFLE_HOME wins over the file's home");
    });
    await Deno.writeTextFile(file, `[sandbox]\nhome = "state"\n`);
    await withEnv(vars, () => {
      assert.throws(
        () => loadWaffleConfig(),
        new RegExp(
          `: Config file '${file}': 'sandbox\\.home' must be an absolute path, found "state"$`,
        ),
      );
    });
  } finally {
    await Deno.remove(user, { recursive: true });
  }
});

Deno.test({
  // The machine's own system or default-home config would be found.
  name: `waffle mcp run, mcp ls and mcp plan without a config file name every place looked at${
    exists(SYSTEM_CONFIG) || exists(join(defaultHome(), "waffle.toml"))
      ? ` [ignored: this machine has '${SYSTEM_CONFIG}' or '${join(defaultHome(), "waffle.toml")}']`
      : ""
  }`,
  ignore: exists(SYSTEM_CONFIG) || exists(join(defaultHome(), "waffle.toml")),
  fn: async () => {
    const user = await Deno.makeTempDir({ prefix: "waffle-user-" });
    try {
      const vars = {
        HOME: user,
        XDG_CONFIG_HOME: undefined,
        WAFFLE_HOME: undefined,
        WAFFLE_CONFIG: undefined,
      };
      await withEnv(vars, async () => {
        const places = [
          `'${user}/.config/waffle/waffle.toml'`,
          `'${SYSTEM_CONFIG}'`,
          `'${join(defaultHome(), "waffle.toml")}'`,
        ].join(", ");
        const run = captureIo();
        assert.equal(await runCli(["mcp", "run", "filesystem", "--user", "u"], run), 125);
        assert.equal(
          run.err(),
          `waffle: Unknown MCP server 'filesystem' (no config file (looked at ${places})); configured: none\n`,
        );
        const ls = captureIo();
        assert.equal(await runCli(["mcp", "ls"], ls), 0, ls.err());
        assert.equal(
          ls.out(),
          `No MCP servers configured (no config file (looked at ${places}))\n`,
        );
        const plan = captureIo();
        assert.equal(await runCli(["mcp", "plan"], plan), 0, plan.err());
        assert.match(
          plan.out(),
          new RegExp(
            `no MCP servers configured \\(no config file \\(looked at ${escape(places)}\\)\\)\\n$`,
          ),
        );
      });
    } finally {
      await Deno.remove(user, { recursive: true });
    }
  },
});

Deno.test("--config and WAFFLE_CONFIG must be absolute paths: a one-line error otherwise", async () => {
  for (
    const args of [
      ["mcp", "plan", "--config", "waffle.toml"],
      ["mcp", "ls", "--config", "./waffle.toml"],
      ["mcp", "run", "x", "--config", "conf/waffle.toml"],
      ["doctor", "--no-docker", "--config", "waffle.toml", "--json"],
      ["exec", "--user", "u", "--config", "waffle.toml", "--", "true"],
    ]
  ) {
    const io = captureIo();
    const code = await runCli(args, io);
    const flag = args[args.indexOf("--config") + 1]!;
    const line =
      `Invalid --config '${flag}': must be an absolute path (an MCP client may start waffle in any directory)`;
    if (args[0] === "doctor") {
      // doctor reports it as its mcp row and goes on.
      assert.match(io.out(), new RegExp(escape(line)));
      continue;
    }
    assert.equal(code, 125, `${args.join(" ")}: ${io.err()}`);
    assert.equal(io.err(), `waffle: ${line}\n`);
  }
  await withEnv({ WAFFLE_CONFIG: "rel.toml" }, async () => {
    const io = captureIo();
    assert.equal(await runCli(["mcp", "ls"], io), 125);
    assert.match(
      io.err(),
      /^waffle: Invalid WAFFLE_CONFIG 'rel\.toml': must be an absolute path .*\n$/,
    );
  });
});

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
}
