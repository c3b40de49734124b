/**
 * The sandboxes of a server whose `[backend] kind = "kubernetes"`: each an
 * agent-sandbox `Sandbox` in its tenant's namespace, with a Secret beside it
 * (its access token, the agent token, its variables). Everything the server
 * needs lives in those objects: this class keeps only what a watch of them
 * tells it (as every Kubernetes controller's informer does), so a restarted
 * server, or a second replica, serves the same sandboxes.
 *
 * Pause is agent-sandbox's `operatingMode: Suspended`: the pod is deleted and
 * the workspace claim kept, so files survive and processes do not (unlike a
 * Docker sandbox's freeze). Timeouts are the reaper's, and also the
 * object's own `shutdownTime`, which agent-sandbox's controller honours
 * while no server runs.
 *
 * @module
 */
import { SingleFlight } from "../async.ts";
import * as z from "../schema.ts";
import { KubeApiError, UsageError, WaffleError } from "../errors.ts";
import { newBearerToken } from "../mcp/bearer_token.ts";
import type { KubernetesBackendSettings } from "../config/serve_schema.ts";
import type { KubeApi, WatchEvent } from "../k8s/client.ts";
import { tenantNamespace } from "../k8s/names.ts";
import {
  AGENT_PORT,
  K8S_ANNOTATIONS,
  K8S_LABELS,
  MANAGED_BY,
  readSandboxObject,
  type SandboxLimits,
  sandboxObject,
  sandboxSecret,
  SECRET_KEYS,
  type StoredSandbox,
} from "../k8s/sandbox_object.ts";
import type { CreateRequest, ForkOutcome, SandboxFleet, SandboxView } from "./sandboxes.ts";
import { newSandboxId } from "./sandboxes.ts";
import type { SandboxRecord } from "./state.ts";
import type { NetworkAsk } from "./network.ts";

/** Options of {@linkcode KubeSandboxes}. */
export interface KubeSandboxesOptions {
  /** The API. */
  api: KubeApi;
  /** `[backend]`. */
  settings: KubernetesBackendSettings;
  /** Every sandbox's limits (the config's `[sandbox]`). */
  limits: SandboxLimits;
  /** Told each create that succeeded: its tenant and how long it took, in seconds. */
  onCreated?: (tenant: string, seconds: number) => void;
  /** One line when the watch of the objects fails and is started again. */
  onEvent?: (line: string) => void;
  /** Clock (tests). */
  now?: () => number;
}

/** What a sandbox's Secret holds, as the server uses it. */
interface Secrets {
  accessToken: string;
  agentToken: string;
  envVars: Record<string, string>;
}

/** One sandbox as the watch last showed it, with its Secret. */
interface Known {
  stored: StoredSandbox;
  secrets: Secrets;
}

/** Where a sandbox's agent answers, and the token it wants. */
export interface AgentRoute {
  /** `host:port` of the pod's agent. */
  authority: string;
  /** The agent token. */
  agentToken: string;
  /** Aborted when the sandbox is removed: its proxied streams are cut. */
  killed: AbortSignal;
}

const LABEL_SELECTOR = `${K8S_LABELS.managedBy}=${MANAGED_BY}`;

const secretsSchema = z.object({
  [SECRET_KEYS.accessToken]: z.string().check(z.minLength(16), z.maxLength(256)),
  [SECRET_KEYS.agentToken]: z.string().check(z.minLength(16), z.maxLength(256)),
  [SECRET_KEYS.envVars]: z.string().check(z.maxLength(1 << 20)),
});
const envVarsSchema = z.record(z.string(), z.string());
const networkSchema = z.object({
  allowInternetAccess: z.optional(z.boolean()),
  allowOut: z.optional(z.array(z.string())),
  denyOut: z.optional(z.array(z.string())),
});

/** The sandboxes of a server on Kubernetes. */
export class KubeSandboxes implements SandboxFleet {
  readonly #options: KubeSandboxesOptions;
  readonly #known = new Map<string, Known>();
  // Creates of this server not ready yet, by id to tenant: listed by nobody,
  // counted against their tenant's limit.
  readonly #creating = new Map<string, string>();
  readonly #removing = new SingleFlight<string, boolean>();
  readonly #recycling = new SingleFlight<string, boolean>();
  // When each sandbox's pod was last replaced.
  readonly #recycled = new Map<string, number>();
  readonly #killed = new Map<string, AbortController>();
  readonly #changed = new Set<() => void>();
  readonly #said = new Set<string>();
  #stopWatch: (() => void) | undefined;
  #applying: Promise<void> = Promise.resolve();
  #closed = false;
  #reaper: ReturnType<typeof setInterval> | undefined;

  /** @param options The API, the backend's settings and the limits. */
  constructor(options: KubeSandboxesOptions) {
    this.#options = options;
  }

  /** What the server knows of its sandboxes, from the watch. */
  readonly store: SandboxView = {
    get: (id, tenant) => {
      const known = this.#known.get(id);
      if (known === undefined || (tenant !== undefined && known.stored.tenant !== tenant)) {
        return undefined;
      }
      return this.#record(known);
    },
    list: (tenant) =>
      [...this.#known.values()]
        .filter((known) => tenant === undefined || known.stored.tenant === tenant)
        .map((known) => this.#record(known)),
    count: (tenant) => {
      const ids = new Set<string>();
      for (const known of this.#known.values()) {
        if (known.stored.tenant === tenant) ids.add(known.stored.id);
      }
      for (const [id, owner] of this.#creating) if (owner === tenant) ids.add(id);
      return ids.size;
    },
  };

  /** No snapshots on Kubernetes (CSI snapshots are the cluster's). */
  readonly snapshots = undefined;

  #now(): number {
    return this.#options.now?.() ?? Date.now();
  }

  /**
   * Lists the objects, then watches them (again after any break).
   *
   * @throws {KubeApiError} When the first list fails.
   */
  async start(): Promise<void> {
    const { items, resourceVersion } = await this.#options.api.listSandboxes(LABEL_SELECTOR);
    for (const item of items) await this.#learn(item);
    await this.#watch(resourceVersion);
  }

  async #watch(resourceVersion: string): Promise<void> {
    if (this.#closed) return;
    let last = resourceVersion;
    this.#stopWatch = await this.#options.api.watchSandboxes(LABEL_SELECTOR, {
      resourceVersion,
      onEvent: (event) => {
        const version = (event.object.metadata as { resourceVersion?: unknown } | undefined)
          ?.resourceVersion;
        if (typeof version === "string") last = version;
        // In order: a sandbox's first event waits on its Secret, and a later
        // one (its deletion) must not be overtaken by it.
        this.#applying = this.#applying.then(() => this.#apply(event)).catch(() => {});
      },
      onDone: (error) => {
        if (this.#closed) return;
        // A watch ends (the API server's timeout, 410 Gone, a broken
        // connection): list again, then watch from there.
        if (error !== null && error !== undefined) {
          this.#options.onEvent?.(`watch of Sandboxes ended: ${messageOf(error)}`);
        }
        const gone = error instanceof KubeApiError && error.status === 410;
        setTimeout(() => void this.#rewatch(gone ? undefined : last), 1000);
      },
    });
  }

  async #rewatch(from: string | undefined): Promise<void> {
    if (this.#closed) return;
    try {
      if (from === undefined) {
        const { items, resourceVersion } = await this.#options.api.listSandboxes(LABEL_SELECTOR);
        const seen = new Set<string>();
        for (const item of items) seen.add((await this.#learn(item)) ?? "");
        for (const id of [...this.#known.keys()]) if (!seen.has(id)) this.#forget(id);
        from = resourceVersion;
      }
      await this.#watch(from);
    } catch (error) {
      this.#options.onEvent?.(`list of Sandboxes failed: ${messageOf(error)}`);
      setTimeout(() => void this.#rewatch(undefined), 2000);
    }
  }

  async #apply(event: WatchEvent): Promise<void> {
    if (event.type === "DELETED") {
      const id = idOf(event.object);
      const known = id === undefined ? undefined : this.#known.get(id)?.stored;
      const meta = event.object.metadata as { namespace?: unknown; name?: unknown } | undefined;
      // Only the object that holds the id: another claiming it goes unnoticed.
      if (known !== undefined && known.namespace === meta?.namespace && known.name === meta?.name) {
        this.#forget(known.id);
      }
      return;
    }
    await this.#learn(event.object);
  }

  // Reads an object (and, the first time, its Secret) into what is known;
  // an object that does not read as waffle's is skipped, loudly.
  async #learn(object: unknown): Promise<string | undefined> {
    let stored: StoredSandbox;
    try {
      stored = readSandboxObject(object);
    } catch (error) {
      this.#skipped(`skipped a Sandbox: ${messageOf(error)}`);
      return undefined;
    }
    const problem = this.#foreign(stored);
    if (problem !== undefined) {
      this.#skipped(`skipped Sandbox '${stored.namespace}/${stored.name}': ${problem}`);
      return undefined;
    }
    let secrets = this.#known.get(stored.id)?.secrets;
    if (secrets === undefined) {
      try {
        secrets = await this.#readSecrets(stored);
      } catch (error) {
        this.#skipped(`skipped Sandbox '${stored.namespace}/${stored.name}': ${messageOf(error)}`);
        return undefined;
      }
      if (secrets === undefined) return undefined;
    }
    this.#known.set(stored.id, { stored, secrets });
    for (const wake of this.#changed) wake();
    return stored.id;
  }

  // Each skip is said once (a skipped object's every status change comes
  // again), in one line; the memory of them is bounded.
  #skipped(line: string): void {
    const said = line.replaceAll(/[\r\n]+/g, " ").slice(0, 500);
    if (this.#said.has(said)) return;
    if (this.#said.size >= 1024) this.#said.clear();
    this.#said.add(said);
    this.#options.onEvent?.(said);
  }

  // Only this server makes these objects, but whoever may write one
  // namespace's Sandboxes could make one: an object speaks for a tenant only
  // in that tenant's namespace, and an id is one object's (another claiming
  // it would be sent that sandbox's traffic, its access token included).
  #foreign(stored: StoredSandbox): string | undefined {
    const own = tenantNamespace(stored.tenant, this.#options.settings.namespacePrefix);
    if (stored.namespace !== own) {
      return `it claims tenant '${stored.tenant.slice(0, 80)}', whose namespace is '${own}'`;
    }
    const first = this.#known.get(stored.id)?.stored;
    if (
      first !== undefined && (first.namespace !== stored.namespace || first.name !== stored.name)
    ) {
      return `its id '${stored.id}' is already '${first.namespace}/${first.name}'`;
    }
    return undefined;
  }

  async #readSecrets(stored: StoredSandbox): Promise<Secrets | undefined> {
    const data = await this.#options.api.getSecret(stored.namespace, stored.secretName);
    if (data === undefined) return undefined;
    const where = `Secret '${stored.namespace}/${stored.secretName}'`;
    const parsed = z.safeParse(secretsSchema, data);
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!;
      throw new WaffleError(`${where}: key '${issue.path.join(".")}' ${issue.message}`);
    }
    let envVars;
    try {
      envVars = envVarsSchema.parse(JSON.parse(parsed.data[SECRET_KEYS.envVars]));
    } catch (cause) {
      throw new WaffleError(
        `${where}: key '${SECRET_KEYS.envVars}' is not a JSON object of strings`,
        { cause },
      );
    }
    return {
      accessToken: parsed.data[SECRET_KEYS.accessToken],
      agentToken: parsed.data[SECRET_KEYS.agentToken],
      envVars,
    };
  }

  #forget(id: string): void {
    this.#known.delete(id);
    this.#recycled.delete(id);
    this.#killed.get(id)?.abort(new UsageError(`Sandbox '${id}' was killed`));
    this.#killed.delete(id);
    for (const wake of this.#changed) wake();
  }

  #record(known: Known): SandboxRecord {
    const { stored, secrets } = known;
    const network = networkSchema.safeParse(stored.network);
    return {
      id: stored.id,
      tenant: stored.tenant,
      keyId: stored.keyId,
      template: stored.template,
      image: stored.image,
      metadata: stored.metadata,
      envVars: secrets.envVars,
      accessToken: secrets.accessToken,
      startedAt: stored.startedAt,
      endAt: stored.endAt,
      state: this.#creating.has(stored.id) ? "creating" : stored.suspended ? "paused" : "running",
      ...(network.success ? { network: network.data as NetworkAsk } : {}),
    };
  }

  /**
   * Makes the Sandbox and its Secret, and returns once its pod is ready.
   * A create that fails deletes what it made.
   *
   * @param request Owner, template and settings.
   * @returns The record.
   */
  async create(request: CreateRequest): Promise<SandboxRecord> {
    if (request.fromImage !== undefined) {
      throw new UsageError('Snapshots are not available with [backend] kind = "kubernetes"');
    }
    const { api, settings, limits } = this.#options;
    const began = performance.now();
    const now = this.#now();
    const id = newSandboxId();
    const namespace = tenantNamespace(request.tenant, settings.namespacePrefix);
    const secrets: Secrets = {
      accessToken: newBearerToken(),
      agentToken: newBearerToken(),
      envVars: request.envVars,
    };
    const endAt = now + request.timeoutS * 1000;
    const object = sandboxObject({
      id,
      namespace,
      tenant: request.tenant,
      keyId: request.keyId,
      template: request.template,
      image: request.image,
      waffleImage: settings.waffleImage,
      metadata: request.metadata,
      startedAt: now,
      endAt,
      ...(request.network === undefined ? {} : { network: request.network }),
      limits,
      runtimeClassName: settings.runtimeClass,
      storageClassName: settings.storageClass,
    });
    withShutdown(object, endAt);
    this.#creating.set(id, request.tenant);
    try {
      const made = await api.createSandbox(namespace, object);
      await api.createSecret(
        namespace,
        ownedBy(sandboxSecret({ id, namespace, tenant: request.tenant, ...secrets }), made),
      );
      const stored = readSandboxObject(made);
      if (!this.#known.has(id)) this.#known.set(id, { stored, secrets });
      await this.#whenReady(id);
      this.#creating.delete(id);
      this.#options.onCreated?.(request.tenant, (performance.now() - began) / 1000);
      return this.store.get(id)!;
    } catch (error) {
      this.#creating.delete(id);
      await this.#deleteObjects(namespace, object).catch(() => {});
      this.#forget(id);
      throw error;
    }
  }

  /**
   * Waits until a sandbox's pod is ready (its agent listening).
   *
   * @param record The sandbox.
   * @throws {WaffleError} When it is not ready within `[backend] ready_timeout`.
   */
  async ready(record: SandboxRecord): Promise<void> {
    await this.#whenReady(record.id);
  }

  // Resolves when the watch shows the sandbox ready with a pod address;
  // asks the API server itself each second too (a watch may lag).
  async #whenReady(id: string): Promise<void> {
    const timeoutMs = this.#options.settings.readyTimeoutSeconds * 1000;
    const deadline = Date.now() + timeoutMs;
    while (true) {
      const known = this.#known.get(id);
      if (known === undefined && !this.#creating.has(id)) {
        throw new UsageError(`Sandbox '${id}' was removed`);
      }
      if (known !== undefined && known.stored.ready && known.stored.podIP !== undefined) return;
      if (Date.now() >= deadline) {
        throw new WaffleError(
          `Sandbox '${id}' was not ready after ${timeoutMs / 1000} s (its pod: ${
            known?.stored.podIP === undefined ? "no address yet" : "not ready"
          })`,
        );
      }
      await this.#changedOrAfter(1000);
      if (known !== undefined && Date.now() < deadline) {
        const fresh = await this.#options.api.getSandbox(known.stored.namespace, known.stored.name)
          .catch(() => undefined);
        if (fresh !== undefined) await this.#learn(fresh);
      }
    }
  }

  #changedOrAfter(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = (): void => {
        clearTimeout(timer);
        this.#changed.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.#changed.add(wake);
    });
  }

  /**
   * Where a sandbox's agent answers, once its pod is ready.
   *
   * @param record The sandbox.
   * @returns Its route.
   */
  async route(record: SandboxRecord): Promise<AgentRoute> {
    await this.#whenReady(record.id);
    const known = this.#known.get(record.id)!;
    const ip = known.stored.podIP!;
    let killed = this.#killed.get(record.id);
    if (killed === undefined) {
      killed = new AbortController();
      this.#killed.set(record.id, killed);
    }
    return {
      authority: `${ip.includes(":") ? `[${ip}]` : ip}:${AGENT_PORT}`,
      agentToken: known.secrets.agentToken,
      killed: killed.signal,
    };
  }

  /**
   * Replaces a sandbox's pod whose agent says its queue cannot be served
   * there (a runner-side file a broken-into runner damaged: the agent can
   * neither set it aside nor restart the runner). agent-sandbox makes the pod
   * again on the same claims, so the workspace stays; its processes end. At
   * most once a minute per sandbox; concurrent asks share one.
   *
   * @param record The sandbox.
   * @param why What its agent said.
   * @returns True when the pod was deleted now.
   */
  recycle(record: SandboxRecord, why: string): Promise<boolean> {
    return this.#recycling.run(record.id, async () => {
      const known = this.#known.get(record.id);
      const last = this.#recycled.get(record.id) ?? -Infinity;
      if (known === undefined || Date.now() - last < 60_000) return false;
      this.#recycled.set(record.id, Date.now());
      this.#options.onEvent?.(`replacing the pod of sandbox '${record.id}': ${why}`);
      this.#killed.get(record.id)?.abort(
        new UsageError(`Sandbox '${record.id}' is being replaced`),
      );
      this.#killed.delete(record.id);
      // Not ready until the watch shows the new pod.
      known.stored = { ...known.stored, ready: false, podIP: undefined };
      return await this.#options.api.deletePod(known.stored.namespace, known.stored.name);
    });
  }

  /**
   * Forks are not available on Kubernetes (a CSI volume clone would be the
   * way): each fork asked is answered 501, as E2B's fork answers one refused.
   *
   * @param _source The sandbox.
   * @param request How many were asked.
   * @returns One refusal per fork.
   */
  fork(_source: SandboxRecord, request: { count: number }): Promise<ForkOutcome[]> {
    const message = 'Fork is not available with [backend] kind = "kubernetes"';
    return Promise.resolve(
      Array.from({ length: request.count }, () => ({ error: { code: 501, message } })),
    );
  }

  /** Snapshots are not available on Kubernetes. */
  snapshot(): Promise<never> {
    return Promise.reject(
      new UsageError('Snapshots are not available with [backend] kind = "kubernetes"'),
    );
  }

  /**
   * Deletes a sandbox: its Sandbox (the pod and the workspace claim go with
   * it) and its Secret. Concurrent calls share one removal.
   *
   * @param id The sandbox id.
   * @returns False when there was no such sandbox.
   */
  remove(id: string): Promise<boolean> {
    return this.#removing.run(id, () => this.#removeNow(id));
  }

  async #removeNow(id: string): Promise<boolean> {
    const known = this.#known.get(id);
    if (known === undefined) return false;
    this.#killed.get(id)?.abort(new UsageError(`Sandbox '${id}' was killed`));
    const { namespace, name, secretName } = known.stored;
    await this.#options.api.deleteSandbox(namespace, name);
    await this.#options.api.deleteSecret(namespace, secretName);
    this.#forget(id);
    return true;
  }

  async #deleteObjects(
    namespace: string,
    object: { metadata: Record<string, unknown> },
  ): Promise<void> {
    const name = String(object.metadata.name);
    await this.#options.api.deleteSandbox(namespace, name);
    const secret = (object.metadata.annotations as Record<string, string>)[K8S_ANNOTATIONS.secret];
    if (secret !== undefined) await this.#options.api.deleteSecret(namespace, secret);
  }

  /**
   * Whether a sandbox is being removed.
   *
   * @param id The sandbox id.
   * @returns True from the kill until its objects are gone.
   */
  removing(id: string): boolean {
    return this.#removing.has(id);
  }

  /**
   * Suspends a sandbox: agent-sandbox deletes its pod and keeps its claim.
   *
   * @param record The sandbox.
   * @returns False when it was already suspended.
   */
  async pause(record: SandboxRecord): Promise<boolean> {
    const known = this.#known.get(record.id);
    if (known === undefined || known.stored.suspended) return false;
    const patched = await this.#options.api.patchSandbox(
      known.stored.namespace,
      known.stored.name,
      {
        spec: { operatingMode: "Suspended" },
      },
    );
    this.#killed.get(record.id)?.abort(new UsageError(`Sandbox '${record.id}' was paused`));
    this.#killed.delete(record.id);
    await this.#learn(patched);
    return true;
  }

  /**
   * Resumes a suspended sandbox (a new pod on the same claim).
   *
   * @param record The sandbox.
   * @returns True when it was suspended.
   */
  async resume(record: SandboxRecord): Promise<boolean> {
    const known = this.#known.get(record.id);
    if (known === undefined || !known.stored.suspended) return false;
    const patched = await this.#options.api.patchSandbox(
      known.stored.namespace,
      known.stored.name,
      {
        spec: { operatingMode: "Running" },
      },
    );
    await this.#learn(patched);
    return true;
  }

  /**
   * Extends (or with `shorten`, sets) a sandbox's end time, in its object.
   *
   * @param id The sandbox id.
   * @param timeoutS Seconds from now.
   * @param options `shorten: true` lets the end come earlier.
   */
  async setTimeout(id: string, timeoutS: number, options: { shorten: boolean }): Promise<void> {
    const known = this.#known.get(id);
    if (known === undefined) return;
    const endAt = this.#now() + timeoutS * 1000;
    if (!options.shorten && endAt <= known.stored.endAt) return;
    const patch = {
      metadata: { annotations: { [K8S_ANNOTATIONS.endAt]: String(endAt) } },
      spec: { shutdownTime: new Date(endAt).toISOString() },
    };
    await this.#learn(
      await this.#options.api.patchSandbox(known.stored.namespace, known.stored.name, patch),
    );
  }

  /**
   * Removes every sandbox past its end time, then every `intervalMs`.
   *
   * @param intervalMs How often to look.
   */
  startReaper(intervalMs = 1000): void {
    const reap = async (): Promise<void> => {
      const now = this.#now();
      for (const known of [...this.#known.values()]) {
        if (known.stored.endAt <= now) await this.remove(known.stored.id).catch(() => {});
      }
    };
    this.#reaper = setInterval(() => void reap(), intervalMs);
  }

  /** Stops the watch and the reaper (the sandboxes go on). */
  close(): void {
    this.#closed = true;
    clearInterval(this.#reaper);
    this.#stopWatch?.();
    for (const killed of this.#killed.values()) {
      killed.abort(new UsageError("The server is stopping"));
    }
    this.#killed.clear();
  }
}

// agent-sandbox's own timeout: the controller deletes the object at its
// end even while no waffle server runs.
function withShutdown(object: Record<string, unknown>, endAt: number): void {
  Object.assign(object.spec as Record<string, unknown>, {
    shutdownTime: new Date(endAt).toISOString(),
    shutdownPolicy: "Delete",
  });
}

// The Secret is the Sandbox's: Kubernetes' garbage collector deletes it
// with the Sandbox, whoever deletes that.
function ownedBy<T extends { metadata: Record<string, unknown> }>(
  secret: T,
  owner: Record<string, unknown>,
): T {
  const meta = owner.metadata as { name?: unknown; uid?: unknown };
  secret.metadata.ownerReferences = [{
    apiVersion: String(owner.apiVersion),
    kind: String(owner.kind),
    name: String(meta.name),
    uid: String(meta.uid),
    blockOwnerDeletion: true,
  }];
  return secret;
}

function idOf(object: Record<string, unknown>): string | undefined {
  const labels = (object.metadata as { labels?: Record<string, unknown> } | undefined)?.labels;
  const id = labels?.[K8S_LABELS.id];
  return typeof id === "string" ? id : undefined;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
