/**
 * `waffle top`, and the cost columns of `waffle ps --stats`: each
 * sandbox's CPU, memory, tasks, disk and network (`lib/sandbox/stats.ts`).
 *
 * @module
 */
import { loadConfig, type SandboxConfig } from "../config/config.ts";
import { DockerClient } from "../docker/mod.ts";
import { listSandboxes, type SandboxStatus } from "../lifecycle/fleet.ts";
import type { SandboxStats } from "../lifecycle/stats.ts";
import { statsOf } from "../sandbox/stats.ts";
import { noPositionals, numberFlag, parse } from "./args.ts";
import { table } from "./report.ts";
import type { CliIo } from "./io.ts";

/** How long `ps --stats` and `top`'s first screen watch the CPU for its share, in ms. */
const SAMPLE_MS = 500;

/** The cost columns' titles, in the order {@linkcode statsCells} gives them. */
export const STATS_TITLES = ["CPU%", "CPU TIME", "MEM", "PEAK", "PIDS", "DISK", "NET UP/DOWN"];

/**
 * Reads every listed sandbox's costs at once (the CPU share over one common
 * window, or since `previous`). A container whose labels name no home gets
 * no reading: its labels may name any path.
 *
 * @param docker The Docker client.
 * @param rows The sandboxes, as `listSandboxes` lists them.
 * @param options This home's config (its quota); readings to compute the share against.
 * @returns The readings by container id.
 */
export async function statsOfRows(
  docker: DockerClient,
  rows: SandboxStatus[],
  options: { config: SandboxConfig; previous?: Map<string, SandboxStats> },
): Promise<Map<string, SandboxStats>> {
  const readings = await Promise.all(rows.map(async (row) => {
    if (row.home === null) return undefined;
    const previous = options.previous?.get(row.containerId);
    const stats = await statsOf(docker, {
      container: row.containerId,
      root: row.statePath,
      home: row.home,
      ...(row.thisHome ? { quotaBytes: options.config.quotaBytes } : {}),
    }, previous === undefined ? { sampleMs: SAMPLE_MS } : { previous });
    return [row.containerId, stats] as const;
  }));
  return new Map(readings.filter((entry) => entry !== undefined));
}

const MIB = 1024 ** 2;

function mib(bytes: number): string {
  return bytes >= 10 * 1024 * MIB
    ? `${(bytes / 1024 ** 3).toFixed(1)}G`
    : `${(bytes / MIB).toFixed(bytes < 10 * MIB ? 1 : 0)}M`;
}

/**
 * One sandbox's cost columns ({@linkcode STATS_TITLES}); `-` for what is unknown.
 *
 * @param stats Its reading, if any.
 * @returns The cells.
 */
export function statsCells(stats: SandboxStats | undefined): string[] {
  const cpu = stats?.cpu ?? null;
  const memory = stats?.memory ?? null;
  const { pids = null, disk = null, network = null } = stats ?? {};
  const limited = (used: string, limit: number | null, unit: (n: number) => string): string =>
    limit === null ? used : `${used}/${unit(limit)}`;
  return [
    cpu?.share === null || cpu === null ? "-" : `${(cpu.share * 100).toFixed(1)}`,
    cpu === null ? "-" : `${(cpu.usageNs / 1e9).toFixed(1)} s`,
    memory === null ? "-" : limited(mib(memory.currentBytes), memory.limitBytes, mib),
    memory?.peakBytes === null || memory === null ? "-" : mib(memory.peakBytes),
    pids === null ? "-" : limited(String(pids.current), pids.limit, String),
    disk === null ? "-" : limited(mib(disk.usedBytes), disk.quotaBytes ?? disk.totalBytes, mib),
    network === null ? "-" : `${mib(network.bytesUp)}/${mib(network.bytesDown)}`,
  ];
}

/** Help of `waffle top`. */
export const TOP_HELP = `Usage: waffle top [--interval S] [--once] [--json] [--all]

Shows what each of this home's sandboxes costs, refreshed every S seconds
(default 2) until Ctrl-C: CPU% (of the sandbox's CPU limit, over the last
interval), CPU TIME (since the container started), MEM (now/limit) and its
PEAK, PIDS (now/limit), DISK (used/quota of its volume) and NET UP/DOWN
(bytes through the egress proxy, for a sandbox attached to it). The figures
are the kernel's (the container's cgroup, found from its init process) and
the volume's file system, never a file the sandbox can write; '-' where
there is none (a stopped container, a volume without a quota).

--once prints one screen (the CPU share over half a second) and exits;
--json prints one JSON object {"sandboxes": [...]} per refresh, each sandbox
with its 'stats' (with --once: one object). --all: every home's containers.
`;

/**
 * Runs `waffle top`.
 *
 * @param args Arguments after `top`.
 * @param io Process streams.
 * @returns 0 (also after Ctrl-C).
 */
export async function topCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    interval: { type: "string" },
    once: { type: "boolean" },
    json: { type: "boolean" },
    all: { type: "boolean" },
  });
  noPositionals(parsed.positionals);
  const intervalMs = (numberFlag(parsed, "interval") ?? 2) * 1000;
  const json = parsed.values.json === true;
  const once = parsed.values.once === true;
  const all = parsed.values.all === true;
  const config = loadConfig();
  const docker = new DockerClient();
  const stop = new AbortController();
  const onInterrupt = (): void => stop.abort();
  if (!once) Deno.addSignalListener("SIGINT", onInterrupt);
  const clear = !once && !json && Deno.stdout.isTerminal();
  try {
    let previous: Map<string, SandboxStats> | undefined;
    while (!stop.signal.aborted) {
      const rows = await listSandboxes(docker, { config, all });
      const readings = await statsOfRows(docker, rows, {
        config,
        ...(previous === undefined ? {} : { previous }),
      });
      previous = readings;
      if (json) {
        const sandboxes = rows.map((row) => ({ ...row, stats: readings.get(row.containerId) }));
        await io.stdout(`${JSON.stringify({ time: Date.now(), sandboxes })}\n`);
      } else {
        await io.stdout(`${clear ? "\x1b[H\x1b[2J" : ""}${topTable(rows, readings, all)}`);
      }
      if (once) break;
      await sleep(intervalMs, stop.signal);
    }
  } finally {
    if (!once) Deno.removeSignalListener("SIGINT", onInterrupt);
  }
  return 0;
}

function topTable(
  rows: SandboxStatus[],
  readings: Map<string, SandboxStats>,
  all: boolean,
): string {
  const lines = [[
    ...(all ? ["HOME"] : []),
    ...["TENANT", "USER", "CONTAINER", "STATE", ...STATS_TITLES],
  ]];
  for (const row of rows) {
    lines.push([
      ...(all ? [row.home ?? "?"] : []),
      row.tenant,
      row.user,
      row.containerId.slice(0, 12),
      row.state,
      ...statsCells(readings.get(row.containerId)),
    ]);
  }
  return table(lines);
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });
}
