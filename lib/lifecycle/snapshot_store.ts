/**
 * Where a sandbox's workspace snapshots live, and the names and records
 * that describe them. The store is the host's alone, beside the queue and
 * outside the volume (no container mounts it):
 *
 * ```
 * <root>/snapshots/           0700
 *   <name>/                   one snapshot: published by one rename
 *     volume.img              the volume's image, copied while frozen (sparse)
 *     snapshot.json           when it was taken, how big, how long it took
 *   .saving-<id>/             a save under way (or a killed one's leftover)
 *   .removing-<id>/           a snapshot being removed
 *   .mount-<id>/              an empty mount point a restore's child uses
 * ```
 *
 * Names a user gives start with a letter or digit, so they never meet the
 * dot names of the work under way. Reads only what the host wrote.
 *
 * @module
 */
import { join } from "../path.ts";
import * as z from "../schema.ts";
import { QueueError, UsageError } from "../errors.ts";
import { removeTree } from "./remove_tree.ts";

/** What a snapshot name may be: 1-64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit. */
export const SNAPSHOT_NAME: RegExp = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/** One snapshot of a sandbox's workspace. */
export interface SnapshotInfo {
  /** Its name. */
  name: string;
  /** When it was taken (ISO 8601, UTC). */
  createdAt: string;
  /** Host disk it takes: the blocks its image holds (sparse), in bytes. */
  bytes: number;
  /** The size of the volume it was taken of, in bytes. */
  volumeBytes: number;
  /** How long the save took, in ms: the volume's flush, then its copy while frozen. */
  saveMs: number;
}

const metaSchema = z.object({
  version: z.literal(1),
  name: z.string().check(z.regex(SNAPSHOT_NAME)),
  createdAt: z.string().check(z.maxLength(64)),
  volumeBytes: z.int().check(z.minimum(0)),
  saveMs: z.number().check(z.minimum(0)),
});

/** The image of a snapshot, inside its directory. */
export const IMAGE_FILE = "volume.img";
const META_FILE = "snapshot.json";
const META_MAX_BYTES = 64 * 1024;

/** Names of the store's work under way, which a later call may remove. */
const LEFTOVER = /^\.(saving|removing|mount)-[0-9a-f]{8}$/;

/**
 * Checks a snapshot name.
 *
 * @param name The name a user gave.
 * @throws {UsageError} Quoting it, when it is not 1-64 of `A-Z a-z 0-9 . _ -`
 *   starting with a letter or digit.
 */
export function checkSnapshotName(name: string): void {
  if (!SNAPSHOT_NAME.test(name)) {
    throw new UsageError(
      `Invalid snapshot name '${
        name.slice(0, 80)
      }': use 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit`,
    );
  }
}

/**
 * The store's directory of a sandbox.
 *
 * @param root The sandbox's state root.
 * @returns `<root>/snapshots`.
 */
export function storeDir(root: string): string {
  return join(root, "snapshots");
}

/**
 * A fresh name in the store (or the volume) for work under way.
 *
 * @param kind What the work is.
 * @returns `.<kind>-<8 hex digits>`.
 */
export function workName(kind: "saving" | "removing" | "mount" | "restore"): string {
  return `.${kind}-${crypto.randomUUID().slice(0, 8)}`;
}

/**
 * Creates the store's directory (0700) when it is missing.
 *
 * @param root The sandbox's state root.
 * @returns The directory.
 */
export function ensureStore(root: string): string {
  const dir = storeDir(root);
  Deno.mkdirSync(dir, { recursive: true, mode: 0o700 });
  Deno.chmodSync(dir, 0o700);
  return dir;
}

/**
 * Every published snapshot of a sandbox, oldest first. A directory whose
 * record is missing or unreadable is listed with what its image says.
 *
 * @param root The sandbox's state root.
 * @returns The snapshots.
 */
export function readSnapshots(root: string): SnapshotInfo[] {
  const found: SnapshotInfo[] = [];
  for (const name of snapshotNames(root)) {
    const info = readSnapshot(root, name);
    if (info !== undefined) found.push(info);
  }
  return found.sort((a, b) => a.createdAt.localeCompare(b.createdAt));
}

/**
 * How many snapshots a sandbox has (for `ps`): names in the store, nothing read.
 *
 * @param root The sandbox's state root.
 * @returns The count; 0 when there is no store or it cannot be read.
 */
export function countSnapshots(root: string): number {
  return snapshotNames(root).length;
}

function snapshotNames(root: string): string[] {
  try {
    return [...Deno.readDirSync(storeDir(root))]
      .filter((entry) => entry.isDirectory && SNAPSHOT_NAME.test(entry.name))
      .map((entry) => entry.name);
  } catch {
    return [];
  }
}

/**
 * One snapshot, when it exists.
 *
 * @param root The sandbox's state root.
 * @param name Its (valid) name.
 * @returns Its record, or undefined when there is no such snapshot.
 */
export function readSnapshot(root: string, name: string): SnapshotInfo | undefined {
  const dir = join(storeDir(root), name);
  let image: Deno.FileInfo;
  try {
    image = Deno.lstatSync(join(dir, IMAGE_FILE));
  } catch {
    return undefined;
  }
  if (!image.isFile) return undefined;
  const bytes = (image.blocks ?? 0) * 512;
  const fallback: SnapshotInfo = {
    name,
    createdAt: image.mtime?.toISOString() ?? new Date(0).toISOString(),
    bytes,
    volumeBytes: image.size,
    saveMs: 0,
  };
  try {
    const path = join(dir, META_FILE);
    if (Deno.lstatSync(path).size > META_MAX_BYTES) return fallback;
    const meta = metaSchema.safeParse(JSON.parse(Deno.readTextFileSync(path)));
    if (!meta.success || meta.data.name !== name) return fallback;
    const { createdAt, volumeBytes, saveMs } = meta.data;
    return { name, createdAt, bytes, volumeBytes, saveMs };
  } catch {
    return fallback;
  }
}

/**
 * Writes a snapshot's record into its (unpublished) directory.
 *
 * @param dir The directory.
 * @param info What to record (its `bytes` are read from the image instead).
 */
export function writeMeta(dir: string, info: Omit<SnapshotInfo, "bytes">): void {
  const record = { version: 1, ...info };
  Deno.writeTextFileSync(join(dir, META_FILE), `${JSON.stringify(record)}\n`, {
    createNew: true,
    mode: 0o600,
  });
}

/**
 * Deletes a snapshot directory the host made (its image and record), which
 * must no longer be published under a snapshot's name.
 *
 * @param dir The directory.
 * @throws {QueueError} When something is left.
 */
export async function deleteSnapshotDir(dir: string): Promise<void> {
  // Only the host writes here: removeTree all the same, so one rule removes trees.
  if (!(await removeTree(dir))) {
    throw new QueueError(`Cannot remove '${dir}': some of it is left for the next call`);
  }
}

/**
 * Removes what killed saves, removals and restores left in the store.
 * Callers hold the sandbox's lock, so none of it is still in use by a live
 * call of this host.
 *
 * @param root The sandbox's state root.
 */
export async function removeStoreLeftovers(root: string): Promise<void> {
  let names: string[] = [];
  try {
    names = [...Deno.readDirSync(storeDir(root))].map((entry) => entry.name)
      .filter((name) => LEFTOVER.test(name));
  } catch {
    return;
  }
  for (const name of names) await removeTree(join(storeDir(root), name)).catch(() => false);
}
