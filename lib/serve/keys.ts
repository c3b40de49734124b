/**
 * The API keys of `waffle serve`: each belongs to one tenant, and a request
 * that carries it acts as that tenant. A key is `e2b_` and 40 lowercase hex
 * digits (160 random bits; E2B's Python SDK refuses a key not of the form
 * `^e2b_[0-9a-f]+$`). Only its SHA-256 is stored, so the database (or a copy
 * of it) never gives a key away; a key is shown once, when it is made.
 *
 * An admin key (`key create --admin`) belongs to a tenant too (its creates
 * go there) but sees every tenant's sandboxes: the operator's key, for the
 * console and an all-tenant `GET /metrics`.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { sha256Hex } from "../digest.ts";
import { UsageError } from "../errors.ts";
import { checkId } from "../config/sandbox_key.ts";
import { isBusyError, statement, transaction } from "../queue/connection.ts";
import { timingSafeEqual } from "../bytes.ts";
import * as z from "../schema.ts";

/** A key as listed: never the key nor its hash. */
export interface KeyInfo {
  /** The key's id, `k_` and 16 hex digits. */
  id: string;
  /** Its name, unique within its tenant. */
  name: string;
  /** The tenant it acts as. */
  tenant: string;
  /** When it was made, in milliseconds since the epoch. */
  createdAt: number;
  /** When a request last carried it (to the minute), or null when none has. */
  lastUsedAt: number | null;
  /** An admin key: it sees every tenant's sandboxes. */
  admin: boolean;
}

/** A key just made: the only time the key itself is known. */
export interface CreatedKey {
  /** The key's id. */
  id: string;
  /** Its name. */
  name: string;
  /** Its tenant. */
  tenant: string;
  /** The key: `e2b_` and 40 lowercase hex digits. */
  key: string;
  /** An admin key. */
  admin: boolean;
}

/** Whose a verified key is. */
export interface KeyOwner {
  /** The key's id. */
  id: string;
  /** Its name. */
  name: string;
  /** The tenant the request acts as. */
  tenant: string;
  /** An admin key: it sees every tenant's sandboxes. */
  admin: boolean;
}

/** Options of {@linkcode KeyStore}. */
export interface KeyStoreOptions {
  /** The wall clock, in milliseconds since the epoch (tests); default `Date.now`. */
  now?: () => number;
}

/** The form of every key: checked before anything is hashed or looked up. */
export const KEY_PATTERN: RegExp = /^e2b_[0-9a-f]{40}$/;

const KEY_BYTES = 20;
const ID_PATTERN = /^k_[0-9a-f]{16}$/;
/** `last_used_at` is written at most this often per key: no write per request. */
const LAST_USED_GRAIN_MS = 60_000;

interface KeyRow {
  id: string;
  name: string;
  tenant: string;
  hash: string;
  created_at: number;
  last_used_at: number | null;
  /** 1 for an admin key (absent in a database made before admin keys: 0). */
  admin: number;
}

/**
 * The keys of one `waffle serve` database (see `openServeDb`). Several
 * stores (a server, `waffle serve key` processes) may share one file.
 *
 * @example
 * ```ts ignore
 * const keys = new KeyStore(openServeDb(home));
 * const { key } = keys.create({ tenant: "acme" });
 * keys.verify(key); // { id: "k_…", name: "key-…", tenant: "acme" }
 * ```
 */
export class KeyStore {
  readonly #db: DatabaseSync;
  readonly #now: () => number;

  /**
   * Uses the keys of an open database.
   *
   * @param db A connection from `openServeDb`; the caller closes it.
   * @param options The clock.
   */
  constructor(db: DatabaseSync, options: KeyStoreOptions = {}) {
    this.#db = db;
    this.#now = options.now ?? Date.now;
  }

  /**
   * Makes a key for a tenant. Its name defaults to `key-` and 8 hex digits.
   *
   * @param request The tenant (a `--tenant` id), optionally the name (the same rule), and
   *   `admin` for a key that sees every tenant.
   * @returns The key, shown this once, with its id, name, tenant and whether it is an admin's.
   * @throws {UsageError} On a bad tenant or name, a name shaped like a key id, or a name the
   *   tenant already has.
   */
  create(
    request: { tenant: string; name?: string | undefined; admin?: boolean | undefined },
  ): CreatedKey {
    const admin = request.admin === true;
    const tenant = checkId("tenant id", request.tenant);
    const given = request.name === undefined ? undefined : checkId("key name", request.name);
    if (given !== undefined && ID_PATTERN.test(given)) {
      throw new UsageError(`Invalid key name '${given}': names of this form are key ids`);
    }
    const key = `e2b_${hex(KEY_BYTES)}`;
    const hash = sha256Hex(key);
    // A generated name that a tenant already has is drawn again; a given one is refused.
    for (let attempt = 0; attempt < 8; attempt++) {
      const id = `k_${hex(8)}`;
      const name = given ?? `key-${hex(4)}`;
      const made = transaction(this.#db, () => {
        const taken = statement(this.#db, "SELECT 1 FROM keys WHERE tenant = ? AND name = ?")
          .get(tenant, name);
        if (taken !== undefined) return false;
        statement(
          this.#db,
          "INSERT INTO keys (id, name, tenant, hash, created_at, admin) VALUES (?, ?, ?, ?, ?, ?)",
        ).run(id, name, tenant, hash, this.#now(), admin ? 1 : 0);
        return true;
      });
      if (made) return { id, name, tenant, key, admin };
      if (given !== undefined) {
        throw new UsageError(`Tenant '${tenant}' already has a key named '${given}'`);
      }
    }
    throw new UsageError(`Cannot find a free key name for tenant '${tenant}': give --name N`);
  }

  /**
   * Lists the keys, by tenant then age.
   *
   * @param filter Only one tenant's keys.
   * @returns Each key's id, name, tenant and times; never a key or its hash.
   */
  list(filter: { tenant?: string | undefined } = {}): KeyInfo[] {
    const rows =
      (filter.tenant === undefined
        ? statement(this.#db, "SELECT * FROM keys ORDER BY tenant, created_at, id").all()
        : statement(this.#db, "SELECT * FROM keys WHERE tenant = ? ORDER BY created_at, id")
          .all(filter.tenant)) as unknown as KeyRow[];
    return rows.map(infoOf);
  }

  /**
   * Removes a key, named by its id or by its name. A name several tenants
   * have needs the tenant.
   *
   * @param idOrName The key's id (`k_…`) or name.
   * @param options Only a key of this tenant.
   * @returns True when a key was removed, false when none matched.
   * @throws {UsageError} When a name without a tenant matches keys of several tenants.
   */
  remove(idOrName: string, options: { tenant?: string | undefined } = {}): boolean {
    return transaction(this.#db, () => {
      const rows = (statement(
        this.#db,
        "SELECT * FROM keys WHERE id = ?1 OR name = ?1 ORDER BY tenant",
      ).all(idOrName) as unknown as KeyRow[])
        .filter((row) => options.tenant === undefined || row.tenant === options.tenant);
      // An id is unique, and no name has an id's form.
      const byId = rows.filter((row) => row.id === idOrName);
      const matches = byId.length > 0 ? byId : rows;
      if (matches.length === 0) return false;
      if (matches.length > 1) {
        const tenants = matches.map((row) => `'${row.tenant}'`).join(", ");
        throw new UsageError(
          `Key name '${idOrName}' is in several tenants (${tenants}): give --tenant T or the key's id`,
        );
      }
      statement(this.#db, "DELETE FROM keys WHERE id = ?").run(matches[0]!.id);
      return true;
    });
  }

  /**
   * Every key as a keys file holds it (`waffle serve key export`): owners and hashes.
   *
   * @returns The keys.
   */
  export(): ExportedKey[] {
    const rows = statement(this.#db, "SELECT * FROM keys ORDER BY tenant, created_at, id")
      .all() as unknown as KeyRow[];
    return rows.map((row) => ({
      id: row.id,
      name: row.name,
      tenant: row.tenant,
      hash: row.hash,
      admin: row.admin === 1,
    }));
  }

  /**
   * Finds whose a key is. Anything not of the key's form is refused before
   * it is hashed; the stored hash is compared in time that does not depend
   * on where it differs. Marks the key used (at most once a minute).
   *
   * @param key What a request carried (`X-API-KEY`).
   * @returns The key's id, name, tenant and admin flag, or undefined when it is no key of this store.
   */
  verify(key: string): KeyOwner | undefined {
    if (!KEY_PATTERN.test(key)) return undefined;
    const hash = sha256Hex(key);
    const row = statement(this.#db, "SELECT * FROM keys WHERE hash = ?").get(hash) as
      | KeyRow
      | undefined;
    if (row === undefined || !timingSafeEqual(encode(row.hash), encode(hash))) return undefined;
    const now = this.#now();
    if (row.last_used_at === null || now - row.last_used_at >= LAST_USED_GRAIN_MS) {
      try {
        statement(this.#db, "UPDATE keys SET last_used_at = ? WHERE id = ?").run(now, row.id);
      } catch (error) {
        // Only a note: a file locked past the busy timeout must not fail the request.
        if (!isBusyError(error)) throw error;
      }
    }
    return { id: row.id, name: row.name, tenant: row.tenant, admin: row.admin === 1 };
  }
}

/** A key as exported for a keys file: its owner and its hash, never the key. */
export interface ExportedKey {
  /** The key's id. */
  id: string;
  /** Its name. */
  name: string;
  /** Its tenant. */
  tenant: string;
  /** SHA-256 of the key, hex. */
  hash: string;
  /** An admin key (absent in a file exported before admin keys: false). */
  admin?: boolean | undefined;
}

const exportedSchema = z.object({
  keys: z.array(z.object({
    id: z.string().check(z.regex(ID_PATTERN)),
    name: z.string().check(z.minLength(1), z.maxLength(64)),
    tenant: z.string().check(z.minLength(1), z.maxLength(64)),
    hash: z.string().check(z.regex(/^[0-9a-f]{64}$/)),
    admin: z.optional(z.boolean()),
  })).check(z.maxLength(100_000)),
});

/** The largest keys file read: 100 000 keys fit well under it. */
const KEYS_FILE_BYTES = 32 << 20;

/**
 * The keys of a keys file (`waffle serve key export`, `[serve] keys_file`):
 * what several servers share, a Kubernetes Secret mounted into each. The
 * file is read again when it changes (a Secret's update), at most once a
 * second; a file that does not read keeps the keys read before, and says why.
 *
 * @param path The file.
 * @param options `onError`: told one line when the file cannot be read.
 * @returns `verify`, as {@linkcode KeyStore.verify} (no last-used time).
 * @throws {UsageError} When the file cannot be read at start.
 */
export function keysFile(
  path: string,
  options: { onError?: (line: string) => void } = {},
): { verify(key: string): KeyOwner | undefined } {
  const read = (): { byHash: Map<string, ExportedKey>; mtime: number } => {
    const info = Deno.statSync(path);
    if (!info.isFile || info.size > KEYS_FILE_BYTES) {
      throw new UsageError(`Keys file '${path}' is not a regular file of at most 32 MiB`);
    }
    const parsed = exportedSchema.safeParse(JSON.parse(Deno.readTextFileSync(path)));
    if (!parsed.success) {
      throw new UsageError(`Keys file '${path}' is not a 'waffle serve key export'`);
    }
    return {
      byHash: new Map(parsed.data.keys.map((key) => [key.hash, key])),
      mtime: info.mtime?.getTime() ?? 0,
    };
  };
  let known: { byHash: Map<string, ExportedKey>; mtime: number };
  try {
    known = read();
  } catch (cause) {
    if (cause instanceof UsageError) throw cause;
    throw new UsageError(`Cannot read keys file '${path}': ${(cause as Error).message}`, { cause });
  }
  let checkedAt = Date.now();
  return {
    verify(key: string): KeyOwner | undefined {
      if (!KEY_PATTERN.test(key)) return undefined;
      if (Date.now() - checkedAt >= 1000) {
        checkedAt = Date.now();
        try {
          if ((Deno.statSync(path).mtime?.getTime() ?? 0) !== known.mtime) known = read();
        } catch (error) {
          options.onError?.(`keys file '${path}' kept as it was: ${(error as Error).message}`);
        }
      }
      const hash = sha256Hex(key);
      const row = known.byHash.get(hash);
      if (row === undefined || !timingSafeEqual(encode(row.hash), encode(hash))) return undefined;
      return { id: row.id, name: row.name, tenant: row.tenant, admin: row.admin === true };
    },
  };
}

function infoOf(row: KeyRow): KeyInfo {
  return {
    id: row.id,
    name: row.name,
    tenant: row.tenant,
    createdAt: row.created_at,
    lastUsedAt: row.last_used_at,
    admin: row.admin === 1,
  };
}

function hex(bytes: number): string {
  const random = crypto.getRandomValues(new Uint8Array(bytes));
  return Array.from(random, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

function encode(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}
