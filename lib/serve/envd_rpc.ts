/**
 * envd's `process.Process` service for one sandbox, over the Connect
 * protocol (JSON, as E2B's SDKs speak it), on {@linkcode ProcessTable}.
 * Commands run as the sandbox's unprivileged uid whatever user the SDK
 * names; `root` is refused with `permission_denied`.
 *
 * @module
 */
import { Code, ConnectError, type HandlerContext, type Interceptor } from "@connectrpc/connect";
import type { DescMessage, MessageInitShape } from "@bufbuild/protobuf";
import { type ConnectFetchHandler, connectHandler } from "./connect.ts";
import {
  type ConnectResponseSchema,
  type ListResponseSchema,
  Process,
  type ProcessEventSchema,
  type StartResponseSchema,
} from "./gen/process/process_pb.ts";
import type { ProcessEntry, ProcessEvent, ProcessTable } from "./processes.ts";
import type { TtySize } from "../queue/protocol.ts";
import { SandboxPausedError, UsageError } from "../errors.ts";
import { registerFilesystem } from "./envd_fs.ts";
import { type EnvdContext, refuseRoot } from "./envd_context.ts";

export type { EnvdContext } from "./envd_context.ts";

/** How many bytes of events one stream holds before the process's output waits. */
const STREAM_BUFFER_BYTES = 1024 * 1024;
/** Keepalive interval when the client names none (`Keepalive-Ping-Interval`, seconds). */
const DEFAULT_KEEPALIVE_S = 90;

type Shape<T extends DescMessage> = MessageInitShape<T>;
type Event = Shape<typeof ProcessEventSchema>;
type Empty = Record<never, never>;

/**
 * The Connect routes of one sandbox's envd.
 *
 * @param context The sandbox's processes, record and kill signal.
 * @returns The handler (undefined for a path it does not serve).
 */
export function envdServices(context: EnvdContext): ConnectFetchHandler {
  const { table } = context;
  return connectHandler((router) => {
    router.service(Process, {
      async *start(request, handler): AsyncGenerator<Shape<typeof StartResponseSchema>> {
        refuseRoot(handler);
        const config = request.process;
        if (config === undefined) throw new ConnectError("No process", Code.InvalidArgument);
        const pty = request.pty === undefined ? undefined : ptySize(request.pty.size);
        const events = new EventStream(handler, context.killed);
        const listener = (event: ProcessEvent): Promise<void> | undefined => events.push(event);
        let entry: ProcessEntry;
        try {
          entry = await table.start(
            { cmd: config.cmd, args: config.args, envs: config.envs, cwd: config.cwd },
            {
              tag: request.tag,
              stdin: request.stdin ?? true,
              pty,
              timeoutMs: handler.timeoutMs(),
              sandboxEnv: context.record.envVars,
              onEvent: listener,
            },
          );
        } catch (cause) {
          throw new ConnectError(
            cause instanceof Error ? cause.message : String(cause),
            // Paused between the check of the call and the start.
            cause instanceof SandboxPausedError ? Code.FailedPrecondition : Code.InvalidArgument,
          );
        }
        try {
          for await (const event of events.drain()) yield { event };
        } finally {
          entry.listeners.delete(listener);
        }
      },
      async *connect(request, handler): AsyncGenerator<Shape<typeof ConnectResponseSchema>> {
        refuseRoot(handler);
        const entry = find(table, request.process?.selector);
        const events = new EventStream(handler, context.killed);
        const listener = (event: ProcessEvent): Promise<void> | undefined => events.push(event);
        // Added and started in one turn: no output falls between them.
        entry.listeners.add(listener);
        events.push({ kind: "start", pid: entry.pid });
        try {
          for await (const event of events.drain()) yield { event };
        } finally {
          entry.listeners.delete(listener);
        }
      },
      list(): Shape<typeof ListResponseSchema> {
        return {
          processes: table.list().map((entry) => ({
            pid: entry.pid,
            ...(entry.tag === undefined ? {} : { tag: entry.tag }),
            config: {
              cmd: entry.config.cmd,
              args: entry.config.args,
              envs: entry.config.envs,
              ...(entry.config.cwd === undefined ? {} : { cwd: entry.config.cwd }),
            },
          })),
        };
      },
      async sendInput(request, handler): Promise<Empty> {
        refuseRoot(handler);
        const entry = find(table, request.process?.selector);
        // Keys for a terminal and stdin for a pipe go the same way: the process's input.
        const input = request.input?.input;
        if (input?.case !== "stdin" && input?.case !== "pty") {
          throw new ConnectError("No input", Code.InvalidArgument);
        }
        if (entry.stdin === undefined) {
          throw new ConnectError(
            `Process '${entry.pid}' has no open stdin`,
            Code.FailedPrecondition,
          );
        }
        await entry.stdin.write(input.value);
        return {};
      },
      async closeStdin(request, handler): Promise<Empty> {
        refuseRoot(handler);
        const entry = find(table, request.process?.selector);
        const stdin = entry.stdin;
        entry.stdin = undefined;
        await stdin?.close().catch(() => {});
        return {};
      },
      async sendSignal(request, handler): Promise<Empty> {
        refuseRoot(handler);
        const entry = find(table, request.process?.selector);
        // SIGTERM and SIGKILL alike end the process's whole tree.
        await entry.process.kill();
        return {};
      },
      async update(request, handler): Promise<Empty> {
        refuseRoot(handler);
        const entry = find(table, request.process?.selector);
        if (request.pty === undefined) return {};
        if (!entry.pty) {
          throw new ConnectError(
            `Process '${entry.pid}' has no terminal to resize`,
            Code.FailedPrecondition,
          );
        }
        try {
          await entry.process.resize(ptySize(request.pty.size));
        } catch (cause) {
          if (!(cause instanceof UsageError)) throw cause;
          throw new ConnectError(cause.message, Code.InvalidArgument);
        }
        return {};
      },
      streamInput(): never {
        throw new ConnectError("StreamInput is not supported", Code.Unimplemented);
      },
    });
    registerFilesystem(router, context);
  }, {
    maxBodyBytes: context.maxBodyBytes,
    interceptors: [refusePaused(context), ...(context.interceptors ?? [])],
  });
}

// Every call to a paused sandbox fails at once (failed_precondition), before
// its handler runs: nothing is queued to run after the resume.
function refusePaused(context: EnvdContext): Interceptor {
  return (next) => (request) => {
    const why = context.paused?.();
    if (why !== undefined) throw new ConnectError(why, Code.FailedPrecondition);
    return next(request);
  };
}

// A terminal size from the request (the library checks its range).
function ptySize(size: { cols: number; rows: number } | undefined): TtySize {
  if (size === undefined) throw new ConnectError("No terminal size", Code.InvalidArgument);
  return { rows: size.rows, cols: size.cols };
}

function find(
  table: ProcessTable,
  selector: { case: "pid"; value: number } | { case: "tag"; value: string } | {
    case: undefined;
    value?: undefined;
  } | undefined,
): ProcessEntry {
  const entry = selector?.case === "pid"
    ? table.find({ pid: selector.value })
    : selector?.case === "tag"
    ? table.find({ tag: selector.value })
    : undefined;
  if (entry === undefined) {
    throw new ConnectError(`Process '${selector?.value ?? ""}' not found`, Code.NotFound);
  }
  return entry;
}

/**
 * A process's events on their way to one response stream: held up to
 * {@linkcode STREAM_BUFFER_BYTES}, with a keepalive while idle, ending at the
 * process's end, the client's going away or the sandbox's kill.
 */
class EventStream {
  readonly #queue: Event[] = [];
  #bytes = 0;
  #wake: (() => void) | undefined;
  #done = false;
  readonly #handler: HandlerContext;
  readonly #killed: AbortSignal;

  constructor(handler: HandlerContext, killed: AbortSignal) {
    this.#handler = handler;
    this.#killed = killed;
  }

  /** Queues an event; resolves once there is room again (the process's output waits). */
  push(event: ProcessEvent): Promise<void> | undefined {
    if (this.#done || this.#handler.signal.aborted || this.#killed.aborted) return undefined;
    this.#queue.push(toMessage(event));
    if (event.kind === "data") this.#bytes += event.data.byteLength;
    if (event.kind === "end") this.#done = true;
    this.#wake?.();
    if (this.#bytes < STREAM_BUFFER_BYTES) return undefined;
    return new Promise((resolve) => this.#room.push(resolve));
  }

  readonly #room: (() => void)[] = [];

  #roomMade(): void {
    if (this.#bytes >= STREAM_BUFFER_BYTES && !this.#handler.signal.aborted) return;
    for (const resolve of this.#room.splice(0)) resolve();
  }

  async *drain(): AsyncGenerator<Event> {
    const keepaliveS = Number(this.#handler.requestHeader.get("keepalive-ping-interval")) ||
      DEFAULT_KEEPALIVE_S;
    const stop = AbortSignal.any([this.#handler.signal, this.#killed]);
    while (true) {
      while (this.#queue.length > 0) {
        const event = this.#queue.shift()!;
        const data = event.event;
        if (data?.case === "data" && data.value.output?.case !== undefined) {
          this.#bytes -= (data.value.output.value as Uint8Array).byteLength;
        }
        this.#roomMade();
        yield event;
        if (data?.case === "end") return;
      }
      if (stop.aborted) {
        // Nobody reads on: the process's output must not wait for this stream.
        this.#done = true;
        for (const resolve of this.#room.splice(0)) resolve();
        if (this.#killed.aborted) {
          throw new ConnectError("The sandbox was killed", Code.Unavailable);
        }
        return;
      }
      const idle = await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(true), keepaliveS * 1000);
        const wake = (): void => {
          clearTimeout(timer);
          stop.removeEventListener("abort", wake);
          this.#wake = undefined;
          resolve(false);
        };
        this.#wake = wake;
        stop.addEventListener("abort", wake, { once: true });
      });
      if (idle) yield { event: { case: "keepalive", value: {} } };
    }
  }
}

function toMessage(event: ProcessEvent): Event {
  switch (event.kind) {
    case "start":
      return { event: { case: "start", value: { pid: event.pid } } };
    case "data":
      return {
        event: { case: "data", value: { output: { case: event.stream, value: event.data } } },
      };
    case "end":
      return {
        event: {
          case: "end",
          value: {
            exitCode: event.exitCode,
            exited: event.exited,
            status: event.status,
            ...(event.error === undefined ? {} : { error: event.error }),
          },
        },
      };
  }
}
