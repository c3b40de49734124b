/**
 * SHA-256 in hex, synchronously, without `node:crypto`: loading Deno's Node
 * crypto layer costs about 20 ms of every process start, and the hot path
 * only hashes a few hundred bytes (names, the posture).
 *
 * @module
 */
import { sha256 } from "npm:@noble/hashes@2.0.1/sha2.js";
import { bytesToHex } from "npm:@noble/hashes@2.0.1/utils.js";

/**
 * The SHA-256 of a string (as UTF-8) or of bytes, in lowercase hex.
 *
 * @param data What to hash.
 * @returns 64 hex digits.
 */
export function sha256Hex(data: string | Uint8Array): string {
  return bytesToHex(sha256(typeof data === "string" ? new TextEncoder().encode(data) : data));
}
