/**
 * The MCP audit log: one JSON line per `tools/call` from the client and per
 * request from the server to the client (`sampling/createMessage`,
 * `roots/list`, …), appended to `$WAFFLE_HOME/audit.jsonl`. Argument names
 * are recorded, never their values; a server request's params are never
 * recorded. Each line is one `write` on a file opened with `O_APPEND`, so
 * concurrent sessions never interleave within a line.
 *
 * @module
 */
import { join } from "../path.ts";
import { openJsonLines } from "../jsonl_log.ts";

/**
 * How a request ended: ok, tool_error (result.isError), error (a JSON-RPC
 * error response), denied (a `tools/call` outside `tools`), refused (a
 * server request outside `client_requests`, never shown to the client),
 * no_response (the session ended first), cancelled (its sender sent
 * `notifications/cancelled`; the duration runs to then), too_large (it, or
 * its answer, was over the server's `max_message_bytes`; answered with an
 * error), unaudited (a summary line: `count` more server requests of this
 * session, past the per-session line limit).
 */
export type AuditOutcome =
  | "ok"
  | "tool_error"
  | "error"
  | "denied"
  | "refused"
  | "no_response"
  | "cancelled"
  | "too_large"
  | "unaudited";

/** One audit line. */
export interface AuditRecord {
  /** When the request was received (ISO 8601). */
  time: string;
  /** The sandbox user, or null for a host server run without `--user`. */
  user: string | null;
  /** The user's tenant. */
  tenant: string;
  /** The group whose policy applied. */
  group: string;
  /** The cron job, or null. */
  cron: string | null;
  /** The server (`[mcp.<name>]`). */
  server: string;
  /** Who sent the request: the client (a `tools/call`) or the server (a request to the client). */
  from: "client" | "server";
  /** The request's method (cut to 128 characters). */
  method: string;
  /** The tool called (`tools/call` only). */
  tool?: string | undefined;
  /** The names of the arguments, never their values (`tools/call` only). */
  arguments?: string[] | undefined;
  /** From the request to its response (or to the end of the session). */
  durationMs: number;
  /** How it ended. */
  outcome: AuditOutcome;
  /** How many requests the line stands for (an `unaudited` summary line only). */
  count?: number | undefined;
}

/** The file name of the audit log under the waffle home. */
export const AUDIT_FILE = "audit.jsonl";

/** Longest argument name recorded; longer ones are cut. */
const MAX_NAME_CHARS = 128;
/** Most argument names recorded per call. */
const MAX_NAMES = 256;

/** Appends audit records; open one per session. */
export interface AuditLog {
  /** The file written. */
  readonly path: string;
  /** Appends one record as one line. A failure is reported once on `onError` and not thrown. */
  append(record: AuditRecord): Promise<void>;
  /** Closes the file. */
  close(): void;
}

/**
 * Opens (creating it with mode 0600 if missing) the audit log of a waffle home.
 *
 * @example
 * ```ts ignore
 * const audit = openAuditLog("/var/lib/waffle");
 * await audit.append({ ...record });
 * audit.close();
 * ```
 *
 * @param home The waffle home; the file is `<home>/audit.jsonl`.
 * @param options Where a failed write is reported.
 * @returns The log.
 * @throws {Deno.errors.PermissionDenied} When the file cannot be opened.
 */
export function openAuditLog(
  home: string,
  options: { onError?: (message: string) => void } = {},
): AuditLog {
  Deno.mkdirSync(home, { recursive: true, mode: 0o700 });
  const log = openJsonLines(join(home, AUDIT_FILE), options);
  return {
    path: log.path,
    append: (record: AuditRecord): Promise<void> => log.append(auditLine(record)),
    close: (): void => log.close(),
  };
}

/**
 * The argument names of a `tools/call`'s `arguments`, capped in number and length.
 *
 * @example
 * ```ts
 * argumentNames({ message: "secret" }); // ["message"]
 * ```
 *
 * @param args The call's `params.arguments` (anything).
 * @returns Its own keys when it is an object, else [].
 */
export function argumentNames(args: unknown): string[] {
  if (args === null || typeof args !== "object" || Array.isArray(args)) return [];
  return Object.keys(args).slice(0, MAX_NAMES).map((name) => name.slice(0, MAX_NAME_CHARS));
}

// Only the documented fields, in a fixed order: nothing else can leak in.
function auditLine(record: AuditRecord): AuditRecord {
  return {
    time: record.time,
    user: record.user,
    tenant: record.tenant,
    group: record.group,
    cron: record.cron,
    server: record.server,
    from: record.from,
    method: record.method.slice(0, MAX_NAME_CHARS),
    ...(record.tool === undefined ? {} : { tool: record.tool.slice(0, MAX_NAME_CHARS) }),
    ...(record.arguments === undefined ? {} : {
      arguments: record.arguments.slice(0, MAX_NAMES).map((n) => n.slice(0, MAX_NAME_CHARS)),
    }),
    durationMs: Math.max(0, Math.round(record.durationMs)),
    outcome: record.outcome,
    ...(record.count === undefined ? {} : { count: Math.max(0, Math.round(record.count)) }),
  };
}
