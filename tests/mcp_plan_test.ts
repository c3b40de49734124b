/**
 * `waffle.toml`'s MCP policy and launch planning: parsing, contradictions,
 * composition of group and cron policy, filtering and environment names.
 * Deterministic: no Docker, nothing is started.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadWaffleConfig, type WaffleConfig } from "../lib/config/config.ts";
import { UsageError } from "../lib/errors.ts";
import { launchable, type LaunchPlan, planLaunch, resolveEnv } from "../lib/mcp/plan.ts";
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
      network: "none",
      workspace: "rw",
      tools: ["echo", "get-env"],
      clientRequests: ["roots/list", "ping"],
      env: [], // cron env = [] narrows GREETING away
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
    assert.equal(local.cwd, config.sandbox.home);
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

Deno.test("resolveEnv() reads only the names asked for and omits missing ones", () => {
  const asked: string[] = [];
  const source = (name: string): string | undefined => {
    asked.push(name);
    const values = new Map([["GREETING", "hi"], ["SECRET", "s"]]);
    return values.get(name);
  };
  assert.deepEqual(resolveEnv(["GREETING", "MISSING"], source), { GREETING: "hi" });
  assert.deepEqual(asked, ["GREETING", "MISSING"]);
  assert.deepEqual(resolveEnv([], source), {});
  const proto = resolveEnv(["__proto__"], () => "x");
  assert.equal(Object.getPrototypeOf(proto), Object.prototype);
  assert.deepEqual(Object.keys(proto), ["__proto__"]);
  Deno.env.set("WAFFLE_PLAN_TEST_VAR", "v");
  try {
    assert.deepEqual(resolveEnv(["WAFFLE_PLAN_TEST_VAR"]), { WAFFLE_PLAN_TEST_VAR: "v" });
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
    [`[mcp.e]\npackage = "npm:a"\n${SERVER}`, "mcp.e.package", /pinned version, found "npm:a"/],
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
    assert.deepEqual(config.policy, { servers: {}, groups: {}, cron: {} });
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
    const plan = JSON.parse(io.out()) as LaunchPlan;
    assert.deepEqual(plan, JSON.parse(JSON.stringify(planLaunch(config, { cron: "nightly" }))));
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
      /everything\s+launch\s+sandbox\s+\/workspace\/jobs\/nightly\s+none\s+rw\s+echo,get-env\s+-\s+roots\/list,ping\n/,
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
      servers: [
        {
          name: "everything",
          execution: "sandbox",
          authority: "sandbox",
          groups: ["main"],
          env: ["GREETING"],
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
