/**
 * `waffle serve`'s one listener: E2B's control API and, for each sandbox,
 * envd (routed by the `E2b-Sandbox-Id` header the SDKs send when
 * `E2B_SANDBOX_URL` points here, or by the host name `49983-<id>.<domain>`).
 * Every request's `Host` (and `Origin`, when sent) must name this server:
 * a page on another site that rebinds its DNS name to this address is
 * refused before anything runs. The listener is `lib/http`'s (the one owner
 * of waffle's HTTP listeners): its connection caps and deadlines bound what
 * an unauthenticated peer can hold.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import type { DockerClient } from "../docker/mod.ts";
import { type AuditEntry, type Caller, controlApp, type ControlDeps } from "./control.ts";
import { UsageError } from "../errors.ts";
import type { KubeApi } from "../k8s/client.ts";
import type { SandboxLimits } from "../k8s/sandbox_object.ts";
import type { KubernetesBackendSettings } from "../config/serve_schema.ts";
import { error, signedFilesSandbox } from "./envd_http.ts";
import { EnvdRouter } from "./envd_router.ts";
import { ServeSnapshots } from "./snapshots.ts";
import { type SandboxFleet, ServeSandboxes } from "./sandboxes.ts";
import { keepPools, type PoolTarget } from "../sandbox/pool_fill.ts";
import { readyMembers } from "../lifecycle/pool.ts";
import { ProcessStore, type SandboxRecord, SandboxStore } from "./state.ts";
import { TenantLimits } from "./limits.ts";
import type { TenantLimitSettings } from "../config/serve_schema.ts";
import type { EgressGrant } from "./network.ts";
import { type HttpLimits, serveHttp } from "../http/mod.ts";
import { ServerMetrics } from "./observe.ts";
import { CommandLog } from "./command_log.ts";
import { consoleApi, type ConsoleApiDeps } from "./console_api.ts";
import { answerConsole } from "./console_route.ts";

/** Options of {@linkcode startServer}. */
export interface ServerOptions {
  /** The waffle home the sandboxes live in. */
  home: string;
  /** The server's database (keys and sandboxes). */
  db: DatabaseSync;
  /** Another connection to it, opened with `survives: "process-death"`: the processes' journal. */
  journal: DatabaseSync;
  /** The Docker client (not with `kubernetes`). */
  docker?: DockerClient | undefined;
  /** Sandboxes on a Kubernetes cluster instead of this host's Docker. */
  kubernetes?: KubeServerOptions | undefined;
  /** Address and port to listen on (port 0: any free one). */
  hostname: string;
  /** The port. */
  port: number;
  /** The domain for host-name routing (`49983-<id>.<domain>`), if any. */
  domain?: string | undefined;
  /** Verifies an API key. */
  verifyKey: (key: string) => Caller | undefined;
  /** A tenant's limits (`tenantLimitsOf` over the config's `serve`). */
  limitsOf: (tenant: string) => TenantLimitSettings;
  /** The image a template names. */
  templateImage: (template: string) => string | undefined;
  /** Default and maximum sandbox timeouts, in seconds. */
  timeouts: { defaultS: number; maxS: number };
  /** Limits reported by `getInfo`. */
  resources: { cpuCount: number; memoryMB: number; diskSizeMB: number };
  /** Largest request body, in bytes. */
  maxBodyBytes: number;
  /** What the config lets every sandbox reach (see `ControlDeps.grant`). */
  grant: EgressGrant;
  /** The config file the server read, for its sandboxes (absent: the home's). */
  configPath?: string | undefined;
  /** The warm pools to keep filled (`[templates.<name>] warm`). */
  pools?: readonly PoolTarget[] | undefined;
  /** Streams (commands, re-attaches, watches) the sandboxes of one key may hold open at once. */
  maxStreamsPerKey: number;
  /** Records each API call. */
  audit?: (entry: AuditEntry) => void;
  /** TLS certificate and key (PEM), for a non-loopback address. */
  tls?: { cert: string; key: string } | undefined;
  /** The listener's connection caps and deadlines (each absent: `lib/http`'s default). */
  connectionLimits?: Partial<HttpLimits> | undefined;
  /** One line when connections are refused at a cap or accepting fails (at most one a minute of each). */
  onEvent?: ((line: string) => void) | undefined;
  /** Stops the server. */
  signal?: AbortSignal;
  /** Called once listening, with the address. */
  onListen?: (address: { hostname: string; port: number }) => void;
  /** How often each sandbox's costs are sampled for E2B's metrics, in ms (tests). */
  metricsIntervalMs?: number | undefined;
}

/** The sandboxes of a server and what serves them, by backend. */
interface Fleet {
  sandboxes: SandboxFleet;
  envd: { respond(request: Request, record: SandboxRecord): Promise<Response>; restore(): void };
  /** What the control API reports of costs (Docker only). */
  observed: Pick<ControlDeps, "metrics" | "prometheus">;
  /** What the console's API reads beyond the sandboxes. */
  console: Pick<ConsoleApiDeps, "backend" | "commands" | "containers">;
  start(): void;
  stop(): Promise<void>;
}

// This host's Docker: sandboxes recorded in serve.db, warm pools, costs.
function dockerFleet(options: ServerOptions): Fleet {
  const docker = options.docker;
  if (docker === undefined) throw new UsageError("A Docker server needs a Docker client");
  const pools = options.pools === undefined || options.pools.length === 0
    ? undefined
    : keepPools(options.home, options.pools, {
      configPath: options.configPath,
      docker,
      onError: options.onEvent,
    });
  const metrics = new ServerMetrics({
    home: options.home,
    resources: options.resources,
    // The pools' sizes as their markers say (`GET /metrics`).
    poolSizes: () =>
      (options.pools ?? []).map(({ template, warm }) => ({
        template,
        ready: readyMembers(options.home, template).length,
        cap: warm,
      })),
    intervalMs: options.metricsIntervalMs,
  });
  const commands = new CommandLog();
  const sandboxes = new ServeSandboxes(new SandboxStore(options.db), {
    home: options.home,
    docker,
    configPath: options.configPath,
    // A take is refilled at once, not at the next round.
    ...(pools === undefined ? {} : { onTaken: () => pools.poke() }),
    onCreated: (tenant, seconds) => metrics.create.observe(tenant, seconds),
    snapshots: new ServeSnapshots(options.db, options.home),
    onRemoved: (id) => commands.forget(id),
  });
  const envd = new EnvdRouter({
    sandboxes,
    processes: new ProcessStore(options.journal),
    maxBodyBytes: options.maxBodyBytes,
    maxStreamsPerKey: options.maxStreamsPerKey,
    onCommandExit: (tenant, seconds) => metrics.command.observe(tenant, seconds),
    commands,
  });
  const ring = metrics.attach(sandboxes);
  return {
    sandboxes,
    envd,
    observed: { metrics: ring, prometheus: (scope) => metrics.prometheus(scope) },
    console: {
      backend: "docker",
      commands,
      containers: {
        stop: (record) => sandboxes.stop(record),
        running: (record) => sandboxes.running(record),
        pooledFrom: (id) => sandboxes.pooledFrom(id),
        queue: (record) => sandboxes.live(record).sandbox.queue,
      },
    },
    start: () => metrics.start(),
    stop: async () => {
      metrics.stop();
      await pools?.stop();
    },
  };
}

// A Kubernetes cluster: sandboxes are its objects, envd their agents'.
async function kubeFleet(options: ServerOptions, kube: KubeServerOptions): Promise<Fleet> {
  const { KubeSandboxes } = await import("./kube_sandboxes.ts");
  const { KubeEnvd } = await import("./kube_envd.ts");
  const sandboxes = new KubeSandboxes({
    api: kube.api,
    settings: kube.settings,
    limits: kube.limits,
    ...(options.onEvent === undefined ? {} : { onEvent: options.onEvent }),
  });
  await sandboxes.start();
  return {
    sandboxes,
    envd: new KubeEnvd(sandboxes),
    observed: {},
    console: { backend: "kubernetes" },
    start: () => {},
    stop: () => Promise.resolve(),
  };
}

/** A server whose sandboxes are a Kubernetes cluster's (`[backend] kind = "kubernetes"`). */
export interface KubeServerOptions {
  /** The API. */
  api: KubeApi;
  /** `[backend]`. */
  settings: KubernetesBackendSettings;
  /** Every sandbox's limits. */
  limits: SandboxLimits;
}

/** A running server. */
export interface RunningServer {
  /** Where it listens. */
  address: { hostname: string; port: number };
  /** The sandboxes it serves. */
  sandboxes: SandboxFleet;
  /** Resolves when it has stopped. */
  finished: Promise<void>;
  /** Stops it (sandboxes keep running; a restarted server serves them). */
  shutdown(): Promise<void>;
}

/**
 * Starts the server.
 *
 * @param options Where, who may call, and the limits.
 * @returns The running server, listening.
 * @throws {WaffleError} When it cannot listen (or the TLS certificate or key is not valid).
 */
export async function startServer(options: ServerOptions): Promise<RunningServer> {
  const fleet = options.kubernetes === undefined
    ? dockerFleet(options)
    : await kubeFleet(options, options.kubernetes);
  const { sandboxes, envd } = fleet;
  const store = sandboxes.store;
  // Counted from the record, creates under way included: two creates at once
  // cannot both take a tenant's last place.
  const limits = new TenantLimits({
    limitsOf: options.limitsOf,
    sandboxCount: (tenant) => store.count(tenant),
  });
  const control = controlApp({
    sandboxes,
    verifyKey: options.verifyKey,
    admitCreate: (tenant) => limits.admitCreate(tenant),
    templateImage: options.templateImage,
    defaultTimeoutS: options.timeouts.defaultS,
    maxTimeoutS: options.timeouts.maxS,
    resources: options.resources,
    maxBodyBytes: options.maxBodyBytes,
    grant: options.grant,
    ...(options.audit === undefined ? {} : { audit: options.audit }),
    ...fleet.observed,
  });
  // waffle's own API for the console, behind the same key check.
  control.route(
    "/waffle/v1",
    consoleApi({
      sandboxes,
      home: options.home,
      grant: options.grant,
      metrics: fleet.observed.metrics,
      ...fleet.console,
    }),
  );
  let port = options.port;
  const handler = async (request: Request): Promise<Response> => {
    const refused = checkHost(request, {
      hostname: options.hostname,
      port,
      domain: options.domain,
    });
    if (refused !== undefined) return refused;
    // The console's page and assets: public (every datum comes from the API, with the key).
    const path = new URL(request.url).pathname;
    if (path === "/ui" || path.startsWith("/ui/")) return await answerConsole(request);
    // A file upload streams into the sandbox (its quota bounds it); every
    // other body is read whole, so it is capped.
    const length = Number(request.headers.get("content-length") ?? 0);
    if (length > options.maxBodyBytes && new URL(request.url).pathname !== "/files") {
      return error(
        413,
        `Request body of ${length} bytes is over the limit of ${options.maxBodyBytes}`,
      );
    }
    const id = sandboxIdOf(request, options.domain) ??
      signedFilesSandbox(
        request,
        () => store.list().filter((record) => record.state !== "creating"),
      );
    if (id === undefined) return await control.fetch(request);
    const record = store.get(id);
    // A sandbox being killed is already gone for envd (its /health is 502).
    if (record === undefined || record.state === "creating" || sandboxes.removing(id)) {
      return Response.json({ message: "The sandbox was not found", sandboxId: id, code: 502 }, {
        status: 502,
      });
    }
    const response = await envd.respond(request, record);
    options.audit?.({
      key: record.keyId,
      tenant: record.tenant,
      sandbox: id,
      method: `${request.method} ${new URL(request.url).pathname}`,
      status: response.status,
    });
    return response;
  };
  const server = await serveHttp(handler, {
    hostname: options.hostname,
    port: options.port,
    tls: options.tls,
    limits: options.connectionLimits,
    onEvent: options.onEvent,
    onError: () => error(500, "Internal server error"),
  });
  port = server.addr.port;
  sandboxes.startReaper();
  fleet.start();
  // Processes a previous server left running go on under this one.
  envd.restore();
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= server.shutdown().finally(async () => {
      sandboxes.close();
      await fleet.stop();
    });
    return stopping;
  };
  const { promise: finished, resolve: finish } = Promise.withResolvers<void>();
  if (options.signal?.aborted) void stop().finally(finish);
  options.signal?.addEventListener("abort", () => void stop().finally(finish), { once: true });
  const address = { hostname: server.addr.hostname, port: server.addr.port };
  options.onListen?.(address);
  return {
    address,
    sandboxes,
    finished,
    shutdown: async () => {
      await stop().finally(finish);
      await finished;
    },
  };
}

const ENVD_HOST = /^49983-([a-z0-9]+)\.(.+)$/;

// The sandbox a request is for: the SDK's header, else the envd host name.
function sandboxIdOf(request: Request, domain: string | undefined): string | undefined {
  const header = request.headers.get("e2b-sandbox-id");
  if (header !== null) return header;
  if (domain === undefined) return undefined;
  const host = (request.headers.get("host") ?? "").replace(/:\d+$/, "");
  const match = ENVD_HOST.exec(host);
  return match !== null && match[2] === domain ? match[1] : undefined;
}

// DNS rebinding: a browser sends the attacker's name as Host, and its own
// origin as Origin; only this server's own names pass.
function checkHost(
  request: Request,
  own: { hostname: string; port: number; domain: string | undefined },
): Response | undefined {
  const allowed = (host: string): boolean => {
    const name = host.replace(/:\d+$/, "").replace(/^\[|\]$/g, "").toLowerCase();
    const port = /:(\d+)$/.exec(host)?.[1];
    if (own.domain !== undefined && (name === own.domain || name.endsWith(`.${own.domain}`))) {
      return true;
    }
    const local = ["127.0.0.1", "localhost", "::1", own.hostname.toLowerCase()];
    return local.includes(name) && port === String(own.port);
  };
  const host = request.headers.get("host") ?? new URL(request.url).host;
  if (!allowed(host)) return error(403, `Host '${host.slice(0, 200)}' is not this server`);
  const origin = request.headers.get("origin");
  if (origin !== null && origin !== "null") {
    let originHost: string;
    try {
      originHost = new URL(origin).host;
    } catch {
      return error(403, `Origin '${origin.slice(0, 200)}' is not this server`);
    }
    if (!allowed(originHost)) {
      return error(403, `Origin '${origin.slice(0, 200)}' is not this server`);
    }
  }
  return undefined;
}
