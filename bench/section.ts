/**
 * What a benchmark section is and what it gets to run: the shared context
 * (sample counts, time budget, the temp root every case works under, case
 * filtering, progress, cleanup). A section is a named list of cases plus a
 * `run` that measures the wanted ones; `main.ts` runs sections in order.
 *
 * To add a section (e.g. Docker: `queue_roundtrip_docker`, `docker_exec_api`,
 * `docker_run_cold`, `ensure_cold`), write a `Section` in its own module and
 * append it to `SECTIONS` in `main.ts`; it may read earlier sections'
 * results from `context.results` to build cross-section ratios.
 *
 * @module
 */
import type { BenchReport, BenchResult, Progress } from "./stats.ts";

/** Shared inputs of every section. */
export interface BenchContext {
  /** Measured iterations for count-based cases. */
  n: number;
  /** Unmeasured iterations run first. */
  warmup: number;
  /** Time budget of each time-based (throughput) case, in seconds. */
  seconds: number;
  /** `--quick`: sections take fewer samples (e.g. one idle sandbox instead of 50). */
  quick: boolean;
  /** A fresh directory; every case's files live under it, on one filesystem. */
  root: string;
  /** Progress lines on stderr. */
  progress: Progress;
  /** Results of the sections that already ran, in order. */
  results: readonly BenchResult[];
  /** Resources to release at the end, or on SIGINT/SIGTERM. */
  cleanup: Cleanup;
  /**
   * Whether a case was asked for (`--only`).
   *
   * @param name A case name.
   */
  wants(name: string): boolean;
}

/** A group of related cases. */
export interface Section {
  /** Section name, for progress lines. */
  name: string;
  /** The case names it can produce (what `--only` accepts). */
  cases: readonly string[];
  /**
   * Measures the wanted cases.
   *
   * @param context Counts, directory, filter, progress and cleanup.
   * @returns Its results and ratios.
   */
  run(context: BenchContext): Promise<BenchReport>;
}

/**
 * Release actions, run in reverse order of registration. Each action runs at
 * most once, whether released early by its owner or at the end.
 */
export class Cleanup {
  #actions: { run: () => Promise<void> }[] = [];

  /**
   * Registers an action.
   *
   * @param action Releases one resource; errors are swallowed.
   * @returns Runs the action now (once) and unregisters it.
   */
  add(action: () => unknown): () => Promise<void> {
    let done: Promise<void> | undefined;
    const entry = {
      run: (): Promise<void> => {
        done ??= (async (): Promise<void> => {
          try {
            await action();
          } catch {
            // Best effort: one failed release must not block the others.
          }
        })();
        return done;
      },
    };
    this.#actions.push(entry);
    return async (): Promise<void> => {
      this.#actions = this.#actions.filter((other) => other !== entry);
      await entry.run();
    };
  }

  /** Runs every registered action, newest first. */
  async runAll(): Promise<void> {
    const actions = this.#actions.reverse();
    this.#actions = [];
    for (const action of actions) await action.run();
  }
}
