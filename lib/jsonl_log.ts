/**
 * An append-only JSON-lines file (the audit logs): each record is one line
 * written with one `write` on a file opened with `O_APPEND`, so concurrent
 * writers never interleave within a line; writes are chained in order, and a
 * failed write is reported once, never thrown into the caller's work.
 *
 * @module
 */

/** An open JSON-lines file. */
export interface JsonLinesLog {
  /** The file written. */
  readonly path: string;
  /** Appends one record as one line. A failure is reported once on `onError` and not thrown. */
  append(record: unknown): Promise<void>;
  /** Closes the file once the pending writes are done. */
  close(): void;
}

/**
 * Opens (creating it with mode 0600 if missing) a JSON-lines file for appending.
 *
 * @example
 * ```ts ignore
 * const log = openJsonLines("/var/lib/waffle/serve/audit.jsonl");
 * await log.append({ time: new Date().toISOString(), method: "GET /sandboxes" });
 * log.close();
 * ```
 *
 * @param path The file.
 * @param options Where a failed write is reported.
 * @returns The log.
 * @throws {Deno.errors.PermissionDenied} When the file cannot be opened.
 */
export function openJsonLines(
  path: string,
  options: { onError?: (message: string) => void } = {},
): JsonLinesLog {
  const file = Deno.openSync(path, { append: true, create: true, mode: 0o600 });
  let reported = false;
  let closed = false;
  let chain = Promise.resolve();
  return {
    path,
    append(record: unknown): Promise<void> {
      if (closed) return Promise.resolve();
      const bytes = new TextEncoder().encode(`${JSON.stringify(record)}\n`);
      chain = chain.then(async () => {
        try {
          // One write: a partial write of a line under O_APPEND is not expected
          // for regular files; if it happens, the rest follows at once.
          let rest = bytes;
          while (rest.byteLength > 0) rest = rest.subarray(await file.write(rest));
        } catch (error) {
          if (!reported) {
            reported = true;
            options.onError?.(
              `Cannot write audit log '${path}': ${
                error instanceof Error ? error.message : String(error)
              }`,
            );
          }
        }
      });
      return chain;
    },
    close(): void {
      if (closed) return;
      closed = true;
      void chain.finally(() => file.close());
    },
  };
}
