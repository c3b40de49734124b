/**
 * The evidence a certification run records: a header naming the
 * installation (Docker server, API, OS, architecture, drivers, kernel, the
 * queue's mount, waffle's version and artefact digest), one row per check
 * with its figures, and a verdict naming the failing mode(s). A skip is
 * never a pass: a run with one is "not certified".
 *
 * @module
 */
import type { BuildIdentity } from "../config/build_identity.ts";
import { type DaemonFacts, describeDaemon } from "../docker/facts.ts";
import { type AnyCheck, checkLabel, type FailureMode, type QueueMount } from "./check.ts";
import type { CleanupReport } from "./cleanup.ts";

/** Who and what a run certifies. */
export interface EvidenceHeader {
  /** The daemon's facts; null when there is no daemon. */
  docker: DaemonFacts | null;
  /** Why there is no daemon; null when there is one. */
  dockerUnavailable: string | null;
  /** Where the client looked for the daemon. */
  endpoint: string;
  /** This host. */
  host: { os: string; arch: string; kernel: string };
  /** What the queue's files sat on, per mount the run used. */
  queueMounts: Partial<Record<QueueMount, string>>;
  /** The configured image and its id (null when not found or not looked up). */
  image: { ref: string; id: string | null };
  /** The waffle that ran. */
  waffle: BuildIdentity;
}

/** `supported`: every check passed; `not supported`: one failed; `not certified`: one did not run. */
export type VerdictStatus = "supported" | "not supported" | "not certified";

/** The run's verdict. */
export interface Verdict {
  /** The outcome. */
  status: VerdictStatus;
  /** One line, e.g. `not supported: lock exclusion / SQLITE_BUSY storm in stress (bind mount): …`. */
  line: string;
  /** Each failing (or skipped) check with its mode. */
  failing: { check: string; mode: FailureMode | "skipped"; detail: string }[];
}

/** A whole run: header, rows, verdict, and what was cleaned up. */
export interface CertifyReport {
  /** The run's id: the value of the `waffle.certify` label on what it created. */
  runId: string;
  /** The installation. */
  header: EvidenceHeader;
  /** One per check, in the order run. */
  checks: AnyCheck[];
  /** The verdict. */
  verdict: Verdict;
  /** What the run removed afterwards, and anything it could not. */
  cleanup: CleanupReport;
}

/** The support statement's names of the failure modes. */
export const FAILURE_MODE_NAMES: Readonly<Record<FailureMode, string>> = {
  busy: "lock exclusion / SQLITE_BUSY storm",
  heartbeat: "stale page cache / missed heartbeats",
  "lost results": "lost or mismatched results",
  "lock not honoured": "lock exclusion not honoured",
  corruption: "fsync not honoured / corruption after kill",
  runner: "runner stopped or restarted",
  "pids limit": "pids limit not enforced",
  harness: "check could not finish",
  image: "an image waffle refuses to run",
};

/**
 * The verdict on a run's checks.
 *
 * @param checks The checks run (or skipped).
 * @param header The header (a missing daemon is named first).
 * @returns The verdict.
 *
 * @example
 * ```ts ignore
 * verdictOf(report.checks, report.header).line; // "supported: every check passed on this installation (bind mount)"
 * ```
 */
export function verdictOf(checks: AnyCheck[], header: EvidenceHeader): Verdict {
  const failing = checks.flatMap((check) =>
    check.failures.map((failure) => ({ check: checkLabel(check), ...failure }))
  );
  if (failing.length > 0) {
    const named = failing.map((f) => `${FAILURE_MODE_NAMES[f.mode]} in ${f.check}`);
    return {
      status: "not supported",
      line: `not supported: ${[...new Set(named)].join("; ")} (${failing[0]!.detail})`,
      failing,
    };
  }
  const skipped = checks.filter((check) => check.status === "skipped");
  if (header.docker === null || skipped.length > 0 || checks.length === 0) {
    const why = header.docker === null
      ? `no Docker daemon (${header.dockerUnavailable ?? "unreachable"})`
      : skipped.map((check) => `${checkLabel(check)} ${check.summary}`).join("; ");
    return {
      status: "not certified",
      line: `not certified: ${why || "no check ran"}`,
      failing: skipped.map((check) => ({
        check: checkLabel(check),
        mode: "skipped",
        detail: check.skipped ?? "",
      })),
    };
  }
  const mounts = [...new Set(checks.flatMap((check) => check.mount ?? []))].join(", ");
  return {
    status: "supported",
    line: `supported: every check passed on this installation (${mounts})`,
    failing: [],
  };
}

/**
 * The report as text: the header lines, a row per check, the verdict.
 *
 * @param report The run.
 * @returns Lines ending in a newline.
 *
 * @example
 * ```ts ignore
 * await io.stdout(formatReport(report));
 * ```
 */
export function formatReport(report: CertifyReport): string {
  const rows = report.checks.map((check) => {
    const tag = check.status === "passed" ? "PASS" : check.status === "failed" ? "FAIL" : "SKIP";
    return `${tag}  ${checkLabel(check).padEnd(28)} ${
      check.ms.toFixed(0).padStart(7)
    } ms  ${check.summary}`;
  });
  const problems = report.cleanup.problems.map((problem) => `cleanup problem: ${problem}`);
  return [
    ...headerLines(report.header),
    "",
    ...rows,
    ...problems,
    `verdict: ${report.verdict.line}`,
    "",
  ].join("\n");
}

function headerLines(header: EvidenceHeader): string[] {
  const line = (name: string, value: string): string => `${name.padEnd(19)} ${value}`;
  const docker = header.docker;
  const waffle = header.waffle;
  const mounts = Object.entries(header.queueMounts).map(([kind, seen]) =>
    line(`queue (${kind})`, seen)
  );
  return [
    "waffle doctor --deep: evidence",
    docker === null
      ? line("docker", `unavailable: ${header.dockerUnavailable}`)
      : line("docker", `${describeDaemon(docker)}, at '${docker.endpoint}'`),
    ...(docker === null ? [] : [
      line("docker os", `${docker.operatingSystem} (${docker.osType}), kernel ${docker.kernel}`),
    ]),
    line("host", `${header.host.os} ${header.host.arch}, kernel ${header.host.kernel}`),
    ...(mounts.length === 0 ? [line("queue", "not looked at (no sandbox ran)")] : mounts),
    line(
      "image",
      `${header.image.ref}${header.image.id === null ? "" : ` = ${header.image.id}`}`,
    ),
    line(
      "waffle",
      `${waffle.version}, ${waffle.kind} ${waffle.path}${
        waffle.digest === undefined ? "" : `, sha256 ${waffle.digest}`
      }`,
    ),
    ...(waffle.runner === undefined
      ? []
      : [line("runner", `${waffle.runner.path}, sha256 ${waffle.runner.digest}`)]),
  ];
}
