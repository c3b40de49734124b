/**
 * The warm path of `submit`: what the last full ensure verified, kept where
 * only the host can write (`<root>/warm.json`, in the host's 0700 state
 * root, which no container mounts), and the checks under which it still
 * holds, so a warm sandbox takes one Docker call instead of two plus a
 * volume and directory check.
 *
 * The record holds while all of these are true, each read afresh:
 * - the image tag still names the same image id (asked of the daemon: a
 *   same-tag rebuild must recycle);
 * - the posture computed from today's config, artefact and paths is the
 *   container's (a config change or a new build must recycle);
 * - the container's init process is alive: the pid and start time Docker
 *   reported, read from `/proc` (the kernel's word, not the sandbox's);
 * - the runner the host saw boot in that container still serves: the same
 *   boot id, judged alive by `Queue.liveness` (the one judgement: its
 *   heartbeat changing by the host's clock; a paused container stops
 *   changing it).
 *
 * A sandbox that forges its heartbeat can only make its own, running
 * container look warm; the host's wait still judges liveness and revives
 * through the full ensure.
 *
 * @module
 */
import { join } from "../path.ts";
import * as z from "../schema.ts";
import { processMark } from "../process_mark.ts";
import type { Queue } from "../queue/queue.ts";
import type { VolumeStatus } from "./quota.ts";
import type { ImageFacts } from "./posture.ts";
import { writeJsonRecord } from "../fs.ts";

/** What a full ensure verified about a running sandbox. */
export interface WarmRecord {
  /** The container's id. */
  containerId: string;
  /** The image it runs: its id and the settings the sandbox took from it. */
  image: ImageFacts;
  /** Its posture hash. */
  postureHash: string;
  /** "pid starttime" of its init process, as the host sees it. */
  process: string;
  /** The boot id of the runner that was ready after the ensure. */
  bootId: string;
  /** The volume as the ensure left it. */
  volume: VolumeStatus;
}

const recordSchema = z.object({
  containerId: z.string(),
  image: z.object({
    id: z.string(),
    env: z.array(z.string()),
    workingDir: z.string(),
    volumes: z.array(z.string()),
  }),
  postureHash: z.string(),
  process: z.string(),
  bootId: z.string(),
  volume: z.object({
    enforced: z.boolean(),
    bytes: z.number(),
    mountPoint: z.string(),
    reason: z.optional(z.string()),
  }),
});

const FILE = "warm.json";

/**
 * Reads a sandbox's warm record.
 *
 * @param root The sandbox's state root.
 * @returns The record, or undefined when there is none or it is unreadable.
 */
export function readWarm(root: string): WarmRecord | undefined {
  try {
    const text = Deno.readTextFileSync(join(root, FILE));
    if (text.length > 256 * 1024) return undefined;
    const parsed = recordSchema.safeParse(JSON.parse(text));
    if (!parsed.success) return undefined;
    const { reason, ...volume } = parsed.data.volume;
    return { ...parsed.data, volume: reason === undefined ? volume : { ...volume, reason } };
  } catch {
    return undefined;
  }
}

/**
 * Records what a full ensure verified (atomically), or forgets it.
 *
 * @param root The sandbox's state root.
 * @param record The record; undefined removes it.
 */
export function writeWarm(root: string, record: WarmRecord | undefined): void {
  writeJsonRecord(join(root, FILE), record);
}

/**
 * The mark a record keeps of a container's init process.
 *
 * @param pid The pid Docker reports for the container.
 * @returns "pid starttime", or undefined when it is not visible here.
 */
export function initMark(pid: number): string | undefined {
  return pid > 0 ? processMark(pid) : undefined;
}

/**
 * The init pid a record names.
 *
 * @param record The record.
 * @returns The pid (NaN when the record is malformed).
 */
export function recordedPid(record: WarmRecord): number {
  return Number(record.process.split(" ")[0]);
}

/**
 * Whether a warm record still holds (see the module's list).
 *
 * @param record The record.
 * @param today Today's image id (undefined: unknown), posture hash and queue.
 * @returns True when the sandbox can take a submission without an ensure.
 */
export function stillWarm(
  record: WarmRecord,
  today: { imageId: string | undefined; postureHash: string; queue: Queue },
): boolean {
  if (today.imageId !== record.image.id || today.postureHash !== record.postureHash) return false;
  const pid = recordedPid(record);
  if (!Number.isSafeInteger(pid) || initMark(pid) !== record.process) return false;
  const judged = today.queue.liveness();
  return judged.state === "alive" && judged.beat?.bootId === record.bootId;
}
