/**
 * The shape every certification check returns: its status, its figures, and
 * for a failure the modes it failed in, named after the support statement's
 * failure modes so the verdict can say which one this installation shows.
 *
 * @module
 */

/** How a check ended. A skip never counts as a pass. */
export type CheckStatus = "passed" | "failed" | "skipped";

/** Where the queue's files were during a check. */
export type QueueMount = "bind mount" | "volume";

/**
 * A way an installation can fail the queue's assumptions:
 *
 * - `busy`: SQLite lock timeouts under load (a lock-exclusion / SQLITE_BUSY storm).
 * - `heartbeat`: a heartbeat gap over 4 s or an unreadable heartbeat (stale page cache, missed heartbeats).
 * - `lost results`: requests without a result, duplicate ids, outputs that do not match.
 * - `lock not honoured`: a result committed while the host held an exclusive lock.
 * - `corruption`: `PRAGMA integrity_check` not ok (fsync not honoured, corruption after kill).
 * - `runner`: the container stopped, restarted or was not killed as asked.
 * - `pids limit`: the limit was not read back, or was exceeded.
 * - `harness`: the check itself could not run to its end (an error, a timeout).
 * - `image`: waffle refuses to run the configured image (a VOLUME no capped tmpfs can cover).
 */
export type FailureMode =
  | "busy"
  | "heartbeat"
  | "lost results"
  | "lock not honoured"
  | "corruption"
  | "runner"
  | "pids limit"
  | "harness"
  | "image";

/** One reason a check failed. */
export interface Failure {
  /** The failure mode. */
  mode: FailureMode;
  /** One line with the offending figure. */
  detail: string;
}

/** A check's outcome: status, one-line summary, figures, and why it failed or was skipped. */
export interface CheckResult<F> {
  /** What was checked, e.g. `stress`, `kill mid-write`, `fork bomb`. */
  name: string;
  /** Where the queue's files were (absent for checks without a queue). */
  mount?: QueueMount | undefined;
  /** How it ended. */
  status: CheckStatus;
  /** How long it took. */
  ms: number;
  /** One line with its figures (or the reason it was skipped). */
  summary: string;
  /** Why it failed; empty unless `status` is `failed`. */
  failures: Failure[];
  /** Why it was skipped; undefined unless `status` is `skipped`. */
  skipped?: string | undefined;
  /** The figures measured; undefined when skipped before measuring. */
  figures: F | undefined;
}

/** Any check's result, figures untyped (the report's rows). */
export type AnyCheck = CheckResult<unknown>;

/**
 * A check's result from its figures and the failures found in them.
 *
 * @param name What was checked.
 * @param options Mount, start time (`performance.now()`), summary, figures and failures.
 * @returns `passed` when there is no failure, else `failed`.
 *
 * @example
 * ```ts
 * import { judged } from "./check.ts";
 * judged("fork bomb", { started: 0, summary: "peak 32", figures: {}, failures: [] }).status; // "passed"
 * ```
 */
export function judged<F>(
  name: string,
  options: {
    mount?: QueueMount | undefined;
    started: number;
    summary: string;
    figures: F;
    failures: Failure[];
  },
): CheckResult<F> {
  return {
    name,
    mount: options.mount,
    status: options.failures.length === 0 ? "passed" : "failed",
    ms: performance.now() - options.started,
    summary: options.summary,
    failures: options.failures,
    figures: options.figures,
  };
}

/**
 * A check that did not run.
 *
 * @param name What would have been checked.
 * @param options Mount and the reason.
 * @returns A `skipped` result.
 *
 * @example
 * ```ts
 * import { skippedCheck } from "./check.ts";
 * skippedCheck("stress", { reason: "no Docker daemon" }).summary; // "skipped: no Docker daemon"
 * ```
 */
export function skippedCheck<F = never>(
  name: string,
  options: { mount?: QueueMount | undefined; reason: string },
): CheckResult<F> {
  return {
    name,
    mount: options.mount,
    status: "skipped",
    ms: 0,
    summary: `skipped: ${options.reason}`,
    failures: [],
    skipped: options.reason,
    figures: undefined,
  };
}

/**
 * A check that broke off with an error: failed in the `harness` mode.
 *
 * @param name What was checked.
 * @param options Mount, start time and the error's message.
 * @returns A `failed` result.
 *
 * @example
 * ```ts
 * import { brokenCheck } from "./check.ts";
 * brokenCheck("stress", { started: 0, message: "Timed out" }).failures[0]?.mode; // "harness"
 * ```
 */
export function brokenCheck<F = never>(
  name: string,
  options: { mount?: QueueMount | undefined; started: number; message: string },
): CheckResult<F> {
  return {
    name,
    mount: options.mount,
    status: "failed",
    ms: performance.now() - options.started,
    summary: `could not finish: ${options.message}`,
    failures: [{ mode: "harness", detail: options.message }],
    figures: undefined,
  };
}

/**
 * The check's name with its mount, as the report's rows show it.
 *
 * @param check A result.
 * @returns E.g. `stress (bind mount)`.
 *
 * @example
 * ```ts
 * import { checkLabel, skippedCheck } from "./check.ts";
 * checkLabel(skippedCheck("stress", { mount: "volume", reason: "x" })); // "stress (volume)"
 * ```
 */
export function checkLabel(check: AnyCheck): string {
  return check.mount === undefined ? check.name : `${check.name} (${check.mount})`;
}
