/**
 * What a launch is made for: a group (declared, or "default") or a cron job
 * (whose group is then the base of its policy). The MCP launch plan and the
 * egress policy of a restricted server both start from it.
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import type { CronConfig, McpPolicy } from "./mcp_types.ts";

/** The group used when neither a group nor a cron job is named; it need not be declared. */
export const DEFAULT_GROUP = "default";

/** A group or cron job, resolved against the policy. */
export interface ResolvedSubject {
  /** The group whose policy applies: the one named, the cron job's, or "default". */
  group: string;
  /** The cron job, when one was named. */
  cron: CronConfig | undefined;
}

/**
 * Resolves a group or cron job against the policy.
 *
 * @example
 * ```ts ignore
 * resolveSubject(config.policy, { cron: "nightly" }); // { group: "main", cron: { name: "nightly", ... } }
 * ```
 *
 * @param policy The configured groups and cron jobs.
 * @param subject A group (declared, or "default") or a cron job; neither means group "default".
 * @returns The group and the cron job.
 * @throws {UsageError} When both are given, or the group or cron job is not configured.
 */
export function resolveSubject(
  policy: Pick<McpPolicy, "groups" | "cron">,
  subject: { group?: string | undefined; cron?: string | undefined },
): ResolvedSubject {
  if (subject.group !== undefined && subject.cron !== undefined) {
    throw new UsageError(
      `Choose a group or a cron job, not both: group '${subject.group}', cron '${subject.cron}'`,
    );
  }
  if (subject.cron !== undefined) {
    if (!Object.hasOwn(policy.cron, subject.cron)) {
      throw new UsageError(
        `Unknown cron job '${subject.cron}'; configured: ${listed(Object.keys(policy.cron))}`,
      );
    }
    const cron = policy.cron[subject.cron]!;
    return { group: cron.group, cron };
  }
  const group = subject.group ?? DEFAULT_GROUP;
  if (group !== DEFAULT_GROUP && !Object.hasOwn(policy.groups, group)) {
    throw new UsageError(
      `Unknown group '${group}'; configured: ${listed(Object.keys(policy.groups))} (or 'default')`,
    );
  }
  return { group, cron: undefined };
}

/**
 * Names as a message lists them: `'a', 'b'`, or `none`.
 *
 * @example
 * ```ts
 * import { listed } from "./subject.ts";
 * listed(["a", "b"]); // "'a', 'b'"
 * ```
 *
 * @param names The names.
 * @returns The phrase.
 */
export function listed(names: readonly string[]): string {
  return names.length === 0 ? "none" : names.map((name) => `'${name}'`).join(", ");
}
