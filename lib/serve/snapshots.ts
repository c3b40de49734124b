/**
 * The snapshots of `waffle serve` (E2B's `createSnapshot`, `listSnapshots`,
 * `deleteSnapshot`, and `Sandbox.create(snapshotId)`): each the volume
 * image of a sandbox copied at one instant while it keeps running
 * (`captureImage`, as a fork copies), kept where the sandbox's own state is
 * not, so it outlives the sandbox:
 *
 * ```
 * $WAFFLE_HOME/serve/             0700 (serve.db beside it)
 *   snapshots/                    0700, the host's alone
 *     <id>.img                    one snapshot's image (sparse)
 *     .<id>.taking                a capture under way (or a killed one's leftover)
 * ```
 *
 * Who owns each, its name, the sandbox and template it came from and its
 * size are rows of `serve.db`'s `snapshots` table: a key sees only its
 * tenant's (another tenant's id is not found). A tenant's snapshots count
 * against the `[sandbox]` limits `max_snapshots` (how many) and
 * `snapshot_bytes` (host disk of their images together).
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { join } from "../path.ts";
import { statement } from "../queue/connection.ts";
import { UsageError } from "../errors.ts";
import type { SandboxConfig } from "../config/config.ts";
import { captureImage, type ForkSource } from "../lifecycle/fork.ts";
import type { DockerClient } from "../docker/mod.ts";
import { SNAPSHOT_NAME } from "../lifecycle/snapshot_store.ts";
import type { SandboxRecord } from "./state.ts";
import { newSandboxId } from "./sandboxes.ts";

/** One snapshot as `serve.db` records it. */
export interface SnapshotRecord {
  /** Its id (`[a-z0-9]`), the `snapshotID` and a create's `templateID`. */
  id: string;
  /** The tenant of the key that took it. */
  tenant: string;
  /** The name it was given, unique in its tenant; a create may use it for the id. */
  name: string | undefined;
  /** The sandbox it was taken of. */
  sandboxId: string;
  /** That sandbox's template. */
  template: string;
  /** That sandbox's container image. */
  image: string;
  /** When it was taken (ms since the epoch). */
  createdAt: number;
  /** Host disk its image takes, in bytes. */
  bytes: number;
}

interface Row {
  id: string;
  tenant: string;
  name: string | null;
  sandbox_id: string;
  template: string;
  image: string;
  created_at: number;
  bytes: number;
}

/** The snapshots of one server. */
export class ServeSnapshots {
  readonly #db: DatabaseSync;
  readonly #dir: string;

  /**
   * @param db The server's database (its migrations made the table).
   * @param home The waffle home.
   */
  constructor(db: DatabaseSync, home: string) {
    this.#db = db;
    this.#dir = join(home, "serve", "snapshots");
    // What a server killed during a capture left (a partial copy, an image
    // renamed in but never recorded): no capture runs before this one starts.
    try {
      for (const entry of Deno.readDirSync(this.#dir)) {
        const image = /^([a-z0-9]+)\.img$/.exec(entry.name);
        const orphan = image !== null &&
          statement(db, "SELECT 1 FROM snapshots WHERE id = ?").get(image[1]!) === undefined;
        if (orphan || /^\.[a-z0-9]+\.taking$/.test(entry.name)) {
          Deno.removeSync(join(this.#dir, entry.name));
        }
      }
    } catch {
      // No store yet.
    }
  }

  /**
   * The image file of a snapshot.
   *
   * @param record The snapshot.
   * @returns Its path.
   */
  imagePath(record: Pick<SnapshotRecord, "id">): string {
    return join(this.#dir, `${record.id}.img`);
  }

  /**
   * Takes a snapshot of a running sandbox: its volume copied at one instant
   * (its processes frozen for the copy, never stopped). A name a snapshot of
   * the tenant has already moves to the new one, and the old one goes.
   *
   * @param source The sandbox's record and its open sandbox.
   * @param options The snapshot's name, the limits, the Docker client.
   * @returns The snapshot.
   * @throws {UsageError} On a bad name or a limit reached.
   */
  async take(
    source: { record: SandboxRecord; sandbox: ForkSource },
    options: {
      name?: string | undefined;
      limits: Pick<SandboxConfig, "maxSnapshots" | "snapshotBytes">;
      docker: DockerClient;
    },
  ): Promise<SnapshotRecord> {
    const { record, sandbox } = source;
    const { name, limits } = options;
    if (name !== undefined && !SNAPSHOT_NAME.test(name)) {
      throw new UsageError(
        `Invalid snapshot name '${
          name.slice(0, 80)
        }': use 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit`,
      );
    }
    const replaced = name === undefined ? undefined : this.find(record.tenant, name);
    const kept = this.list(record.tenant).filter((s) => s.id !== replaced?.id);
    if (kept.length >= limits.maxSnapshots) {
      throw new UsageError(
        `Snapshot limit reached: tenant '${record.tenant}' has ${kept.length} of the ${limits.maxSnapshots} snapshots [sandbox] max_snapshots allows`,
      );
    }
    const estimate = (Deno.statSync(join(sandbox.paths.root, "volume.img")).blocks ?? 0) * 512;
    const total = kept.reduce((sum, s) => sum + s.bytes, 0) + estimate;
    if (limits.snapshotBytes > 0 && total > limits.snapshotBytes) {
      throw new UsageError(
        `Snapshot limit reached: the snapshots of tenant '${record.tenant}' would take ${total} bytes, over the ${limits.snapshotBytes} of [sandbox] snapshot_bytes`,
      );
    }
    Deno.mkdirSync(this.#dir, { recursive: true, mode: 0o700 });
    const id = newSandboxId();
    const taking = join(this.#dir, `.${id}.taking`);
    const { forkedAt } = await captureImage(sandbox, taking, { docker: options.docker });
    const snapshot: SnapshotRecord = {
      id,
      tenant: record.tenant,
      name,
      sandboxId: record.id,
      template: record.template,
      image: record.image,
      createdAt: Date.parse(forkedAt),
      bytes: (Deno.statSync(taking).blocks ?? 0) * 512,
    };
    try {
      Deno.renameSync(taking, this.imagePath(snapshot));
      this.#db.exec("BEGIN IMMEDIATE");
      try {
        if (replaced !== undefined) {
          statement(this.#db, "DELETE FROM snapshots WHERE id = ?").run(replaced.id);
        }
        statement(
          this.#db,
          `INSERT INTO snapshots (id, tenant, name, sandbox_id, template, image, created_at, bytes)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
        ).run(
          id,
          snapshot.tenant,
          name ?? null,
          snapshot.sandboxId,
          snapshot.template,
          snapshot.image,
          snapshot.createdAt,
          snapshot.bytes,
        );
        this.#db.exec("COMMIT");
      } catch (error) {
        this.#db.exec("ROLLBACK");
        throw error;
      }
    } catch (error) {
      await Deno.remove(this.imagePath(snapshot)).catch(() => {});
      await Deno.remove(taking).catch(() => {});
      throw error;
    }
    if (replaced !== undefined) await Deno.remove(this.imagePath(replaced)).catch(() => {});
    return snapshot;
  }

  /**
   * A tenant's snapshot by id or name.
   *
   * @param tenant The caller's tenant (undefined: an admin's scope, every tenant's; a name
   *   then needs to be one tenant's only, an id is unique).
   * @param idOrName Its id, or the name it was given.
   * @returns It, or undefined (also for another tenant's).
   */
  find(tenant: string | undefined, idOrName: string): SnapshotRecord | undefined {
    const row = (tenant === undefined
      ? statement(
        this.#db,
        "SELECT * FROM snapshots WHERE id = ?1 OR name = ?1 ORDER BY id = ?1 DESC LIMIT 1",
      ).get(idOrName)
      : statement(
        this.#db,
        "SELECT * FROM snapshots WHERE tenant = ? AND (id = ? OR name = ?) ORDER BY id = ? DESC LIMIT 1",
      ).get(tenant, idOrName, idOrName, idOrName)) as Row | undefined;
    return row === undefined ? undefined : fromRow(row);
  }

  /**
   * A tenant's snapshots, oldest first.
   *
   * @param tenant The caller's tenant (undefined: every tenant's, an admin's scope).
   * @param filter Only those of one sandbox, or of one id or name.
   * @returns The snapshots.
   */
  list(
    tenant: string | undefined,
    filter: { sandboxId?: string; name?: string } = {},
  ): SnapshotRecord[] {
    const rows =
      (tenant === undefined
        ? statement(this.#db, "SELECT * FROM snapshots ORDER BY created_at, id").all()
        : statement(this.#db, "SELECT * FROM snapshots WHERE tenant = ? ORDER BY created_at, id")
          .all(tenant)) as unknown as Row[];
    return rows.map(fromRow).filter((s) =>
      (filter.sandboxId === undefined || s.sandboxId === filter.sandboxId) &&
      (filter.name === undefined || s.name === filter.name || s.id === filter.name)
    );
  }

  /**
   * Removes a tenant's snapshot: its row, then its image.
   *
   * @param tenant The caller's tenant (undefined: any tenant's, an admin's scope).
   * @param idOrName Its id or name.
   * @returns False when the tenant has no such snapshot.
   */
  async remove(tenant: string | undefined, idOrName: string): Promise<boolean> {
    const snapshot = this.find(tenant, idOrName);
    if (snapshot === undefined) return false;
    statement(this.#db, "DELETE FROM snapshots WHERE id = ?").run(snapshot.id);
    await Deno.remove(this.imagePath(snapshot)).catch(() => {});
    return true;
  }
}

function fromRow(row: Row): SnapshotRecord {
  return {
    id: row.id,
    tenant: row.tenant,
    name: row.name ?? undefined,
    sandboxId: row.sandbox_id,
    template: row.template,
    image: row.image,
    createdAt: Number(row.created_at),
    bytes: Number(row.bytes),
  };
}
