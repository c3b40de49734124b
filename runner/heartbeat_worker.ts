/**
 * Writes the runner's heartbeat from its own thread with its own connection,
 * so nothing on the main thread (a lock wait, a burst of output) can starve it.
 *
 * @module
 */
/// <reference lib="deno.worker" />
import type { DatabaseSync } from "node:sqlite";
import { openDatabase, transaction } from "../lib/queue/connection.ts";
import type { Heartbeat } from "../lib/queue/protocol.ts";
import { writeHeartbeatRow } from "../lib/queue/heartbeat_row.ts";

/** Messages the runner sends to this worker. */
export type HeartbeatMessage =
  | { type: "start"; outbound: string; beat: Heartbeat; intervalMs: number }
  | { type: "update"; idleSince: number | null }
  | { type: "stop" };

let db: DatabaseSync | undefined;
let beat: Heartbeat | undefined;
let timer: ReturnType<typeof setInterval> | undefined;

function write(): void {
  if (db === undefined || beat === undefined) return;
  beat = { ...beat, seq: beat.seq + 1, time: Date.now() };
  const current = beat;
  transaction(db, () => writeHeartbeatRow(db!, current));
}

function writeOrReport(): void {
  try {
    write();
  } catch (error) {
    // A missed beat is visible to the host as a gap; keep trying.
    self.postMessage({ type: "error", message: String(error) });
  }
}

self.onmessage = (event: MessageEvent<HeartbeatMessage>): void => {
  const message = event.data;
  if (message.type === "start") {
    try {
      db = openDatabase(message.outbound, { role: "owner" });
    } catch (error) {
      // Only a file that cannot be opened is fatal; a write that meets a
      // lock (busy past the timeout) is a missed beat, retried next tick.
      self.postMessage({ type: "failed", message: String(error) });
      return;
    }
    beat = message.beat;
    writeOrReport();
    timer = setInterval(writeOrReport, message.intervalMs);
    self.postMessage({ type: "started" });
  } else if (message.type === "update" && beat !== undefined) {
    beat = { ...beat, idleSince: message.idleSince };
  } else if (message.type === "stop") {
    clearInterval(timer);
    db?.close();
    db = undefined;
    self.postMessage({ type: "stopped" });
  }
};
