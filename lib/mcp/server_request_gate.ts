/**
 * The relay's policy for the requests a server sends to its client
 * (`sampling/createMessage`, `elicitation/create`, `roots/list`, `ping`): a
 * request outside the server's `client_requests` is answered here with a
 * JSON-RPC error and never reaches the client; an allowed one is forwarded
 * and remembered, so that only the client's answer to a forwarded request
 * goes back to the server. Both are audited.
 *
 * The server (and a compromised runner, which writes its output) is
 * untrusted, so everything it can make the host write is bounded per
 * session: at most {@linkcode MAX_REFUSED_REQUESTS} refusals (then the
 * session ends) and {@linkcode MAX_SERVER_AUDIT_LINES} audit lines (then one
 * summary line at the end).
 *
 * @module
 */
import { escapeControls } from "../terminal/control_text.ts";
import type { AuditOutcome } from "./audit.ts";
import { idKey, type JsonRpcId, type JsonRpcRequest, type JsonRpcResponse } from "./jsonrpc.ts";

/** The JSON-RPC error code of a refused server request ("method not found" for the server). */
export const CLIENT_REQUEST_REFUSED_CODE = -32601;
/** The JSON-RPC error code of a request refused for its id or the pending limit. */
const INVALID_REQUEST_CODE = -32600;
/** Refusals answered per session; one more ends the session (each answer is a host write). */
export const MAX_REFUSED_REQUESTS = 1024;
/** Audit lines of server requests per session; past it, one summary line counts the rest. */
export const MAX_SERVER_AUDIT_LINES = 4096;
/** Longest method name quoted in an error message or a note. */
const MAX_QUOTED_CHARS = 128;

/** One audit entry of a server request, without the session's context. */
export interface ServerRequestEntry {
  /** When the request arrived (ISO 8601). */
  time: string;
  /** Its method (`*` on the summary line). */
  method: string;
  /** From the request to the client's answer, refusal or the end of the session. */
  durationMs: number;
  /** How it ended. */
  outcome: AuditOutcome;
  /** How many requests the entry stands for (the summary line only). */
  count?: number;
}

/** Options of {@linkcode ServerRequestGate}. */
export interface ServerRequestGateOptions {
  /** The server's name (`[mcp.<name>]`), for messages. */
  name: string;
  /** The methods the server may send to the client. */
  allowed: readonly string[];
  /** Most forwarded requests awaiting the client's answer at once. */
  maxPending: number;
  /** Writes one audit entry. */
  record: (entry: ServerRequestEntry) => void;
}

/** What to do with a server's request. */
export type Admission =
  | { action: "forward" }
  | { action: "refuse"; response: JsonRpcResponse; note: string }
  | { action: "end"; reason: string };

interface Pending {
  method: string;
  time: string;
  startedAt: number;
}

/**
 * Decides each server-to-client request of one session and pairs the
 * client's answers with the requests it was shown.
 *
 * @example
 * ```ts
 * const gate = new ServerRequestGate({
 *   name: "everything",
 *   allowed: ["roots/list", "ping"],
 *   maxPending: 1024,
 *   record: (entry) => console.log(entry.method, entry.outcome),
 * });
 * const admission = gate.admit({ jsonrpc: "2.0", id: 1, method: "sampling/createMessage" });
 * console.log(admission.action); // "refuse"
 * ```
 */
export class ServerRequestGate {
  #options: ServerRequestGateOptions;
  #allowed: Set<string>;
  #pending = new Map<string, Pending>();
  #refused = 0;
  #lines = 0;
  #unaudited = { count: 0, since: "" };

  /**
   * Creates the gate of one session.
   *
   * @param options The server, its allowed methods, the pending limit and the audit sink.
   */
  constructor(options: ServerRequestGateOptions) {
    this.#options = options;
    this.#allowed = new Set(options.allowed);
  }

  /**
   * Decides a request from the server. A forwarded one is pending until the
   * client answers it; a refused one is audited and answered by the caller
   * with `response`; `end` means the session has had too many refusals.
   *
   * @param request The server's request.
   * @returns What the relay does with it.
   */
  admit(request: JsonRpcRequest): Admission {
    const time = new Date().toISOString();
    const { name } = this.#options;
    const method = quoted(request.method);
    let problem: { code: number; message: string } | undefined;
    if (!this.#allowed.has(request.method)) {
      problem = {
        code: CLIENT_REQUEST_REFUSED_CODE,
        message:
          `Request '${method}' from server '${name}' is not allowed by waffle policy; list it in mcp.${name}.client_requests to allow it`,
      };
    } else if (this.#pending.has(idKey(request.id))) {
      // A second request under a pending id would let one answer stand for both.
      problem = { code: INVALID_REQUEST_CODE, message: "Request id is already pending" };
    } else if (this.#pending.size >= this.#options.maxPending) {
      problem = {
        code: INVALID_REQUEST_CODE,
        message: `More than ${this.#options.maxPending} requests pending`,
      };
    }
    if (problem === undefined) {
      this.#pending.set(idKey(request.id), { method: request.method, time, startedAt: Date.now() });
      return { action: "forward" };
    }
    this.#refused++;
    if (this.#refused > MAX_REFUSED_REQUESTS) {
      return {
        action: "end",
        reason:
          `Server '${name}' sent more than ${MAX_REFUSED_REQUESTS} requests that waffle refused`,
      };
    }
    this.#record({ time, method: request.method, durationMs: 0, outcome: "refused" });
    return {
      action: "refuse",
      response: { jsonrpc: "2.0", id: request.id, error: problem },
      note: `waffle: refused request '${method}' from server '${name}': ${
        problem.code === CLIENT_REQUEST_REFUSED_CODE
          ? `not in mcp.${name}.client_requests`
          : problem.message
      }`,
    };
  }

  /**
   * Pairs a client's response with a request it was shown. A response to
   * anything else (a refused request, an id never sent, one already
   * answered) pairs with nothing and must be dropped.
   *
   * @param response The client's response.
   * @returns Whether it answers a forwarded request (it is then audited and may go to the server).
   */
  settle(response: JsonRpcResponse): boolean {
    if (response.id === null) return false;
    return this.end(response.id, Object.hasOwn(response, "error") ? "error" : "ok");
  }

  /**
   * Ends a forwarded request another way: the server cancelled it, or the
   * client's answer was over the size limit.
   *
   * @param id The request's id.
   * @param outcome What the audit says.
   * @returns Whether it was pending.
   */
  end(id: JsonRpcId, outcome: AuditOutcome): boolean {
    const key = idKey(id);
    const pending = this.#pending.get(key);
    if (pending === undefined) return false;
    this.#pending.delete(key);
    this.#record({
      time: pending.time,
      method: pending.method,
      durationMs: Date.now() - pending.startedAt,
      outcome,
    });
    return true;
  }

  /** Audits the requests still unanswered (`no_response`) and the summary line, if any. */
  close(): void {
    for (const pending of this.#pending.values()) {
      this.#record({
        time: pending.time,
        method: pending.method,
        durationMs: Date.now() - pending.startedAt,
        outcome: "no_response",
      });
    }
    this.#pending.clear();
    const { count, since } = this.#unaudited;
    if (count > 0) {
      this.#options.record({
        time: since,
        method: "*",
        durationMs: Date.now() - Date.parse(since),
        outcome: "unaudited",
        count,
      });
    }
    this.#unaudited = { count: 0, since: "" };
  }

  #record(entry: ServerRequestEntry): void {
    if (this.#lines < MAX_SERVER_AUDIT_LINES) {
      this.#lines++;
      this.#options.record(entry);
      return;
    }
    if (this.#unaudited.count === 0) this.#unaudited.since = entry.time;
    this.#unaudited.count++;
  }
}

// A server's method name, cut and with control characters escaped, for
// messages that reach a terminal or a log.
function quoted(method: string): string {
  return escapeControls(method.slice(0, MAX_QUOTED_CHARS));
}
