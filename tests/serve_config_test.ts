/**
 * `waffle.toml`'s `[serve]`, `[serve.tenants.*]` and `[templates.*]`: the
 * defaults, overrides, and a one-line error naming the key and the value
 * for each bad one. Deterministic: nothing is started.
 */
import assert from "node:assert/strict";
import { join } from "../lib/path.ts";
import { loadWaffleConfig, type WaffleConfig } from "../lib/config/config.ts";
import {
  BASE_TEMPLATE_IMAGE,
  DEFAULT_TENANT_LIMITS,
  parseListen,
  tenantLimitsOf,
} from "../lib/config/serve_schema.ts";
import { UsageError } from "../lib/errors.ts";
import { EXIT_WAFFLE } from "../lib/exit_codes.ts";
import { mintCa, mintLeaf } from "../lib/egress/ca.ts";
import { selfCommand } from "../lib/config/self.ts";
import { runCliProcess } from "./_helpers.ts";

async function withConfig<T>(
  toml: string,
  fn: (config: WaffleConfig, file: string) => T | Promise<T>,
): Promise<T> {
  const home = await Deno.makeTempDir({ prefix: "waffle-serve-config-" });
  try {
    const file = join(home, "waffle.toml");
    await Deno.writeTextFile(file, toml);
    return await fn(loadWaffleConfig({ configPath: file, overrides: { home } }), file);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
}

async function refusal(toml: string): Promise<string> {
  const home = await Deno.makeTempDir({ prefix: "waffle-serve-config-" });
  try {
    const file = join(home, "waffle.toml");
    await Deno.writeTextFile(file, toml);
    try {
      loadWaffleConfig({ configPath: file, overrides: { home } });
    } catch (error) {
      assert.ok(error instanceof UsageError, String(error));
      assert.ok(!error.message.includes("\n"), error.message);
      return error.message.replace(`Config file '${file}': `, "");
    }
    throw new Error(`accepted: ${toml}`);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
}

Deno.test("[serve] defaults: loopback port 3000, 300 s of 86400, 64 MiB, 64 streams, base template", async () => {
  await withConfig("", (config) => {
    const serve = config.serve;
    assert.deepEqual(serve.listen, { hostname: "127.0.0.1", port: 3000 });
    assert.equal(serve.domain, undefined);
    assert.equal(serve.defaultTimeoutSeconds, 300);
    assert.equal(serve.maxTimeoutSeconds, 86400);
    assert.equal(serve.maxBodyBytes, 64 * 1024 * 1024);
    assert.equal(serve.maxStreamsPerKey, 64);
    // The connection caps: lib/http's own defaults (it owns them).
    assert.equal(serve.maxConnections, undefined);
    assert.equal(serve.maxConnectionsPerPeer, undefined);
    assert.equal(serve.headerTimeoutSeconds, 10);
    assert.equal(serve.requestTimeoutSeconds, 3600);
    assert.deepEqual([...serve.templates], [["base", BASE_TEMPLATE_IMAGE]]);
    assert.equal(BASE_TEMPLATE_IMAGE, "waffle-base:bookworm");
    assert.deepEqual(tenantLimitsOf(serve, "anyone"), { maxSandboxes: 20, createsPerMinute: 60 });
  });
});

Deno.test("[serve] with no config file at all has the same defaults", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-serve-config-" });
  try {
    const config = loadWaffleConfig({ overrides: { home } });
    assert.deepEqual(config.serve.listen, { hostname: "127.0.0.1", port: 3000 });
    assert.equal(config.serve.templates.get("base"), BASE_TEMPLATE_IMAGE);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("[serve], [serve.tenants.*] and [templates.*] override the defaults", async () => {
  const toml = `
[serve]
listen = "[::1]:8443"
domain = "Sandbox.Example.COM."
default_timeout = 60
max_timeout = 3600
max_body_bytes = 1048576
max_streams_per_key = 8
max_connections = 100
max_connections_per_peer = 10
header_timeout = 5
request_timeout = 120

[serve.tenants.acme]
max_sandboxes = 2
creates_per_minute = 5

[serve.tenants."alice@example.com"]
max_sandboxes = 1

[templates.base]
image = "my-base:1"

[templates.python]
image = "python:3.13-slim"
`;
  await withConfig(toml, (config) => {
    const serve = config.serve;
    assert.deepEqual(serve.listen, { hostname: "::1", port: 8443 });
    assert.equal(serve.domain, "sandbox.example.com");
    assert.equal(serve.defaultTimeoutSeconds, 60);
    assert.equal(serve.maxTimeoutSeconds, 3600);
    assert.equal(serve.maxBodyBytes, 1048576);
    assert.equal(serve.maxStreamsPerKey, 8);
    assert.equal(serve.maxConnections, 100);
    assert.equal(serve.maxConnectionsPerPeer, 10);
    assert.equal(serve.headerTimeoutSeconds, 5);
    assert.equal(serve.requestTimeoutSeconds, 120);
    assert.deepEqual(tenantLimitsOf(serve, "acme"), { maxSandboxes: 2, createsPerMinute: 5 });
    // A tenant table takes the default for what it leaves out; a tenant not listed, all of them.
    assert.deepEqual(tenantLimitsOf(serve, "alice@example.com"), {
      maxSandboxes: 1,
      createsPerMinute: DEFAULT_TENANT_LIMITS.createsPerMinute,
    });
    assert.deepEqual(tenantLimitsOf(serve, "constructor"), { ...DEFAULT_TENANT_LIMITS });
    assert.deepEqual(Object.fromEntries(serve.templates), {
      base: "my-base:1",
      python: "python:3.13-slim",
    });
  });
});

Deno.test("a max_timeout below 300 lowers the default timeout with it", async () => {
  await withConfig("[serve]\nmax_timeout = 120\n", (config) => {
    assert.equal(config.serve.defaultTimeoutSeconds, 120);
  });
});

Deno.test("parseListen() takes addresses and names, and port 0 for any free port", () => {
  assert.deepEqual(parseListen("0.0.0.0:0"), { address: { hostname: "0.0.0.0", port: 0 } });
  assert.deepEqual(parseListen("localhost:3000"), {
    address: { hostname: "localhost", port: 3000 },
  });
  for (const bad of ["3000", "127.0.0.1", ":3000", "::1:3000", "*.x.com:1", "a b:1", "h:65536"]) {
    assert.ok("problem" in parseListen(bad), bad);
  }
});

Deno.test("bad [serve] values are one-line errors naming the key and the value", async () => {
  const cases: [string, string][] = [
    [
      '[serve]\nlisten = "127.0.0.1"',
      `'serve.listen' must be "host:port" (an address or a name, "[v6]:port" for IPv6, port 0-65535), found "127.0.0.1"`,
    ],
    [
      '[serve]\nlisten = "127.0.0.1:70000"',
      `'serve.listen' must be "host:port" (an address or a name, "[v6]:port" for IPv6, port 0-65535), found "127.0.0.1:70000"`,
    ],
    [
      '[serve]\ndomain = "*.example.com"',
      `'serve.domain' must be a DNS name (no wildcard, IP address or port), found "*.example.com"`,
    ],
    [
      '[serve]\ndomain = "10.0.0.1"',
      `'serve.domain' must be a DNS name (no wildcard, IP address or port), found "10.0.0.1"`,
    ],
    ["[serve]\ndefault_timeout = 0", "'serve.default_timeout' must be >= 1, found 0"],
    ["[serve]\ndefault_timeout = 1.5", "'serve.default_timeout' must be an integer, found 1.5"],
    [
      "[serve]\ndefault_timeout = 600\nmax_timeout = 300",
      "'serve.default_timeout' must be <= serve.max_timeout (300), found 600",
    ],
    ["[serve]\nmax_timeout = 2592001", "'serve.max_timeout' must be <= 2592000, found 2592001"],
    ["[serve]\nmax_body_bytes = 10", "'serve.max_body_bytes' must be >= 1024, found 10"],
    [
      '[serve]\nmax_streams_per_key = "64"',
      `'serve.max_streams_per_key' must be a number, found "64"`,
    ],
    [
      "[serve]\nmax_sandboxes = 3",
      "'serve.max_sandboxes' is not a known key (expected one of: listen, domain, default_timeout, max_timeout, max_body_bytes, max_streams_per_key, max_connections, max_connections_per_peer, header_timeout, request_timeout, tenants, keys_file)",
    ],
    ["[serve]\nmax_connections = 0", "'serve.max_connections' must be >= 1, found 0"],
    [
      "[serve]\nmax_connections_per_peer = 1.5",
      "'serve.max_connections_per_peer' must be an integer, found 1.5",
    ],
    [
      "[serve]\nheader_timeout = 60\nrequest_timeout = 30",
      "'serve.header_timeout' must be <= serve.request_timeout (30), found 60",
    ],
    [
      "[serve.tenants.acme]\nmax_sandboxes = 0",
      "'serve.tenants.acme.max_sandboxes' must be >= 1, found 0",
    ],
    [
      "[serve.tenants.acme]\nburst = 3",
      "'serve.tenants.acme.burst' is not a known key (expected one of: max_sandboxes, creates_per_minute)",
    ],
    [
      '[serve.tenants."a/b"]\nmax_sandboxes = 1',
      `'serve.tenants.a/b' name is not a tenant id (use 1-128 of A-Z a-z 0-9 . _ @ + - starting with a letter or digit), found "a/b"`,
    ],
    [
      '[templates."py 3"]\nimage = "python:3"',
      `'templates.py 3' name must be 1-64 letters, digits, '_' or '-', starting with a letter or digit, found "py 3"`,
    ],
    ['[templates.py]\nimage = ""', `'templates.py.image' must not be empty, found ""`],
    [
      '[templates.py]\nimage = "python:3"\ntag = "x"',
      "'templates.py.tag' is not a known key (expected one of: image, warm)",
    ],
    [
      '[templates.py]\nimage = "python:3"\nwarm = 65',
      "'templates.py.warm' must be <= 64, found 65",
    ],
    ['[templates.py]\nimage = "python:3"\nwarm = -1', "'templates.py.warm' must be >= 0, found -1"],
    [
      Array.from({ length: 5 }, (_, i) => `[templates.t${i}]\nimage = "x:1"\nwarm = 60`).join("\n"),
      "'templates' the warm pools together must keep <= 256, found 300",
    ],
    ["[templates.py]", "'templates.py.image' must be a string, found nothing"],
  ];
  for (const [toml, expected] of cases) {
    assert.equal(await refusal(toml), expected, toml);
  }
});

Deno.test("waffle serve over TLS: --tls-cert and --tls-key serve HTTPS with keys checked; a non-loopback address without them, or half a pair, is refused", async () => {
  const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-serve-tls-" }));
  const env = { WAFFLE_HOME: home };
  try {
    const ca = await mintCa({ commonName: "waffle serve test CA" });
    const leaf = await mintLeaf(ca, "127.0.0.1");
    await Deno.writeTextFile(join(home, "cert.pem"), leaf.cert);
    await Deno.writeTextFile(join(home, "key.pem"), leaf.key);
    const wide = await runCliProcess(["serve", "--listen", "0.0.0.0:0"], { env });
    assert.equal(wide.code, EXIT_WAFFLE);
    assert.match(
      wide.stderr,
      /Address '0\.0\.0\.0' is not loopback: give --tls-cert and --tls-key, or --insecure-http/,
    );
    const half = await runCliProcess(
      ["serve", "--listen", "127.0.0.1:0", "--tls-cert", join(home, "cert.pem")],
      { env },
    );
    assert.equal(half.code, EXIT_WAFFLE);
    assert.match(half.stderr, /Give both --tls-cert and --tls-key, or neither/);

    const made = await runCliProcess(["serve", "key", "create", "--tenant", "acme"], { env });
    assert.equal(made.code, 0, made.stderr);
    const self = selfCommand();
    const args = ["serve", "--listen", "127.0.0.1:0", "--json"];
    const tls = ["--tls-cert", join(home, "cert.pem"), "--tls-key", join(home, "key.pem")];
    const child = new Deno.Command(self.executable, {
      args: [...self.prefix, ...args, ...tls],
      env: { ...env, PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin" },
      stdin: "null",
      stdout: "piped",
      stderr: "null",
    }).spawn();
    try {
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let text = "";
      while (!text.includes("\n")) {
        const next = await reader.read();
        if (next.done) break;
        text += next.value;
      }
      reader.releaseLock();
      const url = JSON.parse(text.slice(0, text.indexOf("\n"))).url as string;
      assert.match(url, /^https:\/\/127\.0\.0\.1:\d+$/);
      using client = Deno.createHttpClient({ caCerts: [ca.cert] });
      const listed = await fetch(`${url}/v2/sandboxes`, {
        client,
        headers: { "x-api-key": made.stdout.trim() },
      });
      assert.equal(listed.status, 200);
      assert.deepEqual(await listed.json(), []);
      const refused = await fetch(`${url}/v2/sandboxes`, {
        client,
        headers: { "x-api-key": `e2b_${"0".repeat(40)}` },
      });
      assert.equal(refused.status, 401);
      await refused.body?.cancel();
      // Plain HTTP to the TLS port is no way in.
      await assert.rejects(fetch(url.replace("https:", "http:") + "/v2/sandboxes"));
    } finally {
      child.kill("SIGTERM");
      await child.status;
      await child.stdout.cancel().catch(() => {});
    }
  } finally {
    await Deno.remove(home, { recursive: true }).catch(() => {});
  }
});
