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
 * Counts of nothing yet.
 *
 * @returns All zero.
 */
export function zeroCounts(): EgressCounts {
  return { allowed: 0, denied: 0, bytesUp: 0, bytesDown: 0 };
}

/**
 * Counts one connection, at its end, into each of `into`.
 *
 * @param into The counts to add to (an identity's and the totals).
 * @param line The connection's decision and bytes, as its audit line has them.
 */
export function addCounts(
  into: EgressCounts[],
  line: { decision: "allowed" | "denied"; bytesUp: number; bytesDown: number },
): void {
  for (const counts of into) {
    counts[line.decision]++;
    counts.bytesUp += line.bytesUp;
    counts.bytesDown += line.bytesDown;
  }
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
