/**
 * The heartbeat as the host sees it under load: {@linkcode HeartbeatObserver}
 * samples a queue's heartbeat on a timer and records the largest gap between
 * two successive beats of one runner boot.
 *
 * @module
 */
import { HEARTBEAT_INTERVAL_MS } from "../queue/protocol.ts";
import type { Heartbeat } from "../queue/protocol.ts";
import type { Queue } from "../queue/queue.ts";

/**
 * The largest heartbeat gap a certified installation may show: two runner
 * heartbeat intervals (2 s × 2). A longer gap means the host saw the
 * runner's file late (a stale page cache) or the runner stalled.
 */
export const MAX_HEARTBEAT_GAP_MS = 2 * HEARTBEAT_INTERVAL_MS;

/** What a {@linkcode HeartbeatObserver} saw. */
export interface HeartbeatStats {
  /** Reads of the heartbeat. */
  samples: number;
  /** Distinct heartbeats seen (same boot). */
  beats: number;
  /** Largest difference between the times of two successive distinct heartbeats. */
  maxGapMs: number;
  /** Largest `seq` step between two successive distinct heartbeats (1 = none missed). */
  maxSeqStep: number;
  /** Reads that found no valid heartbeat after the first one. */
  unreadable: number;
  /** Longest time between two reads (how well the observer itself kept up). */
  maxSampleIntervalMs: number;
}

/**
 * Samples `queue.heartbeat()` on a timer and records the largest gap between
 * successive distinct heartbeats of one runner boot.
 *
 * @example
 * ```ts ignore
 * const observer = new HeartbeatObserver(queue);
 * observer.start(100);
 * // … load …
 * const { maxGapMs } = observer.stop();
 * ```
 */
export class HeartbeatObserver {
  #queue: Queue;
  #timer: ReturnType<typeof setInterval> | undefined;
  #last: Heartbeat | undefined;
  #lastSampleAt = 0;
  /** The statistics so far. */
  readonly stats: HeartbeatStats = {
    samples: 0,
    beats: 0,
    maxGapMs: 0,
    maxSeqStep: 0,
    unreadable: 0,
    maxSampleIntervalMs: 0,
  };

  /** @param queue A host handle used only for sampling. */
  constructor(queue: Queue) {
    this.#queue = queue;
  }

  /**
   * Starts sampling.
   *
   * @param intervalMs Sampling interval.
   */
  start(intervalMs = 100): void {
    this.sample();
    this.#timer = setInterval(() => this.sample(), intervalMs);
  }

  /**
   * Stops sampling.
   *
   * @returns The statistics.
   */
  stop(): HeartbeatStats {
    clearInterval(this.#timer);
    this.#timer = undefined;
    this.sample();
    return this.stats;
  }

  /** Takes one sample. */
  sample(): void {
    const now = Date.now();
    const stats = this.stats;
    if (this.#lastSampleAt > 0) {
      stats.maxSampleIntervalMs = Math.max(stats.maxSampleIntervalMs, now - this.#lastSampleAt);
    }
    this.#lastSampleAt = now;
    stats.samples++;
    const beat = this.#queue.heartbeat();
    if (beat === undefined) {
      if (this.#last !== undefined) stats.unreadable++;
      return;
    }
    const last = this.#last;
    this.#last = beat;
    if (last === undefined || last.bootId !== beat.bootId || last.seq === beat.seq) return;
    stats.beats++;
    stats.maxGapMs = Math.max(stats.maxGapMs, beat.time - last.time);
    stats.maxSeqStep = Math.max(stats.maxSeqStep, beat.seq - last.seq);
  }
}
