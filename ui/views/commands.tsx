/// <reference lib="dom" />
/**
 * A sandbox's commands, running and recent (every 2 s); a row shows its
 * output; a running one can be followed live through envd's
 * `process.Connect` by pid.
 *
 * @module
 */
import type { JSX } from "preact";
import { useEffect, useState } from "preact/hooks";
import { api, envdOf, errorText, seg } from "../api.ts";
import { usePoll } from "../state.ts";
import type { ConsoleCommand } from "../types.ts";
import { formatArgv, formatDuration, formatTime, Table } from "./common.tsx";

/** The most of a followed command's output kept in the page. */
const FOLLOW_KEEP = 256 * 1024;

/**
 * @param props The sandbox.
 * @returns The commands tab.
 */
export function CommandsView(props: { sandboxId: string }): JSX.Element {
  const [list] = usePoll(
    () =>
      api<{ commands: ConsoleCommand[] }>(
        "GET",
        `/waffle/v1/sandboxes/${seg(props.sandboxId)}/commands?limit=50`,
      ),
    { ms: 2000, deps: [props.sandboxId] },
  );
  const [selected, setSelected] = useState<string | null>(null);
  const [followed, setFollowed] = useState<number | null>(null);
  const commands = list?.commands ?? [];
  // Another row shows its own output; following stops.
  const choose = (id: string): void => {
    setSelected(id);
    setFollowed(null);
  };
  const chosen = commands.find((command) => command.id === selected);
  return (
    <div>
      <Table
        testid="commands"
        label="Commands"
        head={["Command", "Exit", "Duration", "Started", ""]}
      >
        {commands.map((command) => (
          <tr
            key={command.id}
            data-command-id={command.id}
            class={command.id === selected ? "selected" : "clickable"}
            tabIndex={0}
            onClick={() => choose(command.id)}
            onKeyDown={(event) => {
              // Keys on the row's own button are the button's.
              if (event.target !== event.currentTarget) return;
              if (event.key === "Enter" || event.key === " ") {
                event.preventDefault();
                choose(command.id);
              }
            }}
          >
            <td data-col="argv" class="mono">{formatArgv(command.argv)}</td>
            <td data-col="exit">{exitText(command)}</td>
            <td data-col="duration">{formatDuration(command.durationMs)}</td>
            <td data-col="started">{formatTime(command.startedAt)}</td>
            <td>
              {command.running && command.pid !== null
                ? (
                  <button
                    type="button"
                    data-action="follow"
                    onClick={(event) => {
                      event.stopPropagation();
                      setSelected(command.id);
                      setFollowed(command.pid);
                    }}
                  >
                    Follow
                  </button>
                )
                : null}
            </td>
          </tr>
        ))}
      </Table>
      {followed !== null
        ? <Follow sandboxId={props.sandboxId} pid={followed} />
        : chosen !== undefined
        ? <Output command={chosen} />
        : <p class="muted">Choose a command to see its output.</p>}
    </div>
  );
}

function exitText(command: ConsoleCommand): string {
  if (command.running) return "running";
  if (command.signal !== null) return `signal ${command.signal}`;
  return command.exitCode === null ? "–" : String(command.exitCode);
}

function Output(props: { command: ConsoleCommand }): JSX.Element {
  const { command } = props;
  const text = command.stdoutTail + (command.stderrTail === "" ? "" : `\n${command.stderrTail}`);
  return (
    <div>
      <h2 class="small">
        Output of <code>{formatArgv(command.argv)}</code>
        {command.truncated ? " (last 4 KiB)" : ""}
      </h2>
      <pre data-testid="output" class="output">{text}</pre>
    </div>
  );
}

function Follow(props: { sandboxId: string; pid: number }): JSX.Element {
  const [text, setText] = useState("");
  const [state, setState] = useState("following");
  useEffect(() => {
    const abort = new AbortController();
    const decoder = new TextDecoder();
    setText("");
    setState("following");
    void (async () => {
      try {
        const envd = await envdOf(props.sandboxId);
        const events = envd.process.connect(
          { process: { selector: { case: "pid", value: props.pid } } },
          { signal: abort.signal },
        );
        for await (const { event } of events) {
          const e = event?.event;
          if (e?.case === "data" && e.value.output.case !== undefined) {
            const chunk = decoder.decode(e.value.output.value, { stream: true });
            setText((old) => (old + chunk).slice(-FOLLOW_KEEP));
          } else if (e?.case === "end") setState(`exited ${e.value.exitCode}`);
        }
      } catch (error) {
        if (!abort.signal.aborted) setState(`failed: ${errorText(error)}`);
      }
    })();
    return () => abort.abort();
  }, [props.sandboxId, props.pid]);
  return (
    <div>
      <h2 class="small">Following pid {props.pid}: {state}</h2>
      <pre data-testid="output" class="output" aria-live="polite">{text}</pre>
    </div>
  );
}
