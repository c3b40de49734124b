/**
 * Files in and out of a sandbox, streamed and bounded: the host half of
 * `waffle cp` and the library's `sandbox.files`. Every path inside the
 * sandbox is resolved by `waffle files …` running inside it as the
 * commands' uid (see `lib/cli/files.ts`); the host only streams bytes through a
 * queue session, and extracts what comes out with `extract.ts`'s rules.
 *
 * @example
 * ```ts ignore
 * import { openSandbox } from "../mod.ts";
 * const sandbox = openSandbox("alice");
 * await sandbox.files.write("notes.txt", new TextEncoder().encode("hi\n"));
 * const entries = await sandbox.files.list(".");
 * ```
 *
 * @module
 */
import { escapeControls } from "../terminal/control_text.ts";
import * as z from "../schema.ts";
import { concat } from "../bytes.ts";
import { FilesError } from "../errors.ts";
import type { SandboxConfig } from "../config/config.ts";
import type { Backend } from "../queue/backend.ts";
import { sandboxMetadataReader, sandboxWaffleCommand } from "../lifecycle/posture.ts";
import type { ExecResult } from "../queue/protocol.ts";
import type { WaitOptions } from "../queue/queue.ts";
import { QueueSession } from "../queue/session.ts";
import type { LinkPolicy } from "./pack.ts";
import {
  decodeMetadata,
  METADATA_BYTES,
  METADATA_KEYS,
  METADATA_PREFIX,
  metadataProblem,
  reportedSchema,
} from "./metadata.ts";

/** One entry of {@linkcode listFiles}. */
export interface FileEntry {
  /** The entry's name in its directory. */
  name: string;
  /** `file`, `directory`, `symlink`, `fifo`, `socket`, `device` or `other`. */
  type: "file" | "directory" | "symlink" | "fifo" | "socket" | "device" | "other";
  /** Size in bytes. */
  size: number;
  /** Permission bits. */
  mode: number;
  /** Modification time, epoch milliseconds (the sandbox's clock). */
  mtime: number;
}

const entrySchema = z.object({
  name: z.string().check(z.maxLength(4096)),
  type: z.enum(["file", "directory", "symlink", "fifo", "socket", "device", "other"]),
  size: z.number().check(z.nonnegative()),
  mode: z.int().check(z.nonnegative()),
  mtime: z.number(),
});

/**
 * What the files API uses of a sandbox: `openSandbox`'s result is one (its
 * sessions run `waffle files` inside it).
 */
export interface FilesTarget extends Backend {
  /** Its settings: how a command inside it runs waffle. */
  readonly config: SandboxConfig;
}

/** The library's files API of one sandbox (`sandbox.files`). */
export interface SandboxFiles {
  /**
   * Writes a file (a fresh file renamed onto `path` when complete).
   *
   * @param path Inside the sandbox; relative paths are under the workspace.
   * @param data The bytes, or a stream of them.
   */
  write(path: string, data: Uint8Array | ReadableStream<Uint8Array>): Promise<void>;
  /**
   * Reads a regular file as a stream.
   *
   * @param path Inside the sandbox.
   */
  read(path: string): ReadableStream<Uint8Array>;
  /**
   * Lists a directory (or describes one non-directory); links are not followed.
   *
   * @param path Inside the sandbox.
   */
  list(path: string): Promise<FileEntry[]>;
  /**
   * Removes a file or a directory with its contents (links are not followed).
   *
   * @param path Inside the sandbox.
   */
  remove(path: string): Promise<void>;
}

/** Limits of the sessions a file transfer opens. */
const SESSION = { cwd: ".", endGraceMs: 0, idleMs: 120_000, leaseMs: 15_000 } as const;
const MAX_STDERR = 16 * 1024;

/** How a finished helper went. */
interface Finished {
  result: ExecResult;
  stdout: Uint8Array;
  stderr: string;
}

/** A command in the sandbox, run as any other (the commands' uid). */
interface SandboxCommand {
  argv: string[];
  env: Record<string, string>;
}

async function open(sandbox: FilesTarget, args: string[] | SandboxCommand): Promise<QueueSession> {
  const { argv, env } = Array.isArray(args)
    ? sandboxWaffleCommand(sandbox.config, ["files", ...args])
    : args;
  return await QueueSession.open(sandbox, { argv, env, ...SESSION }, waitOf(sandbox));
}

function waitOf(sandbox: FilesTarget): WaitOptions {
  return { revive: (trouble) => sandbox.ensure(trouble) };
}

/**
 * The one-line error a failed helper stands for: its own `waffle: …` line
 * (the sandbox's words, cleaned and capped), or what the runner said.
 */
function failure(verb: string, path: string, finished: Finished): FilesError {
  const { result, stderr } = finished;
  const line = stderr.split("\n").reverse().find((l) => l.startsWith("waffle: "));
  if (line !== undefined) {
    return new FilesError(escapeControls(line.slice(8)).slice(0, 400));
  }
  const why = result.error ?? (result.timedOut ? "timed out" : result.cancelled ? "cancelled" : "");
  const first = escapeControls(stderr.split("\n")[0] ?? "").slice(0, 200);
  return new FilesError(
    `File transfer '${verb}' of '${path}' failed in the sandbox (exit ${result.exitCode}${
      result.signal ? `, ${result.signal}` : ""
    })${why ? `: ${why}` : first ? `: ${first}` : ""}`,
  );
}

/**
 * A session's stdout chunks; its result and the first 16 KiB of its stderr
 * on the return value.
 */
async function* stdoutOf(
  session: QueueSession,
  borrowed = false,
): AsyncGenerator<Uint8Array, { result: ExecResult; stderr: string }> {
  let stderr = "";
  const decoder = new TextDecoder();
  const output = session.output({ borrowed });
  let next = await output.next();
  while (!next.done) {
    const { stream, data } = next.value;
    if (stream === "stdout") yield data;
    else if (stderr.length < MAX_STDERR) stderr += decoder.decode(data).slice(0, MAX_STDERR);
    next = await output.next();
  }
  return { result: next.value, stderr };
}

/**
 * Drains a session's output: stdout to `onStdout` (or kept, up to
 * `keepStdout` bytes), stderr kept up to 16 KiB.
 */
async function drain(
  session: QueueSession,
  onStdout?: (chunk: Uint8Array) => Promise<void> | void,
  keepStdout = 1024 * 1024,
): Promise<Finished> {
  const kept: Uint8Array[] = [];
  let keptBytes = 0;
  const output = stdoutOf(session);
  let next = await output.next();
  while (!next.done) {
    const data = next.value;
    if (onStdout !== undefined) await onStdout(data);
    else {
      keptBytes += data.byteLength;
      if (keptBytes > keepStdout) {
        throw new FilesError(`The sandbox's answer exceeds ${keepStdout} bytes`);
      }
      kept.push(data.slice());
    }
    next = await output.next();
  }
  return { ...next.value, stdout: concat(kept) };
}

/**
 * Streams bytes into a `waffle files` helper's stdin while draining its
 * output, and fails with the helper's one-line error.
 *
 * @param sandbox The sandbox.
 * @param args The helper's arguments after `files` (its verb and path name
 *   its failure), or another command with the verb and path it stands for.
 * @param data What its stdin gets.
 * @param keepStdout The most bytes of stdout kept (past it: an error; 1 MiB by default).
 * @returns Its stdout.
 */
async function feed(
  sandbox: FilesTarget,
  args: string[] | SandboxCommand & { verb: string; path: string },
  data: AsyncIterable<Uint8Array>,
  keepStdout?: number,
): Promise<Uint8Array> {
  const [verb, path] = Array.isArray(args) ? args : [args.verb, args.path];
  const session = await open(sandbox, args);
  let ended = false;
  try {
    const drained = drain(session, undefined, keepStdout).finally(() => {
      ended = true;
    });
    drained.catch(() => {});
    try {
      for await (const chunk of data) {
        if (ended) break;
        await session.write(chunk);
      }
      if (!ended) await session.end();
    } catch (error) {
      await session.cancel().catch(() => {});
      await drained.catch(() => {});
      throw error;
    }
    const finished = await drained;
    if (finished.result.exitCode !== 0) throw failure(verb!, path!, finished);
    return finished.stdout;
  } finally {
    await session.close();
  }
}

/**
 * A `waffle files` helper's stdout as a stream; it fails at its end when the
 * helper failed. Leaving early cancels the helper.
 *
 * @param sandbox The sandbox.
 * @param args The helper's arguments after `files`.
 * @param options `borrowed`: each chunk is valid only until the next is
 *   asked for (no copy per chunk), for a reader that uses or copies it first.
 * @returns Its stdout.
 */
export async function* helperOutput(
  sandbox: FilesTarget,
  args: string[],
  options: { borrowed?: boolean } = {},
): AsyncGenerator<Uint8Array> {
  const session = await open(sandbox, args);
  let finishedCleanly = false;
  try {
    await session.end();
    const { result, stderr } = yield* stdoutOf(session, options.borrowed === true);
    finishedCleanly = true;
    if (result.exitCode !== 0) {
      throw failure(args[0]!, args[1]!, { result, stdout: new Uint8Array(), stderr });
    }
  } finally {
    if (!finishedCleanly) await session.cancel().catch(() => {});
    await session.close();
  }
}

/** What the in-sandbox unpack reports. */
export interface Unpacked {
  /** Regular files written. */
  files: number;
  /** Directories made. */
  directories: number;
  /** Bytes of file data. */
  bytes: number;
  /** Symbolic links made (as links). */
  links: number;
  /** Symbolic links left out (`links: "skip"`). */
  skippedLinks: number;
  /** Entries whose setuid, setgid or sticky bit was stripped. */
  stripped: string[];
}

const count = z.int().check(z.nonnegative(), z.lte(Number.MAX_SAFE_INTEGER));
const unpackedSchema = z.object({
  files: count,
  directories: count,
  bytes: z.number().check(z.nonnegative()),
  links: count,
  skippedLinks: count,
  stripped: z.array(z.string().check(z.maxLength(4096))).check(z.maxLength(100_000)),
});

/** Options of {@linkcode unpackInSandbox}. */
export interface UnpackOptions {
  /** The destination inside the sandbox. */
  dest: string;
  /**
   * The archive's one top-level name; omitted: every top-level entry goes
   * into `dest`, an existing directory.
   */
  rootName?: string;
  /**
   * `copy` (the default): symlink entries are made as links (target
   * unchanged, never followed). `skip`: the sandbox leaves them out, counted.
   */
  links?: LinkPolicy;
}

/**
 * Streams a tar archive into the sandbox, where `waffle files unpack` extracts
 * it as the commands' uid (files, directories and symbolic links as links;
 * into a new directory renamed into place at the end, so a full quota leaves
 * nothing).
 *
 * @param sandbox The sandbox.
 * @param tar The archive.
 * @param options Where it goes, its root name, what to do with links.
 * @returns What the sandbox says it wrote (its counts: informative only).
 */
export async function unpackInSandbox(
  sandbox: FilesTarget,
  tar: AsyncIterable<Uint8Array>,
  options: UnpackOptions,
): Promise<Unpacked> {
  const { dest, rootName } = options;
  const stdout = await feed(
    sandbox,
    [
      "unpack",
      dest,
      ...(rootName === undefined ? [] : ["--name", rootName]),
      ...(options.links === "skip" ? ["--no-links"] : []),
    ],
    tar,
  );
  try {
    return unpackedSchema.parse(JSON.parse(new TextDecoder().decode(stdout)));
  } catch {
    throw new FilesError(`The sandbox's report of the copy to '${dest}' is malformed`);
  }
}

/**
 * Packs a path inside the sandbox (`waffle files pack`, never following a
 * link there: a link is packed as a link entry with its target) and streams
 * the tar archive out: untrusted, for `extractTar` to check (it skips links
 * when asked to; the sandbox always sends them).
 *
 * @param sandbox The sandbox.
 * @param path The path inside the sandbox.
 * @param rootName The name its entries are under.
 * @returns The archive's bytes; each chunk valid only until the next is
 *   asked for (`readTar` uses or copies it first).
 */
export function packInSandbox(
  sandbox: FilesTarget,
  path: string,
  rootName: string,
): AsyncGenerator<Uint8Array> {
  return helperOutput(sandbox, ["pack", path, "--name", rootName], { borrowed: true });
}

async function* chunksOf(
  data: Uint8Array | ReadableStream<Uint8Array>,
): AsyncGenerator<Uint8Array> {
  if (data instanceof Uint8Array) {
    for (let at = 0; at < data.byteLength; at += 1024 * 1024) {
      yield data.subarray(at, at + 1024 * 1024);
    }
  } else yield* data;
}

/**
 * Writes a file in the sandbox.
 *
 * @param sandbox The sandbox.
 * @param path Inside the sandbox (relative: under the workspace).
 * @param data The bytes or a stream of them.
 */
export async function writeFile(
  sandbox: FilesTarget,
  path: string,
  data: Uint8Array | ReadableStream<Uint8Array>,
  options: WriteOptions = {},
): Promise<void> {
  const metadata = options.metadata ?? {};
  const problem = metadataProblem(metadata);
  if (problem !== undefined) throw new FilesError(problem);
  const flags = Object.keys(metadata).length > 0 ? ["--metadata", JSON.stringify(metadata)] : [];
  await feed(sandbox, ["write", path, ...flags], chunksOf(data));
}

/** Options of {@linkcode writeFile}. */
export interface WriteOptions {
  /**
   * The file's metadata (see `metadata.ts`): set on the fresh file before it
   * is renamed onto the path, so the file has exactly these.
   */
  metadata?: Record<string, string>;
}

/** The most bytes of metadata one `readMetadata` takes back. */
const METADATA_ANSWER_BYTES = 16 * 1024 * 1024;

const metadataAnswerSchema = z.record(z.string().check(z.regex(/^\d{1,9}$/)), reportedSchema);

/** Options of {@linkcode readMetadata}. */
export interface ReadMetadataOptions {
  /** How an error names a path (as given by default). */
  shown?: (path: string) => string;
  /**
   * Which in-sandbox reader answers: `kit` (the default), the runtime kit's
   * static reader (`image/metadata_helper.c`) when the sandbox's kit has one,
   * else `waffle files metadata`; `waffle`: always `waffle files metadata`
   * (a Deno start; the tests hold the two to the same answer).
   */
  via?: "kit" | "waffle";
}

/**
 * The metadata of files in the sandbox, read there as the commands' uid
 * (bounded, checked again here, bytes outside printable ASCII escaped). The
 * reader is a command like any other, never following a path's last
 * component; both readers give the same answer, decoded by `metadata.ts`.
 *
 * @param sandbox The sandbox.
 * @param paths Absolute paths inside the sandbox.
 * @param options How errors name paths; which reader.
 * @returns Each path's metadata (empty when it has none or cannot have any).
 * @throws {FilesError} When a file's metadata is over the limits, or the answer is malformed or too large.
 */
export async function readMetadata(
  sandbox: FilesTarget,
  paths: string[],
  options: ReadMetadataOptions = {},
): Promise<Record<string, string>[]> {
  if (paths.some((path) => path.includes("\0"))) {
    throw new FilesError("A path cannot hold a NUL byte");
  }
  const input = new TextEncoder().encode(paths.map((path) => `${path}\0`).join(""));
  // The kit's reader costs what a small command costs; Deno's start, ~80 ms more.
  const reader = options.via === "waffle" ? undefined : sandboxMetadataReader(sandbox.config);
  const command = reader === undefined ? ["metadata", "-"] : {
    // The rules' owner (metadata.ts) hands the reader its prefix and limits.
    argv: [reader, METADATA_PREFIX, String(METADATA_BYTES), String(METADATA_KEYS)],
    env: {},
    verb: "metadata",
    path: "-",
  };
  const out = await feed(sandbox, command, chunksOf(input), METADATA_ANSWER_BYTES);
  let answer;
  try {
    answer = metadataAnswerSchema.parse(JSON.parse(new TextDecoder().decode(out)));
  } catch {
    throw new FilesError("The sandbox's answer about metadata is malformed");
  }
  const result = paths.map(() => ({}));
  for (const [index, reported] of Object.entries(answer)) {
    const path = paths[Number(index)];
    if (path === undefined) {
      throw new FilesError("The sandbox's answer about metadata is malformed");
    }
    result[Number(index)] = decodeMetadata(reported, options.shown?.(path) ?? path);
  }
  return result;
}

/**
 * Reads a regular file in the sandbox as a stream (it errors at its end when
 * the file could not be read).
 *
 * @param sandbox The sandbox.
 * @param path Inside the sandbox.
 * @returns The file's bytes.
 */
export function readFile(sandbox: FilesTarget, path: string): ReadableStream<Uint8Array> {
  return ReadableStream.from(helperOutput(sandbox, ["read", path]));
}

/**
 * Lists a directory in the sandbox (at most 100,000 entries), or describes a
 * single entry.
 *
 * @param sandbox The sandbox.
 * @param path Inside the sandbox.
 * @returns Entries by name.
 */
export async function listFiles(sandbox: FilesTarget, path: string): Promise<FileEntry[]> {
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  for await (const chunk of helperOutput(sandbox, ["list", path])) {
    bytes += chunk.byteLength;
    if (bytes > 32 * 1024 * 1024) throw new FilesError(`The listing of '${path}' is too large`);
    chunks.push(chunk.slice());
  }
  const text = new TextDecoder().decode(await new Blob(chunks as BlobPart[]).arrayBuffer());
  try {
    return z.array(entrySchema).check(z.maxLength(100_000)).parse(JSON.parse(text));
  } catch {
    throw new FilesError(`The sandbox's listing of '${path}' is malformed`);
  }
}

/**
 * Removes a file, or a directory with its contents, in the sandbox.
 *
 * @param sandbox The sandbox.
 * @param path Inside the sandbox.
 */
export async function removeFile(sandbox: FilesTarget, path: string): Promise<void> {
  for await (const _ of helperOutput(sandbox, ["remove", path])) {
    // nothing is printed
  }
}

/**
 * The files API bound to one sandbox.
 *
 * @param sandbox The sandbox.
 * @returns `write`, `read`, `list` and `remove`.
 */
export function sandboxFiles(sandbox: FilesTarget): SandboxFiles {
  return {
    write: (path, data) => writeFile(sandbox, path, data),
    read: (path) => readFile(sandbox, path),
    list: (path) => listFiles(sandbox, path),
    remove: (path) => removeFile(sandbox, path),
  };
}
