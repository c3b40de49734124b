/**
 * The egress policy of `waffle.toml` (lib/config/egress_{schema,checks,compose}.ts):
 * its keys and their one-line errors, the composition of one identity's policy by
 * intersection, and the launch plan's egress rules. Deterministic: no
 * Docker, nothing is started.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadWaffleConfig, sandboxToml, type WaffleConfig } from "../lib/config/config.ts";
import { UsageError } from "../lib/errors.ts";
import { formatEntry, parseEntry } from "../lib/config/egress_entries.ts";
import { egressPolicy, sandboxEgress, serverEgress } from "../lib/config/egress_compose.ts";
import { type LaunchPlan, planLaunch } from "../lib/mcp/plan.ts";
import { runCli } from "../lib/cli/mod.ts";
import type { CliIo } from "../lib/cli/io.ts";

const POLICY = `[sandbox]
egress = ["api.github.com", "*.pypi.org", "files.pythonhosted.org:443", "API.github.com:8443"]
egress_addresses = ["127.0.0.1", "10.0.0.0/8", "FD00::/8"]
egress_allow_host_loopback = true
secrets = ["github", "npm"]

[users.alice]
egress = ["*.github.com:443", "*.pypi.org"]
secrets = ["github"]

[users."bob@example.com"]
secrets = []

[secrets.github]
from_env = "GITHUB_TOKEN"
hosts = ["API.github.com."]
header = "Authorization"
format = "Bearer {}"

[secrets.npm-token]
from_file = "/etc/waffle/npm-token"
hosts = ["registry.npmjs.org"]
header = "Authorization"

[secrets.npm]
from_file = "/etc/waffle/npm"
hosts = ["registry.npmjs.org"]
header = "X-Npm-Token"
env = "NPM_PLACEHOLDER"

[egress]
max_connections = 16
bytes_per_second = 1048576
extra_ca = "/etc/waffle/corp-ca.pem"

[egress.hosts]
"Git.Internal." = "10.0.0.5"
"v6.internal" = "FD00::0005"

[mcp.fetch]
command = "/usr/local/bin/fetch"
execution = "sandbox"
authority = "restricted"
egress = ["*.example.com", "api.github.com", "*.pypi.org:443"]
egress_addresses = ["10.1.0.0/16"]
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
egress = ["api.github.com", "*.pypi.org"]

[groups.ops]
mode = "host"

[groups.github]
egress = ["*.github.com"]

[cron.nightly]
group = "main"
egress = ["api.github.com:443", "docs.example.com"]

[cron.offline]
group = "ops"
network = "none"

[cron.pypi]
group = "ops"
egress = ["*.pypi.org"]
`;

async function withConfig<T>(
  toml: string,
  fn: (config: WaffleConfig, paths: { home: string; file: string }) => T | Promise<T>,
): Promise<T> {
  const home = await Deno.makeTempDir({ prefix: "waffle-egress-" });
  try {
    const file = join(home, "waffle.toml");
    await Deno.writeTextFile(file, toml);
    return await fn(loadWaffleConfig({ configPath: file, overrides: { home } }), { home, file });
  } finally {
    await Deno.remove(home, { recursive: true });
  }
}

const texts = (list: readonly { kind: string; host: string; ports: number[] }[]): string[] =>
  list.map((entry) => formatEntry(entry as Parameters<typeof formatEntry>[0]));

function server(plan: LaunchPlan, name: string): LaunchPlan["servers"][number] {
  const found = plan.servers.find((s) => s.name === name);
  assert.ok(found, `server ${name} is in the plan`);
  return found;
}

Deno.test("loadWaffleConfig() reads the egress keys in canonical form, defaults filled in", async () => {
  await withConfig(POLICY, (config) => {
    assert.deepEqual(texts(config.sandbox.egress!), [
      "api.github.com:80,443,8443",
      "*.pypi.org",
      "files.pythonhosted.org:443",
    ]);
    assert.deepEqual(config.sandbox.egressAddresses, ["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"]);
    assert.deepEqual(config.sandbox.secrets, ["github", "npm"]);
    assert.deepEqual(config.policy.secrets.github, {
      name: "github",
      source: { env: "GITHUB_TOKEN" },
      hosts: ["api.github.com"],
      header: "Authorization",
      format: "Bearer {}",
      env: "GITHUB_TOKEN",
    });
    assert.deepEqual(config.policy.secrets["npm-token"]!.env, "NPM_TOKEN"); // the table name
    assert.deepEqual(config.policy.secrets["npm-token"]!.format, "{}");
    assert.deepEqual(config.policy.secrets.npm!.env, "NPM_PLACEHOLDER");
    assert.deepEqual(config.policy.secrets.npm!.source, { file: "/etc/waffle/npm" });
    assert.deepEqual(texts(config.policy.users.alice!.egress!), ["*.github.com:443", "*.pypi.org"]);
    assert.deepEqual(config.policy.users["bob@example.com"], {
      name: "bob@example.com",
      secrets: [],
    });
    assert.deepEqual(config.egress, {
      maxConnections: 16,
      bytesPerSecond: 1048576,
      extraCa: "/etc/waffle/corp-ca.pem",
      hosts: { "git.internal": "10.0.0.5", "v6.internal": "fd00::5" },
    });
    assert.deepEqual(config.policy.servers.fetch!.egressAddresses, ["10.1.0.0/16"]);
    assert.deepEqual(config.policy.servers.fetch!.secrets, ["github"]);
    assert.equal(config.policy.servers.quiet!.egress, undefined);
    assert.deepEqual(texts(config.policy.groups.main!.egress!), ["api.github.com", "*.pypi.org"]);
    assert.equal(config.policy.groups.ops!.egress, undefined);
    assert.deepEqual(texts(config.policy.cron.nightly!.egress!), [
      "api.github.com:443",
      "docs.example.com",
    ]);
  });
  await withConfig("", (config) => {
    assert.equal(config.sandbox.egress, undefined);
    assert.deepEqual(config.sandbox.egressAddresses, []);
    assert.deepEqual(config.sandbox.secrets, []);
    assert.deepEqual(config.egress, { maxConnections: 64, bytesPerSecond: 0, hosts: {} });
  });
});

Deno.test("egressPolicy() of a sandbox: [sandbox] egress narrowed by the user's, the user's secrets", async () => {
  await withConfig(POLICY, (config) => {
    const carol = egressPolicy(config, { tenant: "default", user: "carol" })!;
    assert.deepEqual(texts(carol.allow), texts(config.sandbox.egress!));
    assert.deepEqual(carol.addresses, ["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"]);
    assert.deepEqual(carol.secrets.map((s) => s.name), ["github", "npm"]);
    const alice = egressPolicy(config, { tenant: "t1", user: "alice" })!;
    assert.deepEqual(texts(alice.allow), ["api.github.com:443", "*.pypi.org"]);
    assert.deepEqual(alice.secrets.map((s) => s.name), ["github"]);
    assert.deepEqual(alice.addresses, carol.addresses);
    const bob = egressPolicy(config, { tenant: "default", user: "bob@example.com" })!;
    assert.deepEqual(texts(bob.allow), texts(config.sandbox.egress!));
    assert.deepEqual(bob.secrets, []);
    assert.deepEqual(sandboxEgress(config, "alice")!.keys, [
      "sandbox.egress",
      "users.alice.egress",
    ]);
    assert.deepEqual(sandboxEgress(config)!.keys, ["sandbox.egress"]);
    // A sandbox server's session is its sandbox's identity.
    assert.deepEqual(
      egressPolicy(config, { tenant: "default", user: "alice", server: "shell", cron: "nightly" }),
      alice,
    );
    assert.equal(
      egressPolicy(config, { tenant: "default", user: "alice", server: "local" }),
      undefined,
    );
  });
  await withConfig(`[sandbox]\nnetwork = "bridge"\n`, (config) => {
    assert.equal(egressPolicy(config, { tenant: "default", user: "alice" }), undefined);
    assert.equal(sandboxEgress(config, "alice"), undefined);
  });
});

Deno.test("egressPolicy() of a restricted server: its own list narrowed by its group's and cron job's, never the sandbox's", async () => {
  await withConfig(POLICY, (config) => {
    const who = { tenant: "default", user: "alice", server: "fetch" };
    const alone = egressPolicy(config, who)!;
    assert.deepEqual(texts(alone.allow), ["*.example.com", "api.github.com", "*.pypi.org:443"]);
    assert.deepEqual(alone.addresses, ["10.1.0.0/16"]);
    assert.deepEqual(alone.secrets.map((s) => s.name), ["github"]);
    const main = egressPolicy(config, { ...who, group: "main" })!;
    assert.deepEqual(texts(main.allow), ["api.github.com", "*.pypi.org:443"]);
    const nightly = egressPolicy(config, { ...who, cron: "nightly" })!;
    assert.deepEqual(texts(nightly.allow), ["api.github.com:443"]); // group main has no docs.example.com
    assert.deepEqual(serverEgress(config, { server: "fetch", cron: "nightly" })!.keys, [
      "mcp.fetch.egress",
      "groups.main.egress",
      "cron.nightly.egress",
    ]);
    const github = egressPolicy(config, { ...who, group: "github" })!;
    assert.deepEqual(texts(github.allow), ["api.github.com"]);
    assert.equal(egressPolicy(config, { ...who, server: "quiet" }), undefined);
    assert.equal(egressPolicy(config, { ...who, cron: "offline" }), undefined, "network none");
    assert.deepEqual(texts(egressPolicy(config, { ...who, cron: "pypi" })!.allow), [
      "*.pypi.org:443",
    ]);
  });
});

Deno.test("egressPolicy() refuses bad ids, unknown servers, groups and cron jobs, in one line", async () => {
  await withConfig(POLICY, (config) => {
    const cases: [Parameters<typeof egressPolicy>[1], RegExp][] = [
      [{ tenant: "default", user: "a b" }, /^Invalid user id 'a b'/],
      [{ tenant: "x/y", user: "alice" }, /^Invalid tenant id 'x\/y'/],
      [
        { tenant: "default", user: "alice", server: "ghost" },
        /^Unknown MCP server 'ghost'; configured: 'fetch'/,
      ],
      [
        { tenant: "default", user: "alice", server: "fetch", group: "nope" },
        /^Unknown group 'nope'/,
      ],
      [
        { tenant: "default", user: "alice", server: "fetch", cron: "weekly" },
        /^Unknown cron job 'weekly'/,
      ],
      [
        { tenant: "default", user: "alice", server: "fetch", group: "main", cron: "nightly" },
        /^Choose a group or a cron job, not both/,
      ],
      [
        { tenant: "default", user: "alice", group: "main" },
        /applies only to an MCP server's session/,
      ],
    ];
    for (const [who, message] of cases) {
      assert.throws(() => egressPolicy(config, who), (error: unknown) => {
        assert.ok(error instanceof UsageError, String(error));
        assert.match(error.message, message);
        assert.ok(!error.message.includes("\n"));
        return true;
      });
    }
  });
});

const SECRET =
  `[secrets.gh]\nfrom_env = "GITHUB_TOKEN"\nhosts = ["api.github.com"]\nheader = "Authorization"\n`;
const RESTRICTED = `execution = "sandbox"\nauthority = "restricted"\ncommand = "/x"\n`;
const EGRESS = `[sandbox]\negress = ["api.github.com"]\n`;

Deno.test("loadWaffleConfig() names the file, key and value of every bad egress key in one line", async () => {
  const cases: [string, string, RegExp][] = [
    [
      `[sandbox]\negress = ["*."]\n`,
      "sandbox.egress[0]",
      /not a valid egress entry \(a wildcard needs a domain after '\*\.'\), found "\*\."$/,
    ],
    [
      `[sandbox]\negress = ["a.com", "*.com"]\n`,
      "sandbox.egress[1]",
      /too broad.*found "\*\.com"$/,
    ],
    [`[sandbox]\negress = ["*"]\n`, "sandbox.egress[0]", /too broad/],
    [
      `[sandbox]\negress = ["01.2.3.4"]\n`,
      "sandbox.egress[0]",
      /dotted decimal.*found "01\.2\.3\.4"/,
    ],
    [`[sandbox]\negress = ["a.com:0"]\n`, "sandbox.egress[0]", /port '0'/],
    [
      `[sandbox]\negress = "api.github.com"\n`,
      "sandbox.egress",
      /must be an array, found "api\.github\.com"/,
    ],
    [
      `[sandbox]\nnetwork = "bridge"\negress = ["a.com"]\n`,
      "sandbox.egress",
      /must be absent when sandbox\.network is "bridge" \(egress needs network "none".*found \["a\.com"\]/,
    ],
    [
      `${EGRESS}egress_addresses = ["10.1.0.0/8"]\n`,
      "sandbox.egress_addresses[0]",
      /did you mean '10\.0\.0\.0\/8'/,
    ],
    [
      `${EGRESS}egress_addresses = ["localhost"]\n`,
      "sandbox.egress_addresses[0]",
      /not a CIDR or IP address.*found "localhost"/,
    ],
    [
      `[sandbox]\negress_addresses = ["10.0.0.0/8"]\n`,
      "sandbox.egress_addresses",
      /needs 'sandbox\.egress' beside it.*found \["10\.0\.0\.0\/8"\]/,
    ],
    [
      `[sandbox]\nsecrets = ["gh"]\n${SECRET}`,
      "sandbox.secrets",
      /needs 'sandbox\.egress' beside it/,
    ],
    [
      `${EGRESS}secrets = ["ghost"]\n${SECRET}`,
      "sandbox.secrets[0]",
      /declared \[secrets\.<name>\] table \('gh'\), found "ghost"/,
    ],
    [`${EGRESS}secrets = "gh"\n${SECRET}`, "sandbox.secrets", /must be an array/],
    [
      `${EGRESS}egres = []\n`,
      "sandbox.egres",
      /is not a known key \(expected one of: .*egress, egress_addresses, secrets/,
    ],
    [`[users."a b"]\n`, "users.a b", /name is not a user id \(use 1-128 of .*\), found "a b"/],
    [`[users.__proto__]\n`, "users.__proto__", /not a user id/],
    [
      `[users.alice]\negress = ["a.com"]\n`,
      "users.alice.egress",
      /narrows 'sandbox\.egress', which is not set \(nothing to narrow\), found \["a\.com"\]/,
    ],
    [`${EGRESS}[users.alice]\negress = ["*"]\n`, "users.alice.egress[0]", /too broad/],
    [
      `${EGRESS}secrets = ["gh"]\n${SECRET}[users.alice]\nsecrets = ["gh", "npm"]\n`,
      "users.alice.secrets[1]",
      /must be one of sandbox\.secrets \["gh"\], found "npm"/,
    ],
    [
      `[users.alice]\ntools = []\n`,
      "users.alice.tools",
      /is not a known key \(expected one of: egress, secrets\)/,
    ],
    [`[groups.main]\negress = ["bad host"]\n`, "groups.main.egress[0]", /not a URL/],
    [
      `[groups.main]\n[cron.n]\ngroup = "main"\negress = ["*.com"]\n`,
      "cron.n.egress[0]",
      /too broad/,
    ],
    [
      `[mcp.s]\ncommand = "/x"\nexecution = "sandbox"\nauthority = "sandbox"\negress = ["a.com"]\n`,
      "mcp.s.egress",
      /is only for authority "restricted" \(a sandbox server shares its sandbox's egress: set \[sandbox\] egress\), found \["a\.com"\]/,
    ],
    [
      `[mcp.h]\ncommand = "/x"\nexecution = "host"\nauthority = "host"\nsecrets = ["gh"]\n${SECRET}`,
      "mcp.h.secrets",
      /is only for authority "restricted" \(a host server has the host's network\)/,
    ],
    [
      `[mcp.h]\ncommand = "/x"\nexecution = "host"\nauthority = "host"\negress_addresses = []\n`,
      "mcp.h.egress_addresses",
      /only for authority "restricted"/,
    ],
    [
      `[mcp.r]\n${RESTRICTED}secrets = ["gh"]\n${SECRET}`,
      "mcp.r.secrets",
      /needs 'mcp\.r\.egress' beside it/,
    ],
    [
      `[mcp.r]\n${RESTRICTED}egress = ["a.com"]\negress_addresses = ["x"]\n`,
      "mcp.r.egress_addresses[0]",
      /not a CIDR/,
    ],
    [
      `[mcp.r]\n${RESTRICTED}egress = ["a.com"]\nsecrets = ["ghost"]\n`,
      "mcp.r.secrets[0]",
      /declared \[secrets\.<name>\] table \(none\), found "ghost"/,
    ],
    [`[mcp.r]\n${RESTRICTED}egress = ["a.com:x"]\n`, "mcp.r.egress[0]", /port 'x'/],
    [
      `[secrets.gh]\nfrom_env = "A"\nfrom_file = "/f"\nhosts = ["a.com"]\nheader = "X"\n`,
      "secrets.gh.from_file",
      /must be absent when 'secrets\.gh\.from_env' is set.*found "\/f"/,
    ],
    [
      `[secrets.gh]\nhosts = ["a.com"]\nheader = "X"\n`,
      "secrets.gh.from_env",
      /or 'secrets\.gh\.from_file' must be set .*found neither/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = []\nheader = "X"\n`,
      "secrets.gh.hosts",
      /must have >= 1 entries, found \[\]/,
    ],
    [`[secrets.gh]\nfrom_env = "A"\nheader = "X"\n`, "secrets.gh.hosts", /found nothing/],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["*.github.com"]\nheader = "X"\n`,
      "secrets.gh.hosts[0]",
      /must be an exact host name \(no wildcard, IP address or port\), found "\*\.github\.com"/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["api.github.com:443"]\nheader = "X"\n`,
      "secrets.gh.hosts[0]",
      /exact host name/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["10.0.0.1"]\nheader = "X"\n`,
      "secrets.gh.hosts[0]",
      /exact host name/,
    ],
    [`[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\n`, "secrets.gh.header", /found nothing/],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "Host"\n`,
      "secrets.gh.header",
      /must not be Host, Content-Length, Transfer-Encoding, Connection, a hop-by-hop or a Proxy-\* header.*found "Host"/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "proxy-authorization"\n`,
      "secrets.gh.header",
      /Proxy-\*/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "Transfer-Encoding"\n`,
      "secrets.gh.header",
      /must not be/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "Keep-Alive"\n`,
      "secrets.gh.header",
      /hop-by-hop/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "X Token"\n`,
      "secrets.gh.header",
      /must be an HTTP header name/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "X"\nformat = "Bearer"\n`,
      "secrets.gh.format",
      /must contain '\{\}' \(the secret\) exactly once, found "Bearer"/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "X"\nformat = "{} {}"\n`,
      "secrets.gh.format",
      /exactly once/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "X"\nformat = "Bearer {}\\r\\nX: y"\n`,
      "secrets.gh.format",
      /must not contain CR, LF, NUL/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "X"\nformat = "{}\\u0000"\n`,
      "secrets.gh.format",
      /NUL/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "X"\nenv = "1X"\n`,
      "secrets.gh.env",
      /variable name/,
    ],
    [
      `[secrets.gh]\nfrom_env = "bad-name"\nhosts = ["a.com"]\nheader = "X"\n`,
      "secrets.gh.from_env",
      /variable name/,
    ],
    [
      `[secrets.gh]\nfrom_file = "token"\nhosts = ["a.com"]\nheader = "X"\n`,
      "secrets.gh.from_file",
      /must be an absolute path, found "token"/,
    ],
    [
      `[secrets.1pass]\nfrom_file = "/t"\nhosts = ["a.com"]\nheader = "X"\n`,
      "secrets.1pass.env",
      /must be set: the default from the table name, "1PASS", is not a variable name/,
    ],
    [
      `[secrets."bad name"]\nfrom_file = "/t"\nhosts = ["a.com"]\nheader = "X"\n`,
      "secrets.bad name",
      /name must be 1-64 letters/,
    ],
    [
      `[secrets.gh]\nfrom_env = "A"\nhosts = ["a.com"]\nheader = "X"\nvalue = "s3cr3t"\n`,
      "secrets.gh.value",
      /is not a known key \(expected one of: from_env, from_file, hosts, header, format, env\)/,
    ],
    [
      `${EGRESS}secrets = ["gh", "gh2"]\n${SECRET}[secrets.gh2]\nfrom_env = "B"\nhosts = ["a.com"]\nheader = "X"\nenv = "GITHUB_TOKEN"\n`,
      "sandbox.secrets[1]",
      /puts its placeholder in GITHUB_TOKEN, as secret 'gh' does/,
    ],
    [
      `${EGRESS}env = ["LANG", "GITHUB_TOKEN"]\n${SECRET}`,
      "sandbox.env",
      /must not take host variable GITHUB_TOKEN: it holds secret 'gh' \(secrets\.gh\.from_env\), whose value would enter the container, found \["LANG","GITHUB_TOKEN"\]/,
    ],
    [
      `${EGRESS}env = ["GH"]\nsecrets = ["gh"]\n[secrets.gh]\nfrom_file = "/t"\nhosts = ["a.com"]\nheader = "X"\nenv = "GH"\n`,
      "sandbox.env",
      /must not set GH: it holds the placeholder of secret 'gh'/,
    ],
    [
      `[mcp.r]\n${RESTRICTED}egress = ["a.com"]\nsecrets = ["gh"]\nenv = { T = { host = "GITHUB_TOKEN" } }\n${SECRET}`,
      "mcp.r.env",
      /must not take host variable GITHUB_TOKEN/,
    ],
    [
      `[mcp.r]\n${RESTRICTED}egress = ["a.com"]\nsecrets = ["gh"]\nenv = { GITHUB_TOKEN = "x" }\n${SECRET}`,
      "mcp.r.env",
      /must not set GITHUB_TOKEN: it holds the placeholder/,
    ],
    [`[egress]\nmax_connections = 0\n`, "egress.max_connections", /must be >= 1, found 0/],
    [`[egress]\nmax_connections = 5000\n`, "egress.max_connections", /must be <= 4096, found 5000/],
    [`[egress]\nmax_connections = 1.5\n`, "egress.max_connections", /integer/],
    [`[egress]\nbytes_per_second = -1\n`, "egress.bytes_per_second", /must be >= 0, found -1/],
    [
      `[egress]\nextra_ca = "ca.pem"\n`,
      "egress.extra_ca",
      /must be an absolute path, found "ca\.pem"/,
    ],
    [
      `[egress.hosts]\n"git.internal" = "not-an-ip"\n`,
      "egress.hosts.git.internal",
      /must be an IP address.*found "not-an-ip"/,
    ],
    [
      `[egress.hosts]\n"git.internal" = "010.0.0.1"\n`,
      "egress.hosts.git.internal",
      /must be an IP address/,
    ],
    [
      `[egress.hosts]\n"*.x.com" = "1.2.3.4"\n`,
      "egress.hosts.*.x.com",
      /name must be an exact host name/,
    ],
    [`[egress.hosts]\n__proto__ = "1.2.3.4"\n`, "egress.hosts.__proto__", /not a valid host name/],
    [
      `[egress]\nproxy = "x"\n`,
      "egress.proxy",
      /is not a known key \(expected one of: max_connections, bytes_per_second, extra_ca, hosts\)/,
    ],
    [
      `[egres]\n`,
      "egres",
      /is not a known key \(expected one of: .*users, secrets, egress, serve, templates, backend\)/,
    ],
  ];
  for (const [toml, key, detail] of cases) {
    const home = await Deno.makeTempDir({ prefix: "waffle-egress-" });
    try {
      const file = join(home, "waffle.toml");
      await Deno.writeTextFile(file, toml);
      assert.throws(
        () => loadWaffleConfig({ configPath: file, overrides: { home } }),
        (error: unknown) => {
          assert.ok(error instanceof UsageError, `${key}: ${error}`);
          assert.ok(
            error.message.startsWith(`Config file '${file}': '${key}' `),
            `${key}: ${error.message}`,
          );
          assert.ok(!error.message.includes("\n"), error.message);
          assert.ok(!error.message.endsWith("."), error.message);
          assert.match(error.message, detail, key);
          return true;
        },
        key,
      );
    } finally {
      await Deno.remove(home, { recursive: true });
    }
  }
});

Deno.test("loadWaffleConfig() refuses egress_addresses covering the host's loopback unless egress_allow_host_loopback = true stands beside it", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-egress-" });
  try {
    const file = join(home, "waffle.toml");
    const load = async (toml: string): Promise<WaffleConfig> => {
      await Deno.writeTextFile(file, toml);
      return loadWaffleConfig({ configPath: file, overrides: { home } });
    };
    // Each covers a host loopback address (the second value: the part it covers).
    const covering: [string, string][] = [
      ["127.0.0.1", "127.0.0.1/32"],
      ["127.255.0.0/16", "127.255.0.0/16"],
      ["126.0.0.0/7", "127.0.0.0/8"],
      ["0.0.0.0/0", "127.0.0.0/8"],
      ["0.0.0.0", "0.0.0.0/32"],
      ["::1", "::1/128"],
      ["::", "::/128"],
      ["::/0", "::1/128"],
      ["::ffff:127.0.0.1", "127.0.0.1/32"],
      ["::ffff:0:0/96", "127.0.0.0/8"],
      ["::127.0.0.1", "::7f00:1/128"],
      ["64:ff9b::7f00:1", "64:ff9b::7f00:1/128"],
      ["2002:7f00:1::/48", "2002:7f00:1::/48"],
    ];
    for (const [cidr, covered] of covering) {
      const addresses = JSON.stringify(["10.0.0.0/8", cidr]);
      for (const allow of ["", "egress_allow_host_loopback = false\n"]) {
        await assert.rejects(
          () => load(`${EGRESS}egress_addresses = ${addresses}\n${allow}`),
          (error: unknown) => {
            assert.ok(error instanceof UsageError, String(error));
            assert.ok(!error.message.includes("\n"), error.message);
            assert.ok(
              error.message.startsWith(
                `Config file '${file}': 'sandbox.egress_addresses' holds "`,
              ),
              error.message,
            );
            assert.ok(
              error.message.includes(`, which covers the host's loopback (${covered}): `),
              `${cidr}: ${error.message}`,
            );
            assert.match(
              error.message,
              /every service listening on the host's loopback \(waffle mcp serve included\) would be open to every sandbox; set 'sandbox\.egress_allow_host_loopback = true' to allow that, found \["10\.0\.0\.0\/8",/,
            );
            return true;
          },
          cidr,
        );
      }
      const allowed = await load(
        `${EGRESS}egress_addresses = ${addresses}\negress_allow_host_loopback = true\n`,
      );
      assert.equal(allowed.sandbox.egressAllowHostLoopback, true);
      assert.equal(allowed.sandbox.egressAddresses.length, 2, cidr);
    }
    assert.equal(
      await load(`${EGRESS}egress_addresses = ["127.0.0.1"]\n`).then(() => "", (e) => e.message),
      `Config file '${file}': 'sandbox.egress_addresses' holds "127.0.0.1/32", which covers the host's loopback (127.0.0.1/32): the egress proxy has the host's network, so every service listening on the host's loopback (waffle mcp serve included) would be open to every sandbox; set 'sandbox.egress_allow_host_loopback = true' to allow that, found ["127.0.0.1/32"]`,
    );
    // Non-loopback ranges need no second key, whatever else they hold.
    const clear = await load(
      `${EGRESS}egress_addresses = ["10.0.0.0/8", "128.0.0.0/1", "fd00::/8", "::2", "64:ff9b::a00:0/104"]\n`,
    );
    assert.equal(clear.sandbox.egressAllowHostLoopback, false);
    assert.equal(clear.sandbox.egressAddresses.length, 5);

    // A restricted server's own egress_addresses: the same rule, its own key.
    const server = `[mcp.r]\n${RESTRICTED}egress = ["a.com"]\negress_addresses = ["127.0.0.0/8"]\n`;
    await assert.rejects(
      () => load(server),
      (error: unknown) => {
        assert.ok(error instanceof UsageError, String(error));
        assert.match(
          error.message,
          /^Config file '.*': 'mcp\.r\.egress_addresses' holds "127\.0\.0\.0\/8", which covers the host's loopback \(127\.0\.0\.0\/8\): .* would be open to the server; set 'mcp\.r\.egress_allow_host_loopback = true' to allow that, found \["127\.0\.0\.0\/8"\]$/,
        );
        return true;
      },
    );
    // The sandbox's key does not allow it for a server, nor the reverse.
    await assert.rejects(
      () => load(`[sandbox]\negress_allow_host_loopback = true\n${server}`),
      /'mcp\.r\.egress_addresses' holds "127\.0\.0\.0\/8"/,
    );
    await assert.rejects(
      () =>
        load(
          `${EGRESS}egress_addresses = ["::1"]\n[mcp.r]\n${RESTRICTED}egress = ["a.com"]\negress_allow_host_loopback = true\n`,
        ),
      /'sandbox\.egress_addresses' holds "::1\/128"/,
    );
    const open = await load(`${server}egress_allow_host_loopback = true\n`);
    assert.equal(open.policy.servers.r!.egressAllowHostLoopback, true);
    assert.deepEqual(open.policy.servers.r!.egressAddresses, ["127.0.0.0/8"]);
    await assert.rejects(
      () =>
        load(
          `[mcp.h]\ncommand = "/x"\nexecution = "host"\nauthority = "host"\negress_allow_host_loopback = true\n`,
        ),
      /'mcp\.h\.egress_allow_host_loopback' is only for authority "restricted" \(a host server has the host's network\), found true$/,
    );
    await assert.rejects(
      () => load(`${EGRESS}egress_allow_host_loopback = "yes"\n`),
      /'sandbox\.egress_allow_host_loopback' must be true or false, found "yes"$/,
    );

    // A library caller's override meets the same rule, once every layer is applied.
    await Deno.remove(file);
    const egress = [parseEntry("api.github.com:443")];
    throwsUsage(
      () => loadWaffleConfig({ overrides: { home, egress, egressAddresses: ["0.0.0.0/0"] } }),
      /^Invalid setting 'sandbox\.egress_addresses': holds "0\.0\.0\.0\/0", which covers the host's loopback \(127\.0\.0\.0\/8\)/,
    );
    const overridden = loadWaffleConfig({
      overrides: {
        home,
        egress,
        egressAddresses: ["0.0.0.0/0"],
        egressAllowHostLoopback: true,
      },
    });
    assert.deepEqual(overridden.sandbox.egressAddresses, ["0.0.0.0/0"]);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

// Asserts `fn` throws a UsageError whose message matches.
function throwsUsage(fn: () => unknown, message: RegExp): void {
  assert.throws(fn, (error: unknown) => {
    assert.ok(error instanceof UsageError, String(error));
    assert.match(error.message, message);
    return true;
  });
}

Deno.test("loadWaffleConfig() takes egress overrides as canonical entries and checks them after every layer", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-egress-" });
  try {
    const egress = [parseEntry("api.github.com:443")];
    const config = loadWaffleConfig({
      overrides: {
        home,
        egress,
        egressAddresses: ["127.0.0.1/32"],
        egressAllowHostLoopback: true,
      },
    });
    assert.deepEqual(config.sandbox.egress, egress);
    assert.deepEqual(config.sandbox.egressAddresses, ["127.0.0.1/32"]);
    throwsUsage(
      () =>
        loadWaffleConfig({
          overrides: { home, egress: [{ kind: "name", host: "A.com", ports: [443] }] },
        }),
      /^Invalid setting 'egress\[0\]': must be a canonical egress entry/,
    );
    throwsUsage(
      () => loadWaffleConfig({ overrides: { home, egress, network: "bridge" } }),
      /^Invalid setting 'sandbox\.egress': must be absent when sandbox\.network is "bridge"/,
    );
    throwsUsage(
      () => loadWaffleConfig({ overrides: { home, egress, secrets: ["gh"] } }),
      /^Invalid setting 'sandbox\.secrets\[0\]': must name a declared \[secrets\.<name>\] table/,
    );
    const file = join(home, "waffle.toml");
    await Deno.writeTextFile(file, `${EGRESS}${SECRET}`);
    throwsUsage(
      () => loadWaffleConfig({ configPath: file, overrides: { home, network: "bridge" } }),
      new RegExp(
        `^Config file '${file}': 'sandbox\\.egress' must be absent when sandbox\\.network is "bridge"`,
      ),
    );
    // sandboxToml() writes egress as the file reads it.
    const settings = {
      egress: [parseEntry("*.pypi.org:443"), parseEntry("[fd00::1]")],
      secrets: [],
    };
    await Deno.writeTextFile(file, sandboxToml(settings));
    const back = loadWaffleConfig({ configPath: file, overrides: { home } });
    assert.deepEqual(back.sandbox.egress, settings.egress);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("planLaunch() denies a sandbox server whose sandbox reaches beyond the group's or cron job's egress", async () => {
  await withConfig(POLICY, (config) => {
    const nightly = server(planLaunch(config, { cron: "nightly" }), "shell");
    assert.equal(nightly.decision, "denied");
    assert.deepEqual(nightly.reasons, [
      "group 'main' allows egress only to [api.github.com, *.pypi.org] (groups.main.egress) but the user sandbox also allows [api.github.com:8443, files.pythonhosted.org:443] (sandbox.egress)",
      "cron 'nightly' allows egress only to [api.github.com:443, docs.example.com] (cron.nightly.egress) but the user sandbox also allows [api.github.com:80,8443, *.pypi.org, files.pythonhosted.org:443] (sandbox.egress)",
    ]);
    assert.deepEqual(nightly.egress, texts(config.sandbox.egress!));
    // alice's own list is within group main's: the user narrows it enough.
    const alice = server(planLaunch(config, { group: "main", user: "alice" }), "shell");
    assert.equal(alice.decision, "launch", alice.reasons.join("\n"));
    assert.deepEqual(alice.egress, ["api.github.com:443", "*.pypi.org"]);
    const aliceNightly = server(planLaunch(config, { cron: "nightly", user: "alice" }), "shell");
    assert.deepEqual(aliceNightly.reasons, [
      "cron 'nightly' allows egress only to [api.github.com:443, docs.example.com] (cron.nightly.egress) but the user sandbox also allows [*.pypi.org] (sandbox.egress, users.alice.egress)",
    ]);
    // A group without egress narrows nothing.
    const ops = planLaunch(config, { group: "ops" });
    assert.equal(server(ops, "shell").decision, "launch");
    assert.equal(server(ops, "local").egress, "any");
    // A cron job with network "none" refuses a sandbox that reaches something through the proxy.
    const offline = server(planLaunch(config, { cron: "offline" }), "shell");
    assert.equal(offline.decision, "denied");
    assert.match(
      offline.reasons.join("\n"),
      /cron 'offline' requires network "none" \(cron\.offline\.network\) but the user sandbox reaches \[api\.github\.com:80,443,8443, .*\] through the egress proxy \(sandbox\.egress\)/,
    );
    // A host server is denied wherever a group or cron job declares egress.
    const local = server(planLaunch(config, { cron: "pypi" }), "local");
    assert.equal(local.decision, "denied");
    assert.ok(
      local.reasons.includes(
        `cron 'pypi' allows egress only to [*.pypi.org] (cron.pypi.egress); authority "host" has the host's network`,
      ),
      local.reasons.join("\n"),
    );
  });
});

Deno.test("planLaunch() gives restricted servers their composed egress, never denied for it", async () => {
  await withConfig(POLICY, (config) => {
    const nightly = planLaunch(config, { cron: "nightly" });
    assert.equal(server(nightly, "fetch").decision, "launch");
    assert.deepEqual(server(nightly, "fetch").egress, ["api.github.com:443"]);
    assert.equal(server(nightly, "fetch").network, "none");
    assert.equal(server(nightly, "quiet").egress, "none");
    assert.equal(server(planLaunch(config, { cron: "offline" }), "fetch").egress, "none");
    assert.deepEqual(server(planLaunch(config, { group: "main" }), "fetch").egress, [
      "api.github.com",
      "*.pypi.org:443",
    ]);
  });
  const empty = `[groups.main]\negress = ["b.com"]\n[mcp.r]\n${RESTRICTED}egress = ["a.com"]\n`;
  await withConfig(empty, (config) => {
    const r = server(planLaunch(config, { group: "main" }), "r");
    assert.equal(r.decision, "launch");
    assert.deepEqual(r.egress, []);
  });
});

Deno.test("planLaunch() denies sandbox servers of a bridge sandbox under a group or cron egress list", async () => {
  const toml =
    `[sandbox]\nnetwork = "bridge"\n[mcp.shell]\ncommand = "/bin/sh"\nexecution = "sandbox"\nauthority = "sandbox"\n[groups.main]\negress = []\n[groups.free]\n`;
  await withConfig(toml, (config) => {
    const shell = server(planLaunch(config, { group: "main" }), "shell");
    assert.equal(shell.decision, "denied");
    assert.deepEqual(shell.reasons, [
      `group 'main' allows no egress (groups.main.egress) but the user sandbox has network "bridge" (sandbox.network), which reaches anything`,
    ]);
    assert.equal(shell.egress, "any");
    assert.equal(server(planLaunch(config, { group: "free" }), "shell").decision, "launch");
  });
  const none =
    `[mcp.shell]\ncommand = "/bin/sh"\nexecution = "sandbox"\nauthority = "sandbox"\n[groups.main]\negress = []\n`;
  await withConfig(none, (config) => {
    const shell = server(planLaunch(config, { group: "main" }), "shell");
    assert.equal(shell.decision, "launch", "a sandbox without egress reaches nothing");
    assert.equal(shell.egress, "none");
  });
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

Deno.test("waffle mcp plan shows each server's egress in its table and --json", async () => {
  await withConfig(POLICY, async (config, { file }) => {
    const json = captureIo();
    assert.equal(
      await runCli([
        "mcp",
        "plan",
        "--cron",
        "nightly",
        "--user",
        "alice",
        "--json",
        "--config",
        file,
      ], json),
      0,
      json.err(),
    );
    const plan = JSON.parse(json.out()) as LaunchPlan;
    const planned = planLaunch(config, { cron: "nightly", user: "alice" }).servers;
    assert.deepEqual(
      plan.servers.map((s) => [s.name, s.decision, s.egress, s.reasons]),
      planned.map((s) => [s.name, s.decision, s.egress, s.reasons]),
    );
    assert.deepEqual(server(plan, "fetch").egress, ["api.github.com:443"]);
    const text = captureIo();
    assert.equal(
      await runCli(["mcp", "plan", "--group", "ops", "--config", file], text),
      0,
      text.err(),
    );
    assert.match(text.out(), /\bEGRESS\b/);
    assert.match(
      text.out(),
      /fetch\s+launch\s+restricted\s+\S+\s+\S+\s+none\s+\*\.example\.com,api\.github\.com,\*\.pypi\.org:443\s+ro/,
    );
    assert.match(text.out(), /quiet\s+launch\s+restricted\s+\S+\s+\S+\s+none\s+none\s+ro/);
    assert.match(text.out(), /local\s+launch\s+host\s+\S+\s+\S+\s+host\s+any\s+none/);
  });
});
