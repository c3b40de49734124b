/**
 * The streams a CLI invocation talks to, so tests can run the CLI in process.
 *
 * @module
 */
import { writeAll } from "../bytes.ts";

/** Where a subcommand reads and writes. */
export interface CliIo {
  /** Writes bytes to stdout. */
  stdout(data: Uint8Array | string): Promise<void>;
  /** Writes bytes to stderr. */
  stderr(data: Uint8Array | string): Promise<void>;
  /** Stdin, or null when it is a terminal or closed. */
  stdin: ReadableStream<Uint8Array> | null;
}

const encoder = new TextEncoder();

function writeText(
  file: { write(p: Uint8Array): Promise<number> },
  data: Uint8Array | string,
): Promise<void> {
  return writeAll(file, typeof data === "string" ? encoder.encode(data) : data);
}

/**
 * The process's own streams. Stdin is passed only when it is not a terminal.
 *
 * @returns The process IO.
 */
export function processIo(): CliIo {
  return {
    stdout: (data) => writeText(Deno.stdout, data),
    stderr: (data) => writeText(Deno.stderr, data),
    stdin: Deno.stdin.isTerminal() ? null : Deno.stdin.readable,
  };
}
