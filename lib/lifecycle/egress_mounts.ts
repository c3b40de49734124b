/**
 * What a container gets from its egress identity, as the container spec
 * takes it: the launch the config derives (`lib/config/egress_launch.ts`)
 * with its mounts checked, and for a sandbox recorded where its spec reads
 * it (`egress_record.ts`). A restricted session's container gets its launch
 * directly (it lives as long as the session).
 *
 * @module
 */
import { type EgressLaunch, egressLaunch } from "../config/egress_launch.ts";
import type { EgressAttachment } from "../config/egress_types.ts";
import { type ContainerEgress, writeEgressRecord } from "./egress_record.ts";
import { bind } from "./posture.ts";

/**
 * Checks the mounts of an egress launch (see `bind`).
 *
 * @param launch The launch, as the config derives it.
 * @returns What the container spec takes.
 * @throws {UsageError} When a mount path is unsafe.
 */
export function containerEgress(launch: EgressLaunch): ContainerEgress {
  return {
    id: launch.id,
    mounts: launch.mounts.map((mount) => bind(mount.source, mount.target, mount.readOnly)),
    env: launch.env,
  };
}

/**
 * Records what a sandbox's container gets from its attachment (or that it
 * has none), rewriting the record only when it changed.
 *
 * @param root The sandbox's state root.
 * @param options The home and the attachment (undefined: none).
 * @throws {UsageError} When a mount path is unsafe.
 */
export function recordAttachment(
  root: string,
  options: { home: string; attachment: EgressAttachment | undefined },
): void {
  const { home, attachment } = options;
  writeEgressRecord(
    root,
    attachment === undefined ? undefined : containerEgress(egressLaunch(home, attachment)),
  );
}
