/**
 * What the queue's files sit on, for the evidence header: looked at from
 * inside the container (its `/proc/self/mountinfo`, read by waffle's own
 * Deno so any image can be looked at) and, for a bind mount, on this host.
 * Docker Desktop's file sharing shows inside as `virtiofs` or `fakeowner`
 * (VirtioFS), `fuse.grpcfuse` (gRPC-FUSE) or `fuse.osxfs`.
 *
 * @module
 */
import * as z from "../schema.ts";
import { SANDBOX_DENO_ARGV, SANDBOX_DENO_ENV } from "../lifecycle/posture.ts";
import type { QueueRig } from "./rig.ts";

/** One mount as a mountinfo line describes it. */
export interface MountEntry {
  /** The mount point. */
  mountPoint: string;
  /** The filesystem type, e.g. `ext4`, `virtiofs`, `fuse.grpcfuse`. */
  fsType: string;
  /** The mount source, e.g. `/dev/vda`. */
  source: string;
}

/** Where the queue's files sit, as seen from inside and outside the container. */
export interface QueueMountFacts {
  /** `bind mount` or `volume`. */
  kind: QueueRig["mount"];
  /** The container's `/queue/inbound` and `/queue/outbound` mounts. */
  inside: { inbound: MountEntry | undefined; outbound: MountEntry | undefined };
  /** The host's mounts holding the queue's directories (Linux hosts, bind mounts only). */
  host: { inbound: MountEntry | undefined; outbound: MountEntry | undefined };
  /** One line, e.g. `bind mount (host filesystem ext4 on /dev/vda)` or `VirtioFS (Docker Desktop)`. */
  describe: string;
}

const entrySchema = z.object({ mountPoint: z.string(), fsType: z.string(), source: z.string() });
const probeSchema = z.object({
  inbound: z.optional(entrySchema),
  outbound: z.optional(entrySchema),
});

// Runs inside the sandbox: the queue's two mounts out of mountinfo.
const PROBE = `
const unescape = (s) => s.replace(/\\\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)));
const entries = Deno.readTextFileSync("/proc/self/mountinfo").split("\\n").filter(Boolean).map((line) => {
  const [left, right = ""] = line.split(" - ");
  const fields = left.split(" ");
  const [fsType = "", source = ""] = right.split(" ");
  return { mountPoint: unescape(fields[4] ?? ""), fsType, source: unescape(source) };
});
const at = (p) => entries.filter((e) => e.mountPoint === p).at(-1);
console.log(JSON.stringify({ inbound: at("/queue/inbound"), outbound: at("/queue/outbound") }));
`;

/**
 * Looks at where a rig's queue files sit.
 *
 * @param rig A rig whose runner serves.
 * @returns The facts and their one-line description.
 *
 * @example
 * ```ts ignore
 * (await queueMountFacts(rig)).describe; // "bind mount (host filesystem ext4 on /dev/vda)"
 * ```
 */
export async function queueMountFacts(rig: QueueRig): Promise<QueueMountFacts> {
  const inside = await probeInside(rig);
  const host = rig.mount === "bind mount"
    ? { inbound: hostMountOf(rig.paths.inboundDir), outbound: hostMountOf(rig.paths.outboundDir) }
    : { inbound: undefined, outbound: undefined };
  return { kind: rig.mount, inside, host, describe: describeMount(rig.mount, { inside, host }) };
}

async function probeInside(rig: QueueRig): Promise<QueueMountFacts["inside"]> {
  const id = await rig.submit({
    argv: [...SANDBOX_DENO_ARGV, "eval", "--quiet", PROBE],
    env: { ...SANDBOX_DENO_ENV },
    outputCap: 16_384,
  });
  const { result, stdout } = await rig.queue.collect(id);
  await rig.queue.ack(id);
  const text = new TextDecoder().decode(stdout).trim();
  const parsed = result.exitCode === 0 ? probeSchema.safeParse(safeJson(text)) : undefined;
  if (parsed?.success !== true) return { inbound: undefined, outbound: undefined };
  return { inbound: parsed.data.inbound, outbound: parsed.data.outbound };
}

/**
 * The one-line description of a queue's mount.
 *
 * @param kind Bind mount or volume.
 * @param seen The mounts inside and on the host.
 * @returns E.g. `VirtioFS (Docker Desktop file sharing)`.
 *
 * @example
 * ```ts
 * import { describeMount } from "./mounts.ts";
 * const entry = { mountPoint: "/queue/outbound", fsType: "fuse.grpcfuse", source: "grpcfuse" };
 * describeMount("bind mount", {
 *   inside: { inbound: entry, outbound: entry },
 *   host: { inbound: undefined, outbound: undefined },
 * }); // "gRPC-FUSE (Docker Desktop file sharing)"
 * ```
 */
export function describeMount(
  kind: QueueRig["mount"],
  seen: Pick<QueueMountFacts, "inside" | "host">,
): string {
  const inside = seen.inside.outbound ?? seen.inside.inbound;
  const sharing = inside === undefined ? undefined : desktopSharing(inside.fsType);
  if (sharing !== undefined) return `${sharing} (Docker Desktop file sharing)`;
  const fs = (entry: MountEntry | undefined): string =>
    entry === undefined ? "?" : `${entry.fsType} on ${entry.source}`;
  if (kind === "volume") return `Docker named volume (${fs(inside)} in the daemon's filesystem)`;
  const { inbound, outbound } = seen.host;
  if (inbound === undefined && outbound === undefined) {
    return `bind mount (${fs(inside)} as the container sees it)`;
  }
  return inbound?.fsType === outbound?.fsType && inbound?.source === outbound?.source
    ? `bind mount (host filesystem ${fs(outbound)})`
    : `bind mount (host filesystem: inbound ${fs(inbound)}, outbound ${fs(outbound)})`;
}

function desktopSharing(fsType: string): string | undefined {
  if (fsType === "virtiofs" || fsType === "fakeowner") return "VirtioFS";
  if (fsType === "fuse.grpcfuse") return "gRPC-FUSE";
  if (fsType === "fuse.osxfs") return "osxfs";
  return undefined;
}

/**
 * The host mount a directory lives on (the longest mount point above it),
 * from `/proc/self/mountinfo`; undefined where there is none (not Linux).
 *
 * @param dir A directory on this host.
 * @returns Its mount.
 */
export function hostMountOf(dir: string): MountEntry | undefined {
  let real: string;
  let info: string;
  try {
    real = Deno.realPathSync(dir);
    info = Deno.readTextFileSync("/proc/self/mountinfo");
  } catch {
    return undefined;
  }
  const unescape = (s: string): string =>
    s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
  const entries = info.split("\n").filter((line) => line !== "").map((line): MountEntry => {
    const [left = "", right = ""] = line.split(" - ");
    const [fsType = "", source = ""] = right.split(" ");
    return { mountPoint: unescape(left.split(" ")[4] ?? ""), fsType, source: unescape(source) };
  });
  const under = (point: string): boolean =>
    point === "/" || real === point || real.startsWith(`${point}/`);
  // The last of the longest: a mount stacked on another hides it.
  return entries.filter((e) => under(e.mountPoint))
    .reduce<MountEntry | undefined>(
      (best, e) => best === undefined || e.mountPoint.length >= best.mountPoint.length ? e : best,
      undefined,
    );
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
