/**
 * Detached processes (`spawn(..., {detached: true})`, `sandbox.attach(id)`):
 * a process outlives the host that spawned it (killed with SIGKILL), and
 * another host takes it over with the output that waited, its stdin and its
 * exact status, without running it again. A paused sandbox's processes
 * outlive a pause longer than their lease and idle limit.
 *
 * @module
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { UsageError } from "../lib/errors.ts";
import { pauseSandbox, resumeSandbox } from "../lib/lifecycle/pause.ts";
import { liveTest } from "./_docker_gate.ts";
import { runOk, tempHome, uniqueUser } from "./_sandbox_helpers.ts";
import { delay } from "./_helpers.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url)).replace(/\/$/, "");
const encoder = new TextEncoder();
const decoder = new TextDecoder();

async function readAll(stream: ReadableStream<Uint8Array>): Promise<string> {
  let text = "";
  for await (const chunk of stream) text += decoder.decode(chunk, { stream: true });
  return text + decoder.decode();
}

liveTest(
  "a detached process outlives its host's SIGKILL: another host attaches, gets what waited, feeds its stdin and its exact status; it ran once",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("detach");
    const sandbox = home.open(user);
    await runOk(sandbox, "true");
    // The first host: spawns, prints the id, and is killed without a word.
    const script = `${home.home}/first_host.ts`;
    await Deno.writeTextFile(
      script,
      `import { openSandbox } from ${JSON.stringify(`${REPO}/lib/mod.ts`)};
const sandbox = openSandbox(${JSON.stringify(user)}, { config: { home: ${
        JSON.stringify(home.home)
      } } });
const process = await sandbox.spawn(
  ["sh", "-c", 'echo started >> /workspace/runs; echo first; read x; echo "got $x"; exit 7'],
  { detached: true, leaseMs: 60000 },
);
console.log(process.id);
await new Promise(() => {});
`,
    );
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "--allow-all", "--quiet", script],
      stdin: "null",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let line = "";
    while (!line.includes("\n")) {
      const next = await reader.read();
      if (next.done) break;
      line += next.value;
    }
    child.kill("SIGKILL");
    await child.status;
    await reader.cancel();
    const id = line.trim();
    assert.match(id, /^[0-9a-f-]{36}$/, `the first host printed '${line}'`);

    const process = sandbox.attach(id);
    const writer = process.stdin.getWriter();
    await writer.write(encoder.encode("hi\n"));
    await writer.close();
    const [stdout, stderr, status] = await Promise.all([
      readAll(process.stdout),
      readAll(process.stderr),
      process.status,
    ]);
    // "first" was never acknowledged by the dead host: it waited in the queue.
    assert.equal(stdout, "first\ngot hi\n");
    assert.equal(stderr, "");
    assert.equal(status.exitCode, 7);
    assert.equal(await runOk(sandbox, "cat /workspace/runs"), "started\n");
  },
);

liveTest(
  "attach refuses a process that is not detached, and an unknown id, with one clear line",
  async (docker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("detachno"));
    await runOk(sandbox, "true");
    const attached = await sandbox.spawn(["sleep", "30"]);
    try {
      assert.throws(
        () => sandbox.attach(attached.id),
        (error: unknown) =>
          error instanceof UsageError &&
          error.message ===
            `Session '${attached.id}' streams over its host's socket and ended with it: only a session opened with 'channel: false' can be taken over`,
      );
      assert.throws(
        () => sandbox.attach("no-such-id"),
        (error: unknown) =>
          error instanceof UsageError && /^No request 'no-such-id' in queue '/.test(error.message),
      );
    } finally {
      await attached.kill();
      await attached.status.catch(() => {});
    }
  },
);

liveTest(
  "a spawned process outlives a pause longer than its lease and its idle limit",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("pauselease");
    const sandbox = home.open(user);
    await runOk(sandbox, "true");
    const process = await sandbox.spawn(["sh", "-c", 'read x; echo "got $x"'], {
      leaseMs: 1000,
      idleMs: 2000,
    });
    const options = { config: sandbox.config };
    assert.equal(await pauseSandbox(docker, sandbox.key, options), true);
    // Frozen for twice the idle limit and four leases.
    await delay(4000);
    assert.equal(await resumeSandbox(docker, sandbox.key, options), true);
    const writer = process.stdin.getWriter();
    await writer.write(encoder.encode("hi\n"));
    await writer.close();
    const [stdout, status] = await Promise.all([readAll(process.stdout), process.status]);
    await process.stderr.cancel();
    assert.equal(stdout, "got hi\n", JSON.stringify(status));
    assert.equal(status.exitCode, 0);
  },
);
