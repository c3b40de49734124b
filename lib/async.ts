/**
 * Small helpers for bounded waits and scheduling.
 *
 * @module
 */

/**
 * Waits for a promise to settle (either way), for at most `ms`.
 *
 * @param promise What to wait for.
 * @param ms The bound in milliseconds.
 * @returns True when it settled in time; false when the bound ran out.
 */
export async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([promise.then(() => true, () => true), expired]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Runs `fn` after the current macrotask (not as a microtask), through a
 * one-use `MessageChannel`: unlike `setImmediate`, whose first use loads
 * Deno's Node layer (~14 ms of a process start), and `setTimeout(0)`, which
 * Deno rounds up to its timer resolution (about 1-2 ms).
 *
 * @param fn What to run.
 */
export function afterThisTask(fn: () => void): void {
  const { port1, port2 } = new MessageChannel();
  port1.onmessage = () => {
    port1.close(); // a port left open would keep the process alive
    fn();
  };
  port2.postMessage(null);
  port2.close();
}

/**
 * Like `Promise.all`, but waits for every promise to settle before it
 * throws the first rejection (in order), so nothing started here is still
 * running when the caller handles the failure.
 *
 * @example
 * ```ts ignore
 * const [a, b] = await settleAll([first(), second()]);
 * ```
 *
 * @param promises The promises.
 * @returns Their values, in order.
 * @throws The first rejection's reason, once every promise has settled.
 */
export async function settleAll<T extends readonly unknown[]>(
  promises: { readonly [K in keyof T]: Promise<T[K]> },
): Promise<T> {
  const settled = await Promise.allSettled(promises);
  const failed = settled.find((outcome) => outcome.status === "rejected");
  if (failed !== undefined) throw failed.reason;
  return settled.map((outcome) =>
    (outcome as PromiseFulfilledResult<unknown>).value
  ) as unknown as T;
}

/**
 * One call at a time per key: a second `run` of a key whose call is under
 * way shares it (a removal asked twice, by a kill and by the reaper).
 *
 * @example
 * ```ts
 * const removals = new SingleFlight<string, boolean>();
 * await Promise.all([removals.run("a", remove), removals.run("a", remove)]); // one remove
 * ```
 */
export class SingleFlight<K, V> {
  readonly #flights = new Map<K, Promise<V>>();

  /**
   * Runs `fn` for `key`, or joins the call under way.
   *
   * @param key What the call is for.
   * @param fn The call.
   * @returns Its result.
   */
  run(key: K, fn: () => Promise<V>): Promise<V> {
    let flight = this.#flights.get(key);
    if (flight === undefined) {
      flight = fn().finally(() => this.#flights.delete(key));
      this.#flights.set(key, flight);
    }
    return flight;
  }

  /**
   * Whether a call for `key` is under way.
   *
   * @param key What the call is for.
   * @returns True until it settles.
   */
  has(key: K): boolean {
    return this.#flights.has(key);
  }
}
