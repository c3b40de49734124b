/**
 * Which process a certification run's resources belong to, so that the next
 * run can tell the leftovers of a dead one (killed, crashed) from those of a
 * run still going. The owner is this host's boot, its pid namespace, and the
 * process's pid and start time: a pid reused later reads differently, and a
 * run owned on another host (a shared daemon) or in another pid namespace is
 * never judged from here.
 *
 * @module
 */
import { processMark } from "../process_mark.ts";
import { CERTIFY_LABEL } from "./cleanup.ts";

/** The label naming the process that owns a certification run's container or volume. */
export const CERTIFY_OWNER_LABEL = "waffle.certify.owner";

/** The file naming the owner in a certification sandbox's throwaway home. */
export const OWNER_FILE = "certify-owner";

/**
 * This process's owner mark: `<boot id> <pid namespace> <pid> <start time>`.
 *
 * @returns The mark.
 *
 * @example
 * ```ts
 * import { runOwner } from "./owner.ts";
 * runOwner().split(" ").length; // 4
 * ```
 */
export function runOwner(): string {
  return `${hostScope()} ${processMark(Deno.pid) ?? `${Deno.pid} ?`}`;
}

/**
 * The labels of every container and volume a run creates itself: its id and its owner.
 *
 * @param runId The run's id.
 * @returns The labels.
 */
export function runLabels(runId: string): Record<string, string> {
  return { [CERTIFY_LABEL]: runId, [CERTIFY_OWNER_LABEL]: runOwner() };
}

/**
 * Whether an owner mark names a process of this host's boot and pid
 * namespace that is gone. A mark of elsewhere, or one that does not parse,
 * is not judged: false (so is every mark where /proc is missing).
 *
 * @param owner The mark ({@linkcode runOwner}), as read back.
 * @returns True when its run is dead.
 */
export function ownerGone(owner: string | undefined): boolean {
  const parts = owner?.trim().split(" ") ?? [];
  if (parts.length !== 4) return false;
  const [boot, namespace, pid, start] = parts as [string, string, string, string];
  // Without /proc (macOS) nothing can be told apart: nothing is judged.
  if (`${boot} ${namespace}` !== hostScope() || [boot, namespace, start].includes("?")) {
    return false;
  }
  const number = Number(pid);
  if (!Number.isSafeInteger(number) || number <= 0) return false;
  return processMark(number) !== `${pid} ${start}`;
}

// This boot of this host, and the pid namespace pids are read in.
function hostScope(): string {
  const read = (what: () => string): string => {
    try {
      return what().trim().replaceAll(" ", "_") || "?";
    } catch {
      return "?";
    }
  };
  const boot = read(() => Deno.readTextFileSync("/proc/sys/kernel/random/boot_id"));
  const namespace = read(() => Deno.readLinkSync("/proc/self/ns/pid"));
  return `${boot} ${namespace}`;
}
