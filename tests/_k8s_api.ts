/**
 * The API-server half of the Kubernetes stand-in (a MOCK of Kubernetes: no
 * cluster can run here; see tests/_k8s_standin.ts): an object store with
 * Kubernetes' REST paths, JSON bodies, `Status` errors, resourceVersions and
 * watches, for the resources waffle uses (agent-sandbox `sandboxes`, and
 * `secrets`, `persistentvolumeclaims`, `pods`, `namespaces`).
 *
 * Modelled as the real API server behaves: uid, resourceVersion (one
 * monotonic counter, a string), creationTimestamp, generation (bumped on a
 * spec change of a resource with a status subresource), status writable only
 * through `/status`, merge patch (RFC 7386; strategic merge patch taken as
 * one), JSON patch (RFC 6902), optimistic concurrency on a given
 * resourceVersion, finalizers and deletionTimestamp, garbage collection by
 * ownerReferences (background, at once), label and field
 * selectors (equality and `!=`, `exists`), watches from a resourceVersion
 * (410 Expired never happens: every event is kept). Not modelled: admission,
 * defaulting beyond what is named, server-side apply (415), pagination
 * (`limit` ignored), discovery beyond `/version`, RBAC (one token can do
 * everything).
 *
 * @module
 */
import { PersistentVolumeClaim, Pod, Secret } from "kubernetes-models/v1";

/** A Kubernetes object as JSON. */
// deno-lint-ignore no-explicit-any
export type KubeObject = Record<string, any>;

/** One kind of object the stand-in serves. */
export interface Resource {
  group: string;
  version: string;
  plural: string;
  kind: string;
  namespaced: boolean;
  /** The object has a `status` subresource: its status is written only there. */
  statusSubresource: boolean;
  /** DELETE answers with the object (custom resources) rather than a `Status`. */
  returnsObject: boolean;
}

/** The resources served. */
export const RESOURCES: readonly Resource[] = [
  {
    group: "agents.x-k8s.io",
    version: "v1beta1",
    plural: "sandboxes",
    kind: "Sandbox",
    namespaced: true,
    statusSubresource: true,
    returnsObject: true,
  },
  core("secrets", "Secret", { status: false }),
  core("persistentvolumeclaims", "PersistentVolumeClaim", { status: true }),
  core("pods", "Pod", { status: true }),
  { ...core("namespaces", "Namespace", { status: true }), namespaced: false },
];

function core(plural: string, kind: string, options: { status: boolean }): Resource {
  return {
    group: "",
    version: "v1",
    plural,
    kind,
    namespaced: true,
    statusSubresource: options.status,
    returnsObject: false,
  };
}

/** A change, as a watch sends it. */
export interface WatchEvent {
  type: "ADDED" | "MODIFIED" | "DELETED";
  object: KubeObject;
}

/** An error the API server answers with a `Status`. */
export class StatusError extends Error {
  /** HTTP status. */
  readonly code: number;
  /** The Status's `reason`. */
  readonly reason: string;
  /** The Status's `details`. */
  readonly details: KubeObject | undefined;

  /**
   * @param code HTTP status.
   * @param reason E.g. `NotFound`, `AlreadyExists`, `Invalid`, `Conflict`.
   * @param message The Status's message.
   * @param details The Status's details.
   */
  constructor(code: number, reason: string, message: string, details?: KubeObject) {
    super(message);
    this.code = code;
    this.reason = reason;
    this.details = details;
  }

  /** The `Status` body. */
  toStatus(): KubeObject {
    return {
      kind: "Status",
      apiVersion: "v1",
      metadata: {},
      status: "Failure",
      message: this.message,
      reason: this.reason,
      ...(this.details === undefined ? {} : { details: this.details }),
      code: this.code,
    };
  }
}

/** `sandboxes.agents.x-k8s.io` or `secrets`: how the API server names a resource in messages. */
export function qualified(resource: Resource): string {
  return resource.group === "" ? resource.plural : `${resource.plural}.${resource.group}`;
}

function apiVersionOf(resource: Resource): string {
  return resource.group === "" ? resource.version : `${resource.group}/${resource.version}`;
}

function notFound(resource: Resource, name: string): StatusError {
  return new StatusError(404, "NotFound", `${qualified(resource)} "${name}" not found`, {
    name,
    ...(resource.group === "" ? {} : { group: resource.group }),
    kind: resource.plural,
  });
}

function conflict(resource: Resource, name: string): StatusError {
  return new StatusError(
    409,
    "Conflict",
    `Operation cannot be fulfilled on ${
      qualified(resource)
    } "${name}": the object has been modified; please apply your changes to the latest version and try again`,
    { name, ...(resource.group === "" ? {} : { group: resource.group }), kind: resource.plural },
  );
}

/** A field error of a 422 `Invalid`. */
interface Cause {
  reason: "FieldValueInvalid" | "FieldValueRequired" | "FieldValueNotSupported";
  message: string;
  field: string;
}

function invalid(resource: Resource, name: string, causes: Cause[]): StatusError {
  const kind = resource.group === "" ? resource.kind : `${resource.kind}.${resource.group}`;
  const list = causes.map((cause) => `${cause.field}: ${cause.message}`);
  return new StatusError(
    422,
    "Invalid",
    `${kind} "${name}" is invalid: ${list.length === 1 ? list[0] : `[${list.join(", ")}]`}`,
    {
      name,
      ...(resource.group === "" ? {} : { group: resource.group }),
      kind: resource.kind,
      causes,
    },
  );
}

const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const LABEL_NAME =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;

// The structural checks of a create or an update: names, labels, and for a
// Sandbox the fields its CRD's schema requires.
function validate(resource: Resource, object: KubeObject): Cause[] {
  const causes: Cause[] = [];
  const name = object.metadata?.name;
  const isLabel = resource.plural === "namespaces";
  if (typeof name !== "string" || name === "") {
    causes.push({
      reason: "FieldValueRequired",
      message: "Required value: name or generateName is required",
      field: "metadata.name",
    });
  } else if (
    name.length > (isLabel ? 63 : 253) || !(isLabel ? DNS1123_LABEL : DNS1123_SUBDOMAIN).test(name)
  ) {
    causes.push({
      reason: "FieldValueInvalid",
      message: `Invalid value: "${name}": a lowercase RFC 1123 ${
        isLabel ? "label" : "subdomain"
      } must consist of lower case alphanumeric characters, '-'${
        isLabel ? "" : " or '.'"
      }, and must start and end with an alphanumeric character`,
      field: "metadata.name",
    });
  }
  for (const [key, value] of Object.entries(object.metadata?.labels ?? {})) {
    if (!LABEL_NAME.test(key) || key.split("/").at(-1)!.length > 63) {
      causes.push({
        reason: "FieldValueInvalid",
        message: `Invalid value: "${key}": name part must be a valid label name`,
        field: "metadata.labels",
      });
    }
    if (typeof value !== "string" || value.length > 63 || !LABEL_VALUE.test(value)) {
      causes.push({
        reason: "FieldValueInvalid",
        message: `Invalid value: "${value}": a valid label value`,
        field: "metadata.labels",
      });
    }
  }
  for (const [key, value] of Object.entries(object.metadata?.annotations ?? {})) {
    if (typeof value !== "string") {
      causes.push({
        reason: "FieldValueInvalid",
        message: `Invalid value: annotation '${key}' must be a string`,
        field: "metadata.annotations",
      });
    }
  }
  if (resource.plural === "sandboxes") causes.push(...validateSandbox(object));
  if (resource.plural === "secrets") causes.push(...schemaCauses(Secret, object, ""));
  if (resource.plural === "secrets") {
    for (const [key, value] of Object.entries(object.data ?? {})) {
      if (typeof value !== "string" || !/^[A-Za-z0-9+/]*={0,2}$/.test(value)) {
        causes.push({
          reason: "FieldValueInvalid",
          message: `Invalid value: data['${key}'] is not base64`,
          field: `data[${key}]`,
        });
      }
    }
  }
  return causes;
}

function validateSandbox(object: KubeObject): Cause[] {
  const causes: Cause[] = [];
  const spec = object.spec;
  const containers = spec?.podTemplate?.spec?.containers;
  if (!Array.isArray(containers) || containers.length === 0) {
    causes.push({
      reason: "FieldValueRequired",
      message: "Required value",
      field: "spec.podTemplate.spec.containers",
    });
  } else {
    for (
      const [i, container] of [...containers, ...(spec.podTemplate.spec.initContainers ?? [])]
        .entries()
    ) {
      if (typeof container?.name !== "string" || !DNS1123_LABEL.test(container.name)) {
        causes.push({
          reason: "FieldValueInvalid",
          message: `Invalid value: "${container?.name}": a lowercase RFC 1123 label`,
          field: `spec.podTemplate.spec.containers[${i}].name`,
        });
      }
      if (typeof container?.image !== "string" || container.image === "") {
        causes.push({
          reason: "FieldValueRequired",
          message: "Required value",
          field: `spec.podTemplate.spec.containers[${i}].image`,
        });
      }
    }
  }
  // The embedded PodSpec and claim specs against Kubernetes' OpenAPI schema,
  // as the CRD's schema has the API server check them.
  if (causes.length === 0) {
    causes.push(
      ...schemaCauses(
        Pod,
        { metadata: { name: "x" }, spec: spec.podTemplate.spec },
        "spec.podTemplate",
      ),
    );
  }
  for (const [i, template] of (spec?.volumeClaimTemplates ?? []).entries()) {
    causes.push(
      ...schemaCauses(
        PersistentVolumeClaim,
        { metadata: { name: "x" }, spec: template?.spec ?? {} },
        `spec.volumeClaimTemplates[${i}]`,
      ),
    );
  }
  const mode = spec?.operatingMode;
  if (mode !== undefined && mode !== "Running" && mode !== "Suspended") {
    causes.push({
      reason: "FieldValueNotSupported",
      message: `Unsupported value: "${mode}": supported values: "Running", "Suspended"`,
      field: "spec.operatingMode",
    });
  }
  for (const [i, template] of (spec?.volumeClaimTemplates ?? []).entries()) {
    const name = template?.metadata?.name;
    if (typeof name !== "string" || !DNS1123_SUBDOMAIN.test(name)) {
      causes.push({
        reason: "FieldValueInvalid",
        message: `Invalid value: "${name}"`,
        field: `spec.volumeClaimTemplates[${i}].metadata.name`,
      });
    }
  }
  return causes;
}

// A kubernetes-models class's schema errors as causes, their paths under `base`.
function schemaCauses(
  Model: new (data: never) => { validate(): void },
  data: KubeObject,
  base: string,
): Cause[] {
  try {
    new Model(data as never).validate();
    return [];
  } catch (err) {
    const errors: { instancePath: string; message?: string }[] = (err as KubeObject).errors ?? [];
    if (errors.length === 0) throw err;
    return errors.map((error) => {
      const path = error.instancePath.split("/").filter((p) => p !== "")
        .map((p) => /^\d+$/.test(p) ? `[${p}]` : `.${p}`).join("");
      const field = `${base}${path}`.replace(/^\./, "");
      return {
        reason: "FieldValueInvalid",
        message: `Invalid value: ${error.message ?? "invalid"}`,
        field,
      };
    });
  }
}

/** `a=b,c!=d,e,!f` of a label selector, or a field selector's `metadata.name=x`. */
function selectorMatches(
  selector: string | null,
  read: (key: string) => string | undefined,
): boolean {
  if (selector === null || selector.trim() === "") return true;
  return selector.split(",").every((term) => {
    const part = term.trim();
    const match = /^([^!=]+?)\s*(==|=|!=)\s*(.*)$/.exec(part);
    if (match === null) {
      if (part.startsWith("!")) return read(part.slice(1).trim()) === undefined;
      return read(part) !== undefined;
    }
    const value = read(match[1]!.trim());
    return match[2] === "!=" ? value !== match[3] : value === match[3];
  });
}

function fieldOf(object: KubeObject, path: string): string | undefined {
  let value: unknown = object;
  for (const key of path.split(".")) value = (value as KubeObject | undefined)?.[key];
  return value === undefined || value === null ? undefined : String(value);
}

/** RFC 7386: `patch` merged into `target` (null removes). */
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (typeof patch !== "object" || patch === null || Array.isArray(patch)) return patch;
  const result: KubeObject = typeof target === "object" && target !== null && !Array.isArray(target)
    ? { ...target }
    : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete result[key];
    else result[key] = mergePatch(result[key], value);
  }
  return result;
}

/** RFC 6902: add, remove, replace, move, copy, test. */
export function jsonPatch(target: KubeObject, ops: unknown): KubeObject {
  if (!Array.isArray(ops)) throw new StatusError(400, "BadRequest", "json patch must be an array");
  let doc: unknown = structuredClone(target);
  const pointer = (path: string): string[] =>
    path === ""
      ? []
      : path.slice(1).split("/").map((p) => p.replace(/~1/g, "/").replace(/~0/g, "~"));
  const get = (path: string[]): unknown =>
    path.reduce<unknown>((node, key) => (node as KubeObject | undefined)?.[key], doc);
  const parentOf = (path: string[]): [KubeObject, string] => {
    const parent = get(path.slice(0, -1));
    if (typeof parent !== "object" || parent === null) {
      throw new StatusError(422, "Invalid", `doc is missing path: "/${path.join("/")}"`);
    }
    return [parent as KubeObject, path.at(-1)!];
  };
  const add = (path: string[], value: unknown): void => {
    if (path.length === 0) return void (doc = value);
    const [parent, key] = parentOf(path);
    if (Array.isArray(parent)) parent.splice(key === "-" ? parent.length : Number(key), 0, value);
    else parent[key] = value;
  };
  const remove = (path: string[]): unknown => {
    const [parent, key] = parentOf(path);
    if (!(key in parent)) {
      throw new StatusError(422, "Invalid", `doc is missing path: "/${path.join("/")}"`);
    }
    const value = parent[key];
    if (Array.isArray(parent)) parent.splice(Number(key), 1);
    else delete parent[key];
    return value;
  };
  for (const op of ops as KubeObject[]) {
    const path = pointer(String(op.path ?? ""));
    switch (op.op) {
      case "add":
        add(path, structuredClone(op.value));
        break;
      case "remove":
        remove(path);
        break;
      case "replace":
        remove(path);
        add(path, structuredClone(op.value));
        break;
      case "move":
        add(path, remove(pointer(String(op.from))));
        break;
      case "copy":
        add(path, structuredClone(get(pointer(String(op.from)))));
        break;
      case "test":
        if (JSON.stringify(get(path)) !== JSON.stringify(op.value)) {
          throw new StatusError(422, "Invalid", `testing value /${path.join("/")} failed`);
        }
        break;
      default:
        throw new StatusError(400, "BadRequest", `Unexpected kind: ${op.op}`);
    }
  }
  return doc as KubeObject;
}

/** Where an object lives. */
interface Key {
  resource: Resource;
  namespace: string;
  name: string;
}

/** The objects, their history and their watchers. */
export class ObjectStore {
  #counter = 1;
  readonly #objects = new Map<string, KubeObject>();
  readonly #history: { rv: number; resource: Resource; event: WatchEvent }[] = [];
  readonly #watchers = new Set<(resource: Resource, event: WatchEvent) => void>();
  /** Create a namespace on first use (a real cluster needs it made first). */
  readonly autoNamespaces: boolean;

  /** @param options `autoNamespaces`: create a namespace when an object is first put in it. */
  constructor(options: { autoNamespaces?: boolean } = {}) {
    this.autoNamespaces = options.autoNamespaces ?? true;
  }

  /** The latest resourceVersion. */
  get resourceVersion(): string {
    return String(this.#counter);
  }

  #id(key: Key): string {
    return `${key.resource.plural}/${key.namespace}/${key.name}`;
  }

  #emit(resource: Resource, type: WatchEvent["type"], object: KubeObject): void {
    const event = { type, object: structuredClone(object) };
    this.#history.push({ rv: Number(object.metadata.resourceVersion), resource, event });
    for (const watcher of this.#watchers) watcher(resource, event);
  }

  #ensureNamespace(namespace: string): void {
    if (namespace === "") return;
    const ns = RESOURCES.find((r) => r.plural === "namespaces")!;
    if (this.#objects.has(this.#id({ resource: ns, namespace: "", name: namespace }))) return;
    if (!this.autoNamespaces) throw notFound(ns, namespace);
    this.create(ns, "", { apiVersion: "v1", kind: "Namespace", metadata: { name: namespace } });
  }

  /** An object, or undefined. */
  find(resource: Resource, namespace: string, name: string): KubeObject | undefined {
    const found = this.#objects.get(this.#id({ resource, namespace, name }));
    return found === undefined ? undefined : structuredClone(found);
  }

  /** An object, or 404. */
  get(resource: Resource, namespace: string, name: string): KubeObject {
    const found = this.find(resource, namespace, name);
    if (found === undefined) throw notFound(resource, name);
    return found;
  }

  /** Objects of a resource (in a namespace, or all), matching selectors. */
  list(
    resource: Resource,
    namespace: string | undefined,
    selectors: { label?: string | null; field?: string | null } = {},
  ): KubeObject[] {
    return [...this.#objects.entries()]
      .filter(([id]) => id.startsWith(`${resource.plural}/`))
      .map(([, object]) => object)
      .filter((object) =>
        namespace === undefined || (object.metadata.namespace ?? "") === namespace
      )
      .filter((object) => matches(object, selectors))
      .sort((a, b) =>
        `${a.metadata.namespace}/${a.metadata.name}`.localeCompare(
          `${b.metadata.namespace}/${b.metadata.name}`,
        )
      )
      .map((object) => structuredClone(object));
  }

  /** Creates an object (201), as `POST` does. */
  create(resource: Resource, namespace: string, body: KubeObject): KubeObject {
    checkType(resource, body);
    const object = structuredClone(body);
    object.metadata ??= {};
    if (object.metadata.name === undefined && typeof object.metadata.generateName === "string") {
      object.metadata.name = `${object.metadata.generateName}${crypto.randomUUID().slice(0, 5)}`;
    }
    if (resource.namespaced) {
      if (object.metadata.namespace !== undefined && object.metadata.namespace !== namespace) {
        throw new StatusError(
          400,
          "BadRequest",
          "the namespace of the provided object does not match the namespace sent on the request",
        );
      }
      object.metadata.namespace = namespace;
    }
    const causes = validate(resource, object);
    if (causes.length > 0) throw invalid(resource, String(object.metadata.name ?? ""), causes);
    if (resource.namespaced) this.#ensureNamespace(namespace);
    const key = { resource, namespace, name: object.metadata.name };
    if (this.#objects.has(this.#id(key))) {
      throw new StatusError(
        409,
        "AlreadyExists",
        `${qualified(resource)} "${key.name}" already exists`,
        {
          name: key.name,
          ...(resource.group === "" ? {} : { group: resource.group }),
          kind: resource.plural,
        },
      );
    }
    if (resource.statusSubresource) {
      delete object.status;
      if (resource.plural === "namespaces") object.status = { phase: "Active" };
    }
    normalizeSecret(resource, object);
    Object.assign(object.metadata, {
      uid: crypto.randomUUID(),
      resourceVersion: String(++this.#counter),
      creationTimestamp: timestamp(),
      ...(resource.statusSubresource && resource.group !== "" ? { generation: 1 } : {}),
    });
    delete object.metadata.deletionTimestamp;
    object.apiVersion = apiVersionOf(resource);
    object.kind = resource.kind;
    this.#objects.set(this.#id(key), object);
    this.#emit(resource, "ADDED", object);
    return structuredClone(object);
  }

  /**
   * Replaces an object (`PUT`, or what a patch computed): the status (or,
   * for `/status`, all but the status) is kept, a given resourceVersion must
   * be the current one.
   */
  update(
    resource: Resource,
    namespace: string,
    name: string,
    body: KubeObject,
    options: { status?: boolean } = {},
  ): KubeObject {
    const current = this.get(resource, namespace, name);
    checkType(resource, body);
    const given = body.metadata?.resourceVersion;
    if (given !== undefined && given !== current.metadata.resourceVersion) {
      throw conflict(resource, name);
    }
    if (body.metadata?.name !== undefined && body.metadata.name !== name) {
      throw new StatusError(
        400,
        "BadRequest",
        `the name of the object (${body.metadata.name}) does not match the name on the URL (${name})`,
      );
    }
    let next: KubeObject;
    if (options.status) {
      next = { ...current, status: body.status };
    } else {
      next = structuredClone(body);
      if (resource.statusSubresource) next.status = current.status;
      if (next.status === undefined) delete next.status;
    }
    next.apiVersion = apiVersionOf(resource);
    next.kind = resource.kind;
    // What only the server sets stays as it was.
    next.metadata = {
      ...(options.status ? current.metadata : body.metadata ?? {}),
      name,
      ...(resource.namespaced ? { namespace } : {}),
      uid: current.metadata.uid,
      creationTimestamp: current.metadata.creationTimestamp,
      ...(current.metadata.deletionTimestamp === undefined
        ? {}
        : { deletionTimestamp: current.metadata.deletionTimestamp }),
      ...(current.metadata.generation === undefined
        ? {}
        : { generation: current.metadata.generation }),
    };
    if (!options.status) {
      const causes = validate(resource, next);
      if (causes.length > 0) throw invalid(resource, name, causes);
    }
    normalizeSecret(resource, next);
    const { resourceVersion: _a, ...before } = current.metadata;
    const { resourceVersion: _b, ...after } = next.metadata;
    if (
      JSON.stringify({ ...current, metadata: before }) ===
        JSON.stringify({ ...next, metadata: after })
    ) {
      return current; // no change: no new resourceVersion, no event
    }
    if (
      next.metadata.generation !== undefined &&
      JSON.stringify(next.spec) !== JSON.stringify(current.spec)
    ) next.metadata.generation += 1;
    next.metadata.resourceVersion = String(++this.#counter);
    const id = this.#id({ resource, namespace, name });
    if (
      next.metadata.deletionTimestamp !== undefined && (next.metadata.finalizers ?? []).length === 0
    ) {
      this.#objects.delete(id);
      this.#emit(resource, "DELETED", next);
      this.#collect(next.metadata.uid);
      return next;
    }
    this.#objects.set(id, next);
    this.#emit(resource, "MODIFIED", next);
    return structuredClone(next);
  }

  /** Patches an object by its content type (merge, strategic merge as merge, or JSON patch). */
  patch(
    resource: Resource,
    namespace: string,
    name: string,
    contentType: string,
    patch: unknown,
    options: { status?: boolean } = {},
  ): KubeObject {
    const current = this.get(resource, namespace, name);
    const type = contentType.split(";")[0]!.trim();
    let next: KubeObject;
    if (
      type === "application/merge-patch+json" ||
      (type === "application/strategic-merge-patch+json" && resource.group === "")
    ) {
      next = mergePatch(current, patch) as KubeObject;
    } else if (type === "application/json-patch+json") {
      next = jsonPatch(current, patch);
    } else {
      throw new StatusError(
        415,
        "UnsupportedMediaType",
        `the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json${
          resource.group === "" ? ", application/strategic-merge-patch+json" : ""
        }`,
      );
    }
    // A patch that names no resourceVersion is applied to the current one.
    const given = (patch as KubeObject | null)?.metadata?.resourceVersion;
    if (type !== "application/json-patch+json" && given === undefined) {
      next.metadata.resourceVersion = current.metadata.resourceVersion;
    }
    return this.update(resource, namespace, name, next, options);
  }

  /** Deletes an object (or marks it, while it has finalizers), as `DELETE` does. */
  delete(
    resource: Resource,
    namespace: string,
    name: string,
    preconditions: { uid?: string; resourceVersion?: string } = {},
  ): KubeObject {
    const current = this.get(resource, namespace, name);
    if (preconditions.uid !== undefined && preconditions.uid !== current.metadata.uid) {
      throw new StatusError(
        409,
        "Conflict",
        `Precondition failed: UID in precondition: ${preconditions.uid}, UID in object meta: ${current.metadata.uid}`,
      );
    }
    if (
      preconditions.resourceVersion !== undefined &&
      preconditions.resourceVersion !== current.metadata.resourceVersion
    ) {
      throw conflict(resource, name);
    }
    if ((current.metadata.finalizers ?? []).length > 0) {
      if (current.metadata.deletionTimestamp !== undefined) return current;
      const marked = structuredClone(current);
      marked.metadata.deletionTimestamp = timestamp();
      marked.metadata.resourceVersion = String(++this.#counter);
      this.#objects.set(this.#id({ resource, namespace, name }), marked);
      this.#emit(resource, "MODIFIED", marked);
      return structuredClone(marked);
    }
    current.metadata.resourceVersion = String(++this.#counter);
    this.#objects.delete(this.#id({ resource, namespace, name }));
    this.#emit(resource, "DELETED", current);
    this.#collect(current.metadata.uid);
    return current;
  }

  // The garbage collector's part (background propagation): what the
  // removed object owned, and no living owner still holds, goes too.
  #collect(uid: string): void {
    const living = new Set([...this.#objects.values()].map((object) => object.metadata.uid));
    for (const [id, object] of [...this.#objects]) {
      const owners: KubeObject[] = object.metadata.ownerReferences ?? [];
      if (!owners.some((owner) => owner.uid === uid)) continue;
      if (owners.some((owner) => living.has(owner.uid))) continue;
      const resource = RESOURCES.find((r) => id.startsWith(`${r.plural}/`))!;
      try {
        this.delete(resource, object.metadata.namespace ?? "", object.metadata.name);
      } catch {
        // already gone
      }
    }
  }

  /**
   * Subscribes to the events of `resource` after `fromVersion` (all of
   * them, replayed first), or, without one, to synthetic ADDED events of the
   * current objects and then what follows.
   *
   * @returns The unsubscriber.
   */
  watch(
    resource: Resource,
    namespace: string | undefined,
    selectors: { label?: string | null; field?: string | null; fromVersion?: string | null },
    send: (event: WatchEvent) => void,
  ): () => void {
    const wanted = (r: Resource, event: WatchEvent): boolean =>
      r === resource &&
      (namespace === undefined || event.object.metadata.namespace === namespace) &&
      matches(event.object, selectors);
    const from = selectors.fromVersion;
    if (from === undefined || from === null || from === "" || from === "0") {
      for (const object of this.list(resource, namespace, selectors)) {
        send({ type: "ADDED", object });
      }
    } else {
      for (const entry of this.#history) {
        if (entry.rv > Number(from) && wanted(entry.resource, entry.event)) {
          send(structuredClone(entry.event));
        }
      }
    }
    const watcher = (r: Resource, event: WatchEvent): void => {
      if (wanted(r, event)) send(event);
    };
    this.#watchers.add(watcher);
    return () => this.#watchers.delete(watcher);
  }
}

function matches(
  object: KubeObject,
  selectors: { label?: string | null; field?: string | null },
): boolean {
  return selectorMatches(selectors.label ?? null, (key) => object.metadata?.labels?.[key]) &&
    selectorMatches(selectors.field ?? null, (key) => fieldOf(object, key));
}

function checkType(resource: Resource, body: KubeObject): void {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw new StatusError(400, "BadRequest", "the body of the request is not a JSON object");
  }
  const apiVersion = apiVersionOf(resource);
  if (body.apiVersion !== undefined && body.apiVersion !== apiVersion) {
    throw new StatusError(
      400,
      "BadRequest",
      `the API version in the data (${body.apiVersion}) does not match the expected API version (${apiVersion})`,
    );
  }
  if (body.kind !== undefined && body.kind !== resource.kind) {
    throw new StatusError(
      400,
      "BadRequest",
      `the kind in the data (${body.kind}) does not match the expected kind (${resource.kind})`,
    );
  }
  if (resource.group !== "" && (body.apiVersion === undefined || body.kind === undefined)) {
    throw new StatusError(400, "BadRequest", "Object 'Kind' is missing in the request body");
  }
}

// A Secret's stringData goes into data (base64), as the API server stores it; type defaults to Opaque.
function normalizeSecret(resource: Resource, object: KubeObject): void {
  if (resource.plural !== "secrets") return;
  object.type ??= "Opaque";
  for (const [key, value] of Object.entries(object.stringData ?? {})) {
    object.data ??= {};
    object.data[key] = btoa(String.fromCharCode(...new TextEncoder().encode(String(value))));
  }
  delete object.stringData;
}

/** RFC 3339 to the second, as the API server writes times. */
export function timestamp(): string {
  return new Date().toISOString().replace(/\.\d{3}Z$/, "Z");
}

/** What a request path names. */
export interface Route {
  resource: Resource;
  /** Undefined: all namespaces (or a cluster-scoped resource). */
  namespace: string | undefined;
  name: string | undefined;
  status: boolean;
}

/**
 * Parses `/api/v1/namespaces/{ns}/{plural}[/{name}[/status]]`,
 * `/apis/{group}/{version}/…` and the cluster-wide forms.
 *
 * @returns The route, or undefined for an unknown path.
 */
export function route(path: string): Route | undefined {
  const parts = path.split("/").filter((p) => p !== "").map(decodeURIComponent);
  let group: string;
  let rest: string[];
  if (parts[0] === "api" && parts[1] === "v1") {
    group = "";
    rest = parts.slice(2);
  } else if (parts[0] === "apis" && parts.length >= 3) {
    group = parts[1]!;
    rest = parts.slice(3);
  } else return undefined;
  const version = group === "" ? "v1" : parts[2];
  const find = (plural: string | undefined): Resource | undefined =>
    RESOURCES.find((r) => r.group === group && r.version === version && r.plural === plural);
  let namespace: string | undefined;
  if (rest[0] === "namespaces" && rest.length >= 3) {
    namespace = rest[1]!;
    rest = rest.slice(2);
  }
  const resource = find(rest[0]);
  if (resource === undefined || rest.length > 3 || (rest.length === 3 && rest[2] !== "status")) {
    return undefined;
  }
  if (resource.namespaced !== (namespace !== undefined) && rest.length > 1) return undefined;
  return { resource, namespace, name: rest[1], status: rest[2] === "status" };
}
