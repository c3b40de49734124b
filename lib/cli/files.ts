/**
 * `waffle files …` (internal): the half of `waffle cp` and `sandbox.files`
 * that runs inside the sandbox, as an ordinary command (the commands' uid,
 * never the runner's root), so every path inside the sandbox is resolved by
 * a process inside it and never by the host.
 *
 * @module
 */
import { FilesError, UsageError } from "../errors.ts";
import { parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";
import { basename, dirname } from "../path.ts";
import { extractTar, fsError, rootNameOf } from "../files/extract.ts";
import { packTree, READ_CHUNK } from "../files/pack.ts";
import { growPipe } from "../libc.ts";
import {
  applyMetadata,
  metadataProblem,
  metadataSchema,
  type ReportedMetadata,
  reportMetadata,
} from "../files/metadata.ts";

/** The capacity asked of the pipes to and from the runner, and the read size of stdin. */
const PIPE_BYTES = 1024 * 1024;

/** Help of the internal `waffle files`. */
export const FILES_HELP =
  `Usage: waffle files pack|unpack|read|write|list|remove|metadata PATH [options]

Internal: the in-sandbox half of 'waffle cp' and the library's sandbox.files.
It runs inside the sandbox as the commands' uid; the host streams through it.

  pack PATH [--name N]    write PATH (never followed) as a tar stream to stdout;
                          a symbolic link is packed as a link (its target)
  unpack DEST [--name N] [--no-links]
                          extract a tar stream from stdin (files, directories and
                          symbolic links as links; --no-links: links left out, counted)
  read PATH               write a regular file's bytes to stdout
  write PATH [--metadata JSON]
                          write stdin to a fresh file renamed onto PATH at the end
                          (with the metadata, a JSON object of strings, as its
                          user.e2b.* extended attributes)
  list PATH               print the entries of PATH as JSON
  remove PATH             remove PATH (a directory with its contents; links not followed)
  metadata -              for each NUL-ended path on stdin, its metadata (bounded);
                          prints a JSON object of the paths' indexes that have any
`;

function kind(info: Deno.FileInfo): string {
  if (info.isSymlink) return "symlink";
  if (info.isFile) return "file";
  if (info.isDirectory) return "directory";
  if (info.isFifo) return "fifo";
  if (info.isSocket) return "socket";
  if (info.isCharDevice || info.isBlockDevice) return "device";
  return "other";
}

function entryOf(name: string, info: Deno.FileInfo): Record<string, unknown> {
  return {
    name,
    type: kind(info),
    size: info.size,
    mode: (info.mode ?? 0) & 0o7777,
    mtime: info.mtime?.getTime() ?? 0,
  };
}

/**
 * Runs `waffle files`.
 *
 * @param args Arguments after `files`.
 * @param io Process streams.
 * @returns The exit status.
 */
export async function filesCommand(args: string[], io: CliIo): Promise<number> {
  const [verb, ...rest] = args;
  const parsed = parse(rest, {
    name: { type: "string" },
    recursive: { type: "boolean" },
    "no-links": { type: "boolean" },
    metadata: { type: "string" },
  });
  const [path, ...extra] = parsed.positionals;
  if (path === undefined || extra.length > 0) {
    throw new UsageError(`Expected one PATH: 'waffle files ${verb ?? "VERB"} PATH'`);
  }
  const name = stringFlag(parsed, "name");
  // Bulk streams: fewer handovers with the runner (best effort; a file or a
  // terminal is left alone).
  if (verb === "pack" || verb === "read") growPipe(1, PIPE_BYTES);
  if (verb === "unpack" || verb === "write") growPipe(0, PIPE_BYTES);
  switch (verb) {
    case "pack":
      for await (
        const chunk of packTree(path, name ?? rootNameOf(path, "root"), { special: "emit" })
      ) {
        await io.stdout(chunk);
      }
      return 0;
    case "unpack": {
      const result = await extractTar(input(io), path, {
        ...(name === undefined ? {} : { rootName: name }),
        links: parsed.values["no-links"] === true ? "skip" : "copy",
      });
      await io.stdout(JSON.stringify({ ...result.stats, stripped: result.stripped }) + "\n");
      return 0;
    }
    case "read":
      await readRaw(path, io);
      return 0;
    case "write":
      await writeRaw(path, io, writtenMetadata(stringFlag(parsed, "metadata")));
      return 0;
    case "metadata":
      if (path !== "-") throw new UsageError("Expected 'waffle files metadata -'");
      await io.stdout(JSON.stringify(await metadataOf(input(io))) + "\n");
      return 0;
    case "list":
      await io.stdout(JSON.stringify(await list(path)) + "\n");
      return 0;
    case "remove":
      try {
        await Deno.remove(path, { recursive: true });
      } catch (error) {
        throw fsError(error, path);
      }
      return 0;
    default:
      throw new UsageError(`Unknown 'waffle files' command '${verb ?? ""}'`);
  }
}

// Stdin in reads of up to PIPE_BYTES into one buffer: each chunk is valid
// until the next is asked for (the tar reader and writeRaw use it before).
async function* input(io: CliIo): AsyncGenerator<Uint8Array> {
  if (io.stdin === null) return;
  let reader: ReadableStreamBYOBReader;
  try {
    reader = io.stdin.getReader({ mode: "byob" });
  } catch {
    // Not a byte stream: its own chunks.
    for await (const chunk of io.stdin) yield chunk;
    return;
  }
  try {
    let buffer = new Uint8Array(PIPE_BYTES);
    while (true) {
      const { value, done } = await reader.read(buffer);
      if (done || value === undefined) return;
      yield value;
      buffer = new Uint8Array(value.buffer);
    }
  } finally {
    reader.releaseLock();
  }
}

async function list(path: string): Promise<Record<string, unknown>[]> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.lstat(path);
  } catch (error) {
    throw fsError(error, path);
  }
  if (!info.isDirectory) return [entryOf(basename(path), info)];
  const out: Record<string, unknown>[] = [];
  try {
    for await (const child of Deno.readDir(path)) {
      if (out.length >= 100_000) break;
      try {
        out.push(entryOf(child.name, await Deno.lstat(`${path}/${child.name}`)));
      } catch {
        // removed meanwhile
      }
    }
  } catch (error) {
    throw fsError(error, path);
  }
  return out.sort((a, b) => String(a.name) < String(b.name) ? -1 : 1);
}

async function readRaw(path: string, io: CliIo): Promise<void> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.lstat(path);
  } catch (error) {
    throw fsError(error, path);
  }
  if (!info.isFile) throw new FilesError(`Not a regular file '${path}': it is a ${kind(info)}`);
  const file = await Deno.open(path, { read: true }).catch((error) => {
    throw fsError(error, path);
  });
  try {
    const opened = await file.stat();
    if (opened.ino !== info.ino || opened.dev !== info.dev) {
      throw new FilesError(`File '${path}' was replaced during the copy`);
    }
    const buffer = new Uint8Array(READ_CHUNK);
    while (true) {
      const n = await file.read(buffer);
      if (n === null) break;
      await io.stdout(buffer.slice(0, n));
    }
  } finally {
    file.close();
  }
}

function writtenMetadata(json: string | undefined): Record<string, string> {
  if (json === undefined) return {};
  let parsed;
  try {
    parsed = metadataSchema.parse(JSON.parse(json));
  } catch {
    throw new UsageError("Expected '--metadata' to be a JSON object of strings");
  }
  const problem = metadataProblem(parsed);
  if (problem !== undefined) throw new UsageError(problem);
  return parsed;
}

// The paths (NUL-ended, as the host sends them) whose metadata is asked
// for; the answer names each that has any by its index.
async function metadataOf(
  chunks: AsyncIterable<Uint8Array>,
): Promise<Record<string, ReportedMetadata>> {
  const parts: Uint8Array[] = [];
  for await (const chunk of chunks) parts.push(chunk.slice());
  const paths = new TextDecoder().decode(await new Blob(parts as BlobPart[]).arrayBuffer())
    .split("\0");
  paths.pop();
  const out: Record<string, ReportedMetadata> = {};
  paths.forEach((path, index) => {
    const reported = reportMetadata(path);
    if (typeof reported === "number" || reported.length > 0) out[index] = reported;
  });
  return out;
}

async function writeRaw(
  path: string,
  io: CliIo,
  metadata: Record<string, string>,
): Promise<void> {
  const temp = `${dirname(path)}/.waffle-tmp-${crypto.randomUUID().slice(0, 12)}`;
  let file: Deno.FsFile;
  try {
    file = await Deno.open(temp, { write: true, createNew: true, mode: 0o644 });
  } catch (error) {
    throw fsError(error, path);
  }
  let done = false;
  try {
    try {
      for await (const chunk of input(io)) {
        let rest = chunk;
        while (rest.byteLength > 0) rest = rest.subarray(await file.write(rest));
      }
    } finally {
      file.close();
    }
    // On the fresh file, so the renamed one has exactly these (an
    // overwrite drops the old file's).
    applyMetadata(temp, metadata, { shown: path });
    const existing = await Deno.lstat(path).catch(() => null);
    if (existing?.isDirectory) {
      throw new FilesError(`Destination '${path}' is a directory`);
    }
    Deno.renameSync(temp, path);
    done = true;
  } catch (error) {
    throw fsError(error, path);
  } finally {
    if (!done) await Deno.remove(temp).catch(() => {});
  }
}
