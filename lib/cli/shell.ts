/**
 * `waffle shell`: a terminal in the sandbox. The command runs on a pty the
 * runner holds (`runner/pty.ts`); this terminal goes raw, so every key
 * (Ctrl-C and Ctrl-\ included) reaches the pty, whose line discipline turns
 * them into signals of the command's foreground process group. A resize of
 * this terminal is sent on (SIGWINCH inside); the terminal is restored
 * however the shell ends.
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import type { RunnerTrouble } from "../queue/liveness.ts";
import { QueueSession } from "../queue/session.ts";
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

Options:
  --user U      sandbox owner
  --tenant T    tenant of the user (default: "default")
  --image REF   image (default: the config's)
  --cwd DIR     working directory inside the workspace
  --env K=V     environment variable (repeatable)
`;

/** A session with no input and no output for this long ends (a forgotten shell). */
const SHELL_IDLE_MS = 12 * 3600 * 1000;

/**
 * Runs `waffle shell`.
 *
 * @param args Arguments after `shell`.
 * @param io Process streams (its stdin must be this process's terminal).
 * @returns The command's exit status.
 */
export async function shellCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    ...BACKEND_OPTIONS,
    cwd: { type: "string" },
    env: { type: "string", multiple: true },
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
    const terminal = rawTerminal(session);
    try {
      const output = session.output();
      let next = await output.next();
      while (!next.done) {
        await io.stdout(next.value.data);
        next = await output.next();
      }
      terminal.restore();
      const note = noteOf(session.id, next.value);
      if (note !== undefined) await io.stderr(`${note}\n`);
      return exitStatusOf(next.value);
    } finally {
      terminal.restore();
      await session.close();
    }
  } finally {
    backend.close();
  }
}

// Raw mode, keys to the session, resizes sent on; `restore` undoes it all
// (also when this process is told to stop).
function rawTerminal(session: QueueSession): { restore(): void } {
  Deno.stdin.setRaw(true, { cbreak: false });
  const reader = Deno.stdin.readable.getReader();
  let restored = false;
  void (async () => {
    try {
      while (true) {
        const { value, done } = await reader.read();
        if (done) break;
        await session.write(value);
      }
    } catch {
      // The session ended, or this terminal closed.
    }
  })();
  const onResize = (): void => {
    const { rows, columns } = Deno.consoleSize();
    void session.resize({ rows, cols: columns }).catch(() => {});
  };
  const onStop = (): void => {
    restore();
    void session.cancel().catch(() => {});
  };
  const signals = ["SIGTERM", "SIGHUP"] as const;
  Deno.addSignalListener("SIGWINCH", onResize);
  for (const signal of signals) Deno.addSignalListener(signal, onStop);
  const restore = (): void => {
    if (restored) return;
    restored = true;
    Deno.removeSignalListener("SIGWINCH", onResize);
    for (const signal of signals) Deno.removeSignalListener(signal, onStop);
    void reader.cancel().catch(() => {});
    try {
      Deno.stdin.setRaw(false);
    } catch {
      // The terminal is gone.
    }
  };
  return { restore };
}
