/**
 * The host's record of a sandbox's pause (`pause.ts` does the pausing):
 * `<root>/pause.json`, in the 0700 state root no container mounts, read on
 * every submission (a small file, no Docker call) and by a waiting host
 * before it repairs a runner it judged in trouble.
 *
 * @module
 */
import { SandboxPausedError } from "../errors.ts";
import { join } from "../path.ts";
import { STALE_AFTER_MS } from "../queue/liveness.ts";
import * as z from "../schema.ts";
import { writeJsonRecord } from "../fs.ts";

/** The host's record of a sandbox's last pause or resume. */
export interface PauseRecord {
  /** `paused` from just before the freeze until the resume has seen the runner beat again. */
  state: "paused" | "resumed";
  /** When it was written, by the host's clock (ms since epoch). */
  at: number;
}

const recordSchema = z.object({
  state: z.enum(["paused", "resumed"]),
  at: z.number(),
});

const FILE = "pause.json";

/**
 * Reads a sandbox's pause record.
 *
 * @param root The sandbox's state root.
 * @returns The record; undefined when there is none or it is unreadable.
 */
export function readPause(root: string): PauseRecord | undefined {
  try {
    const text = Deno.readTextFileSync(join(root, FILE));
    if (text.length > 1024) return undefined;
    const parsed = recordSchema.safeParse(JSON.parse(text));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Writes a sandbox's pause record (atomically), or forgets it.
 *
 * @param root The sandbox's state root.
 * @param record The record; undefined removes it.
 */
export function writePause(root: string, record: PauseRecord | undefined): void {
  writeJsonRecord(join(root, FILE), record);
}

/**
 * Forgets a sandbox's pause record (its container was removed or stopped).
 *
 * @param root The sandbox's state root.
 */
export function clearPause(root: string): void {
  writePause(root, undefined);
}

/**
 * Throws when the host's record says the sandbox is paused.
 *
 * @param root The sandbox's state root.
 * @param key Whose sandbox (for the message).
 * @throws {SandboxPausedError} When it is paused.
 */
export function refuseIfPaused(root: string, key: { tenant: string; user: string }): void {
  if (readPause(root)?.state === "paused") throw new SandboxPausedError(key);
}

/**
 * Whether a runner judged in trouble at or before `judgedBy` was only
 * paused: the sandbox is paused now, or was resumed so recently that the
 * runner has not had the time to miss a beat since.
 *
 * @param root The sandbox's state root.
 * @param judgedBy When the judgement was made at the latest (ms since epoch).
 * @returns True when the trouble is void.
 */
export function judgedWhilePaused(root: string, judgedBy: number): boolean {
  const record = readPause(root);
  if (record === undefined) return false;
  return record.state === "paused" || record.at > judgedBy - STALE_AFTER_MS;
}
