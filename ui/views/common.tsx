/// <reference lib="dom" />
/**
 * Pieces every view uses: the error line, the progress list, the confirm
 * dialog, ARIA tabs, and the formatting of sizes and times.
 *
 * @module
 */
import type { ComponentChildren, JSX } from "preact";
import { useEffect, useRef } from "preact/hooks";
import { errorStore, questionStore, useStore, workStore } from "../state.ts";

/** @returns The one-line, dismissable error, when there is one. */
export function ErrorLine(): JSX.Element | null {
  const error = useStore(errorStore);
  if (error === "") return null;
  return (
    <div class="error">
      <span role="alert" data-testid="error">{error}</span>
      <button type="button" aria-label="Dismiss" onClick={() => errorStore.set("")}>×</button>
    </div>
  );
}

/** @returns The long work in progress, when there is some. */
export function ProgressList(): JSX.Element | null {
  const works = useStore(workStore);
  if (works.length === 0) return null;
  return (
    <div class="progress" data-testid="progress" role="status">
      {works.map((work) => (
        <div key={work.id}>
          <span>{work.label}</span> {work.done === null
            ? <progress aria-label={work.label} />
            : <progress aria-label={work.label} max={1} value={work.done} />}
        </div>
      ))}
    </div>
  );
}

/** @returns The modal confirm dialog (Escape cancels, focus stays inside). */
export function ConfirmDialog(): JSX.Element {
  const question = useStore(questionStore);
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const dialog = ref.current;
    if (dialog === null) return;
    if (question !== null && !dialog.open) dialog.showModal();
    if (question === null && dialog.open) dialog.close();
  }, [question]);
  return (
    <dialog
      ref={ref}
      aria-labelledby="confirm-text"
      onCancel={() => questionStore.get()?.answer(false)}
      onClose={() => questionStore.get()?.answer(false)}
    >
      <p id="confirm-text">{question?.text ?? ""}</p>
      <div class="row">
        <button type="button" onClick={() => question?.answer(false)}>Cancel</button>
        <button
          type="button"
          class="danger"
          data-testid="confirm"
          onClick={() => question?.answer(true)}
        >
          {question?.confirm ?? "Confirm"}
        </button>
      </div>
    </dialog>
  );
}

/** A tab of {@linkcode Tabs}. */
export interface Tab {
  id: string;
  label: string;
}

/**
 * WAI-ARIA tabs: arrow keys, Home and End move and select; the panel follows
 * the selection.
 *
 * @param props The tabs, the selected one, how to select, the panel.
 * @returns The tab list and its panel.
 */
export function Tabs(
  props: {
    tabs: Tab[];
    selected: string;
    onSelect: (id: string) => void;
    label: string;
    children: ComponentChildren;
  },
): JSX.Element {
  const listRef = useRef<HTMLDivElement>(null);
  const keyDown = (event: KeyboardEvent): void => {
    const at = props.tabs.findIndex((tab) => tab.id === props.selected);
    const last = props.tabs.length - 1;
    const next = {
      ArrowRight: at === last ? 0 : at + 1,
      ArrowLeft: at <= 0 ? last : at - 1,
      Home: 0,
      End: last,
    }[event.key];
    if (next === undefined) return;
    event.preventDefault();
    const tab = props.tabs[next]!;
    props.onSelect(tab.id);
    listRef.current?.querySelector<HTMLElement>(`#tab-${tab.id}`)?.focus();
  };
  return (
    <div class="tabs">
      <div role="tablist" aria-label={props.label} ref={listRef} onKeyDown={keyDown}>
        {props.tabs.map((tab) => (
          <button
            key={tab.id}
            type="button"
            role="tab"
            id={`tab-${tab.id}`}
            aria-selected={tab.id === props.selected}
            aria-controls={`panel-${tab.id}`}
            tabIndex={tab.id === props.selected ? 0 : -1}
            onClick={() => props.onSelect(tab.id)}
          >
            {tab.label}
          </button>
        ))}
      </div>
      <div
        role="tabpanel"
        id={`panel-${props.selected}`}
        aria-labelledby={`tab-${props.selected}`}
        class="panel"
      >
        {props.children}
      </div>
    </div>
  );
}

/**
 * @param props The table's test id and label, its head cells, its rows.
 * @returns A table that scrolls horizontally in its own box.
 */
export function Table(
  props: { testid: string; label: string; head: string[]; children: ComponentChildren },
): JSX.Element {
  return (
    <div class="scroll">
      <table data-testid={props.testid} aria-label={props.label}>
        <thead>
          <tr>{props.head.map((cell) => <th key={cell} scope="col">{cell}</th>)}</tr>
        </thead>
        <tbody>{props.children}</tbody>
      </table>
    </div>
  );
}

/**
 * @param bytes A size, or null.
 * @returns It in B/KiB/MiB/GiB, or "–".
 */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value < 10 && unit > 0 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

/**
 * @param ms A duration, or null.
 * @returns It as "850 ms", "12.3 s", "4m 05s", "3h 02m", or "–".
 */
export function formatDuration(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
}

/**
 * @param iso An ISO time.
 * @returns It as the local time of day (with the date when not today).
 */
export function formatTime(iso: string | null | undefined): string {
  if (iso === null || iso === undefined) return "–";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return iso;
  const today = new Date().toDateString() === date.toDateString();
  return today ? date.toLocaleTimeString() : date.toLocaleString();
}

/**
 * @param argv A command's words.
 * @returns Them as one shell-like line.
 */
export function formatArgv(argv: string[]): string {
  return argv.map((word) => /^[\w@%+=:,./-]+$/.test(word) ? word : JSON.stringify(word)).join(
    " ",
  );
}
