/**
 * The console's view of the two audits of a waffle home: the egress proxy's
 * (`$WAFFLE_HOME/egress.jsonl`, and its rotated `.1` when the tail reaches
 * into it) and the MCP relay's (`$WAFFLE_HOME/audit.jsonl`). Only their
 * tail is read (at most {@linkcode AUDIT_TAIL_BYTES}); each line is
 * size-capped and validated before use (a bad one is skipped, never
 * fatal), then kept only when the caller's scope (a tenant, or every one
 * for an admin key) owns it. A sandbox is an identity whose user is its id.
 *
 * @module
 */
import { join } from "../path.ts";
import * as z from "../schema.ts";
import { egressAuditFile } from "../egress/proxy_container.ts";
import { AUDIT_FILE, type AuditRecord } from "../mcp/audit.ts";
import type { EgressAuditLine } from "../egress/audit.ts";

/** The most bytes read of an audit, newest first (across its rotation). */
export const AUDIT_TAIL_BYTES = 8 << 20;
/** A line longer than this is skipped unread (the writers cut every field to 512 characters). */
const MAX_LINE_BYTES = 64 * 1024;
/** The most entries one answer holds. */
export const MAX_AUDIT_ENTRIES = 1000;
/** The most destinations (or servers) one answer counts. */
const MAX_GROUPS = 100;
/** Minutes of the series. */
const SERIES_MINUTES = 60;

const text = (max: number) => z.string().check(z.maxLength(max));
const count = z.optional(z.int().check(z.minimum(1), z.maximum(1e9)));
const amount = z.number().check(z.minimum(0), z.maximum(Number.MAX_SAFE_INTEGER));

/** An egress audit line as read back (the proxy's `EgressAuditLine`). */
const egressLineSchema = z.object({
  time: text(64),
  tenant: text(600),
  user: text(600),
  method: z.nullable(text(600)),
  destination: z.nullable(text(600)),
  port: z.nullable(z.int().check(z.minimum(0), z.maximum(65535))),
  address: z.nullable(text(600)),
  decision: z.enum(["allowed", "denied"]),
  reason: z.optional(text(600)),
  bytesUp: amount,
  bytesDown: amount,
  durationMs: amount,
  count,
});

const OUTCOMES = [
  "ok",
  "tool_error",
  "error",
  "denied",
  "refused",
  "no_response",
  "cancelled",
  "too_large",
  "unaudited",
] as const;

/** An MCP audit line as read back (the relay's `AuditRecord`). */
const mcpLineSchema = z.object({
  time: text(64),
  user: z.nullable(text(600)),
  tenant: text(600),
  server: text(600),
  from: z.enum(["client", "server"]),
  method: text(600),
  tool: z.optional(text(600)),
  arguments: z.optional(z.array(text(600)).check(z.maxLength(256))),
  durationMs: amount,
  outcome: z.enum(OUTCOMES),
  count,
});

// The readers' shapes stay the writers' (a field renamed there fails to compile here).
type Assignable<T, U extends T> = U;
type _EgressShape = Assignable<
  Pick<EgressAuditLine, "tenant" | "user" | "decision" | "port">,
  z.infer<typeof egressLineSchema>
>;
type _McpShape = Assignable<
  Pick<AuditRecord, "tenant" | "server" | "outcome" | "from">,
  z.infer<typeof mcpLineSchema>
>;

/** Which lines a caller may see and asked for. */
export interface AuditQuery {
  /** The caller's tenant; undefined: every tenant's (an admin key). */
  scope: string | undefined;
  /** Only this sandbox's (an identity whose user is it). */
  sandbox?: string | undefined;
  /** A case-insensitive substring of the searched fields. */
  q?: string | undefined;
  /** The most entries (at most {@linkcode MAX_AUDIT_ENTRIES}). */
  limit: number;
  /** Now, for the series' last minute (ms since the epoch). */
  now: number;
}

/** One egress entry of the console. */
export interface EgressEntry {
  /** When it was accepted (ISO). */
  time: string;
  /** Its identity's tenant. */
  tenant: string;
  /** Its identity's user: the sandbox id. */
  sandbox: string;
  /** `CONNECT` or the request's method. */
  method: string | null;
  /** The host asked for. */
  destination: string | null;
  /** The port asked for. */
  port: number | null;
  /** The address connected to. */
  address: string | null;
  /** Allowed or denied. */
  decision: "allowed" | "denied";
  /** Why denied, or how an allowed one ended badly. */
  reason: string | null;
  /** Bytes up. */
  bytesUp: number;
  /** Bytes down. */
  bytesDown: number;
  /** Accept to close. */
  durationMs: number;
  /** Connections the line stands for. */
  count: number;
}

/** The answer of `GET /waffle/v1/egress`. */
export interface EgressView {
  /** Newest first. */
  entries: EgressEntry[];
  /** Per destination and port, most first. */
  destinations: {
    destination: string | null;
    port: number | null;
    allowed: number;
    denied: number;
  }[];
  /** The last 60 minutes, oldest first. */
  series: { minute: string; allowed: number; denied: number }[];
}

/** One MCP entry of the console. */
export interface McpEntry {
  /** When the request was received (ISO). */
  time: string;
  /** The tenant. */
  tenant: string;
  /** The record's user: the sandbox id (null for a host server). */
  sandbox: string | null;
  /** The MCP server. */
  server: string;
  /** Who sent the request. */
  from: "client" | "server";
  /** The method. */
  method: string;
  /** The tool called. */
  tool: string | null;
  /** The arguments' names. */
  arguments: string[];
  /** Request to response. */
  durationMs: number;
  /** How it ended. */
  outcome: string;
  /** Requests the line stands for. */
  count: number;
}

/** The answer of `GET /waffle/v1/mcp`. */
export interface McpView {
  /** Newest first. */
  entries: McpEntry[];
  /** Per server, most first. */
  servers: { server: string; ok: number; failed: number }[];
  /** The last 60 minutes, oldest first. */
  series: { minute: string; ok: number; failed: number }[];
}

/**
 * The egress audit's tail, as the caller may see it.
 *
 * @param home The waffle home.
 * @param query Scope, filters, limit and now.
 * @returns Entries (newest first), per-destination counts and the per-minute series.
 */
export async function egressView(
  home: string,
  query: AuditQuery & { decision?: "allowed" | "denied" | undefined },
): Promise<EgressView> {
  const path = egressAuditFile(home);
  let rotated: string | undefined;
  try {
    // The link names the proxy's file; it rotates beside itself.
    rotated = `${Deno.realPathSync(path)}.1`;
  } catch {
    rotated = undefined;
  }
  const lines = await tailLines(rotated === undefined ? [path] : [path, rotated]);
  const needle = query.q?.toLowerCase();
  const entries: EgressEntry[] = [];
  for (const line of lines) {
    const parsed = parseLine(line, egressLineSchema);
    if (parsed === undefined || !Number.isFinite(Date.parse(parsed.time))) continue;
    if (query.scope !== undefined && parsed.tenant !== query.scope) continue;
    if (query.sandbox !== undefined && parsed.user !== query.sandbox) continue;
    if (query.decision !== undefined && parsed.decision !== query.decision) continue;
    const entry: EgressEntry = {
      time: parsed.time,
      tenant: parsed.tenant,
      sandbox: parsed.user,
      method: parsed.method,
      destination: parsed.destination,
      port: parsed.port,
      address: parsed.address,
      decision: parsed.decision,
      reason: parsed.reason ?? null,
      bytesUp: parsed.bytesUp,
      bytesDown: parsed.bytesDown,
      durationMs: parsed.durationMs,
      count: parsed.count ?? 1,
    };
    if (needle !== undefined && !matches(needle, entry)) continue;
    entries.push(entry);
  }
  const groups = new Map<string, EgressView["destinations"][number]>();
  for (const entry of entries) {
    const key = JSON.stringify([entry.destination, entry.port]);
    const group = groups.get(key) ??
      { destination: entry.destination, port: entry.port, allowed: 0, denied: 0 };
    group[entry.decision] += entry.count;
    groups.set(key, group);
  }
  const series = minutes(query.now, () => ({ allowed: 0, denied: 0 }));
  for (const entry of entries) {
    series.add(entry.time, (bucket) => bucket[entry.decision] += entry.count);
  }
  return {
    entries: entries.reverse().slice(0, cap(query.limit)),
    destinations: [...groups.values()]
      .sort((a, b) => b.allowed + b.denied - (a.allowed + a.denied))
      .slice(0, MAX_GROUPS),
    series: series.list(),
  };
}

/**
 * The MCP audit's tail, as the caller may see it.
 *
 * @param home The waffle home.
 * @param query Scope, filters, limit and now.
 * @returns Entries (newest first), per-server counts and the per-minute series.
 */
export async function mcpView(home: string, query: AuditQuery): Promise<McpView> {
  const lines = await tailLines([join(home, AUDIT_FILE)]);
  const needle = query.q?.toLowerCase();
  const entries: McpEntry[] = [];
  for (const line of lines) {
    const parsed = parseLine(line, mcpLineSchema);
    if (parsed === undefined || !Number.isFinite(Date.parse(parsed.time))) continue;
    if (query.scope !== undefined && parsed.tenant !== query.scope) continue;
    if (query.sandbox !== undefined && parsed.user !== query.sandbox) continue;
    const entry: McpEntry = {
      time: parsed.time,
      tenant: parsed.tenant,
      sandbox: parsed.user,
      server: parsed.server,
      from: parsed.from,
      method: parsed.method,
      tool: parsed.tool ?? null,
      arguments: parsed.arguments ?? [],
      durationMs: parsed.durationMs,
      outcome: parsed.outcome,
      count: parsed.count ?? 1,
    };
    if (needle !== undefined && !matches(needle, entry)) continue;
    entries.push(entry);
  }
  const groups = new Map<string, McpView["servers"][number]>();
  for (const entry of entries) {
    const group = groups.get(entry.server) ?? { server: entry.server, ok: 0, failed: 0 };
    group[entry.outcome === "ok" ? "ok" : "failed"] += entry.count;
    groups.set(entry.server, group);
  }
  const series = minutes(query.now, () => ({ ok: 0, failed: 0 }));
  for (const entry of entries) {
    series.add(
      entry.time,
      (bucket) => bucket[entry.outcome === "ok" ? "ok" : "failed"] += entry.count,
    );
  }
  return {
    entries: entries.reverse().slice(0, cap(query.limit)),
    servers: [...groups.values()].sort((a, b) => b.ok + b.failed - (a.ok + a.failed))
      .slice(0, MAX_GROUPS),
    series: series.list(),
  };
}

function cap(limit: number): number {
  return Math.min(Math.max(Math.trunc(limit) || 0, 1), MAX_AUDIT_ENTRIES);
}

// Searched fields: every string of the entry (destination, sandbox, reason, address; server, tool…).
function matches(needle: string, entry: EgressEntry | McpEntry): boolean {
  const fields = "decision" in entry
    ? [entry.destination, entry.sandbox, entry.reason, entry.address]
    : [entry.server, entry.sandbox, entry.tool, entry.method, entry.outcome];
  return fields.some((field) => field !== null && field.toLowerCase().includes(needle));
}

function parseLine<T>(line: string, schema: z.ZodMiniType<T>): T | undefined {
  if (line.length === 0 || line.length > MAX_LINE_BYTES) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    return undefined;
  }
  const parsed = schema.safeParse(value);
  return parsed.success ? parsed.data : undefined;
}

// Per-minute buckets of the last SERIES_MINUTES minutes before `now`.
function minutes<B extends Record<string, number>>(now: number, empty: () => B): {
  add(time: string, bump: (bucket: B) => void): void;
  list(): ({ minute: string } & B)[];
} {
  const last = Math.floor(now / 60_000);
  const buckets = Array.from({ length: SERIES_MINUTES }, empty);
  return {
    add(time, bump): void {
      const at = Math.floor(Date.parse(time) / 60_000) - (last - SERIES_MINUTES + 1);
      if (at >= 0 && at < SERIES_MINUTES) bump(buckets[at]!);
    },
    list: () =>
      buckets.map((bucket, i) => ({
        minute: new Date((last - SERIES_MINUTES + 1 + i) * 60_000).toISOString(),
        ...bucket,
      })),
  };
}

/**
 * The whole lines of the last {@linkcode AUDIT_TAIL_BYTES} of a log and,
 * when the newest file holds fewer, of the files before it, oldest first.
 * A file that is missing or not a regular file holds nothing.
 *
 * @param files The newest file first, then its rotations.
 * @returns The lines, oldest first (the first one cut by the window dropped).
 */
async function tailLines(files: string[]): Promise<string[]> {
  let budget = AUDIT_TAIL_BYTES;
  const chunks: string[][] = [];
  for (const path of files) {
    if (budget <= 0) break;
    const read = await readTail(path, budget);
    if (read === undefined) continue;
    budget -= read.bytes;
    const lines = new TextDecoder().decode(read.data).split("\n");
    // A window that starts mid-file starts mid-line.
    if (read.cut) lines.shift();
    chunks.unshift(lines);
    if (read.cut) break;
  }
  return chunks.flat();
}

async function readTail(
  path: string,
  budget: number,
): Promise<{ data: Uint8Array; bytes: number; cut: boolean } | undefined> {
  let file: Deno.FsFile;
  try {
    // Checked before it is opened: a FIFO would block the open.
    if (!Deno.statSync(path).isFile) return undefined;
    file = await Deno.open(path, { read: true });
  } catch {
    return undefined;
  }
  try {
    const info = await file.stat();
    if (!info.isFile) return undefined;
    const length = Math.min(info.size, budget);
    const start = info.size - length;
    await file.seek(start, Deno.SeekMode.Start);
    const data = new Uint8Array(length);
    let at = 0;
    while (at < length) {
      const n = await file.read(data.subarray(at));
      if (n === null) break;
      at += n;
    }
    return { data: data.subarray(0, at), bytes: at, cut: start > 0 };
  } finally {
    file.close();
  }
}
