/**
 * A restricted MCP server's egress, live: the official SDK client talks to
 * `waffle mcp run` (a real process), which starts the server in a
 * restricted container of its own. The server's config names its
 * destinations, secrets and addresses; its group and cron job narrow them;
 * it reaches them through the egress proxy as an identity of its own (never
 * its user's sandbox's), and without `egress` it reaches nothing. Every
 * destination is a server this test starts on loopback.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { loadWaffleConfig } from "../lib/config/config.ts";
import type { ContainerSummary, DockerClient } from "../lib/docker/mod.ts";
import { restrictedAttachment } from "../lib/config/resolve.ts";
import type { EgressAuditLine } from "../lib/egress/audit.ts";
import { SANDBOX_DENO_ARGV } from "../lib/lifecycle/posture.ts";
import { liveTest } from "./_docker_gate.ts";
import { waitFor } from "./_helpers.ts";
import { type EgressHome, egressHome, SECRET_ENV, SECRET_VALUE, sh } from "./_egress_sandbox.ts";
import { run, uniqueUser } from "./_sandbox_helpers.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const SERVER = await Deno.readTextFile(new URL("./fixtures/egress_server.js", import.meta.url));
const [DENO, ...DENO_ARGS] = SANDBOX_DENO_ARGV;
const PROGRAM = [
  `command = ${JSON.stringify(DENO)}`,
  `args = ${
    JSON.stringify([
      ...DENO_ARGS,
      "run",
      "--allow-all",
      "--no-config",
      "--quiet",
      "/workspace/egress_server.js",
    ])
  }`,
  `execution = "sandbox"`,
  `authority = "restricted"`,
].join("\n");

// The SDK's StdioClientTransport leaves a timer and its child's pipes to
// settle after close(): the sanitizers would blame this test for them.
const SDK_CLIENT = { sanitizeOps: false, sanitizeResources: false };

/**
 * The config beside the base tables: the user's sandbox may reach other.test
 * only; `fetcher` names api.test, other.test and secret.test (with the `gh`
 * secret); group `narrow` (cron job `nightly`'s) allows api.test and
 * secret.test; `quiet` names nothing.
 */
function serversToml(world: EgressHome): string {
  return [
    "[mcp.fetcher]",
    PROGRAM,
    `egress = ${JSON.stringify([world.entry("api"), world.entry("other"), world.entry("secret")])}`,
    `egress_addresses = ["127.0.0.0/8"]`,
    `egress_allow_host_loopback = true`,
    `secrets = ["gh"]`,
    "",
    "[mcp.quiet]",
    PROGRAM,
    "",
    "[groups.narrow]",
    `egress = ${JSON.stringify([world.entry("api"), world.entry("secret")])}`,
    "",
    "[cron.nightly]",
    `group = "narrow"`,
    "",
    "[secrets.gh]",
    `from_env = "${SECRET_ENV}"`,
    `hosts = ["secret.test"]`,
    `header = "Authorization"`,
    `format = "Bearer {}"`,
  ].join("\n");
}

function world(docker: DockerClient): Promise<EgressHome> {
  return egressHome(docker, {
    config: (w) => ({ egress: [w.entry("other")], extra: serversToml(w) }),
  });
}

/** The environment `waffle mcp run` gets: the home, and the secret's host variable. */
function clientEnv(home: string): Record<string, string> {
  const docker = Deno.env.get("DOCKER_HOST");
  return {
    PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
    HOME: home,
    WAFFLE_HOME: home,
    NO_COLOR: "1",
    [SECRET_ENV]: SECRET_VALUE,
    ...(docker === undefined ? {} : { DOCKER_HOST: docker }),
  };
}

interface Connected extends AsyncDisposable {
  /** Calls a tool; its text, and whether it is an error. */
  call(name: string, args?: Record<string, unknown>): Promise<{ text: string; isError: boolean }>;
  /** The JSON a tool answers. */
  json<T>(name: string, args?: Record<string, unknown>): Promise<T>;
  /** What `waffle mcp run` wrote on stderr. */
  stderr: string[];
}

async function connect(world: EgressHome, server: string, flags: string[]): Promise<Connected> {
  const transport = new StdioClientTransport({
    command: Deno.execPath(),
    args: ["run", "--allow-all", "--quiet", MAIN, "mcp", "run", server, ...flags],
    env: clientEnv(world.home.home),
    stderr: "pipe",
  });
  const stderr: string[] = [];
  transport.stderr?.on("data", (chunk: Uint8Array) => stderr.push(new TextDecoder().decode(chunk)));
  const client = new Client({ name: "waffle-egress-test", version: "1.0.0" });
  try {
    await client.connect(transport);
  } catch (error) {
    throw new Error(`mcp run ${server} did not start: ${stderr.join("")}`, { cause: error });
  }
  const call = async (name: string, args: Record<string, unknown> = {}) => {
    const result = await client.callTool({ name, arguments: args });
    const content = (result.content ?? []) as { text?: string }[];
    return {
      text: content.map((part) => part.text ?? "").join(""),
      isError: result.isError === true,
    };
  };
  return {
    call,
    async json<T>(name: string, args: Record<string, unknown> = {}): Promise<T> {
      const { text, isError } = await call(name, args);
      assert.equal(isError, false, `${name}: ${text}`);
      return JSON.parse(text) as T;
    },
    stderr,
    [Symbol.asyncDispose]: () => client.close(),
  };
}

/** Writes the server's script into the user's workspace (through the user's sandbox). */
async function putServer(world: EgressHome, user: string): Promise<void> {
  const ran = await run(world.home.open(user), {
    argv: ["sh", "-c", "cat > /workspace/egress_server.js"],
    stdin: new TextEncoder().encode(SERVER),
  });
  assert.equal(ran.result.exitCode, 0, ran.stderr);
}

async function restrictedContainers(world: EgressHome): Promise<ContainerSummary[]> {
  return (await world.home.containers()).filter((c) => /-r-/.test(c.Names[0] ?? ""));
}

/** The first audit line with these fields, once it is written (when its connection closes). */
async function auditLine(
  world: EgressHome,
  match: Partial<EgressAuditLine>,
): Promise<EgressAuditLine> {
  const find = () =>
    world.audit().find((line) =>
      Object.entries(match).every(([key, value]) => line[key as keyof EgressAuditLine] === value)
    );
  await waitFor(() => find() !== undefined, {
    timeoutMs: 10_000,
    what: `an audit line ${JSON.stringify(match)}`,
  });
  return find()!;
}

/** What the fixture's `fetch` tool answers. */
type Fetched = { status: number; upstream: string | null };

// Both sessions reach their destinations, and share one socket directory.
async function reachesAndShares(
  w: EgressHome,
  sessions: { first: Connected; second: Connected; docker: DockerClient },
): Promise<void> {
  const { first, second, docker } = sessions;
  const api = await first.json<Fetched>("fetch", { url: `https://${w.entry("api")}/hello` });
  assert.deepEqual(api, { status: 200, upstream: "api.test" }, first.stderr.join(""));
  const other = await second.json<Fetched>("fetch", { url: `https://${w.entry("other")}/` });
  assert.deepEqual(other, { status: 200, upstream: "other.test" });
  const denied = await first.call("fetch", { url: `https://${w.entry("denied")}/` });
  assert.equal(denied.isError, true, denied.text);
  assert.equal(w.upstreams.denied.connections, 0);
  // The server's containers: network "none", its identity's socket, the proxy variables.
  const containers = await restrictedContainers(w);
  assert.equal(containers.length, 2);
  const sockets = new Set<string>();
  for (const summary of containers) {
    const inspected = (await docker.inspectContainer(summary.Id))!;
    assert.equal(inspected.HostConfig.NetworkMode, "none");
    const mount = inspected.HostConfig.Mounts.find((m) => m.Target === "/opt/waffle/egress");
    assert.equal(mount?.ReadOnly, true);
    sockets.add(mount?.Source ?? "");
  }
  assert.equal(sockets.size, 1, [...sockets].join(" "));
  assert.match([...sockets][0]!, /\/egress\/sockets\/r-[0-9a-f]{24}$/);
  const env = await first.json<Record<string, string>>("env");
  assert.equal(env.HTTPS_PROXY, "http://127.0.0.1:3128");
  assert.equal(env.DENO_CERT, "/opt/waffle/ca/bundle.pem");
  assert.equal(env.WAFFLE_EGRESS_SOCKET, undefined, "the runner's own variables stay its own");
}

// The session sees the placeholder; the value reaches the secret's host only.
async function usesPlaceholder(w: EgressHome, fetcher: Connected): Promise<void> {
  const env = await fetcher.json<Record<string, string>>("env");
  const placeholder = env[SECRET_ENV] ?? "";
  assert.match(placeholder, /^waffle_gh_[0-9a-f]{32}$/);
  assert.ok(!JSON.stringify(env).includes(SECRET_VALUE), "the value is not in its environment");
  const own = await fetcher.json<Fetched>("fetch", {
    url: `https://${w.entry("secret")}/x`,
    bearerFrom: SECRET_ENV,
  });
  assert.deepEqual(own, { status: 200, upstream: "secret.test" }, fetcher.stderr.join(""));
  assert.equal(
    w.upstreams.secret.requests.at(-1)!.headers["authorization"],
    `Bearer ${SECRET_VALUE}`,
  );
  const other = await fetcher.json<Fetched>("fetch", {
    url: `https://${w.entry("other")}/x`,
    bearerFrom: SECRET_ENV,
  });
  assert.equal(other.status, 200);
  assert.equal(
    w.upstreams.other.requests.at(-1)!.headers["authorization"],
    `Bearer ${placeholder}`,
  );
}

Deno.test("restrictedAttachment() is per (tenant, user, server, group, cron); none without the server's egress", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-egress-mcp-" });
  try {
    const file = `${home}/waffle.toml`;
    await Deno.writeTextFile(
      file,
      [
        "[sandbox]",
        `egress = ["other.test"]`,
        "[mcp.fetcher]",
        `command = "/bin/true"`,
        `execution = "sandbox"`,
        `authority = "restricted"`,
        `egress = ["api.test", "other.test:8443"]`,
        `secrets = ["gh"]`,
        "[mcp.quiet]",
        `command = "/bin/true"`,
        `execution = "sandbox"`,
        `authority = "restricted"`,
        "[mcp.shared]",
        `command = "/bin/true"`,
        `execution = "sandbox"`,
        `authority = "sandbox"`,
        "[groups.narrow]",
        `egress = ["api.test:443"]`,
        "[cron.nightly]",
        `group = "narrow"`,
        "[secrets.gh]",
        `from_env = "${SECRET_ENV}"`,
        `hosts = ["api.test"]`,
        `header = "Authorization"`,
      ].join("\n"),
    );
    const config = loadWaffleConfig({ configPath: file, overrides: { home } });
    const who = { tenant: "default", user: "alice", server: "fetcher" };
    const alone = restrictedAttachment(config, who)!;
    assert.match(alone.id, /^r-[0-9a-f]{24}$/);
    assert.deepEqual(alone.identity, {
      tenant: "default",
      user: "alice",
      group: "default",
      cron: null,
      server: "fetcher",
    });
    assert.deepEqual(alone.policy.allow.map((e) => `${e.host}:${e.ports.join("/")}`), [
      "api.test:80/443",
      "other.test:8443",
    ]);
    assert.deepEqual(alone.policy.secrets.map((s) => s.name), ["gh"]);
    // The same scope twice: one identity (concurrent sessions share its socket).
    assert.equal(restrictedAttachment(config, who)!.id, alone.id);
    assert.equal(restrictedAttachment(config, { ...who, group: "default" })!.id, alone.id);
    const nightly = restrictedAttachment(config, { ...who, cron: "nightly" })!;
    assert.deepEqual(nightly.identity, { ...alone.identity, group: "narrow", cron: "nightly" });
    assert.deepEqual(nightly.policy.allow.map((e) => `${e.host}:${e.ports.join("/")}`), [
      "api.test:443",
    ]);
    const ids = new Set([
      alone.id,
      nightly.id,
      restrictedAttachment(config, { ...who, group: "narrow" })!.id,
      restrictedAttachment(config, { ...who, user: "bob" })!.id,
      restrictedAttachment(config, { ...who, tenant: "t2" })!.id,
    ]);
    assert.equal(ids.size, 5, "each scope is its own identity");
    assert.equal(restrictedAttachment(config, { ...who, server: "quiet" }), undefined);
    assert.throws(
      () => restrictedAttachment(config, { ...who, server: "shared" }),
      /authority "sandbox": only a restricted server's session is an egress identity/,
    );
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

liveTest(
  "mcp run: a restricted server with egress reaches its own destinations through the proxy, as its own identity; mcp plan lists them",
  async (docker) => {
    await using w = await world(docker);
    const user = uniqueUser("fetcher");
    await putServer(w, user);

    const plan = await w.home.cli(["mcp", "plan"]);
    assert.equal(plan.code, 0, plan.stderr);
    const row = (name: string) => plan.stdout.split("\n").find((l) => l.startsWith(`${name} `));
    assert.ok(row("fetcher")?.includes(`${w.entry("api")},${w.entry("other")}`), plan.stdout);
    assert.match(row("quiet") ?? "", /restricted\s+\S+\s+\S+\s+none\s+none\s/, plan.stdout);

    {
      await using first = await connect(w, "fetcher", ["--user", user]);
      // A second session of the same server at once: the same identity and socket.
      await using second = await connect(w, "fetcher", ["--user", user]);
      await reachesAndShares(w, { first, second, docker });
    }
    // A connection's audit line is written when it closes: the sessions are over.
    const allowed = await auditLine(w, { destination: "api.test", user, server: "fetcher" });
    assert.equal(allowed.decision, "allowed");
    assert.deepEqual(
      { tenant: allowed.tenant, group: allowed.group, cron: allowed.cron },
      { tenant: "default", group: "default", cron: null },
    );
    const refused = await auditLine(w, { destination: "denied.test", user });
    assert.equal(refused.decision, "denied");
    assert.equal(refused.server, "fetcher");

    // The user's own sandbox is another identity: api.test is not in its list.
    const sandbox = w.home.open(user);
    const fromSandbox = await sh(
      sandbox,
      `curl -sS --max-time 20 -o /dev/null -w '%{http_code}' https://${
        w.entry("api")
      }/ 2>/dev/null; true`,
    );
    assert.equal(fromSandbox.stdout, "000");
    const sandboxLine = await auditLine(w, { destination: "api.test", user, server: null });
    assert.equal(sandboxLine.decision, "denied");
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: a restricted server without egress stays network-less: no socket, no proxy variables, nothing on 127.0.0.1:3128",
  async (docker) => {
    await using w = await world(docker);
    const user = uniqueUser("quiet");
    await putServer(w, user);
    await using quiet = await connect(w, "quiet", ["--user", user]);
    assert.equal((await quiet.call("exists", { path: "/opt/waffle/egress" })).text, "no");
    assert.equal((await quiet.call("exists", { path: "/opt/waffle/ca" })).text, "no");
    const env = await quiet.json<Record<string, string>>("env");
    const proxyish = Object.keys(env).filter((name) =>
      /proxy|_CA_|CERT|CAFILE|CAINFO|WAFFLE_EGRESS/i.test(name)
    );
    assert.deepEqual(proxyish, [], JSON.stringify(env));
    const connected = await quiet.call("connect", { port: 3128 });
    assert.equal(connected.isError, true, connected.text);
    assert.match(connected.text, /ConnectionRefused|refused/i);
    const fetched = await quiet.call("fetch", { url: `https://${w.entry("api")}/` });
    assert.equal(fetched.isError, true, fetched.text);
    assert.equal(w.upstreams.api.connections, 0);
    const [summary] = await restrictedContainers(w);
    const inspected = (await docker.inspectContainer(summary!.Id))!;
    assert.equal(inspected.HostConfig.NetworkMode, "none");
    assert.deepEqual(
      inspected.HostConfig.Mounts.filter((m) => m.Target.startsWith("/opt/waffle/egress")),
      [],
    );
    assert.ok(!inspected.Config.Env.some((entry) => entry.startsWith("WAFFLE_EGRESS_")));
    assert.ok(w.audit().every((line) => line.server !== "quiet"));
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: a cron job's group narrows a restricted server's egress, and its audit lines carry server, group and cron",
  async (docker) => {
    await using w = await world(docker);
    const user = uniqueUser("nightly");
    await putServer(w, user);
    {
      await using nightly = await connect(w, "fetcher", ["--user", user, "--cron", "nightly"]);
      const api = await nightly.json<Fetched>("fetch", { url: `https://${w.entry("api")}/` });
      assert.deepEqual(api, { status: 200, upstream: "api.test" }, nightly.stderr.join(""));
      // In the server's own list, not in group 'narrow''s: refused.
      const other = await nightly.call("fetch", { url: `https://${w.entry("other")}/` });
      assert.equal(other.isError, true, other.text);
      assert.equal(w.upstreams.other.connections, 0);
    }
    const scope = { server: "fetcher", group: "narrow", cron: "nightly" };
    const allowed = await auditLine(w, { destination: "api.test", user });
    assert.deepEqual(
      { server: allowed.server, group: allowed.group, cron: allowed.cron, tenant: allowed.tenant },
      { ...scope, tenant: "default" },
    );
    assert.equal(allowed.decision, "allowed");
    const refused = await auditLine(w, { destination: "other.test", user });
    assert.equal(refused.decision, "denied");
    assert.deepEqual({ server: refused.server, group: refused.group, cron: refused.cron }, scope);
  },
  SDK_CLIENT,
);

liveTest(
  "mcp run: a restricted server's secrets are its own: the placeholder is what it sees, the value reaches the secret's host only",
  async (docker) => {
    await using w = await world(docker);
    const user = uniqueUser("secret");
    await putServer(w, user);
    {
      await using fetcher = await connect(w, "fetcher", ["--user", user]);
      await usesPlaceholder(w, fetcher);
    }
    const injected = await auditLine(w, { destination: "secret.test", user });
    assert.deepEqual(injected.secrets, ["gh"]);
    assert.equal(injected.server, "fetcher");
    // The user's sandbox has no secrets of its own: it never sees this one's placeholder.
    const sandbox = await sh(w.home.open(user), `printf %s "$${SECRET_ENV}"`);
    assert.equal(sandbox.stdout, "");
  },
  SDK_CLIENT,
);
