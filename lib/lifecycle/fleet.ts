/**
 * Operations over the waffle containers on the daemon: list, sweep, stop
 * (removal, which also forgets an egress identity, is
 * `lib/sandbox/remove.ts`'s). They work from labels and the state
 * directories alone, so a fresh host process reconciles containers it never
 * saw (or whose host died).
 *
 * Several waffle homes can share one daemon (CI runs, two users of one
 * machine, tests). `listSandboxes` and `sweep` act on this home's containers
 * (by the home their `waffle.state` label names, see `container_home.ts`)
 * unless asked for `all`; `stopSandbox` (and `removeSandbox`) only ever act
 * on this home's. Restricted sessions' containers carry no `waffle.key` label
 * and none of these lists them.
 *
 * What they read of each sandbox is small and the host's own wherever it can
 * be: the runner's liveness from its heartbeat file (`judgeRunner`, the one
 * judgement every caller uses), the last use from the host's record of it
 * (`use_mark.ts`), open requests from the host's `inbound.db`, and
 * `outbound.db` only to narrow an open request down to one
 * the runner still runs, bounded by what those requests asked for. One
 * sandbox that cannot be read is reported as such; the others go on.
 *
 * @module
 */
import type { SandboxConfig } from "../config/config.ts";
import type { DockerClient } from "../docker/mod.ts";
import { SandboxFileError, UsageError } from "../errors.ts";
import { messageOf, openDatabase } from "../queue/connection.ts";
import { judgeRunner, type Liveness, STALE_AFTER_MS } from "../queue/liveness.ts";
import { openRequestCount, outboundAllowance, submittedAndOpen } from "../queue/open_requests.ts";
import { readInFlight } from "../queue/outbound_rows.ts";
import { MAX_CHUNK_BYTES } from "../queue/protocol.ts";
import { SandboxFile } from "../queue/sandbox_file.ts";
import { lastUse } from "../queue/use_mark.ts";
import { INBOUND_UPGRADES, OUTBOUND_SCHEMA, type QueuePaths, queuePaths } from "../queue/schema.ts";
import type { DatabaseSync } from "node:sqlite";
import { containerHome, homeMatcher } from "./container_home.ts";
import { incompatibility, ownedBy, unusableState } from "./ensure.ts";
import { stateLayout, type StatePaths, statePaths } from "./identity.ts";
import { type SandboxKey, sandboxKey } from "../config/sandbox_key.ts";
import { withLock } from "./lock.ts";
import { clearPause } from "./pause_record.ts";
import { containerSpec, findUncoverableVolume, type ImageFacts, LABELS } from "./posture.ts";
import { escapeControls } from "../terminal/control_text.ts";
import { countSnapshots } from "./snapshot_store.ts";
import { stateExists } from "./state_dir.ts";
import { readBinding } from "./pool.ts";

/** One sandbox container as `waffle ps` shows it. */
export interface SandboxStatus {
  /**
   * The waffle home the container's labels place it in (its `waffle.state`
   * root's home); null when they are missing or malformed and place it in none.
   */
  home: string | null;
  /** Whether that home is this process's `WAFFLE_HOME` (the same directory, however spelled). */
  thisHome: boolean;
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
  /** The runner as `judgeRunner` judges it; `unknown` when its state cannot be read. */
  runner: Liveness["state"] | "unknown";
  /** When the runner's heartbeat last changed, by the host's clock (ms since epoch), or null. */
  lastHeartbeat: number | null;
  /** Requests open by the host's own record: submitted, neither acknowledged nor lost. */
  openRequests: number;
  /**
   * When a host last used this sandbox (submitted, sent input, renewed a
   * session, cancelled, collected a result): the host's own record, a file
   * in the state root that no container mounts (`queue/use_mark.ts`); never
   * a write of the queue's housekeeping. Null when unknown.
   */
  lastUsed: number | null;
  /** How long since {@linkcode SandboxStatus.lastUsed}, in ms, while no request is open; else null. */
  idleMs: number | null;
  /** The sandbox's state root on the host, from the container's label (empty when missing). */
  statePath: string;
  /** How many workspace snapshots the sandbox keeps (see `snapshot.ts`). */
  snapshots: number;
  /** Why the sandbox's state could not be read, when it could not. */
  problem?: string;
  /**
   * A warm pool's member (`pool.ts`): its template, and whether a user took
   * it (then `tenant` and `user` are that user's, from the binding in its
   * host-only state root; else the pool's own).
   */
  pool?: { template: string; taken: boolean };
}

/** What a sandbox's state directory says, as {@linkcode listSandboxes} reports it. */
type StateView = Pick<
  SandboxStatus,
  "runner" | "lastHeartbeat" | "openRequests" | "lastUsed" | "idleMs" | "problem"
>;

function queueOf(root: string): QueuePaths {
  const layout = stateLayout(root);
  return queuePaths(layout.queue, { outboundDir: layout.outbound });
}

// Reads what ps and sweep need: the heartbeat file (at most a kilobyte), the
// host's record of use and its own inbound.db. Never outbound.db, whatever its size.
function viewState(root: string, now: number): StateView {
  const paths = queueOf(root);
  const judged = judgeRunner(paths.heartbeat, { queue: paths.dir, now });
  const view: StateView = {
    runner: judged.state,
    lastHeartbeat: judged.changedAt ?? null,
    openRequests: 0,
    lastUsed: null,
    idleMs: null,
  };
  let inbound: DatabaseSync | undefined;
  try {
    // Before the open, which may upgrade an older inbound.db (a write).
    view.lastUsed = lastUseOf(root, paths);
    inbound = openInbound(paths.inbound);
    view.openRequests = openRequestCount(inbound);
    if (view.openRequests === 0 && view.lastUsed !== null) {
      view.idleMs = Math.max(0, now - view.lastUsed);
    }
  } catch (error) {
    view.problem = `Cannot read '${paths.inbound}': ${messageOf(error)}`;
  } finally {
    inbound?.close();
  }
  return view;
}

// The host's record of use; a sandbox an older waffle made and nobody used
// since has none, and falls back to what that waffle kept: inbound.db's mtime.
function lastUseOf(root: string, paths: QueuePaths): number | null {
  const marked = lastUse(stateLayout(root).useMark);
  if (marked !== undefined) return marked;
  return Deno.statSync(paths.inbound).mtime?.getTime() ?? null;
}

function unreadable(problem: string): StateView {
  return {
    runner: "unknown",
    lastHeartbeat: null,
    openRequests: 0,
    lastUsed: null,
    idleMs: null,
    problem,
  };
}

/** Options for {@linkcode listSandboxes}. */
export interface ListSandboxesOptions {
  /** The config of this waffle home. */
  config: SandboxConfig;
  /** Every home's containers on the daemon (and those placed in none); default this home's only. */
  all?: boolean;
  /** The current time in ms since epoch, for idle times; default `Date.now()`. */
  now?: number;
}

/**
 * Lists this home's waffle-labelled containers (with `all`, every home's)
 * with their runner's liveness and the host's record of their use. A
 * container whose labels place it in no home is listed only with `all`, and
 * its state is never read (its labels may name any path).
 *
 * @example
 * ```ts ignore
 * const mine = await listSandboxes(new DockerClient(), { config: loadConfig() });
 * ```
 *
 * @param docker The Docker client.
 * @param options Config (this waffle home), `all`.
 * @returns One status per container, sorted by home, tenant and user.
 */
export async function listSandboxes(
  docker: DockerClient,
  options: ListSandboxesOptions,
): Promise<SandboxStatus[]> {
  const now = options.now ?? Date.now();
  const ours = homeMatcher(options.config.home);
  const containers = await docker.listContainers({ all: true, labels: [LABELS.key] });
  const rows: SandboxStatus[] = [];
  for (const summary of containers) {
    const placed = containerHome(summary.Labels);
    const thisHome = ours(placed.home);
    if (!thisHome && options.all !== true) continue;
    const statePath = summary.Labels[LABELS.state] ?? "";
    let view: StateView;
    try {
      if (placed.home === null) view = unreadable(placed.problem);
      else if (!stateExists(statePath)) view = unreadable(`State directory '${statePath}' is gone`);
      else view = viewState(statePath, now);
    } catch (error) {
      view = unreadable(messageOf(error));
    }
    const template = summary.Labels[LABELS.pool];
    const binding = template !== undefined && placed.home !== null
      ? readBinding(statePath)
      : undefined;
    rows.push({
      home: placed.home,
      thisHome,
      tenant: binding?.tenant ?? summary.Labels[LABELS.tenant] ?? "?",
      user: binding?.user ?? summary.Labels[LABELS.user] ?? "?",
      ...(template === undefined ? {} : { pool: { template, taken: binding !== undefined } }),
      containerId: summary.Id,
      name: (summary.Names[0] ?? "").replace(/^\//, ""),
      state: summary.State,
      imageId: summary.ImageID,
      ...view,
      statePath,
      snapshots: placed.home === null ? 0 : countSnapshots(statePath),
    });
  }
  return rows.sort((a, b) =>
    (a.home ?? "").localeCompare(b.home ?? "") ||
    `${a.tenant}/${a.user}`.localeCompare(`${b.tenant}/${b.user}`)
  );
}

/** One thing sweep did (or decided not to do). */
export interface SweepAction {
  /** The home the container's labels place it in; null when none (see {@linkcode SandboxStatus.home}). */
  home: string | null;
  /** Whether that home is this process's `WAFFLE_HOME`; false only under `all`. */
  thisHome: boolean;
  /** Tenant id of the sandbox. */
  tenant: string;
  /** User id of the sandbox. */
  user: string;
  /** The container's id. */
  containerId: string;
  /** What sweep did to the container; `failed` when it could not judge or act on it. */
  action: "stopped" | "removed" | "kept" | "failed";
  /** Why, for the operator. */
  reason: string;
}

/** Options for {@linkcode sweep}. */
export interface SweepOptions {
  /** The waffle home, image and default thresholds to sweep against. */
  config: SandboxConfig;
  /** Stop running containers idle at least this long; default the config's idle time; 0 never. */
  idleSeconds?: number;
  /**
   * Stop least recently used running containers beyond this many; default
   * the config's; 0 no cap. It counts this home's running containers, or
   * with `all` every home's on the daemon.
   */
  maxRunning?: number;
  /**
   * Sweep every home's containers on the daemon, not only this home's: the
   * same rules and thresholds, but another home's image and posture are not
   * judged (only its own config knows them). Each action names its home.
   */
  all?: boolean;
  /** The current time in ms since epoch, for idle times; default `Date.now()`. */
  now?: number;
}

/** What sweep needs to judge one sandbox. */
interface SweepContext {
  docker: DockerClient;
  config: SandboxConfig;
  idleMs: number;
  image: ImageFacts | null;
}

/** A container its labels place in a home, with the state paths (and lock) of that home. */
interface Placed {
  status: SandboxStatus;
  paths: StatePaths;
}

/**
 * Reconciles this home's labelled containers (with `all`, every home's on
 * the daemon): keeps paused ones (see `pause.ts`); removes dead, restarting and incompatible ones (image
 * or posture changed, or an image waffle refuses for a VOLUME no capped
 * tmpfs can cover; judged for this home's only) and those whose state
 * directory is gone; stops those whose runner is dead (by the one liveness
 * judgement, whatever its files say) and idle ones; enforces the running cap
 * by stopping the least recently used. Each container is judged under its
 * own home's lock. A container whose live runner has a request in flight is
 * never stopped or removed. One whose labels place it in no home is kept. A
 * sandbox sweep cannot judge or act on is reported `failed` and the sweep
 * goes on.
 *
 * @example
 * ```ts ignore
 * const actions = await sweep(new DockerClient(), { config: loadConfig(), idleSeconds: 600 });
 * ```
 *
 * @param docker The Docker client.
 * @param options Config, thresholds, `all`.
 * @returns What was done to each container.
 */
export async function sweep(docker: DockerClient, options: SweepOptions): Promise<SweepAction[]> {
  const { config } = options;
  const context: SweepContext = {
    docker,
    config,
    idleMs: (options.idleSeconds ?? config.idleSeconds) * 1000,
    image: await docker.inspectImage(config.image),
  };
  const actions: SweepAction[] = [];
  const record = (status: SandboxStatus, action: SweepAction["action"], reason: string): void => {
    const { home, thisHome, tenant, user, containerId } = status;
    actions.push({ home, thisHome, tenant, user, containerId, action, reason });
  };
  const running: Placed[] = [];
  const statuses = await listSandboxes(docker, {
    config,
    all: options.all === true,
    ...(options.now === undefined ? {} : { now: options.now }),
  });
  for (const status of statuses) {
    try {
      const verdict = await sweepOne(status, context);
      if (Array.isArray(verdict)) record(status, verdict[0], verdict[1]);
      else running.push(verdict);
    } catch (error) {
      record(status, "failed", messageOf(error));
    }
  }
  const cap = options.maxRunning ?? config.maxRunning;
  const where = options.all === true ? "on this daemon" : "in this home";
  for (const { status, paths } of overCap(running, cap)) {
    try {
      const stopped = await withLock(paths.lock, async () => {
        if (await inFlight(status.statePath) > 0) return false;
        return await docker.stopContainer(status.containerId, { timeoutSeconds: 10 });
      });
      if (stopped) record(status, "stopped", `over the cap of ${cap} running ${where}`);
    } catch (error) {
      record(status, "failed", messageOf(error));
    }
  }
  return actions;
}

// The paths of the sandbox a placed container's labels name, in its own
// home: its root is the container's label, its lock that home's.
function placedOf(status: SandboxStatus, home: string): Placed {
  const key = sandboxKey(status.tenant, status.user, { home });
  return { status, paths: statePaths(home, key) };
}

// Least recently used first: the longest idle; those with open requests last.
function overCap(running: Placed[], cap: number): Placed[] {
  if (cap <= 0 || running.length <= cap) return [];
  const sorted = [...running].sort((a, b) => (b.status.idleMs ?? -1) - (a.status.idleMs ?? -1));
  return sorted.slice(0, running.length - cap);
}

// Decides (and does) what sweep does to one sandbox; the sandbox itself
// when it stays up and counts towards the cap.
async function sweepOne(
  status: SandboxStatus,
  context: SweepContext,
): Promise<Placed | [SweepAction["action"], string]> {
  const { docker, config } = context;
  if (status.home === null) return ["kept", `labels name no home: ${status.problem}`];
  // A ready member is idle by design and of its template's config: its
  // filler judges and replaces it (`pool_fill.ts`).
  if (status.pool !== undefined && !status.pool.taken) return ["kept", "warm pool member"];
  const placed = placedOf(status, status.home);
  const { paths } = placed;
  if (!status.thisHome && !stateExists(paths.root)) {
    // Another home's orphan: removed without its lock, which would make
    // that (perhaps deleted) home's directory anew.
    await docker.removeContainer(status.containerId, { force: true });
    return ["removed", "state directory is gone"];
  }
  // Image and posture are judged only against the config that made them:
  // this home's, spelled as this process spells it (the root is in the posture).
  const ownKey = sandboxKey(status.tenant, status.user, { home: config.home });
  const ownPaths = statePaths(config.home, ownKey);
  const judgePosture = status.thisHome && ownPaths.root === paths.root;
  return await withLock(paths.lock, async () => {
    const container = await docker.inspectContainer(status.containerId);
    if (container === null) return ["kept", "gone meanwhile"];
    if (!stateExists(paths.root)) {
      await docker.removeContainer(container.Id, { force: true });
      return ["removed", "state directory is gone"];
    }
    // Frozen on purpose: its silent heartbeat is no death, and it waits for a resume.
    if (container.State.Paused) return ["kept", "paused"];
    const now = Date.now();
    const judged = judgeRunner(queueOf(paths.root).heartbeat, { queue: paths.root, now });
    const started = Date.parse(container.State.StartedAt);
    // A runner that has had its chance to beat and does not is dead, whatever it wrote.
    const dead = judged.state === "stale" || judged.state === "exited" ||
      (judged.state === "none" && !(now - started < STALE_AFTER_MS));
    const busy = container.State.Running && !dead && await inFlight(paths.root) > 0;
    const image = context.image;
    const refused = image === null ? undefined : findUncoverableVolume(image);
    const reason = !judgePosture
      ? unusableState(container.State)
      : image === null
      ? "image missing"
      : refused !== undefined
      // Made by a waffle that let Docker give it an uncapped volume.
      ? `image refused: VOLUME '${escapeControls(refused.volume)}' is ${refused.reason}`
      : incompatibility(container, {
        imageId: image.id,
        postureHash: containerSpec(ownKey, { config, image, paths: ownPaths }).postureHash,
      });
    if (
      reason !== undefined &&
      !(busy && (reason === "image changed" || reason === "posture changed"))
    ) {
      await docker.removeContainer(container.Id, { force: true });
      return ["removed", reason];
    }
    if (!container.State.Running) return ["kept", `not running (${container.State.Status})`];
    if (dead) {
      // Nothing it holds can finish: its waiting hosts would kill it too.
      await docker.stopContainer(container.Id, { timeoutSeconds: 2 });
      return ["stopped", `runner ${judged.state}: ${judged.detail}`];
    }
    if (busy) return ["kept", "request in flight"];
    if (status.problem !== undefined) return ["kept", `cannot judge: ${status.problem}`];
    // Idle since the host's last use, once nothing it submitted still runs
    // (a detached request never collected does not keep a sandbox up).
    const idleFor = status.lastUsed === null ? null : Math.max(0, now - status.lastUsed);
    if (context.idleMs > 0 && idleFor !== null && idleFor >= context.idleMs) {
      await docker.stopContainer(container.Id, { timeoutSeconds: 10 });
      return ["stopped", `idle for ${Math.round(idleFor / 1000)} s`];
    }
    return placed;
  });
}

/** How many times a sweep looks at a locked queue file before calling it busy. */
const BUSY_TRIES = 10;
/** Largest outbound.db a sweep reads to see what still runs; a larger one counts as busy. */
const SWEEP_READ_BYTES = 4 * 1024 * 1024;

function sizeOf(path: string): number {
  try {
    return Deno.lstatSync(path).size;
  } catch {
    return 0;
  }
}

// Requests the runner still runs, among those the host holds open. Nothing
// open: nothing to ask the runner. Otherwise outbound.db is read, at most
// SWEEP_READ_BYTES of it (a larger file counts as busy, never copied); a file
// locked on every try counts as busy (never stop what may be busy), a missing
// or damaged one as idle.
async function inFlight(root: string): Promise<number> {
  const paths = queueOf(root);
  let inbound: DatabaseSync | undefined;
  try {
    inbound = openInbound(paths.inbound);
    const open = openRequestCount(inbound);
    if (open === 0) return 0;
    // Never a big copy: a file over the small cap may be busy, and is kept.
    const cap = Math.min(outboundAllowance(inbound), SWEEP_READ_BYTES);
    if (sizeOf(paths.outbound) > cap) return open;
    const file = new SandboxFile(paths.outbound, {
      schema: OUTBOUND_SCHEMA,
      maxValueBytes: 16 * MAX_CHUNK_BYTES,
      maxFileBytes: cap,
    });
    try {
      for (let tries = 0; tries < BUSY_TRIES; tries++) {
        if (tries > 0) await new Promise((resolve) => setTimeout(resolve, 20));
        try {
          return submittedAndOpen(inbound, file.read(readInFlight)).length;
        } catch (error) {
          if (!(error instanceof SandboxFileError && error.problem === "busy")) return 0;
        }
      }
      return open;
    } finally {
      file.close();
    }
  } catch {
    // Cannot check now: never stop what may be busy.
    return 1;
  } finally {
    inbound?.close();
  }
}

/**
 * Stops a user's container gracefully (SIGTERM: the runner records running
 * requests as interrupted); a paused one is resumed first. The container
 * stays adoptable.
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
    // A frozen runner cannot take SIGTERM: thawed first, so it records
    // what it ran as interrupted, as any stop does.
    if (container.State.Paused) await docker.unpauseContainer(container.Id);
    clearPause(paths.root);
    return await docker.stopContainer(container.Id, { timeoutSeconds: 10 });
  });
}

// The host's own inbound.db, brought to this schema if an older waffle made it
// (as its next use would): a fleet command never reports an upgrade as a problem.
function openInbound(path: string): DatabaseSync {
  return openDatabase(path, { role: "owner", upgrades: INBOUND_UPGRADES });
}
