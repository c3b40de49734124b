/**
 * Where the bundled artefact keeps the heartbeat worker's own bundle: the
 * runner starts it from a blob URL, so the thread loads a few kilobytes
 * instead of the whole artefact.
 *
 * @module
 */

/** The global the artefact defines with the heartbeat worker's source. */
export const HEARTBEAT_SOURCE = "__waffleHeartbeatSource";
