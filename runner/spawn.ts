/**
 * How the runner starts a command cheaply.
 *
 * Deno (Rust's std) starts a child with `posix_spawn` (vfork + exec, about
 * 1 ms) unless it is asked for work between fork and exec: `detached`
 * (setsid in a pre-exec hook) or `uid`/`gid` make it fork() the whole
 * runner, 7 to 17 ms depending on its heap. So the session and the uid/gid
 * drop are done by a program that execs in place (the pid stays the
 * command's pid, which `process_tree.ts` tracks).
 *
 * Preferred: waffle's spawn helper (`image/spawn_helper.c`, installed in the
 * image at `/usr/libexec/waffle/spawn`), one small static program:
 * `spawn UID GID /abs/program args...` calls setsid(), drops every
 * supplementary group, the gid and the uid (checking that the drop took),
 * and execs the program (`spawn - /abs/program args...`: no drop). Being
 * static it has no dynamic loader, so it is given the command's environment
 * directly: the request's `LD_PRELOAD`, `LD_LIBRARY_PATH`... load nothing
 * into it while it is root. It is used only if it is an executable regular
 * file owned by root (or the runner's uid), writable by no one else, and an
 * ELF without a loader ({@linkcode spawnHelperProblem}).
 *
 * Where the helper is absent (a runner on a host), a chain of exec-in-place
 * wrappers does the same work, one exec each:
 *
 * - `setsid` (util-linux or busybox): a posix_spawned child is no process
 *   group leader, so both call setsid() and exec without forking (pgid =
 *   sid = pid). Every program they are given is an absolute path, so
 *   busybox never runs one of its applets in place of it;
 * - util-linux `setpriv --reuid=U --regid=G --clear-groups`: drops the uid,
 *   the gid and every supplementary group before the next exec;
 * - `env -i NAME=VALUE...`: sets the command's environment only after the
 *   drop. The stages that run as root get an empty environment, so the
 *   request's `LD_PRELOAD`, `LD_LIBRARY_PATH`, `GCONV_PATH`, `LOCPATH`...
 *   never reach a root process.
 *
 * The argv becomes `[setsid, --, setpriv, ..., --, env, -i, --, NAME=VALUE...,
 * /abs/program, args...]` (just `[setsid, --, /abs/program, args...]` when no
 * uid is dropped). setsid comes first: the process leaves the runner's
 * session and group before anything runs as the command's uid.
 *
 * Where neither the helper nor every wrapper is there (busybox's `setpriv`
 * has no uid options, so it does not count), or a uid is to be dropped by a
 * runner that is not root, Deno's own `detached`/`uid`/`gid` options are
 * used as before.
 *
 * As the final exec now happens in the helper or a wrapper, its failures
 * are decided beforehand by {@linkcode resolveProgram}, the way Deno and
 * execve(2) would.
 *
 * @module
 */
import { libc, O_CLOEXEC, O_NOCTTY, O_NONBLOCK, O_RDONLY } from "../lib/libc.ts";
import { SANDBOX_SPAWN_HELPER } from "../lib/config/sandbox_paths.ts";

/** What runs when a command is spawned. */
export interface SpawnPlan {
  /** Absolute path of the program Deno spawns. */
  program: string;
  /** Its arguments. */
  args: string[];
  /** The environment Deno spawns it with (`clearEnv`). */
  env: Record<string, string>;
  /** Deno's own setsid (forks the runner): no session wrapper is used. */
  detached: boolean;
  /** Deno's own uid/gid drop (forks the runner): no privilege wrapper is used. */
  user?: { uid: number; gid: number } | undefined;
  /**
   * The spawned process starts in the runner's session and group and enters
   * its own only once the helper or the setsid wrapper called setsid() (well
   * before the command runs).
   */
  sessionPending: boolean;
}

/** Absolute paths of the exec-in-place programs; null where unavailable. */
export interface SpawnWrappers {
  /** waffle's static spawn helper (preferred over all the others). */
  helper: string | null;
  /** `setsid` (util-linux or busybox). */
  setsid: string | null;
  /** util-linux `setpriv`. */
  setpriv: string | null;
  /** Any `env` that takes `-i -- NAME=VALUE... PROGRAM`. */
  env: string | null;
}

/** The program a command would execute, or why it cannot run. */
export type Resolution =
  | { ok: true; path: string }
  | { ok: false; notFound: true }
  | { ok: false; notFound: false; reason: string };

// The runtime kit's helper first (any image), then the contract image's own.
const HELPER_PATHS = [SANDBOX_SPAWN_HELPER, "/usr/libexec/waffle/spawn"];
const SETSID_PATHS = ["/usr/bin/setsid", "/bin/setsid"];
const SETPRIV_PATHS = ["/usr/bin/setpriv", "/bin/setpriv"];
const ENV_PATHS = ["/usr/bin/env", "/bin/env"];

/** glibc's execvp() search path when `PATH` is unset. */
const DEFAULT_PATH = "/bin:/usr/bin";
/** Enough of a file for a `#!` line (the kernel reads 256 bytes) and ELF program headers. */
const HEAD_BYTES = 2048;
/** The kernel follows at most this many `#!` interpreters (BINPRM_MAX_RECURSION). */
const MAX_INTERPRETERS = 4;
/** `PT_INTERP`: the ELF program header naming the dynamic loader. */
const PT_INTERP = 3;
/** `ET_EXEC` and `ET_DYN`: the ELF types execve(2) runs. */
const ELF_EXECUTABLE_TYPES = [2, 3];
/** `X_OK` from `<unistd.h>`. */
const X_OK = 1;
/** `ST_NOEXEC` in `statvfs.f_flag`. */
const ST_NOEXEC = 8;
/** Offset of `f_flag` in glibc's `struct statvfs` on 64-bit Linux (x86-64, arm64). */
const F_FLAG_OFFSET = 72;

const NOT_FOUND: Resolution = { ok: false, notFound: true };

let wrappers: SpawnWrappers | undefined;

/**
 * The wrappers in use, looked up once (on first use).
 *
 * @returns Their absolute paths; null for each one missing.
 */
export function spawnWrappers(): Readonly<SpawnWrappers> {
  wrappers ??= {
    helper: findHelper(HELPER_PATHS),
    setsid: findWrapper(SETSID_PATHS, true),
    setpriv: findWrapper(SETPRIV_PATHS, false),
    env: findWrapper(ENV_PATHS, true),
  };
  return wrappers;
}

/**
 * Replaces the wrappers as they are, unchecked (tests: null entries force
 * the wrappers or Deno's own options), or
 * with undefined looks them up again on next use.
 *
 * @param override The wrappers to use, or undefined.
 */
export function setSpawnWrappers(override: SpawnWrappers | undefined): void {
  wrappers = override === undefined ? undefined : { ...override };
}

/**
 * Why a file must not be used as the spawn helper, which runs as root with
 * the request's environment.
 *
 * @param path The candidate's absolute path (symbolic links are followed).
 * @returns The reason, or null when it is usable: an executable regular file
 *   owned by root or the runner's uid, not writable by group or others, and
 *   an ELF executable without a dynamic loader (`PT_INTERP`).
 */
export function spawnHelperProblem(path: string): string | null {
  let info: Deno.FileInfo;
  try {
    info = Deno.statSync(path);
  } catch (error) {
    return errorReason(error);
  }
  const mode = info.mode ?? 0;
  if (!info.isFile) return "not a regular file";
  if ((mode & 0o111) === 0) return "not executable";
  if (info.uid !== 0 && info.uid !== runnerUid()) return `owned by uid ${info.uid}`;
  if ((mode & 0o022) !== 0) return "writable by group or others";
  const head = readHead(path);
  if (head === null) return "not readable";
  const elf = elfProgramHeaders(head);
  if (elf === null || !ELF_EXECUTABLE_TYPES.includes(elf.type)) return "not an ELF executable";
  if (!elf.complete) return "ELF program headers out of reach";
  if (elf.headers.some((header) => header.type === PT_INTERP)) {
    return "dynamically linked (the request's environment could load code into it)";
  }
  return null;
}

/**
 * Whether a command can be given a terminal: only the spawn helper can
 * (`spawn --tty`), and it drops a uid only in a root runner.
 *
 * @param user The uid and gid the command runs as.
 * @returns True when {@linkcode planSpawn} would use the helper.
 */
export function ttySupported(user: { uid: number; gid: number } | undefined): boolean {
  return spawnWrappers().helper !== null && (user === undefined || runnerUid() === 0);
}

function findHelper(candidates: readonly string[]): string | null {
  return candidates.find((candidate) => spawnHelperProblem(candidate) === null) ?? null;
}

// The first candidate that is an executable regular file; a busybox applet
// only where `busyboxOk` (its setpriv lacks --reuid/--regid/--clear-groups).
function findWrapper(candidates: readonly string[], busyboxOk: boolean): string | null {
  for (const candidate of candidates) {
    try {
      const real = Deno.realPathSync(candidate);
      const info = Deno.statSync(real);
      if (!info.isFile || ((info.mode ?? 0) & 0o111) === 0) continue;
      if (!busyboxOk && /(^|\/)busybox[^/]*$/.test(real)) continue;
      return candidate;
    } catch {
      // Missing: try the next one.
    }
  }
  return null;
}

/**
 * How to spawn `path` (from {@linkcode resolveProgram}) in its own session,
 * as `user` when given.
 *
 * @param path Absolute program path.
 * @param args Its arguments (without argv[0]).
 * @param env The command's complete environment.
 * @param user The uid and gid to run as, or undefined for the runner's own.
 * @param options `tty`: a pty slave the helper makes the command's terminal
 *   (only the helper can: see {@linkcode ttySupported}).
 * @returns What to hand to `Deno.Command`.
 */
export function planSpawn(
  path: string,
  args: readonly string[],
  env: Record<string, string>,
  user: { uid: number; gid: number } | undefined,
  options: { tty?: string | undefined } = {},
): SpawnPlan {
  const { helper, setsid, setpriv, env: envWrapper } = spawnWrappers();
  const tty = options.tty === undefined ? [] : ["--tty", options.tty];
  const legacy: SpawnPlan = {
    program: path,
    args: [...args],
    env,
    detached: true,
    user,
    sessionPending: false,
  };
  // The helper needs CAP_SETUID/CAP_SETGID to drop (setgroups fails
  // without): a runner that is not root keeps Deno's way for that.
  if (helper !== null && (user === undefined || runnerUid() === 0)) {
    return {
      program: helper,
      args: user === undefined
        ? [...tty, "-", path, ...args]
        : [...tty, String(user.uid), String(user.gid), path, ...args],
      env,
      detached: false,
      sessionPending: true,
    };
  }
  if (setsid === null) return legacy;
  if (user === undefined) {
    // Same uid as the runner: nothing more privileged than the command sees its environment.
    return {
      program: setsid,
      args: ["--", path, ...args],
      env,
      detached: false,
      sessionPending: true,
    };
  }
  // setpriv needs CAP_SETUID/CAP_SETGID for --clear-groups; a runner that is
  // not root keeps Deno's way (which skips setgroups there). A path with `=`
  // would be taken for an assignment by env.
  if (setpriv === null || envWrapper === null || runnerUid() !== 0 || path.includes("=")) {
    return legacy;
  }
  return {
    program: setsid,
    args: [
      "--",
      setpriv,
      `--reuid=${user.uid}`,
      `--regid=${user.gid}`,
      "--clear-groups",
      "--",
      envWrapper,
      "-i",
      "--",
      ...Object.entries(env).map(([name, value]) => `${name}=${value}`),
      path,
      ...args,
    ],
    env: {},
    detached: false,
    sessionPending: true,
  };
}

/**
 * Finds the program `argv0` names, as Deno would before spawning it, and
 * decides whether execve(2) would fail on it.
 *
 * A name without `/` is looked up in the command's `PATH` (relative entries
 * against its cwd): the first regular file the runner may execute. A name
 * with `/` is taken relative to the cwd and normalized. Either way the
 * result is then checked as the command's user: it must be a regular file
 * it may execute (mode bits for a dropped uid; `access(2)` otherwise), not
 * on a `noexec` mount, and any `#!` interpreter or ELF loader must exist.
 * Only certain failures are reported: anything this cannot see (ACLs,
 * directory permissions of a dropped uid, a race) fails in the wrapper's
 * exec instead, with its 126/127 exit status and message.
 *
 * @param argv0 The program as requested.
 * @param cwd The command's absolute working directory.
 * @param env The command's environment (its `PATH`).
 * @param user The uid and gid it will run as, or undefined for the runner's own.
 * @returns The absolute path to execute (also the command's argv[0], as with
 *   Deno), or why it cannot run.
 */
export function resolveProgram(
  argv0: string,
  cwd: string,
  env: Record<string, string>,
  user: { uid: number; gid: number } | undefined,
): Resolution {
  const resolution = resolvePath(argv0, cwd, env, user);
  // Deno enters the cwd after the uid drop, so a cwd the command's user
  // cannot search made it fail; the wrappers enter it as the runner.
  if (resolution.ok && user !== undefined && !searchable(cwd, user)) {
    return { ok: false, notFound: false, reason: "Permission denied" };
  }
  return resolution;
}

function resolvePath(
  argv0: string,
  cwd: string,
  env: Record<string, string>,
  user: { uid: number; gid: number } | undefined,
): Resolution {
  if (argv0 === "") return NOT_FOUND;
  if (argv0.includes("/")) {
    const path = normalize(argv0.startsWith("/") ? argv0 : `${cwd}/${argv0}`);
    const failure = execFailure(path, cwd, user, 0);
    if (failure === null) return { ok: true, path };
    if (failure === "missing") return NOT_FOUND;
    if (failure === "interpreter") {
      return { ok: false, notFound: false, reason: "Its interpreter or loader was not found" };
    }
    return { ok: false, notFound: false, reason: failure.reason };
  }
  const found = searchPath(argv0, cwd, Object.hasOwn(env, "PATH") ? env.PATH : undefined);
  if (found === null) return NOT_FOUND;
  const failure = execFailure(found, cwd, user, 0);
  if (failure === null) return { ok: true, path: found };
  // A found name whose interpreter is missing: Deno said "not found" (ENOENT).
  if (failure === "missing" || failure === "interpreter") return NOT_FOUND;
  return { ok: false, notFound: false, reason: failure.reason };
}

// False when a directory on the way to `cwd` (or `cwd`) certainly denies the
// user search permission (mode bits; the dropped uid has no capabilities).
function searchable(cwd: string, user: { uid: number; gid: number }): boolean {
  if (user.uid === 0) return true;
  let dir = "";
  for (const part of ["", ...normalize(cwd).split("/").filter((part) => part !== "")]) {
    dir = part === "" ? "/" : dir === "/" ? `/${part}` : `${dir}/${part}`;
    let info: Deno.FileInfo;
    try {
      info = Deno.statSync(dir);
    } catch {
      return true; // let the spawn tell
    }
    if (info.isDirectory && !modeAllows(info, user.uid, user.gid)) return false;
  }
  return true;
}

// Like Deno's `which`: the first regular file in PATH the runner may execute.
function searchPath(name: string, cwd: string, pathVar: string | undefined): string | null {
  for (const entry of (pathVar ?? DEFAULT_PATH).split(":")) {
    const dir = entry.startsWith("/") ? entry : normalize(`${cwd}/${entry}`);
    const candidate = dir.endsWith("/") ? `${dir}${name}` : `${dir}/${name}`;
    if (runnerMayExecute(candidate)) return candidate;
  }
  return null;
}

function runnerMayExecute(path: string): boolean {
  const lib = libc();
  if (lib !== undefined && lib.access(cString(path), X_OK) !== 0) return false;
  let info: Deno.FileInfo;
  try {
    info = Deno.statSync(path);
  } catch {
    return false;
  }
  return info.isFile && (lib !== undefined || modeAllows(info, runnerUid(), runnerGid()));
}

type Failure = "missing" | "interpreter" | { reason: string };

// Why execve(path) as `user` would fail, when certain; null otherwise.
function execFailure(
  path: string,
  cwd: string,
  user: { uid: number; gid: number } | undefined,
  depth: number,
): Failure | null {
  let info: Deno.FileInfo;
  try {
    info = Deno.statSync(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return "missing";
    return { reason: errorReason(error) };
  }
  if (info.isDirectory) return { reason: depth === 0 ? "Is a directory" : "Permission denied" };
  if (!info.isFile || !mayExecute(path, info, user)) return { reason: "Permission denied" };
  const head = readHead(path);
  if (head === null) return null;
  const shebang = shebangInterpreter(head);
  if (shebang !== null) {
    if (depth >= MAX_INTERPRETERS) return null; // the kernel's ELOOP; let it say so
    const interpreter = shebang.startsWith("/") ? shebang : `${cwd}/${shebang}`;
    const failure = execFailure(interpreter, cwd, user, depth + 1);
    return failure === "missing" ? "interpreter" : failure;
  }
  const loader = elfInterpreter(head);
  if (loader !== null && !exists(loader.startsWith("/") ? loader : `${cwd}/${loader}`)) {
    return "interpreter";
  }
  return null;
}

// Exact for the runner's own uid (access(2) sees ACLs, noexec, capabilities);
// mode bits and the mount's noexec flag for a dropped uid, which has no
// capabilities and no supplementary groups.
function mayExecute(
  path: string,
  info: Deno.FileInfo,
  user: { uid: number; gid: number } | undefined,
): boolean {
  const lib = libc();
  if (user === undefined) {
    if (lib !== undefined) return lib.access(cString(path), X_OK) === 0;
    return modeAllows(info, runnerUid(), runnerGid());
  }
  if (!modeAllows(info, user.uid, user.gid)) return false;
  if (lib !== undefined) {
    const buffer = new BigUint64Array(32);
    if (lib.statvfs(cString(path), buffer) === 0) {
      const flags = new DataView(buffer.buffer).getBigUint64(F_FLAG_OFFSET, true);
      if ((flags & BigInt(ST_NOEXEC)) !== 0n) return false;
    }
  }
  return true;
}

// Permission bits as execve(2) applies them (root: any execute bit).
function modeAllows(info: Deno.FileInfo, uid: number, gid: number): boolean {
  const mode = info.mode ?? 0o777;
  if (uid === 0) return (mode & 0o111) !== 0;
  if (info.uid === uid) return (mode & 0o100) !== 0;
  if (info.gid === gid) return (mode & 0o010) !== 0;
  return (mode & 0o001) !== 0;
}

// The first bytes of a file, never blocking: the name is in directories the
// sandbox writes, and a FIFO swapped in between a stat and an open would
// hold this thread (the runner's only one) forever. O_NONBLOCK on the open
// itself; the file type is checked on the open descriptor.
function readHead(path: string): Uint8Array | null {
  const lib = libc();
  if (lib === undefined) return null; // let the exec decide
  const fd = lib.open(cString(path), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0);
  if (fd < 0) return null;
  try {
    if (!Deno.statSync(`/proc/self/fd/${fd}`).isFile) return null;
    const buffer = new Uint8Array(HEAD_BYTES);
    const read = Number(lib.pread(fd, buffer, BigInt(buffer.length), 0n));
    return read < 0 ? null : buffer.subarray(0, read);
  } catch {
    return null;
  } finally {
    lib.close(fd);
  }
}

// The interpreter of a `#!` line, as binfmt_script parses it.
function shebangInterpreter(head: Uint8Array): string | null {
  if (head[0] !== 0x23 || head[1] !== 0x21) return null;
  const line = head.subarray(2, Math.min(head.length, 256));
  let start = 0;
  while (start < line.length && (line[start] === 0x20 || line[start] === 0x09)) start++;
  let end = start;
  while (end < line.length && ![0x20, 0x09, 0x0a, 0x00].includes(line[end] ?? 0)) end++;
  return end > start ? new TextDecoder().decode(line.subarray(start, end)) : null;
}

interface ElfHeaders {
  /** `e_type`. */
  type: number;
  /** The program headers that lie within the bytes read. */
  headers: { type: number; offset: number; size: number }[];
  /** Whether all of them did. */
  complete: boolean;
}

// The type and program headers of an ELF file (from its first bytes); null if no ELF.
function elfProgramHeaders(head: Uint8Array): ElfHeaders | null {
  if (head.length < 64 || head[0] !== 0x7f || head[1] !== 0x45 || head[2] !== 0x4c) return null;
  if (head[3] !== 0x46) return null;
  const is64 = head[4] === 2;
  const little = head[5] === 1;
  const view = new DataView(head.buffer, head.byteOffset, head.byteLength);
  const type = view.getUint16(16, little);
  const phoff = is64 ? Number(view.getBigUint64(32, little)) : view.getUint32(28, little);
  const phentsize = view.getUint16(is64 ? 54 : 42, little);
  const phnum = view.getUint16(is64 ? 56 : 44, little);
  const headers: ElfHeaders["headers"] = [];
  for (let index = 0; index < phnum; index++) {
    const at = phoff + index * phentsize;
    if (at + (is64 ? 56 : 32) > head.length) return { type, headers, complete: false };
    headers.push({
      type: view.getUint32(at, little),
      offset: is64 ? Number(view.getBigUint64(at + 8, little)) : view.getUint32(at + 4, little),
      size: is64 ? Number(view.getBigUint64(at + 32, little)) : view.getUint32(at + 16, little),
    });
  }
  return { type, headers, complete: true };
}

// The dynamic loader (PT_INTERP) of an ELF file, when its headers are in `head`.
function elfInterpreter(head: Uint8Array): string | null {
  const interp = elfProgramHeaders(head)?.headers.find((header) => header.type === PT_INTERP);
  if (interp === undefined) return null;
  const { offset, size } = interp;
  if (offset + size > head.length || size === 0) return null;
  const bytes = head.subarray(offset, offset + size);
  const nul = bytes.indexOf(0);
  return new TextDecoder().decode(nul < 0 ? bytes : bytes.subarray(0, nul));
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch (error) {
    // Only a certain "no such file" counts as missing.
    return !(error instanceof Deno.errors.NotFound);
  }
}

// Lexical normalization, as Deno resolves a command given as a path.
function normalize(path: string): string {
  const parts: string[] = [];
  for (const part of path.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") parts.pop();
    else parts.push(part);
  }
  return `/${parts.join("/")}`;
}

// strerror() texts of the errors stat(2) and execve(2) share.
const ERRNO_TEXT: Readonly<Record<string, string>> = {
  EACCES: "Permission denied",
  ENOTDIR: "Not a directory",
  ELOOP: "Too many levels of symbolic links",
  ENAMETOOLONG: "File name too long",
};

function errorReason(error: unknown): string {
  const code = typeof error === "object" && error !== null && "code" in error
    ? String(error.code)
    : "";
  if (Object.hasOwn(ERRNO_TEXT, code)) return ERRNO_TEXT[code] ?? code;
  if (error instanceof Deno.errors.PermissionDenied) return "Permission denied";
  if (error instanceof Deno.errors.NotADirectory) return "Not a directory";
  const message = error instanceof Error ? error.message : String(error);
  return message.split("\n")[0]?.replace(/ \(os error \d+\).*$/, "") ?? message;
}

let uidCache: number | undefined;
let gidCache: number | undefined;

function runnerUid(): number {
  uidCache ??= Deno.uid() ?? -1;
  return uidCache;
}

function runnerGid(): number {
  gidCache ??= Deno.gid() ?? -1;
  return gidCache;
}

const encoder = new TextEncoder();

function cString(text: string): Uint8Array<ArrayBuffer> {
  const bytes = new Uint8Array(text.length * 3 + 1);
  const { written } = encoder.encodeInto(text, bytes);
  return bytes.subarray(0, written + 1);
}
