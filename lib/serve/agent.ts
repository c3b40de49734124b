/**
 * `waffle agent`: the host side of one sandbox inside its Kubernetes pod
 * (`[backend] kind = "kubernetes"`). It holds the queue the runner container
 * serves and answers that sandbox's envd (the same services `waffle serve`
 * answers for a sandbox of its own host) to the server that routes the
 * sandbox's traffic here.
 *
 * The agent shares the pod's network with the runner, so a command can
 * reach its port: every request, loopback included, must carry a proof of
 * the agent token the server holds (`x-waffle-agent-token`, see
 * `agent_proof.ts`: the token itself is never sent, since a command may
 * hold the port while the agent is down), and then, as envd asks, the
 * sandbox's access token. Both tokens come from the sandbox's Secret,
 * mounted into the agent's container only.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { type HttpLimits, serveHttp } from "../http/mod.ts";
import { AGENT_RECYCLE_HEADER, AGENT_TOKEN_HEADER } from "../k8s/sandbox_object.ts";
import type { EnvdSandbox } from "./envd_context.ts";
import { error } from "./envd_http.ts";
import { AgentProofs } from "./agent_proof.ts";
import { answerEnvd } from "./envd_answer.ts";
import { envdServices } from "./envd_rpc.ts";
import { streamLimiter } from "./limits.ts";
import { ProcessTable } from "./processes.ts";
import { ProcessStore, type SandboxRecord } from "./state.ts";
import type { ConnectFetchHandler } from "./connect.ts";

/** What one agent serves. */
export interface AgentOptions {
  /** The pod's sandbox. */
  sandbox: EnvdSandbox;
  /** Its id, access token and variables (the rest of a server's record is the server's). */
  record: Pick<SandboxRecord, "id" | "accessToken" | "envVars">;
  /** What the server sends on every request. */
  agentToken: string;
  /** The agent's own database (its processes' journal), opened with `survives: "process-death"`. */
  journal: DatabaseSync;
  /** Address to listen on. */
  hostname: string;
  /** Port (0: any free one). */
  port: number;
  /** Largest request body, in bytes. */
  maxBodyBytes: number;
  /** Streams open at once. */
  maxStreams: number;
  /** The listener's caps (absent: `lib/http`'s defaults). */
  connectionLimits?: Partial<HttpLimits> | undefined;
  /** Stops the agent. */
  signal?: AbortSignal;
  /** Why this pod cannot serve the queue any more (see `PodSandbox.damaged`), or undefined. */
  damaged?: () => string | undefined;
}

/** A running agent. */
export interface RunningAgent {
  /** Where it listens. */
  address: { hostname: string; port: number };
  /** Resolves when it has stopped. */
  finished: Promise<void>;
}

/**
 * Starts the agent's listener.
 *
 * @param options The sandbox, its tokens and where to listen.
 * @returns The running agent.
 */
export async function startAgent(options: AgentOptions): Promise<RunningAgent> {
  const record: SandboxRecord = {
    ...options.record,
    tenant: "",
    keyId: "",
    template: "",
    image: "",
    metadata: {},
    startedAt: 0,
    endAt: 0,
    state: "running",
  };
  const table = new ProcessTable(
    options.sandbox,
    new ProcessStore(options.journal).processes(record.id),
  );
  // A killed sandbox is a deleted pod: nothing here is ever killed.
  const killed = new AbortController().signal;
  let services: ConnectFetchHandler | undefined;
  const endpoint = {
    sandbox: options.sandbox,
    accessToken: record.accessToken,
    killed,
    services: () =>
      services ??= envdServices({
        table,
        record,
        killed,
        maxBodyBytes: options.maxBodyBytes,
        sandbox: options.sandbox,
        interceptors: [streamLimiter(options.maxStreams)("agent")],
      }),
  };
  // Processes an agent before this one started (a restarted agent container) go on.
  table.restore();
  const proofs = new AgentProofs(options.agentToken, record.id);
  const server = await serveHttp(async (request) => {
    const url = new URL(request.url);
    const answer = proofs.accept(request.headers.get(AGENT_TOKEN_HEADER), {
      method: request.method,
      target: `${url.pathname}${url.search}`,
    });
    if (answer === undefined) return error(401, "Invalid agent token");
    const length = Number(request.headers.get("content-length") ?? 0);
    const response = length > options.maxBodyBytes && url.pathname !== "/files"
      ? error(413, `Request body of ${length} bytes is over the limit of ${options.maxBodyBytes}`)
      : await answerEnvd(request, endpoint);
    // The server passes on only an answer that proves the token.
    const headers = new Headers(response.headers);
    headers.set(AGENT_TOKEN_HEADER, answer);
    // And replaces a pod that says it cannot serve its queue (its claims kept).
    const damage = options.damaged?.();
    if (damage !== undefined) {
      headers.set(AGENT_RECYCLE_HEADER, damage.replaceAll(/[\r\n]+/g, " ").slice(0, 300));
    }
    return new Response(response.body, {
      status: response.status,
      statusText: response.statusText,
      headers,
    });
  }, {
    hostname: options.hostname,
    port: options.port,
    tls: undefined,
    limits: options.connectionLimits,
    onError: () => error(500, "Internal server error"),
  });
  const { promise: finished, resolve } = Promise.withResolvers<void>();
  const stop = (): void => {
    table.detach();
    void server.shutdown().finally(resolve);
  };
  if (options.signal?.aborted) stop();
  options.signal?.addEventListener("abort", stop, { once: true });
  return { address: { hostname: server.addr.hostname, port: server.addr.port }, finished };
}
