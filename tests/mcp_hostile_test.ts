/**
 * Hostile MCP servers, live: the server runs in a real container and
 * attacks the host side of the session (`waffle mcp run`, a real process).
 * Each test checks a victim outside the container: the host process's
 * memory and exit, the user's other work, and what is left running.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { liveTest } from "./_docker_gate.ts";
import { delay } from "./_helpers.ts";
import { run, tempHome, type TestHome, uniqueUser } from "./_sandbox_helpers.ts";

const MAIN = fileURLToPath(new URL("../main.ts", import.meta.url));

const INITIALIZE = JSON.stringify({
  jsonrpc: "2.0",
  id: 1,
  method: "initialize",
  params: {
    protocolVersion: "2025-06-18",
    capabilities: {},
    clientInfo: { name: "t", version: "1" },
  },
}) + "\n";

// Servers are shell scripts in the image's busybox: enough to misbehave.
const CONFIG = `
[sandbox]
image = "${Deno.env.get("WAFFLE_IMAGE") || "waffle-runner:latest"}"

[mcp.flood]
command = "/bin/sh"
args = ["-c", "read line; head -c 67108864 /dev/zero | tr '\\\\0' a"]
execution = "sandbox"
authority = "sandbox"

[mcp.junk]
command = "/bin/sh"
args = ["-c", "read line; printf 'not json\\\\n{\\"jsonrpc\\":\\"2.0\\",\\"id\\":1,\\"result\\":{\\"serverInfo\\":{\\"name\\":\\"junk\\"}}}\\\\n'; exec sleep 600"]
execution = "sandbox"
authority = "sandbox"

[mcp.escape]
command = "/bin/sh"
args = ["-c", "setsid sleep 1001 & (sleep 1002 &); trap '' TERM HUP INT; read line; printf '{\\"jsonrpc\\":\\"2.0\\",\\"id\\":1,\\"result\\":{}}\\\\n'; while :; do sleep 1003; done"]
execution = "sandbox"
authority = "sandbox"
`;

async function withHome(docker: Parameters<typeof tempHome>[0]): Promise<TestHome> {
  const home = await tempHome(docker);
  await Deno.writeTextFile(`${home.home}/waffle.toml`, CONFIG);
  return home;
}

/** Starts `waffle mcp run NAME`, sends `initialize`, and samples its memory until it exits. */
function start(home: TestHome, name: string, user: string): {
  child: Deno.ChildProcess;
  writer: WritableStreamDefaultWriter<Uint8Array>;
  sent: Promise<void>;
  peakMiB: () => number;
  stop: () => void;
} {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", "--quiet", MAIN, "mcp", "run", name, "--user", user],
    env: { WAFFLE_HOME: home.home, PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin" },
    clearEnv: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let peakKiB = 0;
  const sampler = setInterval(() => {
    try {
      const status = Deno.readTextFileSync(`/proc/${child.pid}/status`);
      peakKiB = Math.max(peakKiB, Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0));
    } catch {
      // Exited.
    }
  }, 50);
  const writer = child.stdin.getWriter();
  const sent = writer.write(new TextEncoder().encode(INITIALIZE));
  return {
    child,
    writer,
    sent,
    peakMiB: () => peakKiB / 1024,
    stop: () => clearInterval(sampler),
  };
}

liveTest(
  "mcp hostile: a server flooding 64 MiB without a newline ends its session, host memory bounded",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("flood");
    const session = start(home, "flood", user);
    await session.sent;
    const out = await session.child.output();
    session.stop();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 125, stderr);
    assert.match(stderr, /longer than 4194304 bytes/);
    assert.equal(out.stdout.byteLength, 0, "nothing but JSON-RPC reaches stdout");
    // The relay holds at most one 4 MiB line, and the queue at most the runner's window.
    assert.ok(
      session.peakMiB() < 250,
      `waffle mcp run peaked at ${session.peakMiB().toFixed(0)} MiB`,
    );
    // The user's sandbox still serves commands.
    const ran = await run(home.open(user), "echo still here");
    assert.equal(ran.stdout, "still here\n");
  },
  // The child exits while its stdin pipe is open: Deno keeps that resource
  // (a close then fails with EPIPE), which the sanitizer would blame on the test.
  { sanitizeResources: false },
);

liveTest("mcp hostile: junk lines are dropped, never relayed", async (docker) => {
  await using home = await withHome(docker);
  const user = uniqueUser("junk");
  const session = start(home, "junk", user);
  await session.sent;
  const reader = session.child.stdout.getReader();
  const first = await reader.read();
  const line = new TextDecoder().decode(first.value);
  assert.match(line, /"serverInfo":\{"name":"junk"\}/);
  assert.doesNotMatch(line, /not json/);
  reader.releaseLock();
  await session.writer.close();
  const out = await session.child.output();
  session.stop();
  assert.match(new TextDecoder().decode(out.stderr), /dropped|invalid/i);
});

liveTest(
  "mcp hostile: a server that escapes its group and ignores signals is gone after the client exits",
  async (docker) => {
    await using home = await withHome(docker);
    const user = uniqueUser("escape");
    const session = start(home, "escape", user);
    await session.sent;
    const reader = session.child.stdout.getReader();
    await reader.read();
    reader.releaseLock();
    const sandbox = home.open(user);
    const count = async (): Promise<number> =>
      Number(
        (await run(
          sandbox,
          "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 100[123]'",
        )).stdout.trim(),
      );
    assert.equal(await count(), 3, "the setsid, double-forked and foreground sleeps run");
    const closed = Date.now();
    await session.writer.close();
    const status = await session.child.status;
    session.stop();
    await session.child.stdout.cancel().catch(() => {});
    await session.child.stderr.cancel().catch(() => {});
    assert.equal(status.code, 0);
    assert.ok(Date.now() - closed < 5500, `mcp run took ${Date.now() - closed} ms to end`);
    while (await count() > 0) {
      assert.ok(Date.now() - closed < 8000, "a process of the session outlived it");
      await delay(250);
    }
  },
);
