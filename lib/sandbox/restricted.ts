/**
 * A restricted session's container: a separate container per session, from
 * the user's image, with no network, the user's workspace read-only, a tmpfs
 * home, and its own queue and channel directory (it never sees the user's
 * sandbox's session sockets). It is removed when the session ends (and removes
 * itself when its runner idles out after a host died). When the session's
 * server has egress of its own (`restrictedAttachment`), its network is
 * still "none": its runner bridges the proxy port to the identity's socket,
 * as a sandbox's does, and the egress proxy (loaded only then) serves it.
 *
 * @module
 */
import { join } from "../path.ts";
import { loadConfig, type SandboxConfig } from "../config/config.ts";
import { DockerClient } from "../docker/mod.ts";
import { egressLaunch } from "../config/egress_launch.ts";
import type { EgressAttachment } from "../config/egress_types.ts";
import { RunnerError } from "../errors.ts";
import { processMark } from "../process_mark.ts";
import type { Backend } from "../queue/backend.ts";
import { Queue } from "../queue/queue.ts";
import { resolveImage } from "../lifecycle/ensure.ts";
import { restrictedChannelDir, type StatePaths, statePaths } from "../lifecycle/identity.ts";
import { sandboxKey } from "../config/sandbox_key.ts";
import { withLock } from "../lifecycle/lock.ts";
import { containerEgress } from "../lifecycle/egress_mounts.ts";
import type { ContainerEgress } from "../lifecycle/egress_record.ts";
import { containerSpec } from "../lifecycle/posture.ts";
import { removeTree } from "../lifecycle/remove_tree.ts";
import { prepareState } from "../lifecycle/state_dir.ts";
import { makeChannelDir, removeChannelDir } from "../queue/channel.ts";

/** A restricted container: a backend whose `close` removes it and its queue. */
export interface RestrictedSandbox extends Backend {
  /** The container's name. */
  readonly name: string;
  /** Removes the container and its queue directory; resolves when both are gone. */
  dispose(): Promise<void>;
}

/** Options for {@linkcode openRestricted}. */
export interface RestrictedOptions {
  /** Tenant id; default "default". */
  tenant?: string;
  /** Configuration overrides. */
  config?: Partial<SandboxConfig>;
  /** Docker client; default from `DOCKER_HOST`. */
  docker?: DockerClient;
  /** How long to wait for the runner's first heartbeat; default 20 s. */
  readyTimeoutMs?: number;
  /**
   * The session's own egress identity (`restrictedAttachment`); undefined:
   * none, the container reaches nothing.
   */
  egress?: EgressAttachment | undefined;
}

/**
 * Starts a restricted container for one session of a user.
 *
 * @example
 * ```ts ignore
 * const egress = restrictedAttachment(whole, { tenant: "default", user: "alice", server: "fetch" });
 * const session = await openRestricted("alice", { config: whole.sandbox, egress });
 * try { await QueueSession.open(session, { argv: ["fetch-server"] }); } finally { await session.dispose(); }
 * ```
 *
 * @param user The user whose workspace it sees (read-only).
 * @param options Tenant, config, Docker client and the session's egress identity.
 * @returns A backend serving the container's own queue.
 * @throws {RunnerError} When the runner stops or sends no heartbeat in time.
 * @throws {DockerError} When the container, or the egress proxy it needs, cannot be started.
 * @throws {UncoverableVolumeError} When the image has a VOLUME no capped tmpfs can cover.
 */
export async function openRestricted(
  user: string,
  options: RestrictedOptions = {},
): Promise<RestrictedSandbox> {
  const config = loadConfig(options.config);
  const docker = options.docker ?? new DockerClient();
  const key = sandboxKey(options.tenant ?? "default", user, { home: config.home });
  const paths = statePaths(config.home, key);
  // An image waffle cannot run is refused before anything is made.
  const image = await resolveImage(docker, config.image);
  Deno.mkdirSync(paths.root, { recursive: true, mode: 0o700 });
  Deno.mkdirSync(config.mcpCache, { recursive: true, mode: 0o755 });
  // The user's volume (and so the workspace) must be there to be shown.
  await withLock(paths.lock, () => prepareState(paths, { quotaBytes: config.quotaBytes }));
  // On the user's quota volume: a compromised runner fills that, not the host's disk.
  const parent = join(paths.volume, "restricted");
  await removeLeftovers(docker, { parent, prefix: key.containerName, paths });
  const id = crypto.randomUUID().slice(0, 12);
  const dir = join(parent, id);
  Deno.mkdirSync(dir, { recursive: true, mode: 0o700 });
  // Which host process owns it: a leftover is one whose owner is gone.
  Deno.writeTextFileSync(join(dir, OWNER_FILE), processMark(Deno.pid) ?? "", { mode: 0o600 });
  // Its own: the user's sandbox's sockets are never in its reach, nor the reverse.
  const channel = restrictedChannelDir(paths, id);
  makeChannelDir(channel);
  const queue = Queue.open(dir, { create: true });
  let containerId: string | undefined;
  const dispose = async (): Promise<void> => {
    queue.close();
    if (containerId !== undefined) {
      await docker.removeContainer(containerId, { force: true }).catch(() => {});
    }
    removeChannelDir(channel);
    // The runner shaped its queue: never a recursive delete in this process.
    await removeTree(dir).catch(() => false);
  };
  let name = "";
  try {
    const spec = containerSpec(key, {
      config,
      image,
      paths: { ...paths, queue: dir, outbound: queue.paths.outboundDir, channel },
      restricted: { id },
      egress: await attachEgress(docker, { attachment: options.egress, config }),
    });
    name = spec.name;
    containerId = await docker.createContainer(spec.name, spec.body);
    await docker.startContainer(containerId);
    await waitAlive(queue, docker, containerId, options.readyTimeoutMs ?? 20_000);
    await queue.syncGeneration();
  } catch (error) {
    await dispose();
    throw error;
  }
  return {
    name,
    queue,
    // A restricted runner is never restarted: its session ends with it.
    ensure: () => Promise.resolve(),
    submit: (request) => queue.submit(request),
    close: () => queue.close(),
    channelDir: channel,
    dispose,
  };
}

// The session's socket directory, policy file and the proxy serving them,
// before its container is created (the socket directory is a mount of it).
async function attachEgress(
  docker: DockerClient,
  options: { attachment: EgressAttachment | undefined; config: SandboxConfig },
): Promise<ContainerEgress | undefined> {
  const { attachment, config } = options;
  if (attachment === undefined) return undefined;
  const { ensureEgress } = await import("../egress/supervisor.ts");
  await ensureEgress(docker, attachment, { home: config.home, config });
  return containerEgress(egressLaunch(config.home, attachment));
}

/** Names the host process that owns a restricted session's directory. */
const OWNER_FILE = "owner";

// Restricted sessions whose host process is gone: their container (which a
// hostile runner may keep alive past its lease) and their directory go.
async function removeLeftovers(
  docker: DockerClient,
  options: { parent: string; prefix: string; paths: StatePaths },
): Promise<void> {
  const { parent, prefix, paths } = options;
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(parent)];
  } catch {
    return;
  }
  for (const entry of entries) {
    if (!entry.isDirectory || !/^[0-9a-f-]{12}$/.test(entry.name)) continue;
    let owner: string;
    try {
      owner = Deno.readTextFileSync(join(parent, entry.name, OWNER_FILE)).trim();
    } catch {
      // No owner yet: a session of another process is being set up.
      continue;
    }
    const pid = Number(owner.split(" ")[0]);
    if (Number.isSafeInteger(pid) && pid > 0 && processMark(pid) === owner) continue;
    await docker.removeContainer(`${prefix}-r-${entry.name}`, { force: true }).catch(() => false);
    removeChannelDir(restrictedChannelDir(paths, entry.name));
    removeTree(join(parent, entry.name), { background: true }).catch(() => false);
  }
}

async function waitAlive(
  queue: Queue,
  docker: DockerClient,
  id: string,
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (let checks = 1; Date.now() < deadline; checks++) {
    if (queue.liveness().state === "alive") return;
    if (checks % 25 === 0 && !(await docker.inspectContainer(id))?.State.Running) {
      throw new RunnerError(`Restricted container '${id.slice(0, 12)}' stopped during start`);
    }
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new RunnerError(
    `Restricted container '${id.slice(0, 12)}' sent no heartbeat within ${timeoutMs} ms`,
  );
}
