/**
 * waffle's error hierarchy. Every error that reaches the user is a
 * {@linkcode WaffleError} carrying the exit code the CLI returns (from
 * `exit_codes.ts`); anything else is a bug and `runCli` prints its stack.
 *
 * @module
 */
import { EXIT_WAFFLE } from "./exit_codes.ts";

/** Options shared by every waffle error. */
export interface WaffleErrorOptions {
  /** The underlying error. */
  cause?: unknown;
  /** Process exit code the CLI uses for this error; defaults to `EXIT_WAFFLE`. */
  exitCode?: number;
}

/**
 * Base class of every error waffle reports to a user.
 *
 * @example
 * ```ts
 * throw new WaffleError("Queue directory '/nope' does not exist");
 * ```
 */
export class WaffleError extends Error {
  /** Exit code the CLI returns when this error ends the program. */
  readonly exitCode: number;
  /**
   * Creates an error to report to the user.
   *
   * @param message One line: capital letter, no trailing period, offending value quoted.
   * @param options Cause and exit code.
   */
  constructor(message: string, options: WaffleErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "WaffleError";
    this.exitCode = options.exitCode ?? EXIT_WAFFLE;
  }
}

/** A user, config-file or CLI input was invalid. Nothing was created or run. */
export class UsageError extends WaffleError {
  /** Takes the same arguments as the {@linkcode WaffleError} constructor. */
  constructor(message: string, options: WaffleErrorOptions = {}) {
    super(message, options);
    this.name = "UsageError";
  }
}

/**
 * A config's MCP `package` is not pinned to one exact version (`@latest`, a
 * dist-tag, a range such as `^1`): it is refused at load. The CLI adds the
 * exact version npm would pick to the message (a registry lookup, so never
 * part of loading itself).
 */
export class UnpinnedPackageError extends UsageError {
  /** The package name, scope included: `@scope/name`. */
  readonly packageName: string;
  /** What stood after the name's `@` (empty when nothing did): a tag or a range. */
  readonly requested: string;
  /**
   * Creates the error.
   *
   * @param message One line naming the file, the key and the spec.
   * @param options The package name and what was asked for, cause and exit code.
   */
  constructor(
    message: string,
    options: WaffleErrorOptions & { packageName: string; requested: string },
  ) {
    super(message, options);
    this.name = "UnpinnedPackageError";
    this.packageName = options.packageName;
    this.requested = options.requested;
  }
}

/**
 * The configured image declares a `VOLUME` no capped tmpfs can cover (a
 * system directory, a path at, under or over waffle's own mounts, or one a
 * tmpfs cannot be mounted at): Docker would make it an anonymous volume on
 * the host's disk, with no size cap and outside the workspace quota. Refused
 * before any container of the image is made.
 */
export class UncoverableVolumeError extends UsageError {
  /** The image as named (a reference, or its id). */
  readonly image: string;
  /** The `VOLUME` path as the image declares it. */
  readonly volume: string;
  /** Why no capped tmpfs can cover it, e.g. `a system directory`. */
  readonly reason: string;
  /**
   * Creates the error.
   *
   * @param message One line naming the image, the path, why, and what to do.
   * @param options The image, the path and the reason, cause and exit code.
   */
  constructor(
    message: string,
    options: WaffleErrorOptions & { image: string; volume: string; reason: string },
  ) {
    super(message, options);
    this.name = "UncoverableVolumeError";
    this.image = options.image;
    this.volume = options.volume;
    this.reason = options.reason;
  }
}

/** The queue files could not be opened, had the wrong schema, or failed a write. */
export class QueueError extends WaffleError {
  /** Takes the same arguments as the {@linkcode WaffleError} constructor. */
  constructor(message: string, options: WaffleErrorOptions = {}) {
    super(message, options);
    this.name = "QueueError";
  }
}

/**
 * A row written by the sandbox side was malformed, oversized, duplicated or
 * hostile. It fails only the request it belongs to.
 */
export class ProtocolError extends WaffleError {
  /** Takes the same arguments as the {@linkcode WaffleError} constructor. */
  constructor(message: string, options: WaffleErrorOptions = {}) {
    super(message, options);
    this.name = "ProtocolError";
  }
}

/** The Docker daemon was unreachable or refused a request. */
export class DockerError extends WaffleError {
  /** HTTP status the daemon answered with, when it answered. */
  readonly status: number | undefined;
  /**
   * Creates a Docker error.
   *
   * @param message One-line reason.
   * @param options Cause, exit code and HTTP status.
   */
  constructor(message: string, options: WaffleErrorOptions & { status?: number } = {}) {
    super(message, options);
    this.name = "DockerError";
    this.status = options.status;
  }
}

/** The sandbox runner is not alive (no heartbeat) or could not be started. */
export class RunnerError extends WaffleError {
  /** Takes the same arguments as the {@linkcode WaffleError} constructor. */
  constructor(message: string, options: WaffleErrorOptions = {}) {
    super(message, options);
    this.name = "RunnerError";
  }
}

/**
 * The sandbox is paused (`waffle pause`): it takes no command until it is
 * resumed. Nothing was queued, so nothing runs later or twice.
 */
export class SandboxPausedError extends WaffleError {
  /** The paused sandbox's tenant. */
  readonly tenant: string;
  /** The paused sandbox's user. */
  readonly user: string;
  /**
   * Creates the error; its message names the sandbox and how to resume it.
   *
   * @param sandbox Whose sandbox is paused.
   * @param options Cause and exit code.
   */
  constructor(sandbox: { tenant: string; user: string }, options: WaffleErrorOptions = {}) {
    super(
      `Sandbox '${sandbox.user}' of tenant '${sandbox.tenant}' is paused; resume it with 'waffle resume --user ${sandbox.user} --tenant ${sandbox.tenant}'`,
      options,
    );
    this.name = "SandboxPausedError";
    this.tenant = sandbox.tenant;
    this.user = sandbox.user;
  }
}

/** Why the host could not read a file the sandbox can write. */
export type SandboxFileProblem = "missing" | "busy" | "damaged";

/**
 * A file the sandbox side writes (`outbound.db`) is missing, locked, or
 * damaged or hostile (not a regular file, not a database, another schema).
 * The host never repairs such a file in place: a damaged queue is replaced
 * with a fresh one on the user's next call.
 */
export class SandboxFileError extends QueueError {
  /** What is wrong with the file. */
  readonly problem: SandboxFileProblem;
  /**
   * Creates the error.
   *
   * @param message One-line reason naming the file.
   * @param options The problem, cause and exit code.
   */
  constructor(message: string, options: WaffleErrorOptions & { problem: SandboxFileProblem }) {
    super(message, options);
    this.name = "SandboxFileError";
    this.problem = options.problem;
  }
}

/**
 * A file copy into or out of a sandbox failed or was refused: a missing
 * path, a full disk quota, or an entry the copy never extracts (a link, a
 * device, a FIFO, a name with `..`). Nothing is left half-copied.
 */
export class FilesError extends WaffleError {
  /** Takes the same arguments as the {@linkcode WaffleError} constructor. */
  constructor(message: string, options: WaffleErrorOptions = {}) {
    super(message, options);
    this.name = "FilesError";
  }
}

/**
 * A `waffle doctor --deep` check could not run to its end: a wait timed
 * out, or a helper (the lock holder, a probe) failed. The check reports it
 * as a failure of the harness, never as a pass.
 */
export class CertifyError extends WaffleError {
  /** Takes the same arguments as the {@linkcode WaffleError} constructor. */
  constructor(message: string, options: WaffleErrorOptions = {}) {
    super(message, options);
    this.name = "CertifyError";
  }
}

/**
 * A thrown value's message as one line of at most 300 characters, for a
 * note or a reason that reaches a terminal or a log.
 *
 * @example
 * ```ts
 * oneLineOf(new Error("first\nsecond")); // "first"
 * ```
 *
 * @param error A thrown value.
 * @returns Its message's first line.
 */
export function oneLineOf(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split("\n")[0]!.slice(0, 300);
}

/**
 * The Kubernetes API server refused or failed a call (`[backend] kind =
 * "kubernetes"`): its HTTP status and reason, as its `Status` said.
 */
export class KubeApiError extends WaffleError {
  /** The HTTP status (0: no answer, e.g. the server unreachable). */
  readonly status: number;
  /** The `Status` reason (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, …), or "". */
  readonly reason: string;
  /**
   * Creates the error.
   *
   * @param message One line naming the call and what the API server said.
   * @param options The status, reason and cause.
   */
  constructor(message: string, options: WaffleErrorOptions & { status: number; reason: string }) {
    super(message, options);
    this.name = "KubeApiError";
    this.status = options.status;
    this.reason = options.reason;
  }
}
