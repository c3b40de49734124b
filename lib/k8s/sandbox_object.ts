/**
 * A waffle sandbox as an agent-sandbox `Sandbox` object: the one place that
 * builds it (and its Secret) and the one place that reads one back from the
 * API server. Everything the server needs to remember about a sandbox is in
 * the object (labels, annotations, the Secret's name), so the server keeps
 * no state of its own; the pod carries today's container posture (uids,
 * capabilities, read-only root, limits, no service-account token, no
 * shared process namespace).
 *
 * @module
 */
import * as z from "../schema.ts";
import { WaffleError } from "../errors.ts";
import {
  RUNNER_CACHE,
  RUNNER_CAPS,
  RUNNER_DIR,
  runnerArguments,
  SANDBOX_ARTEFACT_ARGV,
} from "../lifecycle/posture.ts";
import { RUNNER_V8_FLAGS } from "../config/self.ts";
import {
  IMAGE_ENV_VARIABLE,
  IMAGE_WORKDIR_VARIABLE,
  PROGRAM_DIR,
  SANDBOX_ARTEFACT_DIR,
  SANDBOX_CHANNEL_DIR,
  SANDBOX_RUNTIME,
} from "../config/sandbox_paths.ts";
import { dns1123Label, sandboxObjectName, sandboxSecretName, workspaceClaimName } from "./names.ts";

/** agent-sandbox's API group of `Sandbox`. */
export const SANDBOX_GROUP = "agents.x-k8s.io";
/** The version of `Sandbox` waffle writes. */
export const SANDBOX_VERSION = "v1beta1";
/** `apiVersion` of a `Sandbox`. */
export const SANDBOX_API_VERSION = `${SANDBOX_GROUP}/${SANDBOX_VERSION}`;
/** The resource's plural (its REST path). */
export const SANDBOX_PLURAL = "sandboxes";
/** The kind. */
export const SANDBOX_KIND = "Sandbox";
/** The agent's port in the pod: E2B's envd port, so a sandbox URL's port means the same. */
export const AGENT_PORT = 49983;
/** The header carrying the per-sandbox agent token on every request to the agent. */
export const AGENT_TOKEN_HEADER = "x-waffle-agent-token";
/**
 * The header on an agent's answer when its pod cannot serve the queue any
 * more (a damaged runner-side file): the server then replaces the pod.
 */
export const AGENT_RECYCLE_HEADER = "x-waffle-recycle";
/** The value of {@linkcode K8S_LABELS}.managedBy on everything waffle makes. */
export const MANAGED_BY = "waffle";

/** Labels on waffle's Kubernetes objects (values: DNS-safe, see `names.ts`). */
export const K8S_LABELS = {
  managedBy: "app.kubernetes.io/managed-by",
  component: "app.kubernetes.io/component",
  name: "app.kubernetes.io/name",
  id: "waffle.dev/id",
  /** The tenant as a DNS label (the exact tenant is in the annotation). */
  tenant: "waffle.dev/tenant",
} as const;

/** Annotations of a `Sandbox`: what the server reads back, stored once. */
export const K8S_ANNOTATIONS = {
  tenant: "waffle.dev/tenant",
  keyId: "waffle.dev/key-id",
  template: "waffle.dev/template",
  image: "waffle.dev/image",
  /** JSON object of strings. */
  metadata: "waffle.dev/metadata",
  /** Milliseconds since the epoch. */
  startedAt: "waffle.dev/started-at",
  /** Milliseconds since the epoch. */
  endAt: "waffle.dev/end-at",
  /** JSON, optional. */
  network: "waffle.dev/network",
  secret: "waffle.dev/secret",
  claim: "waffle.dev/claim",
} as const;

/** The keys of a sandbox's Secret. */
export const SECRET_KEYS = {
  /** E2B's envd access token. */
  accessToken: "access-token",
  /** What the server sends the agent in {@linkcode AGENT_TOKEN_HEADER}. */
  agentToken: "agent-token",
  /** The sandbox's environment variables, a JSON object. */
  envVars: "env-vars.json",
} as const;

/** Where the agent sees the sandbox's Secret. */
export const AGENT_SECRETS_DIR = "/var/run/waffle";
/** The agent's own directory (its processes' journal): its tmp emptyDir, which outlives a restart of its container. */
export const AGENT_STATE_DIR = "/tmp/agent";
/** Where the init container copies the kit to (the `waffle-kit` volume). */
export const KIT_DIR = "/kit";
/** The name of the workspace's volume claim template (and so of the pod's volume). */
export const WORKSPACE_VOLUME = "workspace";

/** A sandbox's limits, as the config resolves them. */
export interface SandboxLimits {
  /** Memory (request = limit), bytes. */
  memoryBytes: number;
  /** CPUs (request = limit). */
  cpus: number;
  /** The workspace claim's size, bytes. */
  diskBytes: number;
  /** The /tmp emptyDir's size limit, bytes. */
  tmpBytes: number;
}

/** What {@linkcode sandboxObject} builds a Sandbox from. */
export interface SandboxObjectInput {
  /** The sandbox id (E2B's). */
  id: string;
  /** The tenant's namespace (`tenantNamespace`), as stored. */
  namespace: string;
  /** The tenant, exactly. */
  tenant: string;
  /** The API key's id that created it. */
  keyId: string;
  /** The template's name. */
  template: string;
  /** The user's image reference (the runner's container). */
  image: string;
  /** The waffle image reference (the kit and the agent). */
  waffleImage: string;
  /** E2B metadata. */
  metadata: Record<string, string>;
  /** Start, ms since the epoch. */
  startedAt: number;
  /** End of life, ms since the epoch. */
  endAt: number;
  /** The sandbox's network ask (JSON), when it made one. */
  network?: unknown;
  /** Limits. */
  limits: SandboxLimits;
  /** The pod's runtime class (gVisor, Kata). */
  runtimeClassName?: string | undefined;
  /** The workspace claim's storage class (default: the cluster's). */
  storageClassName?: string | undefined;
}

/** A Kubernetes object as plain JSON. */
export type KubeObject = Record<string, unknown> & {
  apiVersion: string;
  kind: string;
  metadata: Record<string, unknown>;
};

/**
 * The labels of everything made for one sandbox.
 *
 * @param id The sandbox id.
 * @param tenant The tenant, exactly (its DNS-safe form goes in the label).
 * @returns The labels.
 */
export function sandboxLabels(id: string, tenant: string): Record<string, string> {
  return {
    [K8S_LABELS.managedBy]: MANAGED_BY,
    [K8S_LABELS.component]: "sandbox",
    [K8S_LABELS.id]: id,
    [K8S_LABELS.tenant]: dns1123Label(tenant),
  };
}

/**
 * The `Sandbox` of one waffle sandbox, as the contract's "The pod" says:
 * a `runner` container (the user's image, waffle's kit mounted read-only),
 * a `waffle-agent` container (the waffle image), the `waffle-kit` init
 * container, emptyDirs for the queue and channel, a `workspace` claim.
 *
 * @param input The sandbox.
 * @returns The object, ready to create.
 * @throws {UsageError} When the id cannot name Kubernetes objects.
 *
 * @example
 * ```ts
 * const sandbox = sandboxObject({
 *   id: "i1a2b3c4d5e6f7g8h9j0", namespace: "waffle-acme", tenant: "acme", keyId: "k_1",
 *   template: "base", image: "python:3.12", waffleImage: "waffle:0.1.0", metadata: {},
 *   startedAt: 0, endAt: 300_000,
 *   limits: { memoryBytes: 2 ** 30, cpus: 1, diskBytes: 2 ** 30, tmpBytes: 2 ** 26 },
 * });
 * sandbox.metadata.name; // "wfl-i1a2b3c4d5e6f7g8h9j0"
 * ```
 */
export function sandboxObject(input: SandboxObjectInput): KubeObject {
  const name = sandboxObjectName(input.id);
  const labels = sandboxLabels(input.id, input.tenant);
  const annotations: Record<string, string> = {
    [K8S_ANNOTATIONS.tenant]: input.tenant,
    [K8S_ANNOTATIONS.keyId]: input.keyId,
    [K8S_ANNOTATIONS.template]: input.template,
    [K8S_ANNOTATIONS.image]: input.image,
    [K8S_ANNOTATIONS.metadata]: JSON.stringify(input.metadata),
    [K8S_ANNOTATIONS.startedAt]: String(input.startedAt),
    [K8S_ANNOTATIONS.endAt]: String(input.endAt),
    ...(input.network === undefined
      ? {}
      : { [K8S_ANNOTATIONS.network]: JSON.stringify(input.network) }),
    [K8S_ANNOTATIONS.secret]: sandboxSecretName(name),
    [K8S_ANNOTATIONS.claim]: workspaceClaimName(name),
  };
  return {
    apiVersion: SANDBOX_API_VERSION,
    kind: SANDBOX_KIND,
    metadata: { name, namespace: input.namespace, labels, annotations },
    spec: {
      operatingMode: "Running",
      service: false,
      volumeClaimTemplates: [workspaceClaimTemplate(input)],
      podTemplate: { metadata: { labels }, spec: podSpec(input, name) },
    },
  };
}

function workspaceClaimTemplate(input: SandboxObjectInput): Record<string, unknown> {
  return {
    metadata: { name: WORKSPACE_VOLUME },
    spec: {
      accessModes: ["ReadWriteOnce"],
      resources: { requests: { storage: String(input.limits.diskBytes) } },
      ...(input.storageClassName === undefined ? {} : { storageClassName: input.storageClassName }),
    },
  };
}

// The pod: no token, no host namespaces, no shared process namespace, the
// runtime's default seccomp profile.
function podSpec(input: SandboxObjectInput, name: string): Record<string, unknown> {
  return {
    automountServiceAccountToken: false,
    enableServiceLinks: false,
    shareProcessNamespace: false,
    hostNetwork: false,
    hostPID: false,
    hostIPC: false,
    ...(input.runtimeClassName === undefined ? {} : { runtimeClassName: input.runtimeClassName }),
    terminationGracePeriodSeconds: 10,
    restartPolicy: "Always",
    securityContext: { seccompProfile: { type: "RuntimeDefault" } },
    initContainers: [kitContainer(input)],
    containers: [runnerContainer(input), agentContainer(input)],
    volumes: podVolumes(input, name),
  };
}

function podVolumes(input: SandboxObjectInput, name: string): Record<string, unknown>[] {
  const memory = (sizeLimit?: string): Record<string, unknown> => ({
    emptyDir: { medium: "Memory", ...(sizeLimit === undefined ? {} : { sizeLimit }) },
  });
  return [
    // Disk-backed: the kit holds Deno and the artefact (~150 MB).
    { name: "waffle-kit", emptyDir: { sizeLimit: "1Gi" } },
    // The queue's SQLite files need a node-local file system with POSIX locks.
    { name: "waffle-inbound", emptyDir: {} },
    // Written by the runner (and so by whoever broke into it): capped.
    { name: "waffle-outbound", emptyDir: { sizeLimit: "2Gi" } },
    { name: "waffle-channel", ...memory("16Mi") },
    { name: "waffle-tmp", ...memory(String(input.limits.tmpBytes)) },
    { name: "waffle-run", ...memory("128Mi") },
    { name: "waffle-agent-tmp", ...memory("64Mi") },
    {
      name: "waffle-secrets",
      secret: { secretName: sandboxSecretName(name), defaultMode: 0o400 },
    },
  ];
}

function kitContainer(input: SandboxObjectInput): Record<string, unknown> {
  return {
    name: "waffle-kit",
    image: input.waffleImage,
    command: [
      ...SANDBOX_ARTEFACT_ARGV,
      "k8s",
      "kit",
      "--to",
      KIT_DIR,
      "--workspace",
      "/workspace",
      // As a Docker sandbox's tmpfs mounts are: the runner's scratch its
      // own, /tmp shared with a sticky bit.
      "--mode",
      `${RUNNER_DIR}=700`,
      "--mode",
      "/tmp=1777",
    ],
    securityContext: {
      ...ownSecurityContext(),
      // Only to give a fresh claim's root to the commands' uid.
      capabilities: { drop: ["ALL"], add: ["CHOWN"] },
    },
    resources: {
      requests: { memory: "256Mi", cpu: "100m" },
      limits: { memory: "256Mi", cpu: "1" },
    },
    volumeMounts: [
      { name: "waffle-kit", mountPath: KIT_DIR },
      { name: WORKSPACE_VOLUME, mountPath: "/workspace" },
      { name: "waffle-run", mountPath: RUNNER_DIR },
      { name: "waffle-tmp", mountPath: "/tmp" },
    ],
  };
}

// What the runner's container sees of the kit: each at the path the
// artefact expects, read-only; /etc/ld.so.preload an empty file so the
// kit's loader preloads nothing into the root runner.
function kitMounts(): Record<string, unknown>[] {
  const kit = (subPath: string, mountPath: string): Record<string, unknown> => ({
    name: "waffle-kit",
    subPath,
    mountPath,
    readOnly: true,
  });
  return [
    kit("deno", `${PROGRAM_DIR}/deno`),
    kit("rt", SANDBOX_RUNTIME),
    kit("app", SANDBOX_ARTEFACT_DIR),
    kit("cache", RUNNER_CACHE),
    kit("empty", "/etc/ld.so.preload"),
  ];
}

/**
 * Variables an image may set that would reach the root runner before it
 * runs a command: set empty here, since a container's own env wins over
 * its image's (in Docker `maskImageEnv` masks every one the image names; a
 * pod cannot know them). Deno refuses an empty DENO_V8_FLAGS: it gets the
 * runner's own.
 */
const MASKED_IMAGE_ENV: readonly [string, string][] = [
  ["LD_PRELOAD", ""],
  ["LD_AUDIT", ""],
  ["LD_LIBRARY_PATH", ""],
  ["DENO_V8_FLAGS", RUNNER_V8_FLAGS.slice("--v8-flags=".length)],
  ["DENO_CERT", ""],
  ["DENO_TLS_CA_STORE", ""],
  ["DENO_AUTH_TOKENS", ""],
  ["NPM_CONFIG_REGISTRY", ""],
];

function runnerContainer(input: SandboxObjectInput): Record<string, unknown> {
  const cpu = `${Math.max(1, Math.round(input.limits.cpus * 1000))}m`;
  const memory = String(input.limits.memoryBytes);
  const env: [string, string][] = [
    ["PATH", "/usr/local/bin:/usr/bin:/bin"],
    ["HOME", RUNNER_DIR],
    ["DENO_DIR", RUNNER_CACHE],
    ["DENO_NO_UPDATE_CHECK", "1"],
    ["NO_COLOR", "1"],
    ["WAFFLE_PASS_ENV", ""],
    // The image's own Env is not known to a pod spec.
    [IMAGE_ENV_VARIABLE, "[]"],
    [IMAGE_WORKDIR_VARIABLE, "/workspace"],
    ...MASKED_IMAGE_ENV,
  ];
  return {
    name: "runner",
    image: input.image,
    command: [...SANDBOX_ARTEFACT_ARGV, ...runnerArguments({ idleSeconds: 0 })],
    workingDir: "/workspace",
    env: env.map(([name, value]) => ({ name, value })),
    securityContext: {
      ...ownSecurityContext(),
      capabilities: { drop: ["ALL"], add: [...RUNNER_CAPS] },
    },
    resources: { requests: { memory, cpu }, limits: { memory, cpu } },
    volumeMounts: [
      ...kitMounts(),
      { name: "waffle-inbound", mountPath: "/queue/inbound", readOnly: true },
      { name: "waffle-outbound", mountPath: "/queue/outbound" },
      { name: "waffle-channel", mountPath: SANDBOX_CHANNEL_DIR, readOnly: true },
      { name: WORKSPACE_VOLUME, mountPath: "/workspace" },
      { name: "waffle-tmp", mountPath: "/tmp" },
      { name: "waffle-run", mountPath: RUNNER_DIR },
    ],
  };
}

function agentContainer(input: SandboxObjectInput): Record<string, unknown> {
  return {
    name: "waffle-agent",
    image: input.waffleImage,
    command: [
      ...SANDBOX_ARTEFACT_ARGV,
      "agent",
      "--queue",
      "/queue",
      "--channel",
      SANDBOX_CHANNEL_DIR,
      "--listen",
      `0.0.0.0:${AGENT_PORT}`,
      "--secrets",
      AGENT_SECRETS_DIR,
      "--state",
      AGENT_STATE_DIR,
    ],
    env: [{ name: "WAFFLE_SANDBOX_ID", value: input.id }],
    ports: [{ name: "envd", containerPort: AGENT_PORT, protocol: "TCP" }],
    readinessProbe: {
      tcpSocket: { port: AGENT_PORT },
      periodSeconds: 1,
      failureThreshold: 3,
    },
    securityContext: ownSecurityContext(),
    resources: {
      requests: { memory: "64Mi", cpu: "50m" },
      limits: { memory: "256Mi", cpu: "1" },
    },
    volumeMounts: [
      { name: "waffle-inbound", mountPath: "/queue/inbound" },
      { name: "waffle-outbound", mountPath: "/queue/outbound" },
      { name: "waffle-channel", mountPath: SANDBOX_CHANNEL_DIR },
      { name: "waffle-secrets", mountPath: AGENT_SECRETS_DIR, readOnly: true },
      { name: "waffle-agent-tmp", mountPath: "/tmp" },
    ],
  };
}

// waffle's own containers (kit, agent): root of the container without a
// single capability, read-only root, no privilege escalation.
function ownSecurityContext(): Record<string, unknown> {
  return {
    runAsUser: 0,
    runAsGroup: 0,
    runAsNonRoot: false,
    privileged: false,
    allowPrivilegeEscalation: false,
    readOnlyRootFilesystem: true,
    capabilities: { drop: ["ALL"] },
  };
}

/** What {@linkcode sandboxSecret} holds. */
export interface SandboxSecretInput {
  /** The sandbox id. */
  id: string;
  /** The tenant's namespace. */
  namespace: string;
  /** The tenant, exactly. */
  tenant: string;
  /** E2B's envd access token. */
  accessToken: string;
  /** The agent token. */
  agentToken: string;
  /** The sandbox's environment variables. */
  envVars: Record<string, string>;
}

/**
 * The Secret of one sandbox (`<name>-waffle`): its tokens and variables,
 * mounted into the agent only.
 *
 * @param input The sandbox and its secrets.
 * @returns The Secret.
 * @throws {UsageError} When the id cannot name Kubernetes objects.
 *
 * @example
 * ```ts
 * const secret = sandboxSecret({
 *   id: "i1a2b3c4d5e6f7g8h9j0", namespace: "waffle-acme", tenant: "acme",
 *   accessToken: "a", agentToken: "b", envVars: {},
 * });
 * secret.metadata.name; // "wfl-i1a2b3c4d5e6f7g8h9j0-waffle"
 * ```
 */
export function sandboxSecret(input: SandboxSecretInput): KubeObject {
  const name = sandboxSecretName(sandboxObjectName(input.id));
  return {
    apiVersion: "v1",
    kind: "Secret",
    metadata: { name, namespace: input.namespace, labels: sandboxLabels(input.id, input.tenant) },
    type: "Opaque",
    stringData: {
      [SECRET_KEYS.accessToken]: input.accessToken,
      [SECRET_KEYS.agentToken]: input.agentToken,
      [SECRET_KEYS.envVars]: JSON.stringify(input.envVars),
    },
  };
}

/** A Sandbox read back from the API server. */
export interface StoredSandbox {
  id: string;
  namespace: string;
  name: string;
  tenant: string;
  keyId: string;
  template: string;
  image: string;
  metadata: Record<string, string>;
  startedAt: number;
  endAt: number;
  /** The stored network ask, or undefined when none was stored. */
  network: unknown;
  /** `spec.operatingMode` is `Suspended`. */
  suspended: boolean;
  /** The `Ready` condition is `True`. */
  ready: boolean;
  /** `status.podIPs[0]`, while a pod exists. */
  podIP: string | undefined;
  serviceFQDN: string | undefined;
  secretName: string;
  claimName: string;
  resourceVersion: string | undefined;
}

/** A Sandbox read back from the API server is not one waffle made, or was altered. */
export class SandboxObjectError extends WaffleError {
  /** Takes the same arguments as the {@linkcode WaffleError} constructor. */
  constructor(message: string, options: ConstructorParameters<typeof WaffleError>[1] = {}) {
    super(message, options);
    this.name = "SandboxObjectError";
  }
}

const millis = z.string().check(z.regex(/^(0|[1-9][0-9]{0,15})$/));
const stored = z.object({
  apiVersion: z.literal(SANDBOX_API_VERSION),
  kind: z.literal(SANDBOX_KIND),
  metadata: z.object({
    name: z.string(),
    namespace: z.string(),
    resourceVersion: z.optional(z.string()),
    labels: z.object({ [K8S_LABELS.id]: z.string() }),
    annotations: z.object({
      [K8S_ANNOTATIONS.tenant]: z.string(),
      [K8S_ANNOTATIONS.keyId]: z.string(),
      [K8S_ANNOTATIONS.template]: z.string(),
      [K8S_ANNOTATIONS.image]: z.string(),
      [K8S_ANNOTATIONS.metadata]: z.string(),
      [K8S_ANNOTATIONS.startedAt]: millis,
      [K8S_ANNOTATIONS.endAt]: millis,
      [K8S_ANNOTATIONS.network]: z.optional(z.string()),
      [K8S_ANNOTATIONS.secret]: z.string(),
      [K8S_ANNOTATIONS.claim]: z.string(),
    }),
  }),
  spec: z.object({ operatingMode: z.optional(z.enum(["Running", "Suspended"])) }),
  status: z.optional(z.object({
    conditions: z.optional(z.array(z.object({ type: z.string(), status: z.string() }))),
    podIPs: z.optional(z.array(z.string())),
    serviceFQDN: z.optional(z.string()),
  })),
});

/**
 * Reads a Sandbox as the API server returns it: what waffle stored in it
 * (never recomputed: the namespace and names are the object's own) and
 * what agent-sandbox's controller reports.
 *
 * @param object The object (JSON).
 * @returns The sandbox's record.
 * @throws {SandboxObjectError} Naming the first thing that is wrong, in one line.
 *
 * @example
 * ```ts
 * readSandboxObject(sandboxObject(input)).suspended; // false
 * ```
 */
export function readSandboxObject(object: unknown): StoredSandbox {
  const parsed = z.safeParse(stored, object);
  const where = describe(object);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const path = issue.path.map(String).join(".") || "(object)";
    throw new SandboxObjectError(`Sandbox ${where} is not waffle's: '${path}' ${issue.message}`);
  }
  const { metadata, spec, status } = parsed.data;
  const notes = metadata.annotations;
  const json = (key: string, text: string): unknown => {
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new SandboxObjectError(
        `Sandbox ${where} is not waffle's: annotation '${key}' is not JSON`,
        { cause: error },
      );
    }
  };
  const meta = json(K8S_ANNOTATIONS.metadata, notes[K8S_ANNOTATIONS.metadata]);
  if (!isStringRecord(meta)) {
    throw new SandboxObjectError(
      `Sandbox ${where} is not waffle's: annotation '${K8S_ANNOTATIONS.metadata}' is not an object of strings`,
    );
  }
  const network = notes[K8S_ANNOTATIONS.network];
  return {
    id: metadata.labels[K8S_LABELS.id],
    namespace: metadata.namespace,
    name: metadata.name,
    tenant: notes[K8S_ANNOTATIONS.tenant],
    keyId: notes[K8S_ANNOTATIONS.keyId],
    template: notes[K8S_ANNOTATIONS.template],
    image: notes[K8S_ANNOTATIONS.image],
    metadata: meta,
    startedAt: Number(notes[K8S_ANNOTATIONS.startedAt]),
    endAt: Number(notes[K8S_ANNOTATIONS.endAt]),
    network: network === undefined ? undefined : json(K8S_ANNOTATIONS.network, network),
    suspended: spec.operatingMode === "Suspended",
    ready: status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false,
    podIP: status?.podIPs?.[0],
    serviceFQDN: status?.serviceFQDN || undefined,
    secretName: notes[K8S_ANNOTATIONS.secret],
    claimName: notes[K8S_ANNOTATIONS.claim],
    resourceVersion: metadata.resourceVersion,
  };
}

function isStringRecord(value: unknown): value is Record<string, string> {
  return typeof value === "object" && value !== null && !Array.isArray(value) &&
    Object.values(value).every((entry) => typeof entry === "string");
}

// `namespace/name` of an object for a message, as far as it has them.
function describe(object: unknown): string {
  const metadata = (object as { metadata?: { name?: unknown; namespace?: unknown } } | null)
    ?.metadata;
  const part = (value: unknown): string => typeof value === "string" ? value.slice(0, 253) : "?";
  return `'${part(metadata?.namespace)}/${part(metadata?.name)}'`;
}
