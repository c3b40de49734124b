/**
 * Egress end to end, on a real daemon: sandboxes with `network = "none"`
 * reach named destinations only through the proxy (its own container) over
 * their Unix socket, from curl, git, Python and Deno in the python image;
 * everything else fails, from a command and from a compromised runner
 * (`docker exec -u 0`); secrets reach their hosts and never the sandbox.
 * Every destination is a server this test starts on loopback.
 *
 * @module
 */
import assert from "node:assert/strict";
import { liveTest } from "./_docker_gate.ts";
import { containerOf } from "./_hostile_helpers.ts";
import { dockerCli, uniqueUser } from "./_sandbox_helpers.ts";
import { waitFor } from "./_helpers.ts";
import {
  asRoot,
  CONNECT_FLOOD,
  egressHome,
  GIT_UPSTREAM,
  SECRET_ENV,
  SECRET_VALUE,
  sh,
} from "./_egress_sandbox.ts";
import { startGitServer, testCa } from "./_egress_upstreams.ts";
import { proxyContainerName } from "../lib/egress/proxy_container.ts";
import { SANDBOX_DENO_ARGV } from "../lib/lifecycle/posture.ts";
import { removeSandbox } from "../lib/sandbox/remove.ts";
import { recordedLaunch } from "../lib/lifecycle/egress_record.ts";
import { homeEgress, identityPaths } from "../lib/config/egress_paths.ts";
import { lexists } from "../lib/fs.ts";
import type { EgressAuditLine } from "../lib/egress/audit.ts";

const CURL = "curl -sS --max-time 20";
const UPSTREAM_API = "api.test";

// A Python client that speaks to the proxy by hand: the shapes a hostile
// command (or runner) would try. Prints one verdict per line.
const RAW_CLIENT = (port: number) => `
import socket, ssl, sys
def tunnel(host, port):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
    return s, s.recv(4096).decode("latin1").split("\\r\\n")[0]
def closed(s):
    try:
        return s.recv(4096) == b""
    except OSError:
        return True
_, line = tunnel("private.test", ${port}); print("private", line)
_, line = tunnel("127.0.0.1", ${port}); print("literal", line)
s, line = tunnel("api.test", ${port})
try:
    ssl.create_default_context().wrap_socket(s, server_hostname="denied.test")
    print("sni", "handshake done")
except (ssl.SSLError, OSError) as e:
    print("sni", "cut")
s, line = tunnel("api.test", ${port})
s.sendall(b"CONNECT denied.test:443 HTTP/1.1\\r\\nHost: denied.test:443\\r\\n\\r\\n")
print("relay", "cut" if closed(s) else "answered")
`;

liveTest(
  "curl, git, Python and Deno in the python image reach allowed names through the proxy; a denied name is refused and never reached",
  async (docker) => {
    const ca = await testCa();
    await using git = await startGitServer({
      name: GIT_UPSTREAM.name,
      ca,
      hostname: GIT_UPSTREAM.ip,
    });
    await using world = await egressHome(docker, {
      config: (w) => ({ egress: [w.entry("api"), `${GIT_UPSTREAM.name}:${git.port}`] }),
    });
    const sandbox = world.home.open(uniqueUser("clients"));
    const api = `https://${world.entry("api")}/hello`;
    const curl = await sh(sandbox, `${CURL} ${api}`);
    assert.equal(curl.code, 0, curl.stderr);
    assert.equal(JSON.parse(curl.stdout).upstream, "api.test");

    const clone = await sh(sandbox, `git clone -q ${git.url} repo && cat repo/README`);
    assert.equal(clone.code, 0, clone.stderr);
    assert.equal(clone.stdout, "hello from upstream\n");

    const python = await sh(
      sandbox,
      `python3 -c 'import urllib.request, requests, json
print(json.load(urllib.request.urlopen("${api}"))["upstream"])
print(requests.get("${api}").json()["path"])'`,
    );
    assert.equal(python.code, 0, python.stderr);
    assert.equal(python.stdout, "api.test\n/hello\n");

    const deno = await sh(
      sandbox,
      `DENO_DIR=/tmp/deno ${SANDBOX_DENO_ARGV.join(" ")} eval ` +
        `'const r = await fetch("${api}"); console.log(r.status, (await r.json()).upstream)'`,
    );
    assert.equal(deno.code, 0, deno.stderr);
    assert.equal(deno.stdout, "200 api.test\n");

    const denied = await sh(
      sandbox,
      `${CURL} https://${world.entry("denied")}/ 2>&1; echo "exit $?"`,
    );
    assert.match(denied.stdout, /403/);
    assert.match(denied.stdout, /exit 56/);
    assert.equal(world.upstreams.denied.connections, 0);
    const lines = world.audit();
    const refused = lines.find((line) => line.destination === "denied.test");
    assert.equal(refused?.decision, "denied");
    assert.match(refused?.reason ?? "", /not in this sandbox's egress list/);
    const allowed = lines.find((line) => line.destination === "api.test");
    assert.equal(allowed?.decision, "allowed");
    assert.equal(allowed?.user, sandbox.key.user);
    assert.ok((allowed?.bytesDown ?? 0) > 0);
    // deno-lint-ignore no-console
    console.log(
      `audit, allowed: ${JSON.stringify(allowed)}\naudit, denied: ${JSON.stringify(refused)}`,
    );
  },
);

liveTest(
  "the sandbox has no route but its proxy: no interface but lo, no DNS, no UDP, no direct connection, as a command and as the runner",
  async (docker) => {
    await using world = await egressHome(docker, { config: (w) => ({ egress: [w.entry("api")] }) });
    const sandbox = world.home.open(uniqueUser("noroute"));
    assert.equal((await sh(sandbox, "true")).code, 0);
    const id = containerOf(sandbox);
    const probe = `
import socket
print("ifaces", sorted(__import__("os").listdir("/sys/class/net")))
print("routes", len(open("/proc/net/route").read().splitlines()) - 1)
try:
    socket.getaddrinfo("api.test", 443); print("dns", "resolved")
except OSError as e:
    print("dns", "failed")
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")] or ["192.0.2.53"]
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", (ns[0], 53)); print("udp", "sent")
except OSError as e:
    print("udp", "failed", e.errno)
try:
    socket.create_connection(("127.0.0.1", ${world.upstreams.api.port}), timeout=5); print("direct", "connected")
except OSError:
    print("direct", "failed")
`;
    const expected = /ifaces \['lo'\]\nroutes 0\ndns failed\nudp failed 101\ndirect failed\n/;
    const asCommand = await sh(sandbox, `python3 -c '${probe}'`);
    assert.equal(asCommand.code, 0, asCommand.stderr);
    assert.match(asCommand.stdout, expected);
    const asRunner = await asRoot(id, `python3 -c '${probe}'`);
    assert.equal(asRunner.code, 0, asRunner.stderr);
    assert.match(asRunner.stdout, expected);
    // Nothing reached the upstream directly.
    assert.equal(world.upstreams.api.connections, 0);
    const noProxy = await sh(
      sandbox,
      `${CURL} --noproxy '*' https://${world.entry("api")}/ ; echo "exit $?"`,
    );
    assert.match(noProxy.stdout, /exit 6\n/); // could not resolve
  },
);

liveTest(
  "a CONNECT to a private address, an IP literal, a mismatched SNI and a CONNECT relayed through an allowed host are refused, as a command and as the runner",
  async (docker) => {
    await using world = await egressHome(docker, {
      config: (w) => ({ egress: [w.entry("api"), `private.test:${w.upstreams.api.port}`] }),
    });
    const sandbox = world.home.open(uniqueUser("shapes"));
    const script = RAW_CLIENT(world.upstreams.api.port);
    const expected = new Map([
      ["private", "HTTP/1.1 403 Refused by waffle egress"],
      ["literal", "HTTP/1.1 403 Refused by waffle egress"],
      ["sni", "cut"],
      ["relay", "cut"],
    ]);
    const verdicts = (out: string) =>
      new Map(
        out.trim().split("\n").map((
          line,
        ) => [line.slice(0, line.indexOf(" ")), line.slice(line.indexOf(" ") + 1)]),
      );
    const asCommand = await sh(sandbox, `python3 -c '${script}'`);
    assert.equal(asCommand.code, 0, asCommand.stderr);
    assert.deepEqual(verdicts(asCommand.stdout), expected);
    const asRunner = await asRoot(containerOf(sandbox), `python3 -c '${script}'`);
    assert.equal(asRunner.code, 0, asRunner.stderr);
    assert.deepEqual(verdicts(asRunner.stdout), expected);
    // The SNI and relay tunnels were cut before the upstream saw anything.
    assert.equal(world.upstreams.api.connections, 0);
    const reasons = world.audit().map((line) => line.reason ?? "");
    assert.ok(
      reasons.some((r) => /resolves to '10\.255\.0\.1' is a private address/.test(r)),
      reasons.join("\n"),
    );
    assert.ok(reasons.some((r) => /IP literal not in this sandbox's egress list/.test(r)));
    assert.ok(
      reasons.some((r) =>
        /TLS server name 'denied\.test' does not match CONNECT host 'api\.test'/.test(r)
      ),
    );
    assert.ok(reasons.some((r) => /the tunnel does not start with TLS/.test(r)));
  },
);

liveTest(
  "a secret reaches its host only; env, /proc/*/environ and every file in the sandbox hold only the placeholder",
  async (docker) => {
    Deno.env.set(SECRET_ENV, SECRET_VALUE);
    try {
      await using world = await egressHome(docker, {
        config: (w) => ({
          egress: [w.entry("api"), w.entry("secret"), w.entry("other")],
          secrets: ["gh"],
          extra: [
            "[secrets.gh]",
            `from_env = "${SECRET_ENV}"`,
            `hosts = ["secret.test"]`,
            `header = "Authorization"`,
            `format = "Bearer {}"`,
          ].join("\n"),
        }),
      });
      const sandbox = world.home.open(uniqueUser("secret"));
      const env = await sh(sandbox, `printf %s "$${SECRET_ENV}"`);
      assert.equal(env.code, 0, env.stderr);
      const placeholder = env.stdout;
      assert.match(placeholder, /^waffle_gh_[0-9a-f]{32}$/);
      const send = (key: "secret" | "other" | "denied") =>
        // -o /dev/null: the test upstream echoes the headers it got, the
        // secret's value included, which a real API would not send back.
        sh(
          sandbox,
          `${CURL} -o /dev/null -H "Authorization: Bearer $${SECRET_ENV}" -H "X-Copy: $${SECRET_ENV}" https://${
            world.entry(key)
          }/x?t=$${SECRET_ENV}`,
        );
      const own = await send("secret");
      assert.equal(own.code, 0, own.stderr);
      const received = world.upstreams.secret.requests.at(-1)!;
      assert.equal(received.headers["authorization"], `Bearer ${SECRET_VALUE}`);
      assert.equal(received.headers["x-copy"], placeholder);
      assert.equal(received.path, `/x?t=${placeholder}`);
      const other = await send("other");
      assert.equal(other.code, 0, other.stderr);
      assert.equal(
        world.upstreams.other.requests.at(-1)!.headers["authorization"],
        `Bearer ${placeholder}`,
      );
      await send("denied");
      assert.equal(world.upstreams.denied.connections, 0);
      const injected = world.audit().find((line) => line.secrets.includes("gh"));
      assert.equal(injected?.destination, "secret.test");
      // deno-lint-ignore no-console
      console.log(`audit, injected: ${JSON.stringify(injected)}`);

      const id = containerOf(sandbox);
      const search = await asRoot(
        id,
        `grep -rlF '${SECRET_VALUE}' / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; ` +
          `for f in /proc/[0-9]*/environ; do grep -lF '${SECRET_VALUE}' "$f" 2>/dev/null; done; echo done`,
      );
      assert.equal(search.stdout, "done\n", search.stdout);
      const present = await asRoot(
        id,
        `cat /proc/1/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c '${placeholder}'`,
      );
      assert.ok(
        Number(present.stdout.trim()) > 0,
        "the placeholder is in the runner's environment",
      );
    } finally {
      Deno.env.delete(SECRET_ENV);
    }
  },
);

// Request targets that name an authority other than the tunnel's (or none):
// each must be refused inside the tunnel, before the secret is written.
const FOREIGN_TARGETS = (port: number): [string, string][] => [
  ["http://attacker.example/steal?x=1", ""],
  [`https://attacker.example:${port}/steal`, ""],
  [`https://secret.test.attacker.example:${port}/steal`, ""],
  ["https://secret.test/steal", ""], // port 443, not the tunnel's
  [`http://secret.test:${port}/steal`, ""], // not https, in a TLS tunnel
  [`https://x@secret.test:${port}/steal`, ""], // userinfo
  [`https://[::1]:${port}/steal`, ""],
  ["//attacker.example/steal", ""], // origin-form some servers read as an authority
  ["/\\attacker.example/steal", ""], // the same, with a backslash
  ["*", "-X OPTIONS"], // asterisk-form
  [`secret.test:${port}`, "-X CONNECT"], // authority-form
  ["/steal", "-H 'Host: attacker.example'"], // origin-form, another Host
  ["/steal", "-H 'Host: secret.test'"], // origin-form, Host of port 443
];

// Shell-quotes a word for sh.
const quoted = (word: string): string => `'${word.replaceAll("'", `'"'"'`)}'`;

liveTest(
  "inside a secret's tunnel a request naming another authority is refused (403, audited denied) before the secret is written; a matching absolute form goes upstream in origin form, as a command and as the runner",
  async (docker) => {
    Deno.env.set(SECRET_ENV, SECRET_VALUE);
    try {
      await using world = await egressHome(docker, {
        config: (w) => ({
          egress: [w.entry("secret")],
          secrets: ["gh"],
          extra: [
            "[secrets.gh]",
            `from_env = "${SECRET_ENV}"`,
            `hosts = ["secret.test"]`,
            `header = "Authorization"`,
            `format = "Bearer {}"`,
          ].join("\n"),
        }),
      });
      const victim = world.upstreams.secret;
      const port = victim.port;
      const url = `https://secret.test:${port}/`;
      const sandbox = world.home.open(uniqueUser("target"));
      // curl as the issue's attack has it: the bare placeholder, which the proxy writes as `Bearer {}`.
      const request = (target: string, extra: string, via = "") =>
        `${CURL} ${via} -o /dev/null -w '%{http_code}\\n' --request-target ${
          quoted(target)
        } -H "Authorization: $${SECRET_ENV}" ${extra} ${url} 2>/dev/null; true`;
      const foreign = FOREIGN_TARGETS(port);
      const asCommand = await sh(sandbox, foreign.map(([t, x]) => request(t, x)).join("; "));
      assert.equal(asCommand.code, 0, asCommand.stderr);
      // The runner (docker exec -u 0) has no proxy variables of a command's:
      // it names the proxy and the CA bundle, and sends the placeholder it can read.
      const placeholder = (await sh(sandbox, `printf %s "$${SECRET_ENV}"`)).stdout;
      assert.match(placeholder, /^waffle_gh_[0-9a-f]{32}$/);
      const runner = `${SECRET_ENV}=${placeholder}; CURL_CA_BUNDLE=/opt/waffle/ca/bundle.pem; ` +
        `export ${SECRET_ENV} CURL_CA_BUNDLE; ` +
        foreign.map(([t, x]) => request(t, x, "-x http://127.0.0.1:3128")).join("; ");
      const asRunner = await asRoot(containerOf(sandbox), runner);
      assert.equal(asRunner.code, 0, asRunner.stderr);

      // The victim never saw the secret with a target that is not origin-form
      // (on a shared front, the absolute form's authority would get it).
      const leaked = victim.requests.filter((r) =>
        JSON.stringify(r).includes(SECRET_VALUE) && !/^\/(?![/\\])/.test(r.path)
      );
      assert.deepEqual(
        leaked.map((r) => `${r.method} ${r.path} (Host: ${r.headers.host})`),
        [],
        "the secret's host received the real secret with a foreign request target",
      );
      assert.equal(victim.requests.length, 0, "no refused request reached the secret's host");
      const expected = foreign.map(() => "403").join("\n") + "\n";
      assert.equal(asCommand.stdout, expected, "as a command");
      assert.equal(asRunner.stdout, expected, "as the runner");
      // One line per connection (a summary line stands for its count), written once both sides closed.
      const audited = () => world.audit().filter((line) => line.destination === "secret.test");
      const connections = (lines: EgressAuditLine[]) =>
        lines.reduce((sum, line) => sum + (line.count ?? 1), 0);
      await waitFor(() => connections(audited()) >= 2 * foreign.length, {
        timeoutMs: 10_000,
        what: "an audit line for every refusal",
      });
      const refused = audited();
      assert.equal(connections(refused), 2 * foreign.length, JSON.stringify(refused));
      for (const line of refused) {
        assert.equal(line.decision, "denied", JSON.stringify(line));
        assert.deepEqual(line.secrets, []);
        assert.match(line.reason ?? "", /^Request (target|Host header) /, JSON.stringify(line));
      }
      assert.ok(
        refused.some((line) =>
          /'http:\/\/attacker\.example\/steal\?x=1' names 'attacker\.example:80', not this tunnel's 'secret\.test:\d+'/
            .test(line.reason ?? "")
        ),
        refused.map((line) => line.reason).join("\n"),
      );

      // Matching absolute forms (any case, a trailing dot, the port given) go
      // upstream in origin form, with the secret and the tunnel's Host.
      const matching = [`https://secret.test:${port}/ok?x=1`, `HTTPS://Secret.TEST.:${port}/case`];
      const sent = await sh(sandbox, matching.map((t) => request(t, "")).join("; "));
      assert.equal(sent.stdout, "200\n200\n", sent.stderr);
      assert.deepEqual(
        victim.requests.map((r) => [r.path, r.headers.host, r.headers.authorization]),
        [
          ["/ok?x=1", `secret.test:${port}`, `Bearer ${SECRET_VALUE}`],
          ["/case", `secret.test:${port}`, `Bearer ${SECRET_VALUE}`],
        ],
      );
    } finally {
      Deno.env.delete(SECRET_ENV);
    }
  },
);

liveTest(
  "two users' sandboxes use their own policy and socket; a policy change applies to the next call without recycling",
  async (docker) => {
    const alice = uniqueUser("alice");
    const bob = uniqueUser("bob");
    await using world = await egressHome(docker, {
      config: (w) => ({
        egress: [w.entry("api"), w.entry("other")],
        extra: `[users."${bob}"]\negress = ["${w.entry("other")}"]`,
      }),
    });
    const a = world.home.open(alice);
    const b = world.home.open(bob);
    const get = (sandbox: typeof a, key: "api" | "other") =>
      sh(
        sandbox,
        `${CURL} -o /dev/null -w '%{http_code}' https://${world.entry(key)}/ 2>/dev/null; true`,
      );
    assert.equal((await get(a, "api")).stdout, "200");
    assert.equal((await get(b, "other")).stdout, "200");
    assert.equal((await get(b, "api")).stdout, "000");
    const lines = world.audit();
    assert.ok(
      lines.some((l) => l.user === bob && l.destination === "api.test" && l.decision === "denied"),
    );
    assert.ok(lines.every((l) => l.user === alice || l.user === bob));
    // Each sees its own socket only.
    const mounts = async (sandbox: typeof a) =>
      (await docker.inspectContainer(containerOf(sandbox)))!.HostConfig.Mounts
        .find((m) => m.Target === "/opt/waffle/egress")?.Source;
    assert.notEqual(await mounts(a), await mounts(b));
    const listing = await asRoot(
      containerOf(b),
      "ls -A /opt/waffle/egress; ls /egress 2>&1 | head -1",
    );
    assert.equal(listing.stdout.split("\n")[0], "proxy.s");

    // A policy change: alice loses api.test, without a new container.
    const before = containerOf(a);
    await world.writeConfig({ egress: [world.entry("other")] });
    assert.equal((await get(a, "api")).stdout, "000");
    assert.equal((await get(a, "other")).stdout, "200");
    assert.equal(containerOf(a), before);
  },
);

liveTest(
  "with the proxy stopped a sandbox's egress fails closed and exec still works; the next call starts it again",
  async (docker) => {
    await using world = await egressHome(docker, { config: (w) => ({ egress: [w.entry("api")] }) });
    const sandbox = world.home.open(uniqueUser("down"));
    const url = `https://${world.entry("api")}/`;
    assert.equal((await sh(sandbox, `${CURL} -o /dev/null ${url}`)).code, 0);
    const stopped = await dockerCli(["stop", "-t", "1", proxyContainerName(world.home.home)]);
    assert.equal(stopped.code, 0, stopped.stderr);
    const before = world.upstreams.api.connections;
    // Outside any waffle call (which would start the proxy again): a process in the sandbox.
    // docker exec has the runner's environment, not a command's: the proxy named.
    const down = await asRoot(
      containerOf(sandbox),
      `${CURL} -x http://127.0.0.1:3128 -o /dev/null ${url} 2>&1; echo "exit $?"`,
    );
    assert.match(down.stdout, /exit (52|56|7)\n/);
    assert.equal(world.upstreams.api.connections, before);
    const exec = await sh(sandbox, "echo still");
    assert.equal(exec.stdout, "still\n");
    assert.equal((await sh(sandbox, `${CURL} -o /dev/null ${url}`)).code, 0);
  },
);

liveTest(
  "a compromised runner cannot replace its socket, reach the proxy's files or the control socket, or pass as another user",
  async (docker) => {
    await using world = await egressHome(docker, { config: (w) => ({ egress: [w.entry("api")] }) });
    const sandbox = world.home.open(uniqueUser("runner"));
    assert.equal((await sh(sandbox, "true")).code, 0);
    const id = containerOf(sandbox);
    const attempts = await asRoot(
      id,
      [
        "rm -f /opt/waffle/egress/proxy.s 2>/dev/null && echo removed || echo rm-refused",
        "touch /opt/waffle/egress/x 2>/dev/null && echo wrote || echo write-refused",
        "find / -xdev \\( -name ca.key -o -name 'ctl.s' -o -name '*.json' -path '*policies*' \\) 2>/dev/null | head -3; echo searched",
      ].join("; "),
    );
    assert.equal(attempts.stdout, "rm-refused\nwrite-refused\nsearched\n");
    const forged = await asRoot(
      id,
      `printf 'CONNECT api.test:${world.upstreams.api.port} HTTP/1.1\\r\\nX-Waffle-User: someone-else\\r\\n\\r\\n' | ` +
        `python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect("/opt/waffle/egress/proxy.s"); s.sendall(sys.stdin.buffer.read()); print(s.recv(100).decode().splitlines()[0])'`,
    );
    assert.equal(forged.stdout, "HTTP/1.1 200 Connection established\n");
    // The proxy writes a connection's line once it ends, after the answer the
    // attacker read: wait for it (bounded) before judging whose it is.
    const forgedLines = () =>
      world.audit().filter((line) => line.destination?.startsWith("api.test") === true);
    await waitFor(() => forgedLines().length > 0, { what: "the forged connection's audit line" });
    assert.equal(forgedLines().at(-1)?.user, sandbox.key.user);
  },
);

liveTest(
  "egress reload applies an edited list to a running command's next connection; status and doctor show the proxy",
  async (docker) => {
    await using world = await egressHome(docker, { config: (w) => ({ egress: [w.entry("api")] }) });
    const sandbox = world.home.open(uniqueUser("reload"));
    const url = `https://${world.entry("api")}/`;
    // A command that keeps connecting, one attempt every 200 ms, until told to stop.
    const id = await sandbox.submit({
      shell:
        `for i in $(seq 1 100); do ${CURL} -o /dev/null -w '%{http_code}\\n' ${url} 2>/dev/null; ` +
        `[ -e /workspace/stop ] && break; sleep 0.2; done`,
    });
    await waitFor(() => world.upstreams.api.connections >= 2, {
      timeoutMs: 30_000,
      what: "first connections",
    });
    await world.writeConfig({ egress: [world.entry("other")] });
    const reload = await world.home.cli(["egress", "reload", "--json"]);
    assert.equal(reload.code, 0, reload.stderr);
    assert.equal(JSON.parse(reload.stdout).identities.length, 1);
    const seen = world.upstreams.api.connections;
    await waitFor(
      () =>
        world.audit().some((line) => line.destination === "api.test" && line.decision === "denied"),
      { timeoutMs: 30_000, what: "a refused connection after the reload" },
    );
    await Deno.writeTextFile(`${sandbox.paths.workspace}/stop`, "");
    const { stdout } = await sandbox.queue.collect(id);
    const codes = new TextDecoder().decode(stdout).trim().split("\n");
    assert.equal(codes[0], "200");
    assert.equal(codes.at(-1), "000");
    assert.ok(world.upstreams.api.connections <= seen + 1);

    const status = await world.home.cli(["egress", "status", "--json"]);
    assert.equal(status.code, 0, status.stderr);
    const parsed = JSON.parse(status.stdout);
    assert.equal(parsed.proxy.state, "running");
    assert.equal(parsed.answering.ok, true);
    assert.match(parsed.ca.fingerprint, /^([0-9A-F]{2}:){31}[0-9A-F]{2}$/);
    assert.deepEqual(
      parsed.identities.map((i: { identity: { user: string } }) => i.identity.user),
      [
        sandbox.key.user,
      ],
    );
    const doctor = await world.home.cli(["doctor", "--json"]);
    const row = JSON.parse(doctor.stdout).checks.find((c: { name: string }) =>
      c.name === "egress proxy"
    );
    assert.equal(row?.ok, true, JSON.stringify(row));
    assert.match(row.detail, /running, answers in .* 1 identities, CA SHA-256/);
  },
);

// Times `count` HTTPS requests, each on a connection of its own, through the
// proxy; prints the p50 in ms.
const TIMED_GETS = (url: string, count: number) => `
import time, requests, statistics
times = []
for _ in range(${count}):
    t = time.perf_counter()
    r = requests.get("${url}", headers={"Connection": "close"}, timeout=20)
    assert r.status_code == 200, r.status_code
    times.append((time.perf_counter() - t) * 1000)
print(round(statistics.median(times), 2))
`;

liveTest(
  "500 parallel CONNECTs from one sandbox are capped at max_connections and deny another sandbox nothing (its every request answered, its audit all allowed)",
  async (docker) => {
    await using world = await egressHome(docker, {
      config: (w) => ({ egress: [w.entry("api")] }),
    });
    const flooder = world.home.open(uniqueUser("flood"));
    const victim = world.home.open(uniqueUser("victim"));
    const url = `https://${world.entry("api")}/`;
    // Each of the victim's 40 requests must be answered 200 (the script
    // asserts it); its p50 is printed, not asserted: the time it takes is
    // the bench's figure (egress_https_flooded beside egress_https_proxy).
    const p50 = async (): Promise<number> => {
      const out = await sh(victim, `python3 -c '${TIMED_GETS(url, 40)}'`);
      assert.equal(out.code, 0, out.stderr);
      return Number(out.stdout.trim());
    };
    await p50(); // warm: the sandbox and the proxy's first connection
    const before = await p50();
    const flood = await flooder.submit({
      shell: `python3 -c '${CONNECT_FLOOD(UPSTREAM_API, world.upstreams.api.port)}'`,
    });
    const floodLines = (): EgressAuditLine[] =>
      world.audit().filter((line) => line.user === flooder.key.user);
    await waitFor(() => floodLines().length > 100, {
      timeoutMs: 30_000,
      what: "the flood under way",
    });
    const victimSince = world.audit().filter((line) => line.user === victim.key.user).length;
    const during = await p50();
    await Deno.writeTextFile(`${flooder.paths.workspace}/stop`, "");
    const { stdout } = await flooder.queue.collect(flood);
    const flooded = new TextDecoder().decode(stdout).trim();
    assert.match(flooded, /^\d+ \d+$/);
    const [accepted, refused] = flooded.split(" ").map(Number);
    const capped = floodLines().filter((line) => /max_connections/.test(line.reason ?? ""));
    // deno-lint-ignore no-console
    console.log(
      `victim p50 ${before} ms alone, ${during} ms during the flood (${
        (during / before).toFixed(2)
      }x); flood: ${accepted} tunnels, ${refused} refused (${capped.length} over max_connections)`,
    );
    assert.ok(capped.length > 0, "the flood met the connection cap");
    assert.ok(refused! > 0, "the flooder saw refusals");
    // The victim was denied nothing while the flood held its own cap.
    const victimLines = world.audit().filter((line) => line.user === victim.key.user)
      .slice(victimSince);
    assert.ok(victimLines.length > 0, "the victim's requests were audited");
    const denied = victimLines.filter((line) => line.decision !== "allowed");
    assert.deepEqual(denied, [], "the victim was refused during the flood");
  },
);

liveTest(
  "rm --purge forgets a sandbox's egress identity: its policy, its socket and the proxy's listener",
  async (docker) => {
    await using world = await egressHome(docker, { config: (w) => ({ egress: [w.entry("api")] }) });
    const sandbox = world.home.open(uniqueUser("purged"));
    assert.equal((await sh(sandbox, "true")).code, 0);
    const id = recordedLaunch(sandbox.paths.root)!.id;
    const own = identityPaths(homeEgress(world.home.home), id);
    assert.ok(lexists(own.policy) && lexists(own.socket));
    sandbox.close();
    await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true });
    assert.equal(lexists(own.policy), false);
    assert.equal(lexists(own.dir), false);
    const status = await world.home.cli(["egress", "status", "--json"]);
    assert.deepEqual(JSON.parse(status.stdout).identities, []);
  },
);
