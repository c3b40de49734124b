/**
 * `waffle ps`, `sweep`, `stop` and `rm`: this home's sandbox fleet on the
 * daemon; `ps --all` and `sweep --all` reach every home's.
 *
 * @module
 */
import { loadConfig, loadWaffleConfig } from "../config/config.ts";
import { listPools } from "../lifecycle/pool.ts";
import { DockerClient } from "../docker/mod.ts";
import { UsageError } from "../errors.ts";
import { listSandboxes, stopSandbox, sweep } from "../lifecycle/fleet.ts";
import { removeSandbox } from "../sandbox/remove.ts";
import { pauseSandbox, resumeSandbox } from "../lifecycle/pause.ts";
import { sandboxKey } from "../config/sandbox_key.ts";
import { noPositionals, numberFlag, parse, stringFlag } from "./args.ts";
import { table } from "./report.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle ps`. */
export const PS_HELP = `Usage: waffle ps [--all] [--json] [--stats]

Lists this home's sandbox containers (WAFFLE_HOME's, by the state root each
container's labels name): tenant, user, container id, Docker state, image id,
the runner (alive, stale, exited, none: judged by its heartbeat changing by
this host's clock), when its heartbeat last changed, requests open, and idle
time (since a host last used the sandbox, while none is open), how many
workspace snapshots it keeps ('waffle snapshot ls'), and POOL: the template
of a warm pool's ready member, or 'taken from T' for a user's sandbox that
came from one. Then the pools ('[templates.T] warm = N'): how many members
are ready of the N asked for. A sandbox whose
state cannot be read says why in PROBLEM; the others are listed all the same.

--all lists every home's containers on the daemon, with a HOME column ('?'
for a container whose labels name no home). --json gives each sandbox's
'home' (null when unknown) and 'thisHome' either way, and 'pools'.

--stats adds what each sandbox costs, as 'waffle top' shows it (CPU% over
half a second, CPU TIME, MEM, PEAK, PIDS, DISK, NET UP/DOWN); with --json,
each sandbox's 'stats'.
`;

/**
 * Runs `waffle ps`.
 *
 * @param args Arguments after `ps`.
 * @param io Process streams.
 * @returns 0.
 */
export async function psCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    json: { type: "boolean" },
    all: { type: "boolean" },
    stats: { type: "boolean" },
  });
  noPositionals(parsed.positionals);
  const all = parsed.values.all === true;
  const whole = loadWaffleConfig();
  const config = whole.sandbox;
  const docker = new DockerClient();
  const rows = await listSandboxes(docker, { config, all });
  const pools = listPools(config.home, whole.serve);
  // Loaded only when asked: a plain ps reads no cgroup.
  const top = parsed.values.stats === true ? await import("./top.ts") : undefined;
  const readings = top === undefined ? undefined : await top.statsOfRows(docker, rows, { config });
  if (parsed.values.json) {
    const sandboxes = readings === undefined
      ? rows
      : rows.map((row) => ({ ...row, stats: readings.get(row.containerId) ?? null }));
    await io.stdout(`${JSON.stringify({ sandboxes, pools })}\n`);
    return 0;
  }
  const anyProblem = rows.some((row) => row.problem !== undefined);
  const lines = [[
    ...(all ? ["HOME"] : []),
    ...["TENANT", "USER", "CONTAINER", "STATE", "IMAGE", "RUNNER", "HEARTBEAT", "OPEN", "IDLE"],
  ]];
  const anyPool = rows.some((row) => row.pool !== undefined);
  lines[0]!.push("SNAPS", ...(anyPool ? ["POOL"] : []));
  if (top !== undefined) lines[0]!.push(...top.STATS_TITLES);
  if (anyProblem) lines[0]!.push("PROBLEM");
  const now = Date.now();
  for (const row of rows) {
    lines.push([
      ...(all ? [row.home ?? "?"] : []),
      row.tenant,
      row.user,
      row.containerId.slice(0, 12),
      row.state,
      row.imageId.replace(/^sha256:/, "").slice(0, 12),
      row.runner,
      row.lastHeartbeat === null
        ? "-"
        : `${Math.max(0, Math.round((now - row.lastHeartbeat) / 1000))} s ago`,
      String(row.openRequests),
      row.idleMs === null ? "-" : `${Math.round(row.idleMs / 1000)} s`,
      String(row.snapshots),
      ...(anyPool
        ? [
          row.pool === undefined
            ? "-"
            : `${row.pool.taken ? "taken from " : ""}${row.pool.template}`,
        ]
        : []),
      ...(top === undefined ? [] : top.statsCells(readings?.get(row.containerId))),
      ...(anyProblem ? [row.problem ?? "-"] : []),
    ]);
  }
  await io.stdout(table(lines));
  if (pools.length > 0) {
    await io.stdout(`\n${
      table([
        ["POOL", "IMAGE", "READY", "WARM"],
        ...pools.map((pool) => [pool.template, pool.image, String(pool.ready), String(pool.warm)]),
      ])
    }`);
  }
  return 0;
}

/** Help of `waffle sweep`. */
export const SWEEP_HELP = `Usage: waffle sweep [--idle-seconds S] [--max-running N] [--all] [--json]

Reconciles this home's waffle containers (WAFFLE_HOME's), including ones
whose host process died: keeps paused ones ('waffle pause'); removes dead
or incompatible (image or posture changed) containers and those whose state directory is gone; stops
containers whose runner is dead (its heartbeat unchanged for three beats by
this host's clock, whatever it wrote); stops containers idle for S seconds
(default: the configured idle time; 0 never; idle by this host's own record
of use, never the sandbox's word); stops the least recently used beyond N of
this home's running (0: no cap). Never touches a container whose live runner
has a request in flight. A sandbox it cannot judge is reported 'failed' and
the sweep goes on. Other homes' containers are left alone.

--all sweeps every home's containers on the daemon with the same rules and
thresholds, under each home's own lock, except that another home's image and
posture are not judged (that home's next call recycles them); N then counts
every home's running containers. Each line for another home's container
names that home. A container whose labels name no home is kept.
`;

/**
 * Runs `waffle sweep`.
 *
 * @param args Arguments after `sweep`.
 * @param io Process streams.
 * @returns 0.
 */
export async function sweepCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    json: { type: "boolean" },
    "idle-seconds": { type: "string" },
    "max-running": { type: "string" },
    all: { type: "boolean" },
  });
  noPositionals(parsed.positionals);
  const idleSeconds = numberFlag(parsed, "idle-seconds", { allowZero: true });
  const maxRunning = numberFlag(parsed, "max-running", { allowZero: true, integer: true });
  const all = parsed.values.all === true;
  const actions = await sweep(new DockerClient(), {
    config: loadConfig(),
    all,
    ...(idleSeconds === undefined ? {} : { idleSeconds }),
    ...(maxRunning === undefined ? {} : { maxRunning }),
  });
  if (parsed.values.json) {
    await io.stdout(`${JSON.stringify({ actions })}\n`);
  } else {
    for (const a of actions) {
      const whose = a.thisHome ? "" : a.home === null ? " (no home)" : ` (home '${a.home}')`;
      await io.stdout(
        `${a.action.padEnd(8)} ${a.tenant}/${a.user} ${
          a.containerId.slice(0, 12)
        }  ${a.reason}${whose}\n`,
      );
    }
    if (actions.length === 0) {
      await io.stdout(`no waffle containers ${all ? "on this daemon" : "in this home"}\n`);
    }
  }
  return 0;
}

/** Help of `waffle stop`. */
export const STOP_HELP = `Usage: waffle stop --user U [--tenant T]

Stops the user's container gracefully (a paused one is resumed first); it
stays and restarts on the next call.
`;

/**
 * Runs `waffle stop`.
 *
 * @param args Arguments after `stop`.
 * @param io Process streams.
 * @returns 0.
 */
export async function stopCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { user: { type: "string" }, tenant: { type: "string" } });
  noPositionals(parsed.positionals);
  const key = keyOf(stringFlag(parsed, "tenant"), stringFlag(parsed, "user"));
  const stopped = await stopSandbox(new DockerClient(), key, { config: loadConfig() });
  await io.stdout(`${stopped ? "stopped" : "already stopped"} ${key.containerName}\n`);
  return 0;
}

/** Help of `waffle pause`. */
export const PAUSE_HELP = `Usage: waffle pause --user U [--tenant T] [--json]

Freezes every process of the user's sandbox (Docker's pause, the cgroup
freezer): its memory is kept and it uses no CPU. While paused, a command
('waffle exec', the library's run and spawn) fails at once with an error
naming the sandbox (exit code 125) and is never queued; a command already
running is frozen with it and goes on after 'waffle resume'. 'waffle ps'
shows it as paused, and 'waffle sweep' keeps it. --json prints
{"user","tenant","container","paused"}, 'paused' false when it already was.
`;

/**
 * Runs `waffle pause`.
 *
 * @param args Arguments after `pause`.
 * @param io Process streams.
 * @returns 0.
 */
export function pauseCommand(args: string[], io: CliIo): Promise<number> {
  return freezeCommand(args, io, {
    act: pauseSandbox,
    field: "paused",
    words: ["paused", "already paused"],
  });
}

/** Help of `waffle resume`. */
export const RESUME_HELP = `Usage: waffle resume --user U [--tenant T] [--json]

Resumes the user's paused sandbox: its processes go on where they were
(none is restarted), and it takes commands again once its runner has beaten.
--json prints {"user","tenant","container","resumed"}, 'resumed' false when
it was not paused.
`;

/**
 * Runs `waffle resume`.
 *
 * @param args Arguments after `resume`.
 * @param io Process streams.
 * @returns 0.
 */
export function resumeCommand(args: string[], io: CliIo): Promise<number> {
  return freezeCommand(args, io, {
    act: resumeSandbox,
    field: "resumed",
    words: ["resumed", "not paused"],
  });
}

// `pause` and `resume`: the same flags, one act on the sandbox, one line out.
async function freezeCommand(
  args: string[],
  io: CliIo,
  how: {
    act: typeof pauseSandbox;
    field: "paused" | "resumed";
    words: [done: string, notDone: string];
  },
): Promise<number> {
  const parsed = parse(args, {
    user: { type: "string" },
    tenant: { type: "string" },
    json: { type: "boolean" },
  });
  noPositionals(parsed.positionals);
  const key = keyOf(stringFlag(parsed, "tenant"), stringFlag(parsed, "user"));
  const done = await how.act(new DockerClient(), key, { config: loadConfig() });
  const { user, tenant, containerName: container } = key;
  await io.stdout(
    parsed.values.json
      ? `${JSON.stringify({ user, tenant, container, [how.field]: done })}\n`
      : `${how.words[done ? 0 : 1]} ${container}\n`,
  );
  return 0;
}

/** Help of `waffle rm`. */
export const RM_HELP = `Usage: waffle rm --user U [--tenant T] [--purge]

Removes the user's container. --purge also deletes the user's queue and workspace.
`;

/**
 * Runs `waffle rm`.
 *
 * @param args Arguments after `rm`.
 * @param io Process streams.
 * @returns 0.
 */
export async function rmCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    user: { type: "string" },
    tenant: { type: "string" },
    purge: { type: "boolean" },
  });
  noPositionals(parsed.positionals);
  const key = keyOf(stringFlag(parsed, "tenant"), stringFlag(parsed, "user"));
  const removed = await removeSandbox(new DockerClient(), key, {
    config: loadConfig(),
    purge: parsed.values.purge === true,
  });
  await io.stdout(
    `${removed ? "removed" : "no container"} ${key.containerName}${
      parsed.values.purge ? " (state purged)" : ""
    }\n`,
  );
  return 0;
}

function keyOf(
  tenant: string | undefined,
  user: string | undefined,
): ReturnType<typeof sandboxKey> {
  if (user === undefined) throw new UsageError("Missing --user U");
  return sandboxKey(tenant ?? "default", user, { home: loadConfig().home });
}
