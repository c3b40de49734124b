/**
 * How often a session may ask the terminal a question it answers on the
 * user's stdin (DSR 5/6, DA1, DA2, DECRQM, the queries `screen_policy.ts`
 * keeps): per kind, a burst of {@linkcode QUERY_BURST}, then one per
 * {@linkcode QUERY_INTERVAL_MS}; the rest are dropped. A program asks a few
 * at a time; a sandbox that asks in a loop cannot flood the user's input
 * with answers (`escape_keys.ts` reads past the answers that do come).
 *
 * @module
 */
import type { Token } from "./sequence_reader.ts";

/** The queries of a kind one session may ask at once. */
export const QUERY_BURST = 4;
/** After a burst, one more query of a kind every this many milliseconds. */
export const QUERY_INTERVAL_MS = 250;

/**
 * One session's query budget.
 *
 * @example
 * ```ts
 * import { QueryLimit } from "./query_limit.ts";
 * const limit = new QueryLimit(() => 0);
 * const dsr = { kind: "csi", prefix: "", params: "5", intermediates: "", final: "n" } as const;
 * [1, 2, 3, 4, 5].map(() => limit.allows(dsr)); // [true, true, true, true, false]
 * ```
 */
export class QueryLimit {
  readonly #now: () => number;
  // Per kind: the tokens left and when they were last counted.
  readonly #buckets = new Map<string, { tokens: number; at: number }>();

  /**
   * @param now The clock, in milliseconds (`performance.now` unless a test's).
   */
  constructor(now: () => number = () => performance.now()) {
    this.#now = now;
  }

  /**
   * Whether a token may reach the terminal: every token that asks nothing
   * may; a query may while its kind has budget left.
   *
   * @param token A token the policy keeps.
   * @returns False for a query over the budget.
   */
  allows(token: Token): boolean {
    const kind = queryKind(token);
    if (kind === null) return true;
    const now = this.#now();
    const bucket = this.#buckets.get(kind) ?? { tokens: QUERY_BURST, at: now };
    const refilled = Math.floor((now - bucket.at) / QUERY_INTERVAL_MS);
    if (refilled > 0) {
      bucket.tokens = Math.min(QUERY_BURST, bucket.tokens + refilled);
      bucket.at += refilled * QUERY_INTERVAL_MS;
    }
    if (bucket.tokens >= QUERY_BURST) bucket.at = now;
    this.#buckets.set(kind, bucket);
    if (bucket.tokens === 0) return false;
    bucket.tokens--;
    return true;
  }
}

// The kind of query a CSI is (null: not one that makes the terminal answer).
function queryKind(token: Token): string | null {
  if (token.kind !== "csi") return null;
  const { prefix, intermediates, final } = token;
  if (intermediates === "$" && final === "p") return `DECRQM${prefix}`;
  if (intermediates !== "") return null;
  if (final === "n") return `DSR${prefix}${token.params}`;
  if (final === "c") return `DA${prefix}`;
  return null;
}
