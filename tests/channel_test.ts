/**
 * A session's fast channel (`lib/queue/channel.ts`): the host's listener
 * takes exactly one connection that shows the session's token, never
 * connects anywhere itself, and reads the runner's frames only within
 * their cap. Unit tests use real unix sockets on the host; the live tests
 * mount the attacks from inside a real container, as a command and as the
 * runner, with a session streaming meanwhile.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { connectChannel, HostChannel, readFrames } from "../lib/queue/channel.ts";
import { MAX_CHUNK_BYTES } from "../lib/queue/protocol.ts";
import { QueueSession } from "../lib/queue/session.ts";
import { SANDBOX_CHANNEL_DIR } from "../lib/config/sandbox_paths.ts";
import { bothWays, victimFile } from "./_hostile_helpers.ts";
import { runOk, tempHome, uniqueUser } from "./_sandbox_helpers.ts";

async function channelDir(): Promise<{ dir: string } & AsyncDisposable> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-ch-" });
  return {
    dir,
    async [Symbol.asyncDispose](): Promise<void> {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
}

const encoder = new TextEncoder();

Deno.test("the host channel takes only the connection that shows the token, then removes its socket", async () => {
  await using place = await channelDir();
  const channel = HostChannel.open(place.dir)!;
  const path = join(place.dir, channel.spec.socket);
  assert.equal((await Deno.lstat(path)).mode! & 0o777, 0o600);
  // A wrong token, a short one and a silent connection first.
  const wrong = await Deno.connect({ transport: "unix", path });
  await wrong.write(encoder.encode(`${"0".repeat(64)}\n`));
  const short = await Deno.connect({ transport: "unix", path });
  await short.write(encoder.encode("abc"));
  short.closeWrite();
  const silent = await Deno.connect({ transport: "unix", path });
  const runner = await connectChannel(place.dir, channel.spec);
  const conn = await channel.connection();
  // The wrong ones were closed: a read ends.
  assert.equal(await wrong.read(new Uint8Array(8)), null);
  await assert.rejects(Deno.lstat(path), Deno.errors.NotFound);
  // Frames in order, then the end.
  await runner.write("stdout", encoder.encode("out"));
  await runner.write("stderr", encoder.encode("err"));
  await runner.end();
  const chunks = [];
  for await (const chunk of readFrames(conn)) chunks.push(chunk);
  assert.deepEqual(
    chunks.map((c) => [c.stream, c.seq, new TextDecoder().decode(c.data)]),
    [["stdout", 0, "out"], ["stderr", 0, "err"]],
  );
  channel.close();
  for (const other of [wrong, short, silent]) other.close();
});

Deno.test("readFrames() lends each frame from its one buffer when asked: a flood allocates nothing per frame", async () => {
  await using place = await channelDir();
  const channel = HostChannel.open(place.dir)!;
  const runner = await connectChannel(place.dir, channel.spec);
  const conn = await channel.connection();
  const frames = ["one", "two", "three"];
  for (const text of frames) await runner.write("stdout", encoder.encode(text));
  await runner.end();
  const seen: { text: string; buffer: ArrayBufferLike }[] = [];
  // Each chunk is read before the next is asked for, as a borrowing reader must.
  for await (const chunk of readFrames(conn, { borrowed: true })) {
    seen.push({ text: new TextDecoder().decode(chunk.data), buffer: chunk.data.buffer });
  }
  assert.deepEqual(seen.map((s) => s.text), frames);
  assert.equal(new Set(seen.map((s) => s.buffer)).size, 1, "one buffer lent throughout");
  channel.close();
});

Deno.test("the host channel refuses frames over the chunk cap and of unknown streams", async (t) => {
  for (
    const [what, header] of [
      ["over the cap", [1, ...u32(MAX_CHUNK_BYTES + 1)]],
      ["an unknown stream", [7, ...u32(1)]],
      ["an empty frame", [1, ...u32(0)]],
    ] as const
  ) {
    await t.step(what, async () => {
      await using place = await channelDir();
      const channel = HostChannel.open(place.dir)!;
      const raw = await Deno.connect({
        transport: "unix",
        path: join(place.dir, channel.spec.socket),
      });
      await raw.write(encoder.encode(`${channel.spec.token}\n`));
      await raw.write(new Uint8Array(header));
      const conn = await channel.connection();
      await assert.rejects(async () => {
        for await (const _ of readFrames(conn)) { /* nothing is yielded */ }
      }, /The channel sent a frame/);
      raw.close();
      channel.close();
    });
  }
});

Deno.test("the host channel gives up after a flood of connections without the token", async () => {
  await using place = await channelDir();
  const channel = HostChannel.open(place.dir)!;
  const path = join(place.dir, channel.spec.socket);
  const failed = channel.connection().then(() => "connected", (error) => String(error));
  for (let i = 0; i < 200; i++) {
    try {
      const conn = await Deno.connect({ transport: "unix", path });
      await conn.write(encoder.encode(`${"f".repeat(64)}\n`)).catch(() => 0);
      conn.close();
    } catch {
      break; // the socket is gone: the host gave up
    }
  }
  assert.match(await failed, /connections without its token/);
  await assert.rejects(Deno.lstat(path), Deno.errors.NotFound);
  channel.close();
});

Deno.test("a connection that never shows its token is closed after the handshake time, and the host goes on", async () => {
  await using place = await channelDir();
  const channel = HostChannel.open(place.dir)!;
  const path = join(place.dir, channel.spec.socket);
  const silent = await Deno.connect({ transport: "unix", path });
  // Past the 2 s handshake: the host closed it (before the fix, its second
  // close was an uncaught error that ended the host process).
  await new Promise((resolve) => setTimeout(resolve, 2500));
  assert.equal(await silent.read(new Uint8Array(8)).catch(() => null), null);
  silent.close();
  const runner = await connectChannel(place.dir, channel.spec);
  const conn = await channel.connection();
  await runner.write("stdout", encoder.encode("late but fine"));
  await runner.end();
  const chunks = [];
  for await (const chunk of readFrames(conn)) chunks.push(new TextDecoder().decode(chunk.data));
  assert.deepEqual(chunks, ["late but fine"]);
  channel.close();
});

Deno.test("connections beyond the handshakes in progress count against the channel", async () => {
  await using place = await channelDir();
  const channel = HostChannel.open(place.dir)!;
  const path = join(place.dir, channel.spec.socket);
  const failed = channel.connection().then(() => "connected", (error) => String(error));
  const holding = [];
  for (let i = 0; i < 8; i++) holding.push(await Deno.connect({ transport: "unix", path }));
  for (let i = 0; i < 200; i++) {
    try {
      (await Deno.connect({ transport: "unix", path })).close();
    } catch {
      break; // the socket is gone: the host gave up
    }
  }
  assert.match(await failed, /connections without its token/);
  for (const conn of holding) conn.close();
  channel.close();
});

function u32(value: number): number[] {
  const bytes = new Uint8Array(4);
  new DataView(bytes.buffer).setUint32(0, value);
  return [...bytes];
}

// ---------------------------------------------------------------------------
// Live: the attacks from inside a container, with a session streaming.

bothWays(
  "the channel directory: the sandbox cannot replace or plant a socket there, and a wrong token does not take a session",
  async (docker, attacker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    await using victim = await victimFile();
    const sandbox = home.open(uniqueUser("chan"));
    await runOk(sandbox, "true");
    const session = await QueueSession.open(sandbox, { argv: ["cat"] });
    assert.ok(session.channelSocket !== undefined, "the session streams over rows");
    // A socket nobody has connected to yet (the session's is gone once taken).
    const waiting = HostChannel.open(sandbox.paths.channel)!;
    const inside = `${SANDBOX_CHANNEL_DIR}/${waiting.spec.socket}`;
    // Planting, replacing, linking to the victim: a command is refused at
    // the directory (EACCES), the runner by the read-only mount (EROFS).
    const attack = await attacker.sh(
      sandbox,
      [
        `ls ${SANDBOX_CHANNEL_DIR} && echo listed`,
        `rm ${inside} && echo removed`,
        `ln -s ${victim.path} ${SANDBOX_CHANNEL_DIR}/0000000000000000.s && echo linked`,
        `: > ${SANDBOX_CHANNEL_DIR}/planted && echo planted`,
        "true",
      ].join("; "),
    );
    assert.doesNotMatch(attack.stdout, /removed|linked|planted/, attack.stdout);
    if (attacker.kind === "command") assert.doesNotMatch(attack.stdout, /listed/);
    else assert.match(attack.stderr, /Read-only file system/);
    // Connecting with a wrong token (only the runner can reach the socket at all).
    const knock = await attacker.deno(
      sandbox,
      `
      try {
        const conn = await Deno.connect({ transport: "unix", path: ${JSON.stringify(inside)} });
        await conn.write(new TextEncoder().encode("${"e".repeat(64)}\\n"));
        console.log("read", await conn.read(new Uint8Array(16)));
      } catch (error) {
        console.log("refused", error.name);
      }
      `,
    );
    if (attacker.kind === "command") assert.match(knock.stdout, /refused/, knock.stderr);
    else assert.match(knock.stdout, /read null/, knock.stderr);
    // Still waiting for its runner: a wrong token took nothing.
    assert.equal(waiting.connected, undefined);
    waiting.close();
    // The session is the runner's still: it echoes, and ends cleanly.
    const output = session.output();
    await session.write(encoder.encode("still mine\n"));
    const first = await output.next();
    assert.equal(first.done, false);
    assert.equal(new TextDecoder().decode(first.value!.data), "still mine\n");
    await session.end();
    let next = await output.next();
    while (!next.done) next = await output.next();
    assert.equal(next.value.exitCode, 0);
    await session.close();
    // Nothing appeared on the host beside the (removed) socket.
    assert.deepEqual([...Deno.readDirSync(sandbox.paths.channel)], []);
    victim.check();
  },
);
