/**
 * A Kubernetes stand-in for end-to-end tests. It is a MOCK of Kubernetes:
 * this machine can run no API server, kubelet or cluster of any kind (none
 * can be installed from the registries reached here), so this rig plays
 * them, and what it does not model is listed below and in docs/kubernetes.md.
 * What runs inside it is real: the containers of each pod run with Docker,
 * joined as a pod joins them.
 *
 * - The API server (tests/_k8s_api.ts) on 127.0.0.1, a bearer token
 *   required: agent-sandbox `Sandbox` objects
 *   (`/apis/agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxes[/{name}[/status]]`),
 *   Secrets, and, for inspection, the PVCs and Pods it makes, with the real
 *   paths, bodies, `Status` errors and watches, as `@kubernetes/client-node`
 *   uses them.
 * - The controller (agent-sandbox's part): for each Sandbox, its PVCs from
 *   volumeClaimTemplates (`<template>-<sandbox>`, volumes of the same name
 *   added to the pod), its pod when `operatingMode` is Running (the
 *   default), no pod when Suspended (the PVCs kept), and on delete the pod
 *   and PVCs removed (owner references: the stand-in's garbage collector
 *   removes whatever a deleted object owned, a Secret included); the status as agent-sandbox writes it (conditions
 *   Ready and Suspended, podIPs, nodeName `standin`, serviceFQDN, selector).
 *   A pod whose Pod object is deleted is made again.
 * - The kubelet (tests/_k8s_kubelet.ts): runs each pod with Docker.
 *
 * Not modelled: scheduling and nodes (one node, `standin`), PVC binding,
 * storage classes and sizes (a claim is a host directory), CSI snapshots,
 * NetworkPolicy (pods share one Docker bridge network, `internal`: no route
 * off the machine), Services and DNS (serviceFQDN is written, nothing
 * resolves it), admission (webhooks, quotas, LimitRanges, pod security),
 * evictions (an emptyDir's sizeLimit is a tmpfs size, not an eviction),
 * RBAC, server-side apply, shutdownTime, and the Sandbox's `service`.
 *
 * @module
 */
import type { DockerClient } from "../lib/docker/mod.ts";
import {
  type KubeObject,
  ObjectStore,
  qualified,
  type Resource,
  RESOURCES,
  route,
  StatusError,
  timestamp,
  type WatchEvent,
} from "./_k8s_api.ts";
import { claimDir, Kubelet, type RunningPod } from "./_k8s_kubelet.ts";

export { POD_PIDS_LIMIT } from "./_k8s_kubelet.ts";
export type { KubeObject } from "./_k8s_api.ts";

/** The Docker label on every object a stand-in makes; its value names the instance. */
export const STANDIN_LABEL = "waffle.k8s-standin";
/** The node every pod runs on. */
export const STANDIN_NODE = "standin";
/** The label agent-sandbox's controller puts on a Sandbox's pod. */
const NAME_HASH_LABEL = "agents.x-k8s.io/sandbox-name-hash";

/** Options of {@linkcode startStandIn}. */
export interface StandInOptions {
  /** Prefix of every Docker object's name (default `wfl-standin`). */
  prefix?: string;
  /** The holder containers' image (needs `sleep`; default `waffle-runner:latest`). */
  holderImage?: string;
  /** Make a namespace on first use (default true; a real cluster needs it made first). */
  autoNamespaces?: boolean;
  /** How often pods are checked (readiness, restarts), default 250 ms. */
  resyncMs?: number;
}

/** A running stand-in. */
export interface StandIn {
  /** The API server's URL (`http://127.0.0.1:<port>`). */
  url: string;
  /** The bearer token it requires. */
  token: string;
  /** A kubeconfig file naming `url` and `token` (context `standin`, namespace `default`). */
  kubeconfigPath: string;
  /** The stored objects (for a test to inspect). */
  objects: ObjectStore;
  /** The Docker network the pods are on. */
  network: string;
  /** Host directory of the pods' volumes and the claims. */
  root: string;
  /** Resolves once every Sandbox's pod matches its spec (or `timeoutMs` passes: rejects). */
  settled(timeoutMs?: number): Promise<void>;
  /** The Docker ids of a pod's containers (`POD` for its holder), or undefined when it has none. */
  podContainers(namespace: string, name: string): Record<string, string> | undefined;
  /** Stops serving and removes every Docker object and file it made. */
  stop(): Promise<void>;
}

const resourceOf = (plural: string): Resource => RESOURCES.find((r) => r.plural === plural)!;
const SANDBOXES = resourceOf("sandboxes");
const PODS = resourceOf("pods");
const PVCS = resourceOf("persistentvolumeclaims");
const SECRETS = resourceOf("secrets");

/**
 * Starts a stand-in: its network, API server and controller.
 *
 * @param docker The Docker client.
 * @param options Names and images.
 * @returns The stand-in.
 */
export async function startStandIn(
  docker: DockerClient,
  options: StandInOptions = {},
): Promise<StandIn> {
  const instance = crypto.randomUUID().slice(0, 8);
  const prefix = `${options.prefix ?? "wfl-standin"}-${instance}`;
  const token = crypto.randomUUID().replaceAll("-", "");
  const root = await Deno.makeTempDir({ prefix: `${prefix}-` });
  const objects = new ObjectStore({ autoNamespaces: options.autoNamespaces ?? true });
  const label: [string, string] = [STANDIN_LABEL, instance];
  // internal: the pods reach the host (and the host them) but nothing beyond.
  await docker.createNetwork(prefix, { internal: true, labels: { [STANDIN_LABEL]: instance } });
  const kubelet = new Kubelet({
    docker,
    root,
    network: prefix,
    label,
    prefix,
    holderImage: options.holderImage ?? "waffle-runner:latest",
    secret: (namespace, name) => objects.find(SECRETS, namespace, name),
  });
  const controller = new Controller(objects, kubelet, root, options.resyncMs ?? 250);
  // Open watches: ended at stop, or the server's shutdown would wait for them.
  const watches = new Set<() => void>();
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    (request) => serve({ objects, token, watches }, request),
  );
  const url = `http://127.0.0.1:${server.addr.port}`;
  const kubeconfigPath = `${root}/kubeconfig`;
  await Deno.writeTextFile(kubeconfigPath, JSON.stringify(kubeconfig(url, token)), { mode: 0o600 });
  return {
    url,
    token,
    kubeconfigPath,
    objects,
    network: prefix,
    root,
    settled: (timeoutMs) => controller.settled(timeoutMs ?? 60_000),
    podContainers: (namespace, name) => controller.podContainers(namespace, name),
    stop: async () => {
      await controller.stop();
      for (const end of [...watches]) end();
      await server.shutdown().catch(() => {});
      const labels = [`${STANDIN_LABEL}=${instance}`];
      for (const container of await docker.listContainers({ all: true, labels })) {
        await docker.removeContainer(container.Id, { force: true }).catch(() => {});
      }
      for (const volume of await docker.listVolumes({ labels })) {
        await docker.removeVolume(volume.Name).catch(() => {});
      }
      await docker.removeNetwork(prefix).catch(() => {});
      await Deno.remove(root, { recursive: true }).catch(() => {});
    },
  };
}

function kubeconfig(url: string, token: string): KubeObject {
  return {
    apiVersion: "v1",
    kind: "Config",
    // client-node speaks plain http only with skipTLSVerify set.
    clusters: [{ name: STANDIN_NODE, cluster: { server: url, "insecure-skip-tls-verify": true } }],
    users: [{ name: STANDIN_NODE, user: { token } }],
    contexts: [{
      name: STANDIN_NODE,
      context: { cluster: STANDIN_NODE, user: STANDIN_NODE, namespace: "default" },
    }],
    "current-context": STANDIN_NODE,
  };
}

// ---- The API server's HTTP side ----

function json(body: KubeObject, status = 200): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json" },
  });
}

/** What the HTTP side serves from. */
interface Served {
  objects: ObjectStore;
  token: string;
  /** How to end each open watch. */
  watches: Set<() => void>;
}

async function serve(served: Served, request: Request): Promise<Response> {
  if (request.headers.get("authorization") !== `Bearer ${served.token}`) {
    return json(new StatusError(401, "Unauthorized", "Unauthorized").toStatus(), 401);
  }
  const url = new URL(request.url);
  try {
    if (url.pathname === "/version" && request.method === "GET") {
      return json({
        major: "1",
        minor: "33",
        gitVersion: "v1.33.0-standin",
        platform: "linux/amd64",
      });
    }
    const at = route(url.pathname);
    if (at === undefined) {
      throw new StatusError(
        404,
        "NotFound",
        "the server could not find the requested resource",
        {},
      );
    }
    return await handle(served, at, request, url);
  } catch (err) {
    const status = err instanceof StatusError ? err : err instanceof SyntaxError
      ? new StatusError(
        400,
        "BadRequest",
        `the body of the request is not valid JSON: ${err.message}`,
      )
      : new StatusError(500, "InternalError", `Internal error occurred: ${String(err)}`);
    return json(status.toStatus(), status.code);
  }
}

async function handle(
  served: Served,
  at: NonNullable<ReturnType<typeof route>>,
  request: Request,
  url: URL,
): Promise<Response> {
  const objects = served.objects;
  const { resource, name, status } = at;
  const namespace = at.namespace ?? "";
  const query = url.searchParams;
  const selectors = { label: query.get("labelSelector"), field: query.get("fieldSelector") };
  const method = request.method;
  if (name === undefined) {
    const watch = query.get("watch");
    if (method === "GET" && (watch === "true" || watch === "1")) {
      return watchResponse(
        served,
        at,
        { ...selectors, fromVersion: query.get("resourceVersion") },
        query,
      );
    }
    if (method === "GET") {
      return json({
        apiVersion: resource.group === "" ? "v1" : `${resource.group}/${resource.version}`,
        kind: `${resource.kind}List`,
        metadata: { resourceVersion: objects.resourceVersion },
        items: objects.list(resource, at.namespace, selectors),
      });
    }
    if (method === "POST") {
      if (resource.namespaced && at.namespace === undefined) throw methodNotAllowed();
      return json(objects.create(resource, namespace, await request.json()), 201);
    }
    throw methodNotAllowed();
  }
  switch (method) {
    case "GET":
      return json(objects.get(resource, namespace, name));
    case "PUT":
      return json(objects.update(resource, namespace, name, await request.json(), { status }));
    case "PATCH":
      return json(
        objects.patch(
          resource,
          namespace,
          name,
          request.headers.get("content-type") ?? "",
          await request.json(),
          { status },
        ),
      );
    case "DELETE": {
      if (status) throw methodNotAllowed();
      const text = await request.text();
      const options = text === "" ? {} : JSON.parse(text);
      const deleted = objects.delete(resource, namespace, name, options.preconditions ?? {});
      if (resource.returnsObject || deleted.metadata.deletionTimestamp !== undefined) {
        return json(deleted);
      }
      return json({
        kind: "Status",
        apiVersion: "v1",
        metadata: {},
        status: "Success",
        details: { name, kind: resource.plural, uid: deleted.metadata.uid },
      });
    }
    default:
      throw methodNotAllowed();
  }
}

function methodNotAllowed(): StatusError {
  return new StatusError(
    405,
    "MethodNotAllowed",
    "the server does not allow this method on the requested resource",
  );
}

// A watch: one JSON event a line, as long as the client reads (or timeoutSeconds).
function watchResponse(
  served: Served,
  at: NonNullable<ReturnType<typeof route>>,
  selectors: { label: string | null; field: string | null; fromVersion: string | null },
  query: URLSearchParams,
): Response {
  const { objects, watches } = served;
  const encoder = new TextEncoder();
  let unsubscribe = (): void => {};
  let timers: ReturnType<typeof setTimeout>[] = [];
  const stop = (): void => {
    unsubscribe();
    timers.forEach(clearInterval);
    timers = [];
    watches.delete(end);
  };
  let end = (): void => stop();
  const body = new ReadableStream<Uint8Array>({
    start(controller): void {
      end = (): void => {
        stop();
        try {
          controller.close();
        } catch {
          // already closed
        }
      };
      watches.add(end);
      const send = (event: WatchEvent | { type: "BOOKMARK"; object: KubeObject }): void => {
        try {
          controller.enqueue(encoder.encode(`${JSON.stringify(event)}\n`));
        } catch {
          unsubscribe();
        }
      };
      unsubscribe = objects.watch(at.resource, at.namespace, selectors, send);
      if (query.get("allowWatchBookmarks") === "true") {
        timers.push(setInterval(() => {
          send({
            type: "BOOKMARK",
            object: {
              apiVersion: at.resource.group === ""
                ? "v1"
                : `${at.resource.group}/${at.resource.version}`,
              kind: at.resource.kind,
              metadata: { resourceVersion: objects.resourceVersion },
            },
          });
        }, 5_000));
      }
      const seconds = Number(query.get("timeoutSeconds") ?? "0");
      if (seconds > 0) {
        timers.push(setTimeout(() => end(), seconds * 1000));
      }
    },
    cancel(): void {
      stop();
    },
  });
  return new Response(body, { headers: { "content-type": "application/json" } });
}

// ---- The controller (agent-sandbox's) ----

class Controller {
  readonly #objects: ObjectStore;
  readonly #kubelet: Kubelet;
  readonly #root: string;
  readonly #pods = new Map<string, RunningPod>();
  readonly #queues = new Map<string, Promise<void>>();
  readonly #unsubscribe: () => void;
  readonly #timer: ReturnType<typeof setInterval>;
  #stopped = false;
  readonly #failures = new Map<string, { at: number; backoff: number; message: string }>();

  constructor(objects: ObjectStore, kubelet: Kubelet, root: string, resyncMs: number) {
    this.#objects = objects;
    this.#kubelet = kubelet;
    this.#root = root;
    const onSandbox = (event: WatchEvent): void =>
      this.#enqueue(event.object.metadata.namespace, event.object.metadata.name);
    const a = objects.watch(
      SANDBOXES,
      undefined,
      { fromVersion: objects.resourceVersion },
      onSandbox,
    );
    // A Pod object deleted through the API: the pod goes, and is made again.
    const b = objects.watch(PODS, undefined, { fromVersion: objects.resourceVersion }, (event) => {
      if (event.type === "DELETED") onSandbox(event);
    });
    // A claim deleted (with its Sandbox, by the garbage collector, or through the API): its files go.
    const c = objects.watch(PVCS, undefined, { fromVersion: objects.resourceVersion }, (event) => {
      if (event.type !== "DELETED") return;
      const { namespace, name } = event.object.metadata;
      Deno.remove(claimDir(root, namespace, name), { recursive: true }).catch(() => {});
    });
    this.#unsubscribe = () => {
      a();
      b();
      c();
    };
    this.#timer = setInterval(() => {
      for (const sandbox of objects.list(SANDBOXES, undefined)) {
        this.#enqueue(sandbox.metadata.namespace, sandbox.metadata.name);
      }
    }, resyncMs);
  }

  // One reconcile at a time per Sandbox, in order; a busy key is not queued twice.
  #pending = new Set<string>();
  #enqueue(namespace: string, name: string): void {
    const key = `${namespace}/${name}`;
    if (this.#stopped || this.#pending.has(key)) return;
    this.#pending.add(key);
    const previous = this.#queues.get(key) ?? Promise.resolve();
    const next = previous.then(async () => {
      this.#pending.delete(key);
      if (this.#stopped) return;
      try {
        await this.#reconcile(namespace, name);
      } catch (err) {
        const failure = this.#failures.get(key);
        const backoff = Math.min(10_000, (failure?.backoff ?? 250) * 2);
        this.#failures.set(key, { at: Date.now(), backoff, message: String(err) });
        await this.#writeStatus(namespace, name, undefined, `Pod failed to start: ${String(err)}`)
          .catch(() => {});
      }
    });
    this.#queues.set(key, next);
  }

  podContainers(namespace: string, name: string): Record<string, string> | undefined {
    const pod = this.#pods.get(`${namespace}/${name}`);
    if (pod === undefined) return undefined;
    return { POD: pod.holder, ...Object.fromEntries(pod.containers) };
  }

  async #reconcile(namespace: string, name: string): Promise<void> {
    const key = `${namespace}/${name}`;
    const sandbox = this.#objects.find(SANDBOXES, namespace, name);
    let pod = this.#pods.get(key);
    // A pod of another Sandbox of that name (deleted and made again), or of no Sandbox, goes.
    if (pod !== undefined && (sandbox === undefined || pod.desc.uid !== podUid(sandbox))) {
      await this.#teardown(key, pod);
      pod = undefined;
    }
    if (pod !== undefined && this.#objects.find(PODS, namespace, name) === undefined) {
      await this.#teardown(key, pod);
      pod = undefined;
    }
    if (sandbox === undefined) {
      await this.#deleteClaims(namespace, name);
      this.#failures.delete(key);
      return;
    }
    const claims = await this.#ensureClaims(sandbox);
    const running = (sandbox.spec.operatingMode ?? "Running") === "Running";
    if (!running && pod !== undefined) {
      await this.#teardown(key, pod);
      pod = undefined;
    }
    if (running && pod === undefined) {
      const failure = this.#failures.get(key);
      if (failure !== undefined && Date.now() - failure.at < failure.backoff) return;
      pod = await this.#startPod(sandbox, claims);
      this.#pods.set(key, pod);
      this.#failures.delete(key);
    }
    await this.#writeStatus(namespace, name, pod);
  }

  async #startPod(sandbox: KubeObject, claims: Map<string, string>): Promise<RunningPod> {
    const { namespace, name } = sandbox.metadata;
    const spec = structuredClone(sandbox.spec.podTemplate.spec);
    // agent-sandbox adds a volume per claim template, named as the template.
    spec.volumes ??= [];
    for (const [volume, claim] of claims) {
      spec.volumes = spec.volumes.filter((v: KubeObject) => v.name !== volume);
      spec.volumes.push({ name: volume, persistentVolumeClaim: { claimName: claim } });
    }
    const uid = podUid(sandbox);
    this.#objects.find(PODS, namespace, name) ?? this.#objects.create(PODS, namespace, {
      apiVersion: "v1",
      kind: "Pod",
      metadata: {
        name,
        namespace,
        labels: {
          ...(sandbox.spec.podTemplate.metadata?.labels ?? {}),
          [NAME_HASH_LABEL]: nameHash(name),
        },
        annotations: {
          ...(sandbox.spec.podTemplate.metadata?.annotations ?? {}),
          "waffle.standin/sandbox-uid": uid,
        },
        ownerReferences: [owner(sandbox)],
      },
      spec: { ...spec, nodeName: STANDIN_NODE },
    });
    try {
      return await this.#kubelet.start({ namespace, name, uid, spec });
    } catch (err) {
      await this.#deletePodObject(namespace, name);
      throw err;
    }
  }

  async #teardown(key: string, pod: RunningPod): Promise<void> {
    this.#pods.delete(key);
    await this.#kubelet.stop(pod);
    await this.#deletePodObject(pod.desc.namespace, pod.desc.name);
  }

  #deletePodObject(namespace: string, name: string): Promise<void> {
    try {
      this.#objects.delete(PODS, namespace, name);
    } catch {
      // already gone
    }
    return Promise.resolve();
  }

  // The Sandbox's PVC objects and host directories: volume name → claim name.
  async #ensureClaims(sandbox: KubeObject): Promise<Map<string, string>> {
    const claims = new Map<string, string>();
    const { namespace, name } = sandbox.metadata;
    for (const template of sandbox.spec.volumeClaimTemplates ?? []) {
      const claim = `${template.metadata.name}-${name}`;
      claims.set(template.metadata.name, claim);
      await Deno.mkdir(claimDir(this.#root, namespace, claim), { recursive: true });
      await Deno.chmod(claimDir(this.#root, namespace, claim), 0o777);
      if (this.#objects.find(PVCS, namespace, claim) !== undefined) continue;
      const created = this.#objects.create(PVCS, namespace, {
        apiVersion: "v1",
        kind: "PersistentVolumeClaim",
        metadata: {
          name: claim,
          namespace,
          labels: { ...(template.metadata.labels ?? {}), [NAME_HASH_LABEL]: nameHash(name) },
          ownerReferences: [owner(sandbox)],
        },
        spec: template.spec ?? {},
      });
      this.#objects.update(PVCS, namespace, claim, {
        ...created,
        status: {
          phase: "Bound",
          accessModes: template.spec?.accessModes ?? [],
          capacity: template.spec?.resources?.requests ?? {},
        },
      }, { status: true });
    }
    return claims;
  }

  // A deleted Sandbox's claims that the garbage collector left (none, unless
  // their owner references were changed) go with it; a claim's files go
  // when its object does.
  #deleteClaims(namespace: string, sandboxName: string): Promise<void> {
    for (const claim of this.#objects.list(PVCS, namespace)) {
      const owned = (claim.metadata.ownerReferences ?? []).some((ref: KubeObject) =>
        ref.kind === "Sandbox" && ref.name === sandboxName
      );
      if (!owned) continue;
      try {
        this.#objects.delete(PVCS, namespace, claim.metadata.name);
      } catch {
        // already gone
      }
    }
    return Promise.resolve();
  }

  async #writeStatus(
    namespace: string,
    name: string,
    pod: RunningPod | undefined,
    failure?: string,
  ): Promise<void> {
    const sandbox = this.#objects.find(SANDBOXES, namespace, name);
    if (sandbox === undefined) return;
    const running = (sandbox.spec.operatingMode ?? "Running") === "Running";
    const observed = pod === undefined ? undefined : await this.#kubelet.observe(pod);
    const ready = observed?.ready === true;
    const generation = sandbox.metadata.generation;
    const previous: KubeObject[] = sandbox.status?.conditions ?? [];
    const condition = (
      type: string,
      status: boolean,
      reason: string,
      message: string,
    ): KubeObject => {
      const before = previous.find((c) => c.type === type);
      const value = status ? "True" : "False";
      return {
        type,
        status: value,
        observedGeneration: generation,
        lastTransitionTime: before?.status === value ? before.lastTransitionTime : timestamp(),
        reason,
        message,
      };
    };
    const readyCondition = !running
      ? condition("Ready", false, "SandboxSuspended", "Sandbox is suspended")
      : ready
      ? condition("Ready", true, "DependenciesReady", "Pod is Ready")
      : condition(
        "Ready",
        false,
        "DependenciesNotReady",
        failure ??
          (pod === undefined ? "Pod does not exist" : `Pod is not Ready: ${observed!.message}`),
      );
    const suspended = running
      ? condition("Suspended", false, "NotSuspended", "Sandbox is running")
      : condition("Suspended", true, "PodTerminated", "Pod has been terminated");
    const status: KubeObject = {
      serviceFQDN: `${name}.${namespace}.svc.cluster.local`,
      conditions: [readyCondition, suspended],
      selector: `${NAME_HASH_LABEL}=${nameHash(name)}`,
      ...(pod === undefined ? {} : { podIPs: [pod.ip], nodeName: STANDIN_NODE }),
    };
    this.#objects.update(SANDBOXES, namespace, name, { ...sandbox, status }, { status: true });
    if (pod !== undefined && this.#objects.find(PODS, namespace, name) !== undefined) {
      const podObject = this.#objects.get(PODS, namespace, name);
      this.#objects.update(PODS, namespace, name, {
        ...podObject,
        status: {
          phase: "Running",
          podIP: pod.ip,
          podIPs: [{ ip: pod.ip }],
          hostIP: "127.0.0.1",
          conditions: [{ type: "Ready", status: ready ? "True" : "False" }],
          containerStatuses: observed?.statuses ?? [],
        },
      }, { status: true });
    }
  }

  /** Resolves once the status of each Sandbox's generation says its pod is ready (Running) or gone (Suspended). */
  async settled(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (true) {
      const sandboxes = this.#objects.list(SANDBOXES, undefined);
      const done = sandboxes.every((s) => {
        const conditions: KubeObject[] = s.status?.conditions ?? [];
        const status = (type: string): string | undefined =>
          conditions.find((c) => c.type === type && c.observedGeneration === s.metadata.generation)
            ?.status;
        const running = (s.spec.operatingMode ?? "Running") === "Running";
        const hasPod = this.#pods.has(`${s.metadata.namespace}/${s.metadata.name}`);
        return running
          ? status("Ready") === "True" && hasPod
          : status("Suspended") === "True" && !hasPod;
      });
      if (done) return;
      if (Date.now() > deadline) {
        throw new Error(
          `Stand-in not settled after ${timeoutMs} ms: ${
            sandboxes.map((s) =>
              `${s.metadata.name}: ${JSON.stringify(s.status?.conditions?.[0]?.message)}`
            ).join("; ")
          }`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearInterval(this.#timer);
    this.#unsubscribe();
    await Promise.all([...this.#queues.values()]);
    for (const [key, pod] of [...this.#pods]) await this.#teardown(key, pod);
  }
}

// Each Sandbox object (by uid) has its own pod: one deleted and made again under its name gets a new one.
function podUid(sandbox: KubeObject): string {
  return sandbox.metadata.uid;
}

function owner(sandbox: KubeObject): KubeObject {
  return {
    apiVersion: `${SANDBOXES.group}/${SANDBOXES.version}`,
    kind: SANDBOXES.kind,
    name: sandbox.metadata.name,
    uid: sandbox.metadata.uid,
    controller: true,
    blockOwnerDeletion: true,
  };
}

// agent-sandbox labels the pod with a hash of the Sandbox's name (FNV-1a 32, hex, here).
function nameHash(name: string): string {
  let hash = 0x811c9dc5;
  for (const byte of new TextEncoder().encode(name)) {
    hash ^= byte;
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash.toString(16).padStart(8, "0");
}

/** How the API server names a resource in its messages, e.g. `sandboxes.agents.x-k8s.io`. */
export const SANDBOX_RESOURCE_NAME: string = qualified(SANDBOXES);
