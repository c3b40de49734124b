/// <reference lib="dom" />
/**
 * A shell in the sandbox: xterm (DOM renderer) fit to its box, over envd's
 * `process.Start` with a pty (`/bin/bash -i -l`), the same PTY path as
 * `waffle shell`. Keys go by `SendInput` in order; a resize refits and
 * sends `Update` with the new size; the stream's end event gives the exit
 * status.
 *
 * @module
 */
import type { JSX } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import { envdOf, errorText } from "../api.ts";

const RESIZE_DEBOUNCE_MS = 100;

/**
 * @param props The sandbox.
 * @returns The terminal tab.
 */
export function TerminalView(props: { sandboxId: string }): JSX.Element {
  const box = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState("connecting");
  const [run, setRun] = useState(0);
  useEffect(() => {
    if (box.current === null) return;
    setStatus("connecting");
    const session = startSession(props.sandboxId, box.current, setStatus);
    return () => session.close();
  }, [props.sandboxId, run]);
  return (
    <div class="terminal-view">
      <div class="row">
        <span data-testid="terminal-status" role="status">{status}</span>
        <button type="button" data-action="restart-terminal" onClick={() => setRun((n) => n + 1)}>
          Restart
        </button>
      </div>
      <div class="terminal" data-testid="terminal" ref={box} />
    </div>
  );
}

function startSession(
  sandboxId: string,
  box: HTMLElement,
  setStatus: (status: string) => void,
): { close: () => void } {
  const abort = new AbortController();
  const term = new Terminal({
    cursorBlink: true,
    fontSize: 14,
    fontFamily: "ui-monospace, Menlo, Consolas, monospace",
    scrollback: 5000,
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  term.focus();
  let pid: number | undefined;
  // Keys typed while a SendInput is in flight go together in the next one:
  // in order, and one round trip per burst rather than per key.
  let pending = "";
  let sending = false;
  const encoder = new TextEncoder();
  const flush = async (): Promise<void> => {
    if (sending || pending === "" || pid === undefined) return;
    sending = true;
    const data = pending;
    pending = "";
    try {
      const envd = await envdOf(sandboxId);
      await envd.process.sendInput({
        process: { selector: { case: "pid", value: pid } },
        input: { input: { case: "pty", value: encoder.encode(data) } },
      }, { signal: abort.signal });
    } catch {
      // The end event (or the stream's failure) tells what happened.
    } finally {
      sending = false;
    }
    void flush();
  };
  const input = (data: string): void => {
    if (pid === undefined) return;
    pending += data;
    void flush();
  };
  term.onData(input);
  term.onBinary((data) => input(data));
  let resizeTimer: ReturnType<typeof setTimeout> | undefined;
  term.onResize(({ cols, rows }) => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      if (pid === undefined) return;
      void envdOf(sandboxId).then((envd) =>
        envd.process.update(
          { process: { selector: { case: "pid", value: pid! } }, pty: { size: { cols, rows } } },
          { signal: abort.signal },
        )
      ).catch(() => {});
    }, RESIZE_DEBOUNCE_MS);
  });
  let fitTimer: ReturnType<typeof setTimeout> | undefined;
  const refit = (): void => {
    clearTimeout(fitTimer);
    fitTimer = setTimeout(() => fit.fit(), RESIZE_DEBOUNCE_MS);
  };
  addEventListener("resize", refit);
  void stream(sandboxId, term, abort.signal, {
    started: (started) => {
      pid = started;
      setStatus("connected");
    },
    setStatus,
  });
  return {
    close: () => {
      abort.abort();
      removeEventListener("resize", refit);
      clearTimeout(resizeTimer);
      clearTimeout(fitTimer);
      term.dispose();
    },
  };
}

async function stream(
  sandboxId: string,
  term: Terminal,
  signal: AbortSignal,
  on: { started: (pid: number) => void; setStatus: (status: string) => void },
): Promise<void> {
  try {
    const envd = await envdOf(sandboxId);
    const events = envd.process.start({
      process: { cmd: "/bin/bash", args: ["-i", "-l"], envs: { TERM: "xterm-256color" } },
      pty: { size: { cols: term.cols, rows: term.rows } },
    }, { signal });
    let ended = false;
    for await (const { event } of events) {
      const e = event?.event;
      if (e?.case === "start") on.started(e.value.pid);
      else if (e?.case === "data" && e.value.output.case !== undefined) {
        term.write(e.value.output.value);
      } else if (e?.case === "end") {
        ended = true;
        on.setStatus(`exited ${e.value.exitCode}`);
      }
    }
    if (!ended) on.setStatus("exited ?");
  } catch (error) {
    if (!signal.aborted) on.setStatus(`failed: ${errorText(error)}`);
  }
}
