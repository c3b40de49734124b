/**
 * What a host holds to have a queue served: the queue and the means to keep
 * a runner serving it. The host backend (a runner process on the host), a
 * user's sandbox and a restricted session's container are each one.
 *
 * @module
 */
import type { RunnerTrouble } from "./liveness.ts";
import type { Queue, SubmitOptions } from "./queue.ts";

/** A queue plus the means to keep a runner serving it. */
export interface Backend {
  /** The host side of the queue. */
  readonly queue: Queue;
  /**
   * Makes sure a live runner serves the queue (starting one if needed). A
   * waiting host passes what it found wrong with the runner, which the
   * backend then repairs (see `WaitOptions.revive`); it resolves `false`
   * when nothing was wrong after all (a paused sandbox) and nothing was done.
   */
  ensure(trouble?: RunnerTrouble): Promise<void | false>;
  /**
   * Ensures a runner and submits, as one step: a Docker backend holds the
   * sandbox lock across both, so a recycle never races a submission.
   */
  submit(options: SubmitOptions): Promise<string>;
  /** Closes the queue; the runner keeps going until its idle exit. */
  close(): void;
  /**
   * The host directory the runner sees at `SANDBOX_CHANNEL_DIR`: sessions
   * stream over a socket there (`queue/channel.ts`). None: over rows.
   */
  readonly channelDir?: string | undefined;
}
