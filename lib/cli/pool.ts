/**
 * `waffle pool fill|drain`: the warm pools of this home
 * (`[templates.<name>] warm = N`, see `lib/lifecycle/pool.ts`).
 *
 * @module
 */
import { absoluteConfigPath, loadWaffleConfig } from "../config/config.ts";
import { UsageError } from "../errors.ts";
import { listPools } from "../lifecycle/pool.ts";
import { drainPool, fillPool, type FillReport, type PoolTarget } from "../sandbox/pool_fill.ts";
import { noPositionals, numberFlag, parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle pool`. */
export const POOL_HELP = `Usage: waffle pool <command> [options]

Commands:
  fill    make ready sandboxes until each pool holds its count
  drain   remove a pool's ready sandboxes

A pool keeps '[templates.T] warm = N' ready sandboxes of template T: made,
their runner beating, no user yet. A new user's first call takes one when
its posture is exactly the one a cold sandbox of that user would get (same
image, limits, disk quota and egress identity); else it gets a cold one.
'waffle serve' refills its pools in the background; elsewhere run
'waffle pool fill --watch' (or 'waffle pool fill' from cron).

Options:
  --template T     only this template's pool
  --watch          keep refilling (every --interval seconds, default 2) until stopped
  --interval S     seconds between rounds with --watch
  --config FILE    the config file (default: $WAFFLE_HOME/waffle.toml)
  --json           one JSON object per round (fill) or in all (drain)
`;

/**
 * Runs `waffle pool`.
 *
 * @param args Arguments after `pool`.
 * @param io Process streams.
 * @returns 0, or 1 when a member could not be made.
 */
export async function poolCommand(args: string[], io: CliIo): Promise<number> {
  const [command, ...rest] = args;
  if (command === undefined || command === "--help" || command === "-h") {
    await io.stdout(POOL_HELP);
    return 0;
  }
  const parsed = parse(rest, {
    template: { type: "string" },
    watch: { type: "boolean" },
    interval: { type: "string" },
    config: { type: "string" },
    json: { type: "boolean" },
    help: { type: "boolean" },
  });
  noPositionals(parsed.positionals);
  if (parsed.values.help) {
    await io.stdout(POOL_HELP);
    return 0;
  }
  const configFlag = stringFlag(parsed, "config");
  const configPath = configFlag === undefined ? undefined : absoluteConfigPath(configFlag);
  const whole = loadWaffleConfig({ configPath });
  const home = whole.sandbox.home;
  const only = stringFlag(parsed, "template");
  if (only !== undefined && !listPools(home, whole.serve).some((p) => p.template === only)) {
    throw new UsageError(`Unknown template '${only}': name one of [templates.*]`);
  }
  const json = parsed.values.json === true;
  if (command === "drain") {
    // With no --template: every pool of the home, also one the config no longer names.
    const names = only === undefined ? listPools(home, whole.serve).map((p) => p.template) : [only];
    let removed = 0;
    for (const template of names) removed += await drainPool(home, template, { configPath });
    await io.stdout(json ? `${JSON.stringify({ removed })}\n` : `removed ${removed}\n`);
    return 0;
  }
  if (command !== "fill") {
    throw new UsageError(`Unknown pool command '${command}': use fill or drain`);
  }
  const targets: PoolTarget[] = [...whole.serve.warm]
    .filter(([template]) => only === undefined || template === only)
    .map(([template, warm]) => ({ template, warm, image: whole.serve.templates.get(template)! }));
  if (targets.length === 0) {
    throw new UsageError(
      `No warm pool to fill: set '[templates.${only ?? "T"}] warm = N' in the config`,
    );
  }
  const intervalMs = (numberFlag(parsed, "interval", { max: 3600 }) ?? 2) * 1000;
  const stop = stopSignal(parsed.values.watch === true);
  let failed = false;
  do {
    for (const target of targets) {
      const report = await fillPool(home, target, {
        configPath,
        onMember: (event) => {
          if (!json) {
            io.stderr(
              `${event.made ? "made" : "removed"} ${event.user} of pool '${event.template}'\n`,
            );
          }
        },
      });
      failed ||= report.error !== undefined;
      await io.stdout(json ? `${JSON.stringify(report)}\n` : summary(report));
    }
  } while (!stop.stopped && await stop.wait(intervalMs));
  stop.dispose();
  return failed ? 1 : 0;
}

function summary(report: FillReport): string {
  if (!report.ran) return `pool '${report.template}': another filler is running\n`;
  return `pool '${report.template}': ${report.ready} ready (made ${report.made}, removed ${report.removed})${
    report.error === undefined ? "" : `; ${report.error}`
  }\n`;
}

// With --watch: rounds until SIGINT or SIGTERM; without: one round.
function stopSignal(watch: boolean): {
  stopped: boolean;
  wait: (ms: number) => Promise<boolean>;
  dispose: () => void;
} {
  const state = { stopped: !watch, wake: () => {} };
  const onSignal = (): void => {
    state.stopped = true;
    state.wake();
  };
  if (watch) {
    for (const signal of ["SIGINT", "SIGTERM"] as const) Deno.addSignalListener(signal, onSignal);
  }
  return {
    get stopped() {
      return state.stopped;
    },
    wait: (ms) =>
      new Promise((resolve) => {
        const timer = setTimeout(() => resolve(!state.stopped), ms);
        state.wake = () => {
          clearTimeout(timer);
          resolve(false);
        };
      }),
    dispose: () => {
      if (watch) {
        for (const signal of ["SIGINT", "SIGTERM"] as const) {
          Deno.removeSignalListener(signal, onSignal);
        }
      }
    },
  };
}
