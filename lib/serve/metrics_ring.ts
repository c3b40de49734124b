/**
 * The samples behind E2B's `GET /sandboxes/{id}/metrics`: every
 * {@linkcode SAMPLE_INTERVAL_MS}, each running or paused sandbox's costs
 * (`sandbox.stats()`: the kernel's counters and the quota volume, never a
 * file the sandbox writes) kept in a ring of the last hour per sandbox, so
 * memory stays bounded however long the server runs. A sandbox asked for
 * before its first sample is sampled then.
 *
 * @module
 */
import type { SandboxStats } from "../lifecycle/stats.ts";
import type { SandboxRecord } from "./state.ts";
import type { ServeSandboxes } from "./sandboxes.ts";
import type { SandboxMetric } from "./console_types.ts";

export type { SandboxMetric };

/** How often every sandbox is sampled. */
export const SAMPLE_INTERVAL_MS = 5000;
/** Samples kept per sandbox: an hour's at the interval. */
export const SAMPLES_KEPT = 720;
/** Sandboxes sampled at once by a tick. */
const SAMPLES_AT_ONCE = 8;

/** What the ring needs to know of the server. */
export interface MetricsRingOptions {
  /** The server's sandboxes. */
  sandboxes: ServeSandboxes;
  /** Limits reported when a reading has none (no memory limit, no quota volume). */
  resources: { cpuCount: number; memoryMB: number; diskSizeMB: number };
  /** Sampling interval (tests); default {@linkcode SAMPLE_INTERVAL_MS}. */
  intervalMs?: number;
}

interface Ring {
  samples: SandboxMetric[];
  last: SandboxStats | undefined;
}

/** Each sandbox's recent samples. */
export class MetricsRing {
  readonly #options: MetricsRingOptions;
  readonly #rings = new Map<string, Ring>();
  #timer: ReturnType<typeof setInterval> | undefined;
  #ticking = false;

  /** @param options The server's sandboxes and the default limits. */
  constructor(options: MetricsRingOptions) {
    this.#options = options;
  }

  /** Samples every sandbox now and then every interval, until {@linkcode MetricsRing.stop}. */
  start(): void {
    void this.#tick();
    this.#timer = setInterval(
      () => void this.#tick(),
      this.#options.intervalMs ?? SAMPLE_INTERVAL_MS,
    );
  }

  /** Stops sampling. */
  stop(): void {
    clearInterval(this.#timer);
  }

  async #tick(): Promise<void> {
    // One tick at a time: a slow daemon skips a beat instead of piling up.
    if (this.#ticking) return;
    this.#ticking = true;
    try {
      const records = this.#options.sandboxes.store.list();
      const present = new Set(records.map((record) => record.id));
      for (const id of this.#rings.keys()) if (!present.has(id)) this.#rings.delete(id);
      const due = records.filter((record) =>
        record.state !== "creating" && !this.#options.sandboxes.removing(record.id)
      );
      // A few at once: each waits on the daemon and on a short CPU window.
      for (let at = 0; at < due.length; at += SAMPLES_AT_ONCE) {
        const batch = due.slice(at, at + SAMPLES_AT_ONCE);
        await Promise.all(batch.map((record) => this.sample(record).catch(() => {})));
      }
    } finally {
      this.#ticking = false;
    }
  }

  /**
   * Takes one sample of a sandbox now and keeps it.
   *
   * @param record The sandbox.
   * @returns The sample; undefined when its container is not running.
   */
  async sample(record: SandboxRecord): Promise<SandboxMetric | undefined> {
    let ring = this.#rings.get(record.id);
    const { sandbox } = this.#options.sandboxes.live(record);
    const stats = await sandbox.stats(
      ring?.last === undefined ? { sampleMs: 200 } : { previous: ring.last },
    );
    if (stats.cpu === null || stats.memory === null) return undefined;
    if (ring === undefined) {
      ring = { samples: [], last: undefined };
      this.#rings.set(record.id, ring);
    }
    ring.last = stats;
    const metric = this.#metricOf(stats);
    ring.samples.push(metric);
    if (ring.samples.length > SAMPLES_KEPT) ring.samples.shift();
    return metric;
  }

  #metricOf(stats: SandboxStats): SandboxMetric {
    const { resources } = this.#options;
    const cpu = stats.cpu!;
    const memory = stats.memory!;
    return {
      timestamp: new Date(stats.time).toISOString(),
      timestampUnix: Math.floor(stats.time / 1000),
      cpuCount: Math.max(1, Math.round(cpu.limitCpus)),
      cpuUsedPct: Math.round((cpu.share ?? 0) * 10000) / 100,
      memUsed: memory.currentBytes,
      memTotal: memory.limitBytes ?? resources.memoryMB * 1024 ** 2,
      diskUsed: stats.disk?.usedBytes ?? 0,
      diskTotal: stats.disk?.quotaBytes ?? stats.disk?.totalBytes ??
        resources.diskSizeMB * 1024 ** 2,
    };
  }

  /**
   * A sandbox's last reading, if it has been sampled.
   *
   * @param id The sandbox id.
   * @returns Its last reading.
   */
  latest(id: string): SandboxStats | undefined {
    return this.#rings.get(id)?.last;
  }

  /**
   * A sandbox's newest sample, if it has one (never samples).
   *
   * @param id The sandbox id.
   * @returns The sample.
   */
  newest(id: string): SandboxMetric | undefined {
    return this.#rings.get(id)?.samples.at(-1);
  }

  /**
   * A sandbox's samples between two instants (whole seconds, both
   * included), oldest first; sampled now when the newest is older than the
   * interval (or there is none).
   *
   * @param record The sandbox.
   * @param range `start` and `end` in seconds since the epoch, each optional.
   * @returns The samples.
   */
  async samples(
    record: SandboxRecord,
    range: { start?: number; end?: number },
  ): Promise<SandboxMetric[]> {
    const newest = this.#rings.get(record.id)?.samples.at(-1);
    const interval = this.#options.intervalMs ?? SAMPLE_INTERVAL_MS;
    if (newest === undefined || Date.now() - Date.parse(newest.timestamp) > interval) {
      await this.sample(record).catch(() => undefined);
    }
    const all = this.#rings.get(record.id)?.samples ?? [];
    return all.filter((metric) =>
      (range.start === undefined || metric.timestampUnix >= range.start) &&
      (range.end === undefined || metric.timestampUnix <= range.end)
    );
  }
}
