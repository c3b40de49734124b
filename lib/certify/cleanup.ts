/**
 * Everything a certification run makes, so that all of it goes afterwards,
 * on every path: containers, named volumes, the sandboxes' quota volumes and
 * temporary homes, and the queue handles open on them. Resources are
 * registered before they are made, and a creation under way is tracked, so
 * an interrupt (Ctrl-C) that lands in the middle of one still removes what
 * it made.
 *
 * @module
 */
import { messageOf } from "../queue/connection.ts";
import type { DockerClient } from "../docker/client.ts";
import { LABELS } from "../lifecycle/posture.ts";
import { removeVolume as removeQuotaVolume } from "../lifecycle/quota.ts";
import { removeTree } from "../lifecycle/remove_tree.ts";
import { settlesWithin } from "../async.ts";

/** The label on every container and volume a certification run creates itself: its run id. */
export const CERTIFY_LABEL = "waffle.certify";

/** How long an interrupt waits for a creation under way before removing what it made. */
const CREATION_GRACE_MS = 30_000;

/** What a cleanup removed, and what it could not. */
export interface CleanupReport {
  /** Containers removed. */
  containers: string[];
  /** Named volumes removed. */
  volumes: string[];
  /** Directories removed. */
  dirs: string[];
  /** One line per resource that could not be removed. */
  problems: string[];
}

/** The resources of one certification run, removed by {@linkcode Cleanup.run}. */
export class Cleanup {
  readonly #docker: DockerClient;
  readonly #closers: (() => void)[] = [];
  readonly #containers = new Map<string, string | undefined>();
  readonly #volumes = new Set<string>();
  readonly #quotas = new Set<string>();
  readonly #dirs = new Set<string>();
  readonly #creating = new Set<Promise<unknown>>();
  #interrupted = false;
  #running: Promise<unknown> = Promise.resolve();
  #report: CleanupReport = { containers: [], volumes: [], dirs: [], problems: [] };

  /** @param docker The daemon the run's containers and volumes are on. */
  constructor(docker: DockerClient) {
    this.#docker = docker;
  }

  /** True once {@linkcode Cleanup.interrupt} was called: no new work should start. */
  get interrupted(): boolean {
    return this.#interrupted;
  }

  /**
   * Registers a handle to close first (a queue open on a directory to remove).
   *
   * @param close Closes it; a throw is ignored.
   */
  close(close: () => void): void {
    this.#closers.push(close);
  }

  /**
   * Registers a container by name or id, before it is created.
   *
   * @param name Its name or id.
   * @param options `stateRoot`: remove it only while its `waffle.state` label names this root.
   */
  container(name: string, options: { stateRoot?: string } = {}): void {
    this.#containers.set(name, options.stateRoot);
  }

  /**
   * Registers a named volume, before it is created.
   *
   * @param name The volume's name.
   */
  volume(name: string): void {
    this.#volumes.add(name);
  }

  /**
   * Registers a sandbox state root whose disk-quota volume may get mounted.
   *
   * @param root The state root.
   */
  quota(root: string): void {
    this.#quotas.add(root);
  }

  /**
   * Registers a directory tree to remove (without following links).
   *
   * @param path Absolute, normalized path.
   */
  dir(path: string): void {
    this.#dirs.add(path);
  }

  /**
   * Tracks a creation under way (a container's create and start, an ensure),
   * so that an interrupt waits for it before removing.
   *
   * @param creation The creation.
   * @returns The same promise.
   */
  creating<T>(creation: Promise<T>): Promise<T> {
    this.#creating.add(creation);
    const forget = (): void => void this.#creating.delete(creation);
    creation.then(forget, forget);
    return creation;
  }

  /**
   * For an interrupt: stops new work, lets creations under way settle (for
   * at most 30 s), then removes everything.
   *
   * @returns What was removed.
   */
  async interrupt(): Promise<CleanupReport> {
    this.#interrupted = true;
    await settlesWithin(Promise.allSettled([...this.#creating]), CREATION_GRACE_MS);
    return await this.run();
  }

  /**
   * Removes everything registered so far (each resource once; later calls
   * remove only what was registered since).
   *
   * @returns Everything removed by this cleanup so far, and the problems met.
   */
  run(): Promise<CleanupReport> {
    // One at a time: an interrupt's run waits for a removal already under way.
    const next = this.#running.then(() => this.#runOnce());
    this.#running = next.catch(() => undefined);
    return next;
  }

  async #runOnce(): Promise<CleanupReport> {
    for (const close of this.#closers.splice(0)) {
      try {
        close();
      } catch {
        // Closing is best effort: the directory goes anyway.
      }
    }
    for (const [name, stateRoot] of [...this.#containers]) {
      this.#containers.delete(name);
      await this.#attempt(`container '${name}'`, () => this.#removeContainer(name, stateRoot));
    }
    for (const name of [...this.#volumes]) {
      this.#volumes.delete(name);
      await this.#attempt(`volume '${name}'`, async () => {
        if (await this.#docker.removeVolume(name)) this.#report.volumes.push(name);
      });
    }
    for (const root of [...this.#quotas]) {
      this.#quotas.delete(root);
      await this.#attempt(`quota volume of '${root}'`, () => removeQuotaVolume(root));
    }
    for (const path of [...this.#dirs]) {
      this.#dirs.delete(path);
      await this.#attempt(`directory '${path}'`, async () => {
        if (!await removeTree(path)) throw new Error("some of it is left");
        this.#report.dirs.push(path);
      });
    }
    return structuredClone(this.#report);
  }

  async #removeContainer(name: string, stateRoot: string | undefined): Promise<void> {
    const found = await this.#docker.inspectContainer(name);
    if (found === null) return;
    const owner = found.Config.Labels[LABELS.state];
    if (stateRoot !== undefined && owner !== stateRoot) {
      throw new Error(`it belongs to '${owner}', not to this run: left alone`);
    }
    if (await this.#docker.removeContainer(found.Id, { force: true })) {
      this.#report.containers.push(found.Name.replace(/^\//, ""));
    }
  }

  async #attempt(what: string, remove: () => Promise<void>): Promise<void> {
    try {
      await remove();
    } catch (error) {
      this.#report.problems.push(`${what}: ${messageOf(error)}`);
    }
  }
}
