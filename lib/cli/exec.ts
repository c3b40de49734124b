/**
 * `waffle exec` and `waffle wait`: run a command in the sandbox (or wait for
 * one submitted with `--detach`), stream its output live, and exit with its
 * exit status.
 *
 * @module
 */
import { concat } from "../bytes.ts";
import { UsageError } from "../errors.ts";
import type { Backend } from "../host_backend.ts";
import { MAX_STDIN_BYTES } from "../queue/protocol.ts";
import { envFlags, numberFlag, parse, stringFlag } from "./args.ts";
import { BACKEND_OPTIONS, openBackend } from "./backend_flags.ts";
import type { CliIo } from "./io.ts";
import { EXIT_CANCELLED, exitStatusOf, jsonOf, noteOf } from "./report.ts";

/** Help text of `waffle exec`. */
export const EXEC_HELP = `Usage: waffle exec [options] -- CMD [ARG...]

Runs CMD (no implicit shell) in the user's sandbox and exits with its status.

Options:
  --user U           sandbox owner (Docker backend, the default)
  --tenant T         tenant of the user (default: "default")
  --image REF        runner image (default: waffle-runner:latest)
  --backend host     run on the host filesystem instead; NOT a sandbox (needs --queue)
  --queue DIR        queue directory for --backend host
  --timeout SECONDS  kill the command's whole process tree after this long (exit 124)
  --cwd DIR          working directory inside the workspace
  --env K=V          environment variable (repeatable; nothing else is inherited)
  --json             print one JSON object with the result and output
  --detach           print the request id and exit; collect with 'waffle wait ID'

Exit status: the command's; 124 timeout; 125 waffle error; 126 cannot execute;
127 not found; 128+n killed by signal n; 130 cancelled (Ctrl-C)
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
    timeout: { type: "string" },
    cwd: { type: "string" },
    env: { type: "string", multiple: true },
    json: { type: "boolean" },
    detach: { type: "boolean" },
  });
  if (parsed.positionals.length === 0) {
    throw new UsageError("Missing command: use 'waffle exec [options] -- CMD [ARG...]'");
  }
  const timeout = numberFlag(parsed, "timeout");
  const cwd = stringFlag(parsed, "cwd");
  const env = envFlags((parsed.values.env as string[] | undefined) ?? []);
  const stdin = io.stdin === null ? undefined : await readCapped(io.stdin);
  const backend = openBackend(parsed);
  try {
    const id = await backend.submit({
      argv: parsed.positionals,
      ...(cwd === undefined ? {} : { cwd }),
      ...(Object.keys(env).length === 0 ? {} : { env }),
      ...(stdin === undefined ? {} : { stdin }),
      ...(timeout === undefined ? {} : { timeoutMs: Math.round(timeout * 1000) }),
    });
    if (parsed.values.detach) {
      await io.stdout(`${id}\n`);
      return 0;
    }
    return await follow(backend, id, { io, json: parsed.values.json === true });
  } finally {
    backend.close();
  }
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
    backend.queue.state(id); // fails fast on an unknown id
    return await follow(backend, id, { io, json: parsed.values.json === true });
  } finally {
    backend.close();
  }
}

// Streams (or collects for --json) until the result is in; Ctrl-C cancels.
async function follow(
  backend: Backend,
  id: string,
  options: { io: CliIo; json: boolean },
): Promise<number> {
  const { io, queue } = { io: options.io, queue: backend.queue };
  let interrupts = 0;
  const onInterrupt = (): void => {
    interrupts++;
    if (interrupts === 1) {
      void queue.cancel(id).catch(() => {});
    } else {
      Deno.exit(EXIT_CANCELLED);
    }
  };
  Deno.addSignalListener("SIGINT", onInterrupt);
  try {
    const wait = { revive: () => backend.ensure() };
    let collected;
    if (options.json) {
      collected = await queue.collect(id, wait);
      await io.stdout(`${JSON.stringify(jsonOf(id, collected))}\n`);
    } else {
      const stream = queue.output(id, wait);
      let next = await stream.next();
      while (!next.done) {
        await (next.value.stream === "stdout" ? io.stdout : io.stderr)(next.value.data);
        next = await stream.next();
      }
      collected = { result: next.value };
    }
    const note = noteOf(id, collected.result);
    if (note !== undefined) await io.stderr(`${note}\n`);
    await queue.ack(id);
    await queue.gc().catch(() => 0);
    return exitStatusOf(collected.result);
  } finally {
    Deno.removeSignalListener("SIGINT", onInterrupt);
  }
}

async function readCapped(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  let size = 0;
  for await (const part of stream) {
    size += part.byteLength;
    if (size > MAX_STDIN_BYTES) {
      throw new UsageError(`Stdin exceeds the ${MAX_STDIN_BYTES}-byte limit`);
    }
    parts.push(part);
  }
  return concat(parts);
}
