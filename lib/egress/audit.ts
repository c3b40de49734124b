/**
 * The egress audit: one JSON line per connection through the proxy, in
 * `$WAFFLE_HOME/egress.jsonl`. Appended whole (one write per line), so
 * readers never see half a line. Bounded, so a sandbox cannot fill the
 * host's disk through it: past {@linkcode AUDIT_LINES_PER_SECOND} lines in a
 * second, an identity's further lines that second become one summary line
 * (`count` connections, the first one's fields); every string field is at
 * most 512 characters; past {@linkcode MAX_AUDIT_BYTES} the file becomes
 * `<file>.1` and a new one starts, so a home's audit takes at most twice that.
 *
 * @module
 */
import { egressLog } from "./log.ts";
import { appendFileSync, renameSync } from "node:fs";
import type { EgressIdentity } from "../config/egress_types.ts";

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
  /** On a summary line: how many connections it stands for (the first one's fields shown). */
  count?: number;
}

/** Most lines one identity writes in a second; the rest of that second is summed up. */
export const AUDIT_LINES_PER_SECOND = 20;
/** The audit file's size past which it becomes `<file>.1` (replacing the older one) and a new one starts. */
export const MAX_AUDIT_BYTES = 64 * 1024 * 1024;
/** The longest string field of an audit line, in characters. */
const MAX_FIELD_CHARS = 512;

/** Appends audit lines to one file. */
export class EgressAudit {
  /** The file. */
  readonly path: string;
  #seconds = new Map<
    string,
    { second: number; lines: number; held?: EgressAuditLine | undefined }
  >();

  /**
   * @param path The audit file (created when missing).
   * @param options `maxBytes`: where it rotates (default {@linkcode MAX_AUDIT_BYTES}).
   */
  constructor(path: string, options: { maxBytes?: number } = {}) {
    this.path = path;
    this.#maxBytes = options.maxBytes ?? MAX_AUDIT_BYTES;
    try {
      this.#bytes = Deno.statSync(path).size;
    } catch {
      this.#bytes = 0;
    }
  }

  #bytes: number;
  #maxBytes: number;

  /**
   * Appends one line. A failed write is reported on stderr, never thrown:
   * the connection it describes is over either way.
   *
   * @param line The line.
   */
  write(line: EgressAuditLine): void {
    this.#append(line);
  }

  /**
   * Appends one identity's line, within its budget of
   * {@linkcode AUDIT_LINES_PER_SECOND}; beyond it, the line is counted
   * into that second's summary, written when the second is over.
   *
   * @param identity The identity's id.
   * @param line The line.
   */
  writeFor(identity: string, line: EgressAuditLine): void {
    const second = Math.floor(Date.now() / 1000);
    let state = this.#seconds.get(identity);
    if (state === undefined || state.second !== second) {
      if (state?.held !== undefined) {
        this.#append(state.held);
        state.held = undefined;
      }
      state = { second, lines: 0 };
      this.#seconds.set(identity, state);
    }
    if (++state.lines <= AUDIT_LINES_PER_SECOND) return this.#append(line);
    if (state.held === undefined) {
      state.held = { ...line, count: 1 };
      const held = state;
      setTimeout(() => {
        if (held.held !== undefined) this.#append(held.held);
        held.held = undefined;
      }, 1000 - (Date.now() % 1000) + 5);
    } else {
      state.held.count = (state.held.count ?? 1) + 1;
    }
  }

  #append(line: EgressAuditLine): void {
    const text = `${JSON.stringify(line, capped)}\n`;
    try {
      if (this.#bytes + text.length > this.#maxBytes) {
        renameSync(this.path, `${this.path}.1`);
        this.#bytes = 0;
      }
      appendFileSync(this.path, text, { mode: 0o600 });
      this.#bytes += text.length;
    } catch (error) {
      egressLog(`Cannot append to '${this.path}': ${String(error)}`);
    }
  }
}

// JSON.stringify's replacer: long strings cut, so no field makes a line long.
function capped(_key: string, value: unknown): unknown {
  return typeof value === "string" && value.length > MAX_FIELD_CHARS
    ? `${value.slice(0, MAX_FIELD_CHARS)}…`
    : value;
}
