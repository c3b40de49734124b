/**
 * The record of what a sandbox's container gets from its egress identity,
 * in its host-only state directory (`<root>/egress.json`): written when the
 * sandbox is opened (`egress_mounts.ts`), read by the container spec, so the
 * warm path, a full ensure and `sweep` compute the same posture.
 *
 * @module
 */
import { join } from "../path.ts";
import * as z from "../schema.ts";
import type { HostConfigMount } from "../docker/mod.ts";

const RECORD = "egress.json";

/** What a container gets from its egress identity, its mounts checked. */
export interface ContainerEgress {
  /** The identity's id. */
  id: string;
  /** Its mounts (socket directory, CA bundle). */
  mounts: HostConfigMount[];
  /** Its runner's variables. */
  env: string[];
}

const launchSchema = z.strictObject({
  id: z.string().check(z.regex(/^[a-z0-9-]{1,64}$/)),
  mounts: z.array(z.strictObject({
    Type: z.literal("bind"),
    Source: z.string(),
    Target: z.string(),
    ReadOnly: z.boolean(),
  })),
  env: z.array(z.string()),
});

/**
 * Records what a sandbox's container gets from its egress identity (or that
 * it has none), rewriting the record only when it changed.
 *
 * @param root The sandbox's state root.
 * @param egress The container's egress (undefined: none).
 */
export function writeEgressRecord(root: string, egress: ContainerEgress | undefined): void {
  const path = join(root, RECORD);
  if (egress === undefined) {
    try {
      Deno.removeSync(path);
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    }
    return;
  }
  const text = `${JSON.stringify(egress)}\n`;
  try {
    if (Deno.readTextFileSync(path) === text) return;
  } catch {
    // absent
  }
  const temp = `${path}.tmp`;
  Deno.writeTextFileSync(temp, text, { mode: 0o600 });
  Deno.renameSync(temp, path);
}

/**
 * What the last open recorded for a sandbox's container.
 *
 * @param root The sandbox's state root.
 * @returns The launch, or undefined when it has no egress.
 */
export function recordedLaunch(root: string): ContainerEgress | undefined {
  let text: string;
  try {
    text = Deno.readTextFileSync(join(root, RECORD));
  } catch {
    return undefined;
  }
  return launchSchema.parse(JSON.parse(text));
}
