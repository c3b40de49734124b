/// <reference lib="dom" />
/**
 * A sandbox's action buttons (stop, pause, resume, kill, snapshot, fork,
 * terminal), the same in the table and on the sandbox's page. Each action
 * is E2B's or waffle's API route; kill and stop ask first.
 *
 * @module
 */
import type { JSX } from "preact";
import { api, seg } from "../api.ts";
import { ask, showError, withProgress } from "../state.ts";
import type { ConsoleSandbox, WhoAmI } from "../types.ts";

/**
 * @param props The sandbox, what the backend offers, what to do after an action.
 * @returns The buttons that apply to its state.
 */
export function SandboxActions(
  props: { sandbox: ConsoleSandbox; who: WhoAmI; changed: () => void },
): JSX.Element {
  const { sandbox, who, changed } = props;
  const id = sandbox.sandboxID;
  const path = `/sandboxes/${seg(id)}`;
  const run = async (call: () => Promise<unknown>): Promise<void> => {
    try {
      await call();
    } catch (error) {
      showError(error);
    }
    changed();
  };
  const paused = sandbox.state === "paused";
  const buttons: { action: string; label: string; onClick: () => void }[] = [];
  if (!paused) {
    buttons.push({
      action: "terminal",
      label: "Terminal",
      onClick: () => location.hash = `#/sandbox/${seg(id)}/terminal`,
    });
  }
  if (sandbox.state === "running" && who.features.stop) {
    buttons.push({
      action: "stop",
      label: "Stop",
      onClick: async () => {
        if (!await ask(`Stop sandbox ${id}? Its processes end; its files stay.`, "Stop")) return;
        await run(() => api("POST", `/waffle/v1/sandboxes/${seg(id)}/stop`));
      },
    });
  }
  if (paused) {
    buttons.push({
      action: "resume",
      label: "Resume",
      onClick: () => void run(() => api("POST", `${path}/connect`, {})),
    });
  } else {
    buttons.push({
      action: "pause",
      label: "Pause",
      onClick: () => void run(() => api("POST", `${path}/pause`)),
    });
  }
  if (!paused && who.features.snapshots) {
    buttons.push({
      action: "snapshot",
      label: "Snapshot",
      onClick: () =>
        void withProgress(`Snapshot of ${id}`, () => api("POST", `${path}/snapshots`, {}))
          .then(changed),
    });
  }
  if (!paused && who.features.fork) {
    buttons.push({
      action: "fork",
      label: "Fork",
      onClick: () =>
        void withProgress(`Fork of ${id}`, () => api("POST", `${path}/fork`, { count: 1 }))
          .then(changed),
    });
  }
  buttons.push({
    action: "kill",
    label: "Kill",
    onClick: async () => {
      if (!await ask(`Kill sandbox ${id}? It and its files are gone.`, "Kill")) return;
      await run(() => api("DELETE", path));
    },
  });
  return (
    <div class="actions">
      {buttons.map((button) => (
        <button
          key={button.action}
          type="button"
          data-action={button.action}
          class={button.action === "kill" || button.action === "stop" ? "danger" : ""}
          onClick={button.onClick}
        >
          {button.label}
        </button>
      ))}
    </div>
  );
}
