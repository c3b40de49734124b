/**
 * The queue files' schema version, on its own so that what only opens a
 * file (the runner's heartbeat thread) loads no validation library.
 *
 * @module
 */

/** Bumped whenever either file's schema changes; stored in `PRAGMA user_version`. */
export const SCHEMA_VERSION = 5;
