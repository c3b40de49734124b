// deno-lint-ignore-file no-explicit-any
/**
 * waffle's API for the console (`/waffle/v1`) and admin keys, on a real
 * `waffle serve` with the real E2B SDK (`npm:e2b@2.51.0`) and Docker: an
 * admin key made, listed and exported by the CLI; an admin key sees and acts
 * on two tenants' sandboxes while a tenant key sees its own; the sandboxes
 * table's fields; stop, and the next command starting the container again;
 * the commands route; the egress and MCP audits' tails over real files.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import { join } from "../lib/path.ts";
import { openServeDb, SERVE_MIGRATIONS } from "../lib/serve/db.ts";
import { keysFile, KeyStore } from "../lib/serve/keys.ts";
import { runCliProcess } from "./_helpers.ts";
import { BASE, baseTest, sdk, sdkTest, serve, type Served } from "./_serve_helpers.ts";
import { startKubeRig } from "./_k8s_rig.ts";

/** Makes a key on a served home with the CLI; returns the key. */
async function cliKey(served: Served, args: string[]): Promise<string> {
  const made = await runCliProcess(["serve", "key", "create", ...args], {
    env: { WAFFLE_HOME: served.home },
  });
  assert.equal(made.code, 0, made.stderr);
  return made.stdout.trim();
}

/** One call to the API with a key; the status and JSON body (or null). */
async function api(
  served: Served,
  key: string,
  path: string,
  init: RequestInit = {},
): Promise<{ status: number; body: any }> {
  const response = await fetch(`${served.url}${path}`, {
    ...init,
    headers: { "x-api-key": key, "content-type": "application/json", ...init.headers },
  });
  const text = await response.text();
  return { status: response.status, body: text === "" ? null : JSON.parse(text) };
}

async function rows(served: Served, key: string): Promise<any[]> {
  const { status, body } = await api(served, key, "/waffle/v1/sandboxes");
  assert.equal(status, 200);
  assert.ok(typeof body.at === "number");
  return body.sandboxes;
}

Deno.test("serve key: --admin makes an admin key, ls and --json say so, export and keys files carry it", async () => {
  const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-admin-" }));
  try {
    await Deno.writeTextFile(join(home, "waffle.toml"), "");
    const env = { WAFFLE_HOME: home };
    const made = await runCliProcess(
      ["serve", "key", "create", "--tenant", "ops", "--name", "root", "--admin", "--json"],
      { env },
    );
    assert.equal(made.code, 0, made.stderr);
    const admin = JSON.parse(made.stdout);
    assert.equal(admin.admin, true);
    const plain = await runCliProcess(["serve", "key", "create", "--tenant", "a"], { env });
    const ls = await runCliProcess(["serve", "key", "ls"], { env });
    assert.match(ls.stdout, /^ID +NAME +TENANT +ADMIN +CREATED +LAST USED$/m);
    assert.match(ls.stdout, / root +ops +yes +/);
    assert.match(ls.stdout, / a +- +/);
    const listed = JSON.parse(
      (await runCliProcess(["serve", "key", "ls", "--json"], { env })).stdout,
    );
    assert.deepEqual(
      listed.keys.map((k: { tenant: string; admin: boolean }) => [k.tenant, k.admin]),
      [["a", false], ["ops", true]],
    );
    const exported = await runCliProcess(["serve", "key", "export"], { env });
    const file = join(home, "keys.json");
    await Deno.writeTextFile(file, exported.stdout);
    const fromFile = keysFile(file);
    assert.equal(fromFile.verify(admin.key)?.admin, true);
    assert.equal(fromFile.verify(plain.stdout.trim())?.admin, false);
    // A keys file exported before admin keys has no admin field: not admin.
    const old = JSON.parse(exported.stdout);
    for (const key of old.keys) delete key.admin;
    await Deno.writeTextFile(file, JSON.stringify(old));
    assert.equal(keysFile(file).verify(admin.key)?.admin, false);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("openServeDb() adds the admin column to an older serve.db: its keys are not admin", async () => {
  const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-admin-" }));
  try {
    const before = openServeDb(home, { migrations: SERVE_MIGRATIONS.slice(0, 5) });
    before.exec(
      "INSERT INTO keys (id, name, tenant, hash, created_at) VALUES ('k_0123456789abcdef', 'old', 'a', '" +
        "0".repeat(64) + "', 1)",
    );
    before.close();
    const db = openServeDb(home);
    try {
      const keys = new KeyStore(db);
      assert.deepEqual(keys.list().map((k) => [k.name, k.admin]), [["old", false]]);
      const made = keys.create({ tenant: "ops", admin: true });
      assert.equal(keys.verify(made.key)?.admin, true);
    } finally {
      db.close();
    }
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

sdkTest(
  "an admin key lists and acts on every tenant's sandboxes; a tenant key sees its own",
  async (served) => {
    const admin = await cliKey(served, ["--tenant", "ops", "--admin"]);
    const a = await Sandbox.create("base", sdk(served, served.keys.a));
    const b = await Sandbox.create("base", sdk(served, served.keys.b));
    const ids = [a.sandboxId, b.sandboxId].sort();

    const who = await api(served, admin, "/waffle/v1/whoami");
    assert.equal(who.status, 200);
    assert.equal(who.body.admin, true);
    assert.equal(who.body.tenant, "ops");
    assert.equal(who.body.backend, "docker");
    assert.deepEqual(who.body.features, { metrics: true, snapshots: true, fork: true, stop: true });
    assert.equal((await api(served, served.keys.a, "/waffle/v1/whoami")).body.admin, false);

    assert.deepEqual((await rows(served, admin)).map((r) => r.sandboxID).sort(), ids);
    assert.deepEqual((await rows(served, served.keys.a)).map((r) => r.sandboxID), [a.sandboxId]);
    const listed = await Sandbox.list(sdk(served, admin)).nextItems();
    assert.deepEqual(listed.map((s) => s.sandboxId).sort(), ids);
    const v1 = await api(served, admin, "/sandboxes");
    assert.deepEqual(v1.body.map((s: { sandboxID: string }) => s.sandboxID).sort(), ids);

    // The admin acts on tenant b's sandbox: info, a command, a timeout, a snapshot listed.
    const asAdmin = await Sandbox.connect(b.sandboxId, sdk(served, admin));
    assert.equal((await asAdmin.commands.run("echo admin")).stdout, "admin\n");
    await asAdmin.setTimeout(600_000);
    assert.equal((await api(served, admin, `/sandboxes/${b.sandboxId}`)).status, 200);
    assert.equal((await api(served, served.keys.a, `/sandboxes/${b.sandboxId}`)).status, 404);
    const snap = await api(served, admin, `/sandboxes/${b.sandboxId}/snapshots`, {
      method: "POST",
      body: "{}",
    });
    assert.equal(snap.status, 201, JSON.stringify(snap.body));
    const snaps = await api(served, admin, `/snapshots?sandboxID=${b.sandboxId}`);
    assert.deepEqual(snaps.body.map((s: { snapshotID: string }) => s.snapshotID), [
      snap.body.snapshotID,
    ]);
    assert.deepEqual((await api(served, served.keys.a, "/snapshots")).body, []);
    assert.equal(
      (await api(served, admin, `/templates/${snap.body.snapshotID}`, { method: "DELETE" }))
        .status,
      204,
    );
    // A fork by the admin is the admin's tenant's.
    const forked = await api(served, admin, `/sandboxes/${a.sandboxId}/fork`, {
      method: "POST",
      body: JSON.stringify({ count: 1 }),
    });
    assert.equal(forked.status, 201, JSON.stringify(forked.body));
    const fork = forked.body[0].sandbox.sandboxID as string;
    const tenants = Object.fromEntries(
      (await rows(served, admin)).map((r) => [r.sandboxID, r.tenant]),
    );
    assert.deepEqual(tenants, { [a.sandboxId]: "a", [b.sandboxId]: "b", [fork]: "ops" });
    assert.equal((await rows(served, served.keys.a)).length, 1);

    // GET /metrics: every tenant's series for the admin, one tenant's for a tenant key.
    const metrics = async (key: string) =>
      await (await fetch(`${served.url}/metrics`, { headers: { authorization: `Bearer ${key}` } }))
        .text();
    const all = await metrics(admin);
    for (const tenant of ["a", "b", "ops"]) {
      assert.match(all, new RegExp(`waffle_sandboxes\\{tenant="${tenant}",state="running"\\} 1`));
    }
    const mine = await metrics(served.keys.a);
    assert.match(mine, /waffle_sandboxes\{tenant="a",state="running"\} 1/);
    assert.doesNotMatch(mine, /tenant="b"/);

    // Kill: the admin removes tenant b's sandbox.
    assert.equal(
      (await api(served, admin, `/sandboxes/${b.sandboxId}`, { method: "DELETE" })).status,
      204,
    );
    assert.equal((await api(served, served.keys.b, `/sandboxes/${b.sandboxId}`)).status, 404);
  },
);

sdkTest(
  "GET /waffle/v1/sandboxes: state, template, image, costs after a sample, last command; stop, then the next command starts it again",
  async (served) => {
    const key = served.keys.a;
    const sandbox = await Sandbox.create("base", { ...sdk(served, key), metadata: { team: "x" } });
    const id = sandbox.sandboxId;
    let [row] = await rows(served, key);
    assert.equal(row.sandboxID, id);
    assert.equal(row.state, "running");
    assert.equal(row.templateID, "base");
    assert.equal(row.image, BASE);
    assert.equal(row.tenant, "a");
    assert.deepEqual(row.metadata, { team: "x" });
    assert.equal(row.pool, null);
    assert.deepEqual(row.egress, { attached: false, allow: [] });
    assert.equal(row.lastCommand, null);

    // E2B's metrics route samples it; the row then has costs.
    assert.equal((await api(served, key, `/sandboxes/${id}/metrics`)).status, 200);
    await sandbox.commands.run("echo one; exit 3").catch(() => {});
    [row] = await rows(served, key);
    for (
      const field of ["cpuCount", "cpuUsedPct", "memUsed", "memTotal", "diskUsed", "diskTotal"]
    ) {
      assert.equal(typeof row[field], "number", field);
    }
    assert.ok(row.memUsed > 0 && row.memTotal >= row.memUsed);
    assert.deepEqual(row.lastCommand.argv.slice(-1), ["echo one; exit 3"]);
    assert.equal(row.lastCommand.exitCode, 3);
    assert.equal(row.lastCommand.running, false);

    // Stop: the container stops (the row says so), files stay, the next command starts it.
    await sandbox.files.write("/home/user/kept.txt", "kept");
    assert.equal(
      (await api(served, key, `/waffle/v1/sandboxes/${id}/stop`, { method: "POST" })).status,
      204,
    );
    [row] = await rows(served, key);
    assert.equal(row.state, "stopped");
    assert.equal((await sandbox.commands.run("cat /home/user/kept.txt")).stdout, "kept");
    [row] = await rows(served, key);
    assert.equal(row.state, "running");

    // Paused: stop is refused (409), and the row says paused.
    await sandbox.pause();
    assert.equal(
      (await api(served, key, `/waffle/v1/sandboxes/${id}/stop`, { method: "POST" })).status,
      409,
    );
    assert.equal((await rows(served, key))[0].state, "paused");
  },
);

sdkTest(
  "GET /waffle/v1/sandboxes/{id}/commands: argv, exit codes, output tails, a running one with its pid",
  async (served) => {
    const key = served.keys.a;
    const sandbox = await Sandbox.create("base", sdk(served, key));
    const id = sandbox.sandboxId;
    await sandbox.commands.run("echo out; echo err >&2");
    await sandbox.commands.run("head -c 10000 /dev/zero | tr '\\0' x; echo; echo END");
    const ticker = await sandbox.commands.run("while true; do echo tick; sleep 0.2; done", {
      background: true,
    });
    const { status, body } = await api(served, key, `/waffle/v1/sandboxes/${id}/commands`);
    assert.equal(status, 200);
    const [running, long, first] = body.commands;
    assert.equal(running.running, true);
    assert.equal(running.pid, ticker.pid);
    assert.equal(running.exitCode, null);
    assert.equal(running.endedAt, null);
    assert.equal(first.exitCode, 0);
    assert.equal(first.running, false);
    assert.equal(first.pid, null);
    assert.equal(first.stdoutTail, "out\n");
    assert.equal(first.stderrTail, "err\n");
    assert.equal(first.truncated, false);
    assert.equal(typeof first.durationMs, "number");
    assert.ok(Array.isArray(first.argv) && first.argv.at(-1) === "echo out; echo err >&2");
    // Only the last 4 KiB of a long output.
    assert.equal(long.truncated, true);
    assert.equal(new TextEncoder().encode(long.stdoutTail).byteLength, 4096);
    assert.ok(long.stdoutTail.endsWith("x\nEND\n"));
    // limit: newest first, capped at 200.
    const one = await api(served, key, `/waffle/v1/sandboxes/${id}/commands?limit=1`);
    assert.deepEqual(one.body.commands.map((c: { id: string }) => c.id), [running.id]);
    assert.equal(
      (await api(served, key, `/waffle/v1/sandboxes/${id}/commands?limit=x`)).status,
      400,
    );
    await ticker.kill();
    let ended = running;
    for (let i = 0; i < 50 && ended.running; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      ended = (await api(served, key, `/waffle/v1/sandboxes/${id}/commands?limit=1`)).body
        .commands[0];
    }
    assert.equal(ended.running, false);
    assert.ok(ended.signal === 9 || ended.signal === 15, String(ended.signal));
    assert.match(ended.stdoutTail, /tick\n$/);
  },
);

sdkTest(
  "GET /waffle/v1/sandboxes/{id}/commands lists what the queue knows beyond envd: a detached waffle exec",
  async (served) => {
    const key = served.keys.a;
    const sandbox = await Sandbox.create("base", sdk(served, key));
    const id = sandbox.sandboxId;
    await sandbox.commands.run("echo envd");
    const detached = await runCliProcess(
      [
        "exec",
        "--tenant",
        "a",
        "--user",
        id,
        "--image",
        BASE,
        "--detach",
        "--",
        "sh",
        "-c",
        "exit 4",
      ],
      { env: { WAFFLE_HOME: served.home } },
    );
    assert.equal(detached.code, 0, detached.stderr);
    const requestId = detached.stdout.trim();
    let found: any;
    for (let i = 0; i < 100; i++) {
      const { body } = await api(served, key, `/waffle/v1/sandboxes/${id}/commands`);
      found = body.commands.find((c: { id: string }) => c.id === requestId);
      if (found !== undefined && !found.running) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.deepEqual(
      [found.argv, found.exitCode, found.running, found.pid],
      [["sh", "-c", "exit 4"], 4, false, null],
    );
    const { body } = await api(served, key, `/waffle/v1/sandboxes/${id}/commands`);
    // Newest first, envd's too, each once.
    assert.deepEqual(body.commands.map((c: { argv: string[] }) => c.argv.at(-1)), [
      "exit 4",
      "echo envd",
    ]);
  },
);

/** Egress audit lines of a sandbox. */
// The audit lines' user: a sandbox of tenant a in the server's store (a tenant sees only its sandboxes' lines).
let owned = "sbx";

function egressLine(over: Record<string, unknown>): string {
  return JSON.stringify({
    time: new Date().toISOString(),
    tenant: "a",
    user: owned,
    group: null,
    cron: null,
    server: null,
    method: "CONNECT",
    destination: "example.com",
    port: 443,
    address: null,
    decision: "denied",
    reason: "not in the allow list",
    secrets: [],
    bytesUp: 0,
    bytesDown: 0,
    durationMs: 1,
    ...over,
  });
}

sdkTest(
  "GET /waffle/v1/egress and /mcp read the audits' tails: scoped, filtered, counted, bad lines skipped",
  async (served) => {
    const admin = await cliKey(served, ["--tenant", "ops", "--admin"]);
    owned = (await Sandbox.create("base", sdk(served, served.keys.a))).sandboxId;
    const other = (await Sandbox.create("base", sdk(served, served.keys.b))).sandboxId;
    const old = new Date(Date.now() - 3 * 3600_000).toISOString();
    const lines = [
      egressLine({}),
      egressLine({ destination: "pypi.org", decision: "allowed", reason: undefined, count: 5 }),
      egressLine({ tenant: "b", user: other, destination: "b.example" }),
      egressLine({ time: old, destination: "old.example" }),
      "not json",
      JSON.stringify({ time: "x", tenant: "a" }),
      egressLine({ port: 70000 }),
      egressLine({ destination: "x".repeat(70_000) }),
      "",
    ];
    // Rotated: the older file is read only as far as the tail needs.
    await Deno.writeTextFile(
      join(served.home, "egress.jsonl.1"),
      egressLine({ destination: "rotated" }) + "\n",
    );
    await Deno.writeTextFile(join(served.home, "egress.jsonl"), lines.join("\n"));
    const egress = async (key: string, query = "") =>
      (await api(served, key, `/waffle/v1/egress${query}`)).body;

    const mine = await egress(served.keys.a);
    assert.deepEqual(mine.entries.map((e: { destination: string }) => e.destination), [
      "old.example",
      "pypi.org",
      "example.com",
      "rotated",
    ]);
    assert.equal(mine.entries[1].count, 5);
    assert.equal(mine.entries[1].reason, null);
    assert.equal(mine.entries[0].sandbox, owned);
    assert.deepEqual(mine.destinations[0], {
      destination: "pypi.org",
      port: 443,
      allowed: 5,
      denied: 0,
    });
    assert.equal(mine.series.length, 60);
    const last = mine.series.at(-1);
    assert.ok(Date.parse(mine.series[0].minute) < Date.parse(last.minute));
    const total = mine.series.reduce(
      (n: number, m: { allowed: number; denied: number }) => n + m.allowed + m.denied,
      0,
    );
    // The old line is out of the last hour; the rotated one's time is now too.
    assert.equal(total, 5 + 1 + 1);
    // Tenant b's line is b's alone; the admin sees both tenants.
    assert.deepEqual(
      (await egress(served.keys.b)).entries.map((e: { tenant: string }) => e.tenant),
      ["b"],
    );
    assert.equal((await egress(admin)).entries.length, 5);
    assert.deepEqual((await egress(served.keys.a, `?sandbox=${other}`)).entries, []);
    // Filters and limit.
    assert.deepEqual(
      (await egress(served.keys.a, "?decision=allowed")).entries.map((e: { destination: string }) =>
        e.destination
      ),
      ["pypi.org"],
    );
    assert.deepEqual(
      (await egress(served.keys.a, "?q=PYPI")).entries.map((e: { destination: string }) =>
        e.destination
      ),
      ["pypi.org"],
    );
    assert.equal((await egress(served.keys.a, "?limit=2")).entries.length, 2);
    assert.equal(
      (await api(served, served.keys.a, "/waffle/v1/egress?decision=maybe")).status,
      400,
    );

    const mcp = (over: Record<string, unknown>) =>
      JSON.stringify({
        time: new Date().toISOString(),
        user: owned,
        tenant: "a",
        group: "default",
        cron: null,
        server: "fs",
        from: "client",
        method: "tools/call",
        tool: "read_file",
        arguments: ["path"],
        durationMs: 3,
        outcome: "ok",
        ...over,
      });
    await Deno.writeTextFile(
      join(served.home, "audit.jsonl"),
      [
        mcp({}),
        mcp({ outcome: "denied", tool: "write_file" }),
        mcp({ tenant: "b", user: "other" }),
        mcp({ outcome: "nonsense" }),
        "{",
      ].join("\n") + "\n",
    );
    const calls = (await api(served, served.keys.a, "/waffle/v1/mcp")).body;
    assert.deepEqual(
      calls.entries.map((e: { tool: string; outcome: string }) => [e.tool, e.outcome]),
      [
        ["write_file", "denied"],
        ["read_file", "ok"],
      ],
    );
    assert.deepEqual(calls.servers, [{ server: "fs", ok: 1, failed: 1 }]);
    assert.equal(calls.series.length, 60);
    assert.equal(calls.series.at(-1).ok + calls.series.at(-2).ok, 1);
    assert.equal((await api(served, admin, "/waffle/v1/mcp")).body.entries.length, 3);
    assert.deepEqual(
      (await api(served, served.keys.a, "/waffle/v1/mcp?q=write")).body.entries.length,
      1,
    );
  },
);

sdkTest(
  "GET /waffle/v1/egress follows the audit between polls: appends, a split line, a rotation, a truncation",
  async (served) => {
    owned = (await Sandbox.create("base", sdk(served, served.keys.a))).sandboxId;
    const path = join(served.home, "egress.jsonl");
    const seen = async () =>
      (await api(served, served.keys.a, "/waffle/v1/egress")).body.entries.map((
        e: { destination: string },
      ) => e.destination);
    await Deno.writeTextFile(path, egressLine({ destination: "one" }) + "\n");
    assert.deepEqual(await seen(), ["one"]);
    await Deno.writeTextFile(path, egressLine({ destination: "two" }) + "\n", { append: true });
    assert.deepEqual(await seen(), ["two", "one"]);
    // A line written in two appends shows once whole.
    const split = egressLine({ destination: "three" }) + "\n";
    await Deno.writeTextFile(path, split.slice(0, 40), { append: true });
    assert.deepEqual(await seen(), ["two", "one"]);
    await Deno.writeTextFile(path, split.slice(40), { append: true });
    assert.deepEqual(await seen(), ["three", "two", "one"]);
    // Rotated as the proxy does: renamed to .1, a new file.
    await Deno.rename(path, `${path}.1`);
    await Deno.writeTextFile(path, egressLine({ destination: "four" }) + "\n");
    assert.deepEqual(await seen(), ["four", "three", "two", "one"]);
    // Truncated in place, then written: only the new line.
    await Deno.writeTextFile(path, egressLine({ destination: "five" }) + "\n");
    assert.deepEqual(await seen(), ["five", "three", "two", "one"]);
    await Deno.remove(`${path}.1`);
    assert.deepEqual(await seen(), ["five"]);
  },
);

// One upstream on loopback, named by [egress.hosts]; its port is reserved now, as the config is
// written before the server starts.
function freePort(hostname: string): number {
  const listener = Deno.listen({ hostname, port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}
const ONE = { name: "one.test", ip: "127.0.0.2", port: freePort("127.0.0.2") };
const EGRESS_TOML = [
  "[sandbox]",
  `egress = ["${ONE.name}:${ONE.port}"]`,
  `egress_addresses = ["127.0.0.0/8"]`,
  "egress_allow_host_loopback = true",
  "[egress.hosts]",
  `"${ONE.name}" = "${ONE.ip}"`,
  "",
].join("\n");

sdkTest(
  "a real connection through the egress proxy: the row says attached and what it allows; the denied one shows in /waffle/v1/egress",
  async (served) => {
    const key = served.keys.a;
    const server = Deno.serve(
      { hostname: ONE.ip, port: ONE.port, onListen: () => {} },
      () => new Response("one"),
    );
    try {
      const sandbox = await Sandbox.create("base", sdk(served, key));
      const ran = await sandbox.commands.run(
        `curl -s -o /dev/null -w '%{http_code} ' --max-time 10 http://${ONE.name}:${ONE.port}/; ` +
          `curl -s -o /dev/null -w '%{http_code}' --max-time 10 http://refused.test:81/`,
      );
      assert.equal(ran.stdout, "200 403");
      const [row] = await rows(served, key);
      assert.deepEqual(row.egress, { attached: true, allow: [`${ONE.name}:${ONE.port}`] });
      let view: any;
      for (let i = 0; i < 100; i++) {
        view = (await api(served, key, `/waffle/v1/egress?sandbox=${sandbox.sandboxId}`)).body;
        if (view.entries.length >= 2) break;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      const denied = view.entries.find((e: { decision: string }) => e.decision === "denied");
      assert.equal(denied.destination, "refused.test");
      assert.equal(denied.sandbox, sandbox.sandboxId);
      assert.equal(denied.tenant, "a");
      assert.ok(
        view.entries.some((e: { decision: string; destination: string }) =>
          e.decision === "allowed" && e.destination === ONE.name
        ),
      );
      assert.deepEqual(
        (await api(served, served.keys.b, `/waffle/v1/egress?sandbox=${sandbox.sandboxId}`)).body
          .entries,
        [],
      );
    } finally {
      await server.shutdown();
    }
  },
  { toml: EGRESS_TOML },
);

baseTest(
  "kubernetes: /waffle/v1 says the backend and its features, lists the sandbox without costs, stop is 501",
  async (docker) => {
    const rig = await startKubeRig(docker);
    let served: Served | undefined;
    try {
      served = await serve({ kube: rig });
      const key = served.keys.a;
      const who = await api(served, key, "/waffle/v1/whoami");
      assert.equal(who.body.backend, "kubernetes");
      assert.deepEqual(who.body.features, {
        metrics: false,
        snapshots: false,
        fork: false,
        stop: false,
      });
      const sandbox = await Sandbox.create("base", sdk(served, key));
      assert.equal((await sandbox.commands.run("echo k8s")).stdout, "k8s\n");
      const [row] = await rows(served, key);
      assert.equal(row.sandboxID, sandbox.sandboxId);
      assert.equal(row.state, "running");
      assert.equal(row.cpuUsedPct, null);
      assert.equal(row.memUsed, null);
      const stop = await api(served, key, `/waffle/v1/sandboxes/${sandbox.sandboxId}/stop`, {
        method: "POST",
      });
      assert.equal(stop.status, 501);
      const commands = await api(served, key, `/waffle/v1/sandboxes/${sandbox.sandboxId}/commands`);
      assert.deepEqual(commands, { status: 200, body: { commands: [] } });
      assert.equal((await api(served, key, "/waffle/v1/egress")).status, 200);
      assert.equal((await api(served, key, "/waffle/v1/mcp")).status, 200);
      assert.equal(
        (await api(served, served.keys.b, `/waffle/v1/sandboxes/${sandbox.sandboxId}/commands`))
          .status,
        404,
      );
      await sandbox.kill();
    } finally {
      await served?.stop();
      await rig.stop();
    }
  },
  { sanitize: false },
);
