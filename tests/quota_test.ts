/**
 * Per-sandbox disk quota on real loop devices and real files. Tests that
 * need root and loop devices are registered ignored, with the reason in
 * their name, where the host cannot run them; with
 * `WAFFLE_REQUIRE_DOCKER=1` (CI) they fail instead.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  DEFAULT_QUOTA_BYTES,
  ensureVolume,
  quotaSupport,
  removeVolume,
} from "../lib/lifecycle/quota.ts";
import { text, waitFor } from "./_helpers.ts";

const MIB = 1024 ** 2;
const SIZE = 64 * MIB;
/** The container's uid (`SANDBOX_UID`), spelled out so this file does not load the container posture. */
const SANDBOX_UID = 10001;
const support = quotaSupport();

/** Registers a test that needs root and loop devices (see the module doc). */
function quotaTest(name: string, fn: () => Promise<void>): void {
  if (support.supported) {
    Deno.test({ name, fn });
  } else if (Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1") {
    Deno.test({
      name,
      fn: () => {
        throw new Error(`Quotas are required (WAFFLE_REQUIRE_DOCKER=1): ${support.reason}`);
      },
    });
  } else {
    Deno.test({ name: `${name} [ignored: ${support.reason}]`, ignore: true, fn: () => {} });
  }
}

/** Runs a program; never throws on a non-zero exit. */
async function sh(
  program: string,
  args: string[],
): Promise<{ code: number; stdout: string; stderr: string }> {
  const command = new Deno.Command(program, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  });
  const out = await command.output();
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

/** `findmnt` on exactly this mount point: undefined when nothing is mounted there. */
async function mountAt(path: string): Promise<{ source: string; options: string } | undefined> {
  const out = await sh("findmnt", ["-n", "-o", "SOURCE,OPTIONS", "--mountpoint", path]);
  const [source, options] = out.stdout.trim().split(/\s+/);
  return out.code === 0 && source && options ? { source, options } : undefined;
}

/** Loop devices attached to the image, per `losetup -j`. */
async function loopsOf(image: string): Promise<string[]> {
  const out = await sh("losetup", ["-j", image]);
  return out.stdout.split("\n").filter((line) => line !== "").map((line) => line.split(":")[0]!);
}

/** One column of `df -B1` for the filesystem holding `path`. */
async function df(path: string, column: "avail" | "size"): Promise<number> {
  const out = await sh("df", ["-B1", `--output=${column}`, path]);
  return Number(out.stdout.trim().split("\n")[1]);
}

/** Filesystem UUID from the superblock: a reformat would change it. */
async function uuidOf(image: string): Promise<string> {
  const out = await sh("dumpe2fs", ["-h", image]);
  return /^Filesystem UUID:\s+(\S+)/m.exec(out.stdout)?.[1] ?? "";
}

/** A sandbox state root in a temp dir; disposing leaves no mount, loop device or file. */
interface TempRoot {
  root: string;
  mountPoint: string;
  image: string;
  [Symbol.asyncDispose](): Promise<void>;
}

async function tempRoot(options: { dir?: string } = {}): Promise<TempRoot> {
  const root = await Deno.realPath(
    await Deno.makeTempDir({ prefix: "waffle-quota-", ...options }),
  );
  const image = join(root, "volume.img");
  return {
    root,
    mountPoint: join(root, "volume"),
    image,
    async [Symbol.asyncDispose](): Promise<void> {
      await removeVolume(root).catch(() => {});
      // Whatever removeVolume missed (or a failed test left): never leak a mount.
      const mounts = (await Deno.readTextFile("/proc/self/mountinfo")).split("\n")
        .map((line) => line.split(" ")[4] ?? "").filter((path) => path.startsWith(`${root}/`));
      for (const path of mounts.reverse()) await sh("umount", ["-l", path]);
      for (const device of await loopsOf(image)) await sh("losetup", ["-d", device]);
      await Deno.remove(root, { recursive: true });
    },
  };
}

/** Simulates a host reboot: the image stays, its mount and loop device go. */
async function reboot(sandbox: TempRoot): Promise<void> {
  assert.equal((await sh("umount", [sandbox.mountPoint])).code, 0);
  for (const device of await loopsOf(sandbox.image)) await sh("losetup", ["-d", device]);
  assert.equal(await mountAt(sandbox.mountPoint), undefined);
  assert.deepEqual(await loopsOf(sandbox.image), []);
}

/** Runs a shell command as the sandbox uid, the way commands run in the container. */
function asSandboxUser(script: string): ReturnType<typeof sh> {
  const ids = [`--reuid=${SANDBOX_UID}`, `--regid=${SANDBOX_UID}`, "--clear-groups"];
  return sh("setpriv", [...ids, "sh", "-c", script]);
}

Deno.test("DEFAULT_QUOTA_BYTES is 1 GiB", () => {
  assert.equal(DEFAULT_QUOTA_BYTES, 1024 ** 3);
});

Deno.test("ensureVolume() rejects a quota below 16 MiB or not a whole number", async () => {
  for (const bytes of [1000, 16 * MIB - 1, 16 * MIB + 0.5, Number.NaN]) {
    await assert.rejects(() => ensureVolume("/nonexistent", { bytes }), {
      name: "UsageError",
      message: new RegExp(`^Invalid disk quota '${bytes}'`),
    });
  }
});

quotaTest("ensureVolume() creates, formats and mounts a sparse volume nosuid,nodev", async () => {
  await using sandbox = await tempRoot();
  const status = await ensureVolume(sandbox.root, { bytes: SIZE });
  assert.deepEqual(status, { enforced: true, bytes: SIZE, mountPoint: sandbox.mountPoint });
  const mount = await mountAt(sandbox.mountPoint);
  assert(mount !== undefined, "volume is not mounted");
  assert.match(mount.source, /^\/dev\/loop\d+$/);
  for (const option of ["rw", "nosuid", "nodev", "noatime"]) {
    assert(mount.options.split(",").includes(option), `'${option}' missing: ${mount.options}`);
  }
  const image = await Deno.lstat(sandbox.image);
  assert.equal(image.size, SIZE);
  assert.equal(image.mode! & 0o777, 0o600);
  assert(image.blocks! * 512 < 8 * MIB, `image is not sparse: ${image.blocks! * 512} bytes`);
  assert.equal((await Deno.stat(sandbox.mountPoint)).uid, 0);
  // ext4 reports its own size minus metadata (the root reserve counts as size).
  const size = await df(sandbox.mountPoint, "size");
  assert(size > SIZE - 8 * MIB && size <= SIZE, `filesystem size ${size}`);
  // No staging image left behind.
  const names = [];
  for await (const entry of Deno.readDir(sandbox.root)) names.push(entry.name);
  assert.deepEqual(names.sort(), ["volume", "volume.img"]);

  await Deno.writeTextFile(join(sandbox.mountPoint, "kept"), "data");
  assert.deepEqual(await ensureVolume(sandbox.root, { bytes: SIZE }), status);
  assert.deepEqual(await mountAt(sandbox.mountPoint), mount);
  assert.deepEqual(await loopsOf(sandbox.image), [mount.source]);
  assert.equal(await Deno.readTextFile(join(sandbox.mountPoint, "kept")), "data");
});

quotaTest(
  "ensureVolume() attaches its loop device with direct I/O, and it detaches when unmounted",
  async () => {
    await using sandbox = await tempRoot();
    // The host's filesystem must take O_DIRECT for the switch to hold.
    const probe = join(sandbox.root, "probe");
    const direct = await sh("dd", [
      "if=/dev/zero",
      `of=${probe}`,
      "bs=4096",
      "count=1",
      "oflag=direct",
    ]);
    await Deno.remove(probe).catch(() => {});
    await ensureVolume(sandbox.root, { bytes: SIZE });
    const [device] = await loopsOf(sandbox.image);
    assert(device !== undefined, "no loop device");
    const dio = (await Deno.readTextFile(`/sys/block/${device.slice(5)}/loop/dio`)).trim();
    assert.equal(dio, direct.code === 0 ? "1" : "0", `dd oflag=direct: ${direct.stderr}`);
    const autoclear = (await Deno.readTextFile(`/sys/block/${device.slice(5)}/loop/autoclear`))
      .trim();
    assert.equal(autoclear, "1");
    // Autoclear: a plain umount (not removeVolume) leaves no device behind.
    assert.equal((await sh("umount", [sandbox.mountPoint])).code, 0);
    await waitFor(async () => (await loopsOf(sandbox.image)).length === 0, {
      what: "the loop device to detach",
    });
  },
);

quotaTest(
  "ensureVolume() bounds what a command can write: ENOSPC inside, the host loses at most the quota",
  async () => {
    // The "host" is a tmpfs of our own, so other processes writing to the real
    // disk cannot move the figure, and tmpfs charges exactly the pages a file
    // holds (no block-map overhead): the drop may exceed the quota only by
    // rounding, which 64 KiB covers with room.
    const host = await Deno.makeTempDir({ prefix: "waffle-quota-host-" });
    assert.equal(
      (await sh("mount", ["-t", "tmpfs", "-o", "size=256m", "tmpfs", host])).code,
      0,
    );
    try {
      await using sandbox = await tempRoot({ dir: host });
      const before = await df(host, "avail");
      const status = await ensureVolume(sandbox.root, { bytes: SIZE });
      assert(status.enforced);
      // The container reaches the volume through a bind mount; here the uid walks the path.
      await Deno.chmod(host, 0o711);
      await Deno.chmod(sandbox.root, 0o711);
      const fill = join(sandbox.mountPoint, "fill");
      await Deno.mkdir(fill);
      await Deno.chown(fill, SANDBOX_UID, SANDBOX_UID);

      const big = await asSandboxUser(`head -c ${4 * SIZE} /dev/zero > '${fill}/big'`);
      assert(big.code !== 0, "writing 4x the quota succeeded");
      assert.match(big.stderr, /No space left on device/);
      assert.equal((await sh("sync", ["-f", sandbox.mountPoint])).code, 0);
      const drop = before - await df(host, "avail");
      assert(drop <= SIZE + 64 * 1024, `host lost ${drop} bytes for a ${SIZE}-byte quota`);
      // Half of a volume this small is reserved for uid 0 (the runner).
      assert(drop > SIZE / 2 - 8 * MIB, `host lost only ${drop} bytes: was the volume filled?`);
      // The runner (uid 0 inside) still has room to record results.
      await Deno.writeFile(join(sandbox.mountPoint, "result"), new Uint8Array(4 * MIB));
      const full = before - await df(host, "avail");
      assert(full <= SIZE + 64 * 1024, `host lost ${full} bytes for a ${SIZE}-byte quota`);

      const small = await asSandboxUser(
        `rm '${fill}/big' && echo ok > '${fill}/small' && cat '${fill}/small'`,
      );
      assert.equal(small.stdout.trim(), "ok", small.stderr);
      // `discard`: the deleted blocks are punched out of the image again.
      assert.equal((await sh("sync", ["-f", sandbox.mountPoint])).code, 0);
      await waitFor(async () => before - await df(host, "avail") < 16 * MIB, {
        what: "the host to get the deleted file's space back",
      });
    } finally {
      await sh("umount", ["-l", host]);
      await Deno.remove(host, { recursive: true });
    }
  },
);

quotaTest(
  "ensureVolume() mounts an existing image again after a reboot, never reformatting it",
  async () => {
    await using sandbox = await tempRoot();
    await ensureVolume(sandbox.root, { bytes: SIZE });
    await Deno.writeTextFile(join(sandbox.mountPoint, "kept"), "data");
    const uuid = await uuidOf(sandbox.image);
    assert(uuid !== "");
    await reboot(sandbox);

    const status = await ensureVolume(sandbox.root, { bytes: SIZE });
    assert.deepEqual(status, { enforced: true, bytes: SIZE, mountPoint: sandbox.mountPoint });
    assert(await mountAt(sandbox.mountPoint) !== undefined, "not mounted again");
    assert.equal(await Deno.readTextFile(join(sandbox.mountPoint, "kept")), "data");
    assert.equal(await uuidOf(sandbox.image), uuid);
  },
);

quotaTest(
  "ensureVolume() mounts a volume still live elsewhere again without checking it",
  async () => {
    await using sandbox = await tempRoot();
    await ensureVolume(sandbox.root, { bytes: SIZE });
    await Deno.writeTextFile(join(sandbox.mountPoint, "kept"), "data");
    const device = (await mountAt(sandbox.mountPoint))?.source;
    // A container's bind mount keeps the filesystem alive after the host's mount goes.
    const container = join(sandbox.root, "container");
    await Deno.mkdir(container);
    assert.equal((await sh("mount", ["--bind", sandbox.mountPoint, container])).code, 0);
    assert.equal((await sh("umount", [sandbox.mountPoint])).code, 0);

    const status = await ensureVolume(sandbox.root, { bytes: SIZE });
    assert.deepEqual(status, { enforced: true, bytes: SIZE, mountPoint: sandbox.mountPoint });
    assert.equal((await mountAt(sandbox.mountPoint))?.source, device);
    assert.deepEqual(await loopsOf(sandbox.image), [device]);
    assert.equal(await Deno.readTextFile(join(sandbox.mountPoint, "kept")), "data");
    await removeVolume(sandbox.root);
    assert.equal(await mountAt(container), undefined);
    assert.deepEqual(await loopsOf(sandbox.image), []);
  },
);

quotaTest(
  "ensureVolume() refuses a symlink, a foreign directory or a foreign image and mounts nothing",
  async () => {
    await using sandbox = await tempRoot();
    await using elsewhere = await tempRoot();
    await Deno.symlink(elsewhere.root, sandbox.mountPoint);
    await assert.rejects(() => ensureVolume(sandbox.root, { bytes: SIZE }), {
      name: "QueueError",
      message: `Refusing volume path '${sandbox.mountPoint}': it is a symlink`,
    });
    assert.equal(await mountAt(elsewhere.root), undefined);
    assert.equal(await mountAt(sandbox.mountPoint), undefined);
    await assert.rejects(() => Deno.lstat(sandbox.image), Deno.errors.NotFound);

    // A mount point the sandbox uid could have prepared.
    await Deno.remove(sandbox.mountPoint);
    await Deno.mkdir(sandbox.mountPoint);
    await Deno.chown(sandbox.mountPoint, SANDBOX_UID, SANDBOX_UID);
    await assert.rejects(() => ensureVolume(sandbox.root, { bytes: SIZE }), {
      name: "QueueError",
      message: `Refusing volume path '${sandbox.mountPoint}': it is not owned by root`,
    });
    assert.equal(await mountAt(sandbox.mountPoint), undefined);

    // An image pointing at a host file: losetup would follow it.
    await Deno.chown(sandbox.mountPoint, 0, 0);
    const target = join(elsewhere.root, "precious");
    await Deno.writeTextFile(target, "host data");
    await Deno.symlink(target, sandbox.image);
    await assert.rejects(() => ensureVolume(sandbox.root, { bytes: SIZE }), {
      name: "QueueError",
      message: `Refusing volume path '${sandbox.image}': it is a symlink`,
    });
    assert.equal(await mountAt(sandbox.mountPoint), undefined);
    assert.deepEqual(await loopsOf(target), []);
    assert.equal(await Deno.readTextFile(target), "host data");
  },
);

quotaTest("ensureVolume() does not mount over data written without a quota", async () => {
  await using sandbox = await tempRoot();
  await Deno.mkdir(sandbox.mountPoint);
  await Deno.writeTextFile(join(sandbox.mountPoint, "old"), "data");
  const status = await ensureVolume(sandbox.root, { bytes: SIZE });
  assert.equal(status.enforced, false);
  assert.match(status.reason ?? "", /holds data written without a quota/);
  assert.equal(await mountAt(sandbox.mountPoint), undefined);
  assert.equal(await Deno.readTextFile(join(sandbox.mountPoint, "old")), "data");
});

quotaTest("removeVolume() leaves no mount, no loop device and no image", async () => {
  await using sandbox = await tempRoot();
  await ensureVolume(sandbox.root, { bytes: SIZE });
  await Deno.writeTextFile(join(sandbox.mountPoint, "data"), "x");
  await removeVolume(sandbox.root);
  assert.equal(await mountAt(sandbox.mountPoint), undefined);
  assert.deepEqual(await loopsOf(sandbox.image), []);
  await assert.rejects(() => Deno.lstat(sandbox.image), Deno.errors.NotFound);
  await removeVolume(sandbox.root); // nothing left to do
  await removeVolume(join(sandbox.root, "never-existed"));
});

quotaTest(
  "removeVolume() detaches a busy volume lazily; the loop device goes when it is released",
  async () => {
    await using sandbox = await tempRoot();
    await ensureVolume(sandbox.root, { bytes: SIZE });
    const [device] = await loopsOf(sandbox.image);
    assert(device !== undefined);
    const busy = await Deno.open(join(sandbox.mountPoint, "open"), { write: true, create: true });
    try {
      await removeVolume(sandbox.root);
      assert.equal(await mountAt(sandbox.mountPoint), undefined);
      await assert.rejects(() => Deno.lstat(sandbox.image), Deno.errors.NotFound);
    } finally {
      busy.close();
    }
    // autoclear (set by `mount -o loop`, or by `losetup -d` on a busy device).
    await waitFor(async () => (await sh("losetup", [device])).code !== 0, {
      what: `'${device}' to be detached`,
    });
  },
);

quotaTest(
  "ensureVolume() grows the filesystem when the quota grows and never shrinks it",
  async () => {
    await using sandbox = await tempRoot();
    await ensureVolume(sandbox.root, { bytes: SIZE });
    await Deno.writeTextFile(join(sandbox.mountPoint, "kept"), "data");

    let status = await ensureVolume(sandbox.root, { bytes: 2 * SIZE });
    assert.equal((await Deno.stat(sandbox.image)).size, 2 * SIZE);
    if (status.bytes !== 2 * SIZE) {
      // Online resizing needs CAP_SYS_RESOURCE; without it the next mount grows the volume.
      assert.equal(status.bytes, SIZE);
      assert.match(status.reason ?? "", /grows to 134217728 bytes when next mounted/);
      await reboot(sandbox);
      status = await ensureVolume(sandbox.root, { bytes: 2 * SIZE });
    }
    assert.deepEqual(status, { enforced: true, bytes: 2 * SIZE, mountPoint: sandbox.mountPoint });
    const size = await df(sandbox.mountPoint, "size");
    assert(size > 2 * SIZE - 8 * MIB && size <= 2 * SIZE, `filesystem size ${size}`);
    assert.equal(await Deno.readTextFile(join(sandbox.mountPoint, "kept")), "data");

    const smaller = await ensureVolume(sandbox.root, { bytes: SIZE });
    assert.equal(smaller.bytes, 2 * SIZE);
    assert.match(smaller.reason ?? "", /keeps its 134217728 bytes: volumes never shrink/);
    assert.equal((await Deno.stat(sandbox.image)).size, 2 * SIZE);
    assert.equal(await df(sandbox.mountPoint, "size"), size);
  },
);

quotaTest("ensureVolume() falls back to a plain directory when not root", async () => {
  await using sandbox = await tempRoot();
  await Deno.chown(sandbox.root, SANDBOX_UID, SANDBOX_UID);
  const home = join(sandbox.root, "home");
  await Deno.mkdir(home);
  await Deno.chown(home, SANDBOX_UID, SANDBOX_UID);
  const module = new URL("../lib/lifecycle/quota.ts", import.meta.url).href;
  const script = `import { ensureVolume, quotaSupport } from "${module}";
console.log(JSON.stringify([quotaSupport(), await ensureVolume(Deno.args[0], { bytes: ${SIZE} })]));`;
  const out = await sh("setpriv", [
    `--reuid=${SANDBOX_UID}`,
    `--regid=${SANDBOX_UID}`,
    "--clear-groups",
    "env",
    `HOME=${home}`,
    `DENO_DIR=${home}/deno`,
    Deno.execPath(),
    "eval",
    "--no-config",
    script,
    sandbox.root,
  ]);
  assert.equal(out.code, 0, out.stderr);
  const reason = `Loop mounts need root: running as uid '${SANDBOX_UID}'`;
  assert.deepEqual(JSON.parse(out.stdout), [
    { supported: false, reason },
    { enforced: false, bytes: SIZE, mountPoint: sandbox.mountPoint, reason },
  ]);
  const volume = await Deno.lstat(sandbox.mountPoint);
  assert(volume.isDirectory);
  assert.equal(volume.uid, SANDBOX_UID);
  assert.equal(await mountAt(sandbox.mountPoint), undefined);
});
