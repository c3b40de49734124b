/**
 * An exclusive lock on a queue file, held by another process: the
 * kill-mid-write check holds `outbound.db` so that the runner's result write
 * blocks, and reads (inside the lock) whether anything was committed.
 *
 * A separate process, like the runner: POSIX record locks belong to a
 * process, and one close() of the database file by that process outside
 * SQLite drops them all (`Deno.watchFs` opens and closes every file it
 * reports an event for; an in-process lock was seen lost that way). The
 * holder is this same waffle's hidden `certify-lock` subcommand, started
 * through `selfCommand()`, so an installed artefact needs nothing else.
 *
 * Protocol: the holder takes `BEGIN EXCLUSIVE`, prints `locked`, then
 * answers JSON lines `{"op":"query","sql":…,"params":[…]}` with
 * `{"rows":[…]}` or `{"error":…}` until `{"op":"release"}` or the end of its
 * stdin, and rolls back: it never writes.
 *
 * @module
 */
import * as z from "../schema.ts";
import { CertifyError } from "../errors.ts";
import { selfCommand } from "../config/self.ts";
import { messageOf, openDatabase } from "../queue/connection.ts";

/** A process holding `BEGIN EXCLUSIVE` on a queue file: nobody else can read or write it. */
export interface ExclusiveLock {
  /** The holder's pid. */
  pid: number;
  /**
   * Runs a read inside the exclusive transaction.
   *
   * @param sql The statement.
   * @param params Its parameters.
   * @returns Its rows.
   */
  query(sql: string, ...params: (string | number)[]): Promise<Record<string, unknown>[]>;
  /** Rolls back (nothing was written), closes and waits for the holder to exit. Idempotent. */
  release(): Promise<void>;
}

const requestSchema = z.union([
  z.object({ op: z.literal("release") }),
  z.object({
    op: z.literal("query"),
    sql: z.string(),
    params: z.array(z.union([z.string(), z.number()])),
  }),
]);

const replySchema = z.object({
  rows: z.optional(z.array(z.record(z.string(), z.unknown()))),
  error: z.optional(z.string()),
});

/**
 * Takes an exclusive lock on a queue file in a child process (this waffle's
 * `certify-lock` subcommand), configured like waffle's own connections by
 * `openDatabase` (TRUNCATE journal, FULL sync, the busy timeout).
 *
 * @param path The database file.
 * @returns The held lock.
 * @throws {CertifyError} When the holder cannot lock the file.
 *
 * @example
 * ```ts ignore
 * const lock = await lockExclusive(queue.paths.outbound);
 * try {
 *   const [row] = await lock.query("SELECT count(*) AS n FROM results");
 * } finally {
 *   await lock.release();
 * }
 * ```
 */
export async function lockExclusive(path: string): Promise<ExclusiveLock> {
  const self = selfCommand();
  const child = new Deno.Command(self.executable, {
    args: [...self.prefix, "certify-lock", path],
    ...(self.sourceRoot === undefined ? {} : { cwd: self.sourceRoot }),
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const writer = child.stdin.getWriter();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).pipeThrough(splitLines())
    .getReader();
  const next = async (): Promise<string> => {
    const { value, done } = await lines.read();
    if (done) throw new CertifyError(`The lock holder of '${path}' exited`);
    return value;
  };
  const send = (message: z.infer<typeof requestSchema>): Promise<void> =>
    writer.write(new TextEncoder().encode(`${JSON.stringify(message)}\n`));
  let released: Promise<void> | undefined;
  const release = (): Promise<void> =>
    released ??= (async () => {
      await send({ op: "release" }).catch(() => {});
      await writer.close().catch(() => {});
      while (!(await lines.read()).done) { /* drain */ }
      const status = await child.status;
      if (!status.success) {
        throw new CertifyError(`The lock holder of '${path}' exited with ${status.code}`);
      }
    })();
  const first = await next().catch((error) => messageOf(error));
  if (first !== "locked") {
    await release().catch(() => {});
    throw new CertifyError(`Cannot lock '${path}': ${first}`);
  }
  return {
    pid: child.pid,
    async query(sql, ...params): Promise<Record<string, unknown>[]> {
      await send({ op: "query", sql, params });
      const line = await next();
      const reply = replySchema.safeParse(safeJson(line));
      if (!reply.success) throw new CertifyError(`Lock holder answered '${line.slice(0, 80)}'`);
      if (reply.data.error !== undefined) throw new CertifyError(reply.data.error);
      return reply.data.rows ?? [];
    },
    release,
  };
}

/**
 * The holder's side: locks `path`, writes `locked`, answers queries read from
 * `input` until a release or its end, then rolls back and closes.
 *
 * @param path The database file.
 * @param io Where requests come from and replies go.
 * @returns 0 after a release; 1 when the file could not be locked (after writing `error: …`).
 *
 * @example
 * ```ts ignore
 * await holdExclusiveLock("/q/outbound/outbound.db", { input: Deno.stdin.readable, write });
 * ```
 */
export async function holdExclusiveLock(
  path: string,
  io: { input: ReadableStream<Uint8Array> | null; write: (line: string) => Promise<void> },
): Promise<number> {
  let db: ReturnType<typeof openDatabase>;
  try {
    db = openDatabase(path, { role: "owner" });
  } catch (error) {
    await io.write(`error: ${messageOf(error)}`);
    return 1;
  }
  try {
    db.exec("BEGIN EXCLUSIVE");
  } catch (error) {
    db.close();
    await io.write(`error: ${messageOf(error)}`);
    return 1;
  }
  await io.write("locked");
  try {
    if (io.input === null) return 0;
    const requests = io.input.pipeThrough(new TextDecoderStream()).pipeThrough(splitLines());
    for await (const line of requests) {
      const request = requestSchema.safeParse(safeJson(line));
      if (!request.success) {
        await io.write(JSON.stringify({ error: `Not a request: '${line.slice(0, 80)}'` }));
        continue;
      }
      if (request.data.op === "release") break;
      try {
        const rows = db.prepare(request.data.sql).all(...request.data.params);
        await io.write(JSON.stringify({ rows }));
      } catch (error) {
        await io.write(JSON.stringify({ error: messageOf(error) }));
      }
    }
    return 0;
  } finally {
    if (db.isTransaction) db.exec("ROLLBACK");
    db.close();
  }
}

function splitLines(): TransformStream<string, string> {
  let buffer = "";
  return new TransformStream({
    transform(chunk, controller): void {
      buffer += chunk;
      const parts = buffer.split("\n");
      buffer = parts.pop() ?? "";
      for (const line of parts) controller.enqueue(line);
    },
    flush(controller): void {
      if (buffer !== "") controller.enqueue(buffer);
    },
  });
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
