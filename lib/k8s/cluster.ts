/**
 * Every cluster object `waffle k8s render` prints: agent-sandbox's CRDs,
 * waffle's own namespace with the server (RBAC, config, Deployment,
 * Service) and the egress proxy, and per tenant a namespace fenced by
 * NetworkPolicies (default deny; egress only to the proxy and DNS; the
 * agent's port only from the server) with a ResourceQuota and LimitRange.
 *
 * @module
 */
import { SANDBOX_DEFAULTS } from "../config/config.ts";
import { DEFAULT_TENANT_LIMITS } from "../config/serve_schema.ts";
import { PROXY_UID } from "../egress/proxy_container.ts";
import { SANDBOX_ARTEFACT_ARGV } from "../lifecycle/posture.ts";
import { sandboxCrds } from "./crds.ts";
import { DEFAULT_NAMESPACE_PREFIX, dns1123Label, tenantNamespace } from "./names.ts";
import {
  AGENT_PORT,
  K8S_ANNOTATIONS,
  K8S_LABELS,
  type KubeObject,
  MANAGED_BY,
  SANDBOX_GROUP,
  SANDBOX_PLURAL,
} from "./sandbox_object.ts";

/** The namespace of waffle's server and egress proxy unless told otherwise. */
export const SYSTEM_NAMESPACE = "waffle-system";
/** The name of the server's Deployment, Service, ServiceAccount and RBAC objects. */
export const SERVER_NAME = "waffle-server";
/** The name of the egress proxy's Deployment and Service. */
export const EGRESS_NAME = "waffle-egress";
/** The egress proxy's port. */
export const EGRESS_PORT = 3128;
/** The server's port (E2B's API). */
export const SERVER_PORT = 3000;
/** Where the server's pods see their config file. */
export const SERVER_CONFIG_PATH = "/etc/waffle/config.toml";
/**
 * The uid the server's pods run as: neither the commands' (`SANDBOX_UID`, 10001)
 * nor the egress proxy's ({@linkcode PROXY_UID}).
 */
export const SERVER_UID = 10003;
/** Where the server's pods see that Secret (its `keys.json`). */
export const SERVER_KEYS_DIR = "/etc/waffle/keys";
/** The Secret the server's pods read their API keys from (made by the operator, not rendered). */
export const SERVER_SECRET = "waffle-server-keys";

/** What {@linkcode clusterObjects} renders. */
export interface ClusterOptions {
  /** The waffle image (server, egress proxy, sandboxes' kit and agent). */
  image: string;
  /** waffle's own namespace (default `waffle-system`). */
  namespace?: string | undefined;
  /** Tenants to make namespaces for. */
  tenants?: readonly string[] | undefined;
  /** The server's replicas (default 2). */
  replicas?: number | undefined;
  /** The workspace claims' storage class. */
  storageClassName?: string | undefined;
  /** The sandbox pods' runtime class. */
  runtimeClassName?: string | undefined;
  /** The tenants' namespaces' prefix (default `waffle-`). */
  namespacePrefix?: string | undefined;
  /** Leave out the CRDs (agent-sandbox's release installed its own). */
  noCrds?: boolean | undefined;
}

/** The managed-by label (and a component) every rendered object carries. */
function labelsOf(component: string, name?: string): Record<string, string> {
  return {
    [K8S_LABELS.managedBy]: MANAGED_BY,
    [K8S_LABELS.component]: component,
    ...(name === undefined ? {} : { [K8S_LABELS.name]: name }),
  };
}

/**
 * Every object of a waffle install, in the order to apply them: CRDs,
 * waffle's namespace and what runs in it, then each tenant's namespace and
 * its fences.
 *
 * @param options The image, namespace, tenants and classes.
 * @returns The objects.
 * @throws {UsageError} When the namespace prefix is invalid.
 *
 * @example
 * ```ts
 * const objects = clusterObjects({ image: "waffle:0.1.0", tenants: ["acme"] });
 * objects.some((o) => o.kind === "NetworkPolicy"); // true
 * ```
 */
export function clusterObjects(options: ClusterOptions): KubeObject[] {
  const system = options.namespace ?? SYSTEM_NAMESPACE;
  const prefix = options.namespacePrefix ?? DEFAULT_NAMESPACE_PREFIX;
  return [
    ...(options.noCrds ? [] : sandboxCrds(labelsOf("crd"))),
    {
      apiVersion: "v1",
      kind: "Namespace",
      metadata: { name: system, labels: labelsOf("system") },
    },
    ...serverRbac(system),
    serverConfig(system, { ...options, prefix }),
    serverDeployment(system, options),
    service(system, SERVER_NAME, SERVER_PORT),
    egressDeployment(system, options),
    service(system, EGRESS_NAME, EGRESS_PORT),
    ...[...new Set(options.tenants ?? [])].flatMap((tenant) =>
      tenantObjects(tenant, { system, prefix })
    ),
  ];
}

function serverRbac(system: string): KubeObject[] {
  const labels = labelsOf("server", SERVER_NAME);
  return [
    {
      apiVersion: "v1",
      kind: "ServiceAccount",
      metadata: { name: SERVER_NAME, namespace: system, labels },
    },
    {
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "ClusterRole",
      metadata: { name: SERVER_NAME, labels },
      rules: [
        {
          apiGroups: [SANDBOX_GROUP],
          resources: [SANDBOX_PLURAL],
          verbs: ["get", "list", "watch", "create", "patch", "delete"],
        },
        { apiGroups: [""], resources: ["secrets"], verbs: ["get", "create", "delete"] },
        // A pod whose queue a broken-into runner damaged is replaced (its claims kept).
        { apiGroups: [""], resources: ["pods"], verbs: ["delete"] },
        { apiGroups: [""], resources: ["namespaces"], verbs: ["get"] },
      ],
    },
    {
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "ClusterRoleBinding",
      metadata: { name: SERVER_NAME, labels },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: SERVER_NAME },
      subjects: [{ kind: "ServiceAccount", name: SERVER_NAME, namespace: system }],
    },
  ];
}

/**
 * The server's `config.toml`: the Kubernetes backend and where it listens.
 * The `[backend]` keys are the lead's (`lib/config`); this names those the
 * render options fill.
 *
 * @param options The image, classes and namespace prefix.
 * @returns The file's text.
 */
export function serverConfigToml(
  options: Pick<ClusterOptions, "image" | "storageClassName" | "runtimeClassName"> & {
    prefix: string;
  },
): string {
  const line = (key: string, value: string | undefined): string[] =>
    value === undefined ? [] : [`${key} = ${JSON.stringify(value)}`];
  return [
    "[backend]",
    'kind = "kubernetes"',
    ...line("namespace_prefix", options.prefix),
    ...line("waffle_image", options.image),
    ...line("storage_class", options.storageClassName),
    ...line("runtime_class", options.runtimeClassName),
    "",
    "[serve]",
    `listen = "0.0.0.0:${SERVER_PORT}"`,
    // Every replica reads the same keys: 'waffle serve key export', in the Secret.
    `keys_file = "${SERVER_KEYS_DIR}/keys.json"`,
    "",
  ].join("\n");
}

function serverConfig(
  system: string,
  options: ClusterOptions & { prefix: string },
): KubeObject {
  return {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: `${SERVER_NAME}-config`, namespace: system, labels: labelsOf("server") },
    data: { "config.toml": serverConfigToml(options) },
  };
}

// A waffle container of the system namespace: not root, no capability, a
// read-only root; the pod's own service-account token only where it is used.
function ownContainer(
  name: string,
  options: { image: string; args: string[]; port: number; uid: number },
): Record<string, unknown> {
  const probe = { tcpSocket: { port: options.port }, periodSeconds: 5 };
  return {
    name,
    image: options.image,
    command: [...SANDBOX_ARTEFACT_ARGV, ...options.args],
    env: [
      { name: "WAFFLE_HOME", value: "/var/lib/waffle" },
      { name: "DENO_DIR", value: "/tmp/.waffle-deno" },
      { name: "NO_COLOR", value: "1" },
    ],
    ports: [{ name: "http", containerPort: options.port, protocol: "TCP" }],
    securityContext: {
      runAsUser: options.uid,
      runAsGroup: options.uid,
      runAsNonRoot: true,
      privileged: false,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ["ALL"] },
    },
    resources: {
      requests: { memory: "256Mi", cpu: "250m" },
      limits: { memory: "1Gi", cpu: "2" },
    },
    readinessProbe: probe,
    livenessProbe: { ...probe, initialDelaySeconds: 10, failureThreshold: 6 },
  };
}

function podTemplate(
  name: string,
  options: { uid: number; spec: Record<string, unknown> },
): Record<string, unknown> {
  return {
    metadata: { labels: labelsOf(name === SERVER_NAME ? "server" : "egress", name) },
    spec: {
      enableServiceLinks: false,
      securityContext: { seccompProfile: { type: "RuntimeDefault" }, fsGroup: options.uid },
      ...options.spec,
    },
  };
}

function serverDeployment(system: string, options: ClusterOptions): KubeObject {
  const container = ownContainer("server", {
    image: options.image,
    // TLS ends at the cluster's ingress or mesh, in front of the Service.
    args: ["serve", "--config", SERVER_CONFIG_PATH, "--insecure-http"],
    port: SERVER_PORT,
    uid: SERVER_UID,
  });
  container.volumeMounts = [
    {
      name: "config",
      mountPath: "/etc/waffle/config.toml",
      subPath: "config.toml",
      readOnly: true,
    },
    { name: "keys", mountPath: SERVER_KEYS_DIR, readOnly: true },
    { name: "home", mountPath: "/var/lib/waffle" },
    { name: "tmp", mountPath: "/tmp" },
  ];
  return {
    apiVersion: "apps/v1",
    kind: "Deployment",
    metadata: { name: SERVER_NAME, namespace: system, labels: labelsOf("server", SERVER_NAME) },
    spec: {
      replicas: options.replicas ?? 2,
      selector: { matchLabels: { [K8S_LABELS.name]: SERVER_NAME } },
      template: podTemplate(SERVER_NAME, {
        uid: SERVER_UID,
        spec: {
          serviceAccountName: SERVER_NAME,
          automountServiceAccountToken: true,
          containers: [container],
          volumes: [
            { name: "config", configMap: { name: `${SERVER_NAME}-config` } },
            { name: "keys", secret: { secretName: SERVER_SECRET, defaultMode: 0o440 } },
            { name: "home", emptyDir: {} },
            { name: "tmp", emptyDir: { medium: "Memory", sizeLimit: "256Mi" } },
          ],
        },
      }),
    },
  };
}

function egressDeployment(system: string, options: ClusterOptions): KubeObject {
  const container = ownContainer("egress-proxy", {
    image: options.image,
    args: ["egress-proxy", "--dir", "/egress", "--audit", "/egress/audit.jsonl"],
    port: EGRESS_PORT,
    uid: PROXY_UID,
  });
  // The proxy serves per-sandbox Unix sockets under --dir today; a TCP
  // listener on EGRESS_PORT is not there yet, so no probe may wait for it.
  delete container.readinessProbe;
  delete container.livenessProbe;
  container.volumeMounts = [
    { name: "egress", mountPath: "/egress" },
    { name: "tmp", mountPath: "/tmp" },
  ];
  return {
    apiVersion: "apps/v1",
    kind: "Deployment",
    metadata: { name: EGRESS_NAME, namespace: system, labels: labelsOf("egress", EGRESS_NAME) },
    spec: {
      replicas: 1,
      selector: { matchLabels: { [K8S_LABELS.name]: EGRESS_NAME } },
      template: podTemplate(EGRESS_NAME, {
        uid: PROXY_UID,
        spec: {
          automountServiceAccountToken: false,
          containers: [container],
          volumes: [
            { name: "egress", emptyDir: {} },
            { name: "tmp", emptyDir: { medium: "Memory", sizeLimit: "64Mi" } },
          ],
        },
      }),
    },
  };
}

function service(system: string, name: string, port: number): KubeObject {
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: {
      name,
      namespace: system,
      labels: labelsOf(name === SERVER_NAME ? "server" : "egress", name),
    },
    spec: {
      type: "ClusterIP",
      selector: { [K8S_LABELS.name]: name },
      ports: [{ name: "http", port, targetPort: port, protocol: "TCP" }],
    },
  };
}

/**
 * One tenant's objects: its namespace (the tenant stored in an
 * annotation), the NetworkPolicies and the quota.
 *
 * @param tenant The tenant, exactly.
 * @param options waffle's namespace and the tenants' prefix.
 * @returns The objects.
 */
export function tenantObjects(
  tenant: string,
  options: { system: string; prefix: string },
): KubeObject[] {
  const namespace = tenantNamespace(tenant, options.prefix);
  const labels = { ...labelsOf("tenant"), [K8S_LABELS.tenant]: dns1123Label(tenant) };
  const sandboxes = { matchLabels: { [K8S_LABELS.component]: "sandbox" } };
  const inSystem = (name: string): Record<string, unknown> => ({
    namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": options.system } },
    podSelector: { matchLabels: { [K8S_LABELS.name]: name } },
  });
  const policy = (name: string, spec: Record<string, unknown>): KubeObject => ({
    apiVersion: "networking.k8s.io/v1",
    kind: "NetworkPolicy",
    metadata: { name, namespace, labels },
    spec,
  });
  return [
    {
      apiVersion: "v1",
      kind: "Namespace",
      metadata: {
        name: namespace,
        // The runner's capabilities (SETUID, SETGID, KILL) are within "baseline".
        labels: { ...labels, "pod-security.kubernetes.io/enforce": "baseline" },
        annotations: { [K8S_ANNOTATIONS.tenant]: tenant },
      },
    },
    policy("default-deny", { podSelector: {}, policyTypes: ["Ingress", "Egress"] }),
    policy("sandbox-egress", {
      podSelector: sandboxes,
      policyTypes: ["Egress"],
      egress: [
        { to: [inSystem(EGRESS_NAME)], ports: [{ protocol: "TCP", port: EGRESS_PORT }] },
        {
          to: [{
            namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "kube-system" } },
            podSelector: { matchLabels: { "k8s-app": "kube-dns" } },
          }],
          ports: [{ protocol: "UDP", port: 53 }, { protocol: "TCP", port: 53 }],
        },
      ],
    }),
    policy("sandbox-agent-ingress", {
      podSelector: sandboxes,
      policyTypes: ["Ingress"],
      ingress: [{ from: [inSystem(SERVER_NAME)], ports: [{ protocol: "TCP", port: AGENT_PORT }] }],
    }),
    ...tenantQuota(namespace, labels),
  ];
}

// What a tenant may hold at once: its sandboxes (`[serve.tenants]`'s
// default) each at the default size, plus each pod's agent and kit.
function tenantQuota(namespace: string, labels: Record<string, string>): KubeObject[] {
  const count = DEFAULT_TENANT_LIMITS.maxSandboxes;
  const mib = 1024 * 1024;
  const memory = SANDBOX_DEFAULTS.memoryBytes;
  const cpuMilli = Math.round(SANDBOX_DEFAULTS.cpus * 1000);
  const disk = SANDBOX_DEFAULTS.quotaBytes;
  // The agent's limit (256 MiB, 1 CPU) beside the runner's, per pod.
  const podMemory = memory + 256 * mib;
  const podCpu = cpuMilli + 1000;
  return [
    {
      apiVersion: "v1",
      kind: "ResourceQuota",
      metadata: { name: "waffle-quota", namespace, labels },
      spec: {
        hard: {
          pods: String(count),
          "requests.cpu": `${count * podCpu}m`,
          "requests.memory": String(count * podMemory),
          "limits.cpu": `${count * podCpu}m`,
          "limits.memory": String(count * podMemory),
          persistentvolumeclaims: String(count),
          "requests.storage": String(count * disk),
        },
      },
    },
    {
      apiVersion: "v1",
      kind: "LimitRange",
      metadata: { name: "waffle-limits", namespace, labels },
      spec: {
        limits: [
          {
            type: "Container",
            max: { memory: String(memory), cpu: `${cpuMilli}m` },
            default: { memory: "256Mi", cpu: "250m" },
            defaultRequest: { memory: "64Mi", cpu: "50m" },
          },
          { type: "PersistentVolumeClaim", max: { storage: String(disk) } },
        ],
      },
    },
  ];
}
