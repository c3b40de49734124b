/**
 * Operations over every waffle container on the daemon: list, sweep, stop,
 * remove. They work from labels and the state directories alone, so a fresh
 * host process reconciles containers it never saw (or whose host died).
 *
 * @module
 */
import type { SandboxConfig } from "../config/config.ts";
import type { DockerClient } from "../docker/mod.ts";
import { QueueError, SandboxFileError, UsageError } from "../errors.ts";
import { messageOf, openDatabase } from "../queue/connection.ts";
import { readHeartbeat as readBeat, readInFlight } from "../queue/outbound_rows.ts";
import { type Heartbeat, MAX_CHUNK_BYTES } from "../queue/protocol.ts";
import { SandboxFile } from "../queue/sandbox_file.ts";
import { OUTBOUND_SCHEMA, queuePaths } from "../queue/schema.ts";
import { MAX_OUTBOUND_BYTES, submittedAndOpen } from "../queue/queue.ts";
import type { DatabaseSync } from "node:sqlite";
import { incompatibility, ownedBy } from "./ensure.ts";
import { type SandboxKey, sandboxKey, stateLayout, statePaths } from "./identity.ts";
import { removeVolume } from "./quota.ts";
import { withLock } from "./lock.ts";
import { containerSpec, hostCanChown, LABELS, SANDBOX_UID } from "./posture.ts";
import { stateExists } from "./state_dir.ts";

/** One sandbox container as `waffle ps` shows it. */
export interface SandboxStatus {
  /** Tenant id from the container's label (`?` when missing). */
  tenant: string;
  /** User id from the container's label (`?` when missing). */
  user: string;
  /** The container's id. */
  containerId: string;
  /** The container's name. */
  name: string;
  /** Docker state: running, exited, paused, created, dead, restarting. */
  state: string;
  /** Id of the image the container was created from. */
  imageId: string;
  /** Time of the runner's last heartbeat (ms since epoch), or null. */
  lastHeartbeat: number | null;
  /** How long the runner has had nothing to do, in ms; null while busy or unknown. */
  idleMs: number | null;
  /** The sandbox's state root on the host, from the container's label (empty when missing). */
  statePath: string;
}

// What a sandbox's runner last wrote, read without waiting on any lock and
// without touching anything but its outbound file (see sandbox_file.ts): a
// hostile sandbox can make this undefined, never slow.
function peekRunner<T>(
  root: string,
  read: Parameters<SandboxFile["read"]>[0],
  options: { busy?: "retry" } = {},
): T | undefined {
  const file = new SandboxFile(`${stateLayout(root).outbound}/outbound.db`, {
    schema: OUTBOUND_SCHEMA,
    maxValueBytes: 16 * MAX_CHUNK_BYTES,
    maxFileBytes: MAX_OUTBOUND_BYTES,
  });
  try {
    return file.read(read) as T;
  } catch (error) {
    // `retry`: undefined only for a file locked now; anything else reads as empty.
    if (
      options.busy === "retry" && !(error instanceof SandboxFileError && error.problem === "busy")
    ) {
      return [] as T;
    }
    return undefined;
  } finally {
    file.close();
  }
}

/** How many times a sweep looks at a locked queue file before calling it idle. */
const BUSY_TRIES = 10;

/**
 * Lists every waffle-labelled container with its runner's liveness.
 *
 * @param docker The Docker client.
 * @param options Config (for the state root of this waffle home).
 * @returns One status per container, sorted by tenant and user.
 */
export async function listSandboxes(
  docker: DockerClient,
  options: { config: SandboxConfig; now?: number },
): Promise<SandboxStatus[]> {
  const now = options.now ?? Date.now();
  const containers = await docker.listContainers({ all: true, labels: [LABELS.key] });
  return containers.map((summary) => {
    const statePath = summary.Labels[LABELS.state] ?? "";
    const beat = stateExists(statePath) ? peekRunner<Heartbeat>(statePath, readBeat) : undefined;
    const idleMs = beat === undefined
      ? null
      : beat.idleSince === null
      ? null
      : Math.max(0, now - beat.idleSince);
    return {
      tenant: summary.Labels[LABELS.tenant] ?? "?",
      user: summary.Labels[LABELS.user] ?? "?",
      containerId: summary.Id,
      name: (summary.Names[0] ?? "").replace(/^\//, ""),
      state: summary.State,
      imageId: summary.ImageID,
      lastHeartbeat: beat?.time ?? null,
      idleMs,
      statePath,
    };
  }).sort((a, b) => `${a.tenant}/${a.user}`.localeCompare(`${b.tenant}/${b.user}`));
}

/** One thing sweep did (or decided not to do). */
export interface SweepAction {
  /** Tenant id of the sandbox. */
  tenant: string;
  /** User id of the sandbox. */
  user: string;
  /** The container's id. */
  containerId: string;
  /** What sweep did to the container. */
  action: "stopped" | "removed" | "kept";
  /** Why, for the operator. */
  reason: string;
}

/** Options for {@linkcode sweep}. */
export interface SweepOptions {
  /** The waffle home, image and default thresholds to sweep against. */
  config: SandboxConfig;
  /** Stop running containers idle at least this long; default the config's idle time; 0 never. */
  idleSeconds?: number;
  /** Stop least recently used running containers beyond this many; default the config's; 0 no cap. */
  maxRunning?: number;
  /** The current time in ms since epoch, for idle times; default `Date.now()`. */
  now?: number;
}

/**
 * Reconciles every labelled container: removes paused, dead, restarting and
 * incompatible ones (image or posture changed) and those whose state
 * directory is gone; stops idle ones; enforces the running cap by stopping
 * the least recently used. A container with a request in flight is never
 * stopped or removed by sweep.
 *
 * @param docker The Docker client.
 * @param options Config, thresholds.
 * @returns What was done to each container.
 */
export async function sweep(docker: DockerClient, options: SweepOptions): Promise<SweepAction[]> {
  const { config } = options;
  const idleMs = (options.idleSeconds ?? config.idleSeconds) * 1000;
  const cap = options.maxRunning ?? config.maxRunning;
  const image = await docker.inspectImage(config.image);
  const actions: SweepAction[] = [];
  const running: { status: SandboxStatus; key: SandboxKey }[] = [];
  for (
    const status of await listSandboxes(
      docker,
      options.now === undefined ? { config } : { config, now: options.now },
    )
  ) {
    const record = (action: SweepAction["action"], reason: string): void => {
      actions.push({
        tenant: status.tenant,
        user: status.user,
        containerId: status.containerId,
        action,
        reason,
      });
    };
    const key = sandboxKey(status.tenant, status.user, { home: config.home });
    const paths = statePaths(config.home, key);
    if (status.statePath !== paths.root) {
      // Labelled by another waffle home: not ours to judge beyond removal of orphans.
      if (!stateExists(status.statePath)) {
        await docker.removeContainer(status.containerId, { force: true });
        record("removed", "state directory is gone");
      } else record("kept", "belongs to another WAFFLE_HOME");
      continue;
    }
    await withLock(paths.lock, async () => {
      const container = await docker.inspectContainer(status.containerId);
      if (container === null) return;
      if (!stateExists(paths.root)) {
        await docker.removeContainer(container.Id, { force: true });
        return record("removed", "state directory is gone");
      }
      const busy = container.State.Running && await inFlight(paths.root) > 0;
      const expected = image === null ? undefined : {
        imageId: image.id,
        postureHash: containerSpec(key, { config, imageId: image.id, paths }).postureHash,
      };
      const reason = expected === undefined
        ? "image missing"
        : incompatibility(container, expected);
      if (
        reason !== undefined &&
        !(busy && (reason === "image changed" || reason === "posture changed"))
      ) {
        await docker.removeContainer(container.Id, { force: true });
        return record("removed", reason);
      }
      if (!container.State.Running) {
        return record("kept", `not running (${container.State.Status})`);
      }
      if (busy) return record("kept", "request in flight");
      if (idleMs > 0 && status.idleMs !== null && status.idleMs >= idleMs) {
        await docker.stopContainer(container.Id, { timeoutSeconds: 10 });
        return record("stopped", `idle for ${Math.round(status.idleMs / 1000)} s`);
      }
      running.push({ status, key });
    });
  }
  if (cap > 0 && running.length > cap) {
    // Least recently used first: the longest idle; busy ones last.
    running.sort((a, b) => (b.status.idleMs ?? -1) - (a.status.idleMs ?? -1));
    for (const { status, key } of running.slice(0, running.length - cap)) {
      const paths = statePaths(config.home, key);
      await withLock(paths.lock, async () => {
        if (await inFlight(paths.root) > 0) return;
        await docker.stopContainer(status.containerId, { timeoutSeconds: 10 });
        actions.push({
          tenant: status.tenant,
          user: status.user,
          containerId: status.containerId,
          action: "stopped",
          reason: `over the cap of ${cap} running`,
        });
      });
    }
  }
  return actions;
}

async function inFlight(root: string): Promise<number> {
  // A runner mid-commit holds its file for a moment: look again, briefly,
  // rather than call a busy sandbox idle. (A missing or damaged file has
  // nothing in flight that the host could know of.)
  let ids: string[] | undefined;
  for (let tries = 0; ids === undefined && tries < BUSY_TRIES; tries++) {
    if (tries > 0) await new Promise((resolve) => setTimeout(resolve, 20));
    ids = peekRunner<string[]>(root, readInFlight, { busy: "retry" });
  }
  ids ??= [];
  if (ids.length === 0) return 0;
  let inbound: DatabaseSync | undefined;
  try {
    inbound = openDatabase(queuePaths(stateLayout(root).queue).inbound, { role: "reader" });
    return submittedAndOpen(inbound, ids).length;
  } catch {
    // Cannot check now: never stop what may be busy.
    return ids.length;
  } finally {
    inbound?.close();
  }
}

/**
 * Stops a user's container gracefully (SIGTERM: the runner records running
 * requests as interrupted). The container stays adoptable.
 *
 * @param docker The Docker client.
 * @param key Whose sandbox.
 * @param options Config.
 * @returns True when a running container was stopped.
 */
export async function stopSandbox(
  docker: DockerClient,
  key: SandboxKey,
  options: { config: SandboxConfig },
): Promise<boolean> {
  const paths = statePaths(options.config.home, key);
  return await withLock(paths.lock, async () => {
    const container = await docker.inspectContainer(key.containerName);
    // The name may be held by the same (tenant, user) of another WAFFLE_HOME: not ours.
    if (container === null || !ownedBy(container, paths.root)) {
      throw new UsageError(`No sandbox for user '${key.user}' of tenant '${key.tenant}'`);
    }
    return await docker.stopContainer(container.Id, { timeoutSeconds: 10 });
  });
}

/**
 * Removes a user's container; with `purge`, also their state (queue and workspace).
 *
 * @param docker The Docker client.
 * @param key Whose sandbox.
 * @param options Config and purge.
 * @returns True when a container was removed.
 */
export async function removeSandbox(
  docker: DockerClient,
  key: SandboxKey,
  options: { config: SandboxConfig; purge?: boolean },
): Promise<boolean> {
  const paths = statePaths(options.config.home, key);
  return await withLock(paths.lock, async () => {
    // The name may be held by the same (tenant, user) of another WAFFLE_HOME: leave that one.
    const container = await docker.inspectContainer(key.containerName);
    const ours = container !== null && ownedBy(container, paths.root);
    if (options.purge && ours && !hostCanChown()) {
      // A host that is not root cannot delete what commands wrote (uid
      // SANDBOX_UID): empty the workspace as that uid, inside the container.
      if (!container.State.Running) await docker.startContainer(container.Id);
      await docker.exec(container.Id, [
        "/bin/sh",
        "-c",
        "chmod -R u+rwX /workspace; find /workspace -mindepth 1 -maxdepth 1 -exec rm -rf {} +",
      ], { user: `${SANDBOX_UID}:${SANDBOX_UID}`, timeoutMs: 60_000 });
    }
    const removed = ours && await docker.removeContainer(container.Id, { force: true });
    if (options.purge) {
      await removeVolume(paths.root);
      try {
        await Deno.remove(paths.root, { recursive: true });
      } catch (error) {
        if (!(error instanceof Deno.errors.NotFound)) {
          throw new QueueError(`Cannot purge sandbox state '${paths.root}': ${messageOf(error)}`, {
            cause: error,
          });
        }
      }
    }
    return removed;
  });
}
