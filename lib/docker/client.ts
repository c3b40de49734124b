/**
 * A small, typed Docker Engine API client over `docker-modem`. waffle never
 * shells out to the docker CLI: everything goes through this class.
 *
 * Every failure becomes a one-line {@linkcode DockerError} (exit code `EXIT_WAFFLE`)
 * carrying the HTTP status when the daemon answered; 404 and 409 use the
 * {@linkcode DockerNotFoundError} and {@linkcode DockerConflictError}
 * subclasses. Every request has a timeout, so a stalled daemon cannot hang a
 * caller forever.
 *
 * @example
 * ```ts
 * const docker = new DockerClient();
 * await docker.ping();
 * const id = await docker.createContainer("waffle-demo", { Image: "waffle-runner:latest", Cmd: ["sleep", "60"] });
 * await docker.startContainer(id);
 * const { exitCode, stdout } = await docker.exec(id, ["echo", "hi"]);
 * await docker.removeContainer(id, { force: true });
 * ```
 *
 * @module
 */
import type * as z from "../schema.ts";
import {
  describeDockerEndpoint,
  type DockerEndpoint,
  dockerHostEnv,
  parseDockerHost,
} from "./endpoint.ts";
import { DockerError } from "../errors.ts";
import { DockerConflictError, DockerNotFoundError } from "./errors.ts";
import { concat } from "../bytes.ts";
import { demuxDockerStream } from "./stream.ts";
import { quickRequest } from "./quick_get.ts";
import {
  type ContainerCreateBody,
  type ContainerInspect,
  containerInspectSchema,
  containerListSchema,
  type ContainerStats,
  type ContainerSummary,
  type ContainerTop,
  createResponseSchema,
  type DockerInfo,
  type DockerVersion,
  type DockerVolume,
  execCreateSchema,
  execInspectSchema,
  type ExecResult,
  imageInspectSchema,
  type ImageSummary,
  infoSchema,
  statsSchema,
  topSchema,
  versionSchema,
  volumeListSchema,
  volumeSchema,
  waitResponseSchema,
} from "./types.ts";

/** Default per-request timeout in milliseconds. */
export const DEFAULT_DOCKER_TIMEOUT_MS = 30_000;

/** Options of {@linkcode DockerClient}. */
export interface DockerClientOptions {
  /**
   * `unix:///path/docker.sock`, a bare socket path, `tcp://host:port`,
   * `http://host:port` or `https://host:port`. Defaults to `$DOCKER_HOST`,
   * then `unix:///var/run/docker.sock`.
   */
  host?: string;
  /** Per-request timeout in milliseconds (default 30 000). */
  timeoutMs?: number;
  /** Pin an API version such as `1.41`; default: the daemon's own. */
  apiVersion?: string;
}

/** Per-call options every method accepts. */
export interface RequestOptions {
  /**
   * Timeout in milliseconds for this call; defaults to the client's.
   * `Infinity` disables it (only sensible for {@linkcode DockerClient.waitContainer}).
   */
  timeoutMs?: number;
}

/** Options of {@linkcode DockerClient.stopContainer}. */
export interface StopOptions extends RequestOptions {
  /** Seconds between the stop signal and SIGKILL; default: the container's StopTimeout (10). */
  timeoutSeconds?: number;
}

/** Options of {@linkcode DockerClient.killContainer}. */
export interface KillOptions extends RequestOptions {
  /** Signal name or number, default `SIGKILL`. */
  signal?: string;
}

/** Options of {@linkcode DockerClient.removeContainer}. */
export interface RemoveOptions extends RequestOptions {
  /** Kill a running container first. */
  force?: boolean;
  /**
   * Also remove its anonymous volumes (an image's `VOLUME` that no mount
   * covered); default true: they would stay on the host's disk, named by
   * nothing, with whatever the container wrote there.
   */
  volumes?: boolean;
}

/** Options of {@linkcode DockerClient.listContainers}. */
export interface ListOptions extends RequestOptions {
  /** Include stopped containers. */
  all?: boolean;
  /** `key` or `key=value` label filters; all must match. */
  labels?: string[];
}

/** Options of {@linkcode DockerClient.waitContainer}. */
export interface WaitOptions extends RequestOptions {
  /** What to wait for; default `not-running`. */
  condition?: "not-running" | "next-exit" | "removed";
}

/** Options of {@linkcode DockerClient.exec}. */
export interface ExecOptions extends RequestOptions {
  /** `uid`, `uid:gid` or a user name; default: the container's user. */
  user?: string;
  /** Extra `NAME=value` entries on top of the container's environment. */
  env?: string[];
  /** Working directory; default: the container's. */
  workdir?: string;
}

/** Options of {@linkcode DockerClient.top}. */
export interface TopOptions extends RequestOptions {
  /** Arguments for `ps`, default `-ef`. */
  psArgs?: string;
}

/** The part of a `docker-modem` instance this client uses (the package ships no types). */
interface ModemLike {
  dial(
    options: DialOptions,
    callback: (err: ModemError | null, data: unknown) => void,
  ): void;
}

interface DialOptions {
  path: string;
  /** A file (path) sent as the request body (`application/tar`). */
  file?: string;
  method: "GET" | "POST" | "DELETE";
  statusCodes: Record<number, boolean | string>;
  options?: Record<string, unknown>;
  abortSignal?: AbortSignal;
  hijack?: boolean;
  isStream?: boolean;
  openStdin?: boolean;
}

interface ModemError extends Error {
  statusCode?: number;
  json?: unknown;
  code?: string;
}

/** The Node-style readable `docker-modem` hands back for streams. */
interface NodeReadable {
  on(event: "data", listener: (chunk: Uint8Array) => void): unknown;
  on(event: "end" | "close", listener: () => void): unknown;
  on(event: "error", listener: (err: Error) => void): unknown;
  destroy(): void;
}

type ModemConstructor = new (options: Record<string, unknown>) => ModemLike;

// docker-modem (CommonJS, with its dependencies) costs 30-40 ms to load: a
// process that talks to a unix socket and never execs into a container
// (`waffle ps`, a warm check, a cold start) never loads it.
let modemModule: Promise<ModemConstructor> | undefined;
function loadModem(): Promise<ModemConstructor> {
  modemModule ??= import("npm:docker-modem@5.0.7").then(
    (module) => module.default as unknown as ModemConstructor,
    (error) => {
      modemModule = undefined; // the next call tries again
      throw new DockerError(
        `Cannot load the Docker client library: ${
          oneLine(error instanceof Error ? error.message : String(error))
        }`,
        { cause: error },
      );
    },
  );
  return modemModule;
}

/** Largest reply read without docker-modem; a larger GET goes through it. */
const QUICK_MAX_BYTES = 4 * 1024 * 1024;
/** The longest timer Deno keeps (a longer or infinite one fires at once). */
const MAX_TIMER_MS = 2 ** 31 - 1;

interface RequestSpec {
  method: "GET" | "POST" | "DELETE";
  path: string;
  query?: Record<string, unknown>;
  body?: unknown;
  /** Statuses that count as success; anything else rejects with a DockerError. */
  ok: number[];
  timeoutMs: number | undefined;
}

/**
 * Docker Engine API client. Construct once and share; it holds no connection
 * state besides `docker-modem`'s HTTP agent.
 */
export class DockerClient {
  /** Where this client connects. */
  readonly endpoint: DockerEndpoint;
  /** Default per-request timeout in milliseconds. */
  readonly timeoutMs: number;
  readonly #modemOptions: Record<string, unknown>;
  #modem: Promise<ModemLike> | undefined;

  /**
   * Creates a client; nothing connects until the first request.
   *
   * @param options Endpoint (default `$DOCKER_HOST`, then `/var/run/docker.sock`),
   *   timeout and API version.
   */
  constructor(options: DockerClientOptions = {}) {
    this.endpoint = parseDockerHost(options.host ?? dockerHostEnv());
    this.timeoutMs = options.timeoutMs ?? DEFAULT_DOCKER_TIMEOUT_MS;
    // Explicit undefineds: docker-modem merges its own DOCKER_HOST parsing underneath.
    const modemOptions: Record<string, unknown> = this.endpoint.kind === "unix"
      ? { socketPath: this.endpoint.socketPath, host: undefined, port: undefined, protocol: "http" }
      : {
        socketPath: undefined,
        host: this.endpoint.host,
        port: this.endpoint.port,
        protocol: this.endpoint.protocol,
        pathPrefix: "/",
      };
    // Our own timer enforces timeouts; TLS client certificates are not supported.
    Object.assign(modemOptions, {
      timeout: undefined,
      ca: undefined,
      cert: undefined,
      key: undefined,
    });
    if (options.apiVersion !== undefined) {
      modemOptions.version = `v${options.apiVersion.replace(/^v/, "")}`;
    }
    this.#modemOptions = modemOptions;
  }

  // docker-modem, loaded and set up on first use.
  #modemReady(): Promise<ModemLike> {
    this.#modem ??= loadModem().then((Ctor) => {
      try {
        return new Ctor(this.#modemOptions);
      } catch (err) {
        throw new DockerError(
          `Cannot set up a Docker client for '${this.location}': ${
            oneLine(err instanceof Error ? err.message : String(err))
          }`,
          { cause: err },
        );
      }
    });
    return this.#modem;
  }

  /** The endpoint as shown in messages: socket path or `tcp://host:port`. */
  get location(): string {
    return describeDockerEndpoint(this.endpoint);
  }

  /** Resolves when the daemon answers `GET /_ping`. */
  async ping(options: RequestOptions = {}): Promise<void> {
    await this.#request({ method: "GET", path: "/_ping", ok: [200], timeoutMs: options.timeoutMs });
  }

  /** Daemon and API version (`GET /version`). */
  async version(options: RequestOptions = {}): Promise<DockerVersion> {
    const data = await this.#request({
      method: "GET",
      path: "/version",
      ok: [200],
      timeoutMs: options.timeoutMs,
    });
    return this.#parse(versionSchema, data, "GET /version");
  }

  /** Storage driver, cgroup driver/version, architecture (`GET /info`). */
  async info(options: RequestOptions = {}): Promise<DockerInfo> {
    const data = await this.#request({
      method: "GET",
      path: "/info",
      ok: [200],
      timeoutMs: options.timeoutMs,
    });
    return this.#parse(infoSchema, data, "GET /info");
  }

  /** Image id and labels, or `null` when the image does not exist. */
  async inspectImage(ref: string, options: RequestOptions = {}): Promise<ImageSummary | null> {
    try {
      const data = await this.#request({
        method: "GET",
        path: `/images/${encodeURIComponent(ref)}/json`,
        ok: [200],
        timeoutMs: options.timeoutMs,
      });
      return this.#parse(imageInspectSchema, data, "GET /images/{name}/json");
    } catch (err) {
      if (err instanceof DockerNotFoundError) return null;
      throw err;
    }
  }

  /**
   * Creates a container and returns its id.
   *
   * @throws {DockerConflictError} When the name is taken; the caller may adopt that container.
   * @throws {DockerNotFoundError} When the image does not exist (`Image 'x' not found`).
   */
  async createContainer(
    name: string,
    body: ContainerCreateBody,
    options: RequestOptions = {},
  ): Promise<string> {
    try {
      const data = await this.#request({
        method: "POST",
        path: "/containers/create",
        query: { name },
        body,
        ok: [201],
        timeoutMs: options.timeoutMs,
      });
      return this.#parse(createResponseSchema, data, "POST /containers/create").Id;
    } catch (err) {
      if (err instanceof DockerConflictError) {
        throw new DockerConflictError(`Container name '${name}' is already in use`, { cause: err });
      }
      if (err instanceof DockerNotFoundError) {
        throw new DockerNotFoundError(`Image '${body.Image}' not found`, { cause: err });
      }
      throw err;
    }
  }

  /** Starts a container. Resolves `false` when it was already running (304). */
  async startContainer(id: string, options: RequestOptions = {}): Promise<boolean> {
    return await this.#containerAction(id, "start", {}, [204], options);
  }

  /** Full inspect subset, or `null` when the container does not exist. */
  async inspectContainer(
    idOrName: string,
    options: RequestOptions = {},
  ): Promise<ContainerInspect | null> {
    try {
      const data = await this.#request({
        method: "GET",
        path: `/containers/${encodeURIComponent(idOrName)}/json`,
        ok: [200],
        timeoutMs: options.timeoutMs,
      });
      return this.#parse(containerInspectSchema, data, "GET /containers/{id}/json");
    } catch (err) {
      if (err instanceof DockerNotFoundError) return null;
      throw err;
    }
  }

  /**
   * Stops a container (stop signal, then SIGKILL after `timeoutSeconds`).
   * Resolves `false` when it was not running (304). The HTTP timeout is
   * extended by `timeoutSeconds` so a slow stop is not reported as a timeout.
   */
  async stopContainer(id: string, options: StopOptions = {}): Promise<boolean> {
    const query: Record<string, unknown> = {};
    if (options.timeoutSeconds !== undefined) {
      query.t = Math.max(0, Math.ceil(options.timeoutSeconds));
    }
    const timeoutMs = options.timeoutMs ??
      this.timeoutMs + (options.timeoutSeconds ?? 10) * 1000;
    return await this.#containerAction(id, "stop", query, [204], { timeoutMs });
  }

  /**
   * Sends a signal (default SIGKILL) to the container's PID 1.
   *
   * @throws {DockerConflictError} When the container is not running.
   */
  async killContainer(id: string, options: KillOptions = {}): Promise<void> {
    await this.#containerAction(
      id,
      "kill",
      { signal: options.signal ?? "SIGKILL" },
      [204],
      options,
    );
  }

  /**
   * Removes a container, with its anonymous volumes unless `volumes: false`.
   * Resolves `false` when it did not exist (404).
   */
  async removeContainer(id: string, options: RemoveOptions = {}): Promise<boolean> {
    return await this.#deleted({
      method: "DELETE",
      path: `/containers/${encodeURIComponent(id)}`,
      query: { force: options.force ?? false, v: options.volumes ?? true },
      ok: [204],
      timeoutMs: options.timeoutMs,
    });
  }

  /** Freezes every process of a container (cgroup freezer). */
  async pauseContainer(id: string, options: RequestOptions = {}): Promise<void> {
    await this.#containerAction(id, "pause", {}, [204], options);
  }

  /** Thaws a paused container. */
  async unpauseContainer(id: string, options: RequestOptions = {}): Promise<void> {
    await this.#containerAction(id, "unpause", {}, [204], options);
  }

  /** Renames a container (a warm pool's member taken by a user, see `lib/lifecycle/pool.ts`). */
  async renameContainer(id: string, name: string, options: RequestOptions = {}): Promise<void> {
    await this.#containerAction(id, "rename", { name }, [204], options);
  }

  /** Lists containers, optionally stopped ones too, filtered by labels. */
  async listContainers(options: ListOptions = {}): Promise<ContainerSummary[]> {
    const query = { all: options.all ?? false, ...labelFilter(options.labels) };
    const data = await this.#request({
      method: "GET",
      path: "/containers/json",
      query,
      ok: [200],
      timeoutMs: options.timeoutMs,
    });
    return this.#parse(containerListSchema, data, "GET /containers/json");
  }

  /**
   * Waits until the container stops and returns its exit code. Uses the
   * client's timeout unless `timeoutMs` (possibly `Infinity`) says otherwise.
   */
  async waitContainer(id: string, options: WaitOptions = {}): Promise<number> {
    const data = await this.#request({
      method: "POST",
      path: `/containers/${encodeURIComponent(id)}/wait`,
      query: { condition: options.condition ?? "not-running" },
      ok: [200],
      timeoutMs: options.timeoutMs,
    }).catch((err) => this.#rethrowForContainer(err, id));
    const result = this.#parse(waitResponseSchema, data, "POST /containers/{id}/wait");
    if (result.Error !== null && result.Error.Message !== "") {
      throw new DockerError(
        `Waiting for container '${id}' failed: ${oneLine(result.Error.Message)}`,
      );
    }
    return result.StatusCode;
  }

  /**
   * Runs a command in a running container and collects its output: exec
   * create, exec start over a hijacked connection, demultiplexing of Docker's
   * 8-byte framed stream, then exec inspect for the exit code. The timeout
   * covers the whole call; on timeout the command keeps running (the Engine
   * API cannot kill an exec).
   */
  async exec(id: string, argv: string[], options: ExecOptions = {}): Promise<ExecResult> {
    if (argv.length === 0) throw new DockerError("Exec needs a non-empty argv");
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    const deadline = Date.now() + timeoutMs;
    const createBody: Record<string, unknown> = {
      AttachStdin: false,
      AttachStdout: true,
      AttachStderr: true,
      Tty: false,
      Cmd: argv,
    };
    if (options.user !== undefined) createBody.User = options.user;
    if (options.env !== undefined) createBody.Env = options.env;
    if (options.workdir !== undefined) createBody.WorkingDir = options.workdir;
    const created = await this.#request({
      method: "POST",
      path: `/containers/${encodeURIComponent(id)}/exec`,
      body: createBody,
      ok: [201],
      timeoutMs,
    }).catch((err) => this.#rethrowForContainer(err, id));
    const execId = this.#parse(execCreateSchema, created, "POST /containers/{id}/exec").Id;

    const raw = await this.#execStream(execId, remaining(deadline));
    const { stdout, stderr } = demuxDockerStream(raw);

    // The stream can close a moment before the daemon records the exit code.
    for (let delay = 5;; delay = Math.min(delay * 2, 100)) {
      const inspected = await this.#request({
        method: "GET",
        path: `/exec/${execId}/json`,
        ok: [200],
        timeoutMs: remaining(deadline),
      });
      const state = this.#parse(execInspectSchema, inspected, "GET /exec/{id}/json");
      if (!state.Running && state.ExitCode !== null) {
        return { exitCode: state.ExitCode, stdout, stderr };
      }
      if (Date.now() + delay >= deadline) {
        throw new DockerError(
          `Exec in container '${id}' timed out after ${timeoutMs} ms waiting for its exit code`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }

  /** Processes running in a container (`GET /containers/{id}/top`). */
  async top(id: string, options: TopOptions = {}): Promise<ContainerTop> {
    const data = await this.#request({
      method: "GET",
      path: `/containers/${encodeURIComponent(id)}/top`,
      query: { ps_args: options.psArgs ?? "-ef" },
      ok: [200],
      timeoutMs: options.timeoutMs,
    }).catch((err) => this.#rethrowForContainer(err, id));
    return this.#parse(topSchema, data, "GET /containers/{id}/top");
  }

  /** One resource-usage sample of a running container (memory, pids, CPU time). */
  async stats(id: string, options: RequestOptions = {}): Promise<ContainerStats> {
    const data = await this.#request({
      method: "GET",
      path: `/containers/${encodeURIComponent(id)}/stats`,
      query: { stream: false, "one-shot": true },
      ok: [200],
      timeoutMs: options.timeoutMs,
    }).catch((err) => this.#rethrowForContainer(err, id));
    return this.#parse(statsSchema, data, "GET /containers/{id}/stats");
  }

  /** Creates a named volume of the `local` driver (`POST /volumes/create`). */
  async createVolume(
    name: string,
    options: RequestOptions & {
      labels?: Record<string, string>;
      /** The local driver's options, e.g. `{ type: "tmpfs", device: "tmpfs", o: "size=64m" }`. */
      driverOpts?: Record<string, string>;
    } = {},
  ): Promise<DockerVolume> {
    const data = await this.#request({
      method: "POST",
      path: "/volumes/create",
      body: {
        Name: name,
        Driver: "local",
        Labels: options.labels ?? {},
        DriverOpts: options.driverOpts ?? {},
      },
      ok: [201],
      timeoutMs: options.timeoutMs,
    });
    return this.#parse(volumeSchema, data, "POST /volumes/create");
  }

  /** A named volume, or `null` when it does not exist. */
  async inspectVolume(name: string, options: RequestOptions = {}): Promise<DockerVolume | null> {
    try {
      const data = await this.#request({
        method: "GET",
        path: `/volumes/${encodeURIComponent(name)}`,
        ok: [200],
        timeoutMs: options.timeoutMs,
      });
      return this.#parse(volumeSchema, data, "GET /volumes/{name}");
    } catch (err) {
      if (err instanceof DockerNotFoundError) return null;
      throw err;
    }
  }

  /** Lists named volumes, filtered by labels (`key` or `key=value`, all must match). */
  async listVolumes(
    options: RequestOptions & { labels?: string[] } = {},
  ): Promise<DockerVolume[]> {
    const query = labelFilter(options.labels);
    const data = await this.#request({
      method: "GET",
      path: "/volumes",
      query,
      ok: [200],
      timeoutMs: options.timeoutMs,
    });
    return this.#parse(volumeListSchema, data, "GET /volumes");
  }

  /**
   * Removes a named volume. Resolves `false` when it did not exist (404).
   *
   * @throws {DockerConflictError} When a container still uses it.
   */
  async removeVolume(name: string, options: RequestOptions = {}): Promise<boolean> {
    return await this.#deleted({
      method: "DELETE",
      path: `/volumes/${encodeURIComponent(name)}`,
      ok: [204],
      timeoutMs: options.timeoutMs,
    });
  }

  /**
   * Creates an image from a tar of its root file system, as `docker import`
   * does (`POST /images/create?fromSrc=-`): no registry, no base image.
   *
   * @param tarFile The tar on this machine (sent as the request's body).
   * @param options Its `repo:tag` and Dockerfile `changes` (`ENTRYPOINT [...]`, `ENV K=V`, `LABEL k=v`).
   * @returns The new image's id.
   * @throws {DockerError} When the daemon refuses it, mid-stream included.
   */
  async importImage(
    tarFile: string,
    options: RequestOptions & { repo: string; tag: string; changes?: string[] },
  ): Promise<string> {
    const spec: RequestSpec = {
      method: "POST",
      path: "/images/create",
      ok: [200],
      timeoutMs: options.timeoutMs,
    };
    // docker-modem repeats an array's values (`changes=…&changes=…`), as the API expects.
    const query = {
      fromSrc: "-",
      repo: options.repo,
      tag: options.tag,
      changes: options.changes ?? [],
    };
    const stream = await this.#dial(
      {
        path: `${spec.path}?`,
        method: "POST",
        file: tarFile,
        options: { _query: query },
        statusCodes: { 200: true },
        isStream: true,
      },
      spec,
      options.timeoutMs ?? this.timeoutMs,
    );
    const reply = await readAll(stream as NodeReadable);
    // One JSON object a line: `{"status":"sha256:…"}`, or `{"error":…}` when it failed midway.
    let id: string | undefined;
    for (const line of new TextDecoder().decode(reply).split("\n")) {
      if (line.trim() === "") continue;
      const event = JSON.parse(line) as { status?: string; error?: string };
      if (typeof event.error === "string") {
        throw new DockerError(
          `Docker image import of '${options.repo}:${options.tag}' failed: ${oneLine(event.error)}`,
        );
      }
      if (typeof event.status === "string" && /^sha256:[0-9a-f]{64}$/.test(event.status)) {
        id = event.status;
      }
    }
    if (id === undefined) {
      throw new DockerError(`Docker image import of '${options.repo}:${options.tag}' gave no id`);
    }
    return id;
  }

  /** Removes an image by id or reference. Resolves `false` when it did not exist (404). */
  async removeImage(
    ref: string,
    options: RequestOptions & { force?: boolean } = {},
  ): Promise<boolean> {
    return await this.#deleted({
      method: "DELETE",
      path: `/images/${encodeURIComponent(ref)}`,
      query: { force: options.force ?? false },
      ok: [200],
      timeoutMs: options.timeoutMs,
    });
  }

  /**
   * Creates a bridge network (`POST /networks/create`) and returns its id.
   *
   * @param name The network's name.
   * @param options Its labels; `internal`: no route off the machine.
   */
  async createNetwork(
    name: string,
    options: RequestOptions & { labels?: Record<string, string>; internal?: boolean } = {},
  ): Promise<string> {
    const data = await this.#request({
      method: "POST",
      path: "/networks/create",
      body: {
        Name: name,
        Driver: "bridge",
        CheckDuplicate: true,
        Internal: options.internal ?? false,
        Labels: options.labels ?? {},
      },
      ok: [201],
      timeoutMs: options.timeoutMs,
    });
    return this.#parse(createResponseSchema, data, "POST /networks/create").Id;
  }

  /**
   * A network's name and the IPv4 address of each container on it, or
   * `null` when it does not exist (`GET /networks/{id}`).
   */
  async inspectNetwork(
    idOrName: string,
    options: RequestOptions = {},
  ): Promise<{ id: string; name: string; containers: Record<string, string> } | null> {
    let data: unknown;
    try {
      data = await this.#request({
        method: "GET",
        path: `/networks/${encodeURIComponent(idOrName)}`,
        ok: [200],
        timeoutMs: options.timeoutMs,
      });
    } catch (err) {
      if (err instanceof DockerNotFoundError) return null;
      throw err;
    }
    const network = data as { Id?: unknown; Name?: unknown; Containers?: unknown };
    if (typeof network.Id !== "string" || typeof network.Name !== "string") {
      throw new DockerError("Docker GET /networks/{id} returned an unexpected response");
    }
    const containers: Record<string, string> = {};
    for (const [id, entry] of Object.entries(network.Containers ?? {})) {
      const address = (entry as { IPv4Address?: unknown }).IPv4Address;
      if (typeof address === "string" && address !== "") containers[id] = address.split("/")[0]!;
    }
    return { id: network.Id, name: network.Name, containers };
  }

  /** Removes a network. Resolves `false` when it did not exist (404). */
  async removeNetwork(idOrName: string, options: RequestOptions = {}): Promise<boolean> {
    return await this.#deleted({
      method: "DELETE",
      path: `/networks/${encodeURIComponent(idOrName)}`,
      ok: [204],
      timeoutMs: options.timeoutMs,
    });
  }

  /** POST /containers/{id}/{action}; `false` on 304 (already in that state). */
  async #containerAction(
    id: string,
    action: string,
    query: Record<string, unknown>,
    ok: number[],
    options: RequestOptions,
  ): Promise<boolean> {
    try {
      await this.#request({
        method: "POST",
        path: `/containers/${encodeURIComponent(id)}/${action}`,
        query,
        ok,
        timeoutMs: options.timeoutMs,
      });
      return true;
    } catch (err) {
      if (err instanceof DockerError && err.status === 304) return false;
      return this.#rethrowForContainer(err, id);
    }
  }

  /** Rewords a 404 about a container as `Container 'x' not found`. */
  #rethrowForContainer(err: unknown, id: string): never {
    if (err instanceof DockerNotFoundError && /no such container/i.test(err.message)) {
      throw new DockerNotFoundError(`Container '${id}' not found`, { cause: err });
    }
    throw err;
  }

  #parse<T>(schema: z.ZodMiniType<T>, data: unknown, what: string): T {
    const result = schema.safeParse(data);
    if (!result.success) {
      const issue = result.error.issues[0];
      const where = issue === undefined ? "" : ` at '${issue.path.join(".")}'`;
      throw new DockerError(
        `Docker ${what} returned an unexpected response${where}: ${
          oneLine(issue?.message ?? "invalid")
        }`,
      );
    }
    return result.data;
  }

  /** One request with a timeout; failures become DockerErrors. */
  // A DELETE whose 404 is an answer: true when it removed something.
  async #deleted(spec: RequestSpec): Promise<boolean> {
    try {
      await this.#request(spec);
      return true;
    } catch (err) {
      if (err instanceof DockerNotFoundError) return false;
      throw err;
    }
  }

  async #request(spec: RequestSpec): Promise<unknown> {
    const totalMs = spec.timeoutMs ?? this.timeoutMs;
    let timeoutMs = totalMs;
    if (this.endpoint.kind === "unix") {
      const started = Date.now();
      // The reply is waited for as long as the request may take: a slow
      // daemon is never asked twice. docker-modem takes over only where the
      // request may be sent again: it never reached the daemon, or it is a
      // GET whose reply this path cannot take (over the size cap, not JSON).
      const outcome = await quickRequest(this.endpoint, {
        method: spec.method,
        path: this.#versioned(spec.path, spec.query),
        ...(spec.method === "POST" ? { body: JSON.stringify(spec.body ?? {}) } : {}),
      }, { maxBytes: QUICK_MAX_BYTES, timeoutMs: Math.min(MAX_TIMER_MS, timeoutMs) });
      if (outcome.kind === "reply") {
        const reply = outcome.reply;
        if (spec.ok.includes(reply.status)) return reply.body;
        const failed = Object.assign(new Error(`HTTP ${reply.status}`), {
          statusCode: reply.status,
          json: reply.body,
        });
        throw this.#toDockerError(failed, spec);
      }
      if (outcome.kind === "late") throw this.#timedOut(spec, totalMs);
      if (outcome.kind !== "unsent" && spec.method !== "GET") {
        throw new DockerError(
          `Docker ${spec.method} ${spec.path} at '${this.location}' ${
            outcome.kind === "lost" ? "lost its connection" : "gave a reply that is not JSON"
          } after the request was sent`,
        );
      }
      // The time spent is the request's: what is left goes to docker-modem.
      const left = timeoutMs - (Date.now() - started);
      if (left <= 0) throw this.#timedOut(spec, totalMs);
      timeoutMs = left;
    }
    const query = spec.query ?? {};
    const hasQuery = Object.keys(query).length > 0;
    // docker-modem appends `_query` to a path ending in "?" and sends `_body` as JSON.
    const options: Record<string, unknown> = spec.method === "POST"
      ? { _query: query, _body: spec.body ?? {} }
      : { ...query };
    const dial: DialOptions = {
      path: hasQuery ? `${spec.path}?` : spec.path,
      method: spec.method,
      statusCodes: Object.fromEntries(spec.ok.map((s) => [s, true])),
      options,
    };
    return this.#dial(dial, spec, timeoutMs, totalMs);
  }

  // The path as docker-modem sends it: the API version first, object query
  // values JSON-encoded, arrays repeated.
  #versioned(path: string, query: Record<string, unknown> = {}): string {
    const version = this.#modemOptions.version;
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query)) {
      if (value === undefined) continue;
      const values = Array.isArray(value) ? value : [value];
      for (const item of values) {
        params.append(
          key,
          typeof item === "object" && item !== null ? JSON.stringify(item) : String(item),
        );
      }
    }
    const search = params.size > 0 ? `?${params}` : "";
    return `${typeof version === "string" ? `/${version}` : ""}${path}${search}`;
  }

  // `timeoutMs` is what is left of the request's `totalMs` (the one messages name).
  async #dial(
    dial: DialOptions,
    spec: RequestSpec,
    timeoutMs: number,
    totalMs = timeoutMs,
  ): Promise<unknown> {
    const modem = await this.#modemReady();
    return await new Promise((resolve, reject) => {
      const controller = new AbortController();
      let settled = false;
      const timer = Number.isFinite(timeoutMs)
        ? setTimeout(() => {
          if (settled) return;
          settled = true;
          controller.abort();
          reject(this.#timedOut(spec, totalMs));
        }, timeoutMs)
        : undefined;
      try {
        modem.dial({ ...dial, abortSignal: controller.signal }, (err, data) => {
          if (settled) return;
          settled = true;
          clearTimeout(timer);
          if (err === null) resolve(data);
          else reject(this.#toDockerError(err, spec));
        });
      } catch (err) {
        settled = true;
        clearTimeout(timer);
        reject(this.#toDockerError(err as ModemError, spec));
      }
    });
  }

  /** Exec start over a hijacked connection; resolves with the raw multiplexed bytes. */
  async #execStream(execId: string, timeoutMs: number): Promise<Uint8Array> {
    const spec: RequestSpec = {
      method: "POST",
      path: `/exec/${execId}/start`,
      ok: [200],
      timeoutMs,
    };
    const modem = await this.#modemReady();
    return await new Promise((resolve, reject) => {
      const chunks: Uint8Array[] = [];
      let stream: NodeReadable | undefined;
      let settled = false;
      const finish = (err: DockerError | null): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        stream?.destroy();
        if (err === null) resolve(concat(chunks));
        else reject(err);
      };
      const controller = new AbortController();
      const timer = Number.isFinite(timeoutMs)
        ? setTimeout(() => {
          controller.abort();
          finish(new DockerError(`Exec '${execId}' timed out after ${timeoutMs} ms`));
        }, timeoutMs)
        : undefined;
      modem.dial({
        path: spec.path,
        method: "POST",
        statusCodes: { 200: true },
        options: { _body: { Detach: false, Tty: false } },
        abortSignal: controller.signal,
        hijack: true,
        isStream: true,
        openStdin: false,
      }, (err, data) => {
        if (err !== null) return finish(this.#toDockerError(err, spec));
        if (settled) return (data as NodeReadable).destroy();
        stream = data as NodeReadable;
        stream.on("data", (chunk) => chunks.push(new Uint8Array(chunk)));
        stream.on("end", () => finish(null));
        stream.on("close", () => finish(null));
        stream.on("error", (e) => finish(this.#toDockerError(e as ModemError, spec)));
      });
    });
  }

  #timedOut(spec: RequestSpec, timeoutMs: number): DockerError {
    return new DockerError(
      `Docker ${spec.method} ${spec.path} timed out after ${timeoutMs} ms at '${this.location}'`,
    );
  }

  #toDockerError(err: ModemError, spec: RequestSpec): DockerError {
    const status = typeof err.statusCode === "number" ? err.statusCode : undefined;
    if (status === undefined) {
      const where = this.location;
      const code = err.code ?? "";
      if (code === "EACCES" || code === "EPERM") {
        return new DockerError(`Permission denied on Docker socket '${where}'`, { cause: err });
      }
      const reason = TRANSPORT_REASONS[code] ?? oneLine(err.message);
      return new DockerError(`Docker daemon unavailable at '${where}': ${reason}`, { cause: err });
    }
    const message = daemonMessage(err);
    const text = `Docker ${spec.method} ${spec.path} failed with ${status}: ${message}`;
    if (status === 404) return new DockerNotFoundError(text, { cause: err });
    if (status === 409) return new DockerConflictError(text, { cause: err });
    return new DockerError(text, { cause: err, status });
  }
}

const TRANSPORT_REASONS: Record<string, string> = {
  ENOENT: "no such socket (ENOENT)",
  ECONNREFUSED: "connection refused (ECONNREFUSED)",
  ECONNRESET: "connection reset (ECONNRESET)",
  ENOTSOCK: "not a socket (ENOTSOCK)",
  ENOTFOUND: "host not found (ENOTFOUND)",
  ETIMEDOUT: "connection timed out (ETIMEDOUT)",
  EHOSTUNREACH: "host unreachable (EHOSTUNREACH)",
};

function daemonMessage(err: ModemError): string {
  const json = err.json;
  if (typeof json === "object" && json !== null && "message" in json) {
    const message = (json as { message: unknown }).message;
    if (typeof message === "string" && message !== "") return oneLine(message);
  }
  if (json instanceof Uint8Array && json.length > 0) {
    return oneLine(new TextDecoder().decode(json));
  }
  if (json === 304 || err.statusCode === 304) return "not modified";
  // docker-modem's own text: "(HTTP code 500) unexpected - <cause> ".
  return oneLine(err.message.replace(/^\(HTTP code \d+\)\s*[^-]*-\s*/, "")) || "no message";
}

function oneLine(text: string): string {
  return text.replace(/\s+/g, " ").trim().replace(/\.$/, "");
}

// A docker-modem stream read to its end.
function readAll(stream: NodeReadable): Promise<Uint8Array> {
  return new Promise((resolve, reject) => {
    const chunks: Uint8Array[] = [];
    stream.on("data", (chunk) => chunks.push(new Uint8Array(chunk)));
    stream.on("end", () => resolve(concat(chunks)));
    stream.on("error", reject);
  });
}

function remaining(deadline: number): number {
  return Math.max(1, deadline - Date.now());
}

// A list's label filter (`key` or `key=value`, all must match); none when
// no labels. docker-modem JSON-encodes object query values, which is what
// `filters` expects.
function labelFilter(labels: string[] | undefined): { filters?: { label: string[] } } {
  return labels !== undefined && labels.length > 0 ? { filters: { label: labels } } : {};
}
