/**
 * Warm pools: sandboxes made before anyone asks for them, one pool per
 * template (`[templates.<name>] warm = N`), and the take that binds one to a
 * new user without a restart.
 *
 * A member is an ordinary sandbox of the reserved tenant
 * {@linkcode POOL_TENANT} (its container is labelled `waffle.pool`), made and
 * ensured by the filler (`lib/sandbox/pool_fill.ts`), then announced by a
 * marker `<home>/pool/<template>/ready/<member>`. Everything here lives in
 * the host's home, which no container mounts.
 *
 * A take, for a user whose state root does not exist yet, under that user's
 * lock:
 * 1. claims a marker by unlinking it (of two takers, one unlink succeeds);
 * 2. checks the member still serves (its init process and runner, as the
 *    warm path judges them) and that its posture is exactly the one a cold
 *    sandbox of this user would get (the caller's `fits`: the posture hash
 *    leaves out only who a sandbox belongs to, see `posture.ts`);
 * 3. records whom it was taken for in the member's host-only root
 *    (`bound.json`), then makes the user's channel directory and state root
 *    links to the member's: every path of the user's names the member's
 *    directories, whose mounts the running container already has.
 *
 * The container is then renamed to the user's name (`renameTaken`). The
 * member never served anyone before: its workspace is the empty one it was
 * made with, its queue holds no request.
 *
 * @module
 */
import { basename, dirname, join } from "../path.ts";
import * as z from "../schema.ts";
import { POOL_TENANT, type SandboxKey, sandboxKey } from "../config/sandbox_key.ts";
import { judgeRunner } from "../queue/liveness.ts";
import { queuePaths } from "../queue/schema.ts";
import { writeJsonRecord } from "../fs.ts";
import { stateLayout, type StatePaths, statePaths } from "./identity.ts";
import { initMark, readWarm, recordedPid, type WarmRecord } from "./warm.ts";

/** A ready member, as its marker names it. */
export interface PoolMember {
  /** The template it was made for. */
  template: string;
  /** Its user id (of tenant {@linkcode POOL_TENANT}). */
  user: string;
  /** The image reference it was made from. */
  image: string;
  /** The disk quota it was made with (not part of the container's posture). */
  quotaBytes: number;
  /** When it became ready (ms since epoch). */
  readyAt: number;
}

/** Whom a taken member serves: `bound.json` in its state root. */
export interface PoolBinding {
  /** The user's tenant. */
  tenant: string;
  /** The user. */
  user: string;
  /** The template of the pool it came from. */
  template: string;
  /** Its container's id. */
  containerId: string;
  /** When it was taken (ms since epoch). */
  takenAt: number;
}

/** A member just taken. */
export interface TakenMember {
  /** The member as its marker named it. */
  member: PoolMember;
  /** Its own key (the container still carries its labels). */
  memberKey: SandboxKey;
  /** Its container's id. */
  containerId: string;
}

const memberSchema = z.strictObject({
  template: z.string(),
  user: z.string(),
  image: z.string(),
  quotaBytes: z.number(),
  readyAt: z.number(),
});

const bindingSchema = z.strictObject({
  tenant: z.string(),
  user: z.string(),
  template: z.string(),
  containerId: z.string().check(z.regex(/^[0-9a-f]{64}$/)),
  takenAt: z.number(),
});

const BINDING = "bound.json";
/** A marker or binding is a few hundred bytes: anything larger is not ours. */
const RECORD_CAP = 4096;

/**
 * Where a home keeps its pools' markers.
 *
 * @param home `WAFFLE_HOME`.
 * @returns `<home>/pool`.
 */
export function poolsDir(home: string): string {
  return join(home, "pool");
}

function readyDir(home: string, template: string): string {
  return join(poolsDir(home), template, "ready");
}

/**
 * The key of a pool member.
 *
 * @param home `WAFFLE_HOME`.
 * @param member Its template and user id.
 * @returns The key (tenant {@linkcode POOL_TENANT}, `pool` set).
 */
export function memberKey(home: string, member: Pick<PoolMember, "template" | "user">): SandboxKey {
  return sandboxKey(POOL_TENANT, member.user, { home, pool: member.template });
}

/**
 * Announces a member as ready to be taken (atomically).
 *
 * @param home `WAFFLE_HOME`.
 * @param member The member.
 */
export function markReady(home: string, member: PoolMember): void {
  const dir = readyDir(home, member.template);
  Deno.mkdirSync(dir, { recursive: true, mode: 0o700 });
  writeJsonRecord(join(dir, member.user), member);
}

/**
 * Withdraws a member's marker: the claim of a take, or the filler's before
 * it removes a member. Only one caller's unlink succeeds.
 *
 * @param home `WAFFLE_HOME`.
 * @param member The member.
 * @returns True when this call removed it.
 */
export function dropMarker(home: string, member: Pick<PoolMember, "template" | "user">): boolean {
  try {
    Deno.removeSync(join(readyDir(home, member.template), member.user));
    return true;
  } catch {
    return false;
  }
}

/**
 * The templates that have a pool directory in a home.
 *
 * @param home `WAFFLE_HOME`.
 * @returns Their names (none when the home has no pools).
 */
export function poolTemplates(home: string): string[] {
  try {
    return [...Deno.readDirSync(poolsDir(home))].filter((entry) => entry.isDirectory)
      .map((entry) => entry.name).sort();
  } catch {
    return [];
  }
}

/**
 * A pool's ready members, oldest first. A marker that is unreadable or not
 * a member of this template is skipped.
 *
 * @param home `WAFFLE_HOME`.
 * @param template The template.
 * @returns Its members.
 */
export function readyMembers(home: string, template: string): PoolMember[] {
  const members: PoolMember[] = [];
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(readyDir(home, template))];
  } catch {
    return [];
  }
  for (const entry of entries) {
    if (!entry.isFile || entry.name.endsWith(".tmp")) continue;
    const parsed = memberSchema.safeParse(readCapped(join(readyDir(home, template), entry.name)));
    if (!parsed.success) continue;
    if (parsed.data.template !== template || parsed.data.user !== entry.name) continue;
    members.push(parsed.data);
  }
  return members.sort((a, b) => a.readyAt - b.readyAt);
}

/**
 * Whom a taken member serves, from its state root (host-only).
 *
 * @param root A state root (a member's, or a user's link to one).
 * @returns The binding, or undefined when it was never taken.
 */
export function readBinding(root: string): PoolBinding | undefined {
  const parsed = bindingSchema.safeParse(readCapped(join(root, BINDING)));
  return parsed.success ? parsed.data : undefined;
}

/**
 * A member's warm record when its container's init process and its runner
 * are alive as the warm path judges them (the kernel's pid and start time,
 * the heartbeat changing by the host's clock with the boot id the ensure saw).
 *
 * @param paths The member's state paths.
 * @returns The record, or undefined when it does not serve.
 */
export function servingRecord(paths: StatePaths): WarmRecord | undefined {
  const record = readWarm(paths.root);
  if (record === undefined) return undefined;
  const pid = recordedPid(record);
  if (!Number.isSafeInteger(pid) || initMark(pid) !== record.process) return undefined;
  const queue = queuePaths(paths.queue, { outboundDir: paths.outbound });
  const judged = judgeRunner(queue.heartbeat, { queue: queue.dir });
  return judged.state === "alive" && judged.beat?.bootId === record.bootId ? record : undefined;
}

/** Options of {@linkcode takeMember}. */
export interface TakeOptions {
  /** The user's key. */
  key: SandboxKey;
  /** The user's state paths (its root must not exist). */
  paths: StatePaths;
  /**
   * Whether a serving member fits the user: its posture is the one a cold
   * sandbox of the user would get.
   */
  fits: (member: PoolMember, options: { paths: StatePaths; record: WarmRecord }) => boolean;
}

/**
 * Takes a ready member for a user that has no sandbox yet (see the module's
 * steps), synchronously, under the user's lock.
 *
 * @param home `WAFFLE_HOME`.
 * @param options The user's key and paths, and the fit.
 * @returns The member taken, or undefined when none fits (the caller makes a cold one).
 */
export function takeMember(home: string, options: TakeOptions): TakenMember | undefined {
  // Every open comes here: a user that has a sandbox costs one lstat.
  if (exists(options.paths.root)) return undefined;
  const templates = poolTemplates(home);
  if (templates.length === 0) return undefined;
  Deno.mkdirSync(dirname(options.paths.lock), { recursive: true, mode: 0o700 });
  const lock = Deno.openSync(options.paths.lock, {
    read: true,
    write: true,
    create: true,
    mode: 0o600,
  });
  try {
    lock.lockSync(true);
    if (exists(options.paths.root)) return undefined;
    for (const template of templates) {
      for (const member of readyMembers(home, template)) {
        const taken = tryTake(home, member, options);
        if (taken !== undefined) return taken;
      }
    }
    return undefined;
  } finally {
    lock.close();
  }
}

// One member: checked, claimed, bound; undefined when it does not serve,
// does not fit, or another taker claimed it first.
function tryTake(
  home: string,
  member: PoolMember,
  options: TakeOptions,
): TakenMember | undefined {
  const key = memberKey(home, member);
  const paths = statePaths(home, key);
  const record = servingRecord(paths);
  // A member that stopped serving is the filler's to replace.
  if (record === undefined || !options.fits(member, { paths, record })) return undefined;
  if (!dropMarker(home, member)) return undefined;
  const binding: PoolBinding = {
    tenant: options.key.tenant,
    user: options.key.user,
    template: member.template,
    containerId: record.containerId,
    takenAt: Date.now(),
  };
  try {
    writeJsonRecord(join(paths.root, BINDING), binding);
    // Stale names of a user whose state was purged: the host's own.
    removeQuietly(options.paths.channel);
    Deno.symlinkSync(basename(paths.channel), options.paths.channel);
    Deno.symlinkSync(basename(paths.root), options.paths.root);
  } catch {
    // Undone, and the member offered again: the caller makes a cold one.
    removeQuietly(options.paths.channel);
    writeJsonRecord(join(paths.root, BINDING), undefined);
    markReady(home, member);
    return undefined;
  }
  return { member, memberKey: key, containerId: record.containerId };
}

/**
 * The paths of a sandbox's state as they lie: a user's whose sandbox was
 * taken from a pool names links to the member's directories, which are what
 * a purge removes (with the links).
 *
 * @param paths The user's state paths.
 * @returns The member's paths and the user's links, or the paths as they are.
 */
export function resolveTaken(paths: StatePaths): { paths: StatePaths; links: string[] } {
  let target: string;
  try {
    if (!Deno.lstatSync(paths.root).isSymlink) return { paths, links: [] };
    target = Deno.readLinkSync(paths.root);
  } catch {
    return { paths, links: [] };
  }
  // Only a link the take made: a sibling in the same `sandboxes/` directory.
  if (!/^[0-9a-f]{64}$/.test(target)) return { paths, links: [] };
  const root = join(dirname(paths.root), target);
  const home = dirname(dirname(root));
  return {
    paths: {
      ...paths,
      ...stateLayout(root),
      lock: join(home, "locks", `${target}.lock`),
      channel: join(home, "ch", target.slice(0, 16)),
    },
    links: [paths.root, paths.channel],
  };
}

function exists(path: string): boolean {
  try {
    Deno.lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

function removeQuietly(path: string): void {
  try {
    const stat = Deno.lstatSync(path);
    Deno.removeSync(path, { recursive: stat.isDirectory });
  } catch {
    // Gone already.
  }
}

function readCapped(path: string): unknown {
  try {
    const file = Deno.openSync(path, { read: true });
    try {
      const buffer = new Uint8Array(RECORD_CAP + 1);
      const n = file.readSync(buffer) ?? 0;
      if (n > RECORD_CAP) return undefined;
      return JSON.parse(new TextDecoder().decode(buffer.subarray(0, n)));
    } finally {
      file.close();
    }
  } catch {
    return undefined;
  }
}

/** One pool as `waffle ps` and `waffle serve`'s `/metrics` show it. */
export interface PoolStatus {
  /** The template. */
  template: string;
  /** Its image reference. */
  image: string;
  /** The count the config asks for (0: a pool the config no longer names). */
  warm: number;
  /** Ready members now. */
  ready: number;
}

/**
 * The pools of a home: each the config names, and each that still has
 * ready members.
 *
 * @param home `WAFFLE_HOME`.
 * @param config The `[templates.*]` images and warm counts.
 * @returns One status per pool, by template name.
 */
export function listPools(
  home: string,
  config: { templates: ReadonlyMap<string, string>; warm: ReadonlyMap<string, number> },
): PoolStatus[] {
  const names = new Set([...config.warm.keys(), ...poolTemplates(home)]);
  return [...names].sort().map((template) => ({
    template,
    image: config.templates.get(template) ?? "?",
    warm: config.warm.get(template) ?? 0,
    ready: readyMembers(home, template).length,
  }));
}
