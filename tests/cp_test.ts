// deno-lint-ignore-file no-console
/**
 * `waffle cp` and `sandbox.files`: round trips against the real daemon (a
 * file, a directory, tar on stdin and stdout, the shell-less and musl
 * images, a large file with the CLI's peak RSS), the host extractor against
 * crafted archives, and the link, special-file, traversal and race attacks
 * of docker cp's CVEs, each mounted as a command and as a compromised runner
 * with a victim outside the sandbox that must come through untouched.
 *
 * @module
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { concat } from "../lib/bytes.ts";
import { selfCommand } from "../lib/config/self.ts";
import { FilesError } from "../lib/errors.ts";
import { extractTar } from "../lib/files/extract.ts";
import { helperOutput } from "../lib/files/mod.ts";
import { newStats, packTree } from "../lib/files/pack.ts";
import { padding, TAR_END, tarHeader, type TarType } from "../lib/files/tar.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import { text } from "./_helpers.ts";
import { liveTest } from "./_docker_gate.ts";
import {
  type Attacker,
  bothWays,
  containerOf,
  type Victim,
  victimFile,
} from "./_hostile_helpers.ts";
import { runOk, tempHome, type TestHome, uniqueUser } from "./_sandbox_helpers.ts";

const MiB = 1024 * 1024;

// ---------------------------------------------------------------- crafting

interface Forged {
  name: string;
  type?: TarType | "raw";
  flag?: string;
  data?: Uint8Array;
  mode?: number;
  linkname?: string;
}

/** Raw ustar header with any flag (the product's writer refuses odd kinds). */
function rawBlock(name: string, flag: string, size: number, mode: number, link = ""): Uint8Array {
  const block = new Uint8Array(512);
  const enc = new TextEncoder();
  block.set(enc.encode(name).subarray(0, 100), 0);
  const oct = (at: number, width: number, v: number): void => {
    block.set(enc.encode(v.toString(8).padStart(width - 1, "0")), at);
  };
  oct(100, 8, mode);
  oct(108, 8, 0);
  oct(116, 8, 0);
  oct(124, 12, size);
  oct(136, 12, 1_700_000_000);
  block[156] = flag.charCodeAt(0);
  block.set(enc.encode(link).subarray(0, 100), 157);
  block.set(enc.encode("ustar\u000000"), 257);
  block.fill(0x20, 148, 156);
  let sum = 0;
  for (const b of block) sum += b;
  block.set(enc.encode(sum.toString(8).padStart(6, "0") + "\0 "), 148);
  return block;
}

function forge(entries: Forged[]): Uint8Array {
  const parts: Uint8Array[] = [];
  for (const entry of entries) {
    const data = entry.data ?? new Uint8Array();
    if (entry.flag !== undefined) {
      parts.push(
        rawBlock(entry.name, entry.flag, data.byteLength, entry.mode ?? 0o644, entry.linkname),
      );
    } else {
      parts.push(tarHeader({
        name: entry.name,
        type: (entry.type ?? "file") as TarType,
        size: data.byteLength,
        mode: entry.mode ?? 0o644,
        mtime: 1_700_000_000,
        ...(entry.linkname === undefined ? {} : { linkname: entry.linkname }),
      }));
    }
    parts.push(data, padding(data.byteLength));
  }
  parts.push(TAR_END);
  return concat(parts);
}

async function* once(bytes: Uint8Array, chunk = 700): AsyncGenerator<Uint8Array> {
  for (let at = 0; at < bytes.byteLength; at += chunk) yield bytes.subarray(at, at + chunk);
}

function listing(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string, prefix: string): void => {
    for (const e of Deno.readDirSync(d)) {
      out.push(`${prefix}${e.name}`);
      if (e.isDirectory) walk(`${d}/${e.name}`, `${prefix}${e.name}/`);
    }
  };
  walk(dir, "");
  return out.sort();
}

/** The hostile archives, each with the one-line refusal it must meet. */
function hostileArchives(victim: string): [string, Uint8Array, RegExp][] {
  const hi = new TextEncoder().encode("pwned\n");
  const victimDir = victim.slice(0, victim.lastIndexOf("/"));
  return [
    [
      "symlink then a file through it",
      forge([{ name: "d", type: "directory" }, {
        name: "d/l",
        type: "symlink",
        linkname: victimDir,
      }, { name: "d/l/pwned", data: hi }]),
      /^Refused entry 'd\/l\/pwned': under 'd\/l', a symbolic link this copy made/,
    ],
    [
      "the root a symlink to the victim's directory, then a file under it",
      forge([{ name: "d", type: "symlink", linkname: victimDir }, { name: "d/pwned", data: hi }]),
      /^Refused entry 'd\/pwned': under 'd', a symbolic link this copy made/,
    ],
    [
      "symlink then a directory and a file through it",
      forge([
        { name: "d", type: "directory" },
        {
          name: "d/l",
          type: "symlink",
          linkname: victimDir,
        },
        { name: "d/l/sub", type: "directory" },
        { name: "d/l/sub/pwned", data: hi },
      ]),
      /^Refused entry 'd\/l\/sub': under 'd\/l', a symbolic link this copy made/,
    ],
    [
      "symlink then the same name as a file (written through it if opened without O_EXCL)",
      forge([{ name: "d", type: "directory" }, { name: "d/l", type: "symlink", linkname: victim }, {
        name: "d/l",
        data: hi,
      }]),
      /^Refused entry 'd\/l': it appears twice/,
    ],
    [
      "symlink with an empty target",
      forge([{ name: "d", type: "directory" }, { name: "d/e", type: "symlink", linkname: "" }]),
      /^Refused entry 'd\/e': a symbolic link with an empty target/,
    ],
    [
      "symlink with a target over 4095 bytes",
      forge([{ name: "d", type: "directory" }, {
        name: "d/long",
        type: "symlink",
        linkname: "x".repeat(4096),
      }]),
      /^Refused entry 'd\/long': a symbolic link with a target over 4095 bytes/,
    ],
    [
      "NUL in a PAX link target",
      (() => {
        const rec = new TextEncoder().encode("25 linkpath=/etc\0/passwd\n");
        return new Uint8Array([
          ...rawBlock("d", "5", 0, 0o755),
          ...rawBlock("PaxHeaders/x", "x", rec.byteLength, 0o644),
          ...rec,
          ...padding(rec.byteLength),
          ...rawBlock("d/l", "2", 0, 0o777, "x"),
          ...TAR_END,
        ]);
      })(),
      /^Refused entry 'd\/l': a symbolic link with NUL in its target/,
    ],
    [
      "hard link to the victim",
      forge([{ name: "d", type: "directory" }, {
        name: "d/h",
        type: "hardlink",
        linkname: victim,
      }]),
      /^Refused entry 'd\/h': a hard link to /,
    ],
    [
      "FIFO",
      forge([{ name: "d", type: "directory" }, { name: "d/p", type: "fifo" }]),
      /^Refused entry 'd\/p': a FIFO/,
    ],
    [
      "char device",
      forge([{ name: "d", type: "directory" }, { name: "d/null", type: "char" }]),
      /^Refused entry 'd\/null': a character device/,
    ],
    [
      "block device",
      forge([{ name: "d", type: "directory" }, { name: "d/sda", type: "block" }]),
      /^Refused entry 'd\/sda': a block device/,
    ],
    [
      "'..' name",
      forge([{ name: "d", type: "directory" }, { name: "d/../../x", data: hi }]),
      /^Refused entry 'd\/..\/..\/x': '..' in its name/,
    ],
    [
      "absolute name",
      forge([{ name: victim, data: hi }]),
      /^Refused entry '\/.*': an absolute name/,
    ],
    [
      "outside the root",
      forge([{ name: "d", type: "directory" }, { name: "other", data: hi }]),
      /^Refused entry 'other': outside the copied 'd'/,
    ],
    [
      "duplicate",
      forge([{ name: "d", type: "directory" }, { name: "d/a", data: hi }, {
        name: "d/a",
        data: hi,
      }]),
      /^Refused entry 'd\/a': it appears twice/,
    ],
    [
      "GNU long name",
      forge([{ name: "d", type: "directory" }, { name: "././@LongLink", flag: "L", data: hi }]),
      /^Refused entry '.*': an entry of unknown type 'L'/,
    ],
    [
      "NUL in a PAX path",
      (() => {
        const rec = new TextEncoder().encode("17 path=d/a\0/../x\n");
        return new Uint8Array([
          ...rawBlock("PaxHeaders/x", "x", rec.byteLength, 0o644),
          ...rec,
          ...padding(rec.byteLength),
          ...rawBlock("d/a", "0", 0, 0o644),
          ...TAR_END,
        ]);
      })(),
      /NUL|malformed/,
    ],
  ];
}

// ------------------------------------------------------- host extractor

Deno.test("cp extract: every hostile archive is refused in one line and leaves nothing", async () => {
  await using victim = await victimFile();
  for (const [what, bytes, expected] of hostileArchives(victim.path)) {
    const dir = await Deno.makeTempDir({ prefix: "waffle-cp-x-" });
    try {
      await assert.rejects(
        () => extractTar(once(bytes), `${dir}/out`, { rootName: "d" }),
        (error: Error) => {
          assert.ok(error instanceof FilesError, `${what}: ${error.stack}`);
          assert.match(error.message, expected, what);
          assert.ok(!error.message.includes("\n"), `${what}: one line`);
          return true;
        },
      );
      assert.deepEqual(listing(dir), [], `${what}: nothing left`);
      victim.check();
      assertNothingThrough(victim);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});

/** Asserts that nothing was written next to the victim (through a link to its directory). */
function assertNothingThrough(victim: Victim): void {
  const dir = victim.path.slice(0, victim.path.lastIndexOf("/"));
  assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name), ["secret"]);
}

/** Link entries a copy carries as data, with what each must read back as. */
function linkArchive(victim: string): { bytes: Uint8Array; links: [string, string][] } {
  const links: [string, string][] = [
    ["d/passwd", "/etc/passwd"],
    ["d/up", "../../.."],
    ["d/victim", victim],
    ["d/bin/python", "/usr/bin/python3"],
    ["d/bin/python3", "python"],
    ["d/lib64", "lib"],
    ["d/dangling", "no/such/file"],
    ["d/long", `${"n/".repeat(100)}é`],
  ];
  const bytes = forge([
    { name: "d", type: "directory" },
    { name: "d/bin", type: "directory" },
    { name: "d/lib", type: "directory" },
    { name: "d/lib/mod.py", data: new TextEncoder().encode("x = 1\n") },
    ...links.map(([name, linkname]): Forged => ({ name, type: "symlink", linkname })),
  ]);
  return { bytes, links };
}

Deno.test("cp extract: symlinks are made as links with their target unchanged, never followed", async () => {
  await using victim = await victimFile();
  const dir = await Deno.makeTempDir({ prefix: "waffle-cp-x-" });
  try {
    const { bytes, links } = linkArchive(victim.path);
    const done = await extractTar(once(bytes), `${dir}/out`, { rootName: "d" });
    assert.equal(done.stats.links, links.length);
    assert.equal(done.stats.files, 1);
    for (const [name, target] of links) {
      const path = `${dir}/out/${name.slice(2)}`;
      assert.ok(Deno.lstatSync(path).isSymlink, name);
      assert.equal(Deno.readLinkSync(path), target, name);
    }
    victim.check();
    assertNothingThrough(victim);
    // The root itself a link.
    const root = forge([{ name: "l", type: "symlink", linkname: "/etc/shadow" }]);
    await extractTar(once(root), `${dir}/l`, { rootName: "l" });
    assert.equal(Deno.readLinkSync(`${dir}/l`), "/etc/shadow");
    // links: "skip" leaves them out, counted, and a later entry under a skipped
    // link's name is a fresh directory, never the link's target.
    const skipped = await extractTar(
      once(forge([
        { name: "d", type: "directory" },
        {
          name: "d/l",
          type: "symlink",
          linkname: victim.path.slice(0, victim.path.lastIndexOf("/")),
        },
        { name: "d/l/pwned", data: new Uint8Array(3) },
        { name: "d/m", type: "symlink", linkname: "/etc" },
      ])),
      `${dir}/skipped`,
      { rootName: "d", links: "skip" },
    );
    assert.equal(skipped.stats.skippedLinks, 2);
    assert.equal(skipped.stats.links, 0);
    assert.deepEqual(listing(`${dir}/skipped`), ["l", "l/pwned"]);
    assert.ok(Deno.lstatSync(`${dir}/skipped/l`).isDirectory);
    assertNothingThrough(victim);
    await assert.rejects(
      () =>
        extractTar(once(root), `${dir}/l2`, {
          rootName: "l",
          links: "skip",
        }),
      /^FilesError: Nothing was copied: the copy held only a symbolic link, skipped$/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("cp extract: setuid, setgid and sticky bits are stripped and reported", async () => {
  const dir = await Deno.makeTempDir({ prefix: "waffle-cp-x-" });
  try {
    const bytes = forge([
      { name: "d", type: "directory", mode: 0o1777 },
      { name: "d/suid", data: new TextEncoder().encode("#!/bin/sh\n"), mode: 0o4755 },
      { name: "d/sgid", data: new Uint8Array(1), mode: 0o2755 },
    ]);
    const done = await extractTar(once(bytes), `${dir}/out`, { rootName: "d" });
    assert.deepEqual(done.stripped.sort(), ["d", "d/sgid", "d/suid"]);
    for (const name of ["out", "out/suid", "out/sgid"]) {
      assert.equal(Deno.statSync(`${dir}/${name}`).mode! & 0o7000, 0, name);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("cp extract: truncated streams, bad checksums and the size cap leave nothing", async () => {
  const dir = await Deno.makeTempDir({ prefix: "waffle-cp-x-" });
  try {
    const good = forge([{ name: "d", type: "directory" }, {
      name: "d/a",
      data: new Uint8Array(5000),
    }]);
    const cases: [Uint8Array, RegExp, number?][] = [
      [good.subarray(0, 1500), /ends inside an entry's data/],
      [good.subarray(0, 700), /ends inside a header/],
      [
        (() => {
          const bad = good.slice();
          bad[0] = 0x41;
          return bad;
        })(),
        /checksum mismatch/,
      ],
      [good, /would exceed 4096 bytes/, 4096],
    ];
    for (const [bytes, expected, maxBytes] of cases) {
      await assert.rejects(
        () =>
          extractTar(once(bytes), `${dir}/out`, {
            rootName: "d",
            ...(maxBytes === undefined ? {} : { maxBytes }),
          }),
        expected,
      );
      assert.deepEqual(listing(dir), []);
    }
    // Never merges into an existing directory.
    Deno.mkdirSync(`${dir}/out`);
    await assert.rejects(
      () => extractTar(once(good), dir, { rootName: "out" }),
      /Refused entry 'd\/?'/,
    );
    await assert.rejects(
      () => extractTar(once(forge([{ name: "out", type: "directory" }])), dir, { rootName: "out" }),
      /already exists as a directory/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("cp pack: a local tree round-trips through pack and extract, long names via PAX", async () => {
  const dir = await Deno.makeTempDir({ prefix: "waffle-cp-x-" });
  try {
    const long = "n".repeat(150);
    Deno.mkdirSync(`${dir}/src/${long}/deeper`, { recursive: true });
    Deno.writeTextFileSync(`${dir}/src/${long}/deeper/${"é".repeat(40)}.txt`, "long\n");
    Deno.writeFileSync(`${dir}/src/blob`, new Uint8Array(100_000).map((_, i) => i % 251));
    const stats = newStats();
    const done = await extractTar(
      packTree(`${dir}/src`, "src", { special: "refuse", stats }),
      `${dir}/dst`,
      {
        rootName: "src",
      },
    );
    assert.equal(done.stats.files, 2);
    assert.equal(stats.bytes, 100_005);
    assert.deepEqual(listing(`${dir}/dst`), listing(`${dir}/src`));
    assert.deepEqual(Deno.readFileSync(`${dir}/dst/blob`), Deno.readFileSync(`${dir}/src/blob`));
    // Links are packed as links (target text, never followed), or skipped and counted.
    Deno.symlinkSync("/etc/shadow", `${dir}/src/link`);
    Deno.symlinkSync("blob", `${dir}/src/rel`);
    const linked = newStats();
    await extractTar(
      packTree(`${dir}/src`, "src", { special: "refuse", stats: linked }),
      `${dir}/dst2`,
      { rootName: "src" },
    );
    assert.equal(linked.links, 2);
    assert.equal(linked.bytes, 100_005, "no link's target was read");
    assert.equal(Deno.readLinkSync(`${dir}/dst2/link`), "/etc/shadow");
    assert.equal(Deno.readLinkSync(`${dir}/dst2/rel`), "blob");
    const skipped = newStats();
    const done3 = await extractTar(
      packTree(`${dir}/src`, "src", { special: "refuse", links: "skip", stats: skipped }),
      `${dir}/dst3`,
      { rootName: "src" },
    );
    assert.equal(skipped.skippedLinks, 2);
    assert.equal(done3.stats.links, 0);
    assert.deepEqual(listing(`${dir}/dst3`), listing(`${dir}/dst`));
    // Other special files stay refused.
    const fifo = await new Deno.Command("mkfifo", { args: [`${dir}/src/p`] }).output();
    assert.equal(fifo.code, 0);
    await assert.rejects(
      () =>
        extractTar(packTree(`${dir}/src`, "src", { special: "refuse" }), `${dir}/dst4`, {
          rootName: "src",
        }),
      /Refused '.*\/src\/p': a fifo; waffle cp copies regular files, directories and symbolic links only/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

// ------------------------------------------------------------ live helpers

async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  using file = await Deno.open(path);
  for await (const chunk of file.readable) hash.update(chunk);
  return hash.digest("hex");
}

/** Runs the CLI as a child, sampling its peak RSS (VmHWM) while it runs. */
async function cliMeasured(
  home: TestHome,
  args: string[],
  stdin?: Uint8Array,
): Promise<{ code: number; stdout: string; stderr: string; peakKiB: number }> {
  const self = selfCommand();
  const child = new Deno.Command(self.executable, {
    args: [...self.prefix, ...args],
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
    env: { WAFFLE_HOME: home.home },
  }).spawn();
  let peakKiB = 0;
  const sample = setInterval(() => {
    try {
      const status = Deno.readTextFileSync(`/proc/${child.pid}/status`);
      const hwm = Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0);
      peakKiB = Math.max(peakKiB, hwm);
    } catch {
      // exited
    }
  }, 50);
  if (stdin !== undefined) {
    const writer = child.stdin.getWriter();
    await writer.write(stdin);
    await writer.close();
  }
  const out = await child.output();
  clearInterval(sample);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr), peakKiB };
}

async function cpJson(home: TestHome, args: string[]): Promise<Record<string, unknown>> {
  const out = await home.cli(["cp", "--json", ...args]);
  assert.equal(out.code, 0, `cp ${args.join(" ")}: ${out.stderr}`);
  return JSON.parse(out.stdout);
}

// ------------------------------------------------------------ live: basics

liveTest(
  "cp: a file in and out keeps its SHA-256; a directory copies recursively; '-' tar both ways",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("cp");
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    try {
      const blob = new Uint8Array(3 * MiB + 17).map((_, i) => (i * 7) % 256);
      Deno.writeFileSync(`${local}/blob.bin`, blob);
      const want = await sha256File(`${local}/blob.bin`);
      const inn = await cpJson(home, [`${local}/blob.bin`, `${user}:blob.bin`]);
      assert.equal(inn.sha256, want);
      assert.equal(inn.bytes, blob.byteLength);
      Deno.mkdirSync(`${local}/back`);
      const out = await cpJson(home, [`${user}:/workspace/blob.bin`, `${local}/back/`]);
      assert.equal(out.sha256, want);
      assert.equal(await sha256File(`${local}/back/blob.bin`), want);

      Deno.mkdirSync(`${local}/tree/a/b`, { recursive: true });
      Deno.writeTextFileSync(`${local}/tree/top.txt`, "top\n");
      Deno.writeTextFileSync(`${local}/tree/a/b/deep.txt`, "deep\n");
      Deno.chmodSync(`${local}/tree/top.txt`, 0o640);
      await cpJson(home, [`${local}/tree`, `${user}:.`]);
      const sandbox = home.open(user);
      assert.equal(await runOk(sandbox, "cat tree/a/b/deep.txt"), "deep\n");
      const listed = await sandbox.files.list("tree");
      assert.deepEqual(listed.map((e) => [e.name, e.type]), [["a", "directory"], [
        "top.txt",
        "file",
      ]]);
      assert.equal(listed[1]!.mode, 0o640);
      await cpJson(home, [`${user}:tree`, `${local}/tree-back`]);
      assert.deepEqual(listing(`${local}/tree-back`), listing(`${local}/tree`));
      assert.equal(Deno.statSync(`${local}/tree-back/top.txt`).mode! & 0o777, 0o640);

      // '-': a tar stream out on stdout, and in on stdin.
      const tarOut = await new Deno.Command(selfCommand().executable, {
        args: [...selfCommand().prefix, "cp", `${user}:tree`, "-"],
        env: { WAFFLE_HOME: home.home },
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(tarOut.code, 0, text(tarOut.stderr));
      const names = await new Deno.Command("tar", {
        args: ["tf", "-"],
        stdin: "piped",
        stdout: "piped",
      })
        .spawn();
      const w = names.stdin.getWriter();
      await w.write(tarOut.stdout);
      await w.close();
      assert.deepEqual(
        text((await names.output()).stdout).trim().split("\n").sort(),
        ["tree/", "tree/a/", "tree/a/b/", "tree/a/b/deep.txt", "tree/top.txt"],
      );
      await runOk(sandbox, "mkdir -p incoming");
      const piped = await cliMeasured(home, ["cp", "-", `${user}:incoming`], tarOut.stdout);
      assert.equal(piped.code, 0, piped.stderr);
      assert.equal(await runOk(sandbox, "cat incoming/tree/top.txt"), "top\n");

      // The library.
      await sandbox.files.write(
        "lib/x.txt".replace("lib/", ""),
        new TextEncoder().encode("via lib\n"),
      );
      assert.equal(await new Response(sandbox.files.read("x.txt")).text(), "via lib\n");
      await sandbox.files.remove("x.txt");
      await assert.rejects(() => new Response(sandbox.files.read("x.txt")).text(), /No such file/);

      // Errors are one line.
      const missing = await home.cli(["cp", `${user}:nope`, `${local}/n`]);
      assert.equal(missing.code, 125);
      assert.equal(missing.stderr, "waffle: No such file or directory 'nope'\n");
      const both = await home.cli(["cp", `${user}:a`, `${user}:b`]);
      assert.match(both.stderr, /^waffle: Exactly one of 'cp-.*:a' and .* must be USER:PATH.*\n$/);
    } finally {
      await Deno.remove(local, { recursive: true });
    }
  },
);

/** A venv-like tree: relative and absolute links, a link to a directory, a dangling one. */
const VENV_LINKS: [string, string][] = [
  ["venv/bin/python", "/usr/bin/python3"],
  ["venv/bin/python3", "python"],
  ["venv/lib64", "lib"],
  ["venv/lib/python3.11/site-packages/pkg/link.py", "../../../../bin/activate"],
  ["venv/dangling", "no/such/file"],
];

function venvTree(local: string, secret: string): void {
  Deno.mkdirSync(`${local}/venv/bin`, { recursive: true });
  Deno.mkdirSync(`${local}/venv/lib/python3.11/site-packages/pkg`, { recursive: true });
  Deno.writeTextFileSync(`${local}/venv/pyvenv.cfg`, "home = /usr/bin\n");
  Deno.writeTextFileSync(`${local}/venv/bin/activate`, "# activate\n");
  Deno.writeTextFileSync(`${local}/venv/lib/python3.11/site-packages/pkg/__init__.py`, "x = 1\n");
  for (const [name, target] of VENV_LINKS) Deno.symlinkSync(target, `${local}/${name}`);
  Deno.symlinkSync(secret, `${local}/venv/secret`);
}

liveTest(
  "cp: a venv-like tree's links go in and out as links (readlink equal), never followed; --no-links counts",
  async (docker) => {
    await using home = await tempHome(docker);
    await using victim = await victimFile();
    const secret = Deno.readTextFileSync(victim.path);
    const user = uniqueUser("cplinks");
    const sandbox = home.open(user);
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    try {
      venvTree(local, victim.path);
      const links = [...VENV_LINKS, ["venv/secret", victim.path] as [string, string]];
      const fileBytes = 16 + 11 + 6;
      const inn = await cpJson(home, [`${local}/venv`, `${user}:venv`]);
      assert.deepEqual([inn.links, inn.files, inn.bytes], [links.length, 3, fileBytes]);
      const read = await runOk(
        sandbox,
        `for f in ${links.map(([n]) => n).join(" ")}; do readlink "$f"; done`,
      );
      assert.deepEqual(read.trim().split("\n"), links.map(([, t]) => t));
      assert.equal(await runOk(sandbox, "find venv -type l | wc -l"), `${links.length}\n`);
      // The host's secret never crossed: only its path did.
      assert.equal(
        await runOk(sandbox, `grep -rlF '${secret.trim()}' /workspace /tmp || echo none`),
        "none\n",
      );

      // A link the sandbox made to /etc/shadow comes out a link; nothing is read through it.
      await runOk(sandbox, "ln -s /etc/shadow venv/shadow && ln -s /workspace/venv venv/self");
      const all: [string, string][] = [
        ...links,
        ["venv/shadow", "/etc/shadow"],
        ["venv/self", "/workspace/venv"],
      ];
      const out = await cpJson(home, [`${user}:venv`, `${local}/back`]);
      assert.deepEqual([out.links, out.files, out.bytes], [all.length, 3, fileBytes]);
      for (const [name, target] of all) {
        const path = `${local}/back/${name.slice("venv/".length)}`;
        assert.ok(Deno.lstatSync(path).isSymlink, name);
        assert.equal(Deno.readLinkSync(path), target, name);
      }
      assert.deepEqual(
        listing(`${local}/back`),
        [...listing(`${local}/venv`), "self", "shadow"].sort(),
      );
      victim.check();

      // '-' out: the links in the host-made tar, extracted by GNU tar.
      const tarOut = await new Deno.Command(selfCommand().executable, {
        args: [...selfCommand().prefix, "cp", `${user}:venv`, "-"],
        env: { WAFFLE_HOME: home.home },
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(tarOut.code, 0, text(tarOut.stderr));
      Deno.mkdirSync(`${local}/untar`);
      const untar = new Deno.Command("tar", {
        args: ["xf", "-", "-C", `${local}/untar`],
        stdin: "piped",
      }).spawn();
      const w = untar.stdin.getWriter();
      await w.write(tarOut.stdout);
      await w.close();
      assert.equal((await untar.status).code, 0);
      for (const [name, target] of all) {
        assert.equal(Deno.readLinkSync(`${local}/untar/${name}`), target, name);
      }

      // --no-links: both ways, the links are left out and counted.
      const skipIn = await cpJson(home, ["--no-links", `${local}/venv`, `${user}:nolinks`]);
      assert.deepEqual([skipIn.links, skipIn.skippedLinks, skipIn.files], [0, links.length, 3]);
      assert.equal(await runOk(sandbox, "find nolinks -type l | wc -l"), "0\n");
      const skipOut = await home.cli(["cp", "--no-links", `${user}:venv`, `${local}/nolinks`]);
      assert.equal(skipOut.code, 0, skipOut.stderr);
      assert.equal(
        skipOut.stderr,
        `waffle: skipped ${all.length} symbolic link(s) (--no-links)\n`,
      );
      const skipJson = await cpJson(home, ["--no-links", `${user}:venv`, `${local}/nolinks2`]);
      assert.deepEqual([skipJson.links, skipJson.skippedLinks], [0, all.length]);
      const hasLink = (dir: string): boolean =>
        listing(dir).some((n) => Deno.lstatSync(`${dir}/${n}`).isSymlink);
      assert.equal(hasLink(`${local}/nolinks`), false);
      // '-' in with --no-links: the sandbox leaves them out and says how many.
      const stdinSkip = await cliMeasured(
        home,
        ["cp", "--json", "--no-links", "-", `${user}:nolinks`],
        tarOut.stdout,
      );
      assert.equal(stdinSkip.code, 0, stdinSkip.stderr);
      assert.equal(JSON.parse(stdinSkip.stdout).skippedLinks, all.length);
      assert.equal(await runOk(sandbox, "find nolinks -type l | wc -l"), "0\n");
      victim.check();
    } finally {
      await Deno.remove(local, { recursive: true });
    }
  },
);

liveTest(
  "cp attack: a tar on stdin with 'd -> DIR' then 'd/pwned' is refused inside the sandbox, nothing written through the link",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("cplinkin");
    const sandbox = home.open(user);
    await runOk(sandbox, "mkdir -p incoming target");
    const hi = new TextEncoder().encode("pwned\n");
    const attacks: [Uint8Array, RegExp][] = [
      [
        forge([{ name: "d", type: "symlink", linkname: "/workspace/target" }, {
          name: "d/pwned",
          data: hi,
        }]),
        /^waffle: Refused entry 'd\/pwned': under 'd', a symbolic link this copy made\n$/,
      ],
      [
        forge([
          { name: "e", type: "directory" },
          { name: "e/l", type: "symlink", linkname: "../../target" },
          { name: "e/l/pwned", data: hi },
        ]),
        /^waffle: Refused entry 'e\/l\/pwned': under 'e\/l', a symbolic link this copy made\n$/,
      ],
    ];
    for (const [bytes, expected] of attacks) {
      const out = await cliMeasured(home, ["cp", "-", `${user}:incoming`], bytes);
      assert.equal(out.code, 125, out.stderr);
      assert.match(out.stderr, expected);
      assert.equal(await runOk(sandbox, "ls -A incoming target"), "incoming:\n\ntarget:\n");
    }
  },
);

for (const image of ["waffle-noshell:latest", "waffle-musl:latest"]) {
  liveTest(`cp: a file and a directory in and out with the image '${image}'`, async (docker) => {
    await using home = await tempHome(docker, { image });
    const user = uniqueUser("cpimg");
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    try {
      Deno.mkdirSync(`${local}/d`);
      Deno.writeFileSync(`${local}/d/f`, new Uint8Array(200_000).map((_, i) => i % 13));
      const want = await sha256File(`${local}/d/f`);
      await cpJson(home, [`${local}/d`, `${user}:d`]);
      const single = await cpJson(home, [`${user}:d/f`, `${local}/f.back`]);
      assert.equal(single.sha256, want);
      await cpJson(home, [`${user}:d`, `${local}/d.back`]);
      assert.equal(await sha256File(`${local}/d.back/f`), want);
    } finally {
      await Deno.remove(local, { recursive: true });
    }
  });
}

const BIG_MIB = Number(Deno.env.get("WAFFLE_CP_TEST_MIB") ?? 256);

liveTest(
  `cp: ${BIG_MIB} MiB in and out with the SHA-256 unchanged and the CLI's peak RSS flat`,
  async (docker) => {
    await using home = await tempHome(docker, { quotaBytes: (BIG_MIB * 2 + 256) * MiB });
    const user = uniqueUser("cpbig");
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    try {
      const path = `${local}/big.bin`;
      const dd = await new Deno.Command("dd", {
        args: ["if=/dev/urandom", `of=${path}`, "bs=1M", `count=${BIG_MIB}`, "status=none"],
      }).output();
      assert.equal(dd.code, 0);
      const want = await sha256File(path);
      const inn = await cliMeasured(home, ["cp", "--json", path, `${user}:big.bin`]);
      assert.equal(inn.code, 0, inn.stderr);
      assert.equal(JSON.parse(inn.stdout).sha256, want);
      await Deno.remove(path);
      const out = await cliMeasured(home, ["cp", "--json", `${user}:big.bin`, path]);
      assert.equal(out.code, 0, out.stderr);
      assert.equal(JSON.parse(out.stdout).sha256, want);
      assert.equal(await sha256File(path), want);
      console.error(
        `cp ${BIG_MIB} MiB: in ${JSON.parse(inn.stdout).mbPerSecond} MB/s, peak RSS ${
          (inn.peakKiB / 1024).toFixed(0)
        } MiB; out ${JSON.parse(out.stdout).mbPerSecond} MB/s, peak RSS ${
          (out.peakKiB / 1024).toFixed(0)
        } MiB`,
      );
      assert.ok(inn.peakKiB < 300 * 1024, `copy in peak RSS ${inn.peakKiB} KiB`);
      assert.ok(out.peakKiB < 300 * 1024, `copy out peak RSS ${out.peakKiB} KiB`);
    } finally {
      await Deno.remove(local, { recursive: true });
    }
  },
);

liveTest(
  "cp: a copy in over the disk quota fails with a clear error and leaves nothing",
  async (docker) => {
    await using home = await tempHome(docker, { quotaBytes: 64 * MiB });
    const user = uniqueUser("cpquota");
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    try {
      const sandbox = home.open(user);
      await sandbox.ensure();
      // Root enforces the quota (a loop volume); elsewhere there is none to hit.
      if (Deno.uid() !== 0) return;
      assert.equal(sandbox.volume?.enforced, true, "the quota is not enforced although root");
      const dd = await new Deno.Command("dd", {
        args: ["if=/dev/zero", `of=${local}/big`, "bs=1M", "count=96", "status=none"],
      }).output();
      assert.equal(dd.code, 0);
      const out = await home.cli(["cp", `${local}/big`, `${user}:big`]);
      assert.equal(out.code, 125);
      assert.match(out.stderr, /^waffle: No space left writing 'big': the disk quota is full\n$/);
      assert.equal(await runOk(sandbox, "ls -A /workspace"), "");
    } finally {
      await Deno.remove(local, { recursive: true });
    }
  },
);

// ------------------------------------------------------------ live: attacks

async function attackerReady(home: TestHome, attacker: Attacker): Promise<Sandbox> {
  const sandbox = home.open(uniqueUser(`cpatk-${attacker.kind}`));
  // d is the commands' and 0777: the runner (uid 0 without CAP_DAC_OVERRIDE) may write in it too.
  await runOk(
    sandbox,
    "mkdir -p /workspace/d && echo ok > /workspace/d/ok && chmod 777 /workspace/d",
  );
  return sandbox;
}

async function sh(attacker: Attacker, sandbox: Sandbox, line: string): Promise<void> {
  const done = await attacker.sh(sandbox, line);
  assert.equal(done.code, 0, `${line}: ${done.stderr}`);
}

/** Copies d out and asserts the refusal, an empty destination and an untouched victim. */
async function refusedOut(
  home: TestHome,
  sandbox: Sandbox,
  victim: Victim,
  expected: RegExp,
): Promise<void> {
  const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
  try {
    const out = await home.cli(["cp", `${sandbox.key.user}:d`, `${local}/d`]);
    assert.equal(out.code, 125, out.stderr);
    assert.match(out.stderr, expected);
    assert.equal(out.stderr.split("\n").length, 2, `one line: ${out.stderr}`);
    assert.deepEqual(listing(local), []);
    victim.check();
  } finally {
    await Deno.remove(local, { recursive: true });
  }
}

bothWays(
  "cp attack: symlinks to /etc/passwd, ../../.. and the victim's host path come out as links, never followed",
  async (docker, attacker) => {
    await using home = await tempHome(docker);
    await using victim = await victimFile();
    const sandbox = await attackerReady(home, attacker);
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    try {
      for (const [i, target] of ["/etc/passwd", "../../..", victim.path].entries()) {
        await sh(attacker, sandbox, `rm -f /workspace/d/l && ln -s '${target}' /workspace/d/l`);
        const out = await cpJson(home, [`${sandbox.key.user}:d`, `${local}/d${i}`]);
        assert.equal(out.links, 1);
        assert.equal(out.bytes, 3, "only d/ok's bytes: no link's target was read");
        assert.equal(Deno.readLinkSync(`${local}/d${i}/l`), target);
        assert.equal(Deno.readTextFileSync(`${local}/d${i}/ok`), "ok\n");
        victim.check();
        assertNothingThrough(victim);
      }
    } finally {
      await Deno.remove(local, { recursive: true });
    }
  },
);

bothWays("cp attack: a FIFO and a hard link in the copied tree", async (docker, attacker) => {
  await using home = await tempHome(docker);
  await using victim = await victimFile();
  const sandbox = await attackerReady(home, attacker);
  await sh(attacker, sandbox, "mkfifo /workspace/d/p");
  await refusedOut(home, sandbox, victim, /^waffle: Refused entry 'd\/p': a FIFO;/);
  // A hard link to a file outside the copied tree arrives as an inert copy of its bytes.
  await sh(
    attacker,
    sandbox,
    "rm /workspace/d/p",
  );
  // (made by a command: the runner's uid 0 cannot link the commands' files, protected_hardlinks)
  await runOk(sandbox, "echo outside > /workspace/outside && ln /workspace/outside /workspace/d/h");
  const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
  try {
    await cpJson(home, [`${sandbox.key.user}:d`, `${local}/d`]);
    assert.equal(Deno.readTextFileSync(`${local}/d/h`), "outside\n");
    assert.equal(Deno.lstatSync(`${local}/d/h`).nlink, 1);
    victim.check();
  } finally {
    await Deno.remove(local, { recursive: true });
  }
});

bothWays(
  "cp attack: a setuid file comes out with the bit stripped and named",
  async (docker, attacker) => {
    await using home = await tempHome(docker);
    const sandbox = await attackerReady(home, attacker);
    await sh(
      attacker,
      sandbox,
      "cp /bin/sh /workspace/d/suid 2>/dev/null || echo x > /workspace/d/suid; chmod 4755 /workspace/d/suid",
    );
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    try {
      const out = await home.cli(["cp", `${sandbox.key.user}:d`, `${local}/d`]);
      assert.equal(out.code, 0, out.stderr);
      assert.equal(Deno.statSync(`${local}/d/suid`).mode! & 0o7000, 0);
      const mode = (await sandbox.files.list("d/suid"))[0]!.mode;
      if ((mode & 0o4000) !== 0) assert.match(out.stderr, /stripped the setuid.*'d\/suid'/);
    } finally {
      await Deno.remove(local, { recursive: true });
    }
  },
);

bothWays(
  "cp attack: a forged tar stream (devices, links, '..', absolute names) through the session is refused",
  async (docker, attacker) => {
    await using home = await tempHome(docker);
    await using victim = await victimFile();
    const sandbox = await attackerReady(home, attacker);
    // A compromised runner writes any stdout rows for 'files pack'; what the
    // host meets is the forged archive arriving through a session's stdout.
    for (const [what, bytes, expected] of hostileArchives(victim.path)) {
      const b64 = btoa(String.fromCharCode(...bytes));
      await sh(attacker, sandbox, `echo '${b64}' | base64 -d > /workspace/d/forged.tar`);
      const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
      try {
        await assert.rejects(
          () =>
            extractTar(helperOutput(sandbox, ["read", "d/forged.tar"]), `${local}/d`, {
              rootName: "d",
            }),
          (error: Error) => {
            assert.ok(error instanceof FilesError, `${what}: ${error.stack}`);
            assert.match(error.message, expected, what);
            return true;
          },
        );
        assert.deepEqual(listing(local), [], what);
        victim.check();
      } finally {
        await Deno.remove(local, { recursive: true });
      }
    }
  },
);

bothWays(
  "cp attack: a directory swapped for a symlink during the copy (CVE-2018-15664) never reaches the host",
  async (docker, attacker) => {
    await using home = await tempHome(docker);
    await using victim = await victimFile();
    const sandbox = await attackerReady(home, attacker);
    await runOk(
      sandbox,
      "mkdir -p /workspace/d/sub && for i in $(seq 200); do echo $i > /workspace/d/sub/f$i; done",
    );
    const container = containerOf(sandbox);
    const victimDir = victim.path.slice(0, victim.path.lastIndexOf("/"));
    const loop = attacker.kind === "command"
      ? ["sh", "-c", `/usr/libexec/waffle/spawn 10001 10001 /bin/sh -c "$1"; exit $?`, "x"]
      : ["sh", "-c"];
    const swapper = new Deno.Command("docker", {
      args: [
        "exec",
        "-u",
        "0",
        container,
        ...loop,
        `cd /workspace/d; end=$(( $(date +%s) + 20 )); while [ $(date +%s) -lt $end ]; do ` +
        `mv sub sub.real 2>/dev/null; ln -sfn '${victimDir}' sub; ` +
        `rm -f sub; mv sub.real sub 2>/dev/null; done`,
      ],
      stdout: "null",
      stderr: "null",
    }).spawn();
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    try {
      let refused = 0;
      let copied = 0;
      for (let i = 0; i < 6; i++) {
        const out = await home.cli(["cp", `${sandbox.key.user}:d`, `${local}/d${i}`]);
        if (out.code === 0) {
          copied++;
          // The swapped name may come out as the link it was (its target text),
          // never as the victim's directory read through it.
          for (const name of listing(`${local}/d${i}`)) {
            if (!Deno.lstatSync(`${local}/d${i}/${name}`).isSymlink) continue;
            assert.equal(name, "sub");
            assert.equal(Deno.readLinkSync(`${local}/d${i}/sub`), victimDir);
          }
        } else {
          refused++;
          assert.equal(out.stderr.split("\n").length, 2, out.stderr);
          assert.match(
            out.stderr,
            /^waffle: (No such file|(File|Directory|Link) .* was replaced|Cannot read)/,
          );
          assert.ok(!listing(local).some((n) => n.startsWith(`d${i}`)), "nothing left");
        }
        victim.check();
        assertNothingThrough(victim);
      }
      console.error(`swap race: ${copied} copied, ${refused} refused`);
    } finally {
      await swapper.status;
      await Deno.remove(local, { recursive: true });
    }
  },
);

liveTest(
  "cp attack: a planted libnss_files.so.2 / LD_PRELOAD library is never loaded by a host process (CVE-2019-14271)",
  async (docker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("cpnss"));
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    const marker = `${local}/loaded-${crypto.randomUUID()}`;
    try {
      Deno.writeTextFileSync(
        `${local}/evil.c`,
        `#include <stdio.h>\n__attribute__((constructor)) static void hit(void) { FILE *f = fopen("${marker}", "w"); if (f) fclose(f); }\n`,
      );
      const cc = await new Deno.Command("gcc", {
        args: ["-shared", "-fPIC", "-o", `${local}/libnss_files.so.2`, `${local}/evil.c`],
      }).output();
      assert.equal(cc.code, 0, text(cc.stderr));
      // Planted in the workspace, under the names a host resolver or loader would look for.
      await runOk(
        sandbox,
        "mkdir -p d/lib d/lib64 d/etc && echo 'passwd: files' > d/etc/nsswitch.conf",
      );
      await cpJson(home, [`${local}/libnss_files.so.2`, `${sandbox.key.user}:d/lib`]);
      await runOk(
        sandbox,
        "cp d/lib/libnss_files.so.2 d/lib64/ && cp d/lib/libnss_files.so.2 /tmp/",
      );
      await cpJson(home, [`${sandbox.key.user}:d`, `${local}/out`]);
      await cpJson(home, [`${local}/out/etc`, `${sandbox.key.user}:d/etc2`]);
      assert.ok(Deno.statSync(`${local}/out/lib/libnss_files.so.2`).isFile);
      let loaded = true;
      try {
        Deno.statSync(marker);
      } catch {
        loaded = false;
      }
      assert.equal(loaded, false, "the planted library ran on the host");
    } finally {
      await Deno.remove(local, { recursive: true });
    }
  },
);

liveTest(
  "cp: a sparse file larger than the quota is refused on its way out, so the host's disk never fills",
  async (docker) => {
    await using home = await tempHome(docker, { quotaBytes: 64 * MiB });
    const user = uniqueUser("cpsparse");
    const local = await Deno.makeTempDir({ prefix: "waffle-cp-local-" });
    try {
      const sandbox = home.open(user);
      await runOk(sandbox, "truncate -s 1G /workspace/sparse && echo ok > /workspace/small");
      const out = await home.cli(["cp", `${user}:sparse`, `${local}/sparse`]);
      assert.equal(out.code, 125, out.stderr);
      assert.match(
        out.stderr,
        /^waffle: Refused entry 'sparse': the copy would exceed 67108864 bytes/,
      );
      assert.deepEqual([...Deno.readDirSync(local)], [], "nothing is left on the host");
      const small = await home.cli(["cp", `${user}:small`, `${local}/small`]);
      assert.equal(small.code, 0, small.stderr);
    } finally {
      await Deno.remove(local, { recursive: true });
    }
  },
);
