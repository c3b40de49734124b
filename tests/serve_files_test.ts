/**
 * envd's `filesystem.Filesystem` service of `waffle serve`, driven by the
 * unmodified E2B SDK (`npm:e2b@2.51.0`): `files.list`, `exists`, `getInfo`,
 * `makeDir`, `rename`, `remove` and `watchDir` against a real `waffle serve`
 * with real sandboxes of the `base` image; the polling watchers (which the
 * Python SDK uses) through a Connect client; and paths that try to leave the
 * sandbox. Live tests are registered ignored with the reason where Docker or
 * the image is missing; with `WAFFLE_REQUIRE_DOCKER=1` they fail instead.
 *
 * @module
 */
import assert from "node:assert/strict";
import { type EntryInfo, FileType, NotFoundError, Sandbox, type WatchHandle } from "e2b";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { EventType, Filesystem } from "../lib/serve/gen/filesystem/filesystem_pb.ts";
import { delay } from "./_helpers.ts";
import { rssOf, sdk, sdkTest, type Served } from "./_serve_helpers.ts";

async function open(served: Served): Promise<Sandbox> {
  return await Sandbox.create("base", { ...sdk(served, served.keys.a), timeoutMs: 120_000 });
}

function byName(entries: EntryInfo[]): Record<string, EntryInfo> {
  return Object.fromEntries(entries.map((entry) => [entry.name, entry]));
}

/** Waits (bounded) until `check` holds; fails with `what` otherwise. */
async function until(what: string, check: () => boolean): Promise<void> {
  for (let i = 0; i < 80 && !check(); i++) await delay(100);
  assert.ok(check(), `Timed out waiting for ${what}`);
}

sdkTest(
  "the E2B SDK lists, stats, makes, renames and removes files, directories and links",
  async (served) => {
    const sandbox = await open(served);
    try {
      const { files } = sandbox;
      assert.equal(await files.makeDir("/home/user/tree/sub"), true);
      assert.equal(await files.makeDir("tree/sub"), false, "an existing directory");
      await files.write("/home/user/tree/a.txt", "alpha");
      await files.write("tree/sub/b.txt", "bravo!");
      await sandbox.commands.run("ln -s a.txt tree/link");

      const one = byName(await files.list("/home/user/tree"));
      assert.deepEqual(Object.keys(one).sort(), ["a.txt", "link", "sub"]);
      assert.equal(one["a.txt"]!.type, FileType.FILE);
      assert.equal(one["a.txt"]!.size, 5);
      assert.equal(one["a.txt"]!.path, "/home/user/tree/a.txt");
      assert.equal(one["sub"]!.type, FileType.DIR);
      assert.equal(one["sub"]!.path, "/home/user/tree/sub");
      assert.equal(one["link"]!.type, FileType.SYMLINK);

      const two = await files.list("tree", { depth: 2 });
      const b = two.find((entry) => entry.path === "/home/user/tree/sub/b.txt");
      assert.ok(b, `depth 2 lists sub/b.txt: ${JSON.stringify(two.map((e) => e.path))}`);
      assert.equal(b.name, "b.txt");
      assert.equal(b.size, 6);
      assert.equal(two.length, 4);

      assert.equal(await files.exists("tree/a.txt"), true);
      assert.equal(await files.exists("/home/user/tree/nope"), false);
      assert.equal(await files.exists("tree/a.txt/below"), false);

      const info = await files.getInfo("tree/a.txt");
      assert.equal(info.name, "a.txt");
      assert.equal(info.type, FileType.FILE);
      assert.equal(info.path, "/home/user/tree/a.txt");
      assert.equal(info.size, 5);
      assert.equal(info.owner, "user");
      assert.equal(info.mode & 0o777, 0o644);
      assert.equal(info.permissions, "-rw-r--r--");
      assert.ok(info.modifiedTime instanceof Date && info.modifiedTime.getTime() > 0);
      const link = await files.getInfo("/home/user/tree/link");
      assert.equal(link.type, FileType.SYMLINK);
      // envd's target is absolute: a relative one is read from the link's directory.
      assert.equal(link.symlinkTarget, "/home/user/tree/a.txt");

      const moved = await files.rename("tree/a.txt", "/home/user/tree/moved/a2.txt");
      assert.equal(moved.path, "/home/user/tree/moved/a2.txt");
      assert.equal(moved.type, FileType.FILE);
      assert.equal(await files.exists("tree/a.txt"), false);
      assert.equal(await files.read("tree/moved/a2.txt"), "alpha");
      await assert.rejects(files.rename("tree/nope", "tree/x"), NotFoundError);

      // A link removed is the link: its target stays.
      await sandbox.commands.run("ln -s moved/a2.txt tree/link2");
      await files.remove("tree/link2");
      assert.equal(await files.exists("tree/link2"), false);
      assert.equal(await files.read("tree/moved/a2.txt"), "alpha");
      // A directory with its contents.
      await files.remove("/home/user/tree/sub");
      assert.equal(await files.exists("tree/sub"), false);
      assert.equal(await files.exists("tree/sub/b.txt"), false);
      // Removing what is not there succeeds, as envd's (and E2B's suite's "remove non-existing file").
      await files.remove("tree/sub");
      assert.equal(await files.exists("tree/sub"), false);

      // What the uid may not touch.
      await assert.rejects(files.makeDir("/etc/waffle-x"), /permission denied/i);
      await assert.rejects(files.list("/root"), /permission denied/i);
      assert.equal(
        (await sandbox.commands.run("ls /etc/waffle-x || echo absent")).stdout,
        "absent\n",
      );
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "watchDir reports a file a command creates and writes, and stops when stopped",
  async (served) => {
    const sandbox = await open(served);
    try {
      const { files } = sandbox;
      await assert.rejects(files.watchDir("no-such-dir", () => {}), NotFoundError);
      await files.makeDir("watched");
      const events: { name: string; type: string }[] = [];
      let exited = false;
      const handle = await files.watchDir(
        "/home/user/watched",
        (event) => void events.push({ name: event.name, type: event.type }),
        { onExit: () => void (exited = true) },
      );
      await sandbox.commands.run("echo one > watched/w.txt");
      await until(
        "a create event",
        () => events.some((e) => e.name === "w.txt" && e.type === "create"),
      );
      const writes = (): number =>
        events.filter((e) => e.name === "w.txt" && e.type === "write").length;
      const before = writes();
      await sandbox.commands.run("sleep 0.1; echo two >> watched/w.txt");
      await until("a write event", () => writes() > before);
      await sandbox.commands.run("rm watched/w.txt");
      await until(
        "a remove event",
        () => events.some((e) => e.name === "w.txt" && e.type === "remove"),
      );

      await handle.stop();
      await until("the watch's end", () => exited);
      const seen = events.length;
      await sandbox.commands.run("touch watched/after");
      await delay(1500);
      assert.equal(
        events.length,
        seen,
        `no event after stop: ${JSON.stringify(events.slice(seen))}`,
      );

      // The server ended its side too: its watches are counted, and a stopped
      // one frees its place (bounded wait while the server sees the client go).
      const handles = [];
      let refused: unknown;
      for (let i = 0; i < 10 && refused === undefined; i++) {
        try {
          handles.push(await files.watchDir("watched", () => {}));
        } catch (error) {
          refused = error;
        }
      }
      assert.match(String(refused), /watches at once/);
      await handles.pop()!.stop();
      // Opens a watch once the server has a place for it.
      const whenFree = async (onExit?: () => void): Promise<WatchHandle | undefined> => {
        for (let i = 0; i < 40; i++) {
          const opened = await files.watchDir("watched", () => {}, onExit ? { onExit } : {})
            .catch(() => undefined);
          if (opened !== undefined) return opened;
          await delay(100);
        }
        return undefined;
      };
      const reopened = await whenFree();
      assert.ok(reopened, "a stopped watch frees its place");
      for (const open of [...handles, reopened]) await open.stop();

      // Killing the sandbox ends a watch.
      let ended = false;
      assert.ok(await whenFree(() => void (ended = true)));
      assert.equal(await sandbox.kill(), true);
      await until("the watch's end at the kill", () => ended);
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "the polling watchers report events until removed",
  async (served) => {
    const sandbox = await open(served);
    try {
      const token = (sandbox as unknown as { envdAccessToken?: string }).envdAccessToken;
      const headers = { "e2b-sandbox-id": sandbox.sandboxId, "x-access-token": token ?? "" };
      const client = createClient(
        Filesystem,
        createConnectTransport({
          baseUrl: served.url,
          useBinaryFormat: false,
          fetch: (input, init) => {
            const all = new Headers(init?.headers);
            for (const [name, value] of Object.entries(headers)) all.set(name, value);
            return fetch(input, { ...init, headers: all });
          },
        }),
      );
      await sandbox.files.makeDir("polled");
      const { watcherId } = await client.createWatcher({ path: "/home/user/polled" });
      await sandbox.commands.run("echo x > polled/p.txt");
      const got: { name: string; type: EventType }[] = [];
      for (let i = 0; i < 40 && !got.some((e) => e.type === EventType.CREATE); i++) {
        got.push(...(await client.getWatcherEvents({ watcherId })).events);
        await delay(100);
      }
      assert.ok(
        got.some((e) => e.name === "p.txt" && e.type === EventType.CREATE),
        JSON.stringify(got),
      );
      await client.removeWatcher({ watcherId });
      await assert.rejects(client.getWatcherEvents({ watcherId }), /not found/i);
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "paths with '..', planted links and hostile names stay inside the sandbox",
  async (served) => {
    // A victim on the host: in the host's /tmp and in the server's home.
    const victimDir = await Deno.makeTempDir({ prefix: "waffle-victim-" });
    const victim = `${victimDir}/victim.txt`;
    await Deno.writeTextFile(victim, "intact");
    const homeVictim = `${served.home}/victim-home.txt`;
    await Deno.writeTextFile(homeVictim, "intact");
    const sandbox = await open(served);
    try {
      const { files } = sandbox;
      const names = new Set<string>();
      const listed = async (path: string, depth = 1): Promise<EntryInfo[] | Error> => {
        try {
          const entries = await files.list(path, { depth });
          for (const entry of entries) names.add(entry.name);
          return entries;
        } catch (error) {
          return error as Error;
        }
      };
      await sandbox.commands.run(
        "ln -s /proc/1/root pr && ln -s /etc etcl && ln -s / rootl && mkdir real && echo keep > real/keep",
      );
      // Links are reported, never entered, at the end of a path.
      for (const path of ["pr", "etcl", "rootl", "etcl/", "/home/user/rootl/"]) {
        const result = await listed(path);
        assert.ok(
          result instanceof Error && /not a directory/i.test(result.message),
          `${path}: ${result}`,
        );
      }
      const pr = await files.getInfo("pr");
      assert.equal(pr.type, FileType.SYMLINK);
      assert.equal(pr.symlinkTarget, "/proc/1/root");
      // Through a link in the middle: resolved by the sandbox's kernel, inside it.
      await listed("pr/tmp");
      await listed("etcl/..", 2);
      await listed("rootl/tmp", 2);
      // '..' is resolved as text: never above the sandbox's root.
      for (
        const path of [
          `/home/user/../../../..${victimDir}`,
          `../../../../..${victimDir}`,
          "/../../tmp",
        ]
      ) {
        await listed(path);
      }
      assert.equal(
        await files.exists(victim),
        false,
        "the host's path means nothing in the sandbox",
      );
      assert.equal(await files.exists(`../../../../..${homeVictim}`), false);
      // Not there in the sandbox, so nothing is removed (the host's file stays: checked below).
      await files.remove(victim);
      await assert.rejects(files.rename(victim, "stolen.txt"), NotFoundError);
      assert.equal(
        await files.makeDir(`/home/user/../..${victimDir}`),
        true,
        "made in the sandbox's /tmp",
      );
      assert.equal(await files.exists(`/tmp/${victimDir.split("/").at(-1)}`), true);
      // The sandbox's own root is listed, read-only as it is.
      assert.ok((await listed("/")) instanceof Array);
      assert.ok(names.has("bin") || names.has("usr"), "the sandbox's root was listed");

      // Removing or renaming a link leaves what it points at.
      await files.rename("etcl", "etc-link");
      await files.remove("etc-link");
      await files.remove("rootl");
      assert.equal(
        (await sandbox.commands.run("cat /etc/hostname >/dev/null && cat real/keep")).stdout,
        "keep\n",
      );

      // A name with a newline and markup is one entry, named exactly.
      const evil = "evil\nname<b>&\"'.txt";
      await sandbox.commands.run('printf x > "$EVIL"', { envs: { EVIL: evil } });
      const home = await listed("/home/user");
      assert.ok(!(home instanceof Error), String(home));
      const found = home.filter((entry) => entry.name.includes("name<b>"));
      assert.deepEqual(found.map((entry) => [entry.name, entry.path, entry.size]), [[
        evil,
        `/home/user/${evil}`,
        1,
      ]]);
      assert.ok(
        !names.has("evil") && !names.has("name<b>&\"'.txt"),
        "no entry split at the newline",
      );
      assert.equal((await files.getInfo(`/home/user/${evil}`)).size, 1);
      await files.remove(evil);
      assert.equal(await files.exists(evil), false);

      // Nothing of the host's was listed, touched or removed.
      for (const name of names) {
        assert.ok(
          !name.startsWith("waffle-victim-") && !name.startsWith("victim"),
          `listed '${name}'`,
        );
      }
      assert.equal(await Deno.readTextFile(victim), "intact");
      assert.equal(await Deno.readTextFile(homeVictim), "intact");
      assert.deepEqual([...Deno.readDirSync(victimDir)].map((entry) => entry.name), ["victim.txt"]);
    } finally {
      await sandbox.kill();
      await Deno.remove(victimDir, { recursive: true });
    }
  },
);

sdkTest(
  "the E2B SDK's writes answer absolute paths, make missing directories, and signed URLs work under E2B_SANDBOX_URL",
  async (served) => {
    const sandbox = await open(served);
    try {
      const { files } = sandbox;
      // The answer names the file as envd does: absolute, under the home.
      assert.equal((await files.write("w.txt", "one")).path, "/home/user/w.txt");
      // Missing parents are made, for one file and for several (whose names keep their directories).
      assert.equal(
        (await files.write("new/deeper/w.txt", "two")).path,
        "/home/user/new/deeper/w.txt",
      );
      assert.equal(await files.read("new/deeper/w.txt"), "two");
      const many = await files.writeFiles([
        { path: "multi/a/x.txt", data: "x" },
        { path: "/home/user/multi/b/y.txt", data: "y" },
      ]);
      assert.deepEqual(many.map((info) => info.path), [
        "/home/user/multi/a/x.txt",
        "/home/user/multi/b/y.txt",
      ]);
      assert.equal(await files.read("multi/b/y.txt"), "y");
      // Listed as a walk: by name, each directory followed by what is in it.
      await sandbox.commands.run("mkdir -p ord/b ord/a/z && touch ord/c ord/a/y ord/a.txt");
      assert.deepEqual((await files.list("ord", { depth: 2 })).map((entry) => entry.name), [
        "a",
        "y",
        "z",
        "a.txt",
        "b",
        "c",
      ]);

      // Signed URLs carry no sandbox id under E2B_SANDBOX_URL: the signature finds it.
      const download = await sandbox.downloadUrl("w.txt", { useSignatureExpiration: 60 });
      assert.ok(download.startsWith(`${served.url}/files?`), download);
      const read = await fetch(download);
      assert.equal(read.status, 200);
      assert.equal(await read.text(), "one");
      const form = new FormData();
      form.append("file", "field content");
      const upload = await fetch(
        await sandbox.uploadUrl("up.txt", { useSignatureExpiration: 60 }),
        {
          method: "POST",
          body: form,
        },
      );
      assert.equal(upload.status, 200);
      assert.deepEqual(await upload.json(), [
        { name: "up.txt", path: "/home/user/up.txt", type: "file" },
      ]);
      assert.equal(await files.read("up.txt"), "field content");
      const expired = await fetch(
        await sandbox.downloadUrl("w.txt", { useSignatureExpiration: -10 }),
      );
      assert.equal(expired.status, 401);
      assert.deepEqual(await expired.json(), {
        code: 401,
        message: "signature is already expired",
      });
      // A signature of no sandbox's token reaches none.
      const forged = new URL(download);
      forged.searchParams.set("signature", "v1_forged");
      const refused = await fetch(forged);
      assert.equal(refused.status, 401);
      await refused.body?.cancel();
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "file metadata: written with the file, returned by write, getInfo, list and rename, replaced by an overwrite",
  async (served) => {
    const sandbox = await open(served);
    try {
      const { files } = sandbox;
      const metadata = { author: "mish", purpose: "upload <b>&\"'" };
      const written = await files.write("meta/a.txt", "alpha", { metadata });
      assert.ok(!Array.isArray(written));
      assert.deepEqual(written.metadata, metadata);
      assert.deepEqual((await files.getInfo("meta/a.txt")).metadata, metadata);
      const octet = await files.write("meta/b.txt", "bravo", {
        metadata: { Stage: "octet" },
        useOctetStream: true,
      });
      // Header names are case-insensitive: keys come back in lower case.
      assert.deepEqual(octet.metadata, { stage: "octet" });
      const listed = byName(await files.list("meta"));
      assert.deepEqual(listed["a.txt"]!.metadata, metadata);
      assert.deepEqual(listed["b.txt"]!.metadata, { stage: "octet" });
      assert.equal((await files.getInfo("meta")).metadata, undefined, "the directory has none");
      const moved = await files.rename("meta/a.txt", "meta/c.txt");
      assert.deepEqual(moved.metadata, metadata);

      // An overwrite replaces the metadata: other keys, or none.
      await files.write("meta/c.txt", "second", { metadata: { tag: "new" } });
      assert.deepEqual((await files.getInfo("meta/c.txt")).metadata, { tag: "new" });
      const bare = await files.write("meta/c.txt", "third");
      assert.equal(bare.metadata, undefined);
      assert.equal((await files.getInfo("meta/c.txt")).metadata, undefined);

      // Set from inside the sandbox, as envd's namespace: shown without it.
      await sandbox.commands.run(
        `python3 -c "import os; os.setxattr('/workspace/meta/b.txt', 'user.e2b.extra', b'x')"`,
      );
      assert.deepEqual((await files.getInfo("meta/b.txt")).metadata, {
        stage: "octet",
        extra: "x",
      });

      // Over the limits: refused whole, nothing written.
      const big = { huge: "v".repeat(4096) };
      await assert.rejects(
        files.write("meta/big.txt", "x", { metadata: big }),
        /Metadata of \d+ bytes is over 4096/,
      );
      const long = { ["k".repeat(247)]: "v" };
      await assert.rejects(files.write("meta/big.txt", "x", { metadata: long }), /over 246 bytes/);
      assert.equal(await files.exists("meta/big.txt"), false);
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "file metadata planted in the sandbox stays bounded: escaped, or a clear error",
  async (served) => {
    const sandbox = await open(served);
    try {
      const { files } = sandbox;
      await files.write("plant/odd.txt", "x");
      // ext4 (the workspace) keeps about a block of attributes; the
      // sandbox's tmpfs keeps more.
      await files.write("/tmp/huge.txt", "x");
      await files.write("/tmp/many.txt", "x");
      const plant = async (script: string) => {
        await files.write("/tmp/plant.py", `import os\n${script}\n`);
        await sandbox.commands.run("python3 /tmp/plant.py");
      };
      // Bytes outside printable ASCII (not UTF-8, controls, a backslash), and markup.
      await plant(
        "os.setxattr('/workspace/plant/odd.txt', 'user.e2b.k\\xff\\x1b', b'\\xff\\xfe\\x1b[31m\\\\<script>')",
      );
      assert.deepEqual((await files.getInfo("plant/odd.txt")).metadata, {
        "k\\xc3\\xbf\\x1b": "\\xff\\xfe\\x1b[31m\\x5c<script>",
      });
      // A value over the limit, and many keys.
      await plant("os.setxattr('/tmp/huge.txt', 'user.e2b.big', b'v' * 60000)");
      await plant("[os.setxattr('/tmp/many.txt', 'user.e2b.k%d' % i, b'') for i in range(1000)]");
      for (const name of ["huge", "many"]) {
        await assert.rejects(
          files.getInfo(`/tmp/${name}.txt`),
          new RegExp(`The metadata of '/tmp/${name}.txt' .* is over 4096 bytes`),
        );
      }
      await assert.rejects(files.list("/tmp"), /is over 4096 bytes/);
      // Other keys of the user namespace are not envd's metadata.
      await plant("os.setxattr('/workspace/plant/odd.txt', 'user.other', b'y')");
      assert.equal(Object.keys((await files.getInfo("plant/odd.txt")).metadata ?? {}).length, 1);
      assert.equal((await sandbox.commands.run("echo alive")).stdout, "alive\n");
    } finally {
      await sandbox.kill();
    }
  },
);

sdkTest(
  "a 1 GiB file goes in and comes out through /files streamed: the server's memory stays flat",
  async (served) => {
    const sandbox = await Sandbox.create("base", sdk(served, served.keys.a));
    const size = 1024 ** 3;
    const before = await rssOf(served.pid);
    let peak = before;
    const sampler = setInterval(() => {
      rssOf(served.pid).then((rss) => peak = Math.max(peak, rss), () => {});
    }, 50);
    try {
      // Made as it is sent: neither side holds the file.
      const chunk = new Uint8Array(1 << 20);
      let sent = 0;
      const source = new ReadableStream<Uint8Array>({
        pull(controller): void {
          if (sent === size) return controller.close();
          chunk[0] = sent / chunk.byteLength;
          controller.enqueue(chunk.slice());
          sent += chunk.byteLength;
        },
      });
      await sandbox.files.write("big.bin", source);
      assert.equal((await sandbox.files.getInfo("big.bin")).size, size);
      // The 512th MiB came back as it went in.
      const probe = await sandbox.commands.run(
        `od -An -tu1 -j ${511 * 2 ** 20} -N 1 big.bin`,
      );
      assert.equal(probe.stdout.trim(), "255");
      let got = 0;
      for await (const piece of await sandbox.files.read("big.bin", { format: "stream" })) {
        got += piece.byteLength;
      }
      assert.equal(got, size);
    } finally {
      clearInterval(sampler);
      await sandbox.kill();
    }
    const grew = peak - before;
    assert.ok(grew < 256 * 2 ** 20, `the server grew by ${Math.round(grew / 2 ** 20)} MiB`);
  },
  { toml: "[sandbox]\nquota_bytes = 2147483648\n" },
);
