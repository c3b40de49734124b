/**
 * Configuration loading, sandbox identity and the posture hash: pure logic,
 * no Docker needed.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadConfig } from "../lib/config/config.ts";
import { UsageError } from "../lib/errors.ts";
import { sandboxKey, statePaths } from "../lib/lifecycle/identity.ts";
import { containerSpec, LABELS } from "../lib/lifecycle/posture.ts";
import { prepareState } from "../lib/lifecycle/state_dir.ts";

Deno.test("sandboxKey() is deterministic and length-prefixed, so ids never collide", () => {
  const home = { home: "/var/lib/waffle" };
  const a = sandboxKey("ab", "c", home);
  const b = sandboxKey("a", "bc", home);
  assert.notEqual(a.hash, b.hash);
  assert.equal(sandboxKey("ab", "c", home).containerName, a.containerName);
  assert.match(a.containerName, /^waffle-[0-9a-f]{8}-[0-9a-f]{24}$/);
  assert.notEqual(sandboxKey("t1", "alice", home).hash, sandboxKey("t2", "alice", home).hash);
  assert.notEqual(sandboxKey("ab", "c", { home: "/other" }).containerName, a.containerName);
});

Deno.test("sandboxKey() rejects bad tenant and user ids with the value quoted", () => {
  for (
    const [tenant, user] of [["default", ""], ["default", "a/b"], ["x y", "u"], ["t", "-lead"], [
      "t",
      "a".repeat(129),
    ], ["t", "ü"]]
  ) {
    assert.throws(
      () => sandboxKey(tenant!, user!, { home: "/h" }),
      (error: unknown) =>
        error instanceof UsageError && error.message.includes(`'`) && !error.message.endsWith("."),
      `${tenant}/${user}`,
    );
  }
});

Deno.test("loadConfig() layers defaults, config.json and WAFFLE_* variables", async () => {
  const home = await Deno.makeTempDir();
  try {
    assert.equal(loadConfig({ home }).idleSeconds, 1800);
    assert.equal(loadConfig({ home }).pidsLimit, 256);
    assert.equal(loadConfig({ home }).network, "none");
    await Deno.writeTextFile(
      join(home, "config.json"),
      JSON.stringify({ idleSeconds: 5, pidsLimit: 64 }),
    );
    assert.equal(loadConfig({ home }).idleSeconds, 5);
    Deno.env.set("WAFFLE_PIDS_LIMIT", "99");
    try {
      assert.equal(loadConfig({ home }).pidsLimit, 99);
      assert.equal(loadConfig({ home, pidsLimit: 50 }).pidsLimit, 50);
    } finally {
      Deno.env.delete("WAFFLE_PIDS_LIMIT");
    }
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("loadConfig() names the bad file, field or variable in one line", async () => {
  const home = await Deno.makeTempDir();
  try {
    const path = join(home, "config.json");
    await Deno.writeTextFile(path, "{nope");
    assert.throws(() => loadConfig({ home }), /Config file '.*config.json' is not valid JSON/);
    await Deno.writeTextFile(path, JSON.stringify({ pidsLimit: 2 }));
    assert.throws(() => loadConfig({ home }), /'pidsLimit'/);
    await Deno.writeTextFile(path, JSON.stringify({ unknownKey: 1 }));
    assert.throws(() => loadConfig({ home }), /unknownKey/);
    await Deno.remove(path);
    Deno.env.set("WAFFLE_IDLE_SECONDS", "soon");
    try {
      assert.throws(() => loadConfig({ home }), /WAFFLE_IDLE_SECONDS 'soon'/);
    } finally {
      Deno.env.delete("WAFFLE_IDLE_SECONDS");
    }
    assert.throws(() => loadConfig({ home: "relative/home" }), /absolute/);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("containerSpec() posture hash changes with every security setting, not with identity", async () => {
  const home = await Deno.makeTempDir();
  try {
    const key = sandboxKey("t", "u", { home });
    const paths = statePaths(home, key);
    prepareState(paths);
    const config = loadConfig({ home });
    const base = containerSpec(key, { config, imageId: "sha256:aa", paths });
    assert.equal(base.body.Labels?.[LABELS.posture], base.postureHash);
    assert.equal(base.body.Labels?.[LABELS.image], "sha256:aa");
    assert.equal(base.body.HostConfig?.NetworkMode, "none");
    assert.deepEqual(base.body.HostConfig?.CapDrop, ["ALL"]);
    assert.equal(base.body.HostConfig?.ReadonlyRootfs, true);
    assert.equal(
      containerSpec(key, { config, imageId: "sha256:bb", paths }).postureHash,
      base.postureHash,
    );
    for (
      const change of [
        { pidsLimit: 32 },
        { memoryBytes: 64 * 1024 * 1024 },
        { cpus: 2 },
        { network: "bridge" as const },
        { tmpBytes: 2 * 1024 * 1024 },
        { idleSeconds: 7 },
      ]
    ) {
      const other = containerSpec(key, {
        config: { ...config, ...change },
        imageId: "sha256:aa",
        paths,
      });
      assert.notEqual(other.postureHash, base.postureHash, JSON.stringify(change));
    }
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("prepareState() creates the state directory whole, with the documented modes", async () => {
  const home = await Deno.makeTempDir();
  try {
    const paths = statePaths(home, sandboxKey("t", "u", { home }));
    prepareState(paths);
    prepareState(paths); // idempotent
    assert.equal(Deno.statSync(paths.root).mode! & 0o7777, 0o700);
    assert.equal(Deno.statSync(paths.workspace).mode! & 0o7777, 0o700);
    assert.equal(Deno.statSync(paths.queue).mode! & 0o7777, 0o1777);
    assert.equal(Deno.statSync(join(paths.queue, "inbound.db")).mode! & 0o777, 0o666);
    const leftovers = [...Deno.readDirSync(join(home, "sandboxes"))].filter((e) =>
      e.name.includes("staging")
    );
    assert.deepEqual(leftovers, []);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});
