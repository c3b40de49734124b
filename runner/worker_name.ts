/**
 * The heartbeat worker's file in the bundled artefact: the build bundles
 * `runner/heartbeat_worker.ts` on its own into this file beside the entry,
 * so the thread loads a few kilobytes (with Deno's code cache) instead of
 * the whole artefact.
 *
 * @module
 */

/** The heartbeat worker's bundle, in the artefact's build directory. */
export const HEARTBEAT_BUNDLE = "heartbeat_worker.js";
