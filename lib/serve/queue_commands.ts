/**
 * The commands a sandbox's queue still knows that envd did not start (a
 * `waffle exec` into the sandbox, say): each request of the host's own
 * `inbound.db` (opened read-only; its payload checked by the queue's
 * schema), with the runner's view of it read through the queue
 * (`Queue.state`: `outbound.db`, written by the sandbox, opened by its
 * checked descriptor and validated row by row in `outbound_rows.ts`). A
 * request the queue has forgotten (acknowledged and collected) is gone;
 * output is not kept here, so its tails are empty.
 *
 * @module
 */
import type { Queue } from "../queue/queue.ts";
import { openDatabase, statement } from "../queue/connection.ts";
import { execPayloadSchema } from "../queue/protocol.ts";
import { capArgv, type ConsoleCommand } from "./command_log.ts";

/** Requests looked at per answer, at most. */
const MAX_REQUESTS = 200;

const SIGNALS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 };

/**
 * A queue's newest requests as console commands, leaving out those already known.
 *
 * @param queue The sandbox's open queue.
 * @param options The most returned, and request ids to leave out (envd's, in the command log).
 * @returns The commands, newest first; empty when the queue cannot be read.
 */
export function queueCommands(
  queue: Queue,
  options: { limit: number; known: ReadonlySet<string> },
): ConsoleCommand[] {
  let db;
  try {
    db = openDatabase(queue.paths.inbound, { role: "reader", busyTimeoutMs: 0 });
  } catch {
    return [];
  }
  try {
    const rows = statement(
      db,
      "SELECT id, payload, created_at FROM requests ORDER BY seq DESC LIMIT ?",
    ).all(Math.min(options.limit, MAX_REQUESTS)) as {
      id: string;
      payload: string;
      created_at: number;
    }[];
    return rows.filter((row) => !options.known.has(row.id)).flatMap((row) => {
      const command = commandOf(queue, row);
      return command === undefined ? [] : [command];
    });
  } catch {
    return [];
  } finally {
    db.close();
  }
}

function commandOf(
  queue: Queue,
  row: { id: string; payload: string; created_at: number },
): ConsoleCommand | undefined {
  let payload;
  try {
    const parsed = execPayloadSchema.safeParse(JSON.parse(row.payload));
    if (!parsed.success) return undefined;
    payload = parsed.data;
  } catch {
    return undefined;
  }
  let result;
  try {
    result = queue.state(row.id).result;
  } catch {
    // A bad row of the sandbox's, or a file busy now: shown as not known to have ended.
    result = undefined;
  }
  const startedAt = row.created_at;
  const argv = capArgv(payload.argv);
  return {
    id: row.id,
    pid: null,
    argv: argv.argv,
    ...(argv.truncated ? { argvTruncated: true as const } : {}),
    cwd: payload.cwd ?? null,
    startedAt: new Date(startedAt).toISOString(),
    endedAt: result === undefined ? null : new Date(startedAt + result.durationMs).toISOString(),
    durationMs: result === undefined ? null : Math.round(result.durationMs),
    exitCode: result?.exitCode ?? null,
    signal: result?.signal === undefined || result.signal === null
      ? null
      : SIGNALS[result.signal] ?? null,
    running: result === undefined,
    stdoutTail: "",
    stderrTail: "",
    truncated: result?.stdoutTruncated === true || result?.stderrTruncated === true,
  };
}
