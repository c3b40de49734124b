/**
 * `waffle exec` and `waffle wait`: run a command in the sandbox (or wait for
 * one submitted with `--detach`), stream its output live, and exit with its
 * exit status.
 *
 * @module
 */
import { mark } from "../trace.ts";
import { UsageError, WaffleError } from "../errors.ts";
import {
  EXIT_CANCELLED,
  EXIT_CANNOT_EXECUTE,
  EXIT_NOT_FOUND,
  EXIT_SIGNAL_BASE,
  EXIT_TIMEOUT,
  EXIT_WAFFLE,
} from "../exit_codes.ts";
import type { Backend } from "../queue/backend.ts";
import type { RunnerTrouble } from "../queue/liveness.ts";
import {
  DEFAULT_OUTPUT_CAP,
  type ExecResult,
  MAX_OUTPUT_CAP,
  type OutputChunk,
} from "../queue/protocol.ts";
import { collectOutput } from "../queue/queue.ts";
import { QueueSession } from "../queue/session.ts";
import { envFlags, numberFlag, parse, stringFlag } from "./args.ts";
import { BACKEND_OPTIONS, openBackend } from "./backend_flags.ts";
import type { CliIo } from "./io.ts";
import { exitStatusOf, jsonOf, noteOf, truncationNotesOf } from "./report.ts";

/** Help text of `waffle exec`. */
export const EXEC_HELP = `Usage: waffle exec [options] -- CMD [ARG...]

Runs CMD (no implicit shell) in the user's sandbox and exits with its status.

Options:
  --user U           sandbox owner (Docker backend, the default)
  --tenant T         tenant of the user (default: "default")
  --image REF        runner image (default: waffle-runner:latest)
  --backend host     run on the host filesystem instead; NOT a sandbox (needs --queue)
  --queue DIR        queue directory for --backend host
  -i, --interactive  stream stdin to CMD while it runs (any size; output streams back as it
                     comes, without --output-cap); without -i stdin is not read and
                     CMD's stdin is closed
  --timeout SECONDS  kill the command's whole process tree after this long (exit ${EXIT_TIMEOUT})
  --output-cap BYTES keep at most BYTES of each of stdout and stderr (default ${DEFAULT_OUTPUT_CAP},
                     at most ${MAX_OUTPUT_CAP}); a stream cut short is named on stderr
  --cwd DIR          working directory inside the workspace
  --env K=V          environment variable (repeatable; nothing else is inherited)
  --json             print one JSON object with the result and output
  --detach           print the request id and exit; collect with 'waffle wait ID'

Exit status: the command's; ${EXIT_TIMEOUT} timeout; ${EXIT_WAFFLE} waffle error; ${EXIT_CANNOT_EXECUTE} cannot execute;
${EXIT_NOT_FOUND} not found; ${EXIT_SIGNAL_BASE}+n killed by signal n; ${EXIT_CANCELLED} cancelled (Ctrl-C)
`;

/**
 * Runs `waffle exec`.
 *
 * @param args Arguments after `exec`.
 * @param io Process streams.
 * @returns The exit status.
 */
export async function execCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    ...BACKEND_OPTIONS,
    interactive: { type: "boolean", short: "i" },
    timeout: { type: "string" },
    "output-cap": { type: "string" },
    cwd: { type: "string" },
    env: { type: "string", multiple: true },
    json: { type: "boolean" },
    detach: { type: "boolean" },
  });
  if (parsed.positionals.length === 0) {
    throw new UsageError("Missing command: use 'waffle exec [options] -- CMD [ARG...]'");
  }
  const timeout = numberFlag(parsed, "timeout");
  const outputCap = numberFlag(parsed, "output-cap", { integer: true, max: MAX_OUTPUT_CAP });
  const cwd = stringFlag(parsed, "cwd");
  const env = envFlags((parsed.values.env as string[] | undefined) ?? []);
  // Like `docker exec`: stdin only when asked for. Reading it otherwise would
  // hang a script whose stdin is a pipe that never closes.
  const interactive = parsed.values.interactive === true;
  if (interactive && (parsed.values.detach || outputCap !== undefined)) {
    throw new UsageError(
      `'-i' streams stdin and output while the command runs: it takes no '${
        parsed.values.detach ? "--detach" : "--output-cap"
      }'`,
    );
  }
  mark("arguments parsed");
  const backend = openBackend(parsed);
  mark("backend open (config, queue)");
  const request = {
    argv: parsed.positionals,
    ...(cwd === undefined ? {} : { cwd }),
    ...(Object.keys(env).length === 0 ? {} : { env }),
    ...(timeout === undefined ? {} : { timeoutMs: Math.round(timeout * 1000) }),
  };
  try {
    if (interactive) {
      return await streamed(backend, request, { io, json: parsed.values.json === true });
    }
    const id = await backend.submit({
      ...request,
      ...(outputCap === undefined ? {} : { outputCap }),
    });
    mark("submitted");
    if (parsed.values.detach) {
      await io.stdout(`${id}\n`);
      return 0;
    }
    return await follow(backend, id, {
      io,
      json: parsed.values.json === true,
      outputCap: outputCap ?? DEFAULT_OUTPUT_CAP,
    });
  } finally {
    backend.close();
  }
}

// `exec -i`: a session whose stdin is pumped from ours while it runs (with
// the queue's flow control: a window of rows, however large the input) and
// whose output streams back unbounded. It may run on after its stdin ends.
async function streamed(
  backend: Backend,
  request: { argv: string[]; cwd?: string; env?: Record<string, string>; timeoutMs?: number },
  options: { io: CliIo; json: boolean },
): Promise<number> {
  const wait = { revive: (trouble: RunnerTrouble) => backend.ensure(trouble) };
  const session = await QueueSession.open(backend, {
    ...request,
    endGraceMs: 0,
    // Ended by its own time limit, or by ours ending (the lease).
    idleMs: 7 * 24 * 3600 * 1000,
  }, wait);
  mark("submitted");
  const pump = pumpStdin(options.io.stdin, session);
  try {
    return await follow(backend, session.id, { ...options, output: () => session.output() });
  } finally {
    await pump.cancel();
    await session.close();
  }
}

// Copies our stdin into the session until it ends (then closes the
// session's), or until the session is over.
function pumpStdin(
  stdin: ReadableStream<Uint8Array> | null,
  session: QueueSession,
): { cancel(): Promise<void> } {
  const reader = (stdin ?? Deno.stdin.readable).getReader();
  const done = (async () => {
    try {
      while (true) {
        const { value, done } = await reader.read();
        if (done) break;
        await session.write(value);
      }
      await session.end();
    } catch {
      // The session ended first (its input is closed, or it is gone).
    }
  })();
  return {
    cancel: async () => {
      await reader.cancel().catch(() => {});
      await done;
    },
  };
}

/** Help text of `waffle wait`. */
export const WAIT_HELP =
  `Usage: waffle wait ID [--json] [--user U [--tenant T] | --backend host --queue DIR]

Waits for a request submitted with 'waffle exec --detach' (or by a host that
died) and then behaves as 'waffle exec' would have: output, exit status, --json.
`;

/**
 * Runs `waffle wait ID`.
 *
 * @param args Arguments after `wait`.
 * @param io Process streams.
 * @returns The exit status.
 */
export async function waitCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { ...BACKEND_OPTIONS, json: { type: "boolean" } });
  const [id, ...rest] = parsed.positionals;
  if (id === undefined || rest.length > 0) {
    throw new UsageError("Expected exactly one request id: 'waffle wait ID'");
  }
  const backend = openBackend(parsed);
  try {
    // An unknown id fails at once, from the host's own inbound.db (reading
    // outbound.db here could meet the runner mid-commit: the wait handles that).
    return await follow(backend, id, { io, json: parsed.values.json === true });
  } finally {
    backend.close();
  }
}

// Streams (or collects for --json) until the result is in. The first Ctrl-C
// cancels the request; a second stops waiting at once, whatever the wait is
// blocked on (a revival, a full pipe), and ends through runCli like any
// other error.
async function follow(
  backend: Backend,
  id: string,
  options: { io: CliIo; json: boolean; outputCap?: number; output?: () => OutputStream },
): Promise<number> {
  const forced = Promise.withResolvers<never>();
  const stopWaiting = new AbortController();
  let interrupts = 0;
  const onInterrupt = (): void => {
    interrupts++;
    if (interrupts === 1) {
      void backend.queue.cancel(id).catch(() => {});
      return;
    }
    const error = new WaffleError(
      `Stopped waiting for request '${id}' at a second Ctrl-C (the first asked for its cancel)`,
      { exitCode: EXIT_CANCELLED },
    );
    stopWaiting.abort(error);
    forced.reject(error);
  };
  Deno.addSignalListener("SIGINT", onInterrupt);
  try {
    return await Promise.race([
      report(backend, id, { ...options, signal: stopWaiting.signal }),
      forced.promise,
    ]);
  } finally {
    Deno.removeSignalListener("SIGINT", onInterrupt);
  }
}

// The output, the notes, the acknowledgement and the exit status of one request.
// `outputCap` is the request's cap when this process submitted it; `wait`
// does not know it, and names the bytes it received instead: the runner
// forwards exactly the cap's worth of a stream before cutting it.
async function report(
  backend: Backend,
  id: string,
  options: {
    io: CliIo;
    json: boolean;
    outputCap?: number;
    signal: AbortSignal;
    output?: () => OutputStream;
  },
): Promise<number> {
  const { io, queue } = { io: options.io, queue: backend.queue };
  const wait = {
    signal: options.signal,
    revive: (trouble: RunnerTrouble) => backend.ensure(trouble),
  };
  const output = options.output ?? (() => queue.output(id, wait));
  const notes: string[] = [];
  let stderrMidLine = false;
  let collected;
  if (options.json) {
    // The object carries the truncation flags itself.
    collected = await collectOutput(output());
    await io.stdout(`${JSON.stringify(jsonOf(id, collected))}\n`);
  } else {
    const received = { stdout: 0, stderr: 0 };
    const stream = output();
    let next = await stream.next();
    while (!next.done) {
      const { stream: name, data } = next.value;
      received[name] += data.byteLength;
      if (name === "stderr" && data.byteLength > 0) stderrMidLine = data.at(-1) !== 0x0a;
      await (name === "stdout" ? io.stdout : io.stderr)(data);
      next = await stream.next();
    }
    collected = { result: next.value };
    const caps = options.outputCap === undefined
      ? received
      : { stdout: options.outputCap, stderr: options.outputCap };
    notes.push(...truncationNotesOf(collected.result, caps));
  }
  mark("result");
  const note = noteOf(id, collected.result);
  if (note !== undefined) notes.push(note);
  // waffle's lines start a line of their own, even after a stream cut mid-line.
  if (notes.length > 0) await io.stderr(`${stderrMidLine ? "\n" : ""}${notes.join("\n")}\n`);
  await queue.ack(id);
  mark("acknowledged");
  await queue.gc().catch(() => 0);
  mark("gc");
  return exitStatusOf(collected.result);
}

/** A request's output chunks, its result on the return value. */
type OutputStream = AsyncGenerator<OutputChunk, ExecResult>;
