/**
 * The server's record of the sandboxes it made: who owns each (tenant and
 * key), its template, metadata, environment, access token and end time. In
 * `serve.db` beside the keys (its table is `db.ts`'s), so a server killed and started again serves
 * every sandbox it had.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { statement } from "../queue/connection.ts";
import type { NetworkAsk } from "./network.ts";
import type { ProcessJournal, SavedProcess } from "./processes.ts";

/** A sandbox as the server records it. */
export interface SandboxRecord {
  /** The E2B sandbox id, also the waffle user id of its sandbox (`[a-z0-9]`). */
  id: string;
  /** The tenant of the key that made it. */
  tenant: string;
  /** The id of the key that made it. */
  keyId: string;
  /** The template it was made from. */
  template: string;
  /** The image the template named then. */
  image: string;
  /** The caller's metadata (string to string). */
  metadata: Record<string, string>;
  /** Variables every command of the sandbox gets (a command's own win). */
  envVars: Record<string, string>;
  /** The envd access token (`X-Access-Token`); also signs `/files` URLs. */
  accessToken: string;
  /** When it was made (ms since the epoch). */
  startedAt: number;
  /** When the reaper removes it (ms since the epoch). */
  endAt: number;
  /** `creating` until its container serves; `running` or `paused` after. */
  state: "creating" | "running" | "paused";
  /** What its create asked of the network; undefined when it asked nothing. */
  network?: NetworkAsk | undefined;
}

interface Row {
  id: string;
  tenant: string;
  key_id: string;
  template: string;
  image: string;
  metadata: string;
  env_vars: string;
  access_token: string;
  started_at: number;
  end_at: number;
  state: SandboxRecord["state"];
  network: string | null;
}

interface ProcessRow {
  pid: number;
  request_id: string;
  tag: string | null;
  config: string;
  pty: number;
  stdin: number;
}

/** The `sandboxes` table of `serve.db`. */
export class SandboxStore {
  readonly #db: DatabaseSync;

  /**
   * The table of an open `serve.db` (its migrations made it).
   *
   * @param db The server's database (see `openServeDb`).
   */
  constructor(db: DatabaseSync) {
    this.#db = db;
  }

  /** Records a new sandbox (state `creating`). */
  insert(record: SandboxRecord): void {
    statement(
      this.#db,
      `INSERT INTO sandboxes (id, tenant, key_id, template, image, metadata, env_vars,
         access_token, started_at, end_at, state, network)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ).run(
      record.id,
      record.tenant,
      record.keyId,
      record.template,
      record.image,
      JSON.stringify(record.metadata),
      JSON.stringify(record.envVars),
      record.accessToken,
      record.startedAt,
      record.endAt,
      record.state,
      record.network === undefined ? null : JSON.stringify(record.network),
    );
  }

  /** The sandbox, when this tenant owns it (another tenant's is not found). */
  get(id: string, tenant?: string): SandboxRecord | undefined {
    const row = statement(this.#db, "SELECT * FROM sandboxes WHERE id = ?").get(id) as
      | Row
      | undefined;
    if (row === undefined || (tenant !== undefined && row.tenant !== tenant)) return undefined;
    return fromRow(row);
  }

  /** A tenant's sandboxes (or every one), oldest first. */
  list(tenant?: string): SandboxRecord[] {
    const rows =
      (tenant === undefined
        ? statement(this.#db, "SELECT * FROM sandboxes ORDER BY started_at, id").all()
        : statement(this.#db, "SELECT * FROM sandboxes WHERE tenant = ? ORDER BY started_at, id")
          .all(tenant)) as unknown as Row[];
    return rows.map(fromRow);
  }

  /** How many sandboxes a tenant has (creating ones included). */
  count(tenant: string): number {
    const row = statement(this.#db, "SELECT count(*) AS n FROM sandboxes WHERE tenant = ?").get(
      tenant,
    ) as { n: number };
    return row.n;
  }

  /** Sets a sandbox's state. */
  setState(id: string, state: SandboxRecord["state"]): void {
    statement(this.#db, "UPDATE sandboxes SET state = ? WHERE id = ?").run(state, id);
  }

  /** Sets a sandbox's end time. */
  setEndAt(id: string, endAt: number): void {
    statement(this.#db, "UPDATE sandboxes SET end_at = ? WHERE id = ?").run(endAt, id);
  }

  /** Forgets a sandbox and its processes. */
  delete(id: string): void {
    statement(this.#db, "DELETE FROM processes WHERE sandbox_id = ?").run(id);
    statement(this.#db, "DELETE FROM sandboxes WHERE id = ?").run(id);
  }

  /** Sandboxes whose end time has passed. */
  expired(now: number): SandboxRecord[] {
    return (statement(this.#db, "SELECT * FROM sandboxes WHERE end_at <= ?").all(
      now,
    ) as unknown as Row[]).map(fromRow);
  }
}

/**
 * The `processes` table of `serve.db`: each sandbox's envd processes, so a
 * server killed and started again takes them over. Written twice per
 * process, on the hot path of every command: its connection's commits
 * survive the server's death, not the machine's (the processes do not
 * either).
 */
export class ProcessStore {
  readonly #db: DatabaseSync;

  /**
   * The table of an open `serve.db`.
   *
   * @param db A connection opened with `survives: "process-death"`.
   */
  constructor(db: DatabaseSync) {
    this.#db = db;
  }

  /** The ids of the sandboxes with recorded processes. */
  withProcesses(): string[] {
    return (statement(this.#db, "SELECT DISTINCT sandbox_id FROM processes").all() as {
      sandbox_id: string;
    }[]).map((row) => row.sandbox_id);
  }

  /**
   * The journal of one sandbox's processes (the `processes` table).
   *
   * @param id The sandbox.
   * @returns Its journal.
   */
  processes(id: string): ProcessJournal {
    const db = this.#db;
    return {
      save(process: SavedProcess): void {
        statement(
          db,
          `INSERT OR REPLACE INTO processes (sandbox_id, pid, request_id, tag, config, pty, stdin)
             VALUES (?, ?, ?, ?, ?, ?, ?)`,
        ).run(
          id,
          process.pid,
          process.requestId,
          process.tag ?? null,
          JSON.stringify(process.config),
          process.pty ? 1 : 0,
          process.stdin ? 1 : 0,
        );
      },
      forget(pid: number): void {
        statement(db, "DELETE FROM processes WHERE sandbox_id = ? AND pid = ?").run(id, pid);
      },
      saved(): SavedProcess[] {
        const rows = statement(db, "SELECT * FROM processes WHERE sandbox_id = ? ORDER BY pid")
          .all(id) as unknown as ProcessRow[];
        return rows.map((row) => ({
          pid: Number(row.pid),
          requestId: row.request_id,
          tag: row.tag ?? undefined,
          config: JSON.parse(row.config),
          pty: row.pty === 1,
          stdin: row.stdin === 1,
        }));
      },
    };
  }
}

function fromRow(row: Row): SandboxRecord {
  return {
    id: row.id,
    tenant: row.tenant,
    keyId: row.key_id,
    template: row.template,
    image: row.image,
    metadata: JSON.parse(row.metadata),
    envVars: JSON.parse(row.env_vars),
    accessToken: row.access_token,
    startedAt: row.started_at,
    endAt: row.end_at,
    state: row.state,
    ...(row.network === null ? {} : { network: JSON.parse(row.network) }),
  };
}
