/**
 * `waffle runner`: serve a queue directory (what runs inside the container).
 *
 * @module
 */
import { logToFile } from "../../runner/log.ts";
import { runRunner } from "../../runner/runner.ts";
import { UsageError } from "../errors.ts";
import { numberFlag, parse, stringFlag } from "./args.ts";

/** Help text of `waffle runner`. */
export const RUNNER_HELP = `Usage: waffle runner --queue DIR [--outbound DIR] [--workspace DIR]
                     [--idle-exit SECONDS] [--concurrency N] [--poll-ms MS]
                     [--log FILE] [--command-user UID:GID] [--private-ptys]

Serves the queue in DIR: runs requests in submission order, one at a time
unless --concurrency says otherwise. --idle-exit 0 (the default) never exits
on idleness. --outbound names the runner's own directory (default
DIR/outbound). --command-user runs every command as UID:GID, with no
supplementary groups (the runner must be able to switch to it).
`;

/**
 * Runs `waffle runner`.
 *
 * @param args Arguments after `runner`.
 * @returns The exit status.
 */
export async function runnerCommand(args: string[]): Promise<number> {
  const parsed = parse(args, {
    queue: { type: "string" },
    workspace: { type: "string" },
    "idle-exit": { type: "string" },
    concurrency: { type: "string" },
    "poll-ms": { type: "string" },
    log: { type: "string" },
    outbound: { type: "string" },
    "command-user": { type: "string" },
    "private-ptys": { type: "boolean" },
  });
  if (parsed.positionals.length > 0) {
    throw new UsageError(`Unexpected argument '${parsed.positionals[0]}'`);
  }
  const queueDir = stringFlag(parsed, "queue");
  if (queueDir === undefined) throw new UsageError("Missing --queue DIR");
  const log = stringFlag(parsed, "log");
  if (log !== undefined) logToFile(log);
  const idle = numberFlag(parsed, "idle-exit", { allowZero: true });
  const concurrency = numberFlag(parsed, "concurrency", { integer: true });
  const pollMs = numberFlag(parsed, "poll-ms", { integer: true });
  const commandUser = parseUser(stringFlag(parsed, "command-user"));
  const outboundDir = stringFlag(parsed, "outbound");
  return await runRunner({
    queueDir,
    ...(outboundDir === undefined ? {} : { outboundDir }),
    ...(commandUser === undefined ? {} : { commandUser }),
    ...(parsed.values["private-ptys"] === true ? { privatePtys: true } : {}),
    workspace: stringFlag(parsed, "workspace") ?? Deno.cwd(),
    ...(idle === undefined ? {} : { idleExitMs: Math.round(idle * 1000) }),
    ...(concurrency === undefined ? {} : { concurrency }),
    ...(pollMs === undefined ? {} : { pollMs }),
  });
}

function parseUser(value: string | undefined): { uid: number; gid: number } | undefined {
  if (value === undefined) return undefined;
  const match = /^(\d{1,9}):(\d{1,9})$/.exec(value);
  if (match === null) throw new UsageError(`Invalid --command-user '${value}': use UID:GID`);
  return { uid: Number(match[1]), gid: Number(match[2]) };
}
