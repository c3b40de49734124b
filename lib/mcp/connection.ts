/**
 * The one shape every MCP server connection has, wherever the server runs:
 * a host process, the user's sandbox, or a restricted container.
 *
 * @module
 */

/** A running MCP server's stdio, and how to end it. */
export interface ServerConnection {
  /** The server's standard input. */
  stdin: WritableStream<Uint8Array>;
  /**
   * The server's standard output: newline-delimited JSON-RPC, untrusted. A
   * chunk may be lent: its bytes may change once the next is read, so a
   * reader copies what it keeps (`readLines` does).
   */
  stdout: ReadableStream<Uint8Array>;
  /** The server's diagnostics. */
  stderr: ReadableStream<Uint8Array>;
  /**
   * Ends the server: closes its input, waits a short grace, then kills its
   * whole process tree. Resolves once nothing of it is left. Idempotent.
   */
  close(): Promise<void>;
  /** Resolves when the server has ended, by itself or by `close`, with a one-line reason. */
  closed: Promise<string>;
}
