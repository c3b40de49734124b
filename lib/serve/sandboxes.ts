/**
 * The sandboxes `waffle serve` made: each an ordinary waffle sandbox whose
 * user id is the E2B sandbox id and whose tenant is its key's, recorded in
 * {@linkcode SandboxStore} so a restarted server serves them again. A reaper
 * removes each at its end time, paused or not (Docker removes a paused
 * container by force).
 *
 * @module
 */
import { SingleFlight } from "../async.ts";
import { newBearerToken } from "../mcp/bearer_token.ts";
import type { DockerClient } from "../docker/mod.ts";
import type { SandboxConfig } from "../config/config.ts";
import { SandboxPausedError, UsageError } from "../errors.ts";
import { openSandbox, removeSandbox, type Sandbox } from "../sandbox/mod.ts";
import { pauseSandbox, resumeSandbox } from "../lifecycle/pause.ts";
import { stopSandbox } from "../lifecycle/fleet.ts";
import type { SandboxRecord, SandboxStore } from "./state.ts";
import type { ServeSnapshots, SnapshotRecord } from "./snapshots.ts";
import type { Admission } from "./limits.ts";
import { forkSandbox, sandboxFromImage } from "../lifecycle/fork.ts";
import { type EgressGrant, narrowEgress, type NetworkAsk } from "./network.ts";

/** What a create asks for. */
export interface CreateRequest {
  /** The tenant of the calling key. */
  tenant: string;
  /** The calling key's id. */
  keyId: string;
  /** The template's name. */
  template: string;
  /** The image the template names. */
  image: string;
  /** Seconds until the sandbox is removed. */
  timeoutS: number;
  /** The caller's metadata. */
  metadata: Record<string, string>;
  /** Variables for every command. */
  envVars: Record<string, string>;
  /** What it asked of the network (already judged by `narrowEgress`); undefined: nothing. */
  network?: NetworkAsk | undefined;
  /** A volume image to start from (a snapshot's): its workspace, a fresh queue. */
  fromImage?: string | undefined;
}

/** One fork's outcome, as E2B's fork answers it: the new sandbox or why not. */
export type ForkOutcome =
  | { record: SandboxRecord }
  | { error: { code: number; message: string } };

/** What the server reads of its sandboxes' records. */
export interface SandboxView {
  /** A sandbox by id (of this tenant, when given). */
  get(id: string, tenant?: string): SandboxRecord | undefined;
  /** Every sandbox (of this tenant, when given). */
  list(tenant?: string): SandboxRecord[];
  /** How many sandboxes a tenant has, creates under way included. */
  count(tenant: string): number;
}

/**
 * The sandboxes of a server, wherever they run: this host's Docker
 * ({@linkcode ServeSandboxes}) or a Kubernetes cluster (`KubeSandboxes`).
 * E2B's control API is written against this.
 */
export interface SandboxFleet {
  /** The records. */
  readonly store: SandboxView;
  /** The server's snapshots, when it keeps them. */
  readonly snapshots: ServeSnapshots | undefined;
  /** Makes a sandbox; returns once it serves. */
  create(request: CreateRequest): Promise<SandboxRecord>;
  /** Forks a sandbox (see {@linkcode ServeSandboxes.fork}). */
  fork(
    source: SandboxRecord,
    request: {
      tenant: string;
      keyId: string;
      timeoutS: number;
      count: number;
      admit: () => Admission;
    },
  ): Promise<ForkOutcome[]>;
  /** Takes a snapshot of a sandbox. */
  snapshot(record: SandboxRecord, name: string | undefined): Promise<SnapshotRecord>;
  /** Waits until a sandbox serves (a connect's answer). */
  ready(record: SandboxRecord): Promise<void>;
  /** Removes a sandbox; false when there was none. */
  remove(id: string): Promise<boolean>;
  /** Whether a sandbox is being removed. */
  removing(id: string): boolean;
  /** Pauses a sandbox; false when it was paused already. */
  pause(record: SandboxRecord): Promise<boolean>;
  /** Resumes a paused sandbox; true when it was paused. */
  resume(record: SandboxRecord): Promise<boolean>;
  /** Extends (or with `shorten`, sets) a sandbox's end time. */
  setTimeout(id: string, timeoutS: number, options: { shorten: boolean }): void | Promise<void>;
  /** Removes every sandbox past its end time, from now on. */
  startReaper(intervalMs?: number): void;
  /** Stops the reaper and lets go of every sandbox (they keep running). */
  close(): void;
}

/** Options of {@linkcode ServeSandboxes}. */
export interface ServeSandboxesOptions {
  /** The waffle home sandboxes live in. */
  home: string;
  /** The Docker client every sandbox shares. */
  docker: DockerClient;
  /** The config file the server read, so its sandboxes read the same one (absent: the home's). */
  configPath?: string | undefined;
  /** Told when a create took a warm pool's member (its keeper refills). */
  onTaken?: (template: string) => void;
  /** The server's snapshots (absent: none can be taken). */
  snapshots?: ServeSnapshots;
  /** Clock (tests). */
  now?: () => number;
  /** Told each create that succeeded: its tenant and how long it took, in seconds. */
  onCreated?: (tenant: string, seconds: number) => void;
  /** Told each sandbox removed (its id). */
  onRemoved?: (id: string) => void;
}

/** A live sandbox: its record's id, the open waffle sandbox and what ends with it. */
interface Live {
  sandbox: Sandbox;
  /** Aborted when the sandbox is killed: every stream of it ends. */
  killed: AbortController;
}

/** Lowercase letters and digits: E2B ids carry no dash, and waffle user ids take them. */
const ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";

/**
 * A new sandbox id: 20 characters of `[a-z0-9]` from the system's random
 * source, starting with a letter (a waffle user id starts with a letter or digit).
 *
 * @returns The id.
 */
export function newSandboxId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(20));
  let id = "";
  for (const [i, byte] of bytes.entries()) {
    id += i === 0 ? ID_ALPHABET[byte % 26] : ID_ALPHABET[byte % ID_ALPHABET.length];
  }
  return id;
}

/**
 * What a call to a paused sandbox is told.
 *
 * @param id The sandbox id.
 * @returns One line naming the sandbox and how to resume it.
 */
export function pausedMessage(id: string): string {
  return `Sandbox '${id}' is paused; resume it with Sandbox.connect('${id}')`;
}

/** The sandboxes of one server. */
export class ServeSandboxes implements SandboxFleet {
  readonly #store: SandboxStore;
  readonly #options: ServeSandboxesOptions;
  readonly #live = new Map<string, Live>();
  readonly #removing = new SingleFlight<string, boolean>();
  /** The warm pool (its template) each sandbox this server took from one came from. */
  readonly #pooled = new Map<string, string>();
  #reaper: ReturnType<typeof setInterval> | undefined;

  /**
   * @param store The server's record.
   * @param options Home, Docker client, clock.
   */
  constructor(store: SandboxStore, options: ServeSandboxesOptions) {
    this.#store = store;
    this.#options = options;
  }

  /** The server's record. */
  get store(): SandboxStore {
    return this.#store;
  }

  #now(): number {
    return this.#options.now?.() ?? Date.now();
  }

  /**
   * Makes a sandbox and returns once its runner serves. Recorded first, so a
   * server killed during a create leaves a record the reaper removes, never
   * an unrecorded container.
   *
   * @param request Owner, template and settings.
   * @returns The record.
   */
  async create(request: CreateRequest): Promise<SandboxRecord> {
    const now = this.#now();
    const record: SandboxRecord = {
      id: newSandboxId(),
      tenant: request.tenant,
      keyId: request.keyId,
      template: request.template,
      image: request.image,
      metadata: request.metadata,
      envVars: request.envVars,
      accessToken: newBearerToken(),
      startedAt: now,
      endAt: now + request.timeoutS * 1000,
      state: "creating",
      ...(request.network === undefined ? {} : { network: request.network }),
    };
    this.#store.insert(record);
    const began = performance.now();
    try {
      // A sandbox made from an image makes its state anew: never a pool's.
      const live = this.#open(record, { fromPool: request.fromImage === undefined });
      const pooled = live.sandbox.pooled;
      if (pooled !== undefined) {
        this.#pooled.set(record.id, pooled.template);
        this.#options.onTaken?.(pooled.template);
      }
      if (request.fromImage !== undefined) {
        // Removed by the catch below, as any failed create.
        await sandboxFromImage(live.sandbox, request.fromImage, {
          docker: this.#options.docker,
          discard: () => Promise.resolve(),
        });
      }
      await live.sandbox.ensure();
      this.#store.setState(record.id, "running");
      this.#options.onCreated?.(record.tenant, (performance.now() - began) / 1000);
      return { ...record, state: "running" };
    } catch (error) {
      await this.remove(record.id);
      throw error;
    }
  }

  /**
   * Forks a sandbox into `count` new ones of the same tenant (see
   * `forkSandbox`): the source keeps running; each fork has the source's
   * files, template, metadata and environment, and its own id, token, queue,
   * quota and egress. Each is admitted as a create; one refused is answered
   * with its own error, the others go ahead.
   *
   * @param source The sandbox to fork.
   * @param request The calling key and its tenant (the forks'; an admin's may differ from the
   *   source's), the forks' timeout, how many, and the admission of each.
   * @returns One outcome per fork asked.
   */
  async fork(
    source: SandboxRecord,
    request: {
      tenant: string;
      keyId: string;
      timeoutS: number;
      count: number;
      admit: () => Admission;
    },
  ): Promise<ForkOutcome[]> {
    const outcomes: ForkOutcome[] = [];
    const records: SandboxRecord[] = [];
    for (let i = 0; i < request.count; i++) {
      const admission = request.admit();
      if (!admission.ok) {
        outcomes.push({ error: { code: 429, message: admission.message } });
        continue;
      }
      const now = this.#now();
      const record: SandboxRecord = {
        ...source,
        id: newSandboxId(),
        tenant: request.tenant,
        keyId: request.keyId,
        accessToken: newBearerToken(),
        startedAt: now,
        endAt: now + request.timeoutS * 1000,
        state: "creating",
      };
      this.#store.insert(record);
      records.push(record);
      outcomes.push({ record });
    }
    if (records.length === 0) return outcomes;
    try {
      // A fork's state is made anew: never a pool's member.
      const targets = records.map((r) => this.#open(r, { fromPool: false }).sandbox);
      await forkSandbox(this.live(source).sandbox, targets, {
        docker: this.#options.docker,
        // E2B answers with running sandboxes.
        start: true,
        discard: () => Promise.resolve(),
      });
      for (const record of records) {
        this.#store.setState(record.id, "running");
        record.state = "running";
      }
      return outcomes;
    } catch (error) {
      for (const record of records) await this.remove(record.id).catch(() => {});
      const message = error instanceof Error ? error.message : String(error);
      const code = error instanceof UsageError ? 409 : 500;
      return outcomes.map((o) => "record" in o ? { error: { code, message } } : o);
    }
  }

  /**
   * Takes a snapshot of a sandbox, kept apart from it (see `snapshots.ts`).
   *
   * @param record The sandbox.
   * @param name The snapshot's name, if given.
   * @returns The snapshot.
   * @throws {UsageError} On a bad name, a limit reached, or a server without a snapshot store.
   */
  async snapshot(record: SandboxRecord, name: string | undefined): Promise<SnapshotRecord> {
    const snapshots = this.#options.snapshots;
    if (snapshots === undefined) throw new UsageError("This server keeps no snapshots");
    const { sandbox } = this.live(record);
    return await snapshots.take({ record, sandbox }, {
      name,
      limits: sandbox.config,
      docker: this.#options.docker,
    });
  }

  /** The server's snapshots, when it keeps them. */
  get snapshots(): ServeSnapshots | undefined {
    return this.#options.snapshots;
  }

  /**
   * Waits until a sandbox's runner serves (its container made or started as needed).
   *
   * @param record The sandbox.
   */
  async ready(record: SandboxRecord): Promise<void> {
    await this.live(record).sandbox.ensure();
  }

  /**
   * The open waffle sandbox of a recorded sandbox (opened on first use after
   * a restart), with the signal its kill aborts.
   *
   * @param record The sandbox.
   * @returns The live handle.
   */
  live(record: SandboxRecord): Live {
    return this.#live.get(record.id) ?? this.#open(record);
  }

  #open(record: SandboxRecord, options: { fromPool?: boolean } = {}): Live {
    const ask = record.network;
    const sandbox = openSandbox(record.id, {
      fromPool: options.fromPool ?? true,
      tenant: record.tenant,
      config: {
        home: this.#options.home,
        image: record.image,
        configPath: this.#options.configPath,
      },
      ...(ask === undefined ? {} : { narrow: (loaded: SandboxConfig) => narrowing(loaded, ask) }),
      docker: this.#options.docker,
    });
    const live = { sandbox, killed: new AbortController() };
    this.#live.set(record.id, live);
    return live;
  }

  /**
   * Removes a sandbox: its streams end, its container and state go, then its
   * record. Concurrent calls share one removal.
   *
   * @param id The sandbox id.
   * @returns False when there was no such sandbox.
   */
  remove(id: string): Promise<boolean> {
    return this.#removing.run(id, () => this.#removeNow(id));
  }

  /**
   * Whether a sandbox is being removed: killed, its container not yet gone.
   *
   * @param id The sandbox id.
   * @returns True from the kill until its record is deleted.
   */
  removing(id: string): boolean {
    return this.#removing.has(id);
  }

  async #removeNow(id: string): Promise<boolean> {
    const record = this.#store.get(id);
    if (record === undefined) return false;
    const live = this.#live.get(id);
    live?.killed.abort(new UsageError(`Sandbox '${id}' was killed`));
    const sandbox = live?.sandbox ?? this.#open(record).sandbox;
    this.#live.delete(id);
    try {
      await removeSandbox(this.#options.docker, sandbox.key, {
        config: sandbox.config,
        purge: true,
      });
    } finally {
      sandbox.close();
    }
    this.#store.delete(id);
    this.#pooled.delete(id);
    this.#options.onRemoved?.(id);
    return true;
  }

  /**
   * The warm pool a sandbox was taken from, when this server took it.
   *
   * @param id The sandbox id.
   * @returns The pool's template, or undefined when not taken from one (or before a restart).
   */
  pooledFrom(id: string): string | undefined {
    return this.#pooled.get(id);
  }

  /**
   * Stops a sandbox's container now, as `waffle stop` does (`stopSandbox`):
   * its processes end, its files stay, and the next call starts it again.
   *
   * @param record The sandbox (running, not paused).
   * @returns False when its container was not running.
   * @throws {UsageError} When it has no container.
   */
  async stop(record: SandboxRecord): Promise<boolean> {
    const { sandbox } = this.live(record);
    return await stopSandbox(this.#options.docker, sandbox.key, { config: sandbox.config });
  }

  /**
   * Whether a sandbox's container runs now (asked of Docker, never started).
   *
   * @param record The sandbox.
   * @returns True when it runs (paused included), false when stopped or gone.
   */
  async running(record: SandboxRecord): Promise<boolean> {
    const { sandbox } = this.live(record);
    const container = await this.#options.docker.inspectContainer(sandbox.key.containerName);
    return container?.State.Running === true;
  }

  /**
   * Pauses a sandbox (every process frozen, memory kept) and records it.
   *
   * @param record The sandbox.
   * @returns False when it was already paused.
   */
  async pause(record: SandboxRecord): Promise<boolean> {
    if (record.state === "paused") return false;
    const { sandbox } = this.live(record);
    // Its runner may have made its idle exit: started, so there is something
    // to freeze (one paused by hand is left to pauseSandbox, which says so).
    await sandbox.ensure().catch((error) => {
      if (!(error instanceof SandboxPausedError)) throw error;
    });
    const paused = await pauseSandbox(this.#options.docker, sandbox.key, {
      config: sandbox.config,
    });
    this.#store.setState(record.id, "paused");
    return paused;
  }

  /**
   * Resumes a paused sandbox where it was, and records it running.
   *
   * @param record The sandbox.
   * @returns True when it was paused, by its record or Docker (the connect then answers 201).
   */
  async resume(record: SandboxRecord): Promise<boolean> {
    const { sandbox } = this.live(record);
    let resumed = false;
    try {
      // Asked of Docker whatever the record says: a container paused by hand resumes too.
      resumed = await resumeSandbox(this.#options.docker, sandbox.key, { config: sandbox.config });
    } catch (error) {
      // Its container is gone: the connect's ensure makes it anew.
      if (!(error instanceof UsageError)) throw error;
    }
    if (record.state === "paused") this.#store.setState(record.id, "running");
    return resumed || record.state === "paused";
  }

  /**
   * Extends (or with `shorten`, sets) a sandbox's end time.
   *
   * @param id The sandbox id.
   * @param timeoutS Seconds from now.
   * @param options `shorten: true` lets the end come earlier (`setTimeout`);
   *   `connect` only ever extends.
   */
  setTimeout(id: string, timeoutS: number, options: { shorten: boolean }): void {
    const record = this.#store.get(id);
    if (record === undefined) return;
    const endAt = this.#now() + timeoutS * 1000;
    if (options.shorten || endAt > record.endAt) this.#store.setEndAt(id, endAt);
  }

  /**
   * Removes every sandbox past its end time, then every `intervalMs`.
   *
   * @param intervalMs How often to look.
   */
  startReaper(intervalMs = 1000): void {
    const reap = async (): Promise<void> => {
      for (const record of this.#store.expired(this.#now())) {
        await this.remove(record.id).catch(() => {});
      }
    };
    void reap();
    this.#reaper = setInterval(() => void reap(), intervalMs);
  }

  /** Stops the reaper and closes every open sandbox (their containers keep running). */
  close(): void {
    clearInterval(this.#reaper);
    for (const live of this.#live.values()) {
      live.killed.abort(new UsageError("The server is stopping"));
      live.sandbox.close();
    }
    this.#live.clear();
  }
}

/**
 * The grant narrowed by what the create asked. Judged at the create; a
 * config changed since then that no longer grants the ask (edited while
 * the server runs, or before a restart) leaves the sandbox reaching
 * nothing rather than more.
 *
 * @param grant What the config grants every sandbox.
 * @param ask What the sandbox's create asked.
 * @returns The overrides its config gets.
 */
export function narrowing(grant: EgressGrant, ask: NetworkAsk): Partial<SandboxConfig> {
  const narrowed = narrowEgress(grant, ask);
  if ("overrides" in narrowed) return narrowed.overrides;
  const none = narrowEgress(grant, { allowInternetAccess: false });
  return "overrides" in none ? none.overrides : { network: "none", egress: [] };
}
