/**
 * A sandbox's costs as the library and the CLI report them: the kernel's
 * counters and the quota volume's figures (`lib/lifecycle/stats.ts`), and,
 * for a sandbox attached to egress, what the proxy counted for its identity.
 * The egress modules load only for an attached sandbox.
 *
 * @module
 */
import type { DockerClient } from "../docker/client.ts";
import type { ContainerInspect } from "../docker/types.ts";
import { recordedLaunch } from "../lifecycle/egress_record.ts";
import { ownedBy } from "../lifecycle/ensure.ts";
import { stateLayout } from "../lifecycle/identity.ts";
import { type SandboxStats, sandboxStats } from "../lifecycle/stats.ts";

/** Which sandbox to read, as the host knows it. */
export interface StatsTarget {
  /** The container's id or name. */
  container: string | ContainerInspect;
  /** The sandbox's state root on the host (its quota volume and egress record are there). */
  root: string;
  /** The waffle home, whose egress proxy counts the sandbox's connections. */
  home: string;
  /** The configured disk quota in bytes, when known. */
  quotaBytes?: number;
}

/**
 * Reads one sandbox's costs. A container the state root does not own (the
 * same name held by another home's sandbox) is reported `missing`.
 *
 * @param docker The Docker client.
 * @param target The container, state root, home and quota.
 * @param options `sampleMs` or `previous`, for the CPU share (see `SandboxStatsOptions`).
 * @returns The reading, with network counts when the sandbox is attached to egress.
 */
export async function statsOf(
  docker: DockerClient,
  target: StatsTarget,
  options: { sampleMs?: number; previous?: SandboxStats } = {},
): Promise<SandboxStats> {
  const inspect = typeof target.container === "string"
    ? await docker.inspectContainer(target.container)
    : target.container;
  const owned = inspect !== null && ownedBy(inspect, target.root);
  const reading = await sandboxStats(docker, owned ? inspect : null, {
    volume: stateLayout(target.root).volume,
    ...(target.quotaBytes === undefined ? {} : { quotaBytes: target.quotaBytes }),
    ...options,
  });
  let egressId: string | undefined;
  try {
    egressId = recordedLaunch(target.root)?.id;
  } catch (error) {
    reading.problems.push(`Cannot read the egress record: ${(error as Error).message}`);
  }
  if (egressId !== undefined) {
    const { egressCounts } = await import("../egress/status.ts");
    reading.network = await egressCounts(target.home, egressId) ?? null;
    if (reading.network === null) {
      reading.problems.push(`The egress proxy gave no counts for identity '${egressId}'`);
    }
  }
  return reading;
}
