/**
 * Every sandbox's envd behind one server: its plain routes (`/health`,
 * `/files`, their own auth), then, with the sandbox's access token, its
 * Connect services over a process table made once per live sandbox. A
 * killed sandbox's streams are cut; its processes are let go, never ended,
 * when it stops being live (a server stopping), and a server started again
 * takes them over.
 *
 * @module
 */
import { envdHttp, type EnvdTarget } from "./envd_http.ts";
import { envdServices } from "./envd_rpc.ts";
import type { ConnectFetchHandler } from "./connect.ts";
import { streamLimiter } from "./limits.ts";
import { ProcessTable } from "./processes.ts";
import { pausedMessage, type ServeSandboxes } from "./sandboxes.ts";
import { sameSecret } from "./secret.ts";
import type { ProcessStore, SandboxRecord } from "./state.ts";
import type { Interceptor } from "@connectrpc/connect";

/** Options of {@linkcode EnvdRouter}. */
export interface EnvdRouterOptions {
  /** The server's sandboxes. */
  sandboxes: ServeSandboxes;
  /** The journal of their processes. */
  processes: ProcessStore;
  /** Largest request body, in bytes. */
  maxBodyBytes: number;
  /** Streams the sandboxes of one key may hold open at once. */
  maxStreamsPerKey: number;
  /** Told how long each command this server started ran, start to exit, in seconds. */
  onCommandExit?: (tenant: string, seconds: number) => void;
}

/** One sandbox's envd: its process table and Connect services. */
interface Envd {
  table: ProcessTable;
  services: ConnectFetchHandler;
}

/** The envd of every sandbox of a server. */
export class EnvdRouter {
  readonly #options: EnvdRouterOptions;
  readonly #envds = new Map<string, Envd>();
  readonly #streamLimit: (keyId: string) => Interceptor;

  /** @param options The sandboxes, the processes' journal and the limits. */
  constructor(options: EnvdRouterOptions) {
    this.#options = options;
    this.#streamLimit = streamLimiter(options.maxStreamsPerKey);
  }

  /** Takes over the processes a previous server recorded (before the first request). */
  restore(): void {
    const { sandboxes, processes } = this.#options;
    for (const id of processes.withProcesses()) {
      const record = sandboxes.store.get(id);
      if (record !== undefined && record.state !== "creating") this.#envdOf(record).table.restore();
    }
  }

  /**
   * Answers one request for a sandbox's envd.
   *
   * @param request The request (its `Host` already checked).
   * @param record The sandbox it names.
   * @returns The response.
   */
  async respond(request: Request, record: SandboxRecord): Promise<Response> {
    const live = this.#options.sandboxes.live(record);
    return await answerEnvd(request, {
      sandbox: live.sandbox,
      accessToken: record.accessToken,
      paused: record.state === "paused" ? pausedMessage(record.id) : undefined,
      killed: live.killed.signal,
      services: () => this.#envdOf(record).services,
    });
  }

  // Made once per live sandbox; its processes are let go (never ended)
  // when it stops being live.
  #envdOf(record: SandboxRecord): Envd {
    const { sandboxes, processes, maxBodyBytes } = this.#options;
    const id = record.id;
    const live = sandboxes.live(record);
    const known = this.#envds.get(id);
    if (known !== undefined && !live.killed.signal.aborted) return known;
    const onCommandExit = this.#options.onCommandExit;
    const table = new ProcessTable(live.sandbox, processes.processes(id), {
      ...(onCommandExit === undefined
        ? {}
        : { onExit: (seconds: number) => onCommandExit(record.tenant, seconds) }),
    });
    const services = envdServices({
      table,
      record,
      killed: live.killed.signal,
      maxBodyBytes,
      sandbox: live.sandbox,
      interceptors: [this.#streamLimit(record.keyId)],
      paused: () => sandboxes.store.get(id)?.state === "paused" ? pausedMessage(id) : undefined,
    });
    const envd = { table, services };
    this.#envds.set(id, envd);
    live.killed.signal.addEventListener("abort", () => {
      table.detach();
      this.#envds.delete(id);
    }, { once: true });
    return envd;
  }
}

/** One sandbox's envd, as {@linkcode answerEnvd} answers it. */
export interface EnvdEndpoint extends EnvdTarget {
  /** Aborted when the sandbox is killed: its streams are cut. */
  killed: AbortSignal;
  /** Its Connect services (made on first use). */
  services: () => ConnectFetchHandler;
}

/**
 * Answers one request for one sandbox's envd: its plain routes (their own
 * auth), else, with its access token, its Connect services. A killed
 * sandbox's streams are cut, not ended: the SDK then asks /health, which
 * says the sandbox is gone.
 *
 * @param request The request.
 * @param endpoint The sandbox, its token, its services.
 * @returns The response.
 */
export async function answerEnvd(request: Request, endpoint: EnvdEndpoint): Promise<Response> {
  const plain = await envdHttp(request, endpoint);
  if (plain !== undefined) return plain;
  const token = request.headers.get("x-access-token");
  if (token === null || !sameSecret(token, endpoint.accessToken)) {
    return Response.json({ code: "unauthenticated", message: "Invalid access token" }, {
      status: 401,
    });
  }
  const answered = await endpoint.services()(request);
  if (
    answered?.body && answered.headers.get("content-type")?.startsWith("application/connect+")
  ) {
    return new Response(droppedOnKill(answered.body, endpoint.killed), answered);
  }
  return answered ?? noRoute(new URL(request.url).pathname);
}

/**
 * A stream's body that is cut, not ended, when its sandbox is killed: the
 * client sees its connection dropped mid-stream (as a killed E2B sandbox's
 * streams are), and the SDK's health probe then tells it the sandbox is gone.
 *
 * @param body The stream's envelopes.
 * @param killed Aborted when the sandbox is killed.
 * @returns The same bytes until the kill.
 */
function droppedOnKill(
  body: ReadableStream<Uint8Array>,
  killed: AbortSignal,
): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let drop = (): void => {};
  return new ReadableStream<Uint8Array>({
    start(controller): void {
      drop = () => {
        controller.error(new Error("The sandbox was killed"));
        reader.cancel().catch(() => {});
      };
      if (killed.aborted) drop();
      else killed.addEventListener("abort", drop, { once: true });
    },
    async pull(controller): Promise<void> {
      const next = await reader.read().catch((cause) => ({ done: true, cause } as const));
      // Killed while reading: the stream is already errored, nothing more goes out.
      if (killed.aborted) return;
      if (!next.done) {
        controller.enqueue(next.value);
        return;
      }
      killed.removeEventListener("abort", drop);
      if ("cause" in next) controller.error(next.cause);
      else controller.close();
    },
    cancel(reason): Promise<void> {
      killed.removeEventListener("abort", drop);
      return reader.cancel(reason);
    },
  });
}

function noRoute(path: string): Response {
  return Response.json({ code: "unimplemented", message: `No route '${path}'` }, { status: 404 });
}
