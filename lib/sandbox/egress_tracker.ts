/**
 * A sandbox's egress while it is open: whether (and as whom) it reaches the
 * egress proxy, recorded for its posture and read again when the config
 * file changes; and, on each call of an attached sandbox, its policy written
 * and the proxy serving it. The egress modules load only for an attached
 * sandbox.
 *
 * @module
 */
import type { WaffleConfig } from "../config/config.ts";
import { homeEgress } from "../config/egress_paths.ts";
import type { EgressAttachment } from "../config/egress_types.ts";
import { type ResolvedSandbox, sandboxAttachment } from "../config/resolve.ts";
import { recordAttachment } from "../lifecycle/egress_mounts.ts";

/**
 * Whether (and as whom) a sandbox reaches the egress proxy, recorded for its
 * posture. Its lists apply live: each call reads the config file again when
 * it changed, so an edited waffle.toml governs the next connection.
 *
 * @param resolved The sandbox as the config resolved it when it was opened.
 * @param options The config file (to notice an edit), the sandbox's state root, and how to reload.
 * @returns The sandbox's egress identity now (undefined: none).
 * @throws {UsageError} When a mount path of the identity is unsafe.
 */
export function egressTracker(
  resolved: ResolvedSandbox,
  options: { path: string | undefined; root: string; reload: () => WaffleConfig },
): () => EgressAttachment | undefined {
  const home = resolved.config.home;
  let egress = resolved.egress;
  recordAttachment(options.root, { home, attachment: egress });
  let seen = fileStamp(options.path);
  return () => {
    const stamp = fileStamp(options.path);
    if (stamp === seen) return egress;
    seen = stamp;
    egress = sandboxAttachment(options.reload(), resolved.key);
    recordAttachment(options.root, { home, attachment: egress });
    return egress;
  };
}

// A file's modification time and size, to notice an edit; "" when absent.
function fileStamp(path: string | undefined): string {
  if (path === undefined) return "";
  try {
    const stat = Deno.statSync(path);
    return `${stat.mtime?.getTime()}:${stat.size}`;
  } catch {
    return "";
  }
}

/**
 * Writes an attached sandbox's policy (the config may have changed since the
 * last call) and has the proxy serve it.
 *
 * @param home The waffle home.
 * @param egress The sandbox's identity.
 * @returns False when either fails (the full ensure then starts the proxy).
 */
export async function egressServing(home: string, egress: EgressAttachment): Promise<boolean> {
  try {
    // Loaded here, for an attached sandbox only.
    const { controlCall, writePolicy } = await import("../egress/policy_writer.ts");
    writePolicy(home, egress);
    await controlCall(homeEgress(home), "sync");
    return true;
  } catch {
    return false;
  }
}
