/**
 * The per-tenant limits of `waffle serve` (`[serve.tenants.<tenant>]`):
 * sandboxes at once, and creates in any sliding minute. A create over
 * either is answered 429 with `Retry-After` (E2B's SDKs retry on an integer
 * one), so each refusal says how long to wait.
 *
 * The create window is in memory: a restarted server forgets at most a
 * minute of creates, while the sandboxes at once are counted from the
 * server's own state by the function it passes in.
 *
 * @module
 */
import type { TenantLimitSettings } from "../config/serve_schema.ts";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";

/** The answer to a create: go ahead, or wait and retry. */
export type Admission =
  | { ok: true }
  | {
    ok: false;
    /** Whole seconds to wait before a retry may pass, at least 1 (`Retry-After`). */
    retryAfterSeconds: number;
    /** Which limit refused it. */
    limit: "max_sandboxes" | "creates_per_minute";
    /** One line for the 429's body, naming the tenant, the limit and its key. */
    message: string;
  };

/** Options of {@linkcode TenantLimits}. */
export interface TenantLimitsOptions {
  /** A tenant's limits (`tenantLimitsOf` over the config's `serve`). */
  limitsOf: (tenant: string) => TenantLimitSettings;
  /**
   * How many sandboxes a tenant has now, creates under way included (two
   * creates at once must not both pass the last free place).
   */
  sandboxCount: (tenant: string) => number;
  /** A monotonic clock in milliseconds (tests); default `performance.now`. */
  now?: () => number;
}

const WINDOW_MS = 60_000;
/** The wait a full tenant is told: a sandbox may end any moment (a kill, a timeout). */
const FULL_RETRY_SECONDS = 5;

/**
 * Admits or refuses creates by tenant.
 *
 * @example
 * ```ts ignore
 * const limits = new TenantLimits({
 *   limitsOf: (tenant) => tenantLimitsOf(config.serve, tenant),
 *   sandboxCount: (tenant) => state.countOf(tenant),
 * });
 * const admission = limits.admitCreate("acme");
 * if (!admission.ok) return tooMany(admission.retryAfterSeconds, admission.message);
 * ```
 */
export class TenantLimits {
  readonly #options: TenantLimitsOptions;
  readonly #now: () => number;
  /** Per tenant, the times of the creates admitted within the last minute, oldest first. */
  readonly #creates = new Map<string, number[]>();

  /**
   * Creates the limiter.
   *
   * @param options The limits, the sandbox count and the clock.
   */
  constructor(options: TenantLimitsOptions) {
    this.#options = options;
    this.#now = options.now ?? (() => performance.now());
  }

  /**
   * Decides a create for a tenant; an admitted one counts against the
   * tenant's creates of the next minute.
   *
   * @param tenant The key's tenant.
   * @returns `{ ok: true }`, or how long to wait and why.
   */
  admitCreate(tenant: string): Admission {
    const limits = this.#options.limitsOf(tenant);
    const running = this.#options.sandboxCount(tenant);
    if (running >= limits.maxSandboxes) {
      return {
        ok: false,
        retryAfterSeconds: FULL_RETRY_SECONDS,
        limit: "max_sandboxes",
        message: `Tenant '${tenant}' has ${running} sandboxes, its limit ` +
          `(serve.tenants.${tenant}.max_sandboxes = ${limits.maxSandboxes})`,
      };
    }
    const now = this.#now();
    const recent = this.#recent(tenant, now);
    if (recent.length >= limits.createsPerMinute) {
      // The oldest create in the window leaves it first.
      const waitMs = recent[recent.length - limits.createsPerMinute]! + WINDOW_MS - now;
      return {
        ok: false,
        retryAfterSeconds: Math.max(1, Math.ceil(waitMs / 1000)),
        limit: "creates_per_minute",
        message:
          `Tenant '${tenant}' made ${recent.length} sandboxes in the last minute, its limit ` +
          `(serve.tenants.${tenant}.creates_per_minute = ${limits.createsPerMinute})`,
      };
    }
    recent.push(now);
    this.#creates.set(tenant, recent);
    return { ok: true };
  }

  // The tenant's creates still inside the window; tenants with none are forgotten.
  #recent(tenant: string, now: number): number[] {
    const times = this.#creates.get(tenant) ?? [];
    const first = times.findIndex((time) => time > now - WINDOW_MS);
    const recent = first < 0 ? [] : times.slice(first);
    if (recent.length === 0) this.#creates.delete(tenant);
    return recent;
  }
}

/**
 * Bounds the streams each key's sandboxes hold open: a streaming call (a
 * command, a re-attach, a watch) holds one of its key's `max` places until
 * its stream ends, however it ends; one past them is `resource_exhausted`.
 *
 * @param max Streams one key may hold at once (`[serve] max_streams_per_key`).
 * @returns The interceptor for calls made with a key's access.
 */
export function streamLimiter(max: number): (keyId: string) => Interceptor {
  /** Open streams by the key that made their sandbox. */
  const streams = new Map<string, number>();
  return (keyId) => (next) => async (call) => {
    if (!call.method.methodKind.startsWith("server_streaming")) return await next(call);
    const held = streams.get(keyId) ?? 0;
    if (held >= max) {
      throw new ConnectError(
        `Key '${keyId}' holds ${held} open streams, its limit ([serve] max_streams_per_key)`,
        Code.ResourceExhausted,
      );
    }
    streams.set(keyId, held + 1);
    const release = (): void => {
      const left = (streams.get(keyId) ?? 1) - 1;
      if (left > 0) streams.set(keyId, left);
      else streams.delete(keyId);
    };
    let response;
    try {
      response = await next(call);
    } catch (error) {
      release();
      throw error;
    }
    if (!response.stream) {
      release();
      return response;
    }
    const messages = response.message;
    return {
      ...response,
      message: (async function* (): AsyncGenerator<
        (typeof messages extends AsyncIterable<infer M> ? M : never)
      > {
        try {
          yield* messages;
        } finally {
          release();
        }
      })(),
    };
  };
}
