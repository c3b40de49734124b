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
import { openRestricted } from "../lib/sandbox/restricted.ts";
import { liveTest } from "./_docker_gate.ts";
import { runCliProcess } from "./_helpers.ts";
import { bothWays, containerOf, RUNNER, spawnAsRunner, victimFile } from "./_hostile_helpers.ts";
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

Deno.test("a silent peer holds no handshake slot: past 8 silent connections the runner's is still taken", async () => {
  await using place = await channelDir();
  const channel = HostChannel.open(place.dir)!;
  const path = join(place.dir, channel.spec.socket);
  const silent = [];
  for (let i = 0; i < 8; i++) silent.push(await Deno.connect({ transport: "unix", path }));
  // Before the fix the ninth connection (the runner's) was closed unread,
  // and nothing took it by the time the host gave up on the silent ones.
  const givenUp = Promise.all(silent.map((c) => c.read(new Uint8Array(8)).catch(() => null)));
  const runner = connectChannel(place.dir, channel.spec).catch((error: Error) => error);
  const taken = await Promise.race([
    channel.connection().then(() => "taken"),
    givenUp.then(() => "closed the silent ones first"),
  ]);
  assert.equal(taken, "taken");
  const connected = await runner;
  assert.ok(!(connected instanceof Error), String(connected));
  connected.close();
  channel.close();
  for (const conn of silent) conn.close();
});

Deno.test("connectChannel() fails when the host does not acknowledge the token", async (t) => {
  const cases = [
    ["reads it and says nothing", async (conn: Deno.UnixConn) => {
      await conn.read(new Uint8Array(128));
      // Then waits until the runner gives up (its close ends this read).
      await conn.read(new Uint8Array(1)).catch(() => null);
    }, /did not acknowledge the channel's token within 300 ms/],
    [
      "closes it unread",
      (conn: Deno.UnixConn) => conn.close(),
      /closed the channel unacknowledged 3 times/,
    ],
    ["answers another byte", async (conn: Deno.UnixConn) => {
      await conn.read(new Uint8Array(128));
      await conn.write(new Uint8Array([0x41]));
    }, /answered the channel's token with byte '65'/],
  ] as const;
  for (const [what, host, error] of cases) {
    await t.step(what, async () => {
      await using place = await channelDir();
      const spec = { socket: "0123456789abcdef.s", token: "ab".repeat(32) };
      const listener = Deno.listen({ transport: "unix", path: join(place.dir, spec.socket) });
      const conns: Deno.UnixConn[] = [];
      const serving = (async () => {
        for await (const conn of listener) {
          conns.push(conn);
          void Promise.resolve(host(conn)).catch(() => {});
        }
      })();
      await assert.rejects(connectChannel(place.dir, spec, { ackMs: 300 }), error);
      listener.close();
      await serving;
      for (const conn of conns) {
        try {
          conn.close();
        } catch {
          // Closed by the case.
        }
      }
    });
  }
});

// A runner's side that showed the token, by hand (the acknowledgement left unread).
async function rawRunner(place: { dir: string }, channel: HostChannel): Promise<Deno.UnixConn> {
  const raw = await Deno.connect({ transport: "unix", path: join(place.dir, channel.spec.socket) });
  await raw.write(encoder.encode(`${channel.spec.token}\n`));
  return raw;
}

const frame = (data: string): Uint8Array =>
  new Uint8Array([1, ...u32(encoder.encode(data).byteLength), ...encoder.encode(data)]);

Deno.test("readFrames() ends only at the runner's end frame: a reset or a close before it is an error", async (t) => {
  const cases = [
    ["a reset", false, true, /The session's channel failed/],
    ["a close", false, false, /closed before the end of its output/],
    ["the end frame, then a reset", true, true, undefined],
  ] as const;
  for (const [what, endFrame, reset, error] of cases) {
    await t.step(what, async () => {
      await using place = await channelDir();
      const channel = HostChannel.open(place.dir)!;
      const raw = await rawRunner(place, channel);
      const conn = await channel.connection();
      await raw.write(frame("sent"));
      if (endFrame) await raw.write(new Uint8Array(5));
      // Unread input in the runner's socket makes its close a reset; the
      // end of its writing half is a plain end.
      if (reset) {
        await conn.write(encoder.encode("unread stdin"));
        raw.close();
      } else await raw.closeWrite();
      const got: string[] = [];
      const reading = (async () => {
        for await (const chunk of readFrames(conn)) got.push(new TextDecoder().decode(chunk.data));
      })();
      if (error === undefined) await reading;
      else await assert.rejects(reading, error);
      assert.deepEqual(got, ["sent"]);
      if (!reset) raw.close();
      channel.close();
    });
  }
});

Deno.test("the runner's frames arrive whole when a writer does not wait for the last one (the reused frame is not overwritten)", async () => {
  await using place = await channelDir();
  const channel = HostChannel.open(place.dir)!;
  const runner = await connectChannel(place.dir, channel.spec);
  const conn = await channel.connection();
  const sent = Array.from({ length: 20 }, (_, i) => `chunk ${i} `.repeat(1000 + i));
  // Not awaited one by one: every frame is queued while the earlier ones are sent.
  const writes = sent.map((text, i) =>
    runner.write(i % 3 === 0 ? "stderr" : "stdout", encoder.encode(text))
  );
  const reading = (async () => {
    const got: string[] = [];
    for await (const chunk of readFrames(conn)) got.push(new TextDecoder().decode(chunk.data));
    return got;
  })();
  await Promise.all(writes);
  await runner.end();
  assert.deepEqual(await reading, sent);
  runner.close();
  channel.close();
});

Deno.test("the runner's stdin: the end of the host's writing half ends it, a reset is an error", async (t) => {
  await t.step("the end", async () => {
    await using place = await channelDir();
    const channel = HostChannel.open(place.dir)!;
    const runner = await connectChannel(place.dir, channel.spec);
    const conn = await channel.connection();
    await conn.write(encoder.encode("all of it"));
    await conn.closeWrite();
    const reader = runner.stdin.getReader();
    assert.equal(new TextDecoder().decode((await reader.read()).value), "all of it");
    assert.equal((await reader.read()).done, true);
    runner.close();
    channel.close();
  });
  await t.step("a reset", async () => {
    await using place = await channelDir();
    const channel = HostChannel.open(place.dir)!;
    const runner = await connectChannel(place.dir, channel.spec);
    await channel.connection();
    await runner.write("stdout", encoder.encode("never read"));
    // The host closes with the runner's output unread: a reset, not an end.
    channel.close();
    await assert.rejects(runner.stdin.getReader().read(), /The host's channel failed/);
    runner.close();
  });
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

// ---------------------------------------------------------------------------
// Live: a hog on the channel directory (issue 22, F2). It finds every session
// socket it can, by listing `/opt/waffle/chan` and in `inbound.db`'s session
// requests (which its own container's runner can read), and for `seconds` at
// most either holds 8 silent connections on each, reopened as the host closes
// them (the handshakes the host serves at once), or floods it with
// connections closed at once.

function hogScript(seconds: number, mode: "silent" | "flood" = "silent"): string {
  return `
import { DatabaseSync } from "node:sqlite";
const deadline = Date.now() + ${seconds * 1000};
const dir = ${JSON.stringify(SANDBOX_CHANNEL_DIR)};
let inbound;
try {
  inbound = new DatabaseSync("/queue/inbound/inbound.db", { readOnly: true });
  inbound.exec("PRAGMA busy_timeout = 1000");
} catch {
  inbound = undefined;
}
const seen = new Set();
const hold = async (path) => {
  while (Date.now() < deadline) {
    let conn;
    try {
      conn = await Deno.connect({ transport: "unix", path });
    } catch {
      return; // the socket is gone: the host took its runner or gave up
    }
    // Silent until the host closes it (or at once), then again.
    if (${mode === "silent"}) await conn.read(new Uint8Array(64)).catch(() => null);
    try { conn.close(); } catch { /* closed */ }
  }
};
const names = () => {
  const found = [];
  try {
    for (const entry of Deno.readDirSync(dir)) if (entry.name.endsWith(".s")) found.push(entry.name);
  } catch { /* not listable */ }
  try {
    for (const row of inbound?.prepare("SELECT payload FROM requests ORDER BY seq DESC LIMIT 8").all() ?? []) {
      const socket = JSON.parse(row.payload).session?.channel?.socket;
      if (typeof socket === "string") found.push(socket);
    }
  } catch { /* busy: next round */ }
  return found;
};
console.log("ready");
while (Date.now() < deadline) {
  for (const name of names()) {
    if (seen.has(name)) continue;
    seen.add(name);
    console.log("hog " + name);
    for (let i = 0; i < ${mode === "silent" ? 8 : 4}; i++) void hold(dir + "/" + name);
  }
  await new Promise((r) => setTimeout(r, 3));
}
Deno.exit(0);
`;
}

const IMPORTANT = "important data\n";

/**
 * The user writes IMPORTANT into a workspace file, by `exec -i … cat > name`
 * or by `cp`: how the CLI ended, and what the file holds afterwards.
 */
async function userWrites(
  home: { home: string },
  user: string,
  options: { workspace: string; name: string; cp: boolean },
): Promise<{ code: number; stderr: string; written: string | undefined }> {
  const env = { WAFFLE_HOME: home.home };
  let ran;
  if (options.cp) {
    await using local = await channelDir();
    const from = join(local.dir, "in.txt");
    await Deno.writeTextFile(from, IMPORTANT);
    ran = await runCliProcess(["cp", from, `${user}:${options.name}`], { env });
  } else {
    ran = await runCliProcess(
      ["exec", "-i", "--user", user, "--", "sh", "-c", `cat > ${options.name}`],
      { env, stdin: encoder.encode(IMPORTANT) },
    );
  }
  const written = await Deno.readTextFile(join(options.workspace, options.name)).catch(() =>
    undefined
  );
  return { code: ran.code, stderr: ran.stderr, written };
}

// Either the data is there and the exit is 0, or the exit is not 0 and
// stderr says why in one line: never 0 with the data lost.
function assertWroteOrFailedLoudly(
  what: string,
  ran: { code: number; stderr: string; written: string | undefined },
  hog: string,
): void {
  if (ran.code === 0) {
    assert.equal(
      ran.written,
      IMPORTANT,
      `${what} exited 0 but wrote ${JSON.stringify(ran.written)} (stderr ${
        JSON.stringify(ran.stderr)
      }; the hog: ${hog})`,
    );
    return;
  }
  const lines = ran.stderr.trim().split("\n");
  assert.equal(lines.length, 1, `${what} failed (${ran.code}) without one line: ${ran.stderr}`);
  assert.match(lines[0]!, /^waffle: \S/, `${what}: ${ran.stderr}`);
}

liveTest(
  "a restricted MCP server's runner cannot see its user's session sockets, so a hog there loses none of the user's data [as a restricted server's runner]",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const user = uniqueUser("hogr");
    const sandbox = home.open(user);
    await runOk(sandbox, "true");
    const restricted = await openRestricted(user, { config: sandbox.config, docker });
    try {
      // Inside the restricted container: what would be the sandbox's socket.
      const theirs = HostChannel.open(sandbox.paths.channel)!;
      const look = await RUNNER.deno(
        sandbox,
        `
        const names = [];
        try {
          for (const e of Deno.readDirSync("${SANDBOX_CHANNEL_DIR}")) names.push(e.name);
        } catch (error) {
          names.push(error.name);
        }
        console.log("listed " + JSON.stringify(names));
        try {
          (await Deno.connect({ transport: "unix", path: "${SANDBOX_CHANNEL_DIR}/${theirs.spec.socket}" })).close();
          console.log("connected");
        } catch (error) {
          console.log("refused " + error.name);
        }
        `,
        restricted.name,
      );
      theirs.close();
      assert.doesNotMatch(look.stdout, new RegExp(theirs.spec.socket), look.stdout);
      assert.match(look.stdout, /refused NotFound/, look.stdout + look.stderr);
      // Nor the reverse: the sandbox's runner cannot reach the restricted one's.
      assert.ok(restricted.channelDir !== undefined);
      assert.notEqual(restricted.channelDir, sandbox.paths.channel);
      const mine = HostChannel.open(restricted.channelDir)!;
      const back = await RUNNER.deno(
        sandbox,
        `
        try {
          (await Deno.connect({ transport: "unix", path: "${SANDBOX_CHANNEL_DIR}/${mine.spec.socket}" })).close();
          console.log("connected");
        } catch (error) {
          console.log("refused " + error.name);
        }
        `,
      );
      mine.close();
      assert.match(back.stdout, /refused NotFound/, back.stdout + back.stderr);

      await using hog = await spawnAsRunner(restricted.name, hogScript(120), "ready");
      for (let i = 0; i < 4; i++) {
        const cp = i === 3;
        const name = `f${i}.txt`;
        const ran = await userWrites(home, user, { workspace: sandbox.paths.workspace, name, cp });
        // Nothing the restricted container does reaches the user's sessions.
        assert.equal(ran.code, 0, `${cp ? "cp" : "exec -i"} failed: ${ran.stderr}`);
        assert.equal(ran.written, IMPORTANT, `${name}: the hog: ${hog.output()}`);
      }
      assert.doesNotMatch(hog.output(), /^hog /m, "the restricted container saw a user's socket");
    } finally {
      await restricted.dispose();
    }
  },
);

liveTest(
  "a hog on its own sandbox's session sockets never makes exec -i or cp exit 0 with the data lost [as the runner]",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const user = uniqueUser("hogs");
    const sandbox = home.open(user);
    await runOk(sandbox, "true");
    await using hog = await spawnAsRunner(containerOf(sandbox), hogScript(180), "ready");
    for (let i = 0; i < 6; i++) {
      const cp = i % 3 === 2;
      const name = `f${i}.txt`;
      const ran = await userWrites(home, user, { workspace: sandbox.paths.workspace, name, cp });
      assertWroteOrFailedLoudly(`${cp ? "cp" : "exec -i"} of ${name}`, ran, hog.output());
    }
    // The hog did find the sockets: the attack was mounted.
    assert.match(hog.output(), /^hog /m);
  },
);

liveTest(
  "a flood of connections on its own sandbox's session sockets never makes exec -i or cp exit 0 with the data lost: they fail loudly or succeed [as the runner]",
  async (docker) => {
    await using home = await tempHome(docker, { idleSeconds: 600 });
    const user = uniqueUser("hogf");
    const sandbox = home.open(user);
    await runOk(sandbox, "true");
    await using hog = await spawnAsRunner(containerOf(sandbox), hogScript(180, "flood"), "ready");
    for (let i = 0; i < 4; i++) {
      const cp = i === 3;
      const name = `f${i}.txt`;
      const ran = await userWrites(home, user, { workspace: sandbox.paths.workspace, name, cp });
      assertWroteOrFailedLoudly(`${cp ? "cp" : "exec -i"} of ${name}`, ran, hog.output());
    }
    assert.match(hog.output(), /^hog /m);
    // The user's plain commands are untouched by it.
    assert.equal(await runOk(sandbox, "echo fine"), "fine\n");
  },
);
