/**
 * Extracts a tar stream that is not trusted, for both sides of `waffle cp`:
 * the host extracting what a sandbox sent (a copy out), and `waffle files
 * unpack` inside the sandbox (a copy in, as the commands' uid).
 *
 * Only regular files, directories and symbolic links are created; anything
 * else (a hard link, a FIFO, a device, an unknown kind), a name that is
 * absolute or has `..`, `.` or empty components, a name outside the copied
 * root, a duplicate, or a copy over the limits refuses the whole copy with
 * one line naming the entry. A symbolic link is data: made as a link with
 * its target text unchanged (checked: not empty, no NUL, at most 4095
 * bytes), never followed, and an entry under a link the copy made itself
 * (`d -> /etc`, then `d/passwd`) refuses the copy, so nothing is ever
 * written through one. Setuid, setgid and sticky bits are stripped
 * (reported). Everything is created fresh (`O_CREAT|O_EXCL`, `mkdir`,
 * `symlink`) in a new directory made for this copy next to the destination,
 * whose every directory the extraction made itself, so no existing tree (and
 * no link in it) is ever walked; the result is renamed into place at the
 * end, and on any failure the new directory is removed and nothing is left.
 *
 * @module
 */
import * as z from "../schema.ts";
import { writeAll } from "../bytes.ts";
import { FilesError } from "../errors.ts";
import { basename, dirname } from "../path.ts";
import { type LinkPolicy, newStats, type PackStats } from "./pack.ts";
import { readTar, type TarHeader } from "./tar.ts";

/** Default cap on the file data one copy may extract (bytes). */
export const DEFAULT_MAX_BYTES = 64 * 1024 ** 3;
/** Default cap on the entries one copy may extract. */
export const DEFAULT_MAX_ENTRIES = 1_000_000;
/** Names kept in memory for one copy (the tree made so far), at most: a sandbox sets their length. */
const MAX_KEPT_NAME_BYTES = 64 * 1024 * 1024;
/** Stripped entries named, at most; the rest are counted. */
const MAX_STRIPPED_NAMED = 100;

/** Options of {@linkcode extractTar}. */
export interface ExtractOptions {
  /**
   * The one top-level name the archive must hold (the copied file or
   * directory); it lands at the destination (or inside it, when that is a
   * directory). Undefined: every top-level entry goes into the destination
   * directory, which must exist (`waffle cp - USER:DIR`).
   */
  rootName?: string;
  /** Refuse the copy past this many bytes of file data. */
  maxBytes?: number;
  /** Refuse the copy past this many entries. */
  maxEntries?: number;
  /** Sees each file's data as it is written. */
  onFileData?: (chunk: Uint8Array) => void;
  /** Totals, updated as the extraction goes. */
  stats?: PackStats;
  /**
   * `copy` (the default): a symlink entry is made as a link. `skip`: it is
   * checked, left out and counted in `stats.skippedLinks`.
   */
  links?: LinkPolicy;
}

/** What an extraction did. */
export interface Extracted {
  /** Files, directories and bytes. */
  stats: PackStats;
  /** Entries whose setuid, setgid or sticky bit was stripped. */
  stripped: string[];
  /** The paths created. */
  created: string[];
}

const describe: Record<string, string> = {
  hardlink: "a hard link",
  char: "a character device",
  block: "a block device",
  fifo: "a FIFO",
};

/**
 * Validates an entry's name: relative, no NUL, no `.`/`..`/empty component.
 *
 * @param raw The name as the archive has it.
 * @returns Its components, or an empty list for the archive's own `.`.
 * @throws {FilesError} On an unsafe name.
 */
export function entryComponents(raw: string): string[] {
  const shown = raw.slice(0, 200);
  if (raw.includes("\0")) throw new FilesError(`Refused entry '${shown}': NUL in its name`);
  if (raw.startsWith("/")) throw new FilesError(`Refused entry '${shown}': an absolute name`);
  let name = raw.replace(/\/+$/, "");
  while (name.startsWith("./")) name = name.slice(2).replace(/^\/+/, "");
  if (name === "" || name === ".") return [];
  const parts = name.split("/");
  for (const part of parts) {
    if (part === "..") throw new FilesError(`Refused entry '${shown}': '..' in its name`);
    if (part === "" || part === ".") {
      throw new FilesError(`Refused entry '${shown}': an empty or '.' component`);
    }
    if (new TextEncoder().encode(part).byteLength > 255) {
      throw new FilesError(`Refused entry '${shown}': a name component over 255 bytes`);
    }
  }
  return parts;
}

/**
 * Checks an entry's kind: only regular files, directories and symbolic links
 * are extracted.
 *
 * @param header The entry.
 * @throws {FilesError} Naming the entry and what it is.
 */
export function refuseSpecial(header: TarHeader): void {
  if (header.type === "file" || header.type === "directory" || header.type === "symlink") return;
  const what = describe[header.type] ?? `an entry of unknown type '${header.flag}'`;
  const target = header.linkname === "" ? "" : ` to '${header.linkname.slice(0, 200)}'`;
  throw new FilesError(
    `Refused entry '${header.name.slice(0, 200)}': ${what}${target}; ` +
      "waffle cp copies regular files, directories and symbolic links only",
  );
}

/** Longest symlink target accepted (bytes): Linux's PATH_MAX less its NUL. */
export const MAX_LINK_TARGET_BYTES = 4095;

const encoder = new TextEncoder();

/** A symlink's target as it may be made: not empty, no NUL, bounded. */
const linkTargetSchema = z.string().check(
  z.minLength(1, "an empty target"),
  z.refine((target) => !target.includes("\0"), "NUL in its target"),
  z.refine(
    (target) => encoder.encode(target).byteLength <= MAX_LINK_TARGET_BYTES,
    `a target over ${MAX_LINK_TARGET_BYTES} bytes`,
  ),
);

/**
 * A symlink entry's target, checked (the archive came from the other side,
 * which is not trusted); its text is kept as is, never resolved.
 *
 * @param header A symlink entry.
 * @returns Its target.
 * @throws {FilesError} On an empty target, a NUL or one over 4095 bytes.
 */
export function linkTarget(header: TarHeader): string {
  const parsed = linkTargetSchema.safeParse(header.linkname);
  if (!parsed.success) {
    throw new FilesError(
      `Refused entry '${header.name.slice(0, 200)}': a symbolic link with ${
        parsed.error.issues[0]?.message ?? "a malformed target"
      }`,
    );
  }
  return parsed.data;
}

/**
 * Turns a file-system error into a one-line {@linkcode FilesError}.
 *
 * @param error The error.
 * @param path The path it concerns.
 * @returns The error to throw.
 */
export function fsError(error: unknown, path: string): Error {
  if (error instanceof FilesError) return error;
  const message = error instanceof Error ? error.message : String(error);
  if (/os error 28|No space left|os error 122|quota/i.test(message)) {
    return new FilesError(`No space left writing '${path}': the disk quota is full`, {
      cause: error,
    });
  }
  if (error instanceof Deno.errors.PermissionDenied) {
    return new FilesError(`Permission denied writing '${path}'`, { cause: error });
  }
  if (error instanceof Deno.errors.NotFound) {
    return new FilesError(`No such file or directory '${path}'`, { cause: error });
  }
  return new FilesError(`Cannot write '${path}': ${message.split("\n")[0]}`, { cause: error });
}

function lstatOrNull(path: string): Deno.FileInfo | null {
  try {
    return Deno.lstatSync(path);
  } catch {
    return null;
  }
}

function statOrNull(path: string): Deno.FileInfo | null {
  try {
    return Deno.statSync(path);
  } catch {
    return null;
  }
}

/**
 * Extracts an archive into a destination (see the module's rules).
 *
 * @param source The archive's bytes.
 * @param target The destination path as given.
 * @param options The expected root, limits, observers.
 * @returns What was extracted.
 * @throws {FilesError} When an entry is refused, a limit is passed, the
 *   stream is malformed, or the file system fails; nothing is left then.
 */
export async function extractTar(
  source: AsyncIterable<Uint8Array>,
  target: string,
  options: ExtractOptions = {},
): Promise<Extracted> {
  const maxBytes = options.maxBytes ?? DEFAULT_MAX_BYTES;
  const maxEntries = options.maxEntries ?? DEFAULT_MAX_ENTRIES;
  const stats = options.stats ?? newStats();
  const into = options.rootName === undefined;
  const targetInfo = statOrNull(target);
  let parent: string;
  if (targetInfo?.isDirectory) parent = target;
  else if (into) throw new FilesError(`Destination directory '${target}' does not exist`);
  else if (target.endsWith("/")) {
    throw new FilesError(`Destination directory '${target}' does not exist`);
  } else {
    parent = dirname(target);
    if (!statOrNull(parent)?.isDirectory) {
      throw new FilesError(`Destination directory '${parent}' does not exist`);
    }
  }
  const temp = `${parent}/.waffle-tmp-${crypto.randomUUID().slice(0, 12)}`;
  try {
    Deno.mkdirSync(temp, { mode: 0o700 });
  } catch (error) {
    throw fsError(error, parent);
  }
  const made = new Set<string>();
  // Insertion order is creation order: modes are set deepest-last-made first.
  const dirModes = new Map<string, number>();
  const stripped: string[] = [];
  let strippedMore = 0;
  let keptBytes = 0;
  const keep = (relative: string): void => {
    keptBytes += relative.length;
    if (keptBytes > MAX_KEPT_NAME_BYTES) {
      throw new FilesError(`Refused the copy: its names exceed ${MAX_KEPT_NAME_BYTES} bytes`);
    }
  };
  const roots = new Map<string, "file" | "directory" | "link">();
  // The links this copy made: nothing is ever made under one.
  const links = new LinkGuard();
  let entries = 0;
  const mkdirFresh = (relative: string, mode: number): void => {
    try {
      Deno.mkdirSync(`${temp}/${relative}`, { mode });
    } catch (error) {
      if (error instanceof Deno.errors.AlreadyExists) {
        throw new FilesError(`Refused entry '${relative}': it appears twice in the archive`);
      }
      throw fsError(error, relative);
    }
    keep(relative);
    made.add(relative);
  };
  const parents = (parts: string[]): void => {
    let prefix = "";
    for (let i = 1; i < parts.length; i++) {
      prefix = i === 1 ? parts[0]! : `${prefix}/${parts[i - 1]}`;
      if (made.has(prefix)) continue;
      if (links.has(prefix)) throw underLink(parts, prefix);
      if (i === 1) roots.set(prefix, "directory");
      mkdirFresh(prefix, 0o700);
      dirModes.set(prefix, 0o755);
    }
  };
  try {
    for await (const { header, body } of readTar(source)) {
      const parts = entryComponents(header.name);
      if (parts.length === 0) {
        if (header.type !== "directory") refuseSpecial({ ...header, type: "other" });
        continue;
      }
      refuseSpecial(header);
      if (++entries > maxEntries) {
        throw new FilesError(`Refused the copy: more than ${maxEntries} entries`);
      }
      if (!into && parts[0] !== options.rootName) {
        throw new FilesError(
          `Refused entry '${header.name.slice(0, 200)}': outside the copied '${options.rootName}'`,
        );
      }
      const relative = parts.join("/");
      if (header.type === "symlink") {
        const target = linkTarget(header);
        if (options.links === "skip") {
          stats.skippedLinks++;
          continue;
        }
        parents(parts);
        claimRoot(roots, parts, "link");
        makeLink(target, temp, relative);
        links.add(relative);
        stats.links++;
        continue;
      }
      if ((header.mode & 0o7000) !== 0) {
        if (stripped.length < MAX_STRIPPED_NAMED) stripped.push(relative);
        else strippedMore++;
      }
      const mode = header.mode & 0o777;
      if (header.type === "directory") {
        if (parts.length === 1 && roots.has(relative) && roots.get(relative) !== "directory") {
          throw new FilesError(`Refused entry '${relative}': it appears twice in the archive`);
        }
        if (parts.length === 1) roots.set(relative, "directory");
        parents(parts);
        if (made.has(relative)) {
          // Made as a parent before its own entry: only its mode is its own.
          if (dirModes.has(relative)) dirModes.set(relative, mode);
        } else {
          mkdirFresh(relative, 0o700);
          dirModes.set(relative, mode);
        }
        stats.directories++;
        continue;
      }
      if (stats.bytes + header.size > maxBytes) {
        throw new FilesError(
          `Refused entry '${relative}': the copy would exceed ${maxBytes} bytes`,
        );
      }
      parents(parts);
      claimRoot(roots, parts, "file");
      let file: Deno.FsFile;
      try {
        // O_CREAT|O_EXCL: a fresh file; never an existing one, never through a link.
        file = await Deno.open(`${temp}/${relative}`, { write: true, createNew: true, mode });
      } catch (error) {
        if (error instanceof Deno.errors.AlreadyExists) {
          throw new FilesError(`Refused entry '${relative}': it appears twice in the archive`);
        }
        throw fsError(error, relative);
      }
      try {
        await writeBody(file, body, options.onFileData);
        const when = new Date(header.mtime * 1000);
        await file.utime(when, when);
      } catch (error) {
        throw fsError(error, relative);
      } finally {
        file.close();
      }
      stats.files++;
      stats.bytes += header.size;
    }
    if (roots.size === 0 && !into) {
      throw new FilesError(
        stats.skippedLinks > 0
          ? "Nothing was copied: the copy held only a symbolic link, skipped"
          : "The copy is empty: no entries arrived",
      );
    }
    // Deepest first, so a read-only directory does not block its children.
    for (const [relative, mode] of [...dirModes].reverse()) {
      Deno.chmodSync(`${temp}/${relative}`, mode);
    }
    const created: string[] = [];
    for (const [root, kind] of roots) {
      const final = into || targetInfo?.isDirectory ? `${parent}/${root}` : target;
      const existing = lstatOrNull(final);
      if (existing !== null && (existing.isDirectory || kind === "directory")) {
        throw new FilesError(
          `Destination '${final}' already exists${
            existing.isDirectory ? " as a directory" : ""
          }; waffle cp never merges into or replaces a directory`,
        );
      }
      try {
        // rename(2) replaces an existing file (or symlink) atomically, never following it.
        Deno.renameSync(`${temp}/${root}`, final);
      } catch (error) {
        throw fsError(error, final);
      }
      created.push(final);
    }
    if (strippedMore > 0) stripped.push(`… and ${strippedMore} more`);
    return { stats, stripped, created };
  } finally {
    await Deno.remove(temp, { recursive: true }).catch(() => {});
  }
}

/**
 * The symbolic links one copy made (or wrote to a stream), by archive name:
 * no later entry of the copy may be under one (`d -> /etc`, then
 * `d/passwd`), so nothing is ever written through a link. Its names are
 * capped at 64 MiB in all (the other side sets their length).
 */
export class LinkGuard {
  #links = new Set<string>();
  #bytes = 0;

  /** How many links were added. */
  get size(): number {
    return this.#links.size;
  }

  /**
   * Records a link the copy made.
   *
   * @param relative Its name in the archive (components joined by `/`).
   * @throws {FilesError} When the names kept pass 64 MiB.
   */
  add(relative: string): void {
    this.#bytes += relative.length;
    if (this.#bytes > MAX_KEPT_NAME_BYTES) {
      throw new FilesError(`Refused the copy: its names exceed ${MAX_KEPT_NAME_BYTES} bytes`);
    }
    this.#links.add(relative);
  }

  /**
   * Whether a name is one of the links.
   *
   * @param relative A name in the archive.
   * @returns True when the copy made a link by that name.
   */
  has(relative: string): boolean {
    return this.#links.has(relative);
  }

  /**
   * Refuses an entry under a link the copy made.
   *
   * @param parts The entry's name components.
   * @throws {FilesError} Naming the entry and the link.
   */
  check(parts: readonly string[]): void {
    if (this.#links.size === 0) return;
    let prefix = "";
    for (let i = 0; i < parts.length - 1; i++) {
      prefix = i === 0 ? parts[0]! : `${prefix}/${parts[i]}`;
      if (this.#links.has(prefix)) throw underLink(parts, prefix);
    }
  }
}

function underLink(parts: readonly string[], link: string): FilesError {
  return new FilesError(
    `Refused entry '${parts.join("/").slice(0, 200)}': under '${
      link.slice(0, 200)
    }', a symbolic link this copy made`,
  );
}

// A top-level entry that is not a directory: its name is claimed once.
function claimRoot(
  roots: Map<string, "file" | "directory" | "link">,
  parts: string[],
  kind: "file" | "link",
): void {
  if (parts.length !== 1) return;
  if (roots.has(parts[0]!)) {
    throw new FilesError(`Refused entry '${parts[0]}': it appears twice in the archive`);
  }
  roots.set(parts[0]!, kind);
}

// A fresh symlink (symlink(2) never follows or replaces what is there).
function makeLink(target: string, temp: string, relative: string): void {
  try {
    Deno.symlinkSync(target, `${temp}/${relative}`);
  } catch (error) {
    if (error instanceof Deno.errors.AlreadyExists) {
      throw new FilesError(`Refused entry '${relative}': it appears twice in the archive`);
    }
    throw fsError(error, relative);
  }
}

/** Bytes gathered before one write: a stream's chunks are often 64 KiB, and each write is a thread hop. */
const WRITE_BYTES = 1024 * 1024;

// Writes an entry's data in writes of WRITE_BYTES (one buffer, reused).
async function writeBody(
  file: Deno.FsFile,
  body: AsyncIterable<Uint8Array>,
  onFileData: ((chunk: Uint8Array) => void) | undefined,
): Promise<void> {
  let buffer: Uint8Array | undefined;
  let filled = 0;
  for await (const chunk of body) {
    onFileData?.(chunk);
    if (chunk.byteLength >= WRITE_BYTES) {
      if (filled > 0) await writeAll(file, buffer!.subarray(0, filled));
      filled = 0;
      await writeAll(file, chunk);
      continue;
    }
    buffer ??= new Uint8Array(WRITE_BYTES);
    if (filled + chunk.byteLength > WRITE_BYTES) {
      await writeAll(file, buffer.subarray(0, filled));
      filled = 0;
    }
    buffer.set(chunk, filled);
    filled += chunk.byteLength;
  }
  if (filled > 0) await writeAll(file, buffer!.subarray(0, filled));
}

/**
 * The archive root name of a path: its last component.
 *
 * @param path A path.
 * @param fallback Used when the path has no usable last component (`/`, `.`).
 * @returns A single safe component.
 */
export function rootNameOf(path: string, fallback: string): string {
  const name = basename(path.replace(/\/+$/, "").replace(/\/\.$/, ""));
  return name === "" || name === "." || name === ".." || name === "/" ? fallback : name;
}
