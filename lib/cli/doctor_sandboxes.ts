/**
 * doctor's sandbox rows: one `sandbox <who>` row per sandbox of this waffle
 * home, from the host's view of its state directory. Each row is a check of
 * its own, so a sandbox that cannot be looked at (however its sandbox or a
 * killed host left it) is one row that says so; the rest are still reported.
 *
 * A row reads only what is bounded whatever the sandbox did: names in the
 * host's own directories, the types of `outbound/` and `workspace/`, the
 * heartbeat file (through `liveness.ts`, the one judgement of a runner), and
 * `warm.json`. It never walks a tree or reads `outbound.db`. What the next
 * call heals (a missing or replaced `outbound/`, set-aside trees, a stale
 * warm record) is a warning, not a failure: doctor checks the host.
 *
 * @module
 */
import { join } from "../path.ts";
import { loadConfig } from "../config/config.ts";
import { DockerClient } from "../docker/mod.ts";
import { judgeRunner } from "../queue/liveness.ts";
import { queuePaths } from "../queue/schema.ts";
import { stateLayout } from "../lifecycle/identity.ts";
import { outboundInPlace } from "../lifecycle/outbound_in_place.ts";
import { LABELS } from "../lifecycle/posture.ts";
import { inspectState } from "../lifecycle/state_dir.ts";
import { readWarm } from "../lifecycle/warm.ts";
import type { CheckOutcome, DoctorCheck } from "./doctor.ts";

/** At most this many sandbox rows; one more row counts the rest. */
export const MAX_SANDBOX_ROWS = 100;

/** How long the container list (for the rows' names) may take before rows go by hash. */
const LIST_TIMEOUT_MS = 5000;

/** How long one sandbox's row may take. */
const ROW_TIMEOUT_MS = 10_000;

/**
 * The sandbox rows of this home, one check per sandbox.
 *
 * @param options `docker`: name the rows by tenant and user from the containers' labels.
 * @returns The checks (none when the home has no sandbox).
 */
export async function sandboxChecks(options: { docker: boolean }): Promise<DoctorCheck[]> {
  const home = loadConfig().home;
  const dir = join(home, "sandboxes");
  let names: string[];
  try {
    // The host's own directory: one name per sandbox, made by the host.
    names = [...Deno.readDirSync(dir)].map((entry) => entry.name).sort();
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return [];
    return [{ name: "sandboxes", run: () => Promise.reject(error) }];
  }
  const purged = names.filter((name) => name.startsWith(".purged-")).length;
  const roots = names.filter((name) => !name.startsWith("."));
  const who = options.docker ? await ownersByRoot() : new Map<string, string>();
  const checks: DoctorCheck[] = roots.slice(0, MAX_SANDBOX_ROWS).map((name) => {
    const root = join(dir, name);
    const label = who.get(root) ?? name.slice(0, 12);
    return {
      name: `sandbox ${label}`,
      timeoutMs: ROW_TIMEOUT_MS,
      run: () => Promise.resolve().then(() => sandboxRow(root)),
    };
  });
  if (roots.length > MAX_SANDBOX_ROWS || purged > 0) {
    const more = roots.length - Math.min(roots.length, MAX_SANDBOX_ROWS);
    checks.push({
      name: "sandboxes",
      run: () =>
        Promise.resolve({
          detail: [
            ...(more > 0 ? [`${more} more not shown`] : []),
            ...(purged > 0 ? [`${purged} purged state root(s) not yet fully removed`] : []),
          ].join("; "),
          warning: true,
        }),
    });
  }
  return checks;
}

// One sandbox: what the next call would find, and what it heals.
function sandboxRow(root: string): CheckOutcome {
  const layout = stateLayout(root);
  const state = inspectState(layout);
  const heals: string[] = [];
  if (state.outbound !== "directory") {
    heals.push(
      state.outbound === "missing"
        ? "outbound/ is missing (the next call makes it anew)"
        : "outbound/ is not a directory",
    );
  } else if (state.replaced) {
    heals.push("outbound/ was reset since the container started (the next call restarts it)");
  }
  if (state.workspace !== "directory") {
    heals.push(`workspace/ is ${state.workspace === "missing" ? "missing" : "not a directory"}`);
  }
  if (state.setAside > 0) {
    heals.push(`${state.setAside} set-aside outbound/ tree(s) waiting for removal`);
  }
  if (readWarm(root) !== undefined && !outboundInPlace(layout)) {
    heals.push("warm.json is stale (ignored: the next call does a full ensure)");
  }
  const judged = judgeRunner(queuePaths(layout.queue, { outboundDir: layout.outbound }).heartbeat, {
    queue: layout.queue,
  });
  const runner = judged.changedAt === undefined || judged.changedAt === 0
    ? `runner ${judged.state}`
    : `runner ${judged.state} (heartbeat ${
      Math.max(0, Math.round((Date.now() - judged.changedAt) / 1000))
    } s old)`;
  if (heals.length === 0) return `${runner}; outbound/ and workspace/ in place`;
  return { detail: `${heals.join("; ")}; ${runner}`, warning: true };
}

// The tenant and user of each state root, from the containers' labels; an
// empty map when the daemon does not answer in time.
async function ownersByRoot(): Promise<Map<string, string>> {
  const owners = new Map<string, string>();
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const docker = new DockerClient({ timeoutMs: LIST_TIMEOUT_MS });
    const listed = await Promise.race([
      docker.listContainers({ all: true, labels: [LABELS.key] }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error("timed out")), LIST_TIMEOUT_MS);
      }),
    ]);
    for (const container of listed) {
      const root = container.Labels[LABELS.state];
      const tenant = container.Labels[LABELS.tenant];
      const user = container.Labels[LABELS.user];
      if (root !== undefined && tenant !== undefined && user !== undefined) {
        owners.set(root, `${tenant}/${user}`);
      }
    }
  } catch {
    // Rows are named by hash instead.
  } finally {
    clearTimeout(timer);
  }
  return owners;
}
