/**
 * `waffle k8s render`: every object of a waffle install on Kubernetes,
 * validated, as YAML documents or one JSON `List`. (`k8s image` and
 * `k8s kit` are `k8s_image.ts`'s.)
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import { EXIT_WAFFLE } from "../exit_codes.ts";
import { WAFFLE_VERSION } from "../config/version.ts";
import { checkId } from "../config/sandbox_key.ts";
import { clusterObjects } from "../k8s/cluster.ts";
import { isDns1123Label, isDns1123Subdomain, tenantNamespace } from "../k8s/names.ts";
import { InvalidObjectError, validateObject } from "../k8s/validate.ts";
import { toYamlDocuments } from "../k8s/yaml.ts";
import { noPositionals, numberFlag, parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle k8s`. */
export const K8S_HELP = `Usage: waffle k8s <command> [options]

Commands:
  render   print every object of a waffle install on Kubernetes
  image    make the waffle image (the installed artefact) for the pods
  kit      (internal) copy the image's kit into a pod's volume

Run 'waffle k8s <command> --help' for its options.
`;

/** Help of `waffle k8s render`. */
export const RENDER_HELP =
  `Usage: waffle k8s render [--namespace NS] [--tenant NAME]... [--image REF]
                         [--replicas N] [--storage-class C] [--runtime-class R]
                         [--no-crds] [--json]

Prints every object of a waffle install on Kubernetes, each validated first
(Kubernetes' OpenAPI schema, agent-sandbox's CRD schema, DNS-1123 names):
agent-sandbox's CRDs; waffle's namespace with the server's RBAC, config,
Deployment and Service and the egress proxy; and per tenant a namespace
with default-deny NetworkPolicies, a ResourceQuota and a LimitRange.
Apply with 'kubectl apply -f -'. An invalid object is an error, and
nothing is printed.

Options:
  --namespace NS       waffle's own namespace (default: waffle-system)
  --tenant NAME        a tenant to make a namespace for (repeatable)
  --image REF          the waffle image (default: waffle:${WAFFLE_VERSION})
  --replicas N         the server's replicas (default: 2)
  --storage-class C    the workspace claims' storage class (default: the cluster's)
  --runtime-class R    the sandbox pods' runtime class (gVisor, Kata)
  --no-crds            leave out agent-sandbox's CRDs (its release installed them)
  --json               one JSON List instead of YAML documents
`;

/**
 * Runs `waffle k8s <command>`.
 *
 * @param args Arguments after `k8s`.
 * @param io Process streams.
 * @returns The exit status.
 * @throws {UsageError} On an unknown command or a bad flag.
 */
export async function k8sCommand(args: string[], io: CliIo): Promise<number> {
  const [command, ...rest] = args;
  if (command === undefined || command === "--help" || command === "-h") {
    await io.stdout(K8S_HELP);
    return command === undefined ? EXIT_WAFFLE : 0;
  }
  if (command === "image" || command === "kit") {
    const { k8sImageCommand, k8sKitCommand } = await import("./k8s_image.ts");
    return await (command === "image" ? k8sImageCommand : k8sKitCommand)(rest, io);
  }
  if (command !== "render") {
    throw new UsageError(`Unknown command 'k8s ${command}'; run 'waffle k8s --help'`);
  }
  if (rest.includes("--help") || rest.includes("-h")) {
    await io.stdout(RENDER_HELP);
    return 0;
  }
  return await renderCommand(rest, io);
}

/**
 * Runs `waffle k8s render`.
 *
 * @param args Arguments after `render`.
 * @param io Process streams.
 * @returns 0.
 * @throws {UsageError} On a bad flag.
 * @throws {InvalidObjectError} When a rendered object does not validate (nothing printed).
 */
export async function renderCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    namespace: { type: "string" },
    tenant: { type: "string", multiple: true },
    image: { type: "string" },
    replicas: { type: "string" },
    "storage-class": { type: "string" },
    "runtime-class": { type: "string" },
    "no-crds": { type: "boolean" },
    json: { type: "boolean" },
  });
  noPositionals(parsed.positionals);
  const namespace = stringFlag(parsed, "namespace") ?? "waffle-system";
  if (!isDns1123Label(namespace)) {
    throw new UsageError(
      `Invalid --namespace '${namespace}': use 1-63 of a-z 0-9 - starting and ending with a letter or digit`,
    );
  }
  const image = stringFlag(parsed, "image") ?? `waffle:${WAFFLE_VERSION}`;
  if (image === "" || image.length > 256 || /\s/.test(image)) {
    throw new UsageError(`Invalid --image '${image}': use 1-256 characters without spaces`);
  }
  const tenants = (parsed.values.tenant as string[] | undefined ?? []).map((tenant) =>
    checkId("tenant id", tenant)
  );
  refuseNamespaceClash(tenants, namespace);
  const objects = clusterObjects({
    image,
    namespace,
    tenants,
    replicas: numberFlag(parsed, "replicas", { integer: true, max: 100 }) ?? 2,
    storageClassName: className(parsed, "storage-class"),
    runtimeClassName: className(parsed, "runtime-class"),
    noCrds: parsed.values["no-crds"] === true,
  });
  const problems = (await Promise.all(objects.map(validateObject))).flat();
  if (problems.length > 0) throw new InvalidObjectError(problems);
  await io.stdout(
    parsed.values.json === true
      ? `${JSON.stringify({ apiVersion: "v1", kind: "List", items: objects }, null, 2)}\n`
      : toYamlDocuments(objects),
  );
  return 0;
}

function className(parsed: ReturnType<typeof parse>, flag: string): string | undefined {
  const value = stringFlag(parsed, flag);
  if (value !== undefined && !isDns1123Subdomain(value)) {
    throw new UsageError(
      `Invalid --${flag} '${value}': use a DNS-1123 subdomain (a-z 0-9 - ., at most 253)`,
    );
  }
  return value;
}

// Two tenants whose namespaces would be one, or a tenant's namespace that
// is waffle's own: refused rather than merged.
function refuseNamespaceClash(tenants: string[], system: string): void {
  const seen = new Map<string, string>();
  for (const tenant of tenants) {
    const namespace = tenantNamespace(tenant);
    const other = seen.get(namespace);
    if (namespace === system || (other !== undefined && other !== tenant)) {
      throw new UsageError(
        `Tenant '${tenant}' would share namespace '${namespace}' with ${
          other === undefined ? "waffle itself" : `tenant '${other}'`
        }`,
      );
    }
    seen.set(namespace, tenant);
  }
}
