/**
 * A build of waffle's artefact as a directory (`scripts/build_artefact.ts`):
 * the entry `waffle.js`, the chunks it imports on demand, the runner's
 * heartbeat worker, and `SHA256SUMS`, which names every file with its
 * SHA-256. The build's digest is the SHA-256 of `SHA256SUMS`, so it covers
 * every file a sandbox could load.
 *
 * An install keeps each build in a directory named after its digest
 * (`…/lib/waffle/waffle-<digest12>/`) and never rewrites one: a process
 * that loads a chunk late still finds the build it started from. The file
 * `artefact` beside them names the current build.
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { UsageError } from "../errors.ts";

/** The entry file of a build (the CLI and the runner). */
export const ARTEFACT_ENTRY = "waffle.js";
/** The file that names each file of a build with its SHA-256 (`sha256sum` format). */
export const SUMS_FILE = "SHA256SUMS";
/** The install's file naming its current build directory (one line). */
export const CURRENT_BUILD_FILE = "artefact";
// The sizes and mtimes the install saw, and the digest they vouch for.
const STAMP_FILE = "SHA256SUMS.stamp";
const BUILD_NAME = /^waffle-[0-9a-f]{12}$/;

/**
 * The name an install gives a build's directory.
 *
 * @param digest The build's digest.
 * @returns `waffle-<first 12 hex digits>`.
 */
export function buildDirName(digest: string): string {
  return `waffle-${digest.slice(0, 12)}`;
}

/**
 * Whether a directory holds a build (it has `SHA256SUMS`).
 *
 * @param dir The directory.
 * @returns True for a build directory.
 */
export function isBuildDir(dir: string): boolean {
  try {
    return Deno.statSync(`${dir}/${SUMS_FILE}`).isFile;
  } catch {
    return false;
  }
}

/**
 * The directory that holds the Deno, runtime kit and runner cache for an
 * artefact: the install's `lib/waffle` for a build in a versioned
 * directory, else the artefact's own directory.
 *
 * @param artefact The artefact's path (a build's entry, or a single file).
 * @returns The directory.
 */
export function installDirOf(artefact: string): string {
  const dir = artefact.slice(0, artefact.lastIndexOf("/"));
  const name = dir.slice(dir.lastIndexOf("/") + 1);
  return BUILD_NAME.test(name) && isBuildDir(dir) ? dir.slice(0, dir.lastIndexOf("/")) : dir;
}

/**
 * The current build's entry in an install's `lib/waffle`, from the file
 * that names it.
 *
 * @param lib The install's `lib/waffle` directory.
 * @returns `…/waffle-<digest12>/waffle.js`, or undefined when none is named.
 */
export function currentBuild(lib: string): string | undefined {
  let name: string;
  try {
    name = Deno.readTextFileSync(`${lib}/${CURRENT_BUILD_FILE}`).trim();
  } catch {
    return undefined;
  }
  return BUILD_NAME.test(name) ? `${lib}/${name}/${ARTEFACT_ENTRY}` : undefined;
}

/**
 * Writes a fresh build's `SHA256SUMS` (the build script calls this once).
 *
 * @param dir The build directory.
 * @returns The build's digest.
 */
export function writeSums(dir: string): string {
  const sums = sumsOf(dir);
  Deno.writeTextFileSync(`${dir}/${SUMS_FILE}`, sums, { mode: 0o644 });
  return sha256Hex(sums);
}

/**
 * Checks an installed build against its `SHA256SUMS` and records the
 * files' sizes and mtimes, so {@linkcode buildDigest} need not hash them
 * again (the install calls this once per build).
 *
 * @param dir The build directory.
 * @returns The build's digest.
 * @throws {UsageError} When a file differs from `SHA256SUMS`.
 */
export function writeBuildStamp(dir: string): string {
  const recorded = Deno.readTextFileSync(`${dir}/${SUMS_FILE}`);
  const actual = sumsOf(dir);
  if (actual !== recorded) {
    throw new UsageError(`Build '${dir}' does not match its ${SUMS_FILE}: reinstall it`);
  }
  const digest = sha256Hex(recorded);
  const temp = `${dir}/${STAMP_FILE}.tmp`;
  Deno.writeTextFileSync(temp, `${digest}\n${stampOf(dir)}`, { mode: 0o644 });
  Deno.renameSync(temp, `${dir}/${STAMP_FILE}`);
  return digest;
}

/**
 * A build's digest: the SHA-256 of its `SHA256SUMS` as its files are now.
 * While every file has the size and mtime the install recorded, the
 * recorded digest stands; otherwise the files are hashed again, so an
 * edited build has another digest (and recycles the sandboxes that run it).
 *
 * @param dir The build directory.
 * @returns The hex digest.
 */
export function buildDigest(dir: string): string {
  try {
    const stamp = Deno.readTextFileSync(`${dir}/${STAMP_FILE}`);
    const newline = stamp.indexOf("\n");
    const digest = stamp.slice(0, newline);
    if (/^[0-9a-f]{64}$/.test(digest) && stamp.slice(newline + 1) === stampOf(dir)) return digest;
  } catch {
    // No stamp: hash the files.
  }
  return sha256Hex(sumsOf(dir));
}

// Every regular file of the build but the sums and the stamp, by name.
function filesOf(dir: string): string[] {
  const names: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    if (!entry.isFile || entry.name === SUMS_FILE || entry.name.startsWith(STAMP_FILE)) continue;
    names.push(entry.name);
  }
  return names.sort();
}

// `sha256sum` lines: `sha256sum -c SHA256SUMS` checks a build by hand.
function sumsOf(dir: string): string {
  return filesOf(dir).map((name) => `${sha256Hex(Deno.readFileSync(`${dir}/${name}`))}  ${name}\n`)
    .join("");
}

// Name, size and mtime of each file: a rebuilt or edited file has another line.
function stampOf(dir: string): string {
  return filesOf(dir).map((name) => {
    const info = Deno.statSync(`${dir}/${name}`);
    return `${name} ${info.size} ${info.mtime?.getTime() ?? 0}\n`;
  }).join("");
}
