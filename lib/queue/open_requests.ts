/**
 * What the host knows, from its own `inbound.db`, about which requests are
 * still open: submitted, neither acknowledged by a host nor given up as
 * lost. Every query of "open" requests (the runner's eligible set, the
 * host's orphans, in-flight checks, the outbound size allowance) is built
 * from {@linkcode OPEN_REQUEST}, so there is one rule.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { statement } from "./connection.ts";
import { DEFAULT_OUTPUT_CAP, MAX_OUTPUT_CAP } from "./protocol.ts";
import { SMALL_FILE_BYTES } from "./sandbox_file.ts";

/** SQL condition on a `requests` row aliased `r`: the request is open. */
export const OPEN_REQUEST = `NOT EXISTS (SELECT 1 FROM acks a WHERE a.request_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM lost l WHERE l.request_id = r.id)`;

/**
 * Largest `outbound.db` anyone reads without knowing the requests (it is
 * copied to be read): both streams of one request at the largest output cap,
 * and room for the rest. A host that knows its open requests allows what
 * they asked for instead ({@linkcode outboundAllowance}).
 */
export const MAX_OUTBOUND_BYTES: number = 2 * MAX_OUTPUT_CAP + SMALL_FILE_BYTES;

/**
 * Among ids the runner reported, those a host submitted here and still
 * holds open: a row the runner made up for another id counts for nothing.
 *
 * @param inbound A connection to `inbound.db`.
 * @param ids Request ids (from the runner: untrusted).
 * @param options `sessions: false` leaves out sessions.
 * @returns The ids that are open, in the order given.
 */
export function submittedAndOpen(
  inbound: DatabaseSync,
  ids: string[],
  options: { sessions?: boolean } = {},
): string[] {
  const open = statement(
    inbound,
    `SELECT 1 AS hit FROM requests r WHERE r.id = ?
       AND (r.kind = 'exec' OR ${options.sessions === false ? 0 : 1}) AND ${OPEN_REQUEST}`,
  );
  return ids.filter((id) => open.get(id) !== undefined);
}

/**
 * How many requests are open.
 *
 * @param inbound A connection to `inbound.db`.
 * @returns The count.
 */
export function openRequestCount(inbound: DatabaseSync): number {
  return (statement(inbound, `SELECT count(*) AS n FROM requests r WHERE ${OPEN_REQUEST}`)
    .get() as { n: number }).n;
}

/**
 * What the runner may legitimately hold in `outbound.db`: both streams of
 * every open request at its cap, plus room for the rest. A larger file is
 * refused unread, so a sandbox cannot make a host copy more than was asked.
 *
 * @param inbound A connection to `inbound.db`.
 * @returns Bytes, at most {@linkcode MAX_OUTBOUND_BYTES}.
 */
export function outboundAllowance(inbound: DatabaseSync): number {
  const row = statement(
    inbound,
    `SELECT coalesce(sum(coalesce(json_extract(payload, '$.outputCap'), ?)), 0) AS caps
       FROM requests r WHERE ${OPEN_REQUEST}`,
  ).get(DEFAULT_OUTPUT_CAP) as { caps: number };
  return Math.min(SMALL_FILE_BYTES + 2 * row.caps, MAX_OUTBOUND_BYTES);
}
