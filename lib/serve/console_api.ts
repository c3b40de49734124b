/**
 * waffle's own API for the console, under `/waffle/v1` on the control
 * API's listener and behind its key check (`X-API-KEY` only: never a query
 * string nor a cookie): who the key is, the sandboxes in its scope with
 * their costs, pool, egress and last command, a stop, each sandbox's recent
 * commands, and the egress and MCP audits' tails. The scope is the control
 * API's (`scopeOf`): a tenant key sees its tenant, an admin key every one;
 * another tenant's sandbox is not found. Errors are `{code, message}`.
 *
 * @module
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { UsageError } from "../errors.ts";
import { formatEntry } from "../config/egress_entries.ts";
import { type Caller, fail, scopeOf } from "./control.ts";
import type { SandboxRecord } from "./state.ts";
import { narrowing, type SandboxFleet } from "./sandboxes.ts";
import type { EgressGrant } from "./network.ts";
import type { MetricsRing } from "./metrics_ring.ts";
import { capArgv, type CommandLog, COMMANDS_KEPT, type ConsoleCommand } from "./command_log.ts";
import { queueCommands } from "./queue_commands.ts";
import type { Queue } from "../queue/queue.ts";
import { egressView, MAX_AUDIT_ENTRIES, mcpView } from "./audit_tail.ts";
import type { ConsoleSandbox, WhoAmI } from "./console_types.ts";

export type { ConsoleSandbox, WhoAmI };

// Characters of a sandbox's last command in the sandboxes table.
const LAST_ARGV_CHARS = 512;

/** The most commands one `commands` answer lists. */
export const MAX_COMMANDS = 200;

/** What a Docker server adds: containers it can stop and ask about. */
export interface ConsoleContainers {
  /** Stops a sandbox's container (`ServeSandboxes.stop`). */
  stop(record: SandboxRecord): Promise<boolean>;
  /** Whether a sandbox's container runs (`ServeSandboxes.running`). */
  running(record: SandboxRecord): Promise<boolean>;
  /** The warm pool a sandbox was taken from, when known. */
  pooledFrom(id: string): string | undefined;
  /** A sandbox's open queue (its requests beyond envd's, `queue_commands.ts`). */
  queue(record: SandboxRecord): Queue;
}

/** What the console's API needs of the server. */
export interface ConsoleApiDeps {
  /** The server's sandboxes. */
  sandboxes: SandboxFleet;
  /** Where they run. */
  backend: "docker" | "kubernetes";
  /** The waffle home (its audits). */
  home: string;
  /** What the config lets every sandbox reach (`ControlDeps.grant`). */
  grant: EgressGrant;
  /** Each sandbox's samples (Docker only). */
  metrics?: MetricsRing | undefined;
  /** Each sandbox's recent commands (Docker only). */
  commands?: CommandLog | undefined;
  /** The containers (Docker only). */
  containers?: ConsoleContainers | undefined;
}

type ConsoleContext = Context<{ Variables: { caller: Caller } }>;

/**
 * The routes under `/waffle/v1`, as a Hono app to mount on the control
 * API's (which has verified the key and set `caller`).
 *
 * @param deps The server's sandboxes, backend, home and observers.
 * @returns The app (its paths relative to `/waffle/v1`).
 */
export function consoleApi(deps: ConsoleApiDeps): Hono<{ Variables: { caller: Caller } }> {
  const app = new Hono<{ Variables: { caller: Caller } }>();
  // What a sandbox can influence is in these answers: never cached, never sniffed as markup.
  app.use("*", async (c, next) => {
    await next();
    c.header("cache-control", "no-store");
    c.header("x-content-type-options", "nosniff");
  });
  const owned = (c: ConsoleContext): SandboxRecord | undefined => {
    const record = deps.sandboxes.store.get(c.req.param("id") ?? "", scopeOf(c.get("caller")));
    return record === undefined || record.state === "creating" ||
        deps.sandboxes.removing(record.id)
      ? undefined
      : record;
  };
  const notFound = (c: ConsoleContext) =>
    fail(c, 404, `Sandbox '${(c.req.param("id") ?? "").slice(0, 64)}' not found`);

  app.get("/whoami", (c) => {
    const caller = c.get("caller");
    return c.json<WhoAmI>({
      tenant: caller.tenant,
      keyId: caller.keyId,
      keyName: caller.keyName,
      admin: caller.admin,
      backend: deps.backend,
      features: {
        metrics: deps.metrics !== undefined,
        snapshots: deps.sandboxes.snapshots !== undefined,
        fork: deps.backend === "docker",
        stop: deps.containers !== undefined,
      },
    });
  });
  app.get("/sandboxes", async (c) => {
    const records = deps.sandboxes.store.list(scopeOf(c.get("caller")))
      .filter((record) => record.state !== "creating" && !deps.sandboxes.removing(record.id));
    const sandboxes = await Promise.all(records.map((record) => consoleSandbox(record, deps)));
    return c.json({ at: Date.now(), sandboxes });
  });
  app.post("/sandboxes/:id/stop", async (c) => {
    const record = owned(c);
    if (record === undefined) return notFound(c);
    if (deps.containers === undefined) {
      return fail(c, 501, "Stopping a sandbox is not supported on this backend");
    }
    if (record.state === "paused") {
      return fail(c, 409, `Sandbox '${record.id}' is paused: resume it first`);
    }
    try {
      await deps.containers.stop(record);
    } catch (error) {
      if (error instanceof UsageError) return fail(c, 409, error.message);
      throw error;
    }
    return c.body(null, 204);
  });
  app.get("/sandboxes/:id/commands", (c) => {
    const record = owned(c);
    if (record === undefined) return notFound(c);
    const limit = numberQuery(c, "limit", { fallback: 50, max: MAX_COMMANDS });
    if (typeof limit !== "number") return limit;
    return c.json({ commands: commandsOf(record, deps, limit) });
  });
  auditRoutes(app, deps);
  app.notFound((c) => fail(c, 404, `No route '${c.req.method} ${c.req.path.slice(0, 200)}'`));
  return app;
}

// GET /egress and /mcp: the audits' tails in the caller's scope.
function auditRoutes(app: Hono<{ Variables: { caller: Caller } }>, deps: ConsoleApiDeps): void {
  const query = (c: ConsoleContext) => {
    const limit = numberQuery(c, "limit", { fallback: 200, max: MAX_AUDIT_ENTRIES });
    if (typeof limit !== "number") return limit;
    const sandbox = c.req.query("sandbox");
    const q = c.req.query("q");
    if ((sandbox !== undefined && sandbox.length > 128) || (q !== undefined && q.length > 256)) {
      return fail(c, 400, "Query 'sandbox' (128) or 'q' (256 characters) is too long");
    }
    const scope = scopeOf(c.get("caller"));
    return {
      scope,
      // Built once per answer: a line is the tenant's only when its user is one of its sandboxes.
      owned: scope === undefined
        ? undefined
        : new Set(deps.sandboxes.store.list(scope).map((record) => record.id)),
      ...(sandbox === undefined || sandbox === "" ? {} : { sandbox }),
      ...(q === undefined || q === "" ? {} : { q }),
      limit,
      now: Date.now(),
    };
  };
  app.get("/egress", async (c) => {
    const asked = query(c);
    if (asked instanceof Response) return asked;
    const decision = c.req.query("decision");
    if (
      decision !== undefined && decision !== "" && decision !== "allowed" && decision !== "denied"
    ) {
      return fail(c, 400, `Invalid decision '${decision.slice(0, 40)}': use allowed or denied`);
    }
    return c.json(
      await egressView(deps.home, { ...asked, decision: decision === "" ? undefined : decision }),
    );
  });
  app.get("/mcp", async (c) => {
    const asked = query(c);
    if (asked instanceof Response) return asked;
    return c.json(await mcpView(deps.home, asked));
  });
}

// Envd's commands (the log) and, on Docker, the rest of what the queue knows, newest first.
function commandsOf(record: SandboxRecord, deps: ConsoleApiDeps, limit: number): ConsoleCommand[] {
  const logged = deps.commands?.list(record.id, COMMANDS_KEPT) ?? [];
  const queued = deps.containers === undefined ? [] : queueCommands(deps.containers.queue(record), {
    limit,
    known: new Set(logged.map((command) => command.id)),
  });
  return [...logged.slice(0, limit), ...queued]
    .sort((a, b) => Date.parse(b.startedAt) - Date.parse(a.startedAt))
    .slice(0, limit);
}

// A whole-number query parameter, at most `max`; its fallback when absent.
function numberQuery(
  c: ConsoleContext,
  name: string,
  options: { fallback: number; max: number },
): number | Response {
  const given = c.req.query(name);
  if (given === undefined || given === "") return options.fallback;
  if (!/^\d{1,9}$/.test(given) || Number(given) < 1) {
    return fail(c, 400, `Invalid '${name}' '${given.slice(0, 40)}': use a whole number from 1`);
  }
  return Math.min(Number(given), options.max);
}

async function consoleSandbox(
  record: SandboxRecord,
  deps: ConsoleApiDeps,
): Promise<ConsoleSandbox> {
  const sample = deps.metrics?.newest(record.id);
  const running = record.state === "running" && deps.containers !== undefined
    ? await deps.containers.running(record).catch(() => true)
    : true;
  const last: ConsoleCommand | undefined = deps.commands?.list(record.id, 1)[0];
  return {
    sandboxID: record.id,
    tenant: record.tenant,
    templateID: record.template,
    image: record.image,
    state: record.state === "paused" ? "paused" : running ? "running" : "stopped",
    startedAt: new Date(record.startedAt).toISOString(),
    endAt: new Date(record.endAt).toISOString(),
    metadata: record.metadata,
    cpuCount: sample?.cpuCount ?? null,
    cpuUsedPct: sample?.cpuUsedPct ?? null,
    memUsed: sample?.memUsed ?? null,
    memTotal: sample?.memTotal ?? null,
    diskUsed: sample?.diskUsed ?? null,
    diskTotal: sample?.diskTotal ?? null,
    pool: deps.containers?.pooledFrom(record.id) ?? null,
    egress: egressOf(record, deps.grant),
    lastCommand: last === undefined ? null : {
      // A table row's worth: the commands view has the rest.
      argv: capArgv(last.argv, { total: LAST_ARGV_CHARS }).argv,
      startedAt: last.startedAt,
      exitCode: last.exitCode,
      running: last.running,
    },
  };
}

// What a sandbox may reach: the grant narrowed by its create's ask (`narrowing`, the owner).
function egressOf(record: SandboxRecord, grant: EgressGrant): ConsoleSandbox["egress"] {
  const config = { ...grant, ...narrowing(grant, record.network ?? {}) };
  if (config.egress !== undefined) {
    return { attached: true, allow: config.egress.map(formatEntry) };
  }
  return { attached: false, allow: config.network === "bridge" ? ["*"] : [] };
}
