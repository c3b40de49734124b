/**
 * Fork and snapshots of `waffle serve` driven by the unmodified E2B SDK
 * (`npm:e2b@2.51.0`): `sandbox.fork({ count })`, `createSnapshot`,
 * `listSnapshots` (paged), `Sandbox.create(snapshotId)` after the source is
 * killed, `deleteSnapshot`; the tenant's limits; and another tenant's key,
 * which can neither fork, list, use nor delete any of it.
 *
 * @module
 */
import assert from "node:assert/strict";
import { RateLimitError, Sandbox, SandboxNotFoundError } from "e2b";
import { sdk, sdkTest } from "./_serve_helpers.ts";

sdkTest(
  "the E2B SDK forks a sandbox into independent copies of its files, within the tenant's limits",
  async (served) => {
    const a = sdk(served, served.keys.a);
    const source = await Sandbox.create("base", { ...a, timeoutMs: 300_000 });
    await source.files.write("/home/user/f.txt", "from the source");

    const forks = await source.fork({ count: 2 });
    assert.equal(forks.length, 2);
    for (const fork of forks) {
      assert.ok(fork instanceof Sandbox, String(fork));
      assert.notEqual(fork.sandboxId, source.sandboxId);
      assert.equal(await fork.files.read("/home/user/f.txt"), "from the source");
    }
    const [one, two] = forks as Sandbox[];
    await one!.files.write("/home/user/only-one.txt", "1");
    assert.equal(await source.files.exists("/home/user/only-one.txt"), false);
    assert.equal(await two!.files.exists("/home/user/only-one.txt"), false);
    assert.equal((await source.commands.run("echo still here")).stdout, "still here\n");

    // The answer says processes are not forked; the count is capped.
    const raw = await fetch(`${served.url}/sandboxes/${source.sandboxId}/fork`, {
      method: "POST",
      headers: { "x-api-key": served.keys.a, "content-type": "application/json" },
      body: JSON.stringify({ count: 21 }),
    });
    assert.equal(raw.status, 400);
    assert.match((await raw.json()).message, /over the maximum of 20/);

    // Tenant a may hold 4: the source and two forks, so one more of two.
    const more = await Sandbox.fork(source.sandboxId, { ...a, count: 2 });
    assert.ok(more[0] instanceof Sandbox);
    assert.ok(more[1] instanceof RateLimitError, String(more[1]));
    assert.equal((await Sandbox.list(a).nextItems()).length, 4);

    // Another tenant's key: not found.
    await assert.rejects(
      Sandbox.fork(source.sandboxId, sdk(served, served.keys.b)),
      SandboxNotFoundError,
    );
  },
  { toml: "[serve.tenants.a]\nmax_sandboxes = 4\ncreates_per_minute = 20\n" },
);

sdkTest(
  "E2B snapshots: taken of a running sandbox, listed by pages, outlive it, belong to their tenant",
  async (served) => {
    const a = sdk(served, served.keys.a);
    const b = sdk(served, served.keys.b);
    const source = await Sandbox.create("base", { ...a, timeoutMs: 300_000 });
    await source.files.write("/home/user/f.txt", "first");
    const first = await source.createSnapshot({ name: "first" });
    assert.deepEqual(first.names, ["first"]);
    await source.files.write("/home/user/f.txt", "second");
    const second = await source.createSnapshot();
    assert.deepEqual(second.names, []);
    // The source ran on: its processes were frozen for the copies, not stopped.
    assert.equal((await source.commands.run("cat f.txt")).stdout, "second");

    const pager = Sandbox.listSnapshots({ ...a, limit: 1 });
    const seen: string[] = [];
    for (let page = 0; page < 5 && pager.hasNext; page++) {
      seen.push(...(await pager.nextItems()).map((s) => s.snapshotId));
    }
    assert.deepEqual(seen, [first.snapshotId, second.snapshotId]);
    assert.deepEqual(
      (await source.listSnapshots().nextItems()).map((s) => s.snapshotId),
      [first.snapshotId, second.snapshotId],
    );
    assert.deepEqual(await Sandbox.listSnapshots(b).nextItems(), []);
    await assert.rejects(source.createSnapshot({ name: "../x" }));

    // The snapshots outlive the sandbox they were taken of.
    assert.equal(await source.kill(), true);
    const fromFirst = await Sandbox.create("first", a);
    assert.equal(await fromFirst.files.read("/home/user/f.txt"), "first");
    const fromSecond = await Sandbox.create(second.snapshotId, a);
    assert.equal(await fromSecond.files.read("/home/user/f.txt"), "second");
    assert.equal((await fromSecond.commands.run("echo fresh queue")).exitCode, 0);

    // Another tenant's key can neither use nor delete them.
    await assert.rejects(Sandbox.create(first.snapshotId, b), /not found/i);
    assert.equal(await Sandbox.deleteSnapshot(first.snapshotId, b), false);
    assert.equal(await Sandbox.deleteSnapshot(first.snapshotId, a), true);
    assert.equal(await Sandbox.deleteSnapshot(first.snapshotId, a), false);
    assert.deepEqual(
      (await Sandbox.listSnapshots(a).nextItems()).map((s) => s.snapshotId),
      [second.snapshotId],
    );
  },
);
