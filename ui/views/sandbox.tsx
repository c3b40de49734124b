/// <reference lib="dom" />
/**
 * One sandbox's page: its state and actions, and its tabs (commands,
 * files, terminal, snapshots, network, metrics).
 *
 * @module
 */
import type { JSX } from "preact";
import { listSandboxes, seg } from "../api.ts";
import { usePoll } from "../state.ts";
import type { WhoAmI } from "../types.ts";
import { SandboxActions } from "./actions.tsx";
import { NetworkView } from "./audit.tsx";
import { CommandsView } from "./commands.tsx";
import { type Tab, Tabs } from "./common.tsx";
import { FilesView } from "./files.tsx";
import { MetricsView } from "./metrics.tsx";
import { SnapshotsView } from "./snapshots.tsx";
import { TerminalView } from "./terminal.tsx";

const TABS: Tab[] = [
  { id: "commands", label: "Commands" },
  { id: "files", label: "Files" },
  { id: "terminal", label: "Terminal" },
  { id: "snapshots", label: "Snapshots" },
  { id: "network", label: "Network" },
  { id: "metrics", label: "Metrics" },
];

/**
 * @param props The sandbox, the tab from the route, who is signed in.
 * @returns The sandbox's page.
 */
export function SandboxView(
  props: { id: string; tab: string | undefined; who: WhoAmI },
): JSX.Element {
  const { id } = props;
  const tab = TABS.some((known) => known.id === props.tab) ? props.tab! : "commands";
  const [list, reload] = usePoll(listSandboxes, { ms: 2000, deps: [] });
  const sandbox = list?.sandboxes.find((one) => one.sandboxID === id);
  return (
    <section aria-labelledby="sandbox-title">
      <div class="sandbox-head" data-testid="sandbox-header">
        <h1 id="sandbox-title">
          <a href="#/sandboxes">Sandboxes</a> / <span class="mono">{id}</span>
        </h1>
        {sandbox === undefined
          ? <span class="muted">{list === undefined ? "loading…" : "not found"}</span>
          : (
            <>
              <span class={`state state-${sandbox.state}`} data-testid="sandbox-state">
                {sandbox.state}
              </span>
              <span class="muted">{sandbox.templateID}</span>
              <SandboxActions sandbox={sandbox} who={props.who} changed={reload} />
            </>
          )}
      </div>
      <Tabs
        label="Sandbox"
        tabs={TABS}
        selected={tab}
        onSelect={(next) => location.hash = `#/sandbox/${seg(id)}/${next}`}
      >
        {panel(tab, id)}
      </Tabs>
    </section>
  );
}

function panel(tab: string, id: string): JSX.Element {
  switch (tab) {
    case "files":
      return <FilesView sandboxId={id} />;
    case "terminal":
      return <TerminalView sandboxId={id} />;
    case "snapshots":
      return <SnapshotsView sandboxId={id} />;
    case "network":
      return <NetworkView sandboxId={id} />;
    case "metrics":
      return <MetricsView sandboxId={id} />;
    default:
      return <CommandsView sandboxId={id} />;
  }
}
