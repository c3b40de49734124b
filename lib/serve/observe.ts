/**
 * What `waffle serve` observes of its sandboxes, for `GET /metrics` and
 * E2B's `getMetrics`: the create and command latencies, each sandbox's
 * recent samples (`metrics_ring.ts`), and the Prometheus text of one tenant
 * (`prometheus.ts`).
 *
 * @module
 */
import { MetricsRing } from "./metrics_ring.ts";
import {
  COMMAND_BUCKETS,
  CREATE_BUCKETS,
  Histogram,
  type PoolSize,
  prometheusText,
} from "./prometheus.ts";
import type { ServeSandboxes } from "./sandboxes.ts";

/** Options of {@linkcode ServerMetrics}. */
export interface ServerMetricsOptions {
  /** The waffle home (its egress proxy counts connections). */
  home: string;
  /** Limits reported when a reading has none. */
  resources: { cpuCount: number; memoryMB: number; diskSizeMB: number };
  /** The warm pools' sizes (absent: no pools). */
  poolSizes?: (() => PoolSize[]) | undefined;
  /** How often each sandbox is sampled, in ms (tests). */
  intervalMs?: number | undefined;
}

/** A server's latencies, samples and Prometheus text. */
export class ServerMetrics {
  /** Create latencies, per tenant. */
  readonly create: Histogram = new Histogram(CREATE_BUCKETS);
  /** Command latencies (start to exit), per tenant. */
  readonly command: Histogram = new Histogram(COMMAND_BUCKETS);
  readonly #options: ServerMetricsOptions;
  #sandboxes: ServeSandboxes | undefined;
  #ring: MetricsRing | undefined;

  /** @param options Home, limits, pools and sampling interval. */
  constructor(options: ServerMetricsOptions) {
    this.#options = options;
  }

  /**
   * Watches a server's sandboxes (sampling starts with {@linkcode ServerMetrics.start}).
   *
   * @param sandboxes The server's sandboxes.
   * @returns The ring of their samples.
   */
  attach(sandboxes: ServeSandboxes): MetricsRing {
    this.#sandboxes = sandboxes;
    this.#ring = new MetricsRing({
      sandboxes,
      resources: this.#options.resources,
      ...(this.#options.intervalMs === undefined ? {} : { intervalMs: this.#options.intervalMs }),
    });
    return this.#ring;
  }

  /** Starts sampling. */
  start(): void {
    this.#ring?.start();
  }

  /** Stops sampling. */
  stop(): void {
    this.#ring?.stop();
  }

  /**
   * One scope's series in Prometheus' text format.
   *
   * @param scope The calling key's tenant, or undefined for every tenant (an admin key).
   * @returns The exposition text.
   */
  prometheus(scope: string | undefined): Promise<string> {
    const sandboxes = this.#sandboxes;
    const home = this.#options.home;
    return prometheusText(scope, {
      records: sandboxes?.store.list(scope) ?? [],
      create: this.create,
      command: this.command,
      latest: (id) => this.#ring?.latest(id),
      rootOf: (record) => sandboxes!.live(record).sandbox.paths.root,
      // Loaded on a scrape: a server nobody scrapes never loads the egress modules.
      egress: async (id) => (await import("../egress/status.ts")).egressCounts(home, id),
      poolSizes: this.#options.poolSizes,
    });
  }
}
