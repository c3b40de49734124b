/**
 * The take of a warm pool's member by `openSandbox` (see
 * `lib/lifecycle/pool.ts`): which member fits a user, and the container's
 * rename to the user's name.
 *
 * @module
 */
import type { ResolvedSandbox } from "../config/resolve.ts";
import type { SandboxKey } from "../config/sandbox_key.ts";
import type { DockerEndpoint } from "../docker/endpoint.ts";
import { quickRequest } from "../docker/quick_get.ts";
import { egressLaunch } from "../config/egress_launch.ts";
import { containerEgress } from "../lifecycle/egress_mounts.ts";
import type { StatePaths } from "../lifecycle/identity.ts";
import { takeMember, type TakenMember } from "../lifecycle/pool.ts";
import { containerSpec } from "../lifecycle/posture.ts";
import { mark } from "../trace.ts";

/**
 * Takes a member for a user that has no sandbox yet, when one fits: made
 * from the same image reference, with the same disk quota, and with exactly
 * the posture a cold sandbox of this user would be created with (its
 * config, egress identity included, judged on the member's image).
 *
 * @param resolved The user's resolved sandbox.
 * @param paths The user's state paths.
 * @returns The member taken, or undefined (the first ensure makes a cold one).
 */
export function takeFromPool(
  resolved: ResolvedSandbox,
  paths: StatePaths,
): TakenMember | undefined {
  const { key, config } = resolved;
  // Worked out once, for the first member judged, never for a user that has a sandbox.
  let egress: { launch: ReturnType<typeof containerEgress> | undefined } | undefined;
  const egressOf = () =>
    (egress ??= {
      launch: resolved.egress === undefined
        ? undefined
        : containerEgress(egressLaunch(config.home, resolved.egress)),
    }).launch;
  const taken = takeMember(config.home, {
    key,
    paths,
    fits: (member, found) => {
      if (member.image !== config.image || member.quotaBytes !== config.quotaBytes) return false;
      try {
        const spec = containerSpec(key, {
          config,
          image: found.record.image,
          paths: found.paths,
          egress: egressOf(),
        });
        return spec.postureHash === found.record.postureHash;
      } catch {
        return false;
      }
    },
  });
  if (taken !== undefined) mark(`taken from pool '${taken.member.template}'`);
  return taken;
}

/**
 * Renames a taken member's container to the user's container name, so every
 * command that finds a sandbox by name (stop, rm, pause, ensure) finds it.
 *
 * @param endpoint The Docker daemon.
 * @param taken The member taken.
 * @param key The user's key.
 * @returns False when the daemon could not be asked or refused: the full
 *   ensure then finds the container by its binding and renames it.
 */
export async function renameTaken(
  endpoint: DockerEndpoint,
  taken: TakenMember,
  key: SandboxKey,
): Promise<boolean> {
  const outcome = await quickRequest(endpoint, {
    method: "POST",
    path: `/containers/${taken.containerId}/rename?name=${encodeURIComponent(key.containerName)}`,
  });
  return outcome.kind === "reply" && outcome.reply.status === 204;
}
