/**
 * The host-side work of workspace snapshots that touches the sandbox's
 * volume, each step in a time-bound child process or one system call:
 *
 * - {@linkcode copyFrozenImage}: the volume image copied (sparse, and
 *   reflinked where the host's filesystem can) while the volume is frozen
 *   (`fsfreeze`), so nothing a command or a process it left behind writes
 *   can land half-way. Freeze, copy and thaw are one child shell that
 *   ignores HUP, INT and TERM: a host killed in the middle leaves the child
 *   to thaw the volume when its bounded copy ends.
 * - {@linkcode copyWorkspaceOut}: a snapshot's `workspace/` copied out of its
 *   image into a fresh directory. The image is loop-mounted
 *   `ro,noload,nosuid,nodev,noexec` in a private mount namespace of a child
 *   (`unshare --mount`), so no other process sees the mount and it goes with
 *   the child, however the child ends. GNU `cp -a` never follows a symlink in
 *   the tree it copies (links, FIFOs, sockets and setuid bits are copied
 *   inert: never opened, and the volume is mounted nosuid and nodev).
 * - {@linkcode exchangePaths}: `renameat2(RENAME_EXCHANGE)`, the one atomic
 *   swap of two directory names the kernel offers.
 *
 * Every path given is in a directory only the host can write (the state
 * root, the snapshot store, the volume's root): no name in them can be
 * swapped by the sandbox.
 *
 * @module
 */
import { basename, join } from "../path.ts";
import { QueueError } from "../errors.ts";
import { exists } from "../fs.ts";

/** How long one copy may run before its process is killed: 10 minutes. */
export const SNAPSHOT_COPY_TIMEOUT_MS = 600_000;

/**
 * Tests only: the host kills itself (SIGKILL) right after this step of a
 * snapshot save or restore, to show that nothing half-made is left and that
 * a restore leaves the old workspace or the new one, never a mix.
 */
export const SNAPSHOT_KILL_ENV = "WAFFLE_TEST_KILL_SNAPSHOT_AT";

/**
 * The steps of a save (`saved`: the image is copied, not yet published) and
 * of a restore (`stopped`, `copied`, `exchanged`), for the kill points.
 */
export type SnapshotStep = "saved" | "stopped" | "copied" | "exchanged";

/**
 * Kills this process when {@linkcode SNAPSHOT_KILL_ENV} names `step` (tests only).
 *
 * @param step The step just done.
 */
export function killPoint(step: SnapshotStep): void {
  let at: string | undefined;
  try {
    at = Deno.env.get(SNAPSHOT_KILL_ENV);
  } catch {
    return;
  }
  if (at === step) Deno.kill(Deno.pid, "SIGKILL");
}

// Exit statuses of the child shells that name their own failures.
const FREEZE_FAILED = 90;
const THAW_FAILED = 91;
const MOUNT_FAILED = 92;
const NOT_A_DIRECTORY = 93;

// $1 fsfreeze, $2 mount point, $3 timeout, $4 seconds, $5 cp, $6 image, $7 target, $8 sync.
// The volume is synced first, so the freeze itself flushes only what was
// written since: the sandbox's writes stall for the copy alone.
const FREEZE_SCRIPT = `trap '' HUP INT TERM PIPE
"$3" -s KILL "$4" "$8" -f "$2"
"$1" -f "$2" || exit ${FREEZE_FAILED}
"$3" -s KILL "$4" "$5" --sparse=always --reflink=auto -- "$6" "$7"
rc=$?
"$1" -u "$2" || rc=${THAW_FAILED}
exit $rc`;

// $1 mount, $2 image, $3 mount dir, $4 timeout, $5 seconds, $6 cp, $7 target.
const COPY_OUT_SCRIPT =
  `"$1" -t ext4 -o loop,ro,noload,nosuid,nodev,noexec "$2" "$3" || exit ${MOUNT_FAILED}
[ -d "$3/workspace" ] && [ ! -L "$3/workspace" ] || exit ${NOT_A_DIRECTORY}
exec "$4" -s KILL "$5" "$6" -a --reflink=auto -- "$3/workspace" "$7"`;

/**
 * Copies a mounted volume's image while its filesystem is frozen.
 *
 * @param options `mountPoint`: where the volume is mounted (checked to be
 *   the loop mount of `image` first: freezing any other filesystem would
 *   stop the host's); `image`: its backing file; `target`: a new file on
 *   another filesystem; `timeoutMs`: the copy's bound.
 * @throws {QueueError} When the volume is not mounted from `image`, cannot
 *   be frozen or thawed, or the copy fails.
 */
export async function copyFrozenImage(
  options: { mountPoint: string; image: string; target: string; timeoutMs?: number },
): Promise<void> {
  if (!(await isLoopMountOf(options.mountPoint, options.image))) {
    throw new QueueError(`Volume '${options.mountPoint}' is not mounted from '${options.image}'`);
  }
  const seconds = `${
    Math.max(1, Math.ceil((options.timeoutMs ?? SNAPSHOT_COPY_TIMEOUT_MS) / 1000))
  }`;
  const { code, stderr } = await runChild(program("sh"), [
    "-c",
    FREEZE_SCRIPT,
    "sh",
    program("fsfreeze"),
    options.mountPoint,
    program("timeout"),
    seconds,
    program("cp"),
    options.image,
    options.target,
    program("sync"),
  ]);
  if (code === 0) return;
  const what = code === FREEZE_FAILED
    ? `cannot freeze '${options.mountPoint}'`
    : code === THAW_FAILED
    ? `cannot thaw '${options.mountPoint}'`
    : code === 137
    ? `the copy took longer than ${seconds} s`
    : `the copy failed`;
  throw new QueueError(`Cannot copy volume image '${options.image}': ${what}${detail(stderr)}`);
}

/**
 * Copies an image no one writes (a frozen copy already made): sparse, and
 * reflinked where the host's filesystem can. A failed copy leaves nothing.
 *
 * @param from The image.
 * @param to A new file.
 * @param options `timeoutMs`: the copy's bound.
 * @throws {QueueError} When the copy fails or takes too long.
 */
export async function copyImage(
  from: string,
  to: string,
  options: { timeoutMs?: number } = {},
): Promise<void> {
  const seconds = `${
    Math.max(1, Math.ceil((options.timeoutMs ?? SNAPSHOT_COPY_TIMEOUT_MS) / 1000))
  }`;
  const { code, stderr } = await runChild(program("timeout"), [
    "-s",
    "KILL",
    seconds,
    program("cp"),
    "--sparse=always",
    "--reflink=auto",
    "--",
    from,
    to,
  ]);
  if (code === 0) return;
  await Deno.remove(to).catch(() => {});
  const what = code === 137 ? `the copy took longer than ${seconds} s` : "the copy failed";
  throw new QueueError(`Cannot copy volume image '${from}': ${what}${detail(stderr)}`);
}

/**
 * Thaws a volume a killed save may have left frozen. Does nothing unless
 * `mountPoint` is the loop mount of `image`; a volume that is not frozen is
 * left as it is.
 *
 * @param mountPoint The volume's mount point.
 * @param image Its backing file.
 */
export async function thawVolume(mountPoint: string, image: string): Promise<void> {
  if (!(await isLoopMountOf(mountPoint, image))) return;
  await runChild(program("fsfreeze"), ["-u", mountPoint]).catch(() => undefined);
}

/**
 * Copies the `workspace/` of a snapshot image into `target`, a name that
 * must not exist yet, in a directory only the host can write.
 *
 * @param options `image`: the snapshot's image; `mountDir`: an empty
 *   directory to mount it on (in the child's namespace only); `target`;
 *   `timeoutMs`: the copy's bound.
 * @throws {QueueError} When the image cannot be mounted, holds no
 *   workspace directory, or the copy fails (e.g. no room on the volume).
 */
export async function copyWorkspaceOut(
  options: { image: string; mountDir: string; target: string; timeoutMs?: number },
): Promise<void> {
  const seconds = `${
    Math.max(1, Math.ceil((options.timeoutMs ?? SNAPSHOT_COPY_TIMEOUT_MS) / 1000))
  }`;
  const { code, stderr } = await runChild(program("unshare"), [
    "--mount",
    "--propagation",
    "private",
    "--",
    program("sh"),
    "-c",
    COPY_OUT_SCRIPT,
    "sh",
    program("mount"),
    options.image,
    options.mountDir,
    program("timeout"),
    seconds,
    program("cp"),
    options.target,
  ]);
  if (code === 0) {
    const info = Deno.lstatSync(options.target);
    if (info.isDirectory) return;
    throw new QueueError(`Snapshot image '${options.image}' gave no workspace directory`);
  }
  const what = code === MOUNT_FAILED
    ? "cannot mount it"
    : code === NOT_A_DIRECTORY
    ? "it holds no workspace directory"
    : code === 137
    ? `the copy took longer than ${seconds} s`
    : /No space left on device/.test(stderr)
    ? "no room left on the sandbox's volume for a second copy of the workspace"
    : "the copy failed";
  throw new QueueError(`Cannot restore from '${options.image}': ${what}${detail(stderr)}`);
}

const RENAME_EXCHANGE = 2;
const AT_FDCWD = -100;

const RENAME_SYMBOLS = {
  renameat2: { parameters: ["i32", "buffer", "i32", "buffer", "u32"], result: "i32" },
  __errno_location: { parameters: [], result: "pointer" },
} as const;

/**
 * Swaps two existing names atomically (`renameat2` with `RENAME_EXCHANGE`):
 * whenever this process is killed, each name holds one of the two trees.
 *
 * @param a A path.
 * @param b Another path on the same filesystem.
 * @throws {QueueError} When the swap is not possible (no FFI, no kernel support, a name missing).
 */
export function exchangePaths(a: string, b: string): void {
  let lib: Deno.DynamicLibrary<typeof RENAME_SYMBOLS>;
  try {
    // Loaded for the call alone: a swap is rare, and nothing stays open.
    lib = Deno.dlopen("libc.so.6", RENAME_SYMBOLS);
  } catch (cause) {
    throw new QueueError(`Cannot swap '${a}' and '${b}': renameat2 is not available`, { cause });
  }
  try {
    const encode = (path: string): Uint8Array<ArrayBuffer> =>
      new TextEncoder().encode(`${path}\0`) as Uint8Array<ArrayBuffer>;
    const { renameat2, __errno_location } = lib.symbols;
    if (renameat2(AT_FDCWD, encode(a), AT_FDCWD, encode(b), RENAME_EXCHANGE) === 0) return;
    const pointer = __errno_location();
    const errno = pointer === null ? 0 : new Deno.UnsafePointerView(pointer).getInt32();
    throw new QueueError(`Cannot swap '${a}' and '${b}' (errno ${errno})`);
  } finally {
    lib.close();
  }
}

/**
 * Whether the visible mount at `mountPoint` is a loop device backed by
 * `image`, per this process's mountinfo and sysfs.
 *
 * @param mountPoint An absolute, resolved path.
 * @param image The backing file's resolved path.
 * @returns True when it is.
 */
export async function isLoopMountOf(mountPoint: string, image: string): Promise<boolean> {
  let top: { majorMinor: string; source: string } | undefined;
  for (const line of (await Deno.readTextFile("/proc/self/mountinfo")).split("\n")) {
    const fields = line.split(" ");
    const dash = fields.indexOf("-");
    if (dash < 0 || unescape(fields[4] ?? "") !== mountPoint) continue;
    top = { majorMinor: fields[2] ?? "", source: unescape(fields[dash + 2] ?? "") };
  }
  if (top === undefined || !top.source.startsWith("/dev/loop")) return false;
  try {
    const sys = `/sys/dev/block/${top.majorMinor}`;
    const backing = (await Deno.readTextFile(`${sys}/loop/backing_file`)).trimEnd();
    return backing === image && basename(await Deno.realPath(sys)).startsWith("loop");
  } catch {
    return false;
  }
}

function unescape(field: string): string {
  return field.replace(
    /\\([0-7]{3})/g,
    (_, octal: string) => String.fromCharCode(parseInt(octal, 8)),
  );
}

function detail(stderr: string): string {
  const line = stderr.split("\n").map((text) => text.trim()).find((text) => text !== "");
  return line === undefined ? "" : `: ${line.slice(0, 300)}`;
}

/** How much of a child's stderr is kept (a hostile tree can make cp complain per file). */
const STDERR_KEPT = 4096;

async function runChild(path: string, args: string[]): Promise<{ code: number; stderr: string }> {
  const child = new Deno.Command(path, {
    args,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const kept: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of child.stderr) {
    if (size < STDERR_KEPT) kept.push(chunk.subarray(0, STDERR_KEPT - size));
    size += chunk.byteLength;
  }
  const status = await child.status;
  const decoder = new TextDecoder();
  return {
    // Deno reports death by signal n as 128 + n, as a shell does.
    code: status.code,
    stderr: kept.map((part) => decoder.decode(part, { stream: true })).join(""),
  };
}

/** PATH, then the standard places (a service's PATH often lacks the sbin directories). */
function program(name: string): string {
  let path = "";
  try {
    path = Deno.env.get("PATH") ?? "";
  } catch {
    // No env permission: the standard places only.
  }
  const dirs = [...path.split(":"), "/usr/sbin", "/sbin", "/usr/bin", "/bin"];
  const found = dirs.filter((dir) => dir.startsWith("/")).map((dir) => join(dir, name)).find(
    exists,
  );
  if (found === undefined) throw new QueueError(`Program '${name}' is not installed`);
  return found;
}

/**
 * The programs snapshots need, for a clear error before anything is done.
 *
 * @returns The first one missing, or undefined.
 */
export function missingProgram(): string | undefined {
  for (const name of ["sh", "fsfreeze", "timeout", "cp", "sync", "unshare", "mount"]) {
    try {
      program(name);
    } catch {
      return name;
    }
  }
  return undefined;
}
