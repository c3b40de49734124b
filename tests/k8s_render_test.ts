/**
 * `waffle k8s render` and what it is made of: every rendered object
 * validates (Kubernetes' OpenAPI schema through kubernetes-models,
 * agent-sandbox's CRD schema through ajv, waffle's own name checks), a
 * broken object is caught, tenants map to distinct valid namespaces, and the
 * Sandbox's pod carries the container's posture. No cluster runs here: this
 * checks the objects, not what a cluster does with them.
 */
import assert from "node:assert/strict";
import { parseAllDocuments } from "yaml";
import { sha256Hex } from "../lib/digest.ts";
import { EXIT_WAFFLE } from "../lib/exit_codes.ts";
import { RUNNER_CAPS, runnerArguments, SANDBOX_DENO_ARGV } from "../lib/lifecycle/posture.ts";
import {
  AGENT_PORT,
  clusterObjects,
  dns1123Label,
  isDns1123Label,
  isDns1123Subdomain,
  isLabelKey,
  isLabelValue,
  K8S_ANNOTATIONS,
  K8S_LABELS,
  type KubeObject,
  readSandboxObject,
  sandboxObject,
  SandboxObjectError,
  type SandboxObjectInput,
  sandboxSecret,
  serverConfigToml,
  tenantNamespace,
  toYamlDocuments,
  validateObject,
} from "../lib/k8s/mod.ts";
import { runCliProcess } from "./_helpers.ts";
import { loadWaffleConfig } from "../lib/config/config.ts";

const ID = "i1a2b3c4d5e6f7g8h9j0";

function input(overrides: Partial<SandboxObjectInput> = {}): SandboxObjectInput {
  return {
    id: ID,
    namespace: tenantNamespace("acme"),
    tenant: "acme",
    keyId: "k_0123",
    template: "base",
    image: "python:3.12-slim",
    waffleImage: "waffle:0.1.0",
    metadata: { owner: "ci", "x y": "z" },
    startedAt: 1_700_000_000_000,
    endAt: 1_700_000_300_000,
    limits: {
      memoryBytes: 1024 ** 3,
      cpus: 1.5,
      diskBytes: 2 * 1024 ** 3,
      tmpBytes: 64 * 1024 ** 2,
    },
    ...overrides,
  };
}

// deno-lint-ignore no-explicit-any
type Json = any;

function containerOf(sandbox: KubeObject, name: string): Json {
  const pod = (sandbox as Json).spec.podTemplate.spec;
  const found = [...pod.initContainers, ...pod.containers].find((c: Json) => c.name === name);
  assert.ok(found, `container ${name}`);
  return found;
}

Deno.test("clusterObjects() renders objects that all validate, each labelled managed-by waffle", async () => {
  const objects = clusterObjects({
    image: "registry.example/waffle:0.1.0",
    tenants: ["acme", "Acme_Corp", "t".repeat(128)],
    storageClassName: "fast-ssd",
    runtimeClassName: "gvisor",
  });
  const sandbox = sandboxObject(
    input({ storageClassName: "fast-ssd", runtimeClassName: "gvisor" }),
  );
  const secret = sandboxSecret({
    id: ID,
    namespace: "waffle-acme",
    tenant: "acme",
    accessToken: "a",
    agentToken: "b",
    envVars: { A: "1" },
  });
  for (const object of [...objects, sandbox, secret]) {
    assert.deepEqual(await validateObject(object), [], `${object.kind} ${object.metadata.name}`);
    const labels = object.metadata.labels as Record<string, string>;
    assert.equal(labels[K8S_LABELS.managedBy], "waffle", `${object.kind} ${object.metadata.name}`);
  }
  const kinds = new Set(objects.map((object) => object.kind));
  for (
    const kind of [
      "CustomResourceDefinition",
      "Namespace",
      "ServiceAccount",
      "ClusterRole",
      "ClusterRoleBinding",
      "ConfigMap",
      "Deployment",
      "Service",
      "NetworkPolicy",
      "ResourceQuota",
      "LimitRange",
    ]
  ) assert.ok(kinds.has(kind), kind);
  // Three tenants: a namespace and three policies each.
  assert.equal(objects.filter((o) => o.kind === "NetworkPolicy").length, 9);
  const crds = objects.filter((o) => o.kind === "CustomResourceDefinition").map((o) =>
    o.metadata.name
  );
  assert.deepEqual(crds, [
    "sandboxes.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
  ]);
});

Deno.test("clusterObjects() fences each tenant: default deny, egress to the proxy and DNS only, the agent's port only from the server", () => {
  const objects = clusterObjects({ image: "waffle:x", namespace: "wf-sys", tenants: ["acme"] });
  const policies = new Map(
    objects.filter((o) => o.kind === "NetworkPolicy").map((o) => [o.metadata.name, o as Json]),
  );
  const deny = policies.get("default-deny").spec;
  assert.deepEqual(deny, { podSelector: {}, policyTypes: ["Ingress", "Egress"] });
  const egress = policies.get("sandbox-egress").spec.egress;
  assert.equal(egress.length, 2);
  assert.deepEqual(egress[0].to[0].namespaceSelector.matchLabels, {
    "kubernetes.io/metadata.name": "wf-sys",
  });
  assert.deepEqual(egress[0].to[0].podSelector.matchLabels, {
    [K8S_LABELS.name]: "waffle-egress",
  });
  assert.deepEqual(egress[1].ports.map((p: Json) => `${p.protocol}/${p.port}`), [
    "UDP/53",
    "TCP/53",
  ]);
  const ingress = policies.get("sandbox-agent-ingress").spec.ingress;
  assert.deepEqual(ingress[0].ports, [{ protocol: "TCP", port: AGENT_PORT }]);
  assert.deepEqual(ingress[0].from[0].podSelector.matchLabels, {
    [K8S_LABELS.name]: "waffle-server",
  });
  // The server's pods carry the label the policy admits.
  const server = objects.find((o) =>
    o.kind === "Deployment" && o.metadata.name === "waffle-server"
  );
  assert.equal((server as Json).spec.template.metadata.labels[K8S_LABELS.name], "waffle-server");
  const quota = objects.find((o) => o.kind === "ResourceQuota") as Json;
  for (
    const key of [
      "pods",
      "requests.cpu",
      "requests.memory",
      "limits.cpu",
      "limits.memory",
      "persistentvolumeclaims",
      "requests.storage",
    ]
  ) assert.ok(key in quota.spec.hard, key);
});

Deno.test("validateObject() catches a wrong type, a bad name, a 64-character label, a bad Sandbox", async () => {
  const namespace = { apiVersion: "v1", kind: "Namespace", metadata: { name: "Bad_Name" } };
  const [named] = await validateObject(namespace);
  assert.match(named!, /^Namespace 'Bad_Name': metadata\.name 'Bad_Name' is not a DNS-1123 label/);

  const deployment = clusterObjects({ image: "waffle:x" }).find((o) => o.kind === "Deployment")!;
  const typed = structuredClone(deployment) as Json;
  typed.spec.replicas = "two";
  assert.deepEqual(await validateObject(typed), [
    "Deployment 'waffle-system/waffle-server': spec.replicas must be integer",
  ]);

  const labelled = structuredClone(deployment) as Json;
  labelled.metadata.labels["waffle.dev/x"] = "a".repeat(64);
  const [label] = await validateObject(labelled);
  assert.match(label!, /labels 'waffle\.dev\/x' value 'a{64}' is not a valid label value/);

  const sandbox = structuredClone(sandboxObject(input())) as Json;
  sandbox.spec.operatingMode = "Paused";
  sandbox.spec.podTemplate.spec.containers[0].name = 7;
  sandbox.spec.podTemplate.spec.containers[1].volumeMounts.push({ name: "nope", mountPath: "/x" });
  const problems = await validateObject(sandbox);
  assert.ok(problems.some((p) => p.includes("spec.operatingMode must be one of")), problems.join());
  assert.ok(
    problems.some((p) => p.includes("spec.podTemplate.spec.containers.0.name must be string")),
    problems.join(),
  );
  assert.ok(problems.some((p) => p.includes("mounts unknown volume 'nope'")), problems.join());

  const unknown = structuredClone(sandboxObject(input())) as Json;
  unknown.spec.replicas = 1;
  assert.deepEqual(await validateObject(unknown), [
    `Sandbox 'waffle-acme/wfl-${ID}': spec has unknown field 'replicas'`,
  ]);

  const misplaced = {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: "a", namespace: "A_B" },
  };
  assert.equal((await validateObject(misplaced)).length, 1);
  assert.deepEqual(
    await validateObject({ apiVersion: "v9", kind: "Thing", metadata: { name: "a" } }),
    [
      "Thing 'a': no schema for 'v9' 'Thing'",
      "Thing 'a': metadata.namespace 'undefined' is not a DNS-1123 label",
    ],
  );
});

Deno.test("tenantNamespace() maps long and odd tenants to distinct valid namespaces, the same each time", () => {
  const tenants = [
    "acme",
    "Acme",
    "ACME",
    "acme_corp",
    "acme-corp",
    "acme.corp",
    "a@b+c",
    "1tenant",
    "t".repeat(128),
    `${"t".repeat(127)}u`,
    "x".repeat(56),
    "x".repeat(57),
  ];
  const namespaces = tenants.map((tenant) => tenantNamespace(tenant));
  for (const [at, namespace] of namespaces.entries()) {
    assert.ok(isDns1123Label(namespace), `${tenants[at]} -> ${namespace}`);
    assert.equal(tenantNamespace(tenants[at]!), namespace);
  }
  assert.equal(new Set(namespaces).size, tenants.length, namespaces.join(" "));
  // A valid short tenant is itself; a changed one keeps its readable part and a hash.
  assert.equal(tenantNamespace("acme"), "waffle-acme");
  assert.equal(tenantNamespace("x".repeat(56)), `waffle-${"x".repeat(56)}`);
  assert.equal(tenantNamespace("Acme"), `waffle-acme-${sha256Hex("Acme").slice(0, 8)}`);
  assert.equal(tenantNamespace("x".repeat(57)).length, 63);
  assert.equal(dns1123Label("___"), sha256Hex("___").slice(0, 8));
  assert.throws(() => tenantNamespace("acme", "Bad_"), /Invalid namespace prefix 'Bad_'/);
});

Deno.test("the DNS-1123 and label rules accept and refuse what Kubernetes does", () => {
  assert.ok(isDns1123Label("a") && isDns1123Label("a-1") && isDns1123Label("x".repeat(63)));
  for (const bad of ["", "-a", "a-", "A", "a_b", "a.b", "x".repeat(64)]) {
    assert.equal(isDns1123Label(bad), false, bad);
  }
  assert.ok(isDns1123Subdomain("sandboxes.agents.x-k8s.io"));
  assert.equal(isDns1123Subdomain("a..b"), false);
  assert.ok(isLabelValue("") && isLabelValue("A_b.c-1") && isLabelValue("x".repeat(63)));
  for (const bad of ["-a", "a_", "x".repeat(64), "a b"]) {
    assert.equal(isLabelValue(bad), false, bad);
  }
  assert.ok(isLabelKey("app.kubernetes.io/managed-by") && isLabelKey("plain"));
  for (const bad of ["waffle.dev/", "Bad_Domain/x", "/x", `a/${"x".repeat(64)}`]) {
    assert.equal(isLabelKey(bad), false, bad);
  }
});

Deno.test("sandboxObject() carries the container's posture into the pod", () => {
  const sandbox = sandboxObject(input({ runtimeClassName: "gvisor", storageClassName: "fast" }));
  const pod = (sandbox as Json).spec.podTemplate.spec;
  assert.equal(pod.automountServiceAccountToken, false);
  assert.equal(pod.shareProcessNamespace, false);
  assert.equal(pod.hostNetwork, false);
  assert.equal(pod.hostPID, false);
  assert.equal(pod.hostIPC, false);
  assert.equal(pod.enableServiceLinks, false);
  assert.equal(pod.runtimeClassName, "gvisor");
  assert.deepEqual(pod.securityContext.seccompProfile, { type: "RuntimeDefault" });

  const runner = containerOf(sandbox, "runner");
  assert.equal(runner.image, "python:3.12-slim");
  assert.deepEqual(runner.securityContext.capabilities, { drop: ["ALL"], add: [...RUNNER_CAPS] });
  assert.equal(runner.securityContext.readOnlyRootFilesystem, true);
  assert.equal(runner.securityContext.allowPrivilegeEscalation, false);
  assert.equal(runner.securityContext.privileged, false);
  assert.equal(runner.securityContext.runAsUser, 0);
  assert.deepEqual(runner.resources.limits, { memory: String(1024 ** 3), cpu: "1500m" });
  assert.deepEqual(runner.resources.requests, runner.resources.limits);
  assert.deepEqual(runner.command.slice(0, SANDBOX_DENO_ARGV.length), SANDBOX_DENO_ARGV);
  assert.deepEqual(runner.command.slice(-10), runnerArguments({ idleSeconds: 0 }));
  const mounts = new Map(runner.volumeMounts.map((m: Json) => [m.mountPath, m]));
  assert.equal((mounts.get("/queue/inbound") as Json).readOnly, true);
  assert.equal((mounts.get("/queue/outbound") as Json).readOnly, undefined);
  assert.equal((mounts.get("/etc/ld.so.preload") as Json).subPath, "empty");
  for (
    const path of ["/opt/waffle/deno", "/opt/waffle/rt", "/opt/waffle/app", "/opt/waffle/chan"]
  ) {
    assert.equal((mounts.get(path) as Json).readOnly, true, path);
  }
  const env = new Map(runner.env.map((e: Json) => [e.name, e.value]));
  assert.equal(env.get("LD_PRELOAD"), "");
  assert.equal(env.get("WAFFLE_IMAGE_WORKDIR"), "/workspace");
  const tmp = pod.volumes.find((v: Json) => v.name === "waffle-tmp");
  assert.deepEqual(tmp.emptyDir, { medium: "Memory", sizeLimit: String(64 * 1024 ** 2) });

  const agent = containerOf(sandbox, "waffle-agent");
  assert.deepEqual(agent.securityContext.capabilities, { drop: ["ALL"] });
  assert.equal(agent.securityContext.readOnlyRootFilesystem, true);
  assert.equal(agent.resources.limits.memory, "256Mi");
  assert.deepEqual(agent.readinessProbe.tcpSocket, { port: AGENT_PORT });
  assert.deepEqual(agent.env, [{ name: "WAFFLE_SANDBOX_ID", value: ID }]);
  const secrets = pod.volumes.find((v: Json) => v.name === "waffle-secrets");
  assert.deepEqual(secrets.secret, { secretName: `wfl-${ID}-waffle`, defaultMode: 0o400 });
  const kit = containerOf(sandbox, "waffle-kit");
  assert.deepEqual(kit.command.slice(-10), [
    "k8s",
    "kit",
    "--to",
    "/kit",
    "--workspace",
    "/workspace",
    "--mode",
    "/run/waffle=700",
    "--mode",
    "/tmp=1777",
  ]);
  // Only to give a fresh claim's root to the commands' uid.
  assert.deepEqual(kit.securityContext.capabilities, { drop: ["ALL"], add: ["CHOWN"] });

  const claim = (sandbox as Json).spec.volumeClaimTemplates[0];
  assert.deepEqual(claim.spec, {
    accessModes: ["ReadWriteOnce"],
    resources: { requests: { storage: String(2 * 1024 ** 3) } },
    storageClassName: "fast",
  });
  assert.equal((sandbox as Json).spec.service, false);
  assert.deepEqual((sandbox as Json).spec.podTemplate.metadata.labels, sandbox.metadata.labels);
});

Deno.test("runnerArguments() is the runner's flag list a Docker sandbox has always had", () => {
  // Shared by the container (posture.ts) and the pod: a change here would recycle every container.
  assert.deepEqual(runnerArguments({ idleSeconds: 1800 }), [
    "runner",
    "--queue",
    "/queue",
    "--workspace",
    "/workspace",
    "--idle-exit",
    "1800",
    "--command-user",
    "10001:10001",
    "--private-ptys",
  ]);
});

Deno.test("readSandboxObject() reads back what was stored, never recomputing it, and names what is wrong", () => {
  const made = sandboxObject(input({ network: { allowOut: ["1.1.1.1"] } })) as Json;
  // Stored as it was: a namespace the tenant would not map to today is kept.
  made.metadata.namespace = "legacy-ns";
  made.metadata.resourceVersion = "42";
  made.spec.operatingMode = "Suspended";
  made.status = {
    conditions: [{ type: "Ready", status: "True" }],
    podIPs: ["10.1.2.3", "fd00::1"],
    serviceFQDN: "",
  };
  const record = readSandboxObject(made);
  assert.deepEqual(record, {
    id: ID,
    namespace: "legacy-ns",
    name: `wfl-${ID}`,
    tenant: "acme",
    keyId: "k_0123",
    template: "base",
    image: "python:3.12-slim",
    metadata: { owner: "ci", "x y": "z" },
    startedAt: 1_700_000_000_000,
    endAt: 1_700_000_300_000,
    network: { allowOut: ["1.1.1.1"] },
    suspended: true,
    ready: true,
    podIP: "10.1.2.3",
    serviceFQDN: undefined,
    secretName: `wfl-${ID}-waffle`,
    claimName: `workspace-wfl-${ID}`,
    resourceVersion: "42",
  });
  assert.equal(readSandboxObject(sandboxObject(input())).network, undefined);

  const missing = structuredClone(made);
  delete missing.metadata.annotations[K8S_ANNOTATIONS.keyId];
  assert.throws(() => readSandboxObject(missing), (error: Error) => {
    assert.ok(error instanceof SandboxObjectError);
    assert.match(error.message, /^Sandbox 'legacy-ns\/wfl-i1a2b3c4d5e6f7g8h9j0' is not waffle's: /);
    assert.match(error.message, /waffle\.dev\/key-id/);
    assert.doesNotMatch(error.message, /\n/);
    return true;
  });
  const badJson = structuredClone(made);
  badJson.metadata.annotations[K8S_ANNOTATIONS.metadata] = "{nope";
  assert.throws(() => readSandboxObject(badJson), /annotation 'waffle\.dev\/metadata' is not JSON/);
  assert.throws(() => readSandboxObject({ kind: "Pod" }), SandboxObjectError);
});

Deno.test("toYamlDocuments() writes YAML that reads back as the same objects", () => {
  const objects = [
    ...clusterObjects({ image: "waffle:x", tenants: ["acme"] }),
    sandboxObject(input()),
    {
      apiVersion: "v1",
      kind: "ConfigMap",
      metadata: { name: "tricky", namespace: "a" },
      data: {
        yes: "no",
        "1": "true",
        text: "line one\n  indented\n\nlast: x\n",
        ending: "two\n\n",
        quote: "a \"b\" 'c' # d: e\t",
        unicode: "é\u2028",
        empty: "",
      },
      binaryData: {},
      list: [[1, 2], [], [{ a: null }]],
    } as KubeObject,
  ];
  const documents = parseAllDocuments(toYamlDocuments(objects));
  assert.ok(Array.isArray(documents));
  assert.deepEqual(documents.map((document) => document.toJS()), objects);
});

Deno.test("waffle k8s render prints a List that validates, and fails cleanly on a bad flag", async () => {
  const json = await runCliProcess(["k8s", "render", "--tenant", "a", "--json"]);
  assert.equal(json.code, 0, json.stderr);
  assert.equal(json.stderr, "");
  const list = JSON.parse(json.stdout);
  assert.equal(list.kind, "List");
  assert.ok(list.items.some((o: KubeObject) => o.metadata.name === "waffle-a"));
  for (const object of list.items) assert.deepEqual(await validateObject(object), []);

  const yaml = await runCliProcess(["k8s", "render", "--tenant", "a", "--image", "reg/w:1"]);
  assert.equal(yaml.code, 0, yaml.stderr);
  const documents = parseAllDocuments(yaml.stdout);
  assert.ok(Array.isArray(documents));
  assert.equal(documents.length, list.items.length);

  const bare = await runCliProcess(["k8s", "render", "--no-crds", "--json"]);
  assert.equal(bare.code, 0, bare.stderr);
  const kinds = JSON.parse(bare.stdout).items.map((o: KubeObject) => o.kind);
  assert.ok(kinds.includes("Deployment") && !kinds.includes("CustomResourceDefinition"));

  const cases: [string[], RegExp][] = [
    [["--replicas", "zero"], /^waffle: Invalid --replicas 'zero'/],
    [["--bogus"], /^waffle: Unknown option '--bogus'/],
    [["--tenant", "bad tenant"], /^waffle: Invalid tenant id 'bad tenant'/],
    [["--tenant", "system"], /^waffle: Tenant 'system' would share namespace 'waffle-system'/],
    [["--storage-class", "Fast_SSD"], /^waffle: Invalid --storage-class 'Fast_SSD'/],
  ];
  for (const [args, message] of cases) {
    const out = await runCliProcess(["k8s", "render", ...args]);
    assert.equal(out.code, EXIT_WAFFLE, args.join(" "));
    assert.match(out.stderr, message);
    assert.equal(out.stderr.trim().split("\n").length, 1, out.stderr);
    assert.equal(out.stdout, "");
  }
  const other = await runCliProcess(["k8s", "nope"]);
  assert.equal(other.code, EXIT_WAFFLE);
  assert.match(other.stderr, /^waffle: Unknown command 'k8s nope'; run 'waffle k8s --help'/);
});

Deno.test("render: the server's config.toml is one waffle loads: the Kubernetes backend and the shared keys file", async () => {
  const dir = await Deno.makeTempDir({ prefix: "waffle-k8s-config-" });
  try {
    const path = `${dir}/waffle.toml`;
    await Deno.writeTextFile(
      path,
      serverConfigToml({
        image: "registry.example/waffle:1",
        prefix: "t-",
        storageClassName: "fast",
      }),
    );
    const { serve } = loadWaffleConfig({ configPath: path });
    assert.equal(serve.backend.kind, "kubernetes");
    assert.ok(serve.backend.kind === "kubernetes");
    assert.equal(serve.backend.waffleImage, "registry.example/waffle:1");
    assert.equal(serve.backend.namespacePrefix, "t-");
    assert.equal(serve.backend.storageClass, "fast");
    assert.equal(serve.keysFile, "/etc/waffle/keys/keys.json");
    assert.deepEqual(serve.listen, { hostname: "0.0.0.0", port: 3000 });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test('config: [backend] kind = "kubernetes" without waffle_image, or a Kubernetes key on Docker, is one line naming it', async () => {
  const dir = await Deno.makeTempDir({ prefix: "waffle-k8s-config-" });
  try {
    const path = `${dir}/waffle.toml`;
    const refused = async (toml: string, pattern: RegExp): Promise<void> => {
      await Deno.writeTextFile(path, toml);
      assert.throws(
        () => loadWaffleConfig({ configPath: path }),
        (error: Error) => pattern.test(error.message) && !error.message.includes("\n"),
      );
    };
    await refused('[backend]\nkind = "kubernetes"\n', /'backend\.waffle_image' is required/);
    await refused(
      '[backend]\nkind = "docker"\nstorage_class = "x"\n',
      /'backend\.storage_class' is for kind = "kubernetes" only/,
    );
    await refused('[backend]\nkind = "nomad"\n', /'backend\.kind'/);
    await refused(
      '[backend]\nkind = "kubernetes"\nwaffle_image = "w:1"\nnamespace_prefix = "Bad_"\n',
      /'backend\.namespace_prefix'/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("serve on Kubernetes refuses what it cannot give (egress, warm pools) and an unreadable kubeconfig, in one line each", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-k8s-serve-" });
  try {
    const backend =
      `[backend]\nkind = "kubernetes"\nwaffle_image = "w:1"\nkubeconfig = "${home}/absent"\n`;
    const serveWith = async (toml: string): Promise<{ code: number; stderr: string }> => {
      await Deno.writeTextFile(`${home}/waffle.toml`, toml);
      return await runCliProcess(["serve", "--listen", "127.0.0.1:0"], {
        env: { WAFFLE_HOME: home },
      });
    };
    const egress = await serveWith(`[sandbox]\nnetwork = "bridge"\n${backend}`);
    assert.notEqual(egress.code, 0);
    assert.match(
      egress.stderr,
      /Egress \(\[sandbox\] network = "bridge", 0 egress entries\) is not available/,
    );
    const warm = await serveWith(`${backend}[templates.py]\nimage = "python:3"\nwarm = 2\n`);
    assert.notEqual(warm.code, 0);
    assert.match(warm.stderr, /Warm pools \(\[templates\.py\] warm\) are not available/);
    const config = await serveWith(backend);
    assert.notEqual(config.code, 0);
    assert.match(config.stderr, /Cannot load Kubernetes credentials from kubeconfig '.*\/absent'/);
    for (const run of [egress, warm, config]) {
      assert.equal(run.stderr.trim().split("\n").length, 1, run.stderr);
    }
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("doctor on a Kubernetes backend: an unreadable kubeconfig is a failing row naming it", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-k8s-doctor-" });
  try {
    await Deno.writeTextFile(
      `${home}/waffle.toml`,
      `[backend]\nkind = "kubernetes"\nwaffle_image = "w:1"\nkubeconfig = "${home}/absent"\n`,
    );
    const run = await runCliProcess(["doctor", "--no-docker", "--json"], {
      env: { WAFFLE_HOME: home },
    });
    assert.notEqual(run.code, 0);
    const rows = JSON.parse(run.stdout).checks as { name: string; ok: boolean; detail: string }[];
    const credentials = rows.find((row) => row.name === "kubernetes credentials");
    assert.ok(credentials !== undefined && !credentials.ok, run.stdout);
    assert.match(
      credentials.detail,
      /Cannot load Kubernetes credentials from kubeconfig '.*\/absent'/,
    );
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});
