/**
 * User metadata of a file in a sandbox (E2B's file metadata): string pairs
 * kept as the file's extended attributes under {@linkcode METADATA_PREFIX}.
 * The one owner of their rules (keys, values, sizes), checked on the way in
 * (the host, before a write) and on the way out (the host, on what the
 * sandbox reports); and the in-sandbox half, which reads and sets the
 * attributes as the commands' uid through libc (`waffle files`). The
 * runtime kit's static reader (`image/metadata_helper.c`) gives the same
 * report as {@linkcode reportMetadata}, byte for byte, with the prefix and
 * limits the host passes it from here.
 *
 * The limits are E2B's envd's: a key of at most {@linkcode METADATA_KEY_BYTES}
 * bytes (Linux's 255-byte attribute name less the prefix), and a file's
 * metadata at most {@linkcode METADATA_BYTES} bytes, each key counted with
 * its prefix, so at most {@linkcode METADATA_KEYS} keys.
 *
 * @module
 */
import { FilesError } from "../errors.ts";
import { E2BIG, ENODATA, ENOSPC, ENOTSUP, ERANGE, errno, type Libc, libc } from "../libc.ts";
import * as z from "../schema.ts";

/** The extended attributes' namespace: `user.e2b.<key>`, as E2B's envd keeps them. */
export const METADATA_PREFIX = "user.e2b.";
/** The longest key, in bytes. */
export const METADATA_KEY_BYTES = 255 - METADATA_PREFIX.length;
/** The most bytes of one file's metadata: keys (each with its prefix) and values. */
export const METADATA_BYTES = 4096;
/** The most keys one file can hold (each at least one byte, with its prefix). */
export const METADATA_KEYS = Math.floor(METADATA_BYTES / (METADATA_PREFIX.length + 1));

/** An HTTP token, as `X-Metadata-<key>` carries a key. */
const KEY = /^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$/;
/** Printable US-ASCII. */
const VALUE = /^[\x20-\x7e]*$/;

/** How a file's metadata is written into a `waffle files write` argument. */
export const metadataSchema = z.record(
  z.string().check(z.maxLength(METADATA_KEY_BYTES)),
  z.string().check(z.maxLength(METADATA_BYTES)),
);

function quoted(text: string): string {
  const shown = JSON.stringify(text.length > 60 ? `${text.slice(0, 60)}…` : text);
  return `'${shown.slice(1, -1)}'`;
}

/**
 * What is wrong with metadata to be written, if anything.
 *
 * @param metadata Keys to values.
 * @returns A one-line message quoting the offending key or value, or undefined.
 */
export function metadataProblem(metadata: Record<string, string>): string | undefined {
  let bytes = 0;
  for (const [key, value] of Object.entries(metadata)) {
    if (!KEY.test(key)) {
      return `Metadata key ${
        quoted(key)
      } is not an HTTP token (letters, digits and !#$%&'*+-.^_\`|~)`;
    }
    if (key.length > METADATA_KEY_BYTES) {
      return `Metadata key ${quoted(key)} is over ${METADATA_KEY_BYTES} bytes`;
    }
    if (!VALUE.test(value)) {
      return `Metadata value ${quoted(value)} of key '${key}' is not printable US-ASCII`;
    }
    bytes += METADATA_PREFIX.length + key.length + value.length;
  }
  if (bytes > METADATA_BYTES) {
    return `Metadata of ${bytes} bytes is over ${METADATA_BYTES} (keys with their '${METADATA_PREFIX}' prefix, and values)`;
  }
  return undefined;
}

/**
 * What the sandbox reports of one file's metadata: pairs of base64 bytes
 * (name without the prefix, value), or the bytes it holds when over
 * {@linkcode METADATA_BYTES}.
 */
export const reportedSchema = z.union([
  z.int().check(z.nonnegative()),
  z.array(z.tuple([
    z.string().check(z.maxLength(Math.ceil(METADATA_KEY_BYTES / 3) * 4)),
    z.string().check(z.maxLength(Math.ceil(METADATA_BYTES / 3) * 4)),
  ])).check(z.maxLength(METADATA_KEYS)),
]);

/** One file's report, as {@linkcode reportedSchema} checks it. */
export type ReportedMetadata = z.infer<typeof reportedSchema>;

// Printable ASCII stays; any other byte is written `\xNN`, so what the
// sandbox planted reaches the client as plain text.
function printable(bytes: Uint8Array): string {
  let text = "";
  for (const byte of bytes) {
    text += byte >= 0x20 && byte < 0x7f && byte !== 0x5c
      ? String.fromCharCode(byte)
      : `\\x${byte.toString(16).padStart(2, "0")}`;
  }
  return text;
}

function fromBase64(text: string): Uint8Array {
  const binary = atob(text);
  return Uint8Array.from(binary, (c) => c.charCodeAt(0));
}

/**
 * The host's reading of what the sandbox reported of one file: checked
 * again (the sandbox may lie), bytes outside printable ASCII escaped.
 *
 * @param reported The file's report.
 * @param path The file, for the error.
 * @returns Keys to values (empty when it has none).
 * @throws {FilesError} When the file's metadata is over the limits.
 */
export function decodeMetadata(reported: ReportedMetadata, path: string): Record<string, string> {
  if (typeof reported === "number") {
    return overLimit(path, reported);
  }
  const metadata: Record<string, string> = {};
  let bytes = 0;
  for (const [key64, value64] of reported) {
    let key: Uint8Array, value: Uint8Array;
    try {
      key = fromBase64(key64);
      value = fromBase64(value64);
    } catch {
      throw new FilesError(`The sandbox's metadata of '${path}' is malformed`);
    }
    bytes += METADATA_PREFIX.length + key.byteLength + value.byteLength;
    if (bytes > METADATA_BYTES || key.byteLength > METADATA_KEY_BYTES) {
      return overLimit(path, bytes);
    }
    metadata[printable(key)] = printable(value);
  }
  return metadata;
}

function overLimit(path: string, bytes: number): never {
  throw new FilesError(
    `The metadata of '${path}' (${bytes} bytes or more) is over ${METADATA_BYTES} bytes`,
  );
}

// --- The in-sandbox half (`waffle files`), as the commands' uid. ---

/** Linux's largest list of attribute names (`XATTR_LIST_MAX`). */
const LIST_BYTES = 65_536;

function loaded(): Libc {
  const lib = libc();
  if (lib === undefined) throw new FilesError("Extended attributes need libc (Linux)");
  return lib;
}

function cString(text: string): Uint8Array<ArrayBuffer> {
  return new TextEncoder().encode(`${text}\0`);
}

/**
 * Sets a file's metadata (in the sandbox): each key as `user.e2b.<key>`.
 *
 * @param path The file (its last component not followed).
 * @param metadata Keys to values, already checked by {@linkcode metadataProblem}.
 * @param options `shown`: the path as the error names it (`path` by default).
 * @throws {FilesError} When the file system keeps no extended attributes, or has no room.
 */
export function applyMetadata(
  path: string,
  metadata: Record<string, string>,
  options: { shown?: string } = {},
): void {
  const shown = options.shown ?? path;
  // No metadata needs no libc (an image without glibc still takes writes).
  if (Object.keys(metadata).length === 0) return;
  const lib = loaded();
  const file = cString(path);
  for (const [key, value] of Object.entries(metadata)) {
    const bytes = new TextEncoder().encode(value);
    if (
      lib.lsetxattr(file, cString(METADATA_PREFIX + key), bytes, BigInt(bytes.byteLength), 0) === 0
    ) {
      continue;
    }
    const code = errno(lib);
    if (code === ENOTSUP) {
      throw new FilesError(
        `The file system of '${shown}' keeps no metadata (extended attributes are not supported)`,
      );
    }
    if (code === ENOSPC || code === E2BIG) {
      // ext4 keeps a file's attributes in one block: a little under 4096 bytes.
      throw new FilesError(`No room for the metadata of '${shown}' on its file system`);
    }
    throw new FilesError(`Cannot set metadata key '${key}' on '${shown}' (errno ${code})`);
  }
}

/**
 * Reads a file's metadata (in the sandbox), bounded: the pairs under
 * `user.e2b.` as base64, or the bytes seen once over {@linkcode METADATA_BYTES}.
 * `image/metadata_helper.c` keeps this same contract (tests/metadata_reader_test.ts).
 *
 * @param path The file (its last component not followed).
 * @returns The report; an empty list when it has none or cannot have any.
 */
export function reportMetadata(path: string): ReportedMetadata {
  const lib = loaded();
  const file = cString(path);
  const names = new Uint8Array(LIST_BYTES);
  const listed = Number(lib.llistxattr(file, names, BigInt(LIST_BYTES)));
  if (listed < 0) return errno(lib) === ERANGE ? LIST_BYTES : [];
  const prefix = new TextEncoder().encode(METADATA_PREFIX);
  const value = new Uint8Array(METADATA_BYTES + 1);
  const pairs: [string, string][] = [];
  let bytes = 0;
  let start = 0;
  for (let at = 0; at < listed; at++) {
    if (names[at] !== 0) continue;
    const name = names.subarray(start, at + 1);
    start = at + 1;
    if (!prefix.every((byte, i) => name[i] === byte)) continue;
    const size = Number(lib.lgetxattr(file, name, value, BigInt(value.byteLength)));
    if (size < 0) {
      const code = errno(lib);
      if (code === ENODATA) continue;
      return code === ERANGE ? bytes + value.byteLength : [];
    }
    const key = name.subarray(prefix.byteLength, name.byteLength - 1);
    bytes += prefix.byteLength + key.byteLength + size;
    if (bytes > METADATA_BYTES || pairs.length >= METADATA_KEYS) return bytes;
    pairs.push([toBase64(key), toBase64(value.subarray(0, size))]);
  }
  return pairs;
}

function toBase64(bytes: Uint8Array): string {
  return btoa(String.fromCharCode(...bytes));
}
