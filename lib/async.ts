/**
 * Small helpers for bounded waits.
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
