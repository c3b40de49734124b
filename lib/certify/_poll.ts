/**
 * Bounded waits of the certification checks: each one ends in a
 * {@linkcode CertifyError} naming what it waited for, never in a hang.
 *
 * @module
 */
import { CertifyError } from "../errors.ts";

/**
 * Resolves after `ms`.
 *
 * @param ms Milliseconds.
 * @returns Once they passed.
 */
export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Polls `check` until it returns true.
 *
 * @param check The condition (may be async).
 * @param options The bound, what is waited for (for the message), the pause between polls.
 * @throws {CertifyError} When the bound runs out.
 */
export async function pollUntil(
  check: () => boolean | Promise<boolean>,
  options: { timeoutMs: number; what: string; intervalMs?: number },
): Promise<void> {
  const deadline = Date.now() + options.timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) {
      throw new CertifyError(
        `Timed out after ${options.timeoutMs / 1000} s waiting for ${options.what}`,
      );
    }
    await delay(options.intervalMs ?? 10);
  }
}

/**
 * A promise, or a {@linkcode CertifyError} once `ms` have passed.
 *
 * @param promise What to wait for.
 * @param options The bound and what is waited for.
 * @returns What `promise` resolved to.
 * @throws {CertifyError} When the bound runs out first.
 */
export async function within<T>(
  promise: Promise<T>,
  options: { ms: number; what: string },
): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () =>
            reject(
              new CertifyError(
                `Timed out after ${options.ms / 1000} s waiting for ${options.what}`,
              ),
            ),
          options.ms,
        );
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
