/**
 * The stress load: a mix of requests whose every output names its tool-use
 * id (so a result delivered to the wrong request cannot match), and the loop
 * that submits, collects, checks, acknowledges and collects garbage until a
 * deadline. `waffle doctor --deep` and the test suite drive the same loop.
 *
 * @module
 */
import { isBusyError, messageOf } from "../queue/connection.ts";
import type { Queue, SubmitOptions } from "../queue/queue.ts";
import type { HeartbeatStats } from "./heartbeat_observer.ts";

const encoder = new TextEncoder();

/** One request of the load mix and what it must produce. */
export interface StressRequest {
  /** What to submit. */
  options: SubmitOptions & { toolUseId: string };
  /** Its exact stdout. */
  stdout: string;
  /** Its exact stderr. */
  stderr: string;
  /** Its exit code. */
  exitCode: number;
}

/**
 * The `n`-th request of the load mix: plain argv, a shell with stderr, stdin
 * through `cat`, and a non-zero exit. Needs `sh`, `echo` and `cat` in the image.
 *
 * @param toolUseId Unique id of the request.
 * @param n Selects the kind.
 * @returns Submit options and the expected outcome.
 *
 * @example
 * ```ts
 * import { stressRequest } from "./stress_loop.ts";
 * stressRequest("a-0", 0).stdout; // "a-0\n"
 * ```
 */
export function stressRequest(toolUseId: string, n: number): StressRequest {
  switch (n % 4) {
    case 0:
      return {
        options: { argv: ["echo", toolUseId], toolUseId },
        stdout: `${toolUseId}\n`,
        stderr: "",
        exitCode: 0,
      };
    case 1:
      return {
        options: { shell: `echo ${toolUseId}; echo err-${toolUseId} >&2`, toolUseId },
        stdout: `${toolUseId}\n`,
        stderr: `err-${toolUseId}\n`,
        exitCode: 0,
      };
    case 2:
      return {
        options: { argv: ["cat"], stdin: encoder.encode(`in-${toolUseId}\n`), toolUseId },
        stdout: `in-${toolUseId}\n`,
        stderr: "",
        exitCode: 0,
      };
    default:
      return {
        options: { shell: `echo ${toolUseId}; echo e >&2; exit 3`, toolUseId },
        stdout: `${toolUseId}\n`,
        stderr: "e\n",
        exitCode: 3,
      };
  }
}

/** What a set of stress loops did. */
export interface StressSummary {
  /** Submits that resolved. */
  requests: number;
  /** Collects that returned a result. */
  results: number;
  /** Results whose output or exit code did not match the request. */
  mismatches: string[];
  /** Tool-use ids of the resolved submits. */
  toolUseIds: string[];
  /** Every error thrown by the queue API. */
  errors: string[];
  /** How many of `errors` were lock timeouts. */
  busyErrors: number;
  /** Requests forgotten by `gc()`. */
  collected: number;
  /** The largest heartbeat gap this process saw (see `HeartbeatObserver`). */
  heartbeat?: HeartbeatStats;
}

/**
 * An empty summary.
 *
 * @returns A summary with zero counts.
 *
 * @example
 * ```ts
 * import { newSummary } from "./stress_loop.ts";
 * newSummary().requests; // 0
 * ```
 */
export function newSummary(): StressSummary {
  return {
    requests: 0,
    results: 0,
    mismatches: [],
    toolUseIds: [],
    errors: [],
    busyErrors: 0,
    collected: 0,
  };
}

/**
 * Submits, collects, verifies and acknowledges requests one after another
 * until `deadline`; every 8th request also runs `gc()`. Never throws: every
 * failure is counted in the summary.
 *
 * @param queue The host handle (may be shared by several loops).
 * @param options `prefix` makes the tool-use ids unique, `deadline` (epoch
 * ms) ends the loop, `summary` receives the counts.
 *
 * @example
 * ```ts ignore
 * const summary = newSummary();
 * await stressLoop(queue, { prefix: "w0", deadline: Date.now() + 5000, summary });
 * ```
 */
export async function stressLoop(
  queue: Queue,
  options: { prefix: string; deadline: number; summary: StressSummary },
): Promise<void> {
  const { prefix, deadline, summary } = options;
  const decoder = new TextDecoder();
  for (let n = 0; Date.now() < deadline; n++) {
    const request = stressRequest(`${prefix}-${n}`, n);
    try {
      const id = await queue.submit(request.options);
      summary.requests++;
      summary.toolUseIds.push(request.options.toolUseId);
      const { result, stdout, stderr } = await queue.collect(id);
      summary.results++;
      const got = {
        stdout: decoder.decode(stdout),
        stderr: decoder.decode(stderr),
        exitCode: result.exitCode,
      };
      if (
        got.stdout !== request.stdout || got.stderr !== request.stderr ||
        got.exitCode !== request.exitCode || result.requestId !== id
      ) {
        summary.mismatches.push(`${request.options.toolUseId}: ${JSON.stringify(got)}`);
      }
      await queue.ack(id);
      if (n % 8 === 7) summary.collected += await queue.gc();
    } catch (error) {
      if (isBusyError(error)) summary.busyErrors++;
      summary.errors.push(`${request.options.toolUseId}: ${messageOf(error)}`);
    }
  }
}
