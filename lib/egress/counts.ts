/**
 * What the egress proxy counts, per identity and in all, since it started:
 * connections allowed and denied, and the bytes of closed connections each
 * way. Kept in the proxy's memory (the audit file is the record; reading it
 * back would cost up to its 128 MiB), and asked over the control socket:
 * `stats` for the totals, `stats <id>` for one identity's (`egressCounts` in
 * `status.ts` asks).
 *
 * @module
 */

/** The proxy's counts for one identity, or all of them. */
export interface EgressCounts {
  /** Connections allowed. */
  allowed: number;
  /** Connections refused (by policy, by a limit, or without a policy). */
  denied: number;
  /** Bytes from the sandbox to its upstreams, over closed connections. */
  bytesUp: number;
  /** Bytes from the upstreams to the sandbox, over closed connections. */
  bytesDown: number;
}

/**
 * The proxy's answer to a `stats` control command.
 *
 * @param command The command line (`stats` or `stats <id>`).
 * @param counts The totals, and one identity's counts by id.
 * @returns The answer line.
 */
export function statsAnswer(
  command: string,
  counts: { totals: EgressCounts; of: (id: string) => EgressCounts | undefined },
): string {
  const asked = command === "stats" ? counts.totals : counts.of(command.slice("stats ".length));
  return asked === undefined ? "error unknown identity\n" : `ok ${JSON.stringify(asked)}\n`;
}
