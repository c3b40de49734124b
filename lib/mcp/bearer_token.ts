/**
 * The bearer token of `waffle mcp serve`: every request must carry
 * `Authorization: Bearer <token>`. A fresh token is 32 random bytes in hex;
 * one read from a file must be at least {@linkcode MIN_TOKEN_CHARS} visible
 * ASCII characters (a token68, as RFC 6750 writes it).
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import { timingSafeEqual } from "../bytes.ts";

/** Random bytes in a fresh token. */
export const TOKEN_BYTES = 32;
/** The shortest token a file may hold. */
export const MIN_TOKEN_CHARS = 32;
/** The longest token a file may hold. */
const MAX_TOKEN_CHARS = 4096;
const TOKEN_PATTERN = /^[A-Za-z0-9\-._~+/]+=*$/;

/**
 * A fresh token: {@linkcode TOKEN_BYTES} random bytes, hex.
 *
 * @example
 * ```ts
 * const token = newBearerToken(); // 64 hex digits
 * ```
 *
 * @returns The token.
 */
export function newBearerToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(TOKEN_BYTES));
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

/**
 * Reads a token from a file (surrounding whitespace is ignored). Needs read
 * permission on the file.
 *
 * @example
 * ```ts ignore
 * const token = await readBearerToken("/run/secrets/mcp-token");
 * ```
 *
 * @param path The file.
 * @returns The token.
 * @throws {UsageError} When the file cannot be read, is readable by others, or holds no valid token.
 */
export async function readBearerToken(path: string): Promise<string> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (cause) {
    const why = cause instanceof Deno.errors.NotFound ? "no such file" : String(cause);
    throw new UsageError(`Cannot read token file '${path}': ${why}`, { cause });
  }
  // A secret others may read is no secret: refused, as ssh refuses such a key.
  const mode = (await Deno.stat(path)).mode ?? 0;
  if ((mode & 0o077) !== 0) {
    throw new UsageError(
      `Token file '${path}' is readable by others (mode '${
        (mode & 0o777).toString(8)
      }'): make it 0600`,
    );
  }
  const token = text.trim();
  if (
    token.length < MIN_TOKEN_CHARS || token.length > MAX_TOKEN_CHARS || !TOKEN_PATTERN.test(token)
  ) {
    throw new UsageError(
      `Token file '${path}' holds no token of ${MIN_TOKEN_CHARS} to ${MAX_TOKEN_CHARS} characters (letters, digits, -._~+/)`,
    );
  }
  return token;
}

/**
 * Whether an `Authorization` header carries the token, compared in time
 * that does not depend on where they differ.
 *
 * @example
 * ```ts
 * bearerMatches("Bearer abc", "abc"); // true
 * ```
 *
 * @param header The header's value, or null.
 * @param token The expected token.
 * @returns Whether it matches.
 */
export function bearerMatches(header: string | null, token: string): boolean {
  const match = header === null ? null : /^Bearer +(\S+) *$/i.exec(header);
  if (match === null) return false;
  return timingSafeEqual(new TextEncoder().encode(match[1]!), new TextEncoder().encode(token));
}
