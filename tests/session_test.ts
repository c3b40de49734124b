/**
 * Sessions over the queue: a real `waffle runner` process and real
 * commands, stdin and stdout streamed both ways through the two files.
 */
import assert from "node:assert/strict";
import { Queue } from "../lib/queue/queue.ts";
import { notRunResult, SESSION_WINDOW_BYTES } from "../lib/queue/protocol.ts";
import { QueueSession, type SessionTarget } from "../lib/queue/session.ts";
import { UsageError } from "../lib/errors.ts";
import { RunnerQueue } from "../lib/queue/runner_queue.ts";
import { connectChannel, HostChannel } from "../lib/queue/channel.ts";
import { SessionFeed } from "../runner/session.ts";
import { alive, startRunner, tempQueue, text, waitFor } from "./_helpers.ts";

const encode = (value: string): Uint8Array => new TextEncoder().encode(value);

function target(queue: Queue): SessionTarget {
  return { queue, submit: (options) => queue.submit(options) };
}

Deno.test("session streams stdin and stdout both ways and ends at the end of input", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const session = await QueueSession.open(target(queue), {
    argv: ["sh", "-c", 'while read line; do echo "got $line"; echo "err $line" >&2; done'],
    cwd: "made/here",
    makeCwd: true,
  });
  const output = session.output();
  const seen = { stdout: "", stderr: "" };
  for (const word of ["one", "two", "three"]) {
    await session.write(encode(`${word}\n`));
    // Each answer arrives while the session is still open: it is a conversation.
    while (!seen.stdout.includes(`got ${word}\n`)) {
      const next = await output.next();
      assert.equal(next.done, false);
      if (!next.done) seen[next.value.stream] += text(next.value.data);
    }
  }
  await session.end();
  let next = await output.next();
  while (!next.done) {
    seen[next.value.stream] += text(next.value.data);
    next = await output.next();
  }
  assert.equal(seen.stdout, "got one\ngot two\ngot three\n");
  assert.equal(next.value.exitCode, 0);
  assert.ok((await Deno.stat(`${q.workspace}/made/here`)).isDirectory);
  await assert.rejects(session.end(), UsageError);
  await session.close();
  queue.close();
});

Deno.test("session ends when its host stops renewing the lease, tree and all", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  // Submitted by hand and never renewed: what a host that died leaves behind.
  const id = await queue.submit({
    argv: ["sh", "-c", "sleep 300 & echo $!; wait"],
    session: { leaseMs: 1500, idleMs: 60_000 },
  });
  const stream = queue.output(id);
  const first = await stream.next();
  assert.equal(first.done, false);
  const child = Number(first.done ? NaN : text(first.value.data).trim());
  assert.ok(alive(child));
  const started = Date.now();
  const result = await queue.wait(id);
  assert.match(result.error ?? "", /stopped renewing the lease/);
  assert.ok(Date.now() - started < 5000, `ended ${Date.now() - started} ms after`);
  assert.equal(alive(child), false);
  queue.close();
});

Deno.test("session whose server ignores the end of its input is killed after the grace", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const session = await QueueSession.open(target(queue), {
    argv: ["sh", "-c", "trap '' TERM HUP; exec sleep 300 < /dev/null"],
  });
  await session.end();
  const started = Date.now();
  const result = await queue.wait(session.id);
  assert.ok(Date.now() - started < 5000);
  assert.match(result.error ?? "", /did not exit within/);
  assert.equal(result.signal, "SIGKILL");
  await session.close();
  queue.close();
});

Deno.test("session and exec requests never wait for each other", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const session = await QueueSession.open(target(queue), { argv: ["cat"] });
  const output = session.output();
  // A long exec is running: the session still answers.
  const slow = await queue.submit({ argv: ["sleep", "3"] });
  await waitFor(() => queue.state(slow).state === "started");
  await session.write(encode("ping\n"));
  const echoed = await output.next();
  assert.equal(echoed.done ? "" : text(echoed.value.data), "ping\n");
  assert.equal(queue.state(slow).state, "started");
  // And execs run one after another while the session stays open.
  for (let i = 0; i < 3; i++) {
    const id = await queue.submit({ argv: ["echo", String(i)] });
    assert.equal(text((await queue.collect(id)).stdout), `${i}\n`);
  }
  await session.write(encode("pong\n"));
  const again = await output.next();
  assert.equal(again.done ? "" : text(again.value.data), "pong\n");
  await session.end();
  await session.close();
  queue.close();
});

Deno.test("session output beyond the window waits for the host, and none is lost", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const total = 6 * SESSION_WINDOW_BYTES;
  const session = await QueueSession.open(target(queue), {
    argv: ["sh", "-c", `head -c ${total} /dev/zero | tr '\\0' x`],
  });
  let received = 0;
  let largestFile = 0;
  const output = session.output();
  let next = await output.next();
  while (!next.done) {
    received += next.value.data.byteLength;
    largestFile = Math.max(largestFile, (await Deno.stat(queue.paths.outbound)).size);
    next = await output.next();
  }
  assert.equal(received, total);
  assert.equal(next.value.exitCode, 0);
  // The runner dropped what the host read: the file never held the whole stream.
  assert.ok(largestFile < total / 2, `outbound.db grew to ${largestFile} bytes`);
  await session.close();
  queue.close();
});

Deno.test("session with no input and no output for its idle limit ends", async () => {
  await using q = await tempQueue();
  await using _runner = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  const session = await QueueSession.open(target(queue), { argv: ["cat"], idleMs: 1000 });
  const output = session.output();
  // Traffic keeps it alive past the limit.
  for (let i = 0; i < 4; i++) {
    await session.write(encode("tick\n"));
    assert.equal((await output.next()).done, false);
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
  const quiet = Date.now();
  let next = await output.next();
  while (!next.done) next = await output.next();
  assert.match(next.value.error ?? "", /idle for 1000 ms/);
  assert.ok(Date.now() - quiet < 4000);
  await session.close();
  queue.close();
});

Deno.test("a session reported started whose runner never connected to its channel is an error, never its result", async () => {
  await using q = await tempQueue();
  const channelDir = await Deno.makeTempDir({ prefix: "waffle-ch-" });
  const queue = Queue.open(q.queueDir);
  const runner = RunnerQueue.open(q.queueDir);
  try {
    const session = await QueueSession.open(
      { ...target(queue), channelDir },
      { argv: ["sh", "-c", "cat > f.txt"] },
    );
    assert.ok(session.channelSocket !== undefined);
    // Waits for a connection that never comes; fails once the output gave up.
    const writing = session.write(encode("important data\n")).then(() => "written", String);
    // A runner that says it ran the session (exit 0) and never connected:
    // before the fix, the host reported that result, the input lost.
    const [request] = runner.newRequests();
    assert.equal(request?.id, session.id);
    await runner.accept([session.id], "boot");
    await runner.start(session.id, "boot", request!.seq);
    const now = Date.now();
    await runner.finish(notRunResult(session.id, { startedAt: now, endedAt: now, exitCode: 0 }));
    await assert.rejects(async () => {
      const output = session.output();
      let next = await output.next();
      while (!next.done) next = await output.next();
    }, /started but its runner never connected to its channel/);
    assert.match(await writing, /The channel closed before the runner connected/);
    await session.close();
  } finally {
    runner.close();
    queue.close();
    await Deno.remove(channelDir, { recursive: true });
  }
});

Deno.test("a reset of its channel ends the runner's session with the reason, never the process's input", async () => {
  await using q = await tempQueue();
  const channelDir = await Deno.makeTempDir({ prefix: "waffle-ch-" });
  const runner = RunnerQueue.open(q.queueDir);
  const abort = new AbortController();
  const feed = new SessionFeed(runner, {
    id: "s",
    spec: { leaseMs: 600_000, idleMs: 600_000 },
    abort,
  });
  try {
    const host = HostChannel.open(channelDir)!;
    const channel = await connectChannel(channelDir, host.spec);
    feed.useChannel(channel);
    const conn = await host.connection();
    await conn.write(encode("half of it"));
    const stdin = feed.stdin.getReader();
    assert.equal(text((await stdin.read()).value!), "half of it");
    // The host goes with the runner's output unread: a reset.
    await channel.write("stdout", encode("unread"));
    host.close();
    let settled = false;
    stdin.read().then(() => (settled = true), () => (settled = true));
    // Before the fix the reset was the end of input (the process took half
    // for the whole) and the session went on.
    await waitFor(() => abort.signal.aborted || settled);
    assert.equal(settled, false, "the process's stdin ended");
    assert.match(feed.endedBecause ?? "", /^Session ended: its input was cut short: /);
    channel.close();
  } finally {
    feed.stop();
    runner.close();
    await Deno.remove(channelDir, { recursive: true });
  }
});
