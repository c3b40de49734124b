/**
 * Checks a Kubernetes object before waffle prints or sends it: built-in
 * kinds against Kubernetes' own OpenAPI schema (`kubernetes-models`'
 * validators), agent-sandbox's kinds against the CRD schema waffle renders
 * (`crds.ts`, with ajv) and their pod template as a PodSpec, and the rules
 * the schemas leave to the API server: DNS-1123 names by kind, namespaces,
 * label keys and values.
 *
 * @module
 */
import process from "node:process";
import { Ajv, type ErrorObject, type ValidateFunction } from "ajv";
import { WaffleError } from "../errors.ts";
import { customResourceSchema, type Schema } from "./crds.ts";
import { isDns1123Label, isDns1123Subdomain, isLabelKey, isLabelValue } from "./names.ts";

/** An object waffle made does not validate: nothing was printed or sent. */
export class InvalidObjectError extends WaffleError {
  /** Every problem found, one line each. */
  readonly problems: readonly string[];
  /**
   * Creates the error: its message is the first problem and how many more.
   *
   * @param problems The problems (at least one).
   * @param options Cause and exit code.
   */
  constructor(
    problems: readonly string[],
    options: ConstructorParameters<typeof WaffleError>[1] = {},
  ) {
    const more = problems.length > 1 ? ` (and ${problems.length - 1} more)` : "";
    super(`Invalid object: ${problems[0] ?? "unknown problem"}${more}`, options);
    this.name = "InvalidObjectError";
    this.problems = problems;
  }
}

/** A compiled validator as kubernetes-models ships them (ajv standalone code). */
type SchemaCheck = ((data: unknown) => boolean) & { errors?: ErrorObject[] | null };

// Loaders by `apiVersion/kind`: literal imports, so a bundle includes them.
const BUILT_IN: Record<string, () => Promise<{ validate: SchemaCheck }>> = {
  "v1/Namespace": () => import("kubernetes-models/_schemas/IoK8sApiCoreV1Namespace"),
  "v1/ServiceAccount": () => import("kubernetes-models/_schemas/IoK8sApiCoreV1ServiceAccount"),
  "v1/ConfigMap": () => import("kubernetes-models/_schemas/IoK8sApiCoreV1ConfigMap"),
  "v1/Secret": () => import("kubernetes-models/_schemas/IoK8sApiCoreV1Secret"),
  "v1/Service": () => import("kubernetes-models/_schemas/IoK8sApiCoreV1Service"),
  "v1/ResourceQuota": () => import("kubernetes-models/_schemas/IoK8sApiCoreV1ResourceQuota"),
  "v1/LimitRange": () => import("kubernetes-models/_schemas/IoK8sApiCoreV1LimitRange"),
  "apps/v1/Deployment": () => import("kubernetes-models/_schemas/IoK8sApiAppsV1Deployment"),
  "rbac.authorization.k8s.io/v1/ClusterRole": () =>
    import("kubernetes-models/_schemas/IoK8sApiRbacV1ClusterRole"),
  "rbac.authorization.k8s.io/v1/ClusterRoleBinding": () =>
    import("kubernetes-models/_schemas/IoK8sApiRbacV1ClusterRoleBinding"),
  "networking.k8s.io/v1/NetworkPolicy": () =>
    import("kubernetes-models/_schemas/IoK8sApiNetworkingV1NetworkPolicy"),
  "apiextensions.k8s.io/v1/CustomResourceDefinition": () =>
    import(
      "kubernetes-models/_schemas/IoK8sApiextensionsApiserverPkgApisApiextensionsV1CustomResourceDefinition"
    ),
};
const POD_SPEC = (): Promise<{ validate: SchemaCheck }> =>
  import("kubernetes-models/_schemas/IoK8sApiCoreV1PodSpec");
const CLAIM_SPEC = (): Promise<{ validate: SchemaCheck }> =>
  import("kubernetes-models/_schemas/IoK8sApiCoreV1PersistentVolumeClaimSpec");

/** Kinds whose `metadata.name` must be a DNS-1123 label (≤ 63), not a subdomain. */
const LABEL_NAMED = new Set(["Namespace", "Service", "Sandbox"]);
/** Kinds named by a path segment (RBAC: `system:foo` is a valid name). */
const SEGMENT_NAMED = new Set(["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]);
/** Kinds without a namespace. */
const CLUSTER_SCOPED = new Set([
  "Namespace",
  "ClusterRole",
  "ClusterRoleBinding",
  "CustomResourceDefinition",
]);

/**
 * What is wrong with a Kubernetes object, each a line naming the object
 * and the field: the kind's schema, its name and namespace, its labels
 * and annotations, and its pod spec's container and volume names.
 *
 * @param object The object (JSON).
 * @returns The problems; empty when the object is valid.
 *
 * @example
 * ```ts
 * await validateObject({ apiVersion: "v1", kind: "Namespace", metadata: { name: "Bad_Name" } });
 * // ["Namespace 'Bad_Name': metadata.name 'Bad_Name' is not a DNS-1123 label (...)"]
 * ```
 */
export async function validateObject(object: unknown): Promise<string[]> {
  if (typeof object !== "object" || object === null || Array.isArray(object)) {
    return ["An object must be a JSON object"];
  }
  const record = object as Record<string, unknown>;
  const { apiVersion, kind } = record;
  if (typeof apiVersion !== "string" || typeof kind !== "string") {
    return ["An object must have a string 'apiVersion' and 'kind'"];
  }
  const where = `${kind} '${nameOf(record)}'`;
  const problems = [
    ...await schemaProblems(record, { apiVersion, kind }),
    ...metadataProblems(record, kind),
    ...podProblems(record, kind),
  ];
  return problems.map((problem) => `${where}: ${problem}`);
}

function nameOf(object: Record<string, unknown>): string {
  const metadata = asRecord(object.metadata);
  const name = typeof metadata?.name === "string" ? metadata.name : "?";
  return typeof metadata?.namespace === "string" ? `${metadata.namespace}/${name}` : name;
}

async function schemaProblems(
  object: Record<string, unknown>,
  type: { apiVersion: string; kind: string },
): Promise<string[]> {
  const custom = customResourceSchema(type.apiVersion, type.kind);
  if (custom !== undefined) return await customProblems(object, custom);
  const load = BUILT_IN[`${type.apiVersion}/${type.kind}`];
  if (load === undefined) return [`no schema for '${type.apiVersion}' '${type.kind}'`];
  return run((await loadQuietly(load)).validate, object, "");
}

// The Sandbox's own schema, then what its schema keeps as open objects:
// the pod template's spec as a PodSpec, each claim template's spec as a
// PersistentVolumeClaimSpec.
async function customProblems(object: Record<string, unknown>, schema: Schema): Promise<string[]> {
  const problems = run(compiled(schema), object, "");
  const spec = asRecord(object.spec);
  const template = asRecord(spec?.podTemplate);
  if (template?.spec !== undefined) {
    problems.push(
      ...run((await loadQuietly(POD_SPEC)).validate, template.spec, "spec.podTemplate.spec"),
    );
  }
  const claims = Array.isArray(spec?.volumeClaimTemplates) ? spec.volumeClaimTemplates : [];
  const claimCheck = (await loadQuietly(CLAIM_SPEC)).validate;
  claims.forEach((claim, at) => {
    problems.push(
      ...run(claimCheck, asRecord(claim)?.spec, `spec.volumeClaimTemplates.${at}.spec`),
    );
  });
  return problems;
}

// kubernetes-models' format checks load Node's deprecated punycode module,
// whose warning would land on the CLI's stderr.
async function loadQuietly<M>(load: () => Promise<M>): Promise<M> {
  (process as { noDeprecation?: boolean }).noDeprecation = true;
  return await load();
}

function run(check: SchemaCheck, data: unknown, base: string): string[] {
  if (check(data)) return [];
  return (check.errors ?? []).map((error) => describeError(error, base));
}

function describeError(error: ErrorObject, base: string): string {
  const path = [base, ...error.instancePath.split("/").slice(1)].filter((p) => p !== "").join(".");
  const at = path === "" ? "(object)" : path;
  const params = error.params as Record<string, unknown>;
  switch (error.keyword) {
    case "type":
      return `${at} must be ${params.type}`;
    case "required":
      return `${at} must have '${params.missingProperty}'`;
    case "enum":
      return `${at} must be one of ${JSON.stringify(params.allowedValues)}`;
    case "additionalProperties":
      return `${at} has unknown field '${params.additionalProperty}'`;
    default:
      return `${at} fails '${error.keyword}' ${JSON.stringify(params)}`;
  }
}

const validators = new Map<Schema, ValidateFunction>();

// A CRD schema compiled as the API server applies it with strict field
// validation: an object that lists its properties refuses others unless it
// keeps unknown fields.
function compiled(schema: Schema): ValidateFunction {
  const known = validators.get(schema);
  if (known !== undefined) return known;
  const ajv = new Ajv({ allErrors: true, strict: false });
  ajv.addFormat("date-time", /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/i);
  ajv.addFormat("int32", {
    type: "number",
    validate: (n: number) => Number.isInteger(n) && n >= -(2 ** 31) && n < 2 ** 31,
  });
  ajv.addFormat("int64", { type: "number", validate: (n: number) => Number.isSafeInteger(n) });
  const check = ajv.compile(strictFields(schema) as Schema);
  validators.set(schema, check);
  return check;
}

function strictFields(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(strictFields);
  const record = asRecord(schema);
  if (record === undefined) return schema;
  const out = Object.fromEntries(
    Object.entries(record).map((
      [key, value],
    ) => [key, key === "enum" ? value : strictFields(value)]),
  );
  if (
    record.properties !== undefined && record.additionalProperties === undefined &&
    record["x-kubernetes-preserve-unknown-fields"] !== true
  ) {
    out.additionalProperties = false;
  }
  return out;
}

function metadataProblems(object: Record<string, unknown>, kind: string): string[] {
  const metadata = asRecord(object.metadata);
  if (metadata === undefined) return ["metadata must be an object"];
  const problems: string[] = [];
  const name = metadata.name;
  if (typeof name !== "string") problems.push("metadata.name must be a string");
  else problems.push(...nameProblems(name, kind, "metadata.name"));
  const namespace = metadata.namespace;
  if (CLUSTER_SCOPED.has(kind)) {
    if (namespace !== undefined) problems.push(`a ${kind} has no namespace`);
  } else if (typeof namespace !== "string" || !isDns1123Label(namespace)) {
    problems.push(`metadata.namespace '${String(namespace)}' is not a DNS-1123 label`);
  }
  if (kind === "CustomResourceDefinition") {
    const spec = asRecord(object.spec);
    const names = asRecord(spec?.names);
    const expected = `${names?.plural}.${spec?.group}`;
    if (name !== expected) problems.push(`metadata.name '${name}' must be '${expected}'`);
  }
  problems.push(...labelProblems(metadata, "metadata"));
  return problems;
}

function nameProblems(name: string, kind: string, at: string): string[] {
  if (SEGMENT_NAMED.has(kind)) {
    return name !== "" && name !== "." && name !== ".." && !/[/%]/.test(name)
      ? []
      : [`${at} '${name}' is not a valid path segment`];
  }
  if (LABEL_NAMED.has(kind)) {
    return isDns1123Label(name) ? [] : [
      `${at} '${name}' is not a DNS-1123 label (1-63 of a-z 0-9 -, a letter or digit at each end)`,
    ];
  }
  return isDns1123Subdomain(name) ? [] : [
    `${at} '${name}' is not a DNS-1123 subdomain (at most 253 of a-z 0-9 - ., labels of a letter or digit at each end)`,
  ];
}

// Labels and annotations of an object's (or a pod template's) metadata.
function labelProblems(metadata: Record<string, unknown>, at: string): string[] {
  const problems: string[] = [];
  for (const [key, value] of Object.entries(asRecord(metadata.labels) ?? {})) {
    if (!isLabelKey(key)) problems.push(`${at}.labels key '${key}' is not a valid label key`);
    if (typeof value !== "string" || !isLabelValue(value)) {
      problems.push(
        `${at}.labels '${key}' value '${
          String(value)
        }' is not a valid label value (at most 63 of A-Z a-z 0-9 - _ ., a letter or digit at each end)`,
      );
    }
  }
  const annotations = asRecord(metadata.annotations) ?? {};
  for (const key of Object.keys(annotations)) {
    if (!isLabelKey(key)) problems.push(`${at}.annotations key '${key}' is not a valid key`);
  }
  const size = Object.entries(annotations).reduce(
    (sum, [key, value]) => sum + key.length + String(value).length,
    0,
  );
  if (size > 256 * 1024) problems.push(`${at}.annotations exceed 256 KiB`);
  return problems;
}

// A pod spec's own names: containers and volumes are DNS-1123 labels, and
// each mount names a volume (a Sandbox's claim template adds its own).
function podProblems(object: Record<string, unknown>, kind: string): string[] {
  const spec = asRecord(object.spec);
  const template = kind === "Sandbox"
    ? asRecord(spec?.podTemplate)
    : kind === "Deployment"
    ? asRecord(spec?.template)
    : undefined;
  if (template === undefined) return [];
  const at = kind === "Sandbox" ? "spec.podTemplate" : "spec.template";
  const pod = asRecord(template.spec) ?? {};
  const problems = labelProblems(asRecord(template.metadata) ?? {}, `${at}.metadata`);
  const volumes = listOf(pod.volumes).map((volume) => String(volume.name));
  const claims = kind === "Sandbox"
    ? listOf(spec?.volumeClaimTemplates).map((claim) => String(asRecord(claim.metadata)?.name))
    : [];
  for (const name of [...volumes, ...claims]) {
    if (!isDns1123Label(name)) problems.push(`${at}.spec volume '${name}' is not a DNS-1123 label`);
  }
  const known = new Set([...volumes, ...claims]);
  for (const container of [...listOf(pod.initContainers), ...listOf(pod.containers)]) {
    const name = String(container.name);
    if (!isDns1123Label(name)) {
      problems.push(`${at}.spec container '${name}' is not a DNS-1123 label`);
    }
    for (const mount of listOf(container.volumeMounts)) {
      if (!known.has(String(mount.name))) {
        problems.push(`${at}.spec container '${name}' mounts unknown volume '${mount.name}'`);
      }
    }
  }
  return problems;
}

function listOf(value: unknown): Record<string, unknown>[] {
  return Array.isArray(value) ? value.map((item) => asRecord(item) ?? {}) : [];
}

function asRecord(value: unknown): Record<string, unknown> | undefined {
  return typeof value === "object" && value !== null && !Array.isArray(value)
    ? value as Record<string, unknown>
    : undefined;
}
