/**
 * `waffle serve` driven by the unmodified E2B SDK (`npm:e2b@2.51.0`), as its
 * users call it: the three variables `E2B_API_KEY`, `E2B_API_URL` and
 * `E2B_SANDBOX_URL`, against a real `waffle serve` process (the CLI from
 * source) on loopback, with real sandboxes of the `base` image. Live tests
 * are registered ignored with the reason where Docker or the image is
 * missing; with `WAFFLE_REQUIRE_DOCKER=1` (CI) they fail instead.
 *
 * @module
 */
import assert from "node:assert/strict";
import { CommandExitError, NotFoundError, Sandbox, SandboxError } from "e2b";
import { delay } from "./_helpers.ts";
import { rawGet, sdk, sdkTest } from "./_serve_helpers.ts";

sdkTest(
  "the E2B SDK creates a sandbox, runs commands with output and exit codes, moves files and kills it",
  async (served) => {
    const sandbox = await Sandbox.create("base", {
      ...sdk(served, served.keys.a),
      timeoutMs: 120_000,
    });
    assert.match(sandbox.sandboxId, /^[a-z0-9]+$/);

    const chunks: string[] = [];
    const ran = await sandbox.commands.run("echo out; echo err >&2; whoami; echo $X", {
      envs: { X: "from-envs" },
      onStdout: (data) => void chunks.push(data),
    });
    assert.equal(ran.exitCode, 0);
    assert.equal(ran.stdout, "out\nuser\nfrom-envs\n");
    assert.equal(ran.stderr, "err\n");
    assert.equal(chunks.join(""), ran.stdout);

    // A failing command: the SDK's own error, with the exact exit code.
    await assert.rejects(
      sandbox.commands.run("exit 7"),
      (error: unknown) => error instanceof CommandExitError && error.exitCode === 7,
    );

    // Files: text in the home, read back by a command; 8 MiB of binary both ways.
    await sandbox.files.write("/home/user/hello.txt", "hello from the SDK");
    assert.equal((await sandbox.commands.run("cat hello.txt")).stdout, "hello from the SDK");
    assert.equal(await sandbox.files.read("hello.txt"), "hello from the SDK");
    const big = new Uint8Array(8 * 1024 * 1024);
    for (let at = 0; at < big.byteLength; at += 65536) {
      crypto.getRandomValues(big.subarray(at, at + 65536));
    }
    await sandbox.files.write("big.bin", big.buffer);
    const back = await sandbox.files.read("big.bin", { format: "bytes" });
    assert.equal(back.byteLength, big.byteLength);
    assert.deepEqual(back, big);
    assert.equal(
      (await sandbox.commands.run("stat -c %s /workspace/big.bin")).stdout.trim(),
      String(big.byteLength),
    );
    await assert.rejects(sandbox.files.read("no-such-file"), NotFoundError);

    assert.equal(await sandbox.isRunning(), true);
    assert.equal(await sandbox.kill(), true);
    assert.equal(await sandbox.isRunning(), false);
    await assert.rejects(sandbox.commands.run("true"));
  },
);

sdkTest(
  "a key sees only its tenant's sandboxes; a wrong key, token or Host is refused",
  async (served) => {
    const mine = await Sandbox.create("base", sdk(served, served.keys.a));
    try {
      // Tenant b: not found, for connect, getInfo and kill alike.
      await assert.rejects(
        Sandbox.connect(mine.sandboxId, sdk(served, served.keys.b)),
        (error: unknown) => error instanceof SandboxError,
      );
      await assert.rejects(Sandbox.getInfo(mine.sandboxId, sdk(served, served.keys.b)));
      assert.equal(await Sandbox.kill(mine.sandboxId, sdk(served, served.keys.b)), false);
      assert.deepEqual(
        (await Sandbox.list(sdk(served, served.keys.b)).nextItems()).map((s) => s.sandboxId),
        [],
      );
      // A key that is not one.
      await assert.rejects(
        Sandbox.create("base", sdk(served, "e2b_" + "0".repeat(40))),
        (error: unknown) => error instanceof Error && /401|key/i.test(error.message),
      );
      // envd without the sandbox's token, and with another Host (DNS rebinding).
      const start = `${served.url}/process.Process/Start`;
      const headers = {
        "content-type": "application/connect+json",
        "e2b-sandbox-id": mine.sandboxId,
      };
      const noToken = await fetch(start, { method: "POST", headers, body: "" });
      assert.equal(noToken.status, 401);
      await noToken.body?.cancel();
      // fetch() will not send another Host: write the request by hand, as a
      // browser tricked by a rebound name would send it.
      assert.match(
        await rawGet(served.url, "/sandboxes", {
          host: "evil.example",
          "x-api-key": served.keys.a,
        }),
        /^HTTP\/1\.1 403 /,
      );
      assert.match(
        await rawGet(served.url, "/sandboxes", {
          host: new URL(served.url).host,
          origin: "http://evil.example",
          "x-api-key": served.keys.a,
        }),
        /^HTTP\/1\.1 403 /,
      );
      assert.match(
        await rawGet(served.url, "/sandboxes", {
          host: new URL(served.url).host,
          "x-api-key": served.keys.a,
        }),
        /^HTTP\/1\.1 200 /,
      );
      // The owner still works.
      assert.equal((await mine.commands.run("echo still")).stdout, "still\n");
    } finally {
      await mine.kill();
    }
  },
);

sdkTest(
  "metadata lists, setTimeout shortens, and the reaper removes an expired sandbox",
  async (served) => {
    const options = sdk(served, served.keys.a);
    const tagged = await Sandbox.create("base", { ...options, metadata: { job: "j1" } });
    const other = await Sandbox.create("base", { ...options, metadata: { job: "j2" } });
    try {
      const found = await Sandbox.list({ ...options, query: { metadata: { job: "j1" } } })
        .nextItems();
      assert.deepEqual(found.map((s) => s.sandboxId), [tagged.sandboxId]);
      assert.deepEqual(found[0]!.metadata, { job: "j1" });
      const info = await tagged.getInfo();
      assert.equal(info.sandboxId, tagged.sandboxId);
      assert.equal(info.state, "running");
      await other.setTimeout(1000);
      // Bounded: the reaper looks every second.
      for (let i = 0; i < 40 && await other.isRunning().catch(() => false); i++) await delay(250);
      assert.equal(await other.isRunning(), false);
      await assert.rejects(Sandbox.getInfo(other.sandboxId, options));
    } finally {
      await tagged.kill();
      await other.kill().catch(() => {});
    }
  },
);
