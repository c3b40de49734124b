/// <reference lib="dom" />
/**
 * The sandboxes table: live (every 2 s), filtered by text and state, with
 * each sandbox's actions.
 *
 * @module
 */
import type { JSX } from "preact";
import { useState } from "preact/hooks";
import { listSandboxes, seg } from "../api.ts";
import { usePoll } from "../state.ts";
import type { ConsoleSandbox, WhoAmI } from "../types.ts";
import { SandboxActions } from "./actions.tsx";
import { formatArgv, formatBytes, formatDuration, Table } from "./common.tsx";

const HEAD = [
  "Sandbox",
  "Tenant",
  "Template",
  "State",
  "Uptime",
  "CPU",
  "Memory",
  "Disk",
  "Pool",
  "Egress",
  "Last command",
  "Actions",
];

/**
 * @param props Who is signed in.
 * @returns The sandboxes view.
 */
export function SandboxesView(props: { who: WhoAmI }): JSX.Element {
  const [text, setText] = useState("");
  const [state, setState] = useState("");
  const [list, reload] = usePoll(listSandboxes, { ms: 2000, deps: [] });
  const wanted = (list?.sandboxes ?? []).filter((sandbox) =>
    (state === "" || sandbox.state === state) && matches(sandbox, text)
  );
  return (
    <section aria-labelledby="sandboxes-title">
      <h1 id="sandboxes-title">Sandboxes</h1>
      <div class="filters">
        <label>
          Filter{" "}
          <input
            type="search"
            data-testid="filter"
            value={text}
            placeholder="id, template, tenant, metadata"
            onInput={(event) => setText(event.currentTarget.value)}
          />
        </label>
        <label>
          State{" "}
          <select
            data-testid="state-filter"
            value={state}
            onChange={(event) => setState(event.currentTarget.value)}
          >
            <option value="">all</option>
            <option value="running">running</option>
            <option value="paused">paused</option>
            <option value="stopped">stopped</option>
          </select>
        </label>
        <span class="muted">
          {list === undefined ? "loading…" : `${wanted.length} of ${list.sandboxes.length}`}
        </span>
      </div>
      <Table testid="sandboxes" label="Sandboxes" head={HEAD}>
        {wanted.map((sandbox) => (
          <SandboxRow key={sandbox.sandboxID} sandbox={sandbox} who={props.who} changed={reload} />
        ))}
      </Table>
    </section>
  );
}

function SandboxRow(
  props: { sandbox: ConsoleSandbox; who: WhoAmI; changed: () => void },
): JSX.Element {
  const s = props.sandbox;
  const uptime = Date.now() - Date.parse(s.startedAt);
  const last = s.lastCommand;
  return (
    <tr data-sandbox-id={s.sandboxID}>
      <td data-col="id">
        <a href={`#/sandbox/${seg(s.sandboxID)}`}>{s.sandboxID}</a>
      </td>
      <td data-col="tenant">{s.tenant}</td>
      <td data-col="template" title={s.image}>{s.templateID}</td>
      <td data-col="state">
        <span class={`state state-${s.state}`}>{s.state}</span>
      </td>
      <td data-col="uptime">{s.state === "running" ? formatDuration(uptime) : "–"}</td>
      <td data-col="cpu" title={s.cpuCount === null ? "" : `of ${s.cpuCount} CPU`}>
        {s.cpuUsedPct === null ? "–" : `${s.cpuUsedPct.toFixed(1)}%`}
      </td>
      <td data-col="memory">{usage(s.memUsed, s.memTotal)}</td>
      <td data-col="disk">{usage(s.diskUsed, s.diskTotal)}</td>
      <td data-col="pool">{s.pool ?? "–"}</td>
      <td data-col="egress" title={s.egress.allow.join(", ")}>
        {s.egress.attached
          ? (s.egress.allow.includes("*") ? "any" : s.egress.allow.join(", ") || "none")
          : "off"}
      </td>
      <td data-col="last" title={last === null ? "" : formatArgv(last.argv)}>
        {last === null
          ? "–"
          : `${formatArgv(last.argv).slice(0, 60)} ${
            last.running ? "(running)" : `→ ${last.exitCode ?? "?"}`
          }`}
      </td>
      <td>
        <SandboxActions sandbox={s} who={props.who} changed={props.changed} />
      </td>
    </tr>
  );
}

function usage(used: number | null, total: number | null): string {
  if (used === null) return "–";
  return total === null ? formatBytes(used) : `${formatBytes(used)} / ${formatBytes(total)}`;
}

function matches(sandbox: ConsoleSandbox, text: string): boolean {
  const needle = text.trim().toLowerCase();
  if (needle === "") return true;
  const metadata = Object.entries(sandbox.metadata).map(([k, v]) => `${k}=${v}`);
  return [
    sandbox.sandboxID,
    sandbox.templateID,
    sandbox.image,
    sandbox.tenant,
    sandbox.state,
    ...metadata,
  ]
    .some((field) => field.toLowerCase().includes(needle));
}
