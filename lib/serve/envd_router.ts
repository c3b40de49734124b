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
import { answerEnvd } from "./envd_answer.ts";
import { envdServices } from "./envd_rpc.ts";
import type { ConnectFetchHandler } from "./connect.ts";
import { streamLimiter } from "./limits.ts";
import { ProcessTable } from "./processes.ts";
import { pausedMessage, type ServeSandboxes } from "./sandboxes.ts";
import type { ProcessStore, SandboxRecord } from "./state.ts";
import type { Interceptor } from "@connectrpc/connect";
import type { CommandLog } from "./command_log.ts";

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
  /** Records every command for the console (`command_log.ts`). */
  commands?: CommandLog;
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
    const { onCommandExit, commands } = this.#options;
    const table = new ProcessTable(live.sandbox, processes.processes(id), {
      ...(onCommandExit === undefined
        ? {}
        : { onExit: (seconds: number) => onCommandExit(record.tenant, seconds) }),
      ...(commands === undefined ? {} : { watch: (process) => commands.watch(id, process) }),
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
