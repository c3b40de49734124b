/**
 * Per-user host state: `$WAFFLE_HOME/sandboxes/<hash>/{queue,workspace}`.
 *
 * @module
 */
import { dirname } from "node:path";
import { QueueError } from "../errors.ts";
import { messageOf } from "../queue/connection.ts";
import { initQueue } from "../queue/schema.ts";
import type { StatePaths } from "./identity.ts";
import { hostCanChown, SANDBOX_UID } from "./posture.ts";

/**
 * Creates a sandbox's state directory if it does not exist. It is built
 * under a temporary name and renamed into place, so a failure never leaves a
 * half-created state directory behind.
 *
 * The root is mode 0700 and owned by the sandbox uid; `workspace/` likewise;
 * `queue/` is shared (see `initQueue`'s `shared` option for why).
 *
 * @param paths The sandbox's state paths.
 * @throws {QueueError} When the directories cannot be created.
 */
export function prepareState(paths: StatePaths): void {
  Deno.mkdirSync(dirname(paths.lock), { recursive: true, mode: 0o700 });
  try {
    if (Deno.statSync(paths.root).isDirectory) {
      // Exists: make sure the queue files are there and speak our schema.
      initQueue(paths.queue, { shared: true });
      return;
    }
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  Deno.mkdirSync(dirname(paths.root), { recursive: true, mode: 0o711 });
  const staging = `${paths.root}.staging-${crypto.randomUUID().slice(0, 8)}`;
  try {
    Deno.mkdirSync(staging, { mode: 0o700 });
    initQueue(`${staging}/queue`, { shared: true });
    Deno.mkdirSync(`${staging}/workspace`, { mode: 0o700 });
    if (hostCanChown()) {
      Deno.chownSync(`${staging}/workspace`, SANDBOX_UID, SANDBOX_UID);
      Deno.chownSync(staging, SANDBOX_UID, SANDBOX_UID);
    }
    Deno.renameSync(staging, paths.root);
  } catch (cause) {
    Deno.removeSync(staging, { recursive: true });
    // Another process won the race to create it: theirs is complete.
    if (cause instanceof Deno.errors.AlreadyExists || /not empty|exists/i.test(messageOf(cause))) {
      return;
    }
    throw new QueueError(`Cannot create sandbox state '${paths.root}': ${messageOf(cause)}`, {
      cause,
    });
  }
}

/**
 * Whether a sandbox's state directory still exists. Only a definite "not
 * there" counts as gone: a path this process may not look into (another
 * user's home) is reported as existing, so sweep never mistakes someone
 * else's live sandbox for an orphan.
 *
 * @param root The state root.
 * @returns False when it is missing or not a directory.
 */
export function stateExists(root: string): boolean {
  try {
    return Deno.statSync(root).isDirectory;
  } catch (error) {
    return !(error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory);
  }
}
