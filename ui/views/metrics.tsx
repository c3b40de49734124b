/// <reference lib="dom" />
/**
 * A sandbox's CPU and memory over the last hour (E2B's metrics route),
 * refreshed every 5 s.
 *
 * @module
 */
import type { JSX } from "preact";
import { api, seg } from "../api.ts";
import { usePoll } from "../state.ts";
import type { SandboxMetric } from "../types.ts";
import { Chart } from "./chart.tsx";
import { formatBytes } from "./common.tsx";

/**
 * @param props The sandbox.
 * @returns The metrics tab.
 */
export function MetricsView(props: { sandboxId: string }): JSX.Element {
  const [samples] = usePoll(
    () =>
      api<SandboxMetric[]>(
        "GET",
        `/sandboxes/${seg(props.sandboxId)}/metrics?start=${Math.floor(Date.now() / 1000) - 3600}`,
      ),
    { ms: 5000, deps: [props.sandboxId] },
  );
  const list = samples ?? [];
  const times = list.map((sample) => sample.timestampUnix);
  return (
    <div class="charts">
      <Chart
        testid="cpu-chart"
        title="CPU %"
        lines={[{
          label: "CPU %",
          color: "#2563eb",
          format: (v) => `${v < 10 ? v.toFixed(1) : v.toFixed(0)}%`,
        }]}
        data={[times, list.map((sample) => sample.cpuUsedPct)]}
      />
      <Chart
        testid="mem-chart"
        title="Memory"
        lines={[
          { label: "used", color: "#16a34a", format: formatBytes },
          { label: "total", color: "#9ca3af", format: formatBytes },
        ]}
        data={[
          times,
          list.map((sample) => sample.memUsed),
          list.map((sample) => sample.memTotal),
        ]}
      />
      {samples !== undefined && list.length === 0
        ? <p class="muted">No samples in the last hour yet.</p>
        : null}
    </div>
  );
}
