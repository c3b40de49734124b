/**
 * A small streaming tar (ustar with PAX extended headers) writer and reader
 * for `waffle cp`. The reader trusts nothing: every field is parsed strictly
 * and capped before anything is allocated for it, and entries come out one at
 * a time with their body as a stream, so no file is ever held whole.
 *
 * @module
 */
import * as z from "../schema.ts";
import { FilesError } from "../errors.ts";

/** The size of a tar block. */
export const BLOCK = 512;
/** Longest entry name (bytes) either side accepts. */
export const MAX_NAME_BYTES = 4096;
/** Largest PAX extended header the reader loads. */
export const MAX_PAX_BYTES = 64 * 1024;

/** What an entry is. Only `file` and `directory` are ever extracted. */
export type TarType =
  | "file"
  | "directory"
  | "symlink"
  | "hardlink"
  | "char"
  | "block"
  | "fifo"
  | "other";

/** One entry's header, after PAX records are applied. */
export interface TarHeader {
  /** The path inside the archive, as written (not yet validated as a path). */
  name: string;
  /** Its kind. */
  type: TarType;
  /** Bytes of data that follow the header. */
  size: number;
  /** Permission bits as written (setuid, setgid and sticky included). */
  mode: number;
  /** Modification time, seconds since the epoch. */
  mtime: number;
  /** A link's target, when it is one. */
  linkname: string;
  /** The raw type flag (for messages about unknown kinds). */
  flag: string;
}

const FLAGS: Record<string, TarType> = {
  "0": "file",
  "\0": "file",
  "7": "file",
  "5": "directory",
  "2": "symlink",
  "1": "hardlink",
  "3": "char",
  "4": "block",
  "6": "fifo",
};

const TYPE_FLAGS: Partial<Record<TarType, string>> = {
  file: "0",
  directory: "5",
  symlink: "2",
  hardlink: "1",
  char: "3",
  block: "4",
  fifo: "6",
};

const headerSchema = z.object({
  name: z.string().check(z.minLength(1), z.maxLength(MAX_NAME_BYTES)),
  type: z.enum(["file", "directory", "symlink", "hardlink", "char", "block", "fifo", "other"]),
  size: z.int().check(z.nonnegative(), z.lte(Number.MAX_SAFE_INTEGER)),
  mode: z.int().check(z.nonnegative(), z.lte(0o7777777)),
  mtime: z.int().check(z.gte(-(2 ** 40)), z.lte(2 ** 40)),
  linkname: z.string().check(z.maxLength(MAX_NAME_BYTES)),
  flag: z.string().check(z.length(1)),
});

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** The two zero blocks that end an archive. */
export const TAR_END: Uint8Array = new Uint8Array(2 * BLOCK);

/**
 * The zero bytes that pad an entry's data to a whole block.
 *
 * @param size The entry's data size.
 * @returns Between 0 and 511 zero bytes.
 */
export function padding(size: number): Uint8Array {
  const rest = size % BLOCK;
  return new Uint8Array(rest === 0 ? 0 : BLOCK - rest);
}

function octal(block: Uint8Array, at: number, width: number, value: number): void {
  const digits = value.toString(8).padStart(width - 1, "0");
  block.set(encoder.encode(digits), at);
  block[at + width - 1] = 0;
}

function rawHeader(
  name: Uint8Array,
  flag: string,
  size: number,
  mode: number,
  mtime: number,
  linkname: Uint8Array,
): Uint8Array {
  const block = new Uint8Array(BLOCK);
  block.set(name.subarray(0, 100), 0);
  octal(block, 100, 8, mode & 0o7777);
  octal(block, 108, 8, 0);
  octal(block, 116, 8, 0);
  octal(block, 124, 12, size <= 0o77777777777 ? size : 0);
  octal(block, 136, 12, Math.max(0, Math.min(mtime, 0o77777777777)));
  block[156] = flag.charCodeAt(0);
  block.set(linkname.subarray(0, 100), 157);
  block.set(encoder.encode("ustar\u000000"), 257);
  block.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of block) sum += byte;
  block.set(encoder.encode(sum.toString(8).padStart(6, "0")), 148);
  block[154] = 0;
  block[155] = 0x20;
  return block;
}

function paxRecord(key: string, value: string): Uint8Array {
  const body = ` ${key}=${value}\n`;
  const bodyLength = encoder.encode(body).byteLength;
  let length = bodyLength + 1;
  while (String(length).length + bodyLength !== length) length++;
  return encoder.encode(`${length}${body}`);
}

/** What {@linkcode tarHeader} writes. */
export interface TarEntryInfo {
  /** Path inside the archive (a directory's without a trailing slash). */
  name: string;
  /** Its kind. */
  type: TarType;
  /** Data bytes (0 for anything but a file). */
  size: number;
  /** Permission bits. */
  mode: number;
  /** Modification time, seconds since the epoch. */
  mtime: number;
  /** A link's target. */
  linkname?: string;
}

/**
 * The header block(s) of one entry: a PAX extended header first when the
 * name or link target is long or not ASCII, or the size exceeds ustar's.
 *
 * @param entry The entry.
 * @returns One or more whole blocks.
 */
export function tarHeader(entry: TarEntryInfo): Uint8Array {
  const flag = TYPE_FLAGS[entry.type];
  if (flag === undefined) throw new FilesError(`Cannot write a tar entry of type '${entry.type}'`);
  const name = entry.type === "directory" ? `${entry.name}/` : entry.name;
  const nameBytes = encoder.encode(name);
  const linkBytes = encoder.encode(entry.linkname ?? "");
  const records: Uint8Array[] = [];
  // deno-lint-ignore no-control-regex -- ASCII test
  const ascii = (s: string): boolean => /^[\x01-\x7f]*$/.test(s);
  if (nameBytes.byteLength > 100 || !ascii(name)) records.push(paxRecord("path", name));
  if (linkBytes.byteLength > 100 || !ascii(entry.linkname ?? "")) {
    records.push(paxRecord("linkpath", entry.linkname ?? ""));
  }
  if (entry.size > 0o77777777777) records.push(paxRecord("size", String(entry.size)));
  const main = rawHeader(nameBytes, flag, entry.size, entry.mode, entry.mtime, linkBytes);
  if (records.length === 0) return main;
  const paxBody = concatBytes(records);
  const paxName = encoder.encode(`PaxHeaders/${ascii(name) ? name : "entry"}`.slice(0, 99));
  const pax = rawHeader(paxName, "x", paxBody.byteLength, 0o644, entry.mtime, new Uint8Array());
  return concatBytes([pax, paxBody, padding(paxBody.byteLength), main]);
}

function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  let length = 0;
  for (const part of parts) length += part.byteLength;
  const out = new Uint8Array(length);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}

/** Reads exact byte counts from a stream of chunks without copying more than needed. */
class ByteSource {
  #chunks: AsyncIterator<Uint8Array>;
  #buffer: Uint8Array = new Uint8Array(0);
  #offset = 0;
  #done = false;
  /** Bytes consumed so far. */
  position = 0;

  constructor(source: AsyncIterable<Uint8Array>) {
    this.#chunks = source[Symbol.asyncIterator]();
  }

  async #fill(): Promise<boolean> {
    while (this.#offset >= this.#buffer.byteLength) {
      if (this.#done) return false;
      const next = await this.#chunks.next();
      if (next.done) {
        this.#done = true;
        return false;
      }
      this.#buffer = next.value;
      this.#offset = 0;
    }
    return true;
  }

  /** Exactly `n` bytes (copied), or null at a clean end before the first. */
  async exact(n: number): Promise<Uint8Array | null> {
    const out = new Uint8Array(n);
    let got = 0;
    while (got < n) {
      if (!await this.#fill()) {
        if (got === 0) return null;
        throw new FilesError(`Tar stream ends inside a header at byte ${this.position}`);
      }
      const take = Math.min(n - got, this.#buffer.byteLength - this.#offset);
      out.set(this.#buffer.subarray(this.#offset, this.#offset + take), got);
      this.#offset += take;
      got += take;
      this.position += take;
    }
    return out;
  }

  /** `n` bytes as views into the chunks read (no copy). */
  async *take(n: number): AsyncGenerator<Uint8Array> {
    let left = n;
    while (left > 0) {
      if (!await this.#fill()) {
        throw new FilesError(`Tar stream ends inside an entry's data at byte ${this.position}`);
      }
      const take = Math.min(left, this.#buffer.byteLength - this.#offset);
      const view = this.#buffer.subarray(this.#offset, this.#offset + take);
      this.#offset += take;
      left -= take;
      this.position += take;
      yield view;
    }
  }

  /** Skips `n` bytes. */
  async skip(n: number): Promise<void> {
    for await (const _ of this.take(n)) {
      // discarded
    }
  }

  close(): void {
    this.#chunks.return?.().catch(() => {});
  }
}

/** An entry read from an archive: its header and its data, read once, in order. */
export interface TarItem {
  /** The header (PAX records applied), validated as a structure. */
  header: TarHeader;
  /** The entry's data; read it (or not) before asking for the next entry. */
  body: AsyncGenerator<Uint8Array>;
}

function field(block: Uint8Array, at: number, width: number): Uint8Array {
  const raw = block.subarray(at, at + width);
  const end = raw.indexOf(0);
  return end < 0 ? raw : raw.subarray(0, end);
}

function text(bytes: Uint8Array, what: string): string {
  try {
    return decoder.decode(bytes);
  } catch {
    throw new FilesError(`Tar header has a ${what} that is not UTF-8`);
  }
}

function number(block: Uint8Array, at: number, width: number, what: string): number {
  const raw = block.subarray(at, at + width);
  if ((raw[0]! & 0x80) !== 0) {
    throw new FilesError(`Tar header has a base-256 ${what}, which waffle does not accept`);
  }
  const digits = new TextDecoder().decode(field(block, at, width)).trim();
  if (!/^[0-7]*$/.test(digits) || digits.length > 12) {
    throw new FilesError(`Tar header has a malformed ${what} '${digits.slice(0, 24)}'`);
  }
  return digits === "" ? 0 : parseInt(digits, 8);
}

function checksumOk(block: Uint8Array): boolean {
  const stored = number(block, 148, 8, "checksum");
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : block[i]!;
  return sum === stored;
}

function parsePax(body: Uint8Array): Map<string, string> {
  const records = new Map<string, string>();
  let at = 0;
  while (at < body.byteLength) {
    const space = body.indexOf(0x20, at);
    if (space < 0 || space - at > 8) throw new FilesError("Tar PAX header is malformed");
    const length = Number(new TextDecoder().decode(body.subarray(at, space)));
    if (!Number.isInteger(length) || length <= space - at || at + length > body.byteLength) {
      throw new FilesError("Tar PAX header is malformed");
    }
    const record = text(body.subarray(space + 1, at + length - 1), "PAX record");
    const eq = record.indexOf("=");
    if (eq <= 0 || body[at + length - 1] !== 0x0a) {
      throw new FilesError("Tar PAX header is malformed");
    }
    records.set(record.slice(0, eq), record.slice(eq + 1));
    at += length;
  }
  return records;
}

/**
 * Reads an archive entry by entry. Nothing is trusted: checksums, numbers,
 * names and PAX records are checked and capped; the data of an entry streams
 * through in the source's chunks.
 *
 * @param source The archive's bytes.
 * @returns The entries in order; ends at the two zero blocks (or a clean end).
 * @throws {FilesError} On anything malformed.
 */
export async function* readTar(source: AsyncIterable<Uint8Array>): AsyncGenerator<TarItem> {
  const bytes = new ByteSource(source);
  try {
    let pax = new Map<string, string>();
    while (true) {
      const block = await bytes.exact(BLOCK);
      if (block === null) return;
      if (block.every((b) => b === 0)) {
        // The end; the second zero block (and any trailing padding) is not read.
        return;
      }
      if (!checksumOk(block)) {
        throw new FilesError(`Tar header checksum mismatch at byte ${bytes.position - BLOCK}`);
      }
      const flag = String.fromCharCode(block[156]!);
      const size = number(block, 124, 12, "size");
      if (flag === "x" || flag === "g") {
        if (size > MAX_PAX_BYTES) {
          throw new FilesError(`Tar PAX header of ${size} bytes exceeds ${MAX_PAX_BYTES}`);
        }
        const body = (await bytes.exact(size + padding(size).byteLength)) ?? new Uint8Array();
        const records = parsePax(body.subarray(0, size));
        // Global records are ignored: only per-entry path, linkpath and size count.
        if (flag === "x") pax = records;
        continue;
      }
      const prefix = text(field(block, 345, 155), "name prefix");
      const short = text(field(block, 0, 100), "name");
      const magic = new TextDecoder().decode(block.subarray(257, 262));
      let name = magic === "ustar" && prefix !== "" ? `${prefix}/${short}` : short;
      let linkname = text(field(block, 157, 100), "link name");
      let entrySize = size;
      if (pax.has("path")) name = pax.get("path")!;
      if (pax.has("linkpath")) linkname = pax.get("linkpath")!;
      if (pax.has("size")) {
        const value = pax.get("size")!;
        if (!/^[0-9]{1,16}$/.test(value)) {
          throw new FilesError(`Tar PAX size '${value}' is malformed`);
        }
        entrySize = Number(value);
      }
      pax = new Map();
      const parsed = headerSchema.safeParse({
        name,
        type: FLAGS[flag] ?? "other",
        size: entrySize,
        mode: number(block, 100, 8, "mode"),
        mtime: number(block, 136, 12, "mtime"),
        linkname,
        flag,
      });
      if (!parsed.success) {
        throw new FilesError(
          `Tar header for '${name.slice(0, 200)}' is invalid: ${parsed.error.issues[0]?.message}`,
        );
      }
      const header = parsed.data;
      let read = false;
      const body = (async function* (): AsyncGenerator<Uint8Array> {
        read = true;
        yield* bytes.take(header.size);
        await bytes.skip(padding(header.size).byteLength);
      })();
      yield { header, body };
      if (!read) {
        await bytes.skip(header.size + padding(header.size).byteLength);
      }
    }
  } finally {
    bytes.close();
  }
}
