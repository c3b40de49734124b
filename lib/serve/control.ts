/**
 * E2B's control API (REST) on waffle's sandboxes: create (from a template
 * or a snapshot), get, list, kill, timeout, pause, connect (which resumes a
 * paused one), fork, and snapshots (take, list, delete), on both the `/sandboxes` and `/v2/sandboxes` paths
 * the SDKs use. Every call needs `X-API-KEY`; a key sees only its tenant's
 * sandboxes (another tenant's are not found). Errors are `{code, message}`
 * with the same HTTP status: the JS SDK reads the body, Python the status.
 *
 * @module
 */
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { Context } from "hono";
import { z } from "zod";
import type { SandboxRecord } from "./state.ts";
import type { SnapshotRecord } from "./snapshots.ts";
import { UsageError } from "../errors.ts";
import type { SandboxFleet } from "./sandboxes.ts";
import type { Admission } from "./limits.ts";
import { type EgressGrant, narrowEgress, type NetworkAsk } from "./network.ts";
import type { MetricsRing } from "./metrics_ring.ts";

/** The envd version waffle reports: the SDKs gate features on it. */
export const ENVD_VERSION = "0.6.4";

/** The calling key, once verified. */
export interface Caller {
  /** The key's id. */
  keyId: string;
  /** The key's name (for the audit). */
  keyName: string;
  /** The key's tenant (where its creates go). */
  tenant: string;
  /** An admin key: its scope is every tenant (see {@linkcode scopeOf}). */
  admin: boolean;
}

/**
 * The tenant whose sandboxes a caller sees: its own, or every tenant's
 * (undefined) for an admin key. The one place a key's reach is decided:
 * every route that looks a sandbox up or lists passes this to the store.
 *
 * @param caller The verified caller.
 * @returns The tenant, or undefined for all of them.
 */
export function scopeOf(caller: Caller): string | undefined {
  return caller.admin ? undefined : caller.tenant;
}

/** What the control API needs from the rest of the server. */
export interface ControlDeps {
  /** The server's sandboxes. */
  sandboxes: SandboxFleet;
  /** Verifies an API key. */
  verifyKey: (key: string) => Caller | undefined;
  /** Admits a create, or says why not and when to retry. */
  admitCreate: (tenant: string) => Admission;
  /** The image a template names, undefined for an unknown template. */
  templateImage: (template: string) => string | undefined;
  /** Seconds a sandbox lives when the create names no timeout. */
  defaultTimeoutS: number;
  /** The longest timeout a create or setTimeout may ask for, in seconds. */
  maxTimeoutS: number;
  /** Limits every sandbox gets, for `getInfo`. */
  resources: { cpuCount: number; memoryMB: number; diskSizeMB: number };
  /** Largest request body, in bytes (a chunked body is counted as it comes). */
  maxBodyBytes: number;
  /**
   * What the home's config lets every sandbox reach: nothing (the default),
   * the `[sandbox] egress` list, or anything (`[sandbox] network = "bridge"`).
   * A create's network settings narrow it (`narrowEgress`).
   */
  grant: EgressGrant;
  /** Records one call (key, tenant, sandbox, method, outcome). */
  audit?: (entry: AuditEntry) => void;
  /** Each sandbox's recent samples, for `GET /sandboxes/{id}/metrics`; absent: that route is 404. */
  metrics?: MetricsRing;
  /** The Prometheus text of `GET /metrics` for a scope (undefined: every tenant); absent: 404. */
  prometheus?: (scope: string | undefined) => Promise<string>;
}

/** One audited API call. */
export interface AuditEntry {
  /** The key's id, when a key was given and valid (for envd: the key that made the sandbox). */
  key?: string;
  /** The key's name, when known (control calls). */
  keyName?: string;
  /** The key's tenant. */
  tenant?: string;
  /** The sandbox the call named. */
  sandbox?: string;
  /** `METHOD path`. */
  method: string;
  /** The HTTP status answered. */
  status: number;
}

const Metadata = z.record(z.string().max(256), z.string().max(4096)).refine(
  (value) => Object.keys(value).length <= 64,
  "at most 64 entries",
);

const CreateBody = z.object({
  templateID: z.string().min(1).max(128).optional(),
  timeout: z.number().int().min(1).optional(),
  metadata: Metadata.optional(),
  envVars: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/).max(256), z.string().max(65536))
    .optional(),
  secure: z.boolean().optional(),
  allow_internet_access: z.boolean().optional(),
  network: z.object({
    allowOut: z.array(z.string().max(300)).max(1024).optional(),
    denyOut: z.array(z.string().max(300)).max(1024).optional(),
  }).passthrough().optional(),
  autoPause: z.boolean().optional(),
}).passthrough();

const TimeoutBody = z.object({ timeout: z.number().int().min(0) }).passthrough();

const ForkBody = z.object({
  timeout: z.number().int().min(1).optional(),
  count: z.number().int().min(1).optional(),
}).passthrough();

const SnapshotBody = z.object({ name: z.string().max(128).optional() }).passthrough();

/**
 * The most forks one `POST /sandboxes/{id}/fork` makes (E2B allows 100):
 * each is a container start on this host, and each counts against the
 * tenant's `max_sandboxes` and `creates_per_minute`.
 */
export const MAX_FORKS_PER_CALL = 20;

/**
 * The control API as a Hono app (its `fetch` answers a `Request`).
 *
 * @param deps What it needs from the server.
 * @returns The app.
 */
export function controlApp(deps: ControlDeps): Hono<{ Variables: { caller: Caller } }> {
  const app = new Hono<{ Variables: { caller: Caller } }>();
  app.use("*", async (c, next): Promise<Response | undefined> => {
    // A Prometheus scrape sends its credentials as `Authorization: Bearer`.
    const key = c.req.header("x-api-key") ??
      (c.req.path === "/metrics"
        ? /^Bearer (\S+)$/.exec(c.req.header("authorization") ?? "")?.[1]
        : undefined);
    const caller = key === undefined ? undefined : deps.verifyKey(key);
    if (caller === undefined) {
      deps.audit?.({ method: `${c.req.method} ${c.req.path}`, status: 401 });
      return fail(c, 401, key === undefined ? "Missing API key (X-API-KEY)" : "Invalid API key");
    }
    c.set("caller", caller);
    await next();
    const sandbox = /^(?:\/v2|\/waffle\/v1)?\/sandboxes\/([^/]+)/.exec(c.req.path)?.[1];
    deps.audit?.({
      key: caller.keyId,
      keyName: caller.keyName,
      tenant: caller.tenant,
      ...(sandbox === undefined ? {} : { sandbox }),
      method: `${c.req.method} ${c.req.path}`,
      status: c.res.status,
    });
    return undefined;
  });

  app.use(
    "*",
    bodyLimit({
      maxSize: deps.maxBodyBytes,
      onError: (c) => fail(c, 413, `Request body over the limit of ${deps.maxBodyBytes} bytes`),
    }),
  );

  const create =
    (v1: boolean) => async (c: Context<{ Variables: { caller: Caller } }>): Promise<Response> => {
      const caller = c.get("caller");
      const body = CreateBody.safeParse(await c.req.json().catch(() => undefined));
      if (!body.success) return fail(c, 400, `Invalid create request: ${problem(body.error)}`);
      const { templateID = "base", timeout = deps.defaultTimeoutS, metadata = {}, envVars = {} } =
        body.data;
      // A template of the config, else one of the tenant's snapshots (its id or name).
      const snapshot = deps.templateImage(templateID) === undefined
        ? deps.sandboxes.snapshots?.find(caller.tenant, templateID)
        : undefined;
      const image = snapshot?.image ?? deps.templateImage(templateID);
      if (image === undefined) return fail(c, 404, `Template '${templateID}' not found`);
      if (timeout > deps.maxTimeoutS) {
        return fail(c, 400, `Timeout '${timeout}' is over the maximum of ${deps.maxTimeoutS} s`);
      }
      const network = networkAsk(body.data, { v1 });
      if (network !== undefined) {
        const narrowed = narrowEgress(deps.grant, network);
        if ("status" in narrowed) return fail(c, narrowed.status, narrowed.message);
      }
      if (body.data.autoPause === true) return fail(c, 400, "Auto-pause is not supported");
      const admission = deps.admitCreate(caller.tenant);
      if (!admission.ok) {
        c.header("Retry-After", String(admission.retryAfterSeconds));
        return fail(c, 429, admission.message);
      }
      const record = await deps.sandboxes.create({
        tenant: caller.tenant,
        keyId: caller.keyId,
        template: snapshot?.template ?? templateID,
        image,
        ...(snapshot === undefined
          ? {}
          : { fromImage: deps.sandboxes.snapshots!.imagePath(snapshot) }),
        timeoutS: timeout,
        metadata,
        envVars,
        network,
      });
      return c.json(sandboxJson(record), 201);
    };
  app.post("/sandboxes", create(true));
  app.post("/v2/sandboxes", create(false));

  // A sandbox being killed is gone already, as its envd's /health says (502).
  const owned = (c: Context<{ Variables: { caller: Caller } }>): SandboxRecord | undefined => {
    const record = deps.sandboxes.store.get(c.req.param("id") ?? "", scopeOf(c.get("caller")));
    return record === undefined || deps.sandboxes.removing(record.id) ? undefined : record;
  };

  app.get("/sandboxes/:id", (c) => {
    const record = owned(c);
    if (record === undefined) return notFound(c);
    return c.json({
      ...detailJson(record, deps),
      ...networkJson(record),
      envdAccessToken: record.accessToken,
    });
  });
  app.delete("/sandboxes/:id", async (c) => {
    const record = owned(c);
    if (record === undefined) return notFound(c);
    await deps.sandboxes.remove(record.id);
    return c.body(null, 204);
  });
  app.post("/sandboxes/:id/timeout", async (c) => {
    const record = owned(c);
    if (record === undefined) return notFound(c);
    const body = TimeoutBody.safeParse(await c.req.json().catch(() => undefined));
    if (!body.success) return fail(c, 400, `Invalid timeout request: ${problem(body.error)}`);
    if (body.data.timeout > deps.maxTimeoutS) {
      return fail(
        c,
        400,
        `Timeout '${body.data.timeout}' is over the maximum of ${deps.maxTimeoutS} s`,
      );
    }
    await deps.sandboxes.setTimeout(record.id, body.data.timeout, { shorten: true });
    return c.body(null, 204);
  });
  const connect = async (c: Context<{ Variables: { caller: Caller } }>): Promise<Response> => {
    const record = owned(c);
    if (record === undefined) return notFound(c);
    const body = await c.req.json().catch(() => ({}));
    const timeout = TimeoutBody.safeParse(body);
    if (timeout.success) {
      await deps.sandboxes.setTimeout(
        record.id,
        Math.min(timeout.data.timeout, deps.maxTimeoutS),
        { shorten: false },
      );
    }
    // A paused sandbox goes on where it was (201); a running one is ensured (200).
    const resumed = await deps.sandboxes.resume(record);
    await deps.sandboxes.ready(record);
    return c.json(sandboxJson(deps.sandboxes.store.get(record.id) ?? record), resumed ? 201 : 200);
  };
  app.post("/sandboxes/:id/connect", connect);
  app.post("/v2/sandboxes/:id/connect", connect);
  app.post("/sandboxes/:id/pause", async (c) => {
    const record = owned(c);
    if (record === undefined) return notFound(c);
    // The SDK's pause() answers false on 409: already paused.
    if (!await deps.sandboxes.pause(record)) {
      return fail(c, 409, `Sandbox '${record.id}' is already paused`);
    }
    return c.body(null, 204);
  });

  app.get("/sandboxes/:id/metrics", async (c) => {
    const record = owned(c);
    if (record === undefined || deps.metrics === undefined) return notFound(c);
    const range: { start?: number; end?: number } = {};
    for (const bound of ["start", "end"] as const) {
      const given = c.req.query(bound);
      if (given === undefined) continue;
      if (!/^\d{1,12}$/.test(given)) {
        return fail(
          c,
          400,
          `Invalid '${bound}' '${given.slice(0, 40)}': use whole seconds since the epoch`,
        );
      }
      range[bound] = Number(given);
    }
    return c.json(await deps.metrics.samples(record, range));
  });
  app.get("/metrics", async (c) => {
    if (deps.prometheus === undefined) return fail(c, 404, "No route 'GET /metrics'");
    const text = await deps.prometheus(scopeOf(c.get("caller")));
    return c.body(text, 200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
  });
  forkRoute(app, deps, owned);
  snapshotRoutes(app, deps, owned);

  app.get("/sandboxes", (c) =>
    c.json(
      deps.sandboxes.store.list(scopeOf(c.get("caller"))).filter((r) => r.state !== "creating")
        .map((r) => detailJson(r, deps)),
    ));
  app.get("/v2/sandboxes", (c) => listV2(c, deps));
  app.notFound((c) => fail(c, 404, `No route '${c.req.method} ${c.req.path}'`));
  app.onError((error, c) => fail(c, 500, error instanceof Error ? error.message : String(error)));
  return app;
}

type ControlApp = Hono<{ Variables: { caller: Caller } }>;
type Owned = (c: Context<{ Variables: { caller: Caller } }>) => SandboxRecord | undefined;

// Fork: `POST /sandboxes/{id}/fork` (see `ServeSandboxes.fork`).
function forkRoute(app: ControlApp, deps: ControlDeps, owned: Owned): void {
  app.post("/sandboxes/:id/fork", async (c) => {
    const record = owned(c);
    if (record === undefined) return notFound(c);
    const caller = c.get("caller");
    const body = ForkBody.safeParse(await c.req.json().catch(() => ({})));
    if (!body.success) return fail(c, 400, `Invalid fork request: ${problem(body.error)}`);
    const { count = 1, timeout = deps.defaultTimeoutS } = body.data;
    if (count > MAX_FORKS_PER_CALL) {
      return fail(c, 400, `Fork count '${count}' is over the maximum of ${MAX_FORKS_PER_CALL}`);
    }
    if (timeout > deps.maxTimeoutS) {
      return fail(c, 400, `Timeout '${timeout}' is over the maximum of ${deps.maxTimeoutS} s`);
    }
    // Nothing admitted: the whole call is refused, with when to retry.
    let refused: Admission | undefined;
    let admitted = 0;
    const outcomes = await deps.sandboxes.fork(record, {
      tenant: caller.tenant,
      keyId: caller.keyId,
      timeoutS: timeout,
      count,
      admit: () => {
        const admission = deps.admitCreate(caller.tenant);
        if (admission.ok) admitted++;
        else refused ??= admission;
        return admission;
      },
    });
    if (admitted === 0 && refused !== undefined && !refused.ok) {
      c.header("Retry-After", String(refused.retryAfterSeconds));
      return fail(c, 429, refused.message);
    }
    // Files are forked, running processes are not (said in every answer).
    c.header("X-Waffle-Processes-Forked", "false");
    return c.json(
      outcomes.map((o) =>
        "record" in o
          ? { sandbox: { ...sandboxJson(o.record), processesForked: false } }
          : { error: o.error }
      ),
      201,
    );
  });
}

// Snapshots: take of a running sandbox, list (paged), delete (the SDK's
// deleteSnapshot deletes a template); a create names one as its template.
function snapshotRoutes(app: ControlApp, deps: ControlDeps, owned: Owned): void {
  app.post("/sandboxes/:id/snapshots", async (c) => {
    const record = owned(c);
    if (record === undefined) return notFound(c);
    const body = SnapshotBody.safeParse(await c.req.json().catch(() => ({})));
    if (!body.success) return fail(c, 400, `Invalid snapshot request: ${problem(body.error)}`);
    try {
      const snapshot = await deps.sandboxes.snapshot(record, body.data.name);
      return c.json(snapshotJson(snapshot), 201);
    } catch (error) {
      if (error instanceof UsageError) return fail(c, 400, error.message);
      throw error;
    }
  });
  app.get("/snapshots", (c) => {
    const tenant = scopeOf(c.get("caller"));
    const sandboxId = c.req.query("sandboxID");
    const name = c.req.query("name");
    const all = deps.sandboxes.snapshots?.list(tenant, {
      ...(sandboxId === undefined ? {} : { sandboxId }),
      ...(name === undefined ? {} : { name }),
    }) ?? [];
    const limit = Math.min(Math.max(Number(c.req.query("limit") ?? 100) || 100, 1), 1000);
    const after = c.req.query("nextToken");
    const start = after === undefined ? 0 : all.findIndex((s) => s.id === after) + 1;
    const page = all.slice(start, start + limit);
    if (start + limit < all.length && page.length > 0) c.header("X-Next-Token", page.at(-1)!.id);
    return c.json(page.map(snapshotJson));
  });
  // The SDK's deleteSnapshot: a snapshot is a template to E2B.
  app.delete("/templates/:id", async (c) => {
    const removed = await deps.sandboxes.snapshots?.remove(
      scopeOf(c.get("caller")),
      c.req.param("id"),
    );
    if (removed !== true) return fail(c, 404, `Template '${c.req.param("id")}' not found`);
    return c.body(null, 204);
  });
}

// GET /v2/sandboxes: metadata ("k=v&k2=v2", URL-encoded) and state filters,
// pages of `limit` after `nextToken` (the last id of the page before).
function listV2(c: Context<{ Variables: { caller: Caller } }>, deps: ControlDeps): Response {
  const wanted = new URLSearchParams(c.req.query("metadata") ?? "");
  const states = (c.req.query("state") ?? "running,paused").split(",");
  const limit = Math.min(Math.max(Number(c.req.query("limit") ?? 100) || 100, 1), 1000);
  const after = c.req.query("nextToken");
  const all = deps.sandboxes.store.list(scopeOf(c.get("caller"))).filter((record) =>
    record.state !== "creating" && states.includes(record.state) &&
    [...wanted].every(([key, value]) => record.metadata[key] === value)
  );
  const start = after === undefined ? 0 : all.findIndex((record) => record.id === after) + 1;
  const page = all.slice(start, start + limit);
  if (start + limit < all.length && page.length > 0) c.header("X-Next-Token", page.at(-1)!.id);
  return c.json(page.map((record) => detailJson(record, deps)));
}

// What a create asked of the network, as recorded; undefined when nothing.
// The v1 path's clients (the Python SDK to 2.45, older JS ones) send
// `allow_internet_access: true` on every create, asked or not, so there it
// says nothing: the config's grant stands. On v2 the SDK sends it only when
// its caller set it, so `true` there asks for the internet (a 403 unless
// granted).
function networkAsk(
  body: z.infer<typeof CreateBody>,
  options: { v1: boolean },
): NetworkAsk | undefined {
  const { allowOut, denyOut } = body.network ?? {};
  const said = options.v1 && body.allow_internet_access === true
    ? undefined
    : body.allow_internet_access;
  const ask: NetworkAsk = {
    ...(said === undefined ? {} : { allowInternetAccess: said }),
    ...(allowOut === undefined ? {} : { allowOut }),
    ...(denyOut === undefined ? {} : { denyOut }),
  };
  return Object.keys(ask).length === 0 ? undefined : ask;
}

/**
 * The `Sandbox` object of a create or connect.
 *
 * @param record The sandbox.
 * @returns Its JSON.
 */
export function sandboxJson(record: SandboxRecord): Record<string, unknown> {
  return {
    templateID: record.template,
    sandboxID: record.id,
    alias: record.template,
    clientID: "waffle",
    envdVersion: ENVD_VERSION,
    envdAccessToken: record.accessToken,
    trafficAccessToken: null,
    domain: null,
  };
}

// E2B's SnapshotInfo: the id a create takes, and the names it was given.
function snapshotJson(snapshot: SnapshotRecord): Record<string, unknown> {
  return {
    snapshotID: snapshot.id,
    names: snapshot.name === undefined ? [] : [snapshot.name],
  };
}

function detailJson(record: SandboxRecord, deps: ControlDeps): Record<string, unknown> {
  return {
    templateID: record.template,
    sandboxID: record.id,
    alias: record.template,
    clientID: "waffle",
    startedAt: new Date(record.startedAt).toISOString(),
    endAt: new Date(record.endAt).toISOString(),
    ...deps.resources,
    state: record.state,
    metadata: record.metadata,
    envdVersion: ENVD_VERSION,
    domain: null,
  };
}

// What getInfo adds to a listed sandbox: its network settings as asked.
function networkJson(record: SandboxRecord): Record<string, unknown> {
  const ask = record.network ?? {};
  return {
    allowInternetAccess: ask.allowInternetAccess ?? null,
    ...(ask.allowOut === undefined && ask.denyOut === undefined ? {} : {
      network: {
        ...(ask.allowOut === undefined ? {} : { allowOut: ask.allowOut }),
        ...(ask.denyOut === undefined ? {} : { denyOut: ask.denyOut }),
      },
    }),
  };
}

function notFound(c: Context): Response {
  return fail(c, 404, `Sandbox '${c.req.param("id")}' not found`);
}

/**
 * An error answer: `{code, message}` with the same HTTP status.
 *
 * @param c The request's context.
 * @param status The status.
 * @param message One line.
 * @returns The response.
 */
export function fail(c: Context, status: number, message: string): Response {
  return c.json({ code: status, message }, status as 400);
}

function problem(error: z.ZodError): string {
  const issue = error.issues[0];
  return issue === undefined ? "unreadable" : `${issue.path.join(".") || "body"}: ${issue.message}`;
}
