/**
 * `waffle fork --user U --to V [--count N]`: new sandboxes whose workspace
 * is a copy of U's at one instant (see `lib/lifecycle/fork.ts`).
 *
 * @module
 */
import { absoluteConfigPath, loadConfig } from "../config/config.ts";
import { sandboxKey } from "../config/sandbox_key.ts";
import { UsageError } from "../errors.ts";
import { statePaths } from "../lifecycle/identity.ts";
import { MAX_FORK_TARGETS, sandboxExists } from "../lifecycle/fork.ts";
import { openSandbox, type Sandbox } from "../sandbox/open.ts";
import { removeSandbox } from "../sandbox/remove.ts";
import { noPositionals, numberFlag, parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle fork`. */
export const FORK_HELP = `Usage: waffle fork --user U --to V [--count N] [--tenant T] [--json]

Makes new sandboxes whose workspace is a copy of user U's, taken at one
instant while U's sandbox keeps running: its processes are frozen (as by
'waffle pause') and its volume is frozen while the image is copied (sparse,
reflinked where the host's filesystem can), then both are thawed. Each new
sandbox has its own queue (empty), container, disk quota and egress
identity, and is started. Running processes are not forked: only files.

With --count N the new users are V-1 .. V-N (at most ${MAX_FORK_TARGETS}); without, V.
A target that exists already is refused, and nothing is made.

Options:
  --user U           the sandbox to fork
  --to V             the new user (with --count: the prefix of the new users)
  --count N          make N sandboxes, V-1 .. V-N
  --tenant T         tenant of every user (default: "default")
  --config FILE      the config file (default: $WAFFLE_HOME/waffle.toml)
  --json             print one JSON object
`;

/**
 * Runs `waffle fork`.
 *
 * @param args The arguments after `fork`.
 * @param io Process streams.
 * @returns The exit status.
 */
export async function forkCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    user: { type: "string" },
    to: { type: "string" },
    count: { type: "string" },
    tenant: { type: "string" },
    config: { type: "string" },
    json: { type: "boolean" },
  });
  noPositionals(parsed.positionals);
  const user = stringFlag(parsed, "user");
  if (user === undefined) throw new UsageError("Missing --user U");
  const to = stringFlag(parsed, "to");
  if (to === undefined) throw new UsageError("Missing --to V");
  const count = numberFlag(parsed, "count", { integer: true, max: MAX_FORK_TARGETS });
  const names = count === undefined
    ? [to]
    : Array.from({ length: count }, (_, i) => `${to}-${i + 1}`);
  const tenant = stringFlag(parsed, "tenant") ?? "default";
  const configPath = stringFlag(parsed, "config");
  const config = configPath === undefined ? {} : { configPath: absoluteConfigPath(configPath) };
  const { home } = loadConfig(config);
  // Every id checked and every refusal made before anything is opened (an
  // open makes the user's state directory).
  const sourceKey = sandboxKey(tenant, user, { home });
  const targetKeys = names.map((name) => sandboxKey(tenant, name, { home }));
  const { DockerClient } = await import("../docker/client.ts");
  const docker = new DockerClient();
  if (!(await sandboxExists(docker, { key: sourceKey, paths: statePaths(home, sourceKey) }))) {
    throw new UsageError(`No sandbox for user '${user}' of tenant '${tenant}' to fork`);
  }
  for (const key of targetKeys) {
    if (await sandboxExists(docker, { key, paths: statePaths(home, key) })) {
      throw new UsageError(
        `Cannot fork to user '${key.user}' of tenant '${tenant}': that sandbox exists already`,
      );
    }
  }
  const { forkSandbox } = await import("../lifecycle/fork.ts");
  // A source that does not exist is refused, never taken from a pool.
  const source = openSandbox(user, { tenant, config, docker, fromPool: false });
  const targets: Sandbox[] = [];
  try {
    for (const name of names) {
      targets.push(openSandbox(name, { tenant, config, docker, fromPool: false }));
    }
    const forked = await forkSandbox(source, targets, {
      docker,
      // The CLI answers with running sandboxes.
      start: true,
      discard: (target) =>
        removeSandbox(docker, target.key, { config: target.config, purge: true }).then(() => {}),
    });
    if (parsed.values.json) {
      await io.stdout(`${JSON.stringify(forked)}\n`);
    } else {
      const users = forked.targets.map((t) => t.user).join(", ");
      await io.stdout(
        `forked '${user}' to ${users} in ${forked.forkMs} ms (source frozen ${forked.frozenMs} ms); ` +
          `files only: running processes are not forked\n`,
      );
    }
    return 0;
  } finally {
    source.close();
    for (const target of targets) target.close();
  }
}
