/**
 * `waffle serve`'s new surface, attacked, and its durability: a command and
 * a compromised runner (`docker exec -u 0`) of a real sandbox try to reach
 * the server; one sandbox's token is tried on another's envd; every call is
 * audited; a server killed with SIGKILL and started again serves what it
 * had. Live tests with the real E2B SDK (see tests/_serve_helpers.ts).
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { CommandExitError, Sandbox } from "e2b";
import { sandboxKey } from "../lib/config/sandbox_key.ts";
import { sdk, sdkTest, type Served } from "./_serve_helpers.ts";
import { delay, runProcess, waitFor } from "./_helpers.ts";
import { type RawClient, rawClient, slowloris } from "./_slow_clients.ts";
import { egressAuditFile } from "../lib/egress/proxy_container.ts";

/** The audit's lines so far. */
async function auditLines(served: Served): Promise<Record<string, unknown>[]> {
  const text = await Deno.readTextFile(join(served.home, "serve", "audit.jsonl")).catch(() => "");
  return text.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line));
}

/** The egress audit's lines so far. */
async function egressAudit(served: Served): Promise<Record<string, unknown>[]> {
  const text = await Deno.readTextFile(egressAuditFile(served.home)).catch(() => "");
  return text.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line));
}

/** The IPv4 address of Docker's default bridge interface (`docker0` unless renamed). */
async function bridgeAddress(): Promise<string> {
  const named = await runProcess("docker", [
    "network",
    "inspect",
    "bridge",
    "--format",
    '{{index .Options "com.docker.network.bridge.name"}}',
  ]);
  const shown = await runProcess("ip", ["-4", "-o", "addr", "show", "dev", named.stdout.trim()]);
  return /inet (\d+\.\d+\.\d+\.\d+)\//.exec(shown.stdout)?.[1] ?? "";
}

/** The envd token of a sandbox, as the control API gives it to its owner. */
async function tokenOf(served: Served, key: string, id: string): Promise<string> {
  const info = await fetch(`${served.url}/sandboxes/${id}`, { headers: { "x-api-key": key } });
  return (await info.json()).envdAccessToken;
}

sdkTest(
  "attack: a command and a compromised runner cannot reach waffle serve; nothing reaches its audit",
  async (served) => {
    const sandbox = await Sandbox.create("base", sdk(served, served.keys.a));
    try {
      const port = new URL(served.url).port;
      const before = (await auditLines(served)).length;
      // Loopback is the container's own; the default bridge's gateway is this
      // host's (never any other address).
      const bridge = await runProcess("docker", [
        "network",
        "inspect",
        "bridge",
        "--format",
        "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
      ]);
      // A daemon may leave the gateway out of IPAM (it is then the bridge's
      // own address): read it from the bridge interface instead.
      const gateway = bridge.stdout.trim() || await bridgeAddress();
      assert.match(gateway, /^\d+\.\d+\.\d+\.\d+$/);
      const probe = `for h in 127.0.0.1 ${gateway}; do ` +
        `(exec 3<>/dev/tcp/$h/${port}) 2>/dev/null && echo "reached $h"; done; echo done`;
      const asCommand = await sandbox.commands.run(`bash -c '${probe}'`);
      assert.equal(asCommand.stdout, "done\n");
      const container = sandboxKey("a", sandbox.sandboxId, { home: served.home }).containerName;
      const asRunner = await runProcess("docker", [
        "exec",
        "-u",
        "0",
        container,
        "bash",
        "-c",
        probe,
      ]);
      assert.equal(asRunner.stdout, "done\n", asRunner.stderr);
      // The victim: the server heard nothing from inside (its audit has only
      // the command's own Start, made through the API).
      const after = (await auditLines(served)).slice(before);
      assert.deepEqual(after.map((line) => line.method), ["POST /process.Process/Start"]);
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest("attack: one sandbox's token opens no other sandbox's envd", async (served) => {
  const one = await Sandbox.create("base", sdk(served, served.keys.a));
  const two = await Sandbox.create("base", sdk(served, served.keys.a));
  try {
    await one.files.write("secret.txt", "one's secret");
    const tokenTwo = await tokenOf(served, served.keys.a, two.sandboxId);
    const headers = { "e2b-sandbox-id": one.sandboxId, "x-access-token": tokenTwo };
    const read = await fetch(`${served.url}/files?path=secret.txt&username=user`, { headers });
    assert.equal(read.status, 401);
    await read.body?.cancel();
    const list = await fetch(`${served.url}/process.Process/List`, {
      method: "POST",
      headers: { ...headers, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(list.status, 401);
    assert.equal((await list.json()).code, "unauthenticated");
    // Its own token still opens it.
    assert.equal(await one.files.read("secret.txt"), "one's secret");
  } finally {
    await one.kill();
    await two.kill();
  }
});

sdkTest("every API call is audited: key, tenant, sandbox, method and status", async (served) => {
  const sandbox = await Sandbox.create("base", sdk(served, served.keys.a));
  try {
    await sandbox.commands.run("true");
    await assert.rejects(Sandbox.list(sdk(served, "e2b_" + "1".repeat(40))).nextItems());
    const lines = await auditLines(served);
    const create = lines.find((line) => line.method === "POST /v2/sandboxes");
    assert.equal(create?.status, 201);
    assert.equal(create?.tenant, "a");
    assert.match(String(create?.key), /^k_[0-9a-f]{16}$/);
    const start = lines.find((line) => line.method === "POST /process.Process/Start");
    assert.equal(start?.sandbox, sandbox.sandboxId);
    assert.equal(start?.tenant, "a");
    assert(lines.some((line) => line.status === 401 && line.key === undefined));
    for (const line of lines) assert.match(String(line.time), /^\d{4}-\d\d-\d\dT/);
  } finally {
    await sandbox.kill();
  }
});

sdkTest(
  "a server killed with SIGKILL and started again serves its sandboxes, files, timeouts and running processes",
  async (served) => {
    const sandbox = await Sandbox.create("base", {
      ...sdk(served, served.keys.a),
      metadata: { job: "durable" },
    });
    await sandbox.files.write("kept.txt", "before the crash");
    const endAt = (await sandbox.getInfo()).endAt;
    // Running at the crash: a counter that records its starts, and one
    // waiting for its stdin.
    const counter = await sandbox.commands.run(
      "echo started >> starts; i=0; while :; do i=$((i+1)); echo $i > count; echo tick $i; sleep 0.2; done",
      { background: true },
    );
    const reader = await sandbox.commands.run('read line; echo "got $line"; exit 3', {
      background: true,
      stdin: true,
    });
    await served.crashAndRestart();
    const options = sdk(served, served.keys.a);
    const again = await Sandbox.connect(sandbox.sandboxId, options);
    try {
      assert.equal(await again.files.read("kept.txt"), "before the crash");
      assert.equal((await again.commands.run("cat kept.txt")).stdout, "before the crash");
      const listed = await Sandbox.list({ ...options, query: { metadata: { job: "durable" } } })
        .nextItems();
      assert.deepEqual(listed.map((s) => s.sandboxId), [sandbox.sandboxId]);
      // Connect extends, never shortens: the end time is at least what it was.
      assert((await again.getInfo()).endAt.getTime() >= endAt.getTime());
      // Both processes went on under the new server, under their pids.
      const pids = (await again.commands.list()).map((process) => process.pid).sort();
      assert.deepEqual(pids, [counter.pid, reader.pid].sort());
      // Re-attached: the counter's output goes on from where it is (never
      // from 1: it ran once).
      const ticks: number[] = [];
      const attached = await again.commands.connect(counter.pid, {
        onStdout: (data) => {
          for (const match of data.matchAll(/tick (\d+)/g)) ticks.push(Number(match[1]));
        },
      });
      for (let i = 0; i < 50 && ticks.length < 3; i++) await delay(100);
      const counted = Number((await again.files.read("count")).trim());
      assert.ok(ticks.length >= 3 && ticks[0]! > 1, `ticks after the restart: ${ticks.join(",")}`);
      assert.ok(counted >= ticks[0]!, `count ${counted} went on`);
      assert.equal(await again.files.read("starts"), "started\n");
      // The waiting one takes its stdin through the new server and ends exactly.
      const waiting = await again.commands.connect(reader.pid);
      await again.commands.sendStdin(reader.pid, "hello\n");
      const ended = await waiting.wait().catch((error: unknown) => error);
      assert.ok(ended instanceof CommandExitError, String(ended));
      assert.equal(ended.exitCode, 3);
      assert.equal(ended.stdout, "got hello\n");
      await attached.disconnect();
      // A server stopped (SIGTERM) lets its processes go rather than ending
      // them: the next one takes the counter over as well.
      await served.restart();
      const third = await Sandbox.connect(sandbox.sandboxId, sdk(served, served.keys.a));
      assert.deepEqual((await third.commands.list()).map((process) => process.pid), [counter.pid]);
      const later: number[] = [];
      const reattached = await third.commands.connect(counter.pid, {
        onStdout: (data) => {
          for (const match of data.matchAll(/tick (\d+)/g)) later.push(Number(match[1]));
        },
      });
      for (let i = 0; i < 50 && later.length < 2; i++) await delay(100);
      assert.ok(later.length >= 2 && later[0]! > ticks.at(-1)!, `ticks: ${later.join(",")}`);
      assert.equal(await third.files.read("starts"), "started\n");
      // And the counter is killed through it: nothing is left running.
      assert.equal(await third.commands.kill(counter.pid), true);
      await reattached.wait().catch(() => {});
      assert.deepEqual(await third.commands.list(), []);
    } finally {
      await Sandbox.kill(sandbox.sandboxId, sdk(served, served.keys.a));
    }
  },
);

sdkTest(
  "a key's sandboxes hold at most max_streams_per_key open streams; a finished one frees its place",
  async (served) => {
    const sandbox = await Sandbox.create("base", sdk(served, served.keys.a));
    try {
      const first = await sandbox.commands.run("sleep 30", { background: true });
      const second = await sandbox.commands.run("sleep 30", { background: true });
      await assert.rejects(
        sandbox.commands.run("echo third"),
        (error: unknown) => error instanceof Error && /max_streams_per_key/.test(error.message),
      );
      assert.equal(await first.kill(), true);
      await first.wait().catch(() => {});
      // Its stream ended: the place is free again (bounded wait for the close).
      let ran = "";
      for (let i = 0; i < 20 && ran === ""; i++) {
        ran = await sandbox.commands.run("echo third").then((r) => r.stdout, () => "");
        if (ran === "") await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.equal(ran, "third\n");
      await second.kill();
    } finally {
      await sandbox.kill();
    }
  },
  { toml: "[serve]\nmax_streams_per_key = 2\n" },
);

sdkTest(
  "a create never widens what the config grants: internet and allowOut are 403s naming the key",
  async (served) => {
    const options = sdk(served, served.keys.a);
    await assert.rejects(
      Sandbox.create("base", { ...options, allowInternetAccess: true }),
      (error: unknown) =>
        error instanceof Error && /sandbox\.network = "bridge"/.test(error.message),
    );
    await assert.rejects(
      Sandbox.create("base", { ...options, network: { allowOut: ["example.com"] } }),
      (error: unknown) => error instanceof Error && /'sandbox\.egress'/.test(error.message),
    );
    // Nothing half-made: the refused creates left no sandbox behind.
    assert.deepEqual(await Sandbox.list(options).nextItems(), []);
    // The v1 path's clients (E2B's Python SDK 2.45 sends exactly this body)
    // send allow_internet_access: true on every create, asked or not: there
    // it asks nothing, and the sandbox gets the config's grant (no network).
    const v1 = await fetch(`${served.url}/sandboxes`, {
      method: "POST",
      headers: { "x-api-key": served.keys.a, "content-type": "application/json" },
      body: JSON.stringify({
        templateID: "base",
        autoPause: false,
        metadata: {},
        timeout: 300,
        envVars: {},
        secure: true,
        allow_internet_access: true,
      }),
    });
    assert.equal(v1.status, 201, await v1.clone().text());
    const made = await Sandbox.connect((await v1.json()).sandboxID, options);
    try {
      const links = await made.commands.run("ls /sys/class/net | grep -vc '^lo$' || true");
      assert.equal(links.stdout.trim(), "0", "the config's grant: no interface but lo");
    } finally {
      await made.kill();
    }
    // Narrowing nothing is fine, and the sandbox reaches nothing.
    const narrowed = await Sandbox.create("base", {
      ...options,
      allowInternetAccess: false,
      network: { denyOut: ["0.0.0.0/0"] },
    });
    try {
      const probe = await narrowed.commands.run("ip -o link 2>/dev/null | grep -vc ' lo:' || true");
      assert.equal(probe.stdout.trim(), "0");
    } finally {
      await narrowed.kill();
    }
  },
);

// Two upstreams on loopback, named by [egress.hosts]; their ports are
// reserved now, as the config is written before the server starts.
function freePort(hostname: string): number {
  const listener = Deno.listen({ hostname, port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}
const ONE = { name: "one.test", ip: "127.0.0.2", port: freePort("127.0.0.2") };
const TWO = { name: "two.test", ip: "127.0.0.3", port: freePort("127.0.0.3") };
const LIST_TOML = [
  "[sandbox]",
  `egress = ["${ONE.name}:${ONE.port}", "${TWO.name}:${TWO.port}", "${TWO.ip}:${TWO.port}"]`,
  `egress_addresses = ["127.0.0.0/8"]`,
  "egress_allow_host_loopback = true",
  "[egress.hosts]",
  `"${ONE.name}" = "${ONE.ip}"`,
  `"${TWO.name}" = "${TWO.ip}"`,
  "",
].join("\n");

/** An upstream answering its name, counting the requests that reach it. */
function upstream(
  target: { name: string; ip: string; port: number },
): { hits: () => number } & AsyncDisposable {
  let hits = 0;
  const server = Deno.serve(
    { hostname: target.ip, port: target.port, onListen: () => {} },
    () => {
      hits++;
      return new Response(target.name);
    },
  );
  return { hits: () => hits, [Symbol.asyncDispose]: () => server.shutdown() };
}

// What `curl` (through the proxy its variables name) gets: the status, and the body of a 200.
const fetched = (url: string): string =>
  `code=$(curl -s --max-time 10 -o /tmp/body -w '%{http_code}' ${url}); ` +
  `if [ "$code" = 200 ]; then echo "$code $(cat /tmp/body)"; else echo "$code"; fi`;

sdkTest(
  "network narrowing: a create reaches what it allows of the config's list, the rest is refused and audited, a compromised runner cannot undo it, a restart keeps it",
  async (served) => {
    await using one = upstream(ONE);
    await using two = upstream(TWO);
    const options = sdk(served, served.keys.a);
    // Refused before anything is made: wider than the list (403), inexpressible (400).
    await assert.rejects(
      Sandbox.create("base", { ...options, network: { allowOut: ["three.test"] } }),
      (error: unknown) =>
        error instanceof Error && /allowOut 'three\.test'.*'sandbox\.egress'/.test(error.message),
    );
    await assert.rejects(
      Sandbox.create("base", { ...options, network: { denyOut: [TWO.ip] } }),
      (error: unknown) =>
        error instanceof Error &&
        /denyOut '127\.0\.0\.3\/32' cannot be expressed/.test(error.message),
    );
    assert.deepEqual(await Sandbox.list(options).nextItems(), []);

    const narrowed = await Sandbox.create("base", {
      ...options,
      allowInternetAccess: false,
      network: { allowOut: [ONE.name] },
    });
    const oneUrl = `http://${ONE.name}:${ONE.port}/`;
    const twoUrl = `http://${TWO.name}:${TWO.port}/`;
    const reach = async (sandbox: Sandbox): Promise<string> =>
      (await sandbox.commands.run(`${fetched(oneUrl)}; ${fetched(twoUrl)}`)).stdout;
    try {
      assert.equal(await reach(narrowed), "200 one.test\n403\n");
      assert.equal(one.hits(), 1);
      assert.equal(two.hits(), 0, "the refused upstream was never reached");
      const info = await Sandbox.getInfo(narrowed.sandboxId, options);
      assert.equal(info.allowInternetAccess, false);
      assert.deepEqual(info.network?.allowOut, [ONE.name]);
      await waitFor(
        async () =>
          (await egressAudit(served)).some((line) =>
            line.user === narrowed.sandboxId && line.destination === TWO.name &&
            line.decision === "denied"
          ),
        { what: "the refusal's audit line" },
      );
      // The narrowing is the host's: the policy file is outside the container, whose
      // egress directory is read-only even to its root; root's own request is refused too.
      const container = sandboxKey("a", narrowed.sandboxId, { home: served.home }).containerName;
      const asRunner = await runProcess("docker", [
        "exec",
        "-u",
        "0",
        container,
        "bash",
        "-c",
        `touch /opt/waffle/egress/policy.json 2>/dev/null && echo wrote; ls /opt/waffle/egress; ` +
        `curl -s --max-time 10 -o /dev/null -w '%{http_code}\\n' -x http://127.0.0.1:3128 ${twoUrl}`,
      ]);
      assert.equal(asRunner.stdout, "proxy.s\n403\n", asRunner.stderr);
      assert.equal(await reach(narrowed), "200 one.test\n403\n");

      await served.crashAndRestart();
      const again = await Sandbox.connect(narrowed.sandboxId, sdk(served, served.keys.a));
      assert.equal(await reach(again), "200 one.test\n403\n", "narrowed after a restart");
      const after = await Sandbox.getInfo(narrowed.sandboxId, sdk(served, served.keys.a));
      assert.deepEqual(after.network?.allowOut, [ONE.name]);
      assert.equal(two.hits(), 0);
    } finally {
      await Sandbox.kill(narrowed.sandboxId, sdk(served, served.keys.a));
    }

    // denyOut takes an address off the list; allowOut wins over it for the names.
    const denied = await Sandbox.create("base", {
      ...sdk(served, served.keys.a),
      network: { denyOut: [TWO.ip], allowOut: [ONE.name, TWO.name] },
    });
    try {
      const ran = await denied.commands.run(
        `${fetched(twoUrl)}; ${fetched(`http://${TWO.ip}:${TWO.port}/`)}`,
      );
      assert.equal(ran.stdout, "200 two.test\n403\n");
      assert.equal(two.hits(), 1, "the name reached it once, the denied address never");
      // The config narrowed while the server runs narrows the sandbox with it:
      // what it allowed of two.test is gone at its next command.
      await Deno.writeTextFile(
        join(served.home, "waffle.toml"),
        LIST_TOML.replace(`, "${TWO.name}:${TWO.port}"`, ""),
      );
      assert.equal((await denied.commands.run(fetched(twoUrl))).stdout, "403\n");
      assert.equal(two.hits(), 1);
    } finally {
      await denied.kill();
    }
  },
  { toml: LIST_TOML },
);

sdkTest(
  "network narrowing: with a bridge grant, allowInternetAccess false leaves the sandbox no interface but lo",
  async (served) => {
    const options = sdk(served, served.keys.a);
    const links = "ls /sys/class/net | grep -vc '^lo$' || true";
    const open = await Sandbox.create("base", options);
    try {
      assert.equal((await open.commands.run(links)).stdout.trim(), "1", "bridge: eth0 and lo");
    } finally {
      await open.kill();
    }
    const closed = await Sandbox.create("base", { ...options, allowInternetAccess: false });
    try {
      assert.equal((await closed.commands.run(links)).stdout.trim(), "0");
    } finally {
      await closed.kill();
    }
    await assert.rejects(
      Sandbox.create("base", { ...options, network: { denyOut: ["8.8.8.8"] } }),
      (error: unknown) => error instanceof Error && /cannot be expressed/.test(error.message),
    );
    assert.deepEqual(await Sandbox.list(options).nextItems(), []);
  },
  { toml: '[sandbox]\nnetwork = "bridge"\n' },
);

sdkTest(
  "attack: idle connections past both connection caps are closed at once, a slowloris at the header deadline, and the server serves the SDK after",
  async (served) => {
    const target = { hostname: "127.0.0.1", port: Number(new URL(served.url).port) };
    // Idle connections: 10 from each of 4 peers, past the per-peer cap of 8.
    const idlePeers = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    const idle = await Promise.all(
      idlePeers.flatMap((from) => Array.from({ length: 10 }, () => rawClient(target, from))),
    );
    // A slowloris from 3 more peers, 16 each: of the cap of 40, 8 places are left.
    await using flood = await slowloris(target, {
      connections: 48,
      peers: ["127.0.1.2", "127.0.1.3", "127.0.1.4"],
      everyMs: 200,
      head: "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ",
    });
    await waitFor(() => idle.every((client) => client.closed()) && flood.open() === 0, {
      timeoutMs: 60_000,
      what: "every idle and slow connection to be closed",
    });
    const refused = (clients: RawClient[]): number =>
      clients.filter((client) => client.received() === "").length;
    const timedOut = (clients: RawClient[]): number =>
      clients.filter((client) => client.received().startsWith("HTTP/1.1 408")).length;
    // Per peer: 8 admitted (each closed at the header deadline), 2 closed unanswered.
    for (const from of idlePeers) {
      const mine = idle.filter((client) => client.from === from);
      assert.deepEqual([timedOut(mine), refused(mine)], [8, 2], from);
    }
    // The total cap: at most the 8 places left were taken (the per-peer caps alone would admit 24).
    assert.equal(flood.timedOut() + flood.refused(), 48);
    assert.ok(flood.timedOut() <= 8, `${flood.timedOut()} slow connections were admitted`);
    // The server lives, and serves the SDK.
    assert.ok(await Deno.stat(`/proc/${served.pid}`).then(() => true, () => false));
    const sandbox = await Sandbox.create("base", sdk(served, served.keys.a));
    try {
      assert.equal((await sandbox.commands.run("echo served")).stdout, "served\n");
    } finally {
      await sandbox.kill();
    }
  },
  {
    toml: "[serve]\nmax_connections = 40\nmax_connections_per_peer = 8\nheader_timeout = 3\n",
  },
);
