/**
 * A small tar writer (POSIX ustar, with pax records for long names) for the
 * root file system of the waffle image: directories, files and symlinks,
 * owned by root, with their own modes. Written here rather than imported:
 * it is ~100 lines, and the artefact carries no tar package.
 *
 * @module
 */

const BLOCK = 512;
const encoder = new TextEncoder();

/** One entry's metadata. */
interface Entry {
  path: string;
  type: "file" | "dir" | "symlink" | "pax";
  mode: number;
  size: number;
  mtime: number;
  linkname?: string;
}

/** Writes a tar archive, entry by entry, to an open file. */
export class TarWriter {
  readonly #out: Deno.FsFile;

  /**
   * Writes to `out` (its current position on).
   *
   * @param out An open, writable file.
   */
  constructor(out: Deno.FsFile) {
    this.#out = out;
  }

  /**
   * Adds a directory, a file or a symlink of this machine under `path`,
   * with its mode and mtime; a directory's contents are added after it.
   *
   * @param source The file on this machine (not followed when a symlink).
   * @param path Its path in the archive (no leading `/`).
   */
  async addTree(source: string, path: string): Promise<void> {
    const info = await Deno.lstat(source);
    const mode = (info.mode ?? 0o644) & 0o7777;
    const mtime = Math.floor((info.mtime?.getTime() ?? 0) / 1000);
    if (info.isSymlink) {
      const linkname = await Deno.readLink(source);
      await this.#header({ path, type: "symlink", mode, size: 0, mtime, linkname });
    } else if (info.isDirectory) {
      await this.addDir(path, mode, mtime);
      const names = [];
      for await (const entry of Deno.readDir(source)) names.push(entry.name);
      for (const name of names.sort()) await this.addTree(`${source}/${name}`, `${path}/${name}`);
    } else if (info.isFile) {
      await this.#header({ path, type: "file", mode, size: info.size, mtime });
      using file = await Deno.open(source);
      let written = 0;
      for await (const chunk of file.readable) {
        await this.#write(chunk);
        written += chunk.length;
      }
      if (written !== info.size) throw new Error(`File '${source}' changed while archived`);
      await this.#pad(written);
    }
  }

  /**
   * Adds an empty directory.
   *
   * @param path Its path in the archive.
   * @param mode Its mode (e.g. `0o1777` for a /tmp).
   * @param mtime Seconds since the epoch.
   */
  async addDir(path: string, mode: number, mtime = 0): Promise<void> {
    await this.#header({ path: `${path}/`, type: "dir", mode, size: 0, mtime });
  }

  /**
   * Adds a file with the given bytes.
   *
   * @param path Its path in the archive.
   * @param data Its contents.
   * @param mode Its mode.
   */
  async addFile(path: string, data: Uint8Array, mode: number): Promise<void> {
    await this.#header({ path, type: "file", mode, size: data.length, mtime: 0 });
    await this.#write(data);
    await this.#pad(data.length);
  }

  /** Ends the archive (two zero blocks). */
  async finish(): Promise<void> {
    await this.#write(new Uint8Array(BLOCK * 2));
  }

  async #header(entry: Entry): Promise<void> {
    const name = encoder.encode(entry.path);
    const link = encoder.encode(entry.linkname ?? "");
    if (name.length > 100 || link.length > 100) {
      // A pax extended header carries the long name; the ustar one a truncation.
      const records = paxRecord("path", entry.path) +
        (link.length > 100 ? paxRecord("linkpath", entry.linkname!) : "");
      const body = encoder.encode(records);
      await this.#header({
        path: "PaxHeader",
        type: "pax",
        mode: 0o644,
        size: body.length,
        mtime: entry.mtime,
      });
      await this.#write(body);
      await this.#pad(body.length);
    }
    const block = new Uint8Array(BLOCK);
    block.set(name.subarray(0, 100), 0);
    octal(block, 100, 8, entry.mode);
    octal(block, 108, 8, 0);
    octal(block, 116, 8, 0);
    octal(block, 124, 12, entry.size);
    octal(block, 136, 12, entry.mtime);
    block.fill(0x20, 148, 156);
    block[156] = { file: 0x30, dir: 0x35, symlink: 0x32, pax: 0x78 }[entry.type];
    block.set(link.subarray(0, 100), 157);
    block.set(encoder.encode("ustar\u000000"), 257);
    block.set(encoder.encode("root"), 265);
    block.set(encoder.encode("root"), 297);
    const sum = block.reduce((total, byte) => total + byte, 0);
    block.set(encoder.encode(`${sum.toString(8).padStart(6, "0")}\u0000 `), 148);
    await this.#write(block);
  }

  async #pad(size: number): Promise<void> {
    const rest = size % BLOCK;
    if (rest !== 0) await this.#write(new Uint8Array(BLOCK - rest));
  }

  async #write(data: Uint8Array): Promise<void> {
    let offset = 0;
    while (offset < data.length) offset += await this.#out.write(data.subarray(offset));
  }
}

// `<len> key=value\n`, where len counts the whole record, itself included.
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const bodyLength = encoder.encode(body).length;
  let length = bodyLength + 1;
  while (String(length).length + bodyLength !== length) length = String(length).length + bodyLength;
  return `${length}${body}`;
}

// A zero-padded octal number ending in NUL, filling `width` bytes at `at`.
function octal(block: Uint8Array, at: number, width: number, value: number): void {
  block.set(encoder.encode(`${value.toString(8).padStart(width - 1, "0")}\u0000`), at);
}
