/**
 * Typed {@linkcode DockerError} subclasses for the HTTP statuses callers
 * branch on: 404 (gone) and 409 (conflict, e.g. a container name in use).
 *
 * @module
 */
import { DockerError, type WaffleErrorOptions } from "../errors.ts";

/** The daemon answered 404: the container, image or exec does not exist. */
export class DockerNotFoundError extends DockerError {
  /**
   * Creates a 404 error.
   *
   * @param message One-line reason.
   * @param options Cause and exit code; the status is always 404.
   */
  constructor(message: string, options: WaffleErrorOptions = {}) {
    super(message, { ...options, status: 404 });
    this.name = "DockerNotFoundError";
  }
}

/**
 * The daemon answered 409: the request conflicts with current state, e.g. the
 * container name is taken (callers may adopt that container) or it is not running.
 */
export class DockerConflictError extends DockerError {
  /**
   * Creates a 409 error.
   *
   * @param message One-line reason.
   * @param options Cause and exit code; the status is always 409.
   */
  constructor(message: string, options: WaffleErrorOptions = {}) {
    super(message, { ...options, status: 409 });
    this.name = "DockerConflictError";
  }
}
