/**
 * `waffle serve`'s `GET /metrics`: Prometheus' text exposition format
 * (version 0.0.4), written here (a few series need no client library).
 * A key sees its own tenant's series only; an admin key sees every
 * tenant's, each labelled with its tenant; the pools' series name no tenant
 * and every key sees them.
 *
 * @module
 */
import { recordedLaunch } from "../lifecycle/egress_record.ts";
import type { SandboxStats } from "../lifecycle/stats.ts";
import type { SandboxRecord } from "./state.ts";

/** Upper bounds of the create-latency buckets, in seconds. */
export const CREATE_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
/** Upper bounds of the command-latency buckets (start to exit), in seconds. */
export const COMMAND_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 5, 10, 60, 300, 3600];

/** A histogram per tenant, with fixed buckets. */
export class Histogram {
  /** The buckets' upper bounds, ascending. */
  readonly bounds: readonly number[];
  readonly #byTenant = new Map<string, { counts: number[]; sum: number; count: number }>();

  /** @param bounds The buckets' upper bounds, ascending (the `+Inf` bucket is implied). */
  constructor(bounds: readonly number[]) {
    this.bounds = bounds;
  }

  /**
   * Counts one observation.
   *
   * @param tenant Whose.
   * @param value The value (seconds).
   */
  observe(tenant: string, value: number): void {
    if (!Number.isFinite(value) || value < 0) return;
    let series = this.#byTenant.get(tenant);
    if (series === undefined) {
      series = { counts: this.bounds.map(() => 0), sum: 0, count: 0 };
      this.#byTenant.set(tenant, series);
    }
    const at = this.bounds.findIndex((bound) => value <= bound);
    if (at >= 0) series.counts[at]!++;
    series.sum += value;
    series.count++;
  }

  /**
   * The tenants observed so far.
   *
   * @returns Their names, sorted.
   */
  tenants(): string[] {
    return [...this.#byTenant.keys()].sort();
  }

  /**
   * One tenant's series, cumulative as Prometheus wants them.
   *
   * @param tenant Whose.
   * @returns Each bucket's cumulative count (`+Inf` last), the sum and the count.
   */
  of(tenant: string): { buckets: [string, number][]; sum: number; count: number } {
    const series = this.#byTenant.get(tenant);
    let running = 0;
    const buckets: [string, number][] = this.bounds.map((bound, i) => {
      running += series?.counts[i] ?? 0;
      return [String(bound), running];
    });
    buckets.push(["+Inf", series?.count ?? 0]);
    return { buckets, sum: series?.sum ?? 0, count: series?.count ?? 0 };
  }
}

/** What the lead's warm pools report, per template. */
export interface PoolSize {
  /** The template. */
  template: string;
  /** Sandboxes ready to be taken. */
  ready: number;
  /** The most the pool keeps. */
  cap: number;
}

/** What one scrape reads. */
export interface PrometheusSources {
  /** The scope's sandboxes, as recorded. */
  records: SandboxRecord[];
  /** Create latencies. */
  create: Histogram;
  /** Command latencies. */
  command: Histogram;
  /** The last reading of a sandbox (from the metrics ring), if any. */
  latest: (id: string) => SandboxStats | undefined;
  /** A sandbox's state root, for its egress record. */
  rootOf: (record: SandboxRecord) => string;
  /** The proxy's counts for one egress identity (undefined: none or no answer). */
  egress: (id: string) => Promise<
    { allowed: number; denied: number; bytesUp: number; bytesDown: number } | undefined
  >;
  /** The warm pools' sizes, when the server has pools. */
  poolSizes?: (() => PoolSize[]) | undefined;
}

/** A sandbox's states as the record keeps them. */
const STATES: SandboxRecord["state"][] = ["creating", "running", "paused"];

/**
 * A scope's metrics in Prometheus' text format.
 *
 * @param scope Whose series: one tenant, or undefined for every tenant (an admin key's).
 * @param sources Records (the scope's), histograms, readings, the proxy and the pools.
 * @returns The exposition text.
 */
export async function prometheusText(
  scope: string | undefined,
  sources: PrometheusSources,
): Promise<string> {
  const out = new Exposition();
  const tenants = scope !== undefined ? [scope] : [
    ...new Set([
      ...sources.records.map((record) => record.tenant),
      ...sources.create.tenants(),
      ...sources.command.tenants(),
    ]),
  ].sort();
  out.family("waffle_sandboxes", "gauge", "Sandboxes of the tenant by state");
  for (const tenant of tenants) {
    for (const state of STATES) {
      const count = sources.records.filter((r) => r.tenant === tenant && r.state === state).length;
      out.sample("waffle_sandboxes", { tenant, state }, count);
    }
  }
  const pools = sources.poolSizes?.() ?? [];
  out.family("waffle_pool_ready", "gauge", "Warm sandboxes ready to be taken, by template");
  for (const pool of pools) {
    out.sample("waffle_pool_ready", { template: pool.template }, pool.ready);
  }
  out.family("waffle_pool_capacity", "gauge", "The most warm sandboxes a pool keeps, by template");
  for (const pool of pools) {
    out.sample("waffle_pool_capacity", { template: pool.template }, pool.cap);
  }
  out.histogram(
    "waffle_sandbox_create_seconds",
    "From a create request to its sandbox's runner serving",
    tenants.map((tenant) => ({ tenant, ...sources.create.of(tenant) })),
  );
  out.histogram(
    "waffle_command_seconds",
    "From a command's start to its exit (envd processes)",
    tenants.map((tenant) => ({ tenant, ...sources.command.of(tenant) })),
  );
  sandboxSeries(out, sources);
  await egressSeries(out, sources);
  return out.text();
}

function sandboxSeries(out: Exposition, sources: PrometheusSources): void {
  const readings = sources.records.flatMap((record) => {
    const stats = sources.latest(record.id);
    return stats === undefined ? [] : [{ tenant: record.tenant, sandbox: record.id, stats }];
  });
  const each = (
    name: string,
    type: "gauge" | "counter",
    help: string,
    value: (stats: SandboxStats) => number | null | undefined,
  ): void => {
    out.family(name, type, help);
    for (const { tenant, sandbox, stats } of readings) {
      const v = value(stats);
      if (v !== null && v !== undefined) out.sample(name, { tenant, sandbox }, v);
    }
  };
  each(
    "waffle_sandbox_cpu_seconds_total",
    "counter",
    "CPU time since the container started (last sample)",
    (s) => s.cpu === null ? null : s.cpu.usageNs / 1e9,
  );
  each("waffle_sandbox_memory_bytes", "gauge", "Memory charged now", (s) => s.memory?.currentBytes);
  each("waffle_sandbox_pids", "gauge", "Tasks now", (s) => s.pids?.current);
  each(
    "waffle_sandbox_disk_used_bytes",
    "gauge",
    "Bytes used on the volume",
    (s) => s.disk?.usedBytes,
  );
}

async function egressSeries(out: Exposition, sources: PrometheusSources): Promise<void> {
  const settled = sources.records.filter((record) => record.state !== "creating");
  const counted = await Promise.all(settled.map(async (record) => {
    let id: string | undefined;
    try {
      id = recordedLaunch(sources.rootOf(record))?.id;
    } catch {
      id = undefined;
    }
    const counts = id === undefined ? undefined : await sources.egress(id);
    return counts === undefined ? [] : [{ tenant: record.tenant, sandbox: record.id, counts }];
  }));
  const rows = counted.flat();
  out.family(
    "waffle_egress_connections_total",
    "counter",
    "Connections through the egress proxy since it started, by decision",
  );
  for (const { tenant, sandbox, counts } of rows) {
    for (const decision of ["allowed", "denied"] as const) {
      out.sample(
        "waffle_egress_connections_total",
        { tenant, sandbox, decision },
        counts[decision],
      );
    }
  }
  out.family(
    "waffle_egress_bytes_total",
    "counter",
    "Bytes of closed connections through the egress proxy since it started",
  );
  for (const { tenant, sandbox, counts } of rows) {
    out.sample("waffle_egress_bytes_total", { tenant, sandbox, direction: "up" }, counts.bytesUp);
    out.sample(
      "waffle_egress_bytes_total",
      { tenant, sandbox, direction: "down" },
      counts.bytesDown,
    );
  }
}

/** Lines of the exposition format. */
class Exposition {
  readonly #lines: string[] = [];

  family(name: string, type: "gauge" | "counter" | "histogram", help: string): void {
    this.#lines.push(`# HELP ${name} ${help.replace(/\\/g, "\\\\").replace(/\n/g, "\\n")}`);
    this.#lines.push(`# TYPE ${name} ${type}`);
  }

  sample(name: string, labels: Record<string, string>, value: number): void {
    const pairs = Object.entries(labels).map(([key, v]) => `${key}="${escapeLabel(v)}"`);
    this.#lines.push(`${name}{${pairs.join(",")}} ${formatValue(value)}`);
  }

  histogram(
    name: string,
    help: string,
    all: { tenant: string; buckets: [string, number][]; sum: number; count: number }[],
  ): void {
    this.family(name, "histogram", help);
    for (const series of all) {
      for (const [le, count] of series.buckets) {
        this.sample(`${name}_bucket`, { tenant: series.tenant, le }, count);
      }
      this.sample(`${name}_sum`, { tenant: series.tenant }, series.sum);
      this.sample(`${name}_count`, { tenant: series.tenant }, series.count);
    }
  }

  text(): string {
    return `${this.#lines.join("\n")}\n`;
  }
}

function escapeLabel(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

function formatValue(value: number): string {
  if (Number.isNaN(value)) return "NaN";
  if (!Number.isFinite(value)) return value > 0 ? "+Inf" : "-Inf";
  return String(value);
}
