/**
 * The Kubernetes API as waffle's server uses it: agent-sandbox `Sandbox`
 * objects (create, get, list, merge-patch, delete, watch) and the Secret
 * beside each, through the official client (`@kubernetes/client-node`),
 * with kubeconfig or in-cluster credentials. Loaded only by a server whose
 * `[backend] kind = "kubernetes"`. Every refusal is a {@linkcode KubeApiError}
 * naming the call and what the API server's `Status` said.
 *
 * @module
 */
import process from "node:process";
import { KubeApiError } from "../errors.ts";
import { SANDBOX_GROUP, SANDBOX_PLURAL, SANDBOX_VERSION } from "./sandbox_object.ts";

type ClientNode = typeof import("@kubernetes/client-node");

// agent-sandbox's API group, version and resource, as the client names them.
const SANDBOX_API = {
  group: SANDBOX_GROUP,
  version: SANDBOX_VERSION,
  plural: SANDBOX_PLURAL,
} as const;

/** Where the API server is and who the server is to it. */
export interface KubeApiOptions {
  /** A kubeconfig file; absent: the pod's in-cluster service account. */
  kubeconfig?: string | undefined;
  /** The kubeconfig's context; absent: its current one. */
  context?: string | undefined;
}

/** One event of a watch. */
export interface WatchEvent {
  /** `ADDED`, `MODIFIED`, `DELETED` (a `BOOKMARK` or `ERROR` is handled here). */
  type: "ADDED" | "MODIFIED" | "DELETED";
  /** The object as the API server sent it. */
  object: Record<string, unknown>;
}

/** A Kubernetes object as JSON. */
type KubeObject = Record<string, unknown>;

/** The calls waffle makes, over one client. */
export class KubeApi {
  readonly #k8s: ClientNode;
  readonly #config: InstanceType<ClientNode["KubeConfig"]>;
  readonly #custom: InstanceType<ClientNode["CustomObjectsApi"]>;
  readonly #core: InstanceType<ClientNode["CoreV1Api"]>;

  private constructor(k8s: ClientNode, config: InstanceType<ClientNode["KubeConfig"]>) {
    this.#k8s = k8s;
    this.#config = config;
    this.#custom = config.makeApiClient(k8s.CustomObjectsApi);
    this.#core = config.makeApiClient(k8s.CoreV1Api);
  }

  /**
   * Loads the client and the credentials.
   *
   * @param options The kubeconfig and context, or neither (in-cluster).
   * @returns The API.
   * @throws {KubeApiError} When the credentials cannot be loaded.
   */
  static async open(options: KubeApiOptions = {}): Promise<KubeApi> {
    // node's punycode deprecation is the client's own, not the user's concern.
    process.noDeprecation = true;
    const k8s = await import("@kubernetes/client-node");
    const config = new k8s.KubeConfig();
    try {
      if (options.kubeconfig === undefined) config.loadFromCluster();
      else config.loadFromFile(options.kubeconfig);
      if (options.context !== undefined) config.setCurrentContext(options.context);
    } catch (cause) {
      const where = options.kubeconfig === undefined
        ? "the in-cluster service account"
        : `kubeconfig '${options.kubeconfig}'`;
      throw new KubeApiError(
        `Cannot load Kubernetes credentials from ${where}: ${messageOf(cause)}`,
        {
          status: 0,
          reason: "",
          cause,
        },
      );
    }
    if (config.getCurrentCluster() === null) {
      throw new KubeApiError("The Kubernetes credentials name no cluster", {
        status: 0,
        reason: "",
      });
    }
    return new KubeApi(k8s, config);
  }

  /**
   * Creates a Sandbox.
   *
   * @param namespace Its namespace.
   * @param body The object.
   * @returns The object as stored.
   */
  async createSandbox(namespace: string, body: KubeObject): Promise<KubeObject> {
    return await call(
      `create Sandbox in '${namespace}'`,
      () => this.#custom.createNamespacedCustomObject({ ...SANDBOX_API, namespace, body }),
    );
  }

  /**
   * Reads a Sandbox.
   *
   * @param namespace Its namespace.
   * @param name Its name.
   * @returns The object, or undefined when there is none.
   */
  async getSandbox(namespace: string, name: string): Promise<KubeObject | undefined> {
    return await absentOn404(() =>
      call(
        `get Sandbox '${namespace}/${name}'`,
        () => this.#custom.getNamespacedCustomObject({ ...SANDBOX_API, namespace, name }),
      )
    );
  }

  /**
   * Merge-patches a Sandbox (RFC 7386).
   *
   * @param namespace Its namespace.
   * @param name Its name.
   * @param patch The patch.
   * @returns The object as patched.
   */
  async patchSandbox(namespace: string, name: string, patch: KubeObject): Promise<KubeObject> {
    const k8s = this.#k8s;
    return await call(
      `patch Sandbox '${namespace}/${name}'`,
      () =>
        this.#custom.patchNamespacedCustomObject(
          { ...SANDBOX_API, namespace, name, body: patch },
          k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
        ),
    );
  }

  /**
   * Deletes a Sandbox (its pod and claims go with it).
   *
   * @param namespace Its namespace.
   * @param name Its name.
   * @returns False when there was none.
   */
  async deleteSandbox(namespace: string, name: string): Promise<boolean> {
    const deleted = await absentOn404(() =>
      call(
        `delete Sandbox '${namespace}/${name}'`,
        () =>
          this.#custom.deleteNamespacedCustomObject({
            ...SANDBOX_API,
            namespace,
            name,
            propagationPolicy: "Foreground",
          }),
      )
    );
    return deleted !== undefined;
  }

  /**
   * Lists Sandboxes of every namespace.
   *
   * @param labelSelector Which (`a=b,c=d`).
   * @returns The objects and the list's resourceVersion (to watch from).
   */
  async listSandboxes(
    labelSelector: string,
  ): Promise<{ items: KubeObject[]; resourceVersion: string }> {
    const list = await call(
      "list Sandboxes",
      () => this.#custom.listClusterCustomObject({ ...SANDBOX_API, labelSelector }),
    );
    const items = Array.isArray(list.items) ? list.items as KubeObject[] : [];
    const meta = list.metadata as { resourceVersion?: unknown } | undefined;
    return { items, resourceVersion: String(meta?.resourceVersion ?? "") };
  }

  /**
   * Watches Sandboxes of every namespace from a resourceVersion.
   *
   * @param labelSelector Which.
   * @param options `resourceVersion` to start after, `onEvent` for each
   *   change, `onDone` when the watch ends (with why; `410 Gone`: list again).
   * @returns Stops the watch.
   */
  async watchSandboxes(
    labelSelector: string,
    options: {
      resourceVersion: string;
      onEvent: (event: WatchEvent) => void;
      onDone: (error: unknown) => void;
    },
  ): Promise<() => void> {
    const watch = new this.#k8s.Watch(this.#config);
    const path = `/apis/${SANDBOX_API.group}/${SANDBOX_API.version}/${SANDBOX_API.plural}`;
    let done = false;
    const finish = (error: unknown): void => {
      if (done) return;
      done = true;
      options.onDone(error);
    };
    const controller = await watch.watch(
      path,
      { labelSelector, resourceVersion: options.resourceVersion, allowWatchBookmarks: true },
      (type: string, object: KubeObject) => {
        if (type === "ADDED" || type === "MODIFIED" || type === "DELETED") {
          options.onEvent({ type, object });
        } else if (type === "ERROR") {
          const code = Number((object as { code?: unknown }).code ?? 0);
          finish(
            new KubeApiError(`Watch of Sandboxes ended: ${statusMessage(object)}`, {
              status: code,
              reason: String((object as { reason?: unknown }).reason ?? ""),
            }),
          );
        }
      },
      (error: unknown) => finish(error ?? null),
    ).catch((error: unknown) => {
      finish(error);
      return undefined;
    });
    return () => {
      done = true;
      controller?.abort();
    };
  }

  /**
   * Deletes a Pod (a Sandbox's: agent-sandbox makes it again, on the same claims).
   *
   * @param namespace Its namespace.
   * @param name Its name.
   * @returns False when there was none.
   */
  async deletePod(namespace: string, name: string): Promise<boolean> {
    const deleted = await absentOn404(() =>
      call(
        `delete Pod '${namespace}/${name}'`,
        () => this.#core.deleteNamespacedPod({ namespace, name, gracePeriodSeconds: 0 }),
      )
    );
    return deleted !== undefined;
  }

  /**
   * Creates a Secret.
   *
   * @param namespace Its namespace.
   * @param body The object.
   */
  async createSecret(namespace: string, body: KubeObject): Promise<void> {
    await call(`create Secret in '${namespace}'`, () =>
      // deno-lint-ignore no-explicit-any
      this.#core.createNamespacedSecret({ namespace, body: body as any }));
  }

  /**
   * Reads a Secret's data, decoded.
   *
   * @param namespace Its namespace.
   * @param name Its name.
   * @returns Key to text, or undefined when there is none.
   */
  async getSecret(namespace: string, name: string): Promise<Record<string, string> | undefined> {
    const secret = await absentOn404(() =>
      call(
        `get Secret '${namespace}/${name}'`,
        () => this.#core.readNamespacedSecret({ namespace, name }),
      )
    );
    if (secret === undefined) return undefined;
    const decoded: Record<string, string> = {};
    for (const [key, value] of Object.entries(secret.data ?? {})) {
      decoded[key] = new TextDecoder().decode(Uint8Array.from(atob(value), (c) => c.charCodeAt(0)));
    }
    return decoded;
  }

  /**
   * Deletes a Secret.
   *
   * @param namespace Its namespace.
   * @param name Its name.
   */
  async deleteSecret(namespace: string, name: string): Promise<void> {
    await absentOn404(() =>
      call(
        `delete Secret '${namespace}/${name}'`,
        () => this.#core.deleteNamespacedSecret({ namespace, name }),
      )
    );
  }
}

// A call whose failure becomes a KubeApiError with the Status's words.
// deno-lint-ignore no-explicit-any
async function call<T = any>(what: string, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (cause) {
    const { code, body } = cause as { code?: unknown; body?: unknown };
    const status = typeof code === "number" ? code : 0;
    let parsed: unknown = body;
    if (typeof body === "string") {
      try {
        parsed = JSON.parse(body);
      } catch {
        parsed = { message: body.slice(0, 300) };
      }
    }
    const reason = String((parsed as { reason?: unknown } | undefined)?.reason ?? "");
    const said = status === 0 ? messageOf(cause) : statusMessage(parsed);
    throw new KubeApiError(`Kubernetes refused to ${what}: ${said}`, { status, reason, cause });
  }
}

async function absentOn404<T>(run: () => Promise<T>): Promise<T | undefined> {
  try {
    return await run();
  } catch (error) {
    if (error instanceof KubeApiError && error.status === 404) return undefined;
    throw error;
  }
}

function statusMessage(status: unknown): string {
  const { message, code } = (status ?? {}) as { message?: unknown; code?: unknown };
  const text = typeof message === "string" && message !== "" ? message : "no message";
  return `${text.replaceAll(/\s+/g, " ").slice(0, 300)}${code === undefined ? "" : ` (${code})`}`;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
