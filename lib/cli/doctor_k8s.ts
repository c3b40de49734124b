/**
 * `waffle doctor`'s rows for a server whose `[backend] kind = "kubernetes"`:
 * the credentials load, the API server answers a list of agent-sandbox
 * `Sandbox` objects (so the CRD is installed and this identity may read
 * them), and what the config names for the pods.
 *
 * @module
 */
import { loadWaffleConfig } from "../config/config.ts";
import { KubeApi } from "../k8s/client.ts";
import { K8S_LABELS, MANAGED_BY } from "../k8s/sandbox_object.ts";
import type { DoctorCheck } from "./doctor.ts";

/**
 * The Kubernetes rows, or none when the config's backend is Docker.
 *
 * @param options The config file (absent: the home's).
 * @returns The checks.
 */
export function kubernetesChecks(options: { configPath?: string | undefined }): DoctorCheck[] {
  const config = loadWaffleConfig({ configPath: options.configPath });
  const backend = config.serve.backend;
  if (backend.kind !== "kubernetes") return [];
  let api: Promise<KubeApi> | undefined;
  const opened = (): Promise<KubeApi> =>
    api ??= KubeApi.open({ kubeconfig: backend.kubeconfig, context: backend.context });
  return [
    {
      name: "kubernetes credentials",
      run: async () => {
        await opened();
        return backend.kubeconfig === undefined
          ? "in-cluster service account"
          : `kubeconfig '${backend.kubeconfig}'${
            backend.context === undefined ? "" : `, context '${backend.context}'`
          }`;
      },
    },
    {
      name: "kubernetes sandboxes",
      timeoutMs: 20_000,
      run: async () => {
        const { items } = await (await opened()).listSandboxes(
          `${K8S_LABELS.managedBy}=${MANAGED_BY}`,
        );
        return `agent-sandbox Sandbox objects readable: ${items.length} of waffle's; ` +
          `pods run '${backend.waffleImage}' beside each image, namespaces '${backend.namespacePrefix}<tenant>'`;
      },
    },
  ];
}
