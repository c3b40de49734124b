/**
 * The name the runner gives its heartbeat thread: the bundled artefact,
 * started as a worker under this name, runs only the heartbeat.
 *
 * @module
 */

/** The heartbeat worker's name. */
export const HEARTBEAT_WORKER = "waffle-heartbeat";
