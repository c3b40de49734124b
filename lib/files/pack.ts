/**
 * Packs a file or directory tree into a tar stream, never following a
 * symlink (a link is packed as a link: its target text, never what it points
 * at): the host packs its own files for a copy in, and `waffle files pack`
 * packs the sandbox's as the commands' uid for a copy out.
 *
 * @module
 */
import { FilesError } from "../errors.ts";
import { padding, TAR_END, type TarEntryInfo, tarHeader, type TarType } from "./tar.ts";

/** Read size for file data. */
export const READ_CHUNK = 1024 * 1024;

/** Options of {@linkcode packTree}. */
export interface PackOptions {
  /**
   * `refuse`: a FIFO, device or socket fails the pack, naming it (the host's
   * own files). `emit`: it is written as a header of its kind and never
   * opened, for the other side to refuse (inside the sandbox).
   */
  special: "refuse" | "emit";
  /**
   * `copy` (the default): a symlink is packed as a link entry carrying its
   * target text. `skip`: it is left out and counted in `stats.skippedLinks`.
   */
  links?: LinkPolicy;
  /** Sees each file's data as it is packed (for a single file's digest). */
  onFileData?: (chunk: Uint8Array) => void;
  /** Totals, updated as the pack goes. */
  stats?: PackStats;
}

/** What a copy does with a symbolic link: copies it as a link, or leaves it out (counted). */
export type LinkPolicy = "copy" | "skip";

/** What a pack or an extraction moved. */
export interface PackStats {
  /** Regular files. */
  files: number;
  /** Directories. */
  directories: number;
  /** Bytes of file data. */
  bytes: number;
  /** Symbolic links copied (as links). */
  links: number;
  /** Symbolic links left out (`links: "skip"`, `--no-links`). */
  skippedLinks: number;
}

/** A fresh zeroed {@linkcode PackStats}. */
export function newStats(): PackStats {
  return { files: 0, directories: 0, bytes: 0, links: 0, skippedLinks: 0 };
}

function kindOf(info: Deno.FileInfo): TarType | "socket" | "unknown" {
  if (info.isSymlink) return "symlink";
  if (info.isFile) return "file";
  if (info.isDirectory) return "directory";
  if (info.isFifo) return "fifo";
  if (info.isCharDevice) return "char";
  if (info.isBlockDevice) return "block";
  if (info.isSocket) return "socket";
  return "unknown";
}

function seconds(date: Date | null): number {
  return date === null ? 0 : Math.floor(date.getTime() / 1000);
}

/**
 * Packs `path` (not followed if it is a symlink) as the archive entry `name`,
 * and a directory's contents recursively under it, in name order.
 *
 * @param path The file or directory to pack.
 * @param name Its name in the archive (one path component).
 * @param options What to do with special files; a data observer.
 * @returns The archive's bytes, the end blocks included; a chunk of file
 *   data is valid only until the next is asked for (one buffer per file).
 * @throws {FilesError} When the path is missing, a special file is refused,
 *   or a file changes while it is read.
 */
export async function* packTree(
  path: string,
  name: string,
  options: PackOptions,
): AsyncGenerator<Uint8Array> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.lstat(path);
  } catch (error) {
    throw notFound(path, error);
  }
  yield* packEntry(path, name, info, options);
  yield TAR_END;
}

function notFound(path: string, error: unknown): FilesError {
  if (error instanceof Deno.errors.NotFound) {
    return new FilesError(`No such file or directory '${path}'`, { cause: error });
  }
  if (error instanceof Deno.errors.PermissionDenied) {
    return new FilesError(`Permission denied reading '${path}'`, { cause: error });
  }
  return new FilesError(
    `Cannot read '${path}': ${error instanceof Error ? error.message : String(error)}`,
    { cause: error },
  );
}

async function* packEntry(
  path: string,
  name: string,
  info: Deno.FileInfo,
  options: PackOptions,
): AsyncGenerator<Uint8Array> {
  const kind = kindOf(info);
  const base: Omit<TarEntryInfo, "type"> = {
    name,
    size: 0,
    mode: (info.mode ?? 0o644) & 0o7777,
    mtime: seconds(info.mtime),
  };
  if (kind === "directory") {
    options.stats && options.stats.directories++;
    yield tarHeader({ ...base, type: "directory" });
    let children: string[];
    try {
      children = [];
      for await (const child of Deno.readDir(path)) children.push(child.name);
    } catch (error) {
      throw notFound(path, error);
    }
    // readDir follows a link: a directory swapped for one since lstat would
    // list the link's target (CVE-2018-15664's race). The one lstat saw, or none.
    const again = await Deno.lstat(path).catch(() => null);
    if (again === null || !again.isDirectory || again.ino !== info.ino || again.dev !== info.dev) {
      throw new FilesError(`Directory '${path}' was replaced during the copy`);
    }
    children.sort();
    for (const child of children) {
      const childPath = `${path}/${child}`;
      let childInfo: Deno.FileInfo;
      try {
        childInfo = await Deno.lstat(childPath);
      } catch (error) {
        if (error instanceof Deno.errors.NotFound) continue; // removed meanwhile
        throw notFound(childPath, error);
      }
      yield* packEntry(childPath, `${name}/${child}`, childInfo, options);
    }
    return;
  }
  if (kind === "file") {
    yield* packFile(path, info, base, options);
    return;
  }
  if (kind === "symlink") {
    yield* packLink(path, base, options);
    return;
  }
  if (options.special === "refuse" || kind === "socket" || kind === "unknown") {
    throw new FilesError(
      `Refused '${path}': a ${kind === "char" || kind === "block" ? `${kind} device` : kind}; ` +
        "waffle cp copies regular files, directories and symbolic links only",
    );
  }
  yield tarHeader({ ...base, type: kind });
}

// A symlink as a link entry: its target text (readlink), never followed.
async function* packLink(
  path: string,
  base: Omit<TarEntryInfo, "type">,
  options: PackOptions,
): AsyncGenerator<Uint8Array> {
  if (options.links === "skip") {
    options.stats && options.stats.skippedLinks++;
    return;
  }
  let linkname: string;
  try {
    linkname = await Deno.readLink(path);
  } catch (error) {
    // lstat saw a link: it was swapped for something else since.
    if (
      error instanceof Deno.errors.NotFound || /os error 22|invalid argument/i.test(String(error))
    ) {
      throw new FilesError(`Link '${path}' was replaced during the copy`, { cause: error });
    }
    throw notFound(path, error);
  }
  options.stats && options.stats.links++;
  yield tarHeader({ ...base, type: "symlink", linkname });
}

async function* packFile(
  path: string,
  info: Deno.FileInfo,
  base: Omit<TarEntryInfo, "type">,
  options: PackOptions,
): AsyncGenerator<Uint8Array> {
  let file: Deno.FsFile;
  try {
    file = await Deno.open(path, { read: true });
  } catch (error) {
    throw notFound(path, error);
  }
  try {
    // The name may have been swapped between lstat and open (a symlink, a
    // FIFO): only the very file lstat saw is read.
    const opened = await file.stat();
    if (!opened.isFile || opened.ino !== info.ino || opened.dev !== info.dev) {
      throw new FilesError(`File '${path}' was replaced during the copy`);
    }
    const size = info.size;
    options.stats && options.stats.files++;
    options.stats && (options.stats.bytes += size);
    yield tarHeader({ ...base, type: "file", size });
    let left = size;
    // One buffer for the whole file: a fresh zeroed MiB per chunk was a GiB
    // of allocation (and its faults and GC) per GiB packed.
    const buffer = new Uint8Array(Math.min(READ_CHUNK, left));
    while (left > 0) {
      const n = await file.read(buffer.subarray(0, Math.min(READ_CHUNK, left)));
      if (n === null) throw new FilesError(`File '${path}' shrank during the copy`);
      const chunk = buffer.subarray(0, n);
      options.onFileData?.(chunk);
      left -= n;
      yield chunk;
    }
    const pad = padding(size);
    if (pad.byteLength > 0) yield pad;
  } finally {
    file.close();
  }
}
