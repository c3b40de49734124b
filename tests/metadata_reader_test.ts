/**
 * The two in-sandbox readers of E2B file metadata held to one answer, from
 * inside a real container of the `base` image: the runtime kit's static
 * reader (`image/metadata_helper.c`, what `readMetadata` uses when the kit
 * has it) and its fallback `waffle files metadata` (a Deno start, for a kit
 * built without a static C compiler). Hostile files are planted by a command
 * (the commands' uid): a key that is not UTF-8, control bytes and markup, a
 * value at the limit, over it, 1000 keys on /tmp, a symbolic link whose
 * target has metadata, a file in a directory the commands' uid cannot
 * search, a file only other uids can read. Both readers' raw answers must be the same bytes, and the host's
 * reading of them (`readMetadata`) the same values or the same errors.
 * Registered ignored with the reason when Docker or the image is missing;
 * with `WAFFLE_REQUIRE_DOCKER=1` it fails instead.
 *
 * @module
 */
import assert from "node:assert/strict";
import { readMetadata } from "../lib/files/mod.ts";
import { METADATA_BYTES, METADATA_KEYS, METADATA_PREFIX } from "../lib/files/metadata.ts";
import { sandboxMetadataReader, sandboxWaffleCommand } from "../lib/lifecycle/posture.ts";
import { BASE, baseTest } from "./_serve_helpers.ts";
import { run, runOk, tempHome, uniqueUser } from "./_sandbox_helpers.ts";

// Run as the commands' uid (10001); /tmp is the sandbox's tmpfs, which keeps
// more than a block of attributes.
const PLANT = String.raw`
import os
os.makedirs('/workspace/m', exist_ok=True)
def touch(path):
    open(path, 'w').close()
    return path
odd = touch('/workspace/m/odd.txt')
os.setxattr(odd, b'user.e2b.k\xff\x1b', b'\xff\xfe\x1b[31m\\<script>')
os.setxattr(odd, 'user.e2b.plain', b'ok')
os.setxattr(odd, 'user.other', b'not envd')
os.setxattr('/workspace/m', 'user.e2b.dir', b'd')
touch('/workspace/m/none.txt')
# Keys (with the prefix) and values of exactly 4096 bytes, then one more.
os.setxattr(touch('/tmp/at.txt'), 'user.e2b.edge', b'v' * (4096 - 9 - 4))
os.setxattr(touch('/tmp/over.txt'), 'user.e2b.edge', b'v' * (4096 - 9 - 4 + 1))
os.setxattr(touch('/tmp/huge.txt'), 'user.e2b.big', b'v' * 60000)
many = touch('/tmp/many.txt')
for i in range(1000):
    os.setxattr(many, 'user.e2b.k%d' % i, b'')
os.setxattr(touch('/tmp/target.txt'), 'user.e2b.secret', b'target')
os.symlink('/tmp/target.txt', '/tmp/link')
os.makedirs('/tmp/locked')
os.setxattr(touch('/tmp/locked/f.txt'), 'user.e2b.hidden', b'x')
os.chmod('/tmp/locked', 0)
# Readable by others but not by its owner, the commands' uid: only another
# uid (the runner's root, the host) could read its attributes.
mine = touch('/tmp/unreadable.txt')
os.setxattr(mine, 'user.e2b.hidden', b'x')
os.chmod(mine, 0o004)
`;

const PATHS = [
  "/workspace/m/odd.txt",
  "/workspace/m",
  "/workspace/m/none.txt",
  "/tmp/at.txt",
  "/tmp/over.txt",
  "/tmp/huge.txt",
  "/tmp/many.txt",
  "/tmp/target.txt",
  "/tmp/link",
  "/tmp/locked/f.txt",
  "/tmp/unreadable.txt",
  "/workspace/m/missing",
  "",
];

/** Each path's metadata as the host reads it, or the error's message. */
async function hostReading(
  sandbox: Parameters<typeof readMetadata>[0],
  via: "kit" | "waffle",
): Promise<(Record<string, string> | string)[]> {
  const readings: (Record<string, string> | string)[] = [];
  for (const path of PATHS) {
    try {
      readings.push((await readMetadata(sandbox, [path], { via }))[0]!);
    } catch (error) {
      readings.push(error instanceof Error ? error.message : String(error));
    }
  }
  return readings;
}

baseTest(
  "metadata readers: the kit's static reader and `waffle files metadata` give the same answer for hostile files",
  async (docker) => {
    await using home = await tempHome(docker, { image: BASE });
    const sandbox = home.open(uniqueUser("meta-readers"));
    const reader = sandboxMetadataReader(sandbox.config);
    assert.equal(reader, "/opt/waffle/rt/metadata", "the runtime kit has the static reader");
    const planted = await run(sandbox, { argv: ["python3", "-c", PLANT] });
    assert.equal(planted.result.exitCode, 0, planted.stderr);

    // The raw answers: the same bytes, for the same NUL-ended paths on stdin.
    const stdin = new TextEncoder().encode(PATHS.map((path) => `${path}\0`).join(""));
    const kit = await run(sandbox, {
      argv: [reader!, METADATA_PREFIX, String(METADATA_BYTES), String(METADATA_KEYS)],
      stdin,
    });
    const waffle = await run(sandbox, {
      ...sandboxWaffleCommand(sandbox.config, ["files", "metadata", "-"]),
      stdin,
    });
    assert.equal(kit.result.exitCode, 0, kit.stderr);
    assert.equal(waffle.result.exitCode, 0, waffle.stderr);
    assert.equal(kit.stdout, waffle.stdout);
    const raw = JSON.parse(kit.stdout);
    assert.deepEqual(Object.keys(raw), ["0", "1", "3", "4", "5", "6", "7"]);
    assert.equal(raw["4"], 4097, "a value one byte over: the bytes seen");
    assert.equal(
      raw["5"],
      4097,
      "a value past the read buffer: the bytes before it, plus the buffer",
    );

    // The host's reading of either: the same values, the same errors.
    const viaKit = await hostReading(sandbox, "kit");
    assert.deepEqual(await hostReading(sandbox, "waffle"), viaKit);
    assert.deepEqual(viaKit[0], { "k\\xff\\x1b": "\\xff\\xfe\\x1b[31m\\x5c<script>", plain: "ok" });
    assert.deepEqual(viaKit[1], { dir: "d" });
    assert.deepEqual(viaKit[2], {});
    assert.deepEqual(viaKit[3], { edge: "v".repeat(4096 - 9 - 4) });
    for (const at of [4, 5, 6]) {
      assert.match(
        String(viaKit[at]),
        new RegExp(`^The metadata of '${PATHS[at]}' .* is over 4096 bytes$`),
      );
    }
    assert.deepEqual(viaKit[7], { secret: "target" });
    assert.deepEqual(viaKit[8], {}, "a link reports none of its target's");
    assert.deepEqual(viaKit[9], {}, "read as the commands' uid, which cannot search /tmp/locked");
    assert.deepEqual(viaKit[10], {}, "read as the commands' uid, not the runner's root");
    assert.deepEqual(viaKit.slice(11), [{}, {}]);

    // Several paths in one call keep their order; the sandbox is unharmed.
    const three = await readMetadata(sandbox, ["/tmp/link", "/tmp/target.txt", "/workspace/m"]);
    assert.deepEqual(three, [{}, { secret: "target" }, { dir: "d" }]);
    assert.equal(await runOk(sandbox, "echo alive"), "alive\n");
  },
);
