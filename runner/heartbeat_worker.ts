/**
 * Writes the runner's heartbeat file from its own thread, so nothing on the
 * main thread (a lock wait, a burst of output, a busy event loop) can starve
 * it.
 *
 * @module
 */
/// <reference lib="deno.worker" />
import type { Heartbeat } from "../lib/queue/protocol.ts";
import { writeHeartbeatFile } from "../lib/queue/heartbeat_file.ts";

/** Messages the runner sends to this worker. */
export type HeartbeatMessage =
  | { type: "start"; path: string; beat: Heartbeat; intervalMs: number }
  | { type: "tick" }
  | { type: "stop" };

/**
 * How long the runner's main thread may go without a tick before this
 * worker stops beating for it. Beats are the promise that requests are
 * served: a main thread wedged for good (blocked opening a FIFO, a hung
 * syscall) must look dead to hosts, not alive forever. Longer than any
 * honest stall (a busy timeout is 5 s); with the host's three beats to stale,
 * a wedged runner is dead within 14 s.
 */
export const MAIN_STALL_MS = 8_000;

let lastTick = Date.now();
let stalled = false;

let path: string | undefined;
let beat: Heartbeat | undefined;
let timer: ReturnType<typeof setInterval> | undefined;

function write(): void {
  if (path === undefined || beat === undefined) return;
  if (Date.now() - lastTick > MAIN_STALL_MS) {
    if (!stalled) self.postMessage({ type: "error", message: "the main thread stopped ticking" });
    stalled = true;
    return;
  }
  stalled = false;
  beat = { ...beat, seq: beat.seq + 1, time: Date.now() };
  writeHeartbeatFile(path, beat);
}

/** Beats missed in a row after which hosts call the runner dead: it stops itself first. */
const MISSED_BEATS_FATAL = 3;
let missed = 0;

function writeOrReport(): void {
  try {
    write();
    missed = 0;
  } catch (error) {
    // One missed beat is a gap the host tolerates; a disk that refuses them
    // all is a runner that cannot serve, as with any other write.
    missed += 1;
    self.postMessage({
      type: missed >= MISSED_BEATS_FATAL ? "failed" : "error",
      message: String(error),
    });
    if (missed >= MISSED_BEATS_FATAL) clearInterval(timer);
  }
}

self.onmessage = (event: MessageEvent<HeartbeatMessage>): void => {
  const message = event.data;
  if (message.type === "start") {
    path = message.path;
    beat = message.beat;
    try {
      write();
    } catch (error) {
      // A first beat that cannot be written at all is fatal; a later failed
      // write is a missed beat, tried again next tick.
      self.postMessage({ type: "failed", message: String(error) });
      return;
    }
    timer = setInterval(writeOrReport, message.intervalMs);
    self.postMessage({ type: "started" });
  } else if (message.type === "tick") {
    lastTick = Date.now();
  } else if (message.type === "stop") {
    clearInterval(timer);
    path = undefined;
    self.postMessage({ type: "stopped" });
  }
};
