/// <reference lib="dom" />
/**
 * The egress and MCP audits: searchable, live-tailing (every 2 s) tables,
 * counts per destination or server, and a chart per minute over the last
 * hour. The same panels show one sandbox's network on its page.
 *
 * @module
 */
import type { JSX } from "preact";
import { useState } from "preact/hooks";
import { api } from "../api.ts";
import { usePoll } from "../state.ts";
import type { EgressView, McpView } from "../types.ts";
import { Chart } from "./chart.tsx";
import { formatBytes, formatDuration, formatTime, Table, Tabs } from "./common.tsx";

/** The filters of the audit panels. */
interface Filters {
  q: string;
  decision: string;
  tail: boolean;
  sandbox?: string;
}

/**
 * @param props The tab (`egress` or `mcp`) from the route.
 * @returns The audit view.
 */
export function AuditView(props: { tab: string }): JSX.Element {
  const tab = props.tab === "mcp" ? "mcp" : "egress";
  const [filters, setFilters] = useState<Filters>({ q: "", decision: "", tail: true });
  return (
    <section aria-labelledby="audit-title">
      <h1 id="audit-title">Audit</h1>
      <Controls filters={filters} setFilters={setFilters} />
      <Tabs
        label="Audit"
        tabs={[{ id: "egress", label: "Egress" }, { id: "mcp", label: "MCP" }]}
        selected={tab}
        onSelect={(id) => location.hash = `#/audit/${id}`}
      >
        {tab === "egress" ? <EgressPanel filters={filters} /> : <McpPanel filters={filters} />}
      </Tabs>
    </section>
  );
}

/**
 * @param props The sandbox.
 * @returns Its egress and MCP calls (the Network tab).
 */
export function NetworkView(props: { sandboxId: string }): JSX.Element {
  const [filters, setFilters] = useState<Filters>({
    q: "",
    decision: "",
    tail: true,
    sandbox: props.sandboxId,
  });
  return (
    <div>
      <Controls filters={filters} setFilters={setFilters} />
      <h2 class="small">Egress</h2>
      <EgressPanel filters={{ ...filters, sandbox: props.sandboxId }} />
      <h2 class="small">MCP calls</h2>
      <McpPanel filters={{ ...filters, sandbox: props.sandboxId }} />
    </div>
  );
}

function Controls(
  props: { filters: Filters; setFilters: (filters: Filters) => void },
): JSX.Element {
  const { filters, setFilters } = props;
  return (
    <div class="filters">
      <label>
        Search{" "}
        <input
          type="search"
          data-testid="audit-search"
          value={filters.q}
          placeholder="destination, sandbox, reason…"
          onInput={(event) => setFilters({ ...filters, q: event.currentTarget.value })}
        />
      </label>
      <label>
        Decision{" "}
        <select
          data-testid="decision-filter"
          value={filters.decision}
          onChange={(event) => setFilters({ ...filters, decision: event.currentTarget.value })}
        >
          <option value="">all</option>
          <option value="allowed">allowed</option>
          <option value="denied">denied</option>
        </select>
      </label>
      <button
        type="button"
        data-action="tail"
        aria-pressed={!filters.tail}
        onClick={() => setFilters({ ...filters, tail: !filters.tail })}
      >
        {filters.tail ? "Pause tail" : "Resume tail"}
      </button>
    </div>
  );
}

function query(filters: Filters, extra: Record<string, string>): string {
  const params = new URLSearchParams({ limit: "200", ...extra });
  if (filters.q !== "") params.set("q", filters.q);
  if (filters.sandbox !== undefined) params.set("sandbox", filters.sandbox);
  return params.toString();
}

function EgressPanel(props: { filters: Filters }): JSX.Element {
  const { filters } = props;
  const extra: Record<string, string> = filters.decision === ""
    ? {}
    : { decision: filters.decision };
  const path = `/waffle/v1/egress?${query(filters, extra)}`;
  const [answer] = usePoll(() => api<EgressView>("GET", path), {
    ms: 2000,
    paused: !filters.tail,
    deps: [path],
  });
  const series = answer?.series ?? [];
  return (
    <div>
      <Chart
        testid="egress-chart"
        title="Egress per minute"
        lines={[{ label: "allowed", color: "#16a34a" }, { label: "denied", color: "#dc2626" }]}
        data={[
          series.map((point) => Date.parse(point.minute) / 1000),
          series.map((point) => point.allowed),
          series.map((point) => point.denied),
        ]}
        height={160}
      />
      <Table
        testid="egress-destinations"
        label="Egress per destination"
        head={["Destination", "Port", "Allowed", "Denied"]}
      >
        {(answer?.destinations ?? []).map((row) => (
          <tr key={`${row.destination}:${row.port}`}>
            <td class="mono">{row.destination ?? "–"}</td>
            <td>{row.port ?? "–"}</td>
            <td>{row.allowed}</td>
            <td>{row.denied}</td>
          </tr>
        ))}
      </Table>
      <Table
        testid="egress"
        label="Egress decisions"
        head={["Time", "Sandbox", "Destination", "Port", "Decision", "Reason", "Bytes ↑/↓"]}
      >
        {(answer?.entries ?? []).map((entry, at) => (
          <tr key={`${entry.time}-${at}`} data-decision={entry.decision}>
            <td data-col="time">{formatTime(entry.time)}</td>
            <td data-col="sandbox" class="mono">{entry.sandbox}</td>
            <td data-col="destination" class="mono">{entry.destination ?? entry.address ?? "–"}</td>
            <td data-col="port">{entry.port ?? "–"}</td>
            <td data-col="decision">
              <span class={`decision-${entry.decision}`}>{entry.decision}</span>
              {entry.count > 1 ? ` ×${entry.count}` : ""}
            </td>
            <td data-col="reason">{entry.reason ?? ""}</td>
            <td data-col="bytes">
              {`${formatBytes(entry.bytesUp)} / ${formatBytes(entry.bytesDown)}`}
            </td>
          </tr>
        ))}
      </Table>
    </div>
  );
}

function McpPanel(props: { filters: Filters }): JSX.Element {
  const { filters } = props;
  const path = `/waffle/v1/mcp?${query(filters, {})}`;
  const [answer] = usePoll(() => api<McpView>("GET", path), {
    ms: 2000,
    paused: !filters.tail,
    deps: [path],
  });
  const series = answer?.series ?? [];
  return (
    <div>
      <Chart
        testid="mcp-chart"
        title="MCP calls per minute"
        lines={[{ label: "ok", color: "#16a34a" }, { label: "failed", color: "#dc2626" }]}
        data={[
          series.map((point) => Date.parse(point.minute) / 1000),
          series.map((point) => point.ok),
          series.map((point) => point.failed),
        ]}
        height={160}
      />
      <Table testid="mcp-servers" label="MCP calls per server" head={["Server", "OK", "Failed"]}>
        {(answer?.servers ?? []).map((row) => (
          <tr key={row.server}>
            <td class="mono">{row.server}</td>
            <td>{row.ok}</td>
            <td>{row.failed}</td>
          </tr>
        ))}
      </Table>
      <Table
        testid="mcp"
        label="MCP calls"
        head={["Time", "Sandbox", "Server", "Method", "Tool", "Outcome", "Duration"]}
      >
        {(answer?.entries ?? []).map((entry, at) => (
          <tr key={`${entry.time}-${at}`} data-outcome={entry.outcome}>
            <td data-col="time">{formatTime(entry.time)}</td>
            <td data-col="sandbox" class="mono">{entry.sandbox}</td>
            <td data-col="server">{entry.server}</td>
            <td data-col="method">{entry.method}</td>
            <td data-col="tool">{entry.tool ?? "–"}</td>
            <td data-col="outcome">{entry.outcome}{entry.count > 1 ? ` ×${entry.count}` : ""}</td>
            <td data-col="duration">{formatDuration(entry.durationMs)}</td>
          </tr>
        ))}
      </Table>
    </div>
  );
}
