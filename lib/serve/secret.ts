/**
 * Comparing secrets (API keys, access tokens, signatures) in constant time.
 *
 * @module
 */
import { sha256 } from "@noble/hashes/sha2";

/**
 * Whether two secrets are equal, in time that depends on neither: both are
 * hashed first, so even their lengths leak nothing.
 *
 * @param given What the caller sent.
 * @param expected The secret.
 * @returns True when they are the same string.
 */
export function sameSecret(given: string, expected: string): boolean {
  const encoder = new TextEncoder();
  const a = sha256(encoder.encode(given));
  const b = sha256(encoder.encode(expected));
  let difference = 0;
  for (let i = 0; i < a.length; i++) difference |= a[i]! ^ b[i]!;
  return difference === 0;
}
