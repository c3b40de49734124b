/**
 * The few libc calls waffle needs that Deno does not expose, loaded once
 * through FFI. Linux only; callers treat `undefined` as "not available".
 *
 * @module
 */

const SYMBOLS = {
  prctl: { parameters: ["i32", "u64", "u64", "u64", "u64"], result: "i32" },
  waitpid: { parameters: ["i32", "buffer", "i32"], result: "i32" },
  open: { parameters: ["buffer", "i32", "i32"], result: "i32" },
  close: { parameters: ["i32"], result: "i32" },
  flock: { parameters: ["i32", "i32"], result: "i32" },
  fchown: { parameters: ["i32", "u32", "u32"], result: "i32" },
  fchmod: { parameters: ["i32", "u32"], result: "i32" },
  fcntl: { parameters: ["i32", "i32", "buffer"], result: "i32" },
  fcntlInt: { name: "fcntl", parameters: ["i32", "i32", "i32"], result: "i32" },
  pread: { parameters: ["i32", "buffer", "usize", "i64"], result: "isize" },
  read: { parameters: ["i32", "buffer", "usize"], result: "isize" },
  write: { parameters: ["i32", "buffer", "usize"], result: "isize" },
  ioctl: { parameters: ["i32", "u64", "buffer"], result: "i32" },
  ioctlInt: { name: "ioctl", parameters: ["i32", "u64", "u64"], result: "i32" },
  access: { parameters: ["buffer", "i32"], result: "i32" },
  statvfs: { parameters: ["buffer", "buffer"], result: "i32" },
  inotify_init1: { parameters: ["i32"], result: "i32" },
  inotify_add_watch: { parameters: ["i32", "buffer", "u32"], result: "i32" },
  inotify_rm_watch: { parameters: ["i32", "i32"], result: "i32" },
  // On a thread of its own: waiting for an event never blocks the event loop.
  poll: { parameters: ["buffer", "u64", "i32"], result: "i32", nonblocking: true },
  lsetxattr: {
    parameters: ["buffer", "buffer", "buffer", "usize", "i32"],
    result: "i32",
  },
  lgetxattr: { parameters: ["buffer", "buffer", "buffer", "usize"], result: "isize" },
  llistxattr: { parameters: ["buffer", "buffer", "usize"], result: "isize" },
  __errno_location: { parameters: [], result: "pointer" },
} as const;

/** The loaded libc symbols. */
export type Libc = Deno.DynamicLibrary<typeof SYMBOLS>["symbols"];

// open(2) flags differ between architectures: arm64 uses the generic values.
const ARM = Deno.build.arch === "aarch64";

/** `open(2)` flags (Linux, x86_64 and aarch64). */
export const O_RDONLY = 0;
/** `open(2)`: write only. */
export const O_WRONLY = 1;
/** Fail with ELOOP instead of following a symlink in the last component. */
export const O_NOFOLLOW = ARM ? 0o100000 : 0o400000;
/** Fail unless the path is a directory. */
export const O_DIRECTORY = ARM ? 0o40000 : 0o200000;
/** Do not block opening a FIFO with no writer (or a device). */
export const O_NONBLOCK = 0o4000;
/** Not inherited by child processes. */
export const O_CLOEXEC = 0o2000000;
/** A terminal opened does not become the controlling terminal. */
export const O_NOCTTY = 0o400;
/** Open for reading and writing. */
export const O_RDWR = 2;
/** `poll(2)`: data to read. */
export const POLLIN = 0x1;
/** `poll(2)`: room to write. */
export const POLLOUT = 0x4;
/** `errno`: try again (a non-blocking call that would block). */
export const EAGAIN = 11;
/** `errno`: the file system keeps no extended attributes (`EOPNOTSUPP`). */
export const ENOTSUP = 95;
/** `errno`: a buffer too small for the value (`ERANGE`). */
export const ERANGE = 34;
/** `errno`: no space left on the device (`ENOSPC`). */
export const ENOSPC = 28;
/** `errno`: an argument (an attribute's value) too long (`E2BIG`). */
export const E2BIG = 7;
/** `errno`: no such attribute (`ENODATA`). */
export const ENODATA = 61;
/** `errno`: interrupted by a signal. */
export const EINTR = 4;

let loaded: Libc | null | undefined;

/**
 * Loads libc once.
 *
 * @returns The symbols, or undefined off Linux or when FFI is not permitted.
 */
export function libc(): Libc | undefined {
  if (loaded === undefined) {
    try {
      loaded = Deno.build.os === "linux" ? Deno.dlopen("libc.so.6", SYMBOLS).symbols : null;
    } catch {
      loaded = null;
    }
  }
  return loaded ?? undefined;
}

/** `fcntl(2)`: set a pipe's capacity. */
const F_SETPIPE_SZ = 1031;

/**
 * Grows a pipe's capacity (Linux caps it at `/proc/sys/fs/pipe-max-size`,
 * 1 MiB by default): a stream through a 64 KiB pipe hands over between its
 * two processes every 64 KiB, and each handover waits for a CPU.
 *
 * @param fd The pipe's descriptor (either end).
 * @param bytes The capacity wanted.
 * @returns Whether it took (false: not a pipe, over the limit, or no libc).
 */
export function growPipe(fd: number, bytes: number): boolean {
  const lib = libc();
  return lib !== undefined && lib.fcntlInt(fd, F_SETPIPE_SZ, bytes) >= 0;
}

/**
 * The calling thread's `errno`, right after a failed call.
 *
 * @param lib The loaded libc.
 * @returns The error number.
 */
export function errno(lib: Libc): number {
  const pointer = lib.__errno_location();
  return pointer === null ? 0 : new Deno.UnsafePointerView(pointer).getInt32();
}

/**
 * A string as a NUL-terminated C string, for a libc call's path argument.
 *
 * @param text The string (a path).
 * @returns Its UTF-8 bytes and a trailing NUL.
 */
export function cString(text: string): Uint8Array<ArrayBuffer> {
  const bytes = new TextEncoder().encode(text);
  const out = new Uint8Array(bytes.length + 1);
  out.set(bytes);
  return out;
}
