/**
 * `waffle serve`'s keys: the store (create, list, remove, verify), its
 * database file (private, never holding a key, versioned), the tenants'
 * limits and `waffle serve key`. Deterministic: no Docker, no server.
 */
import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { join } from "../lib/path.ts";
import { QueueError, UsageError } from "../lib/errors.ts";
import { EXIT_WAFFLE } from "../lib/exit_codes.ts";
import {
  KEY_PATTERN,
  keysFile,
  KeyStore,
  openServeDb,
  SERVE_MIGRATIONS,
  serveDbPath,
  TenantLimits,
} from "../lib/serve/mod.ts";
import { timingSafeEqual } from "../lib/bytes.ts";
import { serveKeyCommand } from "../lib/cli/serve_key.ts";
import { ProcessStore, SandboxStore } from "../lib/serve/state.ts";
import type { CliIo } from "../lib/cli/io.ts";
import { DEFAULT_TENANT_LIMITS } from "../lib/config/serve_schema.ts";

async function withHome<T>(fn: (home: string) => T | Promise<T>): Promise<T> {
  const home = await Deno.makeTempDir({ prefix: "waffle-keys-" });
  try {
    return await fn(home);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
}

function withStore<T>(
  home: string,
  fn: (keys: KeyStore, clock: { ms: number }) => T,
): T {
  const clock = { ms: Date.UTC(2026, 0, 1) };
  const db = openServeDb(home);
  try {
    return fn(new KeyStore(db, { now: () => clock.ms }), clock);
  } finally {
    db.close();
  }
}

Deno.test("KeyStore.create() makes an e2b_ key the SDKs accept, and verify() finds its tenant", async () => {
  await withHome((home) =>
    withStore(home, (keys) => {
      const made = keys.create({ tenant: "acme", name: "ci" });
      assert.match(made.key, /^e2b_[0-9a-f]{40}$/);
      assert.match(made.key, KEY_PATTERN);
      assert.equal(made.name, "ci");
      assert.equal(made.tenant, "acme");
      assert.deepEqual(keys.verify(made.key), {
        id: made.id,
        name: "ci",
        tenant: "acme",
        admin: false,
      });
      const other = keys.create({ tenant: "acme" });
      assert.match(other.name, /^key-[0-9a-f]{8}$/);
      assert.notEqual(other.key, made.key);
      assert.notEqual(other.id, made.id);
    })
  );
});

Deno.test("KeyStore.verify() refuses a wrong key, a malformed one and a removed one", async () => {
  await withHome((home) =>
    withStore(home, (keys) => {
      const made = keys.create({ tenant: "acme" });
      const last = made.key.at(-1) === "0" ? "1" : "0";
      assert.equal(keys.verify(made.key.slice(0, -1) + last), undefined);
      for (
        const malformed of [
          "",
          made.key.toUpperCase(),
          `${made.key}0`,
          made.key.slice(0, -1),
          made.key.replace("e2b_", "e2c_"),
          ` ${made.key}`,
          `${made.key}\n`,
        ]
      ) {
        assert.equal(keys.verify(malformed), undefined, JSON.stringify(malformed));
      }
      assert.ok(keys.verify(made.key));
      assert.equal(keys.remove(made.id), true);
      assert.equal(keys.verify(made.key), undefined);
      assert.equal(keys.remove(made.id), false);
    })
  );
});

Deno.test("KeyStore keeps two tenants apart: names, lists and removal", async () => {
  await withHome((home) =>
    withStore(home, (keys, clock) => {
      const a = keys.create({ tenant: "acme", name: "ci" });
      clock.ms += 1000;
      const b = keys.create({ tenant: "globex", name: "ci" });
      assert.equal(keys.verify(a.key)?.tenant, "acme");
      assert.equal(keys.verify(b.key)?.tenant, "globex");
      assert.deepEqual(keys.list().map((k) => [k.tenant, k.name]), [["acme", "ci"], [
        "globex",
        "ci",
      ]]);
      assert.deepEqual(keys.list({ tenant: "globex" }).map((k) => k.id), [b.id]);
      assert.throws(
        () => keys.create({ tenant: "acme", name: "ci" }),
        (error: unknown) =>
          error instanceof UsageError &&
          error.message === "Tenant 'acme' already has a key named 'ci'",
      );
      // A name both tenants have needs the tenant.
      assert.throws(
        () => keys.remove("ci"),
        (error: unknown) =>
          error instanceof UsageError && /Key name 'ci' is in several tenants/.test(error.message),
      );
      assert.equal(keys.remove("ci", { tenant: "nobody" }), false);
      assert.equal(keys.remove(b.id, { tenant: "acme" }), false);
      assert.equal(keys.remove("ci", { tenant: "globex" }), true);
      assert.equal(keys.verify(b.key), undefined);
      assert.equal(keys.verify(a.key)?.tenant, "acme");
      assert.equal(keys.remove("ci"), true);
      assert.deepEqual(keys.list(), []);
    })
  );
});

Deno.test("KeyStore.create() refuses a bad tenant or name with one line quoting it, and keeps nothing", async () => {
  await withHome((home) =>
    withStore(home, (keys) => {
      const cases: [{ tenant: string; name?: string }, RegExp][] = [
        [{ tenant: "" }, /^Invalid tenant id '': use 1-128 of/],
        [{ tenant: "../x" }, /^Invalid tenant id '\.\.\/x': /],
        [{ tenant: "acme", name: "a b" }, /^Invalid key name 'a b': /],
        [{ tenant: "acme", name: "k_0123456789abcdef" }, /names of this form are key ids/],
      ];
      for (const [request, message] of cases) {
        assert.throws(
          () => keys.create(request),
          (error: unknown) =>
            error instanceof UsageError && message.test(error.message) &&
            !error.message.includes("\n"),
        );
      }
      assert.deepEqual(keys.list(), []);
    })
  );
});

Deno.test("KeyStore.verify() marks a key used at most once a minute", async () => {
  await withHome((home) =>
    withStore(home, (keys, clock) => {
      const made = keys.create({ tenant: "acme" });
      const start = clock.ms;
      assert.equal(keys.list()[0]!.lastUsedAt, null);
      keys.verify(made.key);
      assert.equal(keys.list()[0]!.lastUsedAt, start);
      clock.ms = start + 59_000;
      keys.verify(made.key);
      assert.equal(keys.list()[0]!.lastUsedAt, start);
      clock.ms = start + 60_000;
      keys.verify(made.key);
      assert.equal(keys.list()[0]!.lastUsedAt, start + 60_000);
    })
  );
});

Deno.test("list() never returns a key or its hash", async () => {
  await withHome((home) =>
    withStore(home, (keys) => {
      const made = keys.create({ tenant: "acme" });
      const listed = JSON.stringify(keys.list());
      assert.ok(!listed.includes(made.key.slice(4)));
      assert.deepEqual(Object.keys(keys.list()[0]!).sort(), [
        "admin",
        "createdAt",
        "id",
        "lastUsedAt",
        "name",
        "tenant",
      ]);
    })
  );
});

Deno.test("serve.db is private (0700 directory, 0600 file) and never holds a key", async () => {
  await withHome(async (home) => {
    const made = withStore(
      home,
      (keys) => [keys.create({ tenant: "acme" }), keys.create({ tenant: "b" })],
    );
    const path = serveDbPath(home);
    assert.equal(path, join(home, "serve", "serve.db"));
    assert.equal((await Deno.stat(join(home, "serve"))).mode! & 0o777, 0o700);
    assert.equal((await Deno.stat(path)).mode! & 0o777, 0o600);
    const bytes = new TextDecoder("latin1").decode(await Deno.readFile(path));
    for (const { key } of made) {
      assert.ok(!bytes.includes(key), "the key is not in the file");
      assert.ok(!bytes.includes(key.slice(4)), "nor its hex");
    }
    // What it does hold is the hash, so the check above reads the right file.
    const db = new DatabaseSync(path, { readOnly: true });
    try {
      const rows = db.prepare("SELECT hash FROM keys").all() as { hash: string }[];
      assert.equal(rows.length, 2);
      for (const row of rows) assert.ok(bytes.includes(row.hash));
    } finally {
      db.close();
    }
  });
});

Deno.test("openServeDb() tightens a loose directory and file, and refuses a symlinked file", async () => {
  await withHome(async (home) => {
    openServeDb(home).close();
    await Deno.chmod(join(home, "serve"), 0o755);
    await Deno.chmod(serveDbPath(home), 0o644);
    openServeDb(home).close();
    assert.equal((await Deno.stat(join(home, "serve"))).mode! & 0o777, 0o700);
    assert.equal((await Deno.stat(serveDbPath(home))).mode! & 0o777, 0o600);
    await Deno.remove(serveDbPath(home));
    await Deno.writeTextFile(join(home, "elsewhere"), "");
    await Deno.symlink(join(home, "elsewhere"), serveDbPath(home));
    assert.throws(() => openServeDb(home), QueueError);
  });
});

Deno.test("openServeDb() upgrades an older file by the migrations it lacks, and refuses a newer one", async () => {
  await withHome((home) => {
    const v1 = openServeDb(home);
    const made = new KeyStore(v1).create({ tenant: "acme" });
    v1.close();
    const later = [...SERVE_MIGRATIONS, "CREATE TABLE later (id TEXT PRIMARY KEY);"];
    const v2 = openServeDb(home, { migrations: later });
    try {
      assert.equal(
        (v2.prepare("PRAGMA user_version").get() as { user_version: number }).user_version,
        later.length,
      );
      v2.exec("INSERT INTO later VALUES ('x')");
      assert.equal(new KeyStore(v2).verify(made.key)?.tenant, "acme");
    } finally {
      v2.close();
    }
    assert.throws(
      () => openServeDb(home),
      (error: unknown) =>
        error instanceof QueueError &&
        new RegExp(`schema version ${later.length}`).test(error.message),
    );
  });
});

Deno.test("the processes' journal connection commits without a sync; the keys' connection syncs; both see one file", async () => {
  await withHome((home) => {
    const keys = openServeDb(home);
    const journal = openServeDb(home, { survives: "process-death" });
    try {
      const synchronous = (db: DatabaseSync): number =>
        (db.prepare("PRAGMA synchronous").get() as { synchronous: number }).synchronous;
      assert.equal(synchronous(keys), 2);
      assert.equal(synchronous(journal), 0);
      const store = new ProcessStore(journal).processes("sbx1");
      store.save({
        pid: 1000,
        requestId: "r1",
        tag: "t",
        config: { cmd: "/bin/bash", args: ["-c", "true"], envs: { A: "1" } },
        pty: false,
        stdin: true,
      });
      // The sandbox's removal, through the other connection, takes its processes.
      assert.deepEqual(new ProcessStore(keys).withProcesses(), ["sbx1"]);
      new SandboxStore(keys).delete("sbx1");
      assert.deepEqual(store.saved(), []);
    } finally {
      journal.close();
      keys.close();
    }
  });
});

Deno.test("two stores on one file see each other's keys at once", async () => {
  await withHome((home) => {
    const server = openServeDb(home);
    const cli = openServeDb(home);
    try {
      const serverKeys = new KeyStore(server);
      const made = new KeyStore(cli).create({ tenant: "acme" });
      assert.equal(serverKeys.verify(made.key)?.tenant, "acme");
      new KeyStore(cli).remove(made.id);
      assert.equal(serverKeys.verify(made.key), undefined);
    } finally {
      server.close();
      cli.close();
    }
  });
});

Deno.test("timingSafeEqual() compares bytes and lengths", () => {
  const bytes = (text: string): Uint8Array => new TextEncoder().encode(text);
  assert.equal(timingSafeEqual(bytes("abc"), bytes("abc")), true);
  assert.equal(timingSafeEqual(bytes("abc"), bytes("abd")), false);
  assert.equal(timingSafeEqual(bytes("abc"), bytes("abcd")), false);
  assert.equal(timingSafeEqual(bytes("abcd"), bytes("abc")), false);
  assert.equal(timingSafeEqual(bytes(""), bytes("")), true);
});

Deno.test("TenantLimits refuses creates beyond the tenant's minute with the wait until a slot frees", () => {
  const clock = { ms: 1_000_000 };
  const limits = new TenantLimits({
    limitsOf: (tenant) =>
      tenant === "small"
        ? { maxSandboxes: 100, createsPerMinute: 2 }
        : { ...DEFAULT_TENANT_LIMITS },
    sandboxCount: () => 0,
    now: () => clock.ms,
  });
  assert.deepEqual(limits.admitCreate("small"), { ok: true });
  clock.ms += 10_000;
  assert.deepEqual(limits.admitCreate("small"), { ok: true });
  clock.ms += 500;
  const refused = limits.admitCreate("small");
  assert.equal(refused.ok, false);
  assert.ok(!refused.ok);
  assert.equal(refused.limit, "creates_per_minute");
  // The first create leaves the window 60 s after it: 49.5 s from now, rounded up.
  assert.equal(refused.retryAfterSeconds, 50);
  assert.match(refused.message, /serve\.tenants\.small\.creates_per_minute = 2/);
  // Another tenant is not held back.
  assert.deepEqual(limits.admitCreate("other"), { ok: true });
  clock.ms += 49_500;
  assert.deepEqual(limits.admitCreate("small"), { ok: true });
  // A refusal just before a slot frees still says wait at least one second.
  clock.ms += 9_999;
  const soon = limits.admitCreate("small");
  assert.ok(!soon.ok);
  assert.equal(soon.retryAfterSeconds, 1);
});

Deno.test("TenantLimits refuses a create when the tenant has its sandboxes at once", () => {
  const counts = new Map([["full", 3]]);
  const limits = new TenantLimits({
    limitsOf: () => ({ maxSandboxes: 3, createsPerMinute: 60 }),
    sandboxCount: (tenant) => counts.get(tenant) ?? 0,
    now: () => 0,
  });
  const refused = limits.admitCreate("full");
  assert.ok(!refused.ok);
  assert.equal(refused.limit, "max_sandboxes");
  assert.ok(Number.isInteger(refused.retryAfterSeconds) && refused.retryAfterSeconds >= 1);
  assert.match(refused.message, /^Tenant 'full' has 3 sandboxes, its limit/);
  counts.set("full", 2);
  assert.deepEqual(limits.admitCreate("full"), { ok: true });
});

function captureIo(): CliIo & { out: () => string; err: () => string } {
  let out = "";
  let err = "";
  const decode = (data: Uint8Array | string): string =>
    typeof data === "string" ? data : new TextDecoder().decode(data);
  return {
    stdout: (data) => {
      out += decode(data);
      return Promise.resolve();
    },
    stderr: (data) => {
      err += decode(data);
      return Promise.resolve();
    },
    stdin: null,
    out: () => out,
    err: () => err,
  };
}

async function run(home: string, args: string[]): Promise<{ status: number; out: string }> {
  const io = captureIo();
  const file = join(home, "waffle.toml");
  const status = await serveKeyCommand([...args, "--config", file], io);
  return { status, out: io.out() };
}

Deno.test("waffle serve key create prints the key alone; ls lists it without it; rm removes it", async () => {
  await withHome(async (home) => {
    await Deno.writeTextFile(join(home, "waffle.toml"), `[sandbox]\nhome = "${home}"\n`);
    const created = await run(home, ["create", "--tenant", "acme", "--name", "ci"]);
    assert.equal(created.status, 0);
    assert.match(created.out, /^e2b_[0-9a-f]{40}\n$/);
    const key = created.out.trim();
    const json = await run(home, ["create", "--tenant", "globex", "--json"]);
    const made = JSON.parse(json.out);
    assert.deepEqual(Object.keys(made).sort(), ["admin", "id", "key", "name", "tenant"]);
    assert.equal(made.admin, false);
    assert.equal(made.tenant, "globex");

    const ls = await run(home, ["ls"]);
    assert.equal(ls.status, 0);
    const lines = ls.out.trimEnd().split("\n");
    assert.match(lines[0]!, /^ID +NAME +TENANT +ADMIN +CREATED +LAST USED$/);
    assert.equal(lines.length, 3);
    assert.match(lines[1]!, /^k_[0-9a-f]{16} +ci +acme +- +\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ +-$/);
    assert.ok(!ls.out.includes(key.slice(4)) && !ls.out.includes(made.key.slice(4)));
    const lsJson = JSON.parse((await run(home, ["ls", "--tenant", "globex", "--json"])).out);
    assert.deepEqual(lsJson.keys.map((k: { id: string }) => k.id), [made.id]);

    // The store the server would open sees the key the CLI made.
    const db = openServeDb(home);
    try {
      assert.equal(new KeyStore(db).verify(key)?.tenant, "acme");
    } finally {
      db.close();
    }

    assert.deepEqual(await run(home, ["rm", "ci"]), { status: 0, out: "removed key 'ci'\n" });
    await assert.rejects(
      () => run(home, ["rm", "ci"]),
      (error: unknown) =>
        error instanceof UsageError && error.exitCode === EXIT_WAFFLE &&
        error.message === "No key 'ci'; see 'waffle serve key ls'",
    );
    await assert.rejects(
      () => run(home, ["rm", made.id, "--tenant", "acme"]),
      (error: unknown) =>
        error instanceof UsageError &&
        /^No key 'k_[0-9a-f]{16}' in tenant 'acme'/.test(error.message),
    );
    assert.equal((await run(home, ["rm", made.id])).status, 0);
    assert.equal((await run(home, ["ls"])).out.trimEnd().split("\n").length, 1);
  });
});

Deno.test("waffle serve key refuses a missing tenant, an unknown command and a bad tenant", async () => {
  await withHome(async (home) => {
    await Deno.writeTextFile(join(home, "waffle.toml"), `[sandbox]\nhome = "${home}"\n`);
    await assert.rejects(() => run(home, ["create"]), /Missing --tenant T/);
    await assert.rejects(
      () => run(home, ["create", "--tenant", "a/b"]),
      /Invalid tenant id 'a\/b'/,
    );
    await assert.rejects(() => run(home, ["rotate"]), /Unknown command 'serve key rotate'/);
    await assert.rejects(() => run(home, ["rm"]), /Missing key/);
    const help = captureIo();
    assert.equal(await serveKeyCommand(["create", "--help"], help), 0);
    assert.match(help.out(), /^Usage: waffle serve key create --tenant T/);
    assert.equal(await serveKeyCommand([], captureIo()), EXIT_WAFFLE);
    // Nothing was made by the refused calls.
    const db = openServeDb(home);
    try {
      assert.deepEqual(new KeyStore(db).list(), []);
    } finally {
      db.close();
    }
  });
});

Deno.test("a keys file (serve key export) verifies what the store made, never holds a key, and is read again when it changes", async () => {
  await withHome(async (home) => {
    const path = join(home, "keys.json");
    const [a, b] = withStore(home, (keys) => [
      keys.create({ tenant: "acme" }),
      keys.create({ tenant: "beta" }),
    ]);
    // `waffle serve key export`, as an operator runs it into the Secret.
    await Deno.writeTextFile(join(home, "waffle.toml"), `[sandbox]\nhome = "${home}"\n`);
    const cli = await run(home, ["export"]);
    assert.equal(cli.status, 0);
    const exported = cli.out;
    assert.ok(!exported.includes(a!.key) && !exported.includes(b!.key), "no key in the file");
    await Deno.writeTextFile(path, exported);
    const file = keysFile(path);
    assert.deepEqual(file.verify(a!.key), {
      id: a!.id,
      name: a!.name,
      tenant: "acme",
      admin: false,
    });
    assert.deepEqual(file.verify(b!.key)?.tenant, "beta");
    assert.equal(file.verify(`e2b_${"0".repeat(40)}`), undefined);
    assert.equal(file.verify("not a key"), undefined);
    // b removed and the file rewritten (a Secret updated): b stops within a second.
    withStore(home, (keys) => keys.remove(b!.id));
    await Deno.writeTextFile(path, (await run(home, ["export"])).out);
    await Deno.utime(path, new Date(), new Date(Date.now() + 5000));
    let refused = false;
    for (let i = 0; i < 30 && !refused; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      refused = file.verify(b!.key) === undefined;
    }
    assert.ok(refused, "a removed key is refused once the file changes");
    assert.equal(file.verify(a!.key)?.tenant, "acme");
  });
});

Deno.test("a keys file that is not an export is one line naming it", async () => {
  await withHome(async (home) => {
    const path = join(home, "keys.json");
    await Deno.writeTextFile(path, JSON.stringify({ keys: [{ id: "k_1", hash: "x" }] }));
    assert.throws(
      () => keysFile(path),
      (error: Error) =>
        error instanceof UsageError &&
        error.message === `Keys file '${path}' is not a 'waffle serve key export'`,
    );
    assert.throws(
      () => keysFile(join(home, "absent.json")),
      /Cannot read keys file '.*absent\.json'/,
    );
  });
});
