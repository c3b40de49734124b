/**
 * The filler of warm pools: keeps `[templates.<name>] warm` ready members
 * per template (see `lib/lifecycle/pool.ts`). One filler per template runs
 * at a time (an exclusive lock on `<home>/pool/<template>/fill.lock`, tried,
 * never waited for), so a pool never holds more members than its count:
 * markers are only written by the lock's holder, which counts them first.
 *
 * A round:
 * 1. withdraws members that stopped serving, were made from another image
 *    or quota than the template's today, or are over the count, and removes them;
 * 2. removes members of the template nobody announced or took (a filler
 *    killed mid-make left them);
 * 3. makes members, a few at once, until the count is reached.
 *
 * `waffle serve` runs rounds in the background; `waffle pool fill` runs one
 * (or, with `--watch`, keeps running them).
 *
 * @module
 */
import { loadWaffleConfig } from "../config/config.ts";
import { POOL_TENANT } from "../config/sandbox_key.ts";
import type { DockerClient } from "../docker/client.ts";
import { messageOf } from "../queue/connection.ts";
import { UsageError } from "../errors.ts";
import { join } from "../path.ts";
import { statePaths } from "../lifecycle/identity.ts";
import { LABELS } from "../lifecycle/posture.ts";
import { tryLock } from "../lifecycle/lock.ts";
import {
  dropMarker,
  markReady,
  memberKey,
  type PoolMember,
  poolsDir,
  readBinding,
  readyMembers,
  servingRecord,
} from "../lifecycle/pool.ts";
import { containerHome } from "../lifecycle/container_home.ts";
import { openSandbox } from "./open.ts";
import { removeSandbox } from "./remove.ts";

/** One pool as the config asks for it. */
export interface PoolTarget {
  /** The template. */
  template: string;
  /** Its image reference. */
  image: string;
  /** How many ready members to keep. */
  warm: number;
}

/** What a round did. */
export interface FillReport {
  /** The template. */
  template: string;
  /** False when another filler held the pool's lock: this round did nothing. */
  ran: boolean;
  /** Members made ready. */
  made: number;
  /** Members withdrawn and removed. */
  removed: number;
  /** Ready members after the round. */
  ready: number;
  /** Why a member could not be made, when one could not. */
  error?: string;
}

/** Options of {@linkcode fillPool}. */
export interface FillOptions {
  /** The config file the members read (absent: the home's). */
  configPath?: string | undefined;
  /** Docker client. */
  docker?: DockerClient;
  /** Members made at once; default 2. */
  parallel?: number;
  /** Told of each member made or removed (progress). */
  onMember?: (event: { template: string; user: string; made: boolean }) => void;
}

/**
 * Runs one round of a pool's filler (see the module's steps).
 *
 * @param home `WAFFLE_HOME`.
 * @param target The template, its image and count.
 * @param options Config file, Docker client, parallelism, progress.
 * @returns What the round did.
 */
export async function fillPool(
  home: string,
  target: PoolTarget,
  options: FillOptions = {},
): Promise<FillReport> {
  const dir = join(poolsDir(home), target.template);
  Deno.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const report: FillReport = {
    template: target.template,
    ran: false,
    made: 0,
    removed: 0,
    ready: 0,
  };
  const release = tryLock(join(dir, "fill.lock"));
  if (release === undefined) return report;
  try {
    report.ran = true;
    const docker = options.docker ?? await newDockerClient();
    const quotaBytes = loadWaffleConfig({ configPath: options.configPath }).sandbox.quotaBytes;
    let ready = 0;
    for (const member of readyMembers(home, target.template)) {
      const keep = ready < target.warm && member.image === target.image &&
        member.quotaBytes === quotaBytes &&
        servingRecord(statePaths(home, memberKey(home, member))) !== undefined;
      if (keep) ready++;
      else if (dropMarker(home, member)) {
        await removeMember(docker, home, member, options);
        report.removed++;
      }
    }
    report.removed += await removeUnannounced(docker, home, target, options);
    while (ready < target.warm) {
      const batch = Math.min(options.parallel ?? 2, target.warm - ready);
      const made = await Promise.allSettled(
        Array.from({ length: batch }, () => makeMember(docker, home, target, options)),
      );
      const done = made.filter((outcome) => outcome.status === "fulfilled").length;
      ready += done;
      report.made += done;
      const failed = made.find((outcome) => outcome.status === "rejected");
      if (failed !== undefined) {
        // No hot loop on a broken template: the next round tries again.
        report.error = messageOf((failed as PromiseRejectedResult).reason);
        break;
      }
    }
    report.ready = ready;
    return report;
  } finally {
    release();
  }
}

// Makes one member: a sandbox of the pool tenant, ensured (its runner
// beats), then announced. Removed again when anything fails.
async function makeMember(
  docker: DockerClient,
  home: string,
  target: PoolTarget,
  options: FillOptions,
): Promise<void> {
  const user = `p${crypto.randomUUID().replaceAll("-", "").slice(0, 20)}`;
  const member: PoolMember = {
    template: target.template,
    user,
    image: target.image,
    quotaBytes: 0,
    readyAt: 0,
  };
  try {
    const sandbox = openSandbox(user, {
      tenant: POOL_TENANT,
      pool: target.template,
      docker,
      config: {
        home,
        image: target.image,
        ...(options.configPath === undefined ? {} : { configPath: options.configPath }),
      },
    });
    try {
      await sandbox.ensure();
      // One request through, so a user's first command finds the runner's
      // request path already run (tens of ms colder otherwise); the filler's
      // own `true`, collected and acknowledged: no user's anything.
      const warmUp = await sandbox.run(["true"]);
      if (warmUp.exitCode !== 0) throw new Error(`A new member's 'true' exited ${warmUp.exitCode}`);
      member.quotaBytes = sandbox.config.quotaBytes;
    } finally {
      sandbox.close();
    }
    member.readyAt = Date.now();
    markReady(home, member);
    options.onMember?.({ template: target.template, user, made: true });
  } catch (error) {
    await removeMember(docker, home, member, options).catch(() => {});
    throw error;
  }
}

async function removeMember(
  docker: DockerClient,
  home: string,
  member: Pick<PoolMember, "template" | "user">,
  options: FillOptions,
): Promise<void> {
  const config = loadWaffleConfig({ configPath: options.configPath }).sandbox;
  await removeSandbox(docker, memberKey(home, member), {
    config: { ...config, home },
    purge: true,
  });
  options.onMember?.({ template: member.template, user: member.user, made: false });
}

// Members of this template with a container but neither a marker nor a
// binding: a filler was killed while making them (this one holds the lock,
// so no other is making one now).
async function removeUnannounced(
  docker: DockerClient,
  home: string,
  target: PoolTarget,
  options: FillOptions,
): Promise<number> {
  const announced = new Set(readyMembers(home, target.template).map((m) => m.user));
  const containers = await docker.listContainers({
    all: true,
    labels: [`${LABELS.pool}=${target.template}`],
  });
  let removed = 0;
  for (const summary of containers) {
    const placed = containerHome(summary.Labels);
    if (placed.home !== home || placed.key.pool !== target.template) continue;
    const user = placed.key.user;
    if (announced.has(user)) continue;
    if (readBinding(statePaths(home, placed.key).root) !== undefined) continue;
    await removeMember(docker, home, { template: target.template, user }, options);
    removed++;
  }
  return removed;
}

/**
 * Removes every ready member of a pool (its markers first, so nothing takes
 * one meanwhile); taken members are their users' and stay. Waits for a
 * running filler's round to end (a bounded wait: its lock).
 *
 * @param home `WAFFLE_HOME`.
 * @param template The template.
 * @param options Config file, Docker client, progress.
 * @returns How many members were removed.
 * @throws {UsageError} When a filler still holds the pool after 60 s.
 */
export async function drainPool(
  home: string,
  template: string,
  options: FillOptions = {},
): Promise<number> {
  const lock = join(poolsDir(home), template, "fill.lock");
  let release = tryLock(lock);
  for (let tries = 0; release === undefined && tries < 600; tries++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    release = tryLock(lock);
  }
  if (release === undefined) {
    throw new UsageError(`Pool '${template}' is being filled by another process; try again`);
  }
  try {
    const docker = options.docker ?? await newDockerClient();
    let removed = 0;
    for (const member of readyMembers(home, template)) {
      if (!dropMarker(home, member)) continue;
      await removeMember(docker, home, member, options);
      removed++;
    }
    return removed +
      await removeUnannounced(docker, home, { template, image: "", warm: 0 }, options);
  } finally {
    release();
  }
}

/** A running keeper of warm pools (see {@linkcode keepPools}). */
export interface PoolKeeper {
  /** Runs a round soon (after a take). */
  poke(): void;
  /** The last round's report per template. */
  reports(): FillReport[];
  /** Stops it, after the round under way. */
  stop(): Promise<void>;
}

/**
 * Keeps pools filled in the background: a round per template every
 * `intervalMs` (default 2 s) and soon after each {@linkcode PoolKeeper.poke},
 * once no take came for `settleMs` (default 1 s): making a member takes a
 * few hundred ms of CPU, which a user's first commands right after a take
 * (and the rest of a burst) should not share. A round that fails is
 * reported and tried again at the next one.
 *
 * @param home `WAFFLE_HOME`.
 * @param targets The pools.
 * @param options Config file, Docker client, interval, and where a failure is told.
 * @returns The keeper.
 */
export function keepPools(
  home: string,
  targets: readonly PoolTarget[],
  options: FillOptions & {
    intervalMs?: number;
    settleMs?: number;
    onError?: ((line: string) => void) | undefined;
  } = {},
): PoolKeeper {
  const reports = new Map<string, FillReport>();
  const settleMs = options.settleMs ?? 1000;
  let stopped = false;
  let lastTake = 0;
  let wake: (() => void) | undefined;
  const sleep = (ms: number): Promise<void> =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, ms);
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    }).finally(() => (wake = undefined));
  const loop = (async () => {
    while (!stopped) {
      // A burst of takes is refilled once it settles.
      for (let quiet = settleMs - (Date.now() - lastTake); quiet > 0 && !stopped;) {
        await sleep(quiet);
        quiet = settleMs - (Date.now() - lastTake);
      }
      for (const target of targets) {
        if (stopped) break;
        try {
          const report = await fillPool(home, target, options);
          reports.set(target.template, report);
          if (report.error !== undefined) {
            options.onError?.(`pool '${target.template}': ${report.error}`);
          }
        } catch (error) {
          options.onError?.(`pool '${target.template}': ${messageOf(error)}`);
        }
      }
      if (stopped) break;
      await sleep(options.intervalMs ?? 2000);
    }
  })();
  return {
    poke: () => {
      lastTake = Date.now();
      wake?.();
    },
    reports: () => [...reports.values()],
    stop: async () => {
      stopped = true;
      wake?.();
      await loop;
    },
  };
}

// Loaded on use: the library's module graph carries no Docker client until one is needed.
async function newDockerClient(): Promise<DockerClient> {
  return new (await import("../docker/client.ts")).DockerClient();
}
