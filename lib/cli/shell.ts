/**
 * `waffle shell`: a terminal in the sandbox. The command runs on a pty the
 * runner holds (`runner/pty.ts`); this terminal goes raw, so every key
 * (Ctrl-C and Ctrl-\ included) reaches the pty, whose line discipline turns
 * them into signals of the command's foreground process group. A resize of
 * this terminal is sent on (SIGWINCH inside). The command's output passes
 * through `ScreenFilter` (what acts beyond its screen is dropped unless
 * `--raw`); `~.` at the start of a line ends the session from this side; and
 * the terminal's modes and termios are restored however the shell ends.
 *
 * @module
 */
import { settlesWithin } from "../async.ts";
import { UsageError } from "../errors.ts";
import { EXIT_DISCONNECTED, exitCodeOfSignal } from "../exit_codes.ts";
import type { ExecResult, OutputChunk } from "../queue/protocol.ts";
import type { RunnerTrouble } from "../queue/liveness.ts";
import { QueueSession } from "../queue/session.ts";
import { EscapeKeys } from "../terminal/escape_keys.ts";
import { ScreenFilter } from "../terminal/screen_filter.ts";
import { terminalIsUtf8 } from "../terminal/locale.ts";
import { envFlags, parse, stringFlag } from "./args.ts";
import { BACKEND_OPTIONS, openBackend } from "./backend_flags.ts";
import type { CliIo } from "./io.ts";
import { exitStatusOf, noteOf } from "./report.ts";

/** Help text of `waffle shell`. */
export const SHELL_HELP = `Usage: waffle shell --user U [options] [-- CMD [ARG...]]

Opens a terminal in the user's sandbox running CMD (default: /bin/sh), as
'docker exec -it' would: window size and resizes, Ctrl-C and Ctrl-\\ reach
CMD's process group, and waffle exits with CMD's status. Needs a terminal;
for pipes use 'waffle exec -i'.

Escape: at the start of a line (after Enter), '~.' ends the session from
this terminal, as ssh's does: CMD and everything it started are killed, even
when it ignores Ctrl-C, and waffle exits ${EXIT_DISCONNECTED}. '~~' sends one '~'.

CMD's output is filtered: what would act beyond its screen is dropped
(clipboard writes, OSC 8 links, DCS strings, window operations, title and
other reports the terminal would answer; see README.md), and on exit the
terminal's modes (alternate screen, bracketed paste, mouse, cursor, colours,
title) are restored, whatever ended it.

Options:
  --user U      sandbox owner
  --tenant T    tenant of the user (default: "default")
  --image REF   image (default: the config's)
  --cwd DIR     working directory inside the workspace
  --env K=V     environment variable (repeatable)
  --raw         pass CMD's output to this terminal unchanged (modes are still restored)
`;

/** A session with no input and no output for this long ends (a forgotten shell). */
const SHELL_IDLE_MS = 12 * 3600 * 1000;
/** After `~.` or a signal, how long the runner has to confirm the command's tree is killed. */
const END_WAIT_MS = 5000;

/** How a session was ended from this side. */
type Ending = { by: "escape" } | { by: "signal"; signal: "SIGTERM" | "SIGHUP" };

/**
 * Runs `waffle shell`.
 *
 * @param args Arguments after `shell`.
 * @param io Process streams (its stdin must be this process's terminal).
 * @returns The command's exit status; {@linkcode EXIT_DISCONNECTED} after `~.`;
 *   128+N after signal N.
 */
export async function shellCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    ...BACKEND_OPTIONS,
    cwd: { type: "string" },
    env: { type: "string", multiple: true },
    raw: { type: "boolean" },
  });
  if (!Deno.stdin.isTerminal() || !Deno.stdout.isTerminal()) {
    throw new UsageError(
      "'waffle shell' needs a terminal on stdin and stdout; for pipes use 'waffle exec -i'",
    );
  }
  const env = envFlags((parsed.values.env as string[] | undefined) ?? []);
  const cwd = stringFlag(parsed, "cwd");
  const argv = parsed.positionals.length > 0 ? parsed.positionals : ["/bin/sh"];
  const backend = openBackend(parsed);
  const size = Deno.consoleSize();
  try {
    const session = await QueueSession.open(backend, {
      argv,
      ...(cwd === undefined ? {} : { cwd }),
      env,
      tty: { rows: size.rows, cols: size.columns },
      endGraceMs: 0,
      idleMs: SHELL_IDLE_MS,
    }, { revive: (trouble: RunnerTrouble) => backend.ensure(trouble) });
    try {
      return await attach(session, { io, raw: parsed.values.raw === true });
    } finally {
      await session.close();
    }
  } finally {
    backend.close();
  }
}

// The session on this terminal until it ends, or this side ends it.
async function attach(
  session: QueueSession,
  options: { io: CliIo; raw: boolean },
): Promise<number> {
  const { io } = options;
  const screen = new ScreenFilter({ raw: options.raw, utf8: terminalIsUtf8() });
  const terminal = rawTerminal(session);
  let restored = false;
  // The trailer first (the terminal still raw), then termios.
  const restore = async (): Promise<void> => {
    if (restored) return;
    restored = true;
    await io.stdout(screen.end()).catch(() => {});
    terminal.release();
  };
  try {
    await io.stdout(screen.start());
    const output = session.output();
    const relayed = await relayOutput(output, { screen, io, ended: terminal.ended });
    if ("result" in relayed) {
      await restore();
      const note = noteOf(session.id, relayed.result);
      if (note !== undefined) await io.stderr(`${note}\n`);
      return exitStatusOf(relayed.result);
    }
    // Ended from this side: the command's tree is killed, its output no longer shown.
    await session.cancel().catch(() => {});
    let result: ExecResult | undefined;
    const drained = drain(relayed.pending, output).then((value) => result = value);
    await settlesWithin(drained, END_WAIT_MS);
    await restore();
    const { ending } = relayed;
    const how = ending.by === "escape" ? "with ~." : `on ${ending.signal}`;
    const killed = result !== undefined
      ? "its processes are killed"
      : `the runner did not confirm within ${END_WAIT_MS / 1000} s that its processes are killed`;
    await io.stderr(`waffle: ended request '${session.id}' ${how}: ${killed}\n`).catch(() => {});
    return ending.by === "escape"
      ? EXIT_DISCONNECTED
      : exitCodeOfSignal(ending.signal === "SIGTERM" ? 15 : 1);
  } finally {
    await restore();
  }
}

type Output = AsyncGenerator<OutputChunk, ExecResult>;

// Writes the session's output through the filter until it ends (its result)
// or this side ends it (the read still pending).
async function relayOutput(
  output: Output,
  options: { screen: ScreenFilter; io: CliIo; ended: Promise<Ending> },
): Promise<
  { result: ExecResult } | {
    ending: Ending;
    pending: Promise<IteratorResult<OutputChunk, ExecResult>>;
  }
> {
  const { screen, io } = options;
  // One reaction on `ended`, however many chunks (a race per chunk would add one each).
  let stop: ((ending: Ending) => void) | undefined;
  let endedBy: Ending | undefined;
  void options.ended.then((ending) => {
    endedBy = ending;
    stop?.(ending);
  });
  while (true) {
    const pending = output.next();
    const step = await new Promise<
      { next: IteratorResult<OutputChunk, ExecResult> } | {
        ending: Ending;
      }
    >((resolve, reject) => {
      stop = (ending) => resolve({ ending });
      if (endedBy !== undefined) stop(endedBy);
      pending.then((next) => resolve({ next }), reject);
    });
    if ("ending" in step) return { ending: step.ending, pending };
    if (step.next.done) return { result: step.next.value };
    const bytes = screen.push(step.next.value.data);
    if (bytes.byteLength > 0) await io.stdout(bytes);
  }
}

// Reads what is left of the output without showing it; the result, if it comes.
async function drain(
  pending: Promise<IteratorResult<OutputChunk, ExecResult>>,
  output: Output,
): Promise<ExecResult | undefined> {
  try {
    let next = await pending;
    while (!next.done) next = await output.next();
    return next.value;
  } catch {
    return undefined;
  }
}

// Raw mode, keys to the session (but `~.`), resizes sent on; `ended` says
// when `~.` was typed or this process was told to stop; `release` undoes it.
function rawTerminal(session: QueueSession): { ended: Promise<Ending>; release(): void } {
  Deno.stdin.setRaw(true, { cbreak: false });
  const reader = Deno.stdin.readable.getReader();
  const { promise: ended, resolve: end } = Promise.withResolvers<Ending>();
  let released = false;
  void (async () => {
    const keys = new EscapeKeys();
    try {
      while (true) {
        const { value, done } = await reader.read();
        if (done) break;
        const { forward, disconnect } = keys.feed(value);
        if (forward.byteLength > 0) await session.write(forward);
        if (disconnect) return end({ by: "escape" });
      }
    } catch {
      // The session ended, or this terminal closed.
    }
  })();
  const onResize = (): void => {
    const { rows, columns } = Deno.consoleSize();
    void session.resize({ rows, cols: columns }).catch(() => {});
  };
  const signals = ["SIGTERM", "SIGHUP"] as const;
  const onStop = signals.map((signal) => () => end({ by: "signal", signal }));
  Deno.addSignalListener("SIGWINCH", onResize);
  signals.forEach((signal, i) => Deno.addSignalListener(signal, onStop[i]!));
  const release = (): void => {
    if (released) return;
    released = true;
    Deno.removeSignalListener("SIGWINCH", onResize);
    signals.forEach((signal, i) => Deno.removeSignalListener(signal, onStop[i]!));
    void reader.cancel().catch(() => {});
    try {
      Deno.stdin.setRaw(false);
    } catch {
      // The terminal is gone.
    }
  };
  return { ended, release };
}
