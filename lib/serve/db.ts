/**
 * `waffle serve`'s own state: one SQLite file, `$WAFFLE_HOME/serve/serve.db`
 * (directory 0700, file 0600: it holds the keys' hashes), shared by a
 * running server and any number of `waffle serve key` processes.
 *
 * It is opened by the queue's one owner of SQLite connections
 * (`openDatabase`): its journal mode (TRUNCATE, a rollback journal), FULL
 * sync and busy timeout, so a `key create` waits for the server's write
 * instead of failing. The schema is a list of migrations, each bringing the
 * file from one version (`PRAGMA user_version`) to the next: a new table
 * is a new entry at the end of {@linkcode SERVE_MIGRATIONS}, never an edit
 * of an old one.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { join } from "../path.ts";
import { QueueError } from "../errors.ts";
import { messageOf, openDatabase } from "../queue/connection.ts";

/** Version 1: the API keys. Only a key's hash is stored, never the key. */
const KEYS_TABLE = `
CREATE TABLE keys (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  tenant TEXT NOT NULL,
  hash TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL,
  last_used_at INTEGER,
  UNIQUE (tenant, name)
);
`;

/**
 * Version 2: the sandboxes the server made (lib/serve/state.ts), so a server
 * started again serves every one it had.
 */
const SANDBOXES_TABLE = `
CREATE TABLE sandboxes (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  key_id TEXT NOT NULL,
  template TEXT NOT NULL,
  image TEXT NOT NULL,
  metadata TEXT NOT NULL,
  env_vars TEXT NOT NULL,
  access_token TEXT NOT NULL,
  started_at INTEGER NOT NULL,
  end_at INTEGER NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('creating', 'running', 'paused'))
);
CREATE INDEX sandboxes_tenant ON sandboxes (tenant, started_at, id);
`;
/**
 * Version 3: the processes each sandbox runs for envd (lib/serve/processes.ts),
 * so a server started again finds, by pid and tag, every process that kept
 * running without it, and takes it over.
 */
const PROCESSES_TABLE = `
CREATE TABLE processes (
  sandbox_id TEXT NOT NULL,
  pid INTEGER NOT NULL,
  request_id TEXT NOT NULL,
  tag TEXT,
  config TEXT NOT NULL,
  pty INTEGER NOT NULL,
  stdin INTEGER NOT NULL,
  PRIMARY KEY (sandbox_id, pid)
);
`;

/**
 * Version 4: what each sandbox's create asked of the network (`lib/serve/network.ts`), JSON or
 * NULL, so a restarted server narrows its egress again.
 */
const SANDBOX_NETWORK = `
ALTER TABLE sandboxes ADD COLUMN network TEXT;
`;

/**
 * Version 5: the snapshots of `POST /sandboxes/{id}/snapshots` (lib/serve/snapshots.ts), each a
 * volume image in `serve/snapshots/`, owned by a tenant and outliving the sandbox it was taken of.
 */
const SNAPSHOTS_TABLE = `
CREATE TABLE snapshots (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  name TEXT,
  sandbox_id TEXT NOT NULL,
  template TEXT NOT NULL,
  image TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  UNIQUE (tenant, name)
);
CREATE INDEX snapshots_tenant ON snapshots (tenant, created_at, id);
`;

/**
 * Version 6: admin keys (`waffle serve key create --admin`), which see every tenant's sandboxes.
 * A key of an older file is not one.
 */
const KEYS_ADMIN = `
ALTER TABLE keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0;
`;

/**
 * The schema, as migrations: entry `i` brings a file at version `i` to
 * version `i + 1`, so a file is at version `SERVE_MIGRATIONS.length` once
 * opened. Append; never edit an entry a released waffle has run.
 */
export const SERVE_MIGRATIONS: readonly string[] = Object.freeze([
  KEYS_TABLE,
  SANDBOXES_TABLE,
  PROCESSES_TABLE,
  SANDBOX_NETWORK,
  SNAPSHOTS_TABLE,
  KEYS_ADMIN,
]);

/** Options of {@linkcode openServeDb}. */
export interface ServeDbOptions {
  /** The migrations to bring the file to (tests); default {@linkcode SERVE_MIGRATIONS}. */
  migrations?: readonly string[];
  /** What the connection's commits survive (see `openDatabase`); default `power-loss`. */
  survives?: "power-loss" | "process-death";
}

/**
 * The path of `waffle serve`'s database in a home.
 *
 * @example
 * ```ts
 * import { serveDbPath } from "./db.ts";
 * serveDbPath("/var/lib/waffle"); // "/var/lib/waffle/serve/serve.db"
 * ```
 *
 * @param home The waffle home.
 * @returns The file's path.
 */
export function serveDbPath(home: string): string {
  return join(home, "serve", "serve.db");
}

/**
 * Opens (creating it, mode 0600 in a 0700 directory, when missing)
 * `waffle serve`'s database and brings its schema to the latest version.
 * Needs read and write access to the home.
 *
 * @example
 * ```ts ignore
 * const db = openServeDb("/var/lib/waffle");
 * try {
 *   // …
 * } finally {
 *   db.close();
 * }
 * ```
 *
 * @param home The waffle home.
 * @param options The migrations (tests only).
 * @returns The open connection; the caller closes it.
 * @throws {QueueError} When the directory or file cannot be made private, the file is not a
 *   database, or it has a schema version this waffle does not know (a newer one's).
 */
export function openServeDb(home: string, options: ServeDbOptions = {}): DatabaseSync {
  const migrations = options.migrations ?? SERVE_MIGRATIONS;
  const path = serveDbPath(home);
  privateDir(join(home, "serve"));
  privateFile(path);
  const upgrades: Record<number, string> = {};
  for (let version = 1; version < migrations.length; version++) {
    upgrades[version] = migrations.slice(version).join("\n");
  }
  return openDatabase(path, {
    role: "owner",
    schema: migrations.join("\n"),
    upgrades,
    version: migrations.length,
    ...(options.survives === undefined ? {} : { survives: options.survives }),
  });
}

// The directory holds the keys' hashes and every sandbox's access token:
// only the home's owner may list or open anything in it.
function privateDir(dir: string): void {
  try {
    Deno.mkdirSync(dir, { recursive: true, mode: 0o700 });
    const info = Deno.lstatSync(dir);
    if (!info.isDirectory) throw new QueueError(`'${dir}' is not a directory`);
    if ((info.mode! & 0o777) !== 0o700) Deno.chmodSync(dir, 0o700);
  } catch (cause) {
    if (cause instanceof QueueError) throw cause;
    throw new QueueError(`Cannot make directory '${dir}' private: ${messageOf(cause)}`, { cause });
  }
}

// Made before SQLite opens it, so it is never readable by others, not even
// for a moment under a loose umask (SQLite gives its journal the same mode).
function privateFile(path: string): void {
  try {
    Deno.openSync(path, { createNew: true, write: true, mode: 0o600 }).close();
  } catch (cause) {
    if (!(cause instanceof Deno.errors.AlreadyExists)) {
      throw new QueueError(`Cannot create '${path}': ${messageOf(cause)}`, { cause });
    }
  }
  const info = Deno.lstatSync(path);
  if (info.isFile && (info.mode! & 0o777) !== 0o600) Deno.chmodSync(path, 0o600);
}
