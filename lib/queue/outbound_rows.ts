/**
 * The one place the host reads rows written by the sandbox. Everything here
 * is untrusted: sizes are capped inside SQL (so a hostile multi-gigabyte blob
 * is never loaded), types and shapes are checked with zod, and a bad row
 * becomes a {@linkcode ProtocolError} for that request alone.
 *
 * @module
 */
import type { DatabaseSync, SQLInputValue } from "node:sqlite";
import * as z from "../schema.ts";
import { statement } from "./connection.ts";
import { ProtocolError } from "../errors.ts";
import {
  type ExecResult,
  MAX_CHUNK_BYTES,
  type OutputChunk,
  type RequestState,
  resultSchema,
  type StreamName,
} from "./protocol.ts";

/** Largest result body accepted, in bytes. */
export const MAX_RESULT_BYTES = 16 * 1024;
/** Most chunks read per query, so one read stays bounded. */
export const CHUNK_PAGE = 64;

// Returns the column only when it is text/blob of at most `max` bytes (or any
// other type). `typeof()` and `octet_length()` read only the record header, so
// an oversized value is never materialised (and SQLite's length limit on the
// host's connection refuses one anyway).
function capped(column: string, max: number): string {
  return `CASE WHEN typeof(${column}) IN ('text','blob') AND octet_length(${column}) > ${max} ` +
    `THEN NULL ELSE ${column} END AS ${column}, octet_length(${column}) AS ${column}_len`;
}

function all(db: DatabaseSync, sql: string, ...params: SQLInputValue[]): Record<string, unknown>[] {
  return statement(db, sql).all(...params) as Record<string, unknown>[];
}

/**
 * Reads the result of a request, if the runner wrote one.
 *
 * @param db Host's reader connection to outbound.db.
 * @param requestId The request.
 * @returns The validated result, or undefined when there is none yet.
 * @throws {ProtocolError} When the row is oversized, malformed, duplicated or names another request.
 */
export function readResult(db: DatabaseSync, requestId: string): ExecResult | undefined {
  const rows = all(
    db,
    `SELECT ${capped("body", MAX_RESULT_BYTES)} FROM results WHERE request_id = ? LIMIT 2`,
    requestId,
  );
  if (rows.length === 0) return undefined;
  if (rows.length > 1) throw new ProtocolError(`Duplicate result rows for request '${requestId}'`);
  const row = rows[0]!;
  if (typeof row.body !== "string") {
    throw new ProtocolError(
      `Result of request '${requestId}' is not a JSON text of at most ${MAX_RESULT_BYTES} bytes (got ${row.body_len} bytes)`,
    );
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(row.body);
  } catch {
    throw new ProtocolError(`Result of request '${requestId}' is not valid JSON`);
  }
  const result = resultSchema.safeParse(parsed);
  if (!result.success) {
    throw new ProtocolError(
      `Result of request '${requestId}' is malformed: ${
        z.prettifyError(result.error).split("\n").join(" ")
      }`,
    );
  }
  if (result.data.requestId !== requestId) {
    throw new ProtocolError(
      `Result row for request '${requestId}' names request '${result.data.requestId}'`,
    );
  }
  return result.data;
}

/** Per-stream read position and totals of one request's output. */
export interface ChunkCursor {
  /** Last sequence number read per stream (-1 before the first). */
  seq: Record<StreamName, number>;
  /** Bytes read so far per stream. */
  bytes: Record<StreamName, number>;
}

/**
 * A cursor before the first chunk.
 *
 * @returns A fresh cursor.
 */
export function newCursor(): ChunkCursor {
  return { seq: { stdout: -1, stderr: -1 }, bytes: { stdout: 0, stderr: 0 } };
}

/**
 * Reads the next page of output chunks after `cursor`, advancing it.
 *
 * @param db Host's reader connection to outbound.db.
 * @param requestId The request.
 * @param options The cursor and the cap the request asked for.
 * @returns Validated chunks in write order (at most {@linkcode CHUNK_PAGE}).
 * @throws {ProtocolError} On an oversized, mistyped, out-of-order or over-cap chunk.
 */
export function readChunks(
  db: DatabaseSync,
  requestId: string,
  options: { cursor: ChunkCursor; cap: number },
): OutputChunk[] {
  const { cursor, cap } = options;
  const rows = all(
    db,
    `SELECT stream, seq, ${capped("data", MAX_CHUNK_BYTES)} FROM chunks
     WHERE request_id = ? AND ((stream = 'stdout' AND seq > ?) OR (stream = 'stderr' AND seq > ?)
       OR stream NOT IN ('stdout', 'stderr'))
     ORDER BY rowid LIMIT ${CHUNK_PAGE}`,
    requestId,
    cursor.seq.stdout,
    cursor.seq.stderr,
  );
  const chunks: OutputChunk[] = [];
  for (const row of rows) {
    const stream = row.stream;
    if (stream !== "stdout" && stream !== "stderr") {
      throw new ProtocolError(
        `Output of request '${requestId}' names unknown stream '${String(stream)}'`,
      );
    }
    if (!(row.data instanceof Uint8Array)) {
      throw new ProtocolError(
        `Output chunk of request '${requestId}' is not a blob of at most ${MAX_CHUNK_BYTES} bytes (got ${row.data_len})`,
      );
    }
    if (row.seq !== cursor.seq[stream] + 1) {
      throw new ProtocolError(
        `Output chunk of request '${requestId}' is out of order: ${stream} seq ${
          String(row.seq)
        } after ${cursor.seq[stream]}`,
      );
    }
    cursor.seq[stream]++;
    cursor.bytes[stream] += row.data.byteLength;
    if (cursor.bytes[stream] > cap) {
      throw new ProtocolError(
        `Output of request '${requestId}' exceeds its ${cap}-byte ${stream} cap`,
      );
    }
    chunks.push({ stream, seq: cursor.seq[stream], data: row.data });
  }
  return chunks;
}

/**
 * Reads the runner's state for a request.
 *
 * @param db Host's reader connection to outbound.db.
 * @param requestId The request.
 * @returns "started", "accepted", or "queued" when the runner has not seen it.
 */
export function readState(db: DatabaseSync, requestId: string): RequestState {
  const row = all(db, "SELECT state FROM states WHERE request_id = ? LIMIT 1", requestId)[0];
  if (row === undefined) return "queued";
  return row.state === "started" ? "started" : "accepted";
}

/**
 * Request ids that still have any row in outbound.db, among `ids`.
 *
 * @param db Host's reader connection to outbound.db.
 * @param ids Candidate request ids.
 * @returns The subset still present.
 */
export function idsWithOutboundRows(db: DatabaseSync, ids: string[]): Set<string> {
  const present = new Set<string>();
  const query = statement(
    db,
    `SELECT EXISTS (SELECT 1 FROM states WHERE request_id = ?1)
        OR EXISTS (SELECT 1 FROM results WHERE request_id = ?1)
        OR EXISTS (SELECT 1 FROM chunks WHERE request_id = ?1)
        OR EXISTS (SELECT 1 FROM input_read WHERE request_id = ?1) AS present`,
  );
  for (const id of ids) {
    const row = query.get(id) as { present: number } | undefined;
    if (row?.present) present.add(id);
  }
  return present;
}

/**
 * The generation of an outbound file: random per file, so a replaced or
 * re-created file is told apart from the one requests were bound to.
 *
 * @param db A connection to outbound.db.
 * @returns The generation, or undefined before the runner wrote it.
 */
export function readGeneration(db: DatabaseSync): string | undefined {
  const row = all(db, `SELECT ${capped("generation", 128)} FROM meta WHERE id = 1`)[0];
  const generation = row?.generation;
  return typeof generation === "string" && generation !== "" ? generation : undefined;
}

/**
 * Requests the runner has any state for, among `ids` (bounded).
 *
 * @param db A connection to outbound.db.
 * @returns Request ids with a state row (at most 4096).
 */
export function readStateIds(db: DatabaseSync): Set<string> {
  return new Set(
    all(
      db,
      `SELECT request_id FROM states WHERE typeof(request_id) = 'text'
         AND octet_length(request_id) <= 128 LIMIT 4096`,
    ).map((row) => String(row.request_id)),
  );
}

/**
 * Requests the runner marked started that have no result yet.
 *
 * @param db A connection to outbound.db.
 * @returns Up to 256 request ids (untrusted: use only to decide whether to wait).
 */
export function readInFlight(db: DatabaseSync): string[] {
  return (all(
    db,
    `SELECT request_id FROM states s WHERE state = 'started' AND typeof(request_id) = 'text'
       AND octet_length(request_id) <= 128
       AND NOT EXISTS (SELECT 1 FROM results r WHERE r.request_id = s.request_id) LIMIT 256`,
  )).map((row) => String(row.request_id));
}

/**
 * The last input row the runner took for a session's stdin.
 *
 * @param db `outbound.db` (untrusted).
 * @param requestId The session.
 * @returns Its sequence number; -1 when none was taken (or the row is not a number).
 */
export function readInputTaken(db: DatabaseSync, requestId: string): number {
  const row = statement(db, "SELECT seq FROM input_read WHERE request_id = ?").get(requestId) as
    | { seq: unknown }
    | undefined;
  const seq = row?.seq;
  return typeof seq === "number" && Number.isSafeInteger(seq) && seq >= 0 ? seq : -1;
}
