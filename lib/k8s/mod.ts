/**
 * waffle's sandboxes on Kubernetes: the names, the `Sandbox` object and its
 * Secret, agent-sandbox's CRDs, the cluster objects `waffle k8s render`
 * prints and their validation, the API client, the pod's own sandbox (the
 * agent's), and the waffle image that carries waffle into each pod.
 *
 * @module
 */
export {
  DEFAULT_NAMESPACE_PREFIX,
  DNS1123_LABEL_MAX,
  DNS1123_SUBDOMAIN_MAX,
  dns1123Label,
  isDns1123Label,
  isDns1123Subdomain,
  isLabelKey,
  isLabelValue,
  LABEL_VALUE_MAX,
  sandboxObjectName,
  sandboxSecretName,
  tenantNamespace,
  workspaceClaimName,
} from "./names.ts";
export {
  AGENT_PORT,
  AGENT_RECYCLE_HEADER,
  AGENT_SECRETS_DIR,
  AGENT_TOKEN_HEADER,
  K8S_ANNOTATIONS,
  K8S_LABELS,
  KIT_DIR,
  type KubeObject,
  MANAGED_BY,
  readSandboxObject,
  SANDBOX_API_VERSION,
  SANDBOX_GROUP,
  SANDBOX_KIND,
  SANDBOX_PLURAL,
  SANDBOX_VERSION,
  sandboxLabels,
  type SandboxLimits,
  sandboxObject,
  SandboxObjectError,
  type SandboxObjectInput,
  sandboxSecret,
  type SandboxSecretInput,
  SECRET_KEYS,
  type StoredSandbox,
  WORKSPACE_VOLUME,
} from "./sandbox_object.ts";
export { customResourceSchema, EXTENSIONS_GROUP, SANDBOX_SCHEMA, sandboxCrds } from "./crds.ts";
export {
  clusterObjects,
  type ClusterOptions,
  EGRESS_NAME,
  EGRESS_PORT,
  SERVER_CONFIG_PATH,
  SERVER_NAME,
  SERVER_PORT,
  SERVER_SECRET,
  SERVER_UID,
  serverConfigToml,
  SYSTEM_NAMESPACE,
  tenantObjects,
} from "./cluster.ts";
export { InvalidObjectError, validateObject } from "./validate.ts";
export { toYaml, toYamlDocuments } from "./yaml.ts";
export { KubeApi, type KubeApiOptions, type WatchEvent } from "./client.ts";
export { openPodSandbox, type PodSandbox, type PodSandboxOptions } from "./pod_sandbox.ts";
export {
  type BuildImageOptions,
  buildWaffleImage,
  copyKit,
  KIT_ENTRIES,
  WAFFLE_IMAGE_ARTEFACT_LABEL,
  WAFFLE_IMAGE_REPO,
  type WaffleImage,
} from "./image.ts";
