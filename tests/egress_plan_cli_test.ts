/**
 * `waffle egress plan` as a whole process: its text and --json output, the
 * secret sources it checks without ever showing a value, its warnings, and
 * its one-line usage errors. No Docker: nothing is started.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { runCliProcess } from "./_helpers.ts";

const TOKEN_VALUE = "ghp_never-shown-0123456789";
const FILE_VALUE = "npm_never-shown-9876543210";

function policy(dir: string): string {
  return `[sandbox]
egress = ["api.github.com", "*.pypi.org", "files.pythonhosted.org:443"]
egress_addresses = ["127.0.0.1"]
egress_allow_host_loopback = true
secrets = ["github", "npm", "gone"]

[users.alice]
egress = ["*.github.com:443", "*.pypi.org"]
secrets = ["github", "npm"]

[secrets.github]
from_env = "WAFFLE_TEST_EGRESS_TOKEN"
hosts = ["api.github.com"]
header = "Authorization"
format = "Bearer {}"
env = "GITHUB_TOKEN"

[secrets.npm]
from_file = "${join(dir, "npm-token")}"
hosts = ["registry.npmjs.org"]
header = "Authorization"

[secrets.gone]
from_file = "${join(dir, "missing")}"
hosts = ["files.pythonhosted.org"]
header = "X-Token"

[egress]
max_connections = 8
bytes_per_second = 65536
extra_ca = "${join(dir, "no-ca.pem")}"

[egress.hosts]
"git.internal" = "10.0.0.5"

[mcp.fetch]
command = "/usr/local/bin/fetch"
execution = "sandbox"
authority = "restricted"
egress = ["*.example.com", "api.github.com"]
secrets = ["github"]

[mcp.quiet]
command = "/usr/local/bin/quiet"
execution = "sandbox"
authority = "restricted"

[mcp.shell]
command = "/bin/sh"
execution = "sandbox"
authority = "sandbox"

[mcp.local]
command = "/usr/bin/true"
execution = "host"
authority = "host"

[groups.main]
egress = ["api.github.com:443"]

[cron.nightly]
group = "main"
`;
}

async function withHome<T>(
  toml: (dir: string) => string,
  fn: (paths: { home: string; file: string; cli: typeof run }) => Promise<T>,
): Promise<T> {
  const home = await Deno.makeTempDir({ prefix: "waffle-egress-cli-" });
  try {
    const file = join(home, "waffle.toml");
    await Deno.writeTextFile(file, toml(home));
    await Deno.writeTextFile(join(home, "npm-token"), FILE_VALUE);
    const cli: typeof run = (args, env) =>
      run(args, { WAFFLE_HOME: home, WAFFLE_CONFIG: file, ...env });
    return await fn({ home, file, cli });
  } finally {
    await Deno.remove(home, { recursive: true });
  }
}

function run(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  return runCliProcess(args, { env });
}

function noSecrets(out: { stdout: string; stderr: string }): void {
  for (const value of [TOKEN_VALUE, FILE_VALUE]) {
    assert.ok(!out.stdout.includes(value) && !out.stderr.includes(value), "a secret was shown");
  }
}

Deno.test("waffle egress plan shows a user's composed list, secrets without values, warnings and caps", async () => {
  await withHome(policy, async ({ file, cli }) => {
    const out = await cli(["egress", "plan", "--user", "alice"], {
      WAFFLE_TEST_EGRESS_TOKEN: TOKEN_VALUE,
    });
    assert.equal(out.code, 0, out.stderr);
    assert.equal(out.stderr, "");
    noSecrets(out);
    const lines = out.stdout.split("\n");
    assert.equal(lines[0], `Egress of user 'alice' (tenant 'default'), from '${file}'`);
    assert.match(out.stdout, /\n {2}attached +yes \(sandbox\.egress, users\.alice\.egress\)\n/);
    assert.match(out.stdout, /\n {2}allow +api\.github\.com:443\n {13}\*\.pypi\.org\n/);
    assert.match(out.stdout, /\n {2}addresses +127\.0\.0\.1\/32\n/);
    assert.match(out.stdout, /\n {2}caps +max_connections 8, bytes_per_second 65536\n/);
    assert.match(out.stdout, /\n {2}hosts +git\.internal = 10\.0\.0\.5\n/);
    assert.match(
      out.stdout,
      /\ngithub +api\.github\.com +Authorization +Bearer \{\} +GITHUB_TOKEN +env WAFFLE_TEST_EGRESS_TOKEN \(set\)\n/,
    );
    assert.match(
      out.stdout,
      /\nnpm +registry\.npmjs\.org +Authorization +\{\} +NPM +file \/\S+\/npm-token \(readable\)\n/,
    );
    assert.ok(!out.stdout.includes("gone"), "alice's secrets replace the sandbox's");
    assert.match(
      out.stdout,
      /\nwarning: secret 'npm' is for host 'registry\.npmjs\.org', which the egress list \(sandbox\.egress, users\.alice\.egress\) does not allow: it would never be sent\n/,
    );
    assert.match(out.stdout, /\nwarning: egress\.extra_ca '\/\S+\/no-ca\.pem' is missing here\n/);
    for (const line of lines.filter((l) => l.startsWith("warning: "))) {
      assert.ok(!line.endsWith("."), line);
    }
    // Without the variable, its secret is unset: a warning, still no value.
    const unset = await cli(["egress", "plan", "--user", "carol", "--tenant", "t2"]);
    assert.equal(unset.code, 0, unset.stderr);
    noSecrets(unset);
    assert.match(unset.stdout, /^Egress of user 'carol' \(tenant 't2'\)/);
    assert.match(unset.stdout, /attached +yes \(sandbox\.egress\)\n/);
    assert.match(unset.stdout, /\(unset\)/);
    assert.match(
      unset.stdout,
      /warning: secret 'github' reads host variable WAFFLE_TEST_EGRESS_TOKEN, which is unset here\n/,
    );
    assert.match(
      unset.stdout,
      /warning: secret 'gone' reads file '\/\S+\/missing', which is missing here\n/,
    );
  });
});

Deno.test("waffle egress plan --json carries the same as one object", async () => {
  await withHome(policy, async ({ file, cli }) => {
    const out = await cli(["egress", "plan", "--user", "alice", "--json"], {
      WAFFLE_TEST_EGRESS_TOKEN: TOKEN_VALUE,
    });
    assert.equal(out.code, 0, out.stderr);
    noSecrets(out);
    const report = JSON.parse(out.stdout);
    assert.equal(report.config, file);
    assert.deepEqual(report.subject, {
      tenant: "default",
      user: "alice",
      server: null,
      group: null,
      cron: null,
    });
    assert.equal(report.attached, true);
    assert.equal(report.attachKey, "sandbox.egress");
    assert.equal(report.detached, null);
    assert.deepEqual(report.keys, ["sandbox.egress", "users.alice.egress"]);
    assert.deepEqual(report.allow, [
      { kind: "name", host: "api.github.com", ports: [443], text: "api.github.com:443" },
      { kind: "suffix", host: "pypi.org", ports: [80, 443], text: "*.pypi.org" },
    ]);
    assert.deepEqual(report.addresses, ["127.0.0.1/32"]);
    assert.deepEqual(report.secrets[0], {
      name: "github",
      hosts: ["api.github.com"],
      header: "Authorization",
      format: "Bearer {}",
      env: "GITHUB_TOKEN",
      source: { env: "WAFFLE_TEST_EGRESS_TOKEN" },
      status: "set",
    });
    assert.equal(report.secrets[1].status, "readable");
    assert.equal(report.settings.maxConnections, 8);
    assert.equal(report.settings.bytesPerSecond, 65536);
    assert.deepEqual(report.settings.hosts, { "git.internal": "10.0.0.5" });
    assert.deepEqual(report.warnings.map((w: { kind: string }) => w.kind), [
      "secret-host-not-allowed",
      "extra-ca-unreadable",
    ]);
  });
});

Deno.test("waffle egress plan --server shows a restricted session's own composed list", async () => {
  await withHome(policy, async ({ cli }) => {
    const out = await cli([
      "egress",
      "plan",
      "--user",
      "alice",
      "--server",
      "fetch",
      "--cron",
      "nightly",
    ]);
    assert.equal(out.code, 0, out.stderr);
    assert.match(
      out.stdout,
      /^Egress of server 'fetch' for user 'alice' \(tenant 'default'\), cron 'nightly'/,
    );
    assert.match(out.stdout, /attached +yes \(mcp\.fetch\.egress, groups\.main\.egress\)\n/);
    assert.match(out.stdout, /allow +api\.github\.com:443\n {2}addresses/);
    assert.match(out.stdout, /\ngithub +api\.github\.com/);
    const json = JSON.parse(
      (await cli(["egress", "plan", "--user", "alice", "--server", "fetch", "--json"])).stdout,
    );
    assert.deepEqual(json.keys, ["mcp.fetch.egress"]);
    assert.equal(json.attachKey, "mcp.fetch.egress");
    assert.deepEqual(json.subject.group, null);
    assert.deepEqual(json.allow.map((e: { text: string }) => e.text), [
      "*.example.com",
      "api.github.com",
    ]);
    const quiet = await cli(["egress", "plan", "--user", "alice", "--server", "quiet"]);
    assert.equal(quiet.code, 0, quiet.stderr);
    assert.match(
      quiet.stdout,
      /attached +no: server 'quiet' has no network and reaches nothing; \[mcp\.quiet\] egress would attach the egress proxy\n/,
    );
  });
});

Deno.test("waffle egress plan without [sandbox] egress says none and which key would attach it", async () => {
  const bridge = (): string => `[sandbox]\nnetwork = "bridge"\n`;
  await withHome(() => "", async ({ cli }) => {
    const out = await cli(["egress", "plan", "--user", "alice"]);
    assert.equal(out.code, 0, out.stderr);
    assert.match(
      out.stdout,
      /attached +no: the sandbox has network "none" and reaches nothing; \[sandbox\] egress would attach the egress proxy\n/,
    );
    assert.match(out.stdout, /caps +max_connections 64, bytes_per_second 0 \(no cap\)\n/);
    assert.ok(!out.stdout.includes("warning:"), out.stdout);
    const json = JSON.parse((await cli(["egress", "plan", "--user", "alice", "--json"])).stdout);
    assert.equal(json.attached, false);
    assert.equal(json.attachKey, "sandbox.egress");
    assert.deepEqual([json.allow, json.secrets, json.keys, json.warnings], [[], [], [], []]);
  });
  await withHome(bridge, async ({ cli }) => {
    const out = await cli(["egress", "plan", "--user", "alice"]);
    assert.match(
      out.stdout,
      /attached +no: the sandbox has network "bridge" \(sandbox\.network\) and reaches anything directly/,
    );
  });
});

Deno.test("waffle egress plan refuses bad flags, users and servers in one usage line", async () => {
  await withHome(policy, async ({ file, cli }) => {
    const cases: [string[], RegExp][] = [
      [
        ["egress", "plan"],
        /^waffle: Missing --user U: egress is planned for one user's sandbox or session\n$/,
      ],
      [["egress", "plan", "--user", "a", "--bogus"], /^waffle: Unknown option '--bogus'/],
      [["egress", "plan", "--user", "a", "extra"], /^waffle: Unexpected argument 'extra'\n$/],
      [["egress", "plan", "--user", "a b"], /^waffle: Invalid user id 'a b': use 1-128 of/],
      [
        ["egress", "plan", "--user", "a", "--group", "main"],
        /^waffle: --group and --cron are for a server's session: give --server S too\n$/,
      ],
      [[
        "egress",
        "plan",
        "--user",
        "a",
        "--server",
        "fetch",
        "--group",
        "main",
        "--cron",
        "nightly",
      ], /^waffle: Give --group G or --cron J, not both\n$/],
      [
        ["egress", "plan", "--user", "a", "--server", "ghost"],
        new RegExp(
          `^waffle: Unknown MCP server 'ghost' \\('${file}'\\); configured: 'fetch', 'quiet', 'shell', 'local'\\n$`,
        ),
      ],
      [
        ["egress", "plan", "--user", "a", "--server", "shell"],
        /^waffle: Server 'shell' has authority "sandbox": it shares the user sandbox's egress \(sandbox\.egress\)/,
      ],
      [
        ["egress", "plan", "--user", "a", "--server", "local"],
        /^waffle: Server 'local' has authority "host": it has the host's network/,
      ],
      [
        ["egress", "plan", "--user", "a", "--server", "fetch", "--cron", "weekly"],
        /^waffle: Unknown cron job 'weekly'/,
      ],
      [["egress", "nope"], /^waffle: Unknown command 'egress nope'; run 'waffle egress --help'\n$/],
    ];
    for (const [args, stderr] of cases) {
      const out = await cli(args);
      assert.equal(out.code, 125, `${args.join(" ")}: ${out.stderr}`);
      assert.match(out.stderr, stderr, args.join(" "));
      assert.equal(out.stderr.split("\n").length, 2, out.stderr);
      assert.equal(out.stdout, "");
    }
  });
  await withHome(() => `[sandbox]\negress = ["*.com"]\n`, async ({ file, cli }) => {
    const out = await cli(["egress", "plan", "--user", "a"]);
    assert.equal(out.code, 125);
    assert.equal(
      out.stderr,
      `waffle: Config file '${file}': 'sandbox.egress[0]' is not a valid egress entry (too broad: a wildcard needs at least two labels after '*.', such as '*.example.com'), found "*.com"\n`,
    );
  });
});

Deno.test("waffle egress --help and waffle egress plan --help; waffle --help lists egress", async () => {
  const top = await run(["--help"]);
  assert.equal(top.code, 0);
  assert.match(top.stdout, /\n {2}egress +plan what a sandbox may reach/);
  const egress = await run(["egress", "--help"]);
  assert.equal(egress.code, 0);
  assert.match(egress.stdout, /^Usage: waffle egress <command> \[options\]\n/);
  assert.match(egress.stdout, /\n {2}plan +show what a sandbox/);
  const bare = await run(["egress"]);
  assert.equal(bare.code, 125);
  assert.equal(bare.stdout, egress.stdout);
  const plan = await run(["egress", "plan", "--help"]);
  assert.equal(plan.code, 0);
  assert.match(plan.stdout, /^Usage: waffle egress plan --user U \[--tenant T\] \[--server S/);
  assert.match(plan.stdout, /never\nits value/);
});
