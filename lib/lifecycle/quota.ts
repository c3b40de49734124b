/**
 * Per-sandbox disk quota. Everything a sandbox can write lives on its own
 * ext4 filesystem: a sparse image `<root>/volume.img` loop-mounted at
 * `<root>/volume`. A command that fills it gets ENOSPC inside the sandbox and
 * the host loses at most the image's size, however hostile the command.
 *
 * Why a loop image and not project quotas: it needs nothing from the host's
 * filesystem (no `prjquota` mount option, works on any host filesystem that
 * has sparse files), and `rm --purge` is one unmount and one unlink.
 *
 * Callers must hold the sandbox's lifecycle lock (`withLock`): two
 * concurrent calls for one root could otherwise mount the image twice.
 *
 * Needs `--allow-run`, `--allow-read`, `--allow-write` and `--allow-sys`
 * (for `Deno.uid()`), and root to enforce anything.
 *
 * @module
 */
import { settleRemovals } from "./remove_tree.ts";
import { basename, join } from "../path.ts";
import { QueueError, UsageError } from "../errors.ts";
import { messageOf } from "../queue/connection.ts";
import { exists } from "../fs.ts";
import { errno, libc, O_CLOEXEC, O_NOFOLLOW, O_RDONLY, O_RDWR } from "../libc.ts";

/** Quota of a sandbox's writable volume when the config names none: 1 GiB. */
export const DEFAULT_QUOTA_BYTES = 1024 ** 3;

const BLOCK_BYTES = 4096;

/** Room for ext4's metadata and its smallest journal (4 MiB) with space left to use. */
const MIN_QUOTA_BYTES = 16 * 1024 ** 2;

/**
 * `nosuid,nodev`: a setuid binary or device node the sandbox writes must
 * mean nothing on the host. `discard`: deleting files punches holes in the
 * sparse image, so the host gets the space back instead of keeping each
 * volume's high-water mark. `exec` stays: /workspace is where builds run.
 */
const MOUNT_OPTIONS = "nosuid,nodev,noatime,discard";

/**
 * A 4 MiB journal (the smallest) keeps the workspace consistent across a host
 * crash for ~4 MiB of the quota; the default would take 32 MiB of a 1 GiB
 * volume. 4 KiB blocks and one inode per 16 KiB also for small volumes, where
 * mke2fs would otherwise pick 1 KiB blocks.
 */
const MKFS_ARGS = ["-q", "-F", "-b", `${BLOCK_BYTES}`, "-i", "16384", "-J", "size=4"];

/**
 * Blocks reserved for uid 0: the runner (the container's root) keeps room to
 * record results after a command (uid 10001) filled the volume. 32 MiB, at
 * most half of a small volume.
 */
const ROOT_RESERVE_BYTES = 32 * 1024 ** 2;

function reservePercent(bytes: number): string {
  return Math.min(50, (ROOT_RESERVE_BYTES * 100) / bytes).toFixed(3);
}

/** What {@linkcode ensureVolume} found or made. */
export interface VolumeStatus {
  /** True when `mountPoint` is a mounted volume whose size bounds what the sandbox can write. */
  enforced: boolean;
  /**
   * The filesystem's size in bytes: above the configured quota when that
   * shrank (volumes never shrink), below it while a grow waits for the next
   * mount (`reason` says which); the quota itself when not enforced.
   */
  bytes: number;
  /** `<root>/volume` with `root` resolved: the directory to keep the sandbox's writable state in. */
  mountPoint: string;
  /** Why the quota is not enforced, or why `bytes` differs from the configured quota. */
  reason?: string;
}

/**
 * Makes `<root>/volume` a mounted ext4 volume of `bytes` bytes, creating and
 * formatting `<root>/volume.img` only when it does not exist. A mounted
 * volume is left as it is; an unmounted one (after a reboot) is checked with
 * `e2fsck -p` and mounted again; a larger `bytes` grows it (online where the
 * kernel lets us, otherwise at its next mount); a smaller one is ignored
 * (and reported), since shrinking could lose data. Where the
 * host cannot mount loop devices (not root, no loop driver, no e2fsprogs),
 * `<root>/volume` is a plain directory and the status says why.
 *
 * @param root The sandbox's state directory; it must exist.
 * @param options `bytes`: the quota, at least 16 MiB.
 * @returns Whether the quota is enforced, the capacity and the mount point.
 * @throws {UsageError} When `bytes` is not an integer of at least 16 MiB.
 * @throws {QueueError} When `<root>/volume` or the image is a symlink, not
 * root's or of the wrong type, something else is mounted there, or an
 * existing image cannot be checked or mounted.
 *
 * @example
 * ```ts ignore
 * const volume = await ensureVolume("/var/lib/waffle/sandboxes/ab12", { bytes: DEFAULT_QUOTA_BYTES });
 * if (!volume.enforced) console.warn(`No disk quota: ${volume.reason}`);
 * await Deno.mkdir(`${volume.mountPoint}/workspace`, { recursive: true });
 * ```
 */
export async function ensureVolume(
  root: string,
  options: { bytes: number },
): Promise<VolumeStatus> {
  if (!Number.isSafeInteger(options.bytes) || options.bytes < MIN_QUOTA_BYTES) {
    throw new UsageError(
      `Invalid disk quota '${options.bytes}': use a whole number of bytes, at least ${MIN_QUOTA_BYTES}`,
    );
  }
  // Whole 4 KiB blocks, so the image and its filesystem are the same size.
  const bytes = options.bytes - options.bytes % BLOCK_BYTES;
  const { mountPoint, image } = await volumePaths(root);
  const support = quotaSupport();
  if (!support.supported) return await plainVolume(mountPoint, bytes, support.reason);
  await checkOwnedByRoot(mountPoint, "directory");
  let created = false;
  if (!(await checkOwnedByRoot(image, "file"))) {
    // Mounting over files would hide them: they were written without a quota.
    if (!(await isEmpty(mountPoint))) {
      return await plainVolume(
        mountPoint,
        bytes,
        `'${mountPoint}' holds data written without a quota`,
      );
    }
    await createImage(image, bytes);
    created = true;
  }
  // Growing starts with the image; the filesystem follows, offline before a
  // mount or online after it. Never the other way round: shrinking could lose data.
  if (bytes > (await Deno.stat(image)).size) await Deno.truncate(image, bytes);
  let device = await mountedDevice(mountPoint, image);
  if (device === undefined) {
    try {
      device = await mountImage(image, mountPoint, { check: !created });
    } catch (error) {
      if (!created) throw error;
      // A fresh, empty image that the host cannot mount: the host cannot enforce quotas.
      await Deno.remove(image);
      return await plainVolume(mountPoint, bytes, messageOf(error));
    }
  }
  const status: VolumeStatus = { enforced: true, bytes: 0, mountPoint };
  const imageBytes = (await Deno.stat(image)).size;
  if (await filesystemBytes(device) < imageBytes) {
    // The loop device keeps its old size until told. Online resizing needs
    // CAP_SYS_RESOURCE, which some containers' root lacks; the next mount
    // then grows it offline.
    const grown = await run("losetup", ["-c", device]).then((losetup) =>
      losetup.code === 0 ? run("resize2fs", [device]) : losetup
    );
    if (grown.code !== 0) {
      status.reason =
        `Volume '${image}' grows to ${imageBytes} bytes when next mounted: ${grown.output}`;
    }
  }
  status.bytes = await filesystemBytes(device);
  if (bytes < status.bytes) {
    status.reason = `Volume '${image}' keeps its ${status.bytes} bytes: volumes never shrink`;
  }
  return status;
}

/**
 * Unmounts `<root>/volume` (lazily when it is busy), detaches its loop
 * devices and deletes `<root>/volume.img`, for `rm --purge`. Anything else
 * mounted at `<root>/volume` is unmounted too, so removing the root
 * afterwards (`purgeState`, in a child process that stays on one filesystem)
 * never descends into a mount. Missing pieces are fine.
 *
 * @param root The sandbox's state directory.
 * @throws {QueueError} When a mount cannot be detached even lazily, or the image cannot be removed.
 *
 * @example
 * ```ts ignore
 * await removeVolume(paths.root);
 * await purgeState(paths); // never `Deno.remove(…, { recursive: true })`: see remove_tree.ts
 * ```
 */
export async function removeVolume(root: string): Promise<void> {
  let paths: { mountPoint: string; image: string };
  try {
    paths = await volumePaths(root);
  } catch (error) {
    if (error instanceof QueueError && error.cause instanceof Deno.errors.NotFound) return;
    throw error;
  }
  const { mountPoint, image } = paths;
  // A removal this process started inside the volume (a set-aside tree) would
  // keep the mount busy: the unmount would be lazy and the loop device would
  // outlive the purge until it ended. Bounded by each removal's own limit.
  await settleRemovals();
  const mounts = (await readMounts()).filter((mount) =>
    mount.mountPoint === mountPoint || mount.backingFile === image
  );
  // Newest first: a mount stacked on top must go before the one beneath it.
  for (const mount of mounts.reverse()) {
    if ((await run("umount", [mount.mountPoint])).code === 0) continue;
    const lazy = await run("umount", ["-l", mount.mountPoint]);
    if (lazy.code !== 0) {
      throw new QueueError(`Cannot unmount '${mount.mountPoint}': ${lazy.output}`);
    }
  }
  // `mount -o loop` sets autoclear; this catches devices attached any other
  // way. On a device still busy after a lazy unmount, `-d` defers the detach.
  for (const device of await loopDevicesOf(image)) await run("losetup", ["-d", device]);
  await Deno.remove(image).catch((error) => {
    if (error instanceof Deno.errors.NotFound) return;
    throw new QueueError(`Cannot remove volume image '${image}': ${messageOf(error)}`, {
      cause: error,
    });
  });
}

/**
 * Whether this host can enforce a disk quota, for a doctor row. Cheap: it
 * looks at the uid, `/dev/loop-control` and the programs on PATH, and does
 * not try a mount.
 *
 * @returns `supported`, and the reason when it is not.
 *
 * @example
 * ```ts
 * const support = quotaSupport();
 * const row = support.supported ? "disk quota: enforced" : `disk quota: off (${support.reason})`;
 * ```
 */
export function quotaSupport(): { supported: boolean; reason?: string } {
  if (Deno.uid() !== 0) {
    return { supported: false, reason: `Loop mounts need root: running as uid '${Deno.uid()}'` };
  }
  if (!exists("/dev/loop-control")) {
    return { supported: false, reason: "No loop device support: '/dev/loop-control' is missing" };
  }
  for (const program of PROGRAMS) {
    if (which(program) === undefined) {
      return { supported: false, reason: `Program '${program}' is not installed` };
    }
  }
  return { supported: true };
}

const PROGRAMS = ["mkfs.ext4", "e2fsck", "resize2fs", "mount", "umount", "losetup"] as const;
type Program = typeof PROGRAMS[number];

async function volumePaths(root: string): Promise<{ mountPoint: string; image: string }> {
  let real: string;
  try {
    // Resolved once, so the mount point compared with mountinfo is the one mounted on.
    real = await Deno.realPath(root);
  } catch (cause) {
    throw new QueueError(`Cannot resolve sandbox state '${root}': ${messageOf(cause)}`, { cause });
  }
  return { mountPoint: join(real, "volume"), image: join(real, "volume.img") };
}

async function plainVolume(
  mountPoint: string,
  bytes: number,
  reason: string | undefined,
): Promise<VolumeStatus> {
  await Deno.mkdir(mountPoint, { mode: 0o755 }).catch((error) => {
    if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
  });
  const info = await Deno.lstat(mountPoint);
  if (!info.isDirectory) throw new QueueError(`Volume '${mountPoint}' is not a directory`);
  return { enforced: false, bytes, mountPoint, reason: reason ?? "Quotas are not supported" };
}

/**
 * Checks that `path` is root's and of the expected type without following a
 * symlink: mount(2) would follow one planted at the mount point, and losetup
 * one planted at the image. A missing mount point is created.
 *
 * @returns False when the (image) file does not exist.
 */
async function checkOwnedByRoot(path: string, kind: "directory" | "file"): Promise<boolean> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.lstat(path);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
    if (kind === "file") return false;
    await Deno.mkdir(path, { mode: 0o755 });
    info = await Deno.lstat(path);
  }
  const isKind = kind === "directory" ? info.isDirectory : info.isFile;
  if (info.isSymlink || !isKind || info.uid !== 0) {
    const what = info.isSymlink ? "a symlink" : !isKind ? `not a ${kind}` : "not owned by root";
    throw new QueueError(`Refusing volume path '${path}': it is ${what}`);
  }
  return true;
}

/**
 * Creates and formats under a temporary name, then links (not renames) it
 * into place: a crash never leaves a half-made image under the final name,
 * and an image that appeared meanwhile is never replaced.
 */
async function createImage(image: string, bytes: number): Promise<void> {
  const staging = `${image}.staging-${crypto.randomUUID().slice(0, 8)}`;
  try {
    const file = await Deno.open(staging, { write: true, createNew: true, mode: 0o600 });
    try {
      await file.truncate(bytes); // sparse: the host pays only for blocks written
    } finally {
      file.close();
    }
    await runOrThrow("mkfs.ext4", [
      ...MKFS_ARGS,
      "-m",
      reservePercent(bytes),
      "-E",
      "root_owner=0:0",
      staging,
    ]);
    await Deno.link(staging, image);
  } catch (cause) {
    if (cause instanceof QueueError) throw cause;
    throw new QueueError(`Cannot create volume image '${image}': ${messageOf(cause)}`, { cause });
  } finally {
    await Deno.remove(staging).catch(() => {});
  }
}

async function mountImage(
  image: string,
  mountPoint: string,
  options: { check: boolean },
): Promise<string> {
  // Still attached means live elsewhere (a container's bind mount outlived the
  // host's mount, or a lazy unmount is draining): never check or resize it
  // offline, and mount that device. A fresh image (`check` false) is attached
  // nowhere and has its full size: nothing to look at.
  const [live] = options.check ? await loopDevicesOf(image) : [];
  if (options.check && live === undefined) {
    const grow = await filesystemBytes(image) < (await Deno.stat(image)).size;
    // After a crash or reboot; resize2fs insists on a full check (-f) first.
    await fsck(image, { full: grow });
    if (grow) await runOrThrow("resize2fs", [image]);
  }
  // Mount ids only: resolving every loop mount's backing file costs two
  // sysfs reads each, and a host has one loop mount per sandbox.
  const before = new Set((await readMounts({ resolveLoops: false })).map((m) => m.id));
  if (live !== undefined) {
    await runOrThrow("mount", ["-o", MOUNT_OPTIONS, live, mountPoint]);
  } else {
    using loop = attachLoop(image);
    if (loop === undefined) {
      // No LOOP_CONFIGURE (a kernel before 5.8): mount attaches it, then the switch.
      await runOrThrow("mount", ["-o", `loop,${MOUNT_OPTIONS}`, image, mountPoint]);
      const device = await mountedDevice(mountPoint, image);
      if (device !== undefined) directIo(device);
    } else {
      await runOrThrow("mount", ["-o", MOUNT_OPTIONS, loop.device, mountPoint]);
    }
  }
  const device = await mountedDevice(mountPoint, image);
  if (device !== undefined) return device;
  // The mount point was swapped for a symlink after the check: undo wherever it landed.
  for (const mount of await readMounts()) {
    if (mount.backingFile === image && !before.has(mount.id)) {
      await run("umount", ["-l", mount.mountPoint]);
    }
  }
  throw new QueueError(`Volume image '${image}' did not mount at '${mountPoint}'`);
}

/** `ioctl(2)` requests on loop devices (linux/loop.h). */
const LOOP_SET_DIRECT_IO = 0x4c08n;
const LOOP_CONFIGURE = 0x4c0an;
const LOOP_CTL_GET_FREE = 0x4c82n;
/** `lo_flags`: detach when the last user (the mount) lets go; write with O_DIRECT. */
const LO_FLAGS_AUTOCLEAR = 4;
const LO_FLAGS_DIRECT_IO = 16;
/** `struct loop_config`: fd, block_size, `struct loop_info64` (232 bytes), 8 reserved u64. */
const LOOP_CONFIG_BYTES = 304;
/** `loop_config.info.lo_flags`. */
const LOOP_CONFIG_FLAGS_AT = 8 + 52;
const EBUSY = 16;

/**
 * Attaches `image` to a free loop device that detaches itself when its last
 * user lets go, writing with O_DIRECT from the start: buffered, each byte a
 * sandbox writes is cached twice on the host, and a flush of the volume
 * (every fsync in it, the runner's result commit among them) is an fsync of
 * the whole image file: after a 1 GiB write the next result waited seconds
 * for all of it. Asked for at attach time the direct I/O costs nothing; set
 * on a live device it freezes the device's queue for 15-25 ms.
 *
 * The device stays held until the result is disposed, so it is not detached
 * before `mount` holds it. The image is opened without following a symlink.
 *
 * @returns The held device, or undefined when this kernel or host cannot
 *   (no FFI, no LOOP_CONFIGURE): the caller attaches it with `mount -o loop`.
 */
function attachLoop(image: string): { device: string; [Symbol.dispose](): void } | undefined {
  const lib = libc();
  if (lib === undefined) return undefined;
  const cString = (path: string): Uint8Array => new TextEncoder().encode(`${path}\0`);
  const backing = lib.open(cString(image), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (backing < 0) return undefined;
  try {
    const control = lib.open(cString("/dev/loop-control"), O_RDWR | O_CLOEXEC, 0);
    if (control < 0) return undefined;
    try {
      // Another attach may take the free device first: ask again (bounded).
      for (let attempt = 0; attempt < 8; attempt++) {
        const number = lib.ioctlInt(control, LOOP_CTL_GET_FREE, 0n);
        if (number < 0) return undefined;
        const device = `/dev/loop${number}`;
        const fd = lib.open(cString(device), O_RDWR | O_CLOEXEC, 0);
        if (fd < 0) return undefined;
        const config = new Uint8Array(LOOP_CONFIG_BYTES);
        const view = new DataView(config.buffer);
        view.setUint32(0, backing, true);
        view.setUint32(LOOP_CONFIG_FLAGS_AT, LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO, true);
        if (lib.ioctl(fd, LOOP_CONFIGURE, config) === 0) {
          return { device, [Symbol.dispose]: () => void lib.close(fd) };
        }
        const code = errno(lib);
        lib.close(fd);
        if (code !== EBUSY) return undefined;
      }
      return undefined;
    } finally {
      lib.close(control);
    }
  } finally {
    // The device holds its own reference to the image.
    lib.close(backing);
  }
}

/**
 * Switches a live loop device to O_DIRECT (see {@linkcode attachLoop}), for
 * a kernel without LOOP_CONFIGURE. Best effort: a host filesystem without
 * O_DIRECT, or of another sector size, keeps the device buffered.
 */
function directIo(device: string): void {
  const lib = libc();
  if (lib === undefined) return;
  const fd = lib.open(new TextEncoder().encode(`${device}\0`), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return;
  lib.ioctlInt(fd, LOOP_SET_DIRECT_IO, 1n);
  lib.close(fd);
}

async function fsck(image: string, options: { full: boolean }): Promise<void> {
  // 1 and 2 mean errors were fixed; 4 and up need a human.
  const result = await run("e2fsck", [...(options.full ? ["-f"] : []), "-p", image]);
  if (result.code >= 4) {
    throw new QueueError(`Volume image '${image}' needs a manual fsck: ${result.output}`);
  }
}

/**
 * The loop device of the image when it is the visible mount at `mountPoint`.
 *
 * @throws {QueueError} When something else is mounted there.
 */
async function mountedDevice(mountPoint: string, image: string): Promise<string | undefined> {
  const top = (await readMounts({ mountPoint })).at(-1);
  if (top === undefined) return undefined;
  if (top.backingFile !== image || top.loopDevice === undefined) {
    throw new QueueError(`Volume '${mountPoint}' has '${top.source}' mounted on it`);
  }
  return top.loopDevice;
}

interface Mount {
  /** The mount's id in this namespace (mountinfo's first field), never reused while it is mounted. */
  id: string;
  mountPoint: string;
  source: string;
  /** `/dev/loopN` when the mount is on a loop device. */
  loopDevice?: string;
  /** The loop device's backing file, as the kernel reports it. */
  backingFile?: string;
}

/**
 * Mounts of this mount namespace, oldest first, with loop devices resolved
 * through sysfs (unless `resolveLoops` is false); with `mountPoint`, only the
 * mounts on it.
 */
async function readMounts(
  options: { mountPoint?: string; resolveLoops?: boolean } = {},
): Promise<Mount[]> {
  const mounts: Mount[] = [];
  for (const line of (await Deno.readTextFile("/proc/self/mountinfo")).split("\n")) {
    // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
    const fields = line.split(" ");
    const dash = fields.indexOf("-");
    const [id, majorMinor, mountPoint, source] = [
      fields[0],
      fields[2],
      fields[4],
      fields[dash + 2],
    ];
    if (dash < 0 || majorMinor === undefined || mountPoint === undefined) continue;
    const mount: Mount = {
      id: id ?? "",
      mountPoint: unescape(mountPoint),
      source: unescape(source ?? ""),
    };
    if (options.mountPoint !== undefined && mount.mountPoint !== options.mountPoint) continue;
    // Only a loop device has a backing file: the others cost no sysfs reads
    // (a host with many containers has hundreds of mounts, read on every call).
    const loop = options.resolveLoops !== false && mount.source.startsWith("/dev/loop")
      ? await loopOf(`/sys/dev/block/${majorMinor}`)
      : undefined;
    if (loop !== undefined) Object.assign(mount, loop);
    mounts.push(mount);
  }
  return mounts;
}

/** Loop devices (attached, mounted or not) whose backing file is `image`. */
async function loopDevicesOf(image: string): Promise<string[]> {
  const devices: string[] = [];
  for await (const entry of Deno.readDir("/sys/block")) {
    if (!entry.name.startsWith("loop")) continue;
    const loop = await loopOf(`/sys/block/${entry.name}`);
    if (loop?.backingFile === image) devices.push(loop.loopDevice);
  }
  return devices;
}

async function loopOf(
  sysDir: string,
): Promise<{ loopDevice: string; backingFile: string } | undefined> {
  try {
    const backing = (await Deno.readTextFile(`${sysDir}/loop/backing_file`)).trimEnd();
    const name = basename(await Deno.realPath(sysDir));
    return { loopDevice: `/dev/${name}`, backingFile: backing };
  } catch {
    return undefined; // not a loop device, or detached meanwhile
  }
}

/**
 * Size of the ext4 filesystem in an image, or on the loop device of a mounted
 * one: buffered reads of the device share the mounted filesystem's cache, so
 * they see an online resize at once. Reads the superblock instead of running
 * dumpe2fs, which would cost a process per call.
 */
async function filesystemBytes(path: string): Promise<number> {
  const superblock = new Uint8Array(1024);
  const file = await Deno.open(path, { read: true });
  try {
    await file.seek(1024, Deno.SeekMode.Start);
    let read = 0;
    while (read < superblock.length) {
      const n = await file.read(superblock.subarray(read));
      if (n === null) break;
      read += n;
    }
  } finally {
    file.close();
  }
  const view = new DataView(superblock.buffer);
  if (view.getUint16(0x38, true) !== 0xef53) {
    throw new QueueError(`Volume '${path}' does not hold an ext4 filesystem`);
  }
  const is64bit = (view.getUint32(0x60, true) & 0x80) !== 0;
  const blocks = view.getUint32(0x4, true) + (is64bit ? view.getUint32(0x150, true) * 2 ** 32 : 0);
  return blocks * (1024 * 2 ** view.getUint32(0x18, true));
}

/** mountinfo escapes space, tab, newline and backslash as octal. */
function unescape(field: string): string {
  return field.replace(
    /\\([0-7]{3})/g,
    (_, octal: string) => String.fromCharCode(parseInt(octal, 8)),
  );
}

async function runOrThrow(program: Program, args: string[]): Promise<void> {
  const result = await run(program, args);
  if (result.code !== 0) {
    throw new QueueError(`Command '${program} ${args.join(" ")}' failed: ${result.output}`);
  }
}

async function run(program: Program, args: string[]): Promise<{ code: number; output: string }> {
  const path = which(program);
  if (path === undefined) throw new QueueError(`Program '${program}' is not installed`);
  const command = new Deno.Command(path, { args, stdin: "null", stdout: "piped", stderr: "piped" });
  const out = await command.output();
  const decoder = new TextDecoder();
  const output = `${decoder.decode(out.stderr)}\n${decoder.decode(out.stdout)}`
    .split("\n").map((line) => line.trim())
    // e2fsprogs open with a version banner ("resize2fs 1.47.0 (5-Feb-2023)"): noise in a reason.
    .filter((line) => line !== "" && !/^\S+ [\d.]+ \([^)]*\)$/.test(line)).join("; ");
  return { code: out.code, output: output || `exit status ${out.code}` };
}

/** PATH, then the sbin directories a service's minimal PATH often lacks. */
function which(program: Program): string | undefined {
  const dirs = [...(Deno.env.get("PATH") ?? "").split(":"), "/usr/sbin", "/sbin", "/usr/bin"];
  return dirs.filter((dir) => dir.startsWith("/")).map((dir) => join(dir, program)).find(exists);
}

// Local, not the queue's: this module is also loaded alone (by a child
// process of its tests) without the queue's dependencies.

async function isEmpty(dir: string): Promise<boolean> {
  for await (const _ of Deno.readDir(dir)) return false;
  return true;
}
