/**
 * agent-sandbox's custom resources as waffle renders them: `Sandbox`
 * (`agents.x-k8s.io/v1beta1`) and, in reduced form, `SandboxTemplate`,
 * `SandboxWarmPool` and `SandboxClaim` (`extensions.agents.x-k8s.io/v1beta1`).
 * Written from the facts of agent-sandbox's Go types
 * (`api/v1beta1/sandbox_types.go`, `extensions/api/v1beta1/*_types.go`,
 * v0.5.6), not copied from its generated YAML: a pod template's `spec` and a
 * claim's PVC spec are kept as objects whose fields the API server keeps
 * (`x-kubernetes-preserve-unknown-fields`), since `kubernetes-models`
 * validates a PodSpec itself (`validate.ts`). Only v1beta1 is served here:
 * agent-sandbox's own CRDs also serve v1alpha1 through a conversion webhook.
 *
 * @module
 */
import {
  type KubeObject,
  SANDBOX_GROUP,
  SANDBOX_KIND,
  SANDBOX_PLURAL,
  SANDBOX_VERSION,
} from "./sandbox_object.ts";

/** agent-sandbox's extensions group: templates, warm pools, claims. */
export const EXTENSIONS_GROUP = "extensions.agents.x-k8s.io";

/** A JSON schema (the OpenAPI v3 subset a CRD's structural schema uses). */
export type Schema = Record<string, unknown>;

const string: Schema = { type: "string" };
const stringMap: Schema = { type: "object", additionalProperties: { type: "string" } };
const dateTime: Schema = { type: "string", format: "date-time" };
const preserved: Schema = { type: "object", "x-kubernetes-preserve-unknown-fields": true };
const int32 = (minimum?: number): Schema => ({
  type: "integer",
  format: "int32",
  ...(minimum === undefined ? {} : { minimum }),
});
const object = (properties: Record<string, Schema>, required?: string[]): Schema => ({
  type: "object",
  properties,
  ...(required === undefined ? {} : { required }),
});
const array = (items: Schema): Schema => ({ type: "array", items });
const enumOf = (values: string[], defaultValue?: string): Schema => ({
  type: "string",
  enum: values,
  ...(defaultValue === undefined ? {} : { default: defaultValue }),
});
// A resource quantity ("1Gi", 1073741824).
const quantity: Schema = {
  "x-kubernetes-int-or-string": true,
  anyOf: [{ type: "integer" }, { type: "string" }],
  pattern:
    "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
};

/** metav1.Condition, as every condition list of a CRD status. */
const condition: Schema = object({
  type: string,
  status: enumOf(["True", "False", "Unknown"]),
  reason: string,
  message: string,
  lastTransitionTime: dateTime,
  observedGeneration: { type: "integer", format: "int64", minimum: 0 },
}, ["lastTransitionTime", "message", "reason", "status", "type"]);

const podMetadata: Schema = object({ labels: stringMap, annotations: stringMap });

const podTemplate: Schema = object({ metadata: podMetadata, spec: preserved }, ["spec"]);

// A PVC template: its metadata (name, labels, annotations) and the
// PersistentVolumeClaimSpec fields a workspace claim uses.
const claimTemplate: Schema = object({
  metadata: object({ name: string, labels: stringMap, annotations: stringMap }),
  spec: {
    ...object({
      accessModes: array(string),
      resources: object({
        requests: { type: "object", additionalProperties: quantity },
        limits: { type: "object", additionalProperties: quantity },
      }),
      storageClassName: string,
      volumeMode: string,
      volumeName: string,
      volumeAttributesClassName: string,
      selector: preserved,
      dataSource: preserved,
      dataSourceRef: preserved,
    }),
  },
}, ["spec"]);

// What Sandbox and SandboxTemplate share (SandboxBlueprint).
const blueprint: Record<string, Schema> = {
  podTemplate,
  volumeClaimTemplates: { ...array(claimTemplate), "x-kubernetes-list-type": "atomic" },
  service: { type: "boolean" },
};

const sandboxSpec: Schema = {
  ...object({
    ...blueprint,
    shutdownTime: dateTime,
    shutdownPolicy: enumOf(["Delete", "Retain"], "Retain"),
    operatingMode: enumOf(["Running", "Suspended"], "Running"),
  }, ["podTemplate"]),
  "x-kubernetes-validations": [{
    rule: "has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) && " +
      "(!has(self.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)",
    message: "volumeClaimTemplates is immutable",
  }],
};

const sandboxStatus: Schema = object({
  serviceFQDN: string,
  service: string,
  conditions: array(condition),
  selector: string,
  podIPs: array(string),
  nodeName: string,
});

/** The openAPIV3Schema of `Sandbox` v1beta1. */
export const SANDBOX_SCHEMA: Schema = rootSchema(sandboxSpec, sandboxStatus);

const templateSpec: Schema = object({
  ...blueprint,
  networkPolicy: object({ ingress: array(preserved), egress: array(preserved) }),
  networkPolicyManagement: enumOf(["Managed", "Unmanaged"], "Managed"),
  envVarsInjectionPolicy: enumOf(["Allowed", "Overrides", "Disallowed"], "Disallowed"),
  volumeClaimTemplatesPolicy: enumOf(["Disallowed", "Allowed", "Overrides"], "Disallowed"),
}, ["podTemplate"]);

const warmPoolSpec: Schema = object({
  replicas: { ...int32(0), default: 1 },
  sandboxTemplateRef: object({ name: string }, ["name"]),
  updateStrategy: object({ type: enumOf(["Recreate", "OnReplenish"], "OnReplenish") }),
}, ["sandboxTemplateRef"]);

const warmPoolStatus: Schema = object({
  replicas: int32(0),
  readyReplicas: int32(0),
  selector: string,
  observedGeneration: { type: "integer", format: "int64", minimum: 0 },
});

const claimSpec: Schema = object({
  warmPoolRef: object({ name: string }, ["name"]),
  lifecycle: object({
    shutdownTime: dateTime,
    ttlSecondsAfterFinished: int32(0),
    shutdownPolicy: enumOf(["Delete", "DeleteForeground", "Retain"], "Retain"),
  }),
  additionalPodMetadata: podMetadata,
  env: array(object({ name: string, value: string, containerName: string }, ["name", "value"])),
  volumeClaimTemplates: array(claimTemplate),
}, ["warmPoolRef"]);

const claimStatus: Schema = object({
  conditions: array(condition),
  sandbox: object({ name: string, podIPs: array(string) }),
});

function rootSchema(spec: Schema, status?: Schema): Schema {
  return object({
    apiVersion: string,
    kind: string,
    metadata: { type: "object" },
    spec,
    ...(status === undefined ? {} : { status }),
  }, ["spec"]);
}

/** One custom resource: what its CRD declares. */
interface ResourceFacts {
  group: string;
  kind: string;
  plural: string;
  shortName: string;
  schema: Schema;
  status: boolean;
  scale?: boolean;
  readyColumn?: boolean;
}

const RESOURCES: readonly ResourceFacts[] = [
  {
    group: SANDBOX_GROUP,
    kind: SANDBOX_KIND,
    plural: SANDBOX_PLURAL,
    shortName: "sandbox",
    schema: SANDBOX_SCHEMA,
    status: true,
    readyColumn: true,
  },
  {
    group: EXTENSIONS_GROUP,
    kind: "SandboxTemplate",
    plural: "sandboxtemplates",
    shortName: "sandboxtemplate",
    schema: rootSchema(templateSpec),
    status: false,
  },
  {
    group: EXTENSIONS_GROUP,
    kind: "SandboxWarmPool",
    plural: "sandboxwarmpools",
    shortName: "swp",
    schema: rootSchema(warmPoolSpec, warmPoolStatus),
    status: true,
    scale: true,
  },
  {
    group: EXTENSIONS_GROUP,
    kind: "SandboxClaim",
    plural: "sandboxclaims",
    shortName: "sandboxclaim",
    schema: rootSchema(claimSpec, claimStatus),
    status: true,
    readyColumn: true,
  },
];

function crdOf(facts: ResourceFacts, labels: Record<string, string>): KubeObject {
  const subresources = {
    ...(facts.status ? { status: {} } : {}),
    ...(facts.scale
      ? {
        scale: {
          specReplicasPath: ".spec.replicas",
          statusReplicasPath: ".status.replicas",
          labelSelectorPath: ".status.selector",
        },
      }
      : {}),
  };
  const ready = ".status.conditions[?(@.type=='Ready')]";
  return {
    apiVersion: "apiextensions.k8s.io/v1",
    kind: "CustomResourceDefinition",
    metadata: { name: `${facts.plural}.${facts.group}`, labels },
    spec: {
      group: facts.group,
      names: {
        kind: facts.kind,
        listKind: `${facts.kind}List`,
        plural: facts.plural,
        singular: facts.kind.toLowerCase(),
        shortNames: [facts.shortName],
      },
      scope: "Namespaced",
      versions: [{
        name: SANDBOX_VERSION,
        served: true,
        storage: true,
        schema: { openAPIV3Schema: facts.schema },
        ...(Object.keys(subresources).length === 0 ? {} : { subresources }),
        additionalPrinterColumns: [
          ...(facts.readyColumn
            ? [
              { name: "Ready", type: "string", jsonPath: `${ready}.status` },
              { name: "Reason", type: "string", jsonPath: `${ready}.reason` },
            ]
            : []),
          { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" },
        ],
      }],
    },
  };
}

/**
 * agent-sandbox's four CustomResourceDefinitions (Sandbox, SandboxTemplate,
 * SandboxWarmPool, SandboxClaim), v1beta1.
 *
 * @param labels Labels to put on each (waffle's managed-by).
 * @returns The CRDs.
 *
 * @example
 * ```ts
 * sandboxCrds({})[0]!.metadata; // { name: "sandboxes.agents.x-k8s.io", labels: {} }
 * ```
 */
export function sandboxCrds(labels: Record<string, string>): KubeObject[] {
  return RESOURCES.map((facts) => crdOf(facts, labels));
}

/**
 * The openAPIV3Schema of a custom resource waffle renders, by apiVersion and kind.
 *
 * @param apiVersion E.g. `agents.x-k8s.io/v1beta1`.
 * @param kind E.g. `Sandbox`.
 * @returns The schema, or undefined for a kind that is not one of agent-sandbox's.
 */
export function customResourceSchema(apiVersion: string, kind: string): Schema | undefined {
  return RESOURCES.find((facts) =>
    `${facts.group}/${SANDBOX_VERSION}` === apiVersion && facts.kind === kind
  )?.schema;
}
