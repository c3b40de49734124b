/**
 * The Docker backend: a per-(tenant, user) persistent container whose runner
 * serves the user's queue. This is waffle's sandbox; there is no fallback to
 * unsandboxed execution on any error. It composes what the config resolves
 * (`resolveSandbox`) with the container's lifecycle and, only for a sandbox
 * attached to egress, the egress proxy: a sandbox without egress loads no
 * egress module.
 *
 * @module
 */
import { mark } from "../trace.ts";
import { loadWaffleConfig, type SandboxConfig, type WaffleConfig } from "../config/config.ts";
import type { EgressAttachment } from "../config/egress_types.ts";
import { resolveSandbox } from "../config/resolve.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";
import type { DockerClient } from "../docker/client.ts";
import { type DockerEndpoint, dockerHostEnv, parseDockerHost } from "../docker/endpoint.ts";
import { quickGet } from "../docker/quick_get.ts";
import type { Backend } from "../queue/backend.ts";
import type { SandboxFiles } from "../files/mod.ts";
import { Queue, type SubmitOptions } from "../queue/queue.ts";
import type { RunnerTrouble } from "../queue/liveness.ts";
import { makeChannelDir } from "../queue/channel.ts";
import { initQueue } from "../queue/schema.ts";
import type { Ensured } from "../lifecycle/ensure.ts";
import { type StatePaths, statePaths } from "../lifecycle/identity.ts";
import { withLock } from "../lifecycle/lock.ts";
import { outboundInPlace } from "../lifecycle/outbound_in_place.ts";
import { containerSpec, hostCanChown } from "../lifecycle/posture.ts";
import type { VolumeStatus } from "../lifecycle/quota.ts";
import type { SandboxStats } from "../lifecycle/stats.ts";
import { initMark, readWarm, recordedPid, stillWarm, writeWarm } from "../lifecycle/warm.ts";
import { judgedWhilePaused, refuseIfPaused } from "../lifecycle/pause_record.ts";
import { processesOf, type SandboxProcesses } from "../lifecycle/run.ts";
import { egressServing, egressTracker } from "./egress_tracker.ts";
import { renameTaken, takeFromPool } from "./pool_take.ts";

/** Options for {@linkcode openSandbox}. */
export interface SandboxOptions {
  /** Tenant id; default "default". */
  tenant?: string;
  /** Configuration overrides (image, home, limits). */
  config?: Partial<SandboxConfig>;
  /**
   * Narrows every config loaded (the first, and each reload after the file
   * changed): overrides worked out from what that config grants, applied
   * over it, so a file narrowed later narrows the sandbox with it.
   */
  narrow?: (loaded: SandboxConfig) => Partial<SandboxConfig>;
  /** Docker client; default from `DOCKER_HOST`. */
  docker?: DockerClient;
  /** Fallback poll interval of the queue. */
  pollMs?: number;
  /**
   * False: never take a warm pool's member for a user that has no sandbox
   * yet (a fork's target, a sandbox made from an image: their state is
   * made anew). Default true.
   */
  fromPool?: boolean;
  /**
   * Opens a warm pool's member of this template (the filler's, see
   * `pool_fill.ts`): its tenant must be `POOL_TENANT`, and it never takes
   * from a pool itself.
   */
  pool?: string;
}

/** A user's sandbox: the {@linkcode Backend}, its identity, and `run`/`spawn` (`run.ts`). */
export interface Sandbox extends Backend, SandboxProcesses {
  /** Whose sandbox this is, and its container name. */
  readonly key: SandboxKey;
  /** The sandbox's state directories on the host. */
  readonly paths: StatePaths;
  /** The loaded configuration, overrides applied. */
  readonly config: SandboxConfig;
  /** What the last ensure did (undefined before the first). */
  readonly lastEnsure: Ensured | undefined;
  /** The sandbox's volume after the last ensure: whether its disk quota is enforced. */
  readonly volume: VolumeStatus | undefined;
  /** Files in and out of the sandbox, streamed (`lib/files/mod.ts`). */
  readonly files: SandboxFiles;
  /** Set when this open took the sandbox from a warm pool: the pool's template. */
  readonly pooled: { template: string } | undefined;
  /**
   * What the sandbox costs now: CPU, memory, tasks (the kernel's counters),
   * disk (its quota volume) and network (the egress proxy's counts). Costs
   * nothing until called; never starts the container.
   *
   * @param options `sampleMs`: read the CPU time twice this far apart for the
   * share; `previous`: an earlier reading to compute the share against.
   */
  stats(options?: { sampleMs?: number; previous?: SandboxStats }): Promise<SandboxStats>;
}

/**
 * Opens the sandbox of a user: validates the ids, creates the state
 * directory if needed, and returns a backend whose `ensure`/`submit` create,
 * adopt, start or recycle the container under the sandbox lock.
 *
 * @param user User id.
 * @param options Tenant, config overrides and Docker client.
 * @returns The sandbox backend.
 * @throws {UsageError} On an invalid id or config.
 */
export function openSandbox(user: string, options: SandboxOptions = {}): Sandbox {
  const load = (): WaffleConfig => {
    const overrides = options.config ?? {};
    const loaded = loadWaffleConfig({ overrides });
    if (options.narrow === undefined) return loaded;
    return loadWaffleConfig({ overrides: { ...overrides, ...options.narrow(loaded.sandbox) } });
  };
  const whole = load();
  const resolved = resolveSandbox(whole, {
    tenant: options.tenant ?? "default",
    user,
    pool: options.pool,
  });
  const { key, config } = resolved;
  const paths = statePaths(config.home, key);
  const endpoint = options.docker?.endpoint ?? parseDockerHost(dockerHostEnv());
  // A new user's first open takes a warm pool's member when one fits.
  const taken = options.pool === undefined && options.fromPool !== false
    ? takeFromPool(resolved, paths)
    : undefined;
  // Its container still has the member's name; renamed before the first use.
  let renaming = taken === undefined ? undefined : renameTaken(endpoint, taken, key);
  // The host's half only; the volume and the runner's directory are made
  // under the lock, by ensure.
  Deno.mkdirSync(paths.root, { recursive: true, mode: 0o700 });
  const currentEgress = egressTracker(resolved, {
    path: whole.path,
    root: paths.root,
    reload: load,
  });
  // Before any session: a host listens there while its container is made.
  makeChannelDir(paths.channel);
  // Mounted read-only into every sandbox (npm MCP servers): it must exist.
  Deno.mkdirSync(config.mcpCache, { recursive: true, mode: 0o755 });
  initQueue(paths.queue, { outboundDir: paths.outbound, mode: hostCanChown() ? 0o700 : 0o750 });
  const queue = Queue.open(paths.queue, {
    outboundDir: paths.outbound,
    useMark: paths.useMark,
    ...(options.pollMs === undefined ? {} : { pollMs: options.pollMs }),
  });
  // The Docker client (docker-modem) and the full ensure load only when a
  // warm check fails: a warm submission needs neither.
  let docker = options.docker;
  let lastEnsure: Ensured | undefined;
  let volume: VolumeStatus | undefined;
  // A taken member's rename, settled under the lock once: a first command
  // is submitted while it runs. Not renamed: the next call's full ensure
  // finds the container by its binding and renames it (see ensure.ts).
  const settleRename = async (): Promise<void> => {
    if (renaming === undefined) return;
    const done = renaming;
    renaming = undefined;
    if (!await done) writeWarm(paths.root, undefined);
  };
  const ensureLocked = async (
    trouble?: RunnerTrouble,
    imageAsked?: Promise<string | undefined>,
  ): Promise<void> => {
    mark("lock held");
    // A paused sandbox takes nothing: failed here, never queued for later.
    refuseIfPaused(paths.root, key);
    const egress = currentEgress();
    if ((trouble === undefined || trouble === "none") && await warm(egress, imageAsked)) {
      mark("warm");
      return;
    }
    const [{ prepareState }, { ensureContainer }, { DockerClient }] = await Promise.all([
      import("../lifecycle/state_dir.ts"),
      import("../lifecycle/ensure.ts"),
      import("../docker/client.ts"),
    ]);
    docker ??= new DockerClient();
    if (egress !== undefined) {
      const { ensureEgress } = await import("../egress/supervisor.ts");
      await ensureEgress(docker, egress, { home: config.home, config });
      mark("egress proxy ensured");
    }
    const prepared = prepareState(paths, { quotaBytes: config.quotaBytes }).then((status) => {
      volume = status;
      mark("state prepared (volume)");
    });
    lastEnsure = await ensureContainer(docker, key, {
      config,
      paths,
      queue,
      prepared,
      ...(trouble === undefined ? {} : { trouble }),
    });
    mark(`container ensured (${lastEnsure.action})`);
    const process = initMark(lastEnsure.pid);
    const bootId = queue.heartbeat()?.bootId;
    writeWarm(
      paths.root,
      process === undefined || bootId === undefined ? undefined : {
        containerId: lastEnsure.containerId,
        image: lastEnsure.image,
        postureHash: lastEnsure.postureHash,
        process,
        bootId,
        volume: volume!,
      },
    );
  };
  // True when the last full ensure's findings still hold (see warm.ts).
  const warm = async (
    egress: EgressAttachment | undefined,
    imageAsked?: Promise<string | undefined>,
  ): Promise<boolean> => {
    const record = readWarm(paths.root);
    // Never into a missing or replaced outbound/ (a host killed mid-reset).
    if (record === undefined || !outboundInPlace(paths)) return false;
    // Nor with its egress proxy down or its policy unwritten: the full
    // ensure starts the proxy.
    if (egress !== undefined && !await egressServing(config.home, egress)) return false;
    let postureHash: string;
    try {
      // The posture leaves the image out: any id gives today's hash.
      postureHash = containerSpec(key, { config, image: record.image, paths }).postureHash;
    } catch {
      return false; // the full ensure repairs what it can, or says what is wrong
    }
    const imageId = await (imageAsked ?? currentImageId(endpoint, config.image));
    if (!stillWarm(record, { imageId, postureHash, queue })) return false;
    lastEnsure = {
      containerId: record.containerId,
      imageId: record.image.id,
      image: record.image,
      postureHash,
      pid: recordedPid(record),
      action: "warm",
    };
    volume = record.volume;
    return true;
  };
  const sandbox = {
    key,
    paths,
    pooled: taken === undefined ? undefined : { template: taken.member.template },
    channelDir: paths.channel,
    config,
    queue,
    get lastEnsure(): Ensured | undefined {
      return lastEnsure;
    },
    get volume(): VolumeStatus | undefined {
      return volume;
    },
    ensure: async (trouble?: RunnerTrouble): Promise<void | false> => {
      if (trouble === undefined) {
        return await withLock(paths.lock, async () => {
          await ensureLocked();
          await settleRename();
        });
      }
      // A waiting host's trouble judged while the sandbox was paused (or
      // before its resume's first beat) is no death: nothing is repaired and
      // the wait goes on. Asked again under the lock, which a resume holds.
      const judgedBy = Date.now();
      if (judgedWhilePaused(paths.root, judgedBy)) return false;
      return await withLock(paths.lock, async (): Promise<void | false> => {
        if (judgedWhilePaused(paths.root, judgedBy)) return false;
        await settleRename();
        return await ensureLocked(trouble);
      });
    },
    submit: (request: SubmitOptions) => {
      // Asked while the lock is taken and the record checked: the daemon's
      // answer is the slowest step of a warm submission. A rebuild that
      // lands meanwhile is seen by the next call, as if this one came first.
      const imageAsked = currentImageId(endpoint, config.image);
      return withLock(paths.lock, async () => {
        await ensureLocked(undefined, imageAsked);
        const id = await queue.submit(request);
        await settleRename();
        return id;
      });
    },
    close: () => queue.close(),
    get files(): SandboxFiles {
      return lazyFiles(this as unknown as Sandbox);
    },
    stats: async (asked: { sampleMs?: number; previous?: SandboxStats } = {}) => {
      const [{ statsOf }, { DockerClient }] = await Promise.all([
        import("./stats.ts"),
        import("../docker/client.ts"),
      ]);
      docker ??= new DockerClient();
      return await statsOf(docker, {
        container: lastEnsure?.containerId ?? key.containerName,
        root: paths.root,
        home: config.home,
        quotaBytes: config.quotaBytes,
      }, asked);
    },
  };
  return Object.assign(sandbox, processesOf(sandbox));
}

// The files API, lib/files loaded on first use: a command that never moves
// a file never loads it.
function lazyFiles(sandbox: Sandbox): SandboxFiles {
  const files = (): Promise<typeof import("../files/mod.ts")> => import("../files/mod.ts");
  return {
    write: async (path, data) => await (await files()).writeFile(sandbox, path, data),
    read: (path) =>
      ReadableStream.from((async function* (): AsyncGenerator<Uint8Array> {
        yield* (await files()).readFile(sandbox, path);
      })()),
    list: async (path) => await (await files()).listFiles(sandbox, path),
    remove: async (path) => await (await files()).removeFile(sandbox, path),
  };
}

// The tag's image id, asked without the Docker client; undefined when the
// daemon cannot say (the full ensure then asks properly).
async function currentImageId(
  endpoint: DockerEndpoint,
  ref: string,
): Promise<string | undefined> {
  const reply = await quickGet(endpoint, `/images/${encodeURIComponent(ref)}/json`);
  if (reply?.status !== 200 || typeof reply.body !== "object" || reply.body === null) {
    return undefined;
  }
  const id = (reply.body as { Id?: unknown }).Id;
  return typeof id === "string" ? id : undefined;
}
