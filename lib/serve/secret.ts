/**
 * Comparing secrets of the caller's choosing (access tokens, signatures) in
 * constant time.
 *
 * @module
 */
import { sha256 } from "@noble/hashes/sha2";
import { timingSafeEqual } from "../bytes.ts";

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
  return timingSafeEqual(sha256(encoder.encode(given)), sha256(encoder.encode(expected)));
}
