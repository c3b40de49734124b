/**
 * The tail window of an append-only JSONL log, kept parsed between calls
 * so that a poll costs the bytes appended since the last one, not the
 * whole window. Each file is known by its identity (device and inode) and
 * the size seen: the same inode grown is read from where it was left (a
 * partial last line is read again once whole); a new inode, a shrunk file,
 * a rewrite in place (its last bytes seen changed) or a growth past the
 * window is read cold. A rotated file keeps its inode, so the old newest
 * file's window serves as the rotation's. Only the window's valid entries
 * are kept, and only for the files the last call of each log used. Parsing
 * yields to the event loop every {@linkcode YIELD_BYTES} so a cold read does
 * not hold up other requests.
 *
 * @module
 */

/** Bytes parsed between two yields to the event loop. */
const YIELD_BYTES = 256 * 1024;
/**
 * Bytes of a file's end kept to tell an append from a rewrite in place (a
 * dozen audit lines: a rewrite is taken for an append only when it puts
 * the same last 4 KiB at the same offset; the writers append and rotate by
 * renaming, never rewrite).
 */
const CHECK_BYTES = 4096;
const NEWLINE = 0x0a;

/** One valid line of a window and where it starts in its file. */
interface Line<T> {
  offset: number;
  value: T;
}

/** What is known of one file. */
interface FileWindow<T> {
  /** `dev:ino`; undefined: not cacheable. */
  identity: string | undefined;
  /** The bytes seen. */
  size: number;
  /** The last bytes seen (at most CHECK_BYTES, ending at `size`). */
  check: Uint8Array;
  /** Every line starting after this offset is held (-1: from the file's start). */
  covered: number;
  /** Valid whole lines, oldest first, from `head` on. */
  lines: Line<T>[];
  head: number;
  /** Where the unterminated last segment starts (`size` when the file ends with a newline). */
  pending: number;
  /** That segment parsed, when it is valid as it stands. */
  pendingValue: T | undefined;
}

/** How an {@linkcode AuditWindows} reads its logs. */
export interface AuditWindowsOptions {
  /** The most bytes of a log (across its rotation) a tail holds. */
  maxBytes: number;
  /** A line longer than this (in UTF-16 code units) is skipped. */
  maxLineChars: number;
}

/**
 * Parsed tails of the logs of one kind (one line parser), kept between calls.
 */
export class AuditWindows<T> {
  readonly #parse: (line: string) => T | undefined;
  readonly #options: AuditWindowsOptions;
  readonly #files = new Map<string, FileWindow<T>>();
  readonly #users = new Map<string, string[]>();
  readonly #decoder = new TextDecoder("utf-8", { ignoreBOM: true });
  #queue: Promise<unknown> = Promise.resolve();

  /**
   * @param parse A line to its value, undefined when invalid (the line is at most `maxLineChars`).
   * @param options The window's size and the line cap.
   */
  constructor(parse: (line: string) => T | undefined, options: AuditWindowsOptions) {
    this.#parse = parse;
    this.#options = options;
  }

  /**
   * The valid lines of the last `maxBytes` of a log and, when the newest
   * file holds fewer, of the files before it, oldest first. A window that
   * starts mid-file drops its first (cut) line; a file that is missing or
   * not a regular file holds nothing. Calls run one at a time.
   *
   * @param files The newest file first, then its rotations.
   * @returns The values, oldest first.
   */
  tail(files: string[]): Promise<T[]> {
    const run = this.#queue.then(() => this.#tail(files));
    this.#queue = run.catch(() => undefined);
    return run;
  }

  async #tail(files: string[]): Promise<T[]> {
    let budget = this.#options.maxBytes;
    const parts: T[][] = [];
    const used: string[] = [];
    for (const path of files) {
      if (budget <= 0) break;
      const window = await this.#window(path, budget);
      if (window === undefined) continue;
      if (window.identity !== undefined) used.push(window.identity);
      const start = Math.max(0, window.size - budget);
      budget -= window.size - start;
      parts.unshift(valuesAfter(window, start > 0 ? start : -1));
      if (start > 0) break;
    }
    this.#forget(files[0] ?? "", used);
    return parts.flat();
  }

  // Drops the windows no log's last call used.
  #forget(log: string, used: string[]): void {
    this.#users.set(log, used);
    const live = new Set([...this.#users.values()].flat());
    for (const identity of this.#files.keys()) {
      if (!live.has(identity)) this.#files.delete(identity);
    }
  }

  // The file's window brought up to date, or undefined when it is not a readable regular file.
  async #window(path: string, budget: number): Promise<FileWindow<T> | undefined> {
    let file: Deno.FsFile;
    try {
      // Checked before it is opened: a FIFO would block the open.
      if (!Deno.statSync(path).isFile) return undefined;
      file = await Deno.open(path, { read: true });
    } catch {
      return undefined;
    }
    try {
      const info = await file.stat();
      if (!info.isFile) return undefined;
      const identity = info.dev === null || info.ino === null
        ? undefined
        : `${info.dev}:${info.ino}`;
      const cached = identity === undefined ? undefined : this.#files.get(identity);
      const need = info.size > budget ? info.size - budget : -1;
      if (
        cached !== undefined && cached.covered <= need && info.size >= cached.size &&
        info.size - cached.size <= this.#options.maxBytes &&
        await this.#grow(file, cached, info.size)
      ) {
        return cached;
      }
      const fresh = await this.#cold(file, identity, info.size, budget);
      if (identity !== undefined) this.#files.set(identity, fresh);
      return fresh;
    } finally {
      file.close();
    }
  }

  // The last `budget` bytes read and parsed anew.
  async #cold(
    file: Deno.FsFile,
    identity: string | undefined,
    size: number,
    budget: number,
  ): Promise<FileWindow<T>> {
    const start = Math.max(0, size - budget);
    const bytes = await readRange(file, start, size);
    const window: FileWindow<T> = {
      identity,
      size: start,
      check: new Uint8Array(0),
      covered: start > 0 ? start : -1,
      lines: [],
      head: 0,
      pending: start,
      pendingValue: undefined,
    };
    await this.#scan(window, bytes, start, true);
    window.check = lastBytes(bytes);
    return window;
  }

  // The bytes appended since the window was made, parsed; false when the file is not the
  // one seen (its last bytes seen changed, or it shrank while read).
  async #grow(file: Deno.FsFile, window: FileWindow<T>, size: number): Promise<boolean> {
    const checked = window.size - window.check.length;
    // A pending segment already past the line cap is not read again: skipped to its end.
    const reread = window.size - window.pending <= 3 * this.#options.maxLineChars;
    const from = Math.min(reread ? window.pending : window.size, checked);
    const bytes = await readRange(file, from, size);
    if (bytes.length !== size - from) return false;
    const seen = bytes.subarray(checked - from, window.size - from);
    if (!seen.every((byte, i) => byte === window.check[i])) return false;
    if (size === window.size) return true;
    const tail = bytes.subarray((reread ? window.pending : window.size) - from);
    await this.#scan(window, tail, reread ? window.pending : window.size, reread);
    window.check = lastBytes(bytes);
    return true;
  }

  /**
   * Parses `bytes` (the file's from `base`) into the window: whole lines are
   * kept, the unterminated rest becomes the pending segment. The first
   * segment starts at the window's pending offset; it is parsed only when
   * `parseFirst` (it is read from its start).
   */
  async #scan(
    window: FileWindow<T>,
    bytes: Uint8Array,
    base: number,
    parseFirst: boolean,
  ): Promise<void> {
    let at = 0;
    let offset = window.pending;
    let parse = parseFirst;
    let sinceYield = 0;
    for (
      let newline = bytes.indexOf(NEWLINE);
      newline !== -1;
      newline = bytes.indexOf(NEWLINE, at)
    ) {
      if (parse && offset > window.covered) {
        const value = this.#line(bytes.subarray(at, newline), offset);
        if (value !== undefined) window.lines.push({ offset, value });
      }
      sinceYield += newline + 1 - at;
      at = newline + 1;
      offset = base + at;
      parse = true;
      if (sinceYield >= YIELD_BYTES) {
        sinceYield = 0;
        // A macrotask, so that other requests run between the chunks of a cold read.
        await new Promise((resolve) => setTimeout(resolve, 0));
      }
    }
    window.pending = offset;
    window.pendingValue = parse && offset > window.covered && at < bytes.length
      ? this.#line(bytes.subarray(at), offset)
      : undefined;
    window.size = base + bytes.length;
    trim(window, this.#options.maxBytes);
  }

  #line(bytes: Uint8Array, offset: number): T | undefined {
    // At most 3 bytes per UTF-16 code unit: longer is past the cap whatever it decodes to.
    if (bytes.length > 3 * this.#options.maxLineChars) return undefined;
    let line = this.#decoder.decode(bytes);
    // A byte-order mark is dropped only at a file's start (as decoding the whole file would).
    if (offset === 0 && line.charCodeAt(0) === 0xfeff) line = line.slice(1);
    if (line.length === 0 || line.length > this.#options.maxLineChars) return undefined;
    return this.#parse(line);
  }
}

// Lines no window of the file can reach any more are dropped.
function trim<T>(window: FileWindow<T>, maxBytes: number): void {
  const floor = window.size - maxBytes;
  if (floor <= 0) return;
  while (window.head < window.lines.length && window.lines[window.head]!.offset <= floor) {
    window.head++;
  }
  window.covered = Math.max(window.covered, floor);
  if (window.head > 1024 && window.head * 2 > window.lines.length) {
    window.lines = window.lines.slice(window.head);
    window.head = 0;
  }
}

// The values of the lines starting after `after`, oldest first, the pending one last.
function valuesAfter<T>(window: FileWindow<T>, after: number): T[] {
  let low = window.head;
  let high = window.lines.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    if (window.lines[middle]!.offset > after) high = middle;
    else low = middle + 1;
  }
  const values = new Array<T>(window.lines.length - low);
  for (let i = low; i < window.lines.length; i++) values[i - low] = window.lines[i]!.value;
  if (window.pendingValue !== undefined && window.pending > after) {
    values.push(window.pendingValue);
  }
  return values;
}

// A copy of the last CHECK_BYTES of a read (it reaches back at least as far as the old check).
function lastBytes(bytes: Uint8Array): Uint8Array {
  return bytes.slice(Math.max(0, bytes.length - CHECK_BYTES));
}

async function readRange(file: Deno.FsFile, from: number, to: number): Promise<Uint8Array> {
  await file.seek(from, Deno.SeekMode.Start);
  const data = new Uint8Array(Math.max(0, to - from));
  let at = 0;
  while (at < data.length) {
    const n = await file.read(data.subarray(at));
    if (n === null) break;
    at += n;
  }
  return data.subarray(0, at);
}
