/**
 * The console's view of the two audits of a waffle home: the egress proxy's
 * (`$WAFFLE_HOME/egress.jsonl`, and its rotated `.1` when the tail reaches
 * into it) and the MCP relay's (`$WAFFLE_HOME/audit.jsonl`). Only their
 * tail is read (at most {@linkcode AUDIT_TAIL_BYTES}); each line is
 * size-capped and validated before use (a bad one is skipped, never
 * fatal), then kept only when the caller's scope (a tenant, or every one
 * for an admin key) owns it. A sandbox is an identity whose user is its id.
 * The parsed tail is kept between calls ({@linkcode AuditWindows}): a poll
 * parses only what was appended since the last one.
 *
 * @module
 */
import { join } from "../path.ts";
import * as z from "../schema.ts";
import { egressAuditFile } from "../egress/proxy_container.ts";
import { AUDIT_FILE, type AuditRecord } from "../mcp/audit.ts";
import type { EgressAuditLine } from "../egress/audit.ts";
import { AuditWindows } from "./audit_window.ts";
import type { EgressEntry, EgressView, McpEntry, McpView } from "./console_types.ts";

export type { EgressEntry, EgressView, McpEntry, McpView };

/** The most bytes read of an audit, newest first (across its rotation). */
export const AUDIT_TAIL_BYTES = 8 << 20;
/** A line longer than this (UTF-16 code units) is skipped (the writers cut every field to 512 characters). */
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
  /**
   * With a scope: the ids of the scope's sandboxes in the server's store.
   * A line is the tenant's only when its user is one of them (a CLI user
   * of the home may share the tenant's name); undefined: none is.
   */
  owned?: ReadonlySet<string> | undefined;
  /** Only this sandbox's (an identity whose user is it). */
  sandbox?: string | undefined;
  /** A case-insensitive substring of the searched fields. */
  q?: string | undefined;
  /** The most entries (at most {@linkcode MAX_AUDIT_ENTRIES}). */
  limit: number;
  /** Now, for the series' last minute (ms since the epoch). */
  now: number;
}

// Each cached entry's minute since the epoch, parsed with its line (the series is made on every call).
const entryMinutes = new WeakMap<EgressEntry | McpEntry, number>();

function minuteOf(entry: EgressEntry | McpEntry): number {
  return entryMinutes.get(entry) ?? Math.floor(Date.parse(entry.time) / 60_000);
}

// The entry, its minute noted; undefined when its time is not a date.
function dated<E extends EgressEntry | McpEntry>(entry: E): E | undefined {
  const time = Date.parse(entry.time);
  if (!Number.isFinite(time)) return undefined;
  entryMinutes.set(entry, Math.floor(time / 60_000));
  return entry;
}

// A line of the egress audit as the console's entry; undefined when invalid.
function egressEntry(line: string): EgressEntry | undefined {
  const parsed = parseLine(line, egressLineSchema);
  if (parsed === undefined) return undefined;
  return dated({
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
  });
}

// A line of the MCP audit as the console's entry; undefined when invalid.
function mcpEntry(line: string): McpEntry | undefined {
  const parsed = parseLine(line, mcpLineSchema);
  if (parsed === undefined) return undefined;
  return dated({
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
  });
}

// The parsed windows, kept between calls (entries are never changed once made: answers share them).
const WINDOW_OPTIONS = { maxBytes: AUDIT_TAIL_BYTES, maxLineChars: MAX_LINE_BYTES };
const egressWindows = new AuditWindows(egressEntry, WINDOW_OPTIONS);
const mcpWindows = new AuditWindows(mcpEntry, WINDOW_OPTIONS);

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
  const all = await egressWindows.tail(rotated === undefined ? [path] : [path, rotated]);
  const needle = query.q?.toLowerCase();
  const entries = all.filter((entry) =>
    inScope(query, entry) &&
    (query.sandbox === undefined || entry.sandbox === query.sandbox) &&
    (query.decision === undefined || entry.decision === query.decision) &&
    (needle === undefined || matches(needle, entry))
  );
  const groups = new Map<string, EgressView["destinations"][number]>();
  for (const entry of entries) {
    // A port has no '|'; a null destination is told from any string by its missing 's'.
    const key = `${entry.port}|${entry.destination === null ? "" : `s${entry.destination}`}`;
    const group = groups.get(key) ??
      { destination: entry.destination, port: entry.port, allowed: 0, denied: 0 };
    group[entry.decision] += entry.count;
    groups.set(key, group);
  }
  const series = minutes(query.now, () => ({ allowed: 0, denied: 0 }));
  for (const entry of entries) {
    series.add(entry, (bucket) => bucket[entry.decision] += entry.count);
  }
  return {
    entries: entries.reverse().slice(0, cap(query.limit)),
    destinations: [...groups.values()]
      .sort((a, b) => b.allowed + b.denied - (a.allowed + a.denied))
      .slice(0, MAX_GROUPS),
    series: series.list(),
  };
}

// An admin sees every line; a tenant its own sandboxes' lines, never a same-named CLI tenant's.
function inScope(query: AuditQuery, entry: { tenant: string; sandbox: string | null }): boolean {
  if (query.scope === undefined) return true;
  return entry.tenant === query.scope && entry.sandbox !== null &&
    query.owned?.has(entry.sandbox) === true;
}

/**
 * The MCP audit's tail, as the caller may see it.
 *
 * @param home The waffle home.
 * @param query Scope, filters, limit and now.
 * @returns Entries (newest first), per-server counts and the per-minute series.
 */
export async function mcpView(home: string, query: AuditQuery): Promise<McpView> {
  const all = await mcpWindows.tail([join(home, AUDIT_FILE)]);
  const needle = query.q?.toLowerCase();
  const entries = all.filter((entry) =>
    inScope(query, entry) &&
    (query.sandbox === undefined || entry.sandbox === query.sandbox) &&
    (needle === undefined || matches(needle, entry))
  );
  const groups = new Map<string, McpView["servers"][number]>();
  for (const entry of entries) {
    const group = groups.get(entry.server) ?? { server: entry.server, ok: 0, failed: 0 };
    group[entry.outcome === "ok" ? "ok" : "failed"] += entry.count;
    groups.set(entry.server, group);
  }
  const series = minutes(query.now, () => ({ ok: 0, failed: 0 }));
  for (const entry of entries) {
    series.add(
      entry,
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

// The line cap and emptiness are checked by the window before this.
function parseLine<T>(line: string, schema: z.ZodMiniType<T>): T | undefined {
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
  add(entry: EgressEntry | McpEntry, bump: (bucket: B) => void): void;
  list(): ({ minute: string } & B)[];
} {
  const last = Math.floor(now / 60_000);
  const buckets = Array.from({ length: SERIES_MINUTES }, empty);
  return {
    add(entry, bump): void {
      const at = minuteOf(entry) - (last - SERIES_MINUTES + 1);
      if (at >= 0 && at < SERIES_MINUTES) bump(buckets[at]!);
    },
    list: () =>
      buckets.map((bucket, i) => ({
        minute: new Date((last - SERIES_MINUTES + 1 + i) * 60_000).toISOString(),
        ...bucket,
      })),
  };
}
