/**
 * The artefact's build directory (`lib/config/artefact_dir.ts`): its digest
 * covers every file, an install's stamp spares the hashing until a file
 * changes, and an install's `lib/waffle/waffle.js` stands for its current
 * build (`lib/config/self.ts`).
 */
import assert from "node:assert/strict";
import {
  buildDigest,
  buildDirName,
  installDirOf,
  writeBuildStamp,
  writeSums,
} from "../lib/config/artefact_dir.ts";
import {
  artefactCommand,
  artefactDigest,
  runnerCacheOf,
  runtimeKitOf,
} from "../lib/config/self.ts";
import { sha256Hex } from "../lib/digest.ts";
import { UsageError } from "../lib/errors.ts";

// An install's lib/waffle with one build of three files, its Deno, kit and runner cache.
async function fakeInstall(): Promise<{ lib: string; build: string } & AsyncDisposable> {
  const lib = await Deno.makeTempDir({ prefix: "waffle-lib-" });
  const temp = `${lib}/build.tmp`;
  await Deno.mkdir(temp);
  await Deno.writeTextFile(
    `${temp}/waffle.js`,
    'await import(new URL("./a.js", import.meta.url).href);\n',
  );
  await Deno.writeTextFile(`${temp}/a.js`, "export const a = 1;\n");
  await Deno.writeTextFile(`${temp}/heartbeat_worker.js`, "self.onmessage = () => {};\n");
  const build = `${lib}/${buildDirName(writeSums(temp))}`;
  await Deno.rename(temp, build);
  writeBuildStamp(build);
  await Deno.writeTextFile(`${lib}/artefact`, `${build.slice(lib.length + 1)}\n`);
  await Deno.writeTextFile(`${lib}/deno`, "");
  await Deno.mkdir(`${lib}/runtime`);
  await Deno.writeTextFile(`${lib}/runtime/ld.so`, "");
  await Deno.mkdir(`${lib}/runner-cache`);
  return {
    lib,
    build,
    [Symbol.asyncDispose]: () => Deno.remove(lib, { recursive: true }),
  };
}

Deno.test("buildDigest() is the SHA-256 of SHA256SUMS, which names every file", async () => {
  await using install = await fakeInstall();
  const sums = await Deno.readTextFile(`${install.build}/SHA256SUMS`);
  assert.deepEqual(sums.trim().split("\n").map((line) => line.split("  ")[1]), [
    "a.js",
    "heartbeat_worker.js",
    "waffle.js",
  ]);
  assert.equal(buildDigest(install.build), sha256Hex(sums));
  assert.equal(install.build.endsWith(`/waffle-${sha256Hex(sums).slice(0, 12)}`), true);
  assert.equal(artefactDigest(`${install.build}/waffle.js`), sha256Hex(sums));
});

Deno.test("buildDigest() changes with any chunk, not with a touch", async () => {
  await using install = await fakeInstall();
  const digest = buildDigest(install.build);
  const chunk = `${install.build}/a.js`;
  const original = await Deno.readTextFile(chunk);
  await Deno.writeTextFile(chunk, "export const a = 22;\n"); // another size: seen whatever the mtime
  const edited = buildDigest(install.build);
  assert.notEqual(edited, digest);
  // The same bytes again (another mtime): hashed again, the same digest.
  await Deno.writeTextFile(chunk, original);
  await Deno.utime(chunk, new Date(), new Date(Date.now() + 5000));
  assert.equal(buildDigest(install.build), digest);
  // A file added beside the chunks is covered too.
  await Deno.writeTextFile(`${install.build}/b.js`, "export {};\n");
  assert.notEqual(buildDigest(install.build), digest);
});

Deno.test("writeBuildStamp() refuses a build whose files differ from its SHA256SUMS", async () => {
  await using install = await fakeInstall();
  await Deno.writeTextFile(`${install.build}/a.js`, "export const a = 3;\n");
  assert.throws(
    () => writeBuildStamp(install.build),
    (error: unknown) =>
      error instanceof UsageError && /does not match its SHA256SUMS/.test(error.message),
  );
});

Deno.test("artefactCommand() takes an install's waffle.js as its current build, with the install's Deno", async () => {
  await using install = await fakeInstall();
  const entry = `${install.build}/waffle.js`;
  for (const named of [`${install.lib}/waffle.js`, entry]) {
    const self = artefactCommand(named);
    assert.equal(self.artefact, entry);
    assert.equal(self.executable, `${install.lib}/deno`);
    assert.equal(self.prefix.at(-1), entry);
    assert.equal(runtimeKitOf(self), `${install.lib}/runtime`);
  }
  assert.equal(installDirOf(entry), install.lib);
  assert.equal(runnerCacheOf(entry), `${install.lib}/runner-cache`);
  // No current build named: the install's name is not installed.
  await Deno.remove(`${install.lib}/artefact`);
  assert.throws(() => artefactCommand(`${install.lib}/waffle.js`), UsageError);
});
