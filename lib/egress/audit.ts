/**
 * The egress audit: one JSON line per connection through the proxy, in
 * `$WAFFLE_HOME/egress.jsonl`. Appended whole (one write per line), so
 * readers never see half a line.
 *
 * @module
 */
import { egressLog } from "./log.ts";
import { appendFileSync } from "node:fs";
import type { EgressIdentity } from "./types.ts";

/** One connection's audit line. */
export interface EgressAuditLine extends EgressIdentity {
  /** When it was accepted (ISO 8601). */
  time: string;
  /** `CONNECT`, or the forwarded request's method. */
  method: string | null;
  /** The host the client asked for; null when it never said. */
  destination: string | null;
  /** The port it asked for. */
  port: number | null;
  /** The address connected to, when a connection was made. */
  address: string | null;
  /** `allowed` or `denied`. */
  decision: "allowed" | "denied";
  /** Why it was denied, or how an allowed one ended badly; absent when nothing to say. */
  reason?: string;
  /** The secrets injected into its requests. */
  secrets: string[];
  /** Bytes from the sandbox to the upstream. */
  bytesUp: number;
  /** Bytes from the upstream to the sandbox. */
  bytesDown: number;
  /** From accept to close, in ms. */
  durationMs: number;
}

/** Appends audit lines to one file. */
export class EgressAudit {
  /** The file. */
  readonly path: string;

  /**
   * @param path The audit file (created when missing).
   */
  constructor(path: string) {
    this.path = path;
  }

  /**
   * Appends one line. A failed write is reported on stderr, never thrown:
   * the connection it describes is over either way.
   *
   * @param line The line.
   */
  write(line: EgressAuditLine): void {
    try {
      appendFileSync(this.path, `${JSON.stringify(line)}\n`, { mode: 0o600 });
    } catch (error) {
      egressLog(`Cannot append to '${this.path}': ${String(error)}`);
    }
  }
}
