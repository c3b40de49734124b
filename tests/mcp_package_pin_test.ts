/**
 * Pinned MCP packages: only an exact version is accepted; the CLI's error
 * for anything else names the version npm would pick (asked of a registry
 * this test runs on loopback); and a cached package is never fetched again
 * (`waffle mcp run` twice against a registry that counts its requests).
 */
import { INITIALIZE_REQUEST } from "./_mcp_client.ts";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { UnpinnedPackageError } from "../lib/errors.ts";
import { registryVersion, unpinnedMessage } from "../lib/mcp/npm_registry.ts";
import { isExactVersion } from "../lib/config/package_pin.ts";
import { pickVersion } from "../lib/mcp/npm_version.ts";
import { isCached, packageLaunch } from "../lib/mcp/package_cache.ts";
import { runCli } from "../lib/cli/mod.ts";
import type { CliIo } from "../lib/cli/io.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const CACHE = Deno.env.get("WAFFLE_MCP_CACHE") || `${REPO}/.tools/mcp-cache`;
const MEMORY = "npm:@modelcontextprotocol/server-memory@2026.8.31";

const KNOWN = {
  versions: ["0.1.0", "0.1.5", "0.2.0", "1.0.0", "1.2.0", "1.2.5", "1.10.0", "2.0.0-rc.1", "2.0.0"],
  distTags: { latest: "1.10.0", next: "2.0.0-rc.1" },
};

Deno.test("isExactVersion() accepts one exact version, prerelease and build included", () => {
  for (const v of ["1.2.3", "0.0.0", "2026.8.31", "1.2.3-rc.1", "1.2.3-0.beta", "1.0.0+b.5"]) {
    assert.ok(isExactVersion(v), v);
  }
  for (
    const v of ["", "latest", "1", "1.2", "1.x", "^1.2.3", "~1.2.3", ">=1.0.0", "01.2.3", "1.2.3-"]
  ) {
    assert.ok(!isExactVersion(v), v);
  }
});

Deno.test("pickVersion() picks what npm would: a tag's version, else latest when it satisfies, else the highest match", () => {
  const cases: [string, string | undefined][] = [
    ["latest", "1.10.0"],
    ["", "1.10.0"],
    ["next", "2.0.0-rc.1"],
    ["^1", "1.10.0"],
    ["1.x", "1.10.0"],
    ["1.2", "1.2.5"],
    ["~1.2.0", "1.2.5"],
    [">=1", "1.10.0"], // latest satisfies: npm takes it over 2.0.0
    [">1.10", "2.0.0"],
    ["<1", "0.2.0"],
    ["^0.1", "0.1.5"],
    ["1.0.0 - 1.2", "1.2.5"],
    [">=1.0.0 <1.2.0", "1.0.0"],
    ["^2.0.0-rc.0", "2.0.0"],
    ["2.0.0-rc.1", "2.0.0-rc.1"],
    ["^0.1 || ^2", "2.0.0"],
    ["*", "1.10.0"],
    ["^3", undefined],
    ["beta", undefined],
  ];
  for (const [range, expected] of cases) assert.equal(pickVersion(KNOWN, range), expected, range);
  // A prerelease only when the range names one of the same major.minor.patch.
  const pre = { versions: ["1.0.0", "1.1.0-alpha.1"], distTags: {} };
  assert.equal(pickVersion(pre, ">=1"), "1.0.0");
  assert.equal(pickVersion(pre, ">=1.1.0-alpha.0"), "1.1.0-alpha.1");
});

/** A registry on loopback that answers one package and counts every request. */
function fakeRegistry(): { url: string; hits: string[]; close(): Promise<void> } {
  const hits: string[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (request) => {
    const path = new URL(request.url).pathname;
    hits.push(path);
    if (path === "/@modelcontextprotocol%2fserver-memory") {
      return Response.json({
        name: "@modelcontextprotocol/server-memory",
        "dist-tags": { latest: "2026.8.31" },
        versions: { "2026.7.4": {}, "2026.8.31": {} },
      });
    }
    return Response.json({ error: "Not found" }, { status: 404 });
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}/`,
    hits,
    close: () => server.shutdown(),
  };
}

function captureIo(): CliIo & { err: () => string } {
  let err = "";
  return {
    stdout: () => Promise.resolve(),
    stderr: (data) => {
      err += typeof data === "string" ? data : new TextDecoder().decode(data);
      return Promise.resolve();
    },
    stdin: null,
    err: () => err,
  };
}

async function withRegistryEnv<T>(url: string, fn: () => Promise<T>): Promise<T> {
  const saved = Deno.env.get("NPM_CONFIG_REGISTRY");
  Deno.env.set("NPM_CONFIG_REGISTRY", url);
  try {
    return await fn();
  } finally {
    if (saved === undefined) Deno.env.delete("NPM_CONFIG_REGISTRY");
    else Deno.env.set("NPM_CONFIG_REGISTRY", saved);
  }
}

Deno.test("waffle mcp plan refuses @latest in one line naming the key, the spec and the version npm would pick", async () => {
  const registry = fakeRegistry();
  const home = await Deno.makeTempDir({ prefix: "waffle-pin-" });
  try {
    const file = `${home}/waffle.toml`;
    await Deno.writeTextFile(
      file,
      `[mcp.memory]\npackage = "npm:@modelcontextprotocol/server-memory@latest"\nexecution = "sandbox"\nauthority = "sandbox"\n`,
    );
    const io = captureIo();
    const code = await withRegistryEnv(
      registry.url,
      () => runCli(["mcp", "plan", "--config", file], io),
    );
    assert.equal(code, 125);
    assert.equal(
      io.err(),
      `waffle: Config file '${file}': 'mcp.memory.package' must pin an exact version ("npm:<name>@<major.minor.patch>"), found "npm:@modelcontextprotocol/server-memory@latest"; npm would pick 2026.8.31: write "npm:@modelcontextprotocol/server-memory@2026.8.31"\n`,
    );
    assert.deepEqual(registry.hits, ["/@modelcontextprotocol%2fserver-memory"]);
    // A range, through the same path: the highest match (latest satisfies ^2026).
    const ranged = new UnpinnedPackageError("X", {
      packageName: "@modelcontextprotocol/server-memory",
      requested: "^2026.1",
    });
    assert.match(await unpinnedMessage(ranged, { registry: registry.url }), /pick 2026\.8\.31:/);
    const none = new UnpinnedPackageError("X", { packageName: "no-such", requested: "latest" });
    assert.equal(
      await unpinnedMessage(none, { registry: registry.url }),
      `X; the registry '${registry.url}' has no package 'no-such'`,
    );
  } finally {
    await registry.close();
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("the unpinned error says 'registry not reachable' when the registry does not answer", async () => {
  // A port nothing listens on: bind one, note it, close it.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const url = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}/`;
  listener.close();
  assert.deepEqual(await registryVersion("some-server", "latest", { registry: url }), {
    problem: "not reachable",
    registry: url,
  });
  const error = new UnpinnedPackageError("Config file 'f': 'mcp.p.package' must pin", {
    packageName: "some-server",
    requested: "^1",
  });
  assert.equal(
    await unpinnedMessage(error, { registry: url }),
    `Config file 'f': 'mcp.p.package' must pin; registry not reachable ('${url}')`,
  );
});

/**
 * Runs `waffle mcp run memory` in this process (so only the processes it
 * starts see the test registry, not the Deno that loads waffle's own
 * modules): initialize, tools/list, then the end of its input. The host
 * server it starts is a real process.
 */
async function runOnce(
  file: string,
  registry: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const lines = [
    INITIALIZE_REQUEST,
    { jsonrpc: "2.0", method: "notifications/initialized" },
    { jsonrpc: "2.0", id: 2, method: "tools/list", params: {} },
  ];
  let stdout = "";
  let stderr = "";
  let listed: () => void = () => {};
  const answered = new Promise<void>((resolve) => (listed = resolve));
  const input = new ReadableStream<Uint8Array>({
    async start(controller): Promise<void> {
      controller.enqueue(
        new TextEncoder().encode(lines.map((l) => JSON.stringify(l)).join("\n") + "\n"),
      );
      // The end of input once tools/list is answered (or the run ended).
      await answered;
      controller.close();
    },
  });
  const decode = (data: Uint8Array | string): string =>
    typeof data === "string" ? data : new TextDecoder().decode(data);
  const io: CliIo = {
    stdout: (data) => {
      stdout += decode(data);
      if (/"id":2/.test(stdout)) listed();
      return Promise.resolve();
    },
    stderr: (data) => {
      stderr += decode(data);
      return Promise.resolve();
    },
    stdin: input,
  };
  const code = await withRegistryEnv(
    registry,
    () => runCli(["mcp", "run", "memory", "--config", file], io).finally(listed),
  );
  return { code, stdout, stderr };
}

Deno.test({
  name: ignoredUnless(
    "waffle mcp run of a cached package makes no registry request, run after run",
    isCached(MEMORY, CACHE),
    `${MEMORY} is not in '${CACHE}' (scripts/setup.sh caches it)`,
  ),
  ignore: !isCached(MEMORY, CACHE),
  // The relay leaves the host server's pipes to settle after it returns.
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const registry = fakeRegistry();
    const home = await Deno.makeTempDir({ prefix: "waffle-pin-" });
    try {
      const file = `${home}/waffle.toml`;
      const config = (cache: string, spec: string): string =>
        `[sandbox]\nhome = "${home}/state"\nmcp_cache = "${cache}"\n\n[groups.default]\nmode = "host"\n\n` +
        `[mcp.memory]\npackage = "${spec}"\nexecution = "host"\nauthority = "host"\n`;
      await Deno.writeTextFile(file, config(CACHE, MEMORY));
      for (const run of [1, 2]) {
        const result = await runOnce(file, registry.url);
        assert.equal(result.code, 0, `run ${run}: ${result.stderr}`);
        assert.match(result.stdout, /"read_graph"/, `run ${run} listed the tools`);
        assert.deepEqual(registry.hits, [], `run ${run} asked the registry`);
      }
      // And the server itself can fetch nothing: it runs from the cache only.
      assert.ok(
        packageLaunch(MEMORY, [], { deno: ["deno"], cacheDir: CACHE }).argv.includes(
          "--cached-only",
        ),
      );
      // The control: an exact version not in (an empty) cache is fetched, from
      // this registry: the count above would have seen a fetch.
      await Deno.writeTextFile(
        file,
        config(`${home}/empty-cache`, "npm:waffle-uncached-server@1.0.0"),
      );
      const fetched = await runOnce(file, registry.url);
      assert.equal(fetched.code, 125, fetched.stderr);
      assert.equal(fetched.stdout, "", "nothing but JSON-RPC on stdout, and no server started");
      assert.match(fetched.stderr, /fetching 'npm:waffle-uncached-server@1\.0\.0'/);
      assert.match(fetched.stderr, /Cannot fetch package 'npm:waffle-uncached-server@1\.0\.0'/);
      assert.deepEqual(registry.hits, ["/waffle-uncached-server"], "asked of this registry");
    } finally {
      await registry.close();
      await Deno.remove(home, { recursive: true });
    }
  },
});

/** A test's name, with why it is ignored when it cannot run. */
function ignoredUnless(name: string, runs: boolean, reason: string): string {
  return runs ? name : `${name} [ignored: ${reason}]`;
}
