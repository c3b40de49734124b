/**
 * The heartbeat row's one writer, shared by the runner's main thread and its
 * heartbeat thread (which loads nothing else of the queue).
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { statement } from "./connection.ts";
import type { Heartbeat } from "./protocol.ts";

/**
 * Upserts the single heartbeat row.
 *
 * @param db An owner connection to outbound.db.
 * @param beat The heartbeat.
 */
export function writeHeartbeatRow(db: DatabaseSync, beat: Heartbeat): void {
  statement(
    db,
    `INSERT INTO heartbeat (id, runner_id, boot_id, seq, time, state, idle_since)
     VALUES (1, ?, ?, ?, ?, ?, ?)
     ON CONFLICT (id) DO UPDATE SET runner_id = excluded.runner_id, boot_id = excluded.boot_id,
       seq = excluded.seq, time = excluded.time, state = excluded.state, idle_since = excluded.idle_since`,
  ).run(beat.runnerId, beat.bootId, beat.seq, beat.time, beat.state, beat.idleSince);
}
