/**
 * Where things are inside a sandbox, and the variables through which the
 * host tells its runner about the image: shared by the host (which builds
 * the container) and the runner (which lives in it). Import-free, so the
 * runner loads nothing for it.
 *
 * @module
 */

/** Where a sandbox finds its program: the artefact, Deno, the runtime kit, the runner cache. */
export const PROGRAM_DIR = "/opt/waffle";
/** The build directory's mount point (read-only): the artefact's entry and its chunks. */
export const SANDBOX_ARTEFACT_DIR = `${PROGRAM_DIR}/app`;
/** The runtime kit's mount point (read-only): glibc's loader and libraries, the spawn helper. */
export const SANDBOX_RUNTIME = `${PROGRAM_DIR}/rt`;
/** The runner cache's mount point (read-only): the warm Deno cache an install made. */
export const SANDBOX_RUNNER_CACHE = `${PROGRAM_DIR}/cache`;
/** The spawn helper the runtime kit brings (`image/spawn_helper.c`), whatever the image has. */
export const SANDBOX_SPAWN_HELPER = `${SANDBOX_RUNTIME}/spawn`;
/** The runtime kit's file-metadata reader (`image/metadata_helper.c`), when the kit has one. */
export const METADATA_READER = "metadata";
/** The host's channel directory's mount point (read-only): sockets a session's runner connects to. */
export const SANDBOX_CHANNEL_DIR = `${PROGRAM_DIR}/chan`;
/** Where the egress proxy's container sees the waffle home's `egress/` directory. */
export const PROXY_EGRESS_DIR = "/egress";
/** The runner's variable carrying the image's own `Env` (a JSON array) to its commands. */
export const IMAGE_ENV_VARIABLE = "WAFFLE_IMAGE_ENV";
/** The runner's variable carrying the image's `WorkingDir`: the default cwd of commands. */
export const IMAGE_WORKDIR_VARIABLE = "WAFFLE_IMAGE_WORKDIR";
