/**
 * The Kubernetes stand-in (tests/_k8s_standin.ts), which is a MOCK of
 * Kubernetes (none can run here): its API answers `@kubernetes/client-node`
 * as a real API server does, and its kubelet runs a pod's containers with
 * Docker joined as a pod joins them (one network, one IPC namespace, one
 * kernel for the locks on a shared emptyDir), with the securityContext
 * applied, a claim that outlives a suspension and nothing left after a
 * delete. Live where Docker is (tests/_docker_gate.ts).
 *
 * @module
 */
import assert from "node:assert/strict";
import {
  ApiException,
  CoreV1Api,
  CustomObjectsApi,
  KubeConfig,
  PatchStrategy,
  setHeaderOptions,
  Watch,
} from "@kubernetes/client-node";
import { liveTest } from "./_docker_gate.ts";
import { jsonPatch, mergePatch } from "./_k8s_api.ts";
import {
  type KubeObject,
  POD_PIDS_LIMIT,
  type StandIn,
  STANDIN_LABEL,
  startStandIn,
} from "./_k8s_standin.ts";
import type { DockerClient } from "../lib/docker/mod.ts";

const GROUP = "agents.x-k8s.io";
const VERSION = "v1beta1";
const PLURAL = "sandboxes";
const IMAGE = "waffle-base:bookworm";
const LIVE = { sanitizeResources: false, sanitizeOps: false };

function sandbox(name: string, spec: KubeObject, labels: Record<string, string> = {}): KubeObject {
  return { apiVersion: `${GROUP}/${VERSION}`, kind: "Sandbox", metadata: { name, labels }, spec };
}

const SLEEPER = { name: "main", image: IMAGE, command: ["sleep", "infinity"] };

function clients(
  standIn: StandIn,
): { custom: CustomObjectsApi; core: CoreV1Api; config: KubeConfig } {
  const config = new KubeConfig();
  config.loadFromFile(standIn.kubeconfigPath);
  return {
    custom: config.makeApiClient(CustomObjectsApi),
    core: config.makeApiClient(CoreV1Api),
    config,
  };
}

// The Status a call failed with (client-node hands the body back as text or JSON).
async function failure(
  call: () => Promise<unknown>,
): Promise<{ code: number; status: KubeObject }> {
  try {
    await call();
  } catch (err) {
    assert.ok(err instanceof ApiException, String(err));
    const body = typeof err.body === "string" ? JSON.parse(err.body) : err.body;
    return { code: err.code, status: body };
  }
  throw new Error("the call succeeded");
}

async function withStandIn(
  docker: DockerClient,
  fn: (standIn: StandIn) => Promise<void>,
): Promise<void> {
  const standIn = await startStandIn(docker, { prefix: "wfl-h2" });
  try {
    await fn(standIn);
  } finally {
    await standIn.stop();
    const left = await docker.listContainers({ all: true, labels: [STANDIN_LABEL] });
    assert.deepEqual(
      left.filter((c) => c.Names.some((n) => n.includes("wfl-h2"))),
      [],
      "containers left",
    );
    assert.equal(await docker.inspectNetwork(standIn.network), null, "network left");
  }
}

Deno.test("mergePatch() follows RFC 7386's examples", () => {
  const cases: [unknown, unknown, unknown][] = [
    [{ a: "b" }, { a: "c" }, { a: "c" }],
    [{ a: "b" }, { b: "c" }, { a: "b", b: "c" }],
    [{ a: "b" }, { a: null }, {}],
    [{ a: "b", b: "c" }, { a: null }, { b: "c" }],
    [{ a: ["b"] }, { a: "c" }, { a: "c" }],
    [{ a: "c" }, { a: ["b"] }, { a: ["b"] }],
    [{ a: { b: "c" } }, { a: { b: "d", c: null } }, { a: { b: "d" } }],
    [{ a: [{ b: "c" }] }, { a: [1] }, { a: [1] }],
    [["a", "b"], ["c", "d"], ["c", "d"]],
    [{ a: "b" }, ["c"], ["c"]],
    [{ a: "foo" }, null, null],
    [{ e: null }, { a: 1 }, { e: null, a: 1 }],
    [[1, 2], { a: "b", c: null }, { a: "b" }],
    [{}, { a: { bb: { ccc: null } } }, { a: { bb: {} } }],
  ];
  for (const [target, patch, expected] of cases) {
    assert.deepEqual(mergePatch(target, patch), expected);
  }
});

Deno.test("jsonPatch() adds, removes, replaces, moves, copies and tests, and refuses a missing path", () => {
  const doc = { metadata: { labels: { a: "b" } }, spec: { list: [1, 3] } };
  const patched = jsonPatch(doc, [
    { op: "add", path: "/spec/list/1", value: 2 },
    { op: "add", path: "/spec/list/-", value: 4 },
    { op: "replace", path: "/metadata/labels/a", value: "c" },
    { op: "copy", from: "/metadata/labels/a", path: "/metadata/labels/d~1e" },
    { op: "move", from: "/metadata/labels/a", path: "/metadata/name" },
    { op: "test", path: "/metadata/name", value: "c" },
    { op: "remove", path: "/spec/list/0" },
  ]);
  assert.deepEqual(patched, {
    metadata: { labels: { "d/e": "c" }, name: "c" },
    spec: { list: [2, 3, 4] },
  });
  assert.deepEqual(doc.spec.list, [1, 3], "the target is not changed");
  assert.throws(() => jsonPatch(doc, [{ op: "remove", path: "/spec/nothing" }]), /missing path/);
  assert.throws(
    () => jsonPatch(doc, [{ op: "test", path: "/spec/list", value: [] }]),
    /testing value/,
  );
});

/** What a REST test works with: the clients, a namespace and its Sandboxes' coordinates. */
interface Api {
  standIn: StandIn;
  custom: CustomObjectsApi;
  core: CoreV1Api;
  config: KubeConfig;
  ns: string;
  ref: { group: string; version: string; namespace: string; plural: string };
}

const SUSPENDED = { operatingMode: "Suspended", podTemplate: { spec: { containers: [SLEEPER] } } };
const MERGE = setHeaderOptions("Content-Type", PatchStrategy.MergePatch);

function apiTest(name: string, fn: (api: Api) => Promise<void>): void {
  liveTest(`k8s stand-in: ${name}`, async (docker) => {
    await withStandIn(docker, async (standIn) => {
      const ns = "tenant-a";
      const ref = { group: GROUP, version: VERSION, namespace: ns, plural: PLURAL };
      await fn({ standIn, ...clients(standIn), ns, ref });
    });
  }, LIVE);
}

apiTest(
  "create, get and list answer client-node as the API server does",
  async ({ custom, ns, ref }) => {
    const one = await custom.createNamespacedCustomObject({
      ...ref,
      body: sandbox("one", SUSPENDED, { a: "b" }),
    }) as KubeObject;
    assert.equal(one.metadata.namespace, ns);
    assert.equal(one.metadata.generation, 1);
    assert.match(one.metadata.uid, /^[0-9a-f-]{36}$/);
    assert.match(one.metadata.creationTimestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    const two = await custom.createNamespacedCustomObject({
      ...ref,
      body: sandbox("two", SUSPENDED),
    }) as KubeObject;
    assert.ok(Number(two.metadata.resourceVersion) > Number(one.metadata.resourceVersion));
    const got = await custom.getNamespacedCustomObject({ ...ref, name: "one" }) as KubeObject;
    assert.equal(got.metadata.uid, one.metadata.uid);
    const selected = await custom.listNamespacedCustomObject({
      ...ref,
      labelSelector: "a=b",
    }) as KubeObject;
    assert.equal(selected.kind, "SandboxList");
    assert.deepEqual(selected.items.map((i: KubeObject) => i.metadata.name), ["one"]);
    const all = await custom.listNamespacedCustomObject(ref) as KubeObject;
    assert.deepEqual(all.items.map((i: KubeObject) => i.metadata.name), ["one", "two"]);
    const none = await custom.listNamespacedCustomObject({
      ...ref,
      namespace: "elsewhere",
    }) as KubeObject;
    assert.deepEqual(none.items, []);
  },
);

apiTest(
  "a bad create is a Status: AlreadyExists, Invalid (name, containers, schema), BadRequest",
  async ({ custom, ref }) => {
    await custom.createNamespacedCustomObject({ ...ref, body: sandbox("one", SUSPENDED) });
    const again = await failure(() =>
      custom.createNamespacedCustomObject({ ...ref, body: sandbox("one", SUSPENDED) })
    );
    assert.equal(again.code, 409);
    assert.deepEqual(
      { reason: again.status.reason, kind: again.status.kind, message: again.status.message },
      {
        reason: "AlreadyExists",
        kind: "Status",
        message: `${PLURAL}.${GROUP} "one" already exists`,
      },
    );
    const invalid = async (body: KubeObject): Promise<string> => {
      const refused = await failure(() => custom.createNamespacedCustomObject({ ...ref, body }));
      assert.deepEqual([refused.code, refused.status.reason], [422, "Invalid"]);
      return refused.status.details.causes[0].field;
    };
    assert.equal(await invalid(sandbox("Bad_Name", SUSPENDED)), "metadata.name");
    assert.equal(
      await invalid(sandbox("three", { podTemplate: { spec: {} } })),
      "spec.podTemplate.spec.containers",
    );
    const badPort = {
      podTemplate: { spec: { containers: [{ ...SLEEPER, ports: [{ containerPort: "80" }] }] } },
    };
    assert.equal(
      await invalid(sandbox("five", badPort)),
      "spec.podTemplate.spec.containers[0].ports[0].containerPort",
    );
    const wrongKind = await failure(() =>
      custom.createNamespacedCustomObject({
        ...ref,
        body: { ...sandbox("four", SUSPENDED), kind: "Pod" },
      })
    );
    assert.equal(wrongKind.code, 400);
    const all = await custom.listNamespacedCustomObject(ref) as KubeObject;
    assert.deepEqual(
      all.items.map((i: KubeObject) => i.metadata.name),
      ["one"],
      "nothing half-made",
    );
  },
);

apiTest(
  "merge patch and JSON patch: generation, status only through /status, stale resourceVersion",
  async ({ custom, ref }) => {
    const one = await custom.createNamespacedCustomObject({
      ...ref,
      body: sandbox("one", SUSPENDED, { a: "b" }),
    }) as KubeObject;
    const labelled = await custom.patchNamespacedCustomObject(
      {
        ...ref,
        name: "one",
        body: { metadata: { labels: { c: "d" } }, status: { podIPs: ["1.2.3.4"] } },
      },
      MERGE,
    ) as KubeObject;
    assert.deepEqual(labelled.metadata.labels, { a: "b", c: "d" });
    assert.equal(labelled.metadata.generation, 1);
    assert.ok(Number(labelled.metadata.resourceVersion) > Number(one.metadata.resourceVersion));
    assert.notDeepEqual(
      labelled.status?.podIPs,
      ["1.2.3.4"],
      "status is written only through /status",
    );
    const respec = await custom.patchNamespacedCustomObject({
      ...ref,
      name: "one",
      body: {
        metadata: { labels: { a: null } },
        spec: { podTemplate: { metadata: { labels: { x: "y" } } } },
      },
    }, MERGE) as KubeObject;
    assert.deepEqual(respec.metadata.labels, { c: "d" });
    assert.equal(respec.metadata.generation, 2);
    assert.deepEqual(respec.spec.podTemplate.spec.containers, [SLEEPER]);
    const stale = await failure(() =>
      custom.patchNamespacedCustomObject({
        ...ref,
        name: "one",
        body: { metadata: { resourceVersion: one.metadata.resourceVersion, labels: { e: "f" } } },
      }, MERGE)
    );
    assert.deepEqual([stale.code, stale.status.reason], [409, "Conflict"]);
    // JSON patch is client-node's default.
    const jsonPatched = await custom.patchNamespacedCustomObject({
      ...ref,
      name: "one",
      body: [{ op: "add", path: "/metadata/annotations", value: { "waffle.dev/end-at": "1" } }],
    }) as KubeObject;
    assert.deepEqual(jsonPatched.metadata.annotations, { "waffle.dev/end-at": "1" });
    const status = await custom.patchNamespacedCustomObjectStatus(
      { ...ref, name: "one", body: { status: { podIPs: ["1.2.3.4"] } } },
      MERGE,
    ) as KubeObject;
    assert.deepEqual(status.status.podIPs, ["1.2.3.4"]);
  },
);

apiTest(
  "delete, Secrets, the bearer token and unknown paths",
  async ({ standIn, custom, core, ns, ref }) => {
    const one = await custom.createNamespacedCustomObject({
      ...ref,
      body: sandbox("one", SUSPENDED),
    }) as KubeObject;
    const deleted = await custom.deleteNamespacedCustomObject({
      ...ref,
      name: "one",
    }) as KubeObject;
    assert.equal(deleted.metadata.uid, one.metadata.uid);
    const gone = await failure(() => custom.getNamespacedCustomObject({ ...ref, name: "one" }));
    assert.deepEqual(
      [gone.code, gone.status.reason, gone.status.message],
      [404, "NotFound", `${PLURAL}.${GROUP} "one" not found`],
    );
    // Secrets: stringData stored as data; delete answers a Status.
    const secret = await core.createNamespacedSecret({
      namespace: ns,
      body: { metadata: { name: "one-waffle" }, stringData: { "access-token": "tok" } },
    });
    assert.equal(secret.data?.["access-token"], btoa("tok"));
    assert.equal(secret.type, "Opaque");
    const secretAgain = await failure(() =>
      core.createNamespacedSecret({ namespace: ns, body: { metadata: { name: "one-waffle" } } })
    );
    assert.deepEqual([secretAgain.code, secretAgain.status.message], [
      409,
      `secrets "one-waffle" already exists`,
    ]);
    const read = await core.readNamespacedSecret({ namespace: ns, name: "one-waffle" });
    assert.equal(read.metadata?.uid, secret.metadata?.uid);
    const status = await core.deleteNamespacedSecret({ namespace: ns, name: "one-waffle" });
    assert.equal(status.status, "Success");
    // No token, a wrong one, an unknown path.
    const path = `${standIn.url}/apis/${GROUP}/${VERSION}/namespaces/${ns}/${PLURAL}`;
    const anonymous = await fetch(path);
    assert.deepEqual([anonymous.status, (await anonymous.json()).reason], [401, "Unauthorized"]);
    const wrong = await fetch(path, { headers: { authorization: "Bearer nope" } });
    assert.equal(wrong.status, 401);
    await wrong.body?.cancel();
    const unknown = await fetch(
      `${standIn.url}/apis/${GROUP}/${VERSION}/namespaces/${ns}/widgets`,
      {
        headers: { authorization: `Bearer ${standIn.token}` },
      },
    );
    assert.deepEqual([unknown.status, (await unknown.json()).kind], [404, "Status"]);
  },
);

apiTest(
  "a watch sees each change in order, and one from a resourceVersion replays them",
  async ({ standIn, custom, config, ns, ref }) => {
    const events: { type: string; name: string; version: number; labels: string }[] = [];
    const list = await custom.listNamespacedCustomObject(ref) as KubeObject;
    const watching = await new Watch(config).watch(
      `/apis/${GROUP}/${VERSION}/namespaces/${ns}/${PLURAL}`,
      { resourceVersion: list.metadata.resourceVersion },
      (type, object) =>
        events.push({
          type,
          name: object.metadata.name,
          version: Number(object.metadata.resourceVersion),
          labels: JSON.stringify(object.metadata.labels ?? {}),
        }),
      () => {},
    );
    let first: KubeObject;
    try {
      first = await custom.createNamespacedCustomObject({
        ...ref,
        body: sandbox("one", SUSPENDED),
      }) as KubeObject;
      await custom.createNamespacedCustomObject({ ...ref, body: sandbox("two", SUSPENDED) });
      await custom.patchNamespacedCustomObject({
        ...ref,
        name: "one",
        body: { metadata: { labels: { c: "d" } } },
      }, MERGE);
      await custom.deleteNamespacedCustomObject({ ...ref, name: "one" });
      await waitUntil(() => events.some((e) => e.type === "DELETED"), "the watch's DELETED");
    } finally {
      watching.abort();
    }
    // The controller's status writes come between (MODIFIED): each change is
    // there, in resourceVersion order, once.
    const of = (name: string): string[] => events.filter((e) => e.name === name).map((e) => e.type);
    assert.equal(of("one")[0], "ADDED");
    assert.equal(of("one").at(-1), "DELETED");
    assert.deepEqual(new Set(of("one").slice(1, -1)), new Set(["MODIFIED"]));
    assert.equal(of("two")[0], "ADDED");
    assert.ok(events.some((e) => e.type === "MODIFIED" && e.labels === '{"c":"d"}'));
    const versions = events.map((e) => e.version);
    assert.deepEqual(versions, [...new Set(versions)].sort((a, b) => a - b));
    // From the first object's resourceVersion: what the live watch saw after it.
    const replay = (await fetchJsonLines(
      standIn,
      `/apis/${GROUP}/${VERSION}/namespaces/${ns}/${PLURAL}?watch=1&resourceVersion=${first.metadata.resourceVersion}&timeoutSeconds=1`,
    )).map((e) => `${e.type} ${e.object.metadata.name} ${e.object.metadata.resourceVersion}`);
    const live = events.map((e) => `${e.type} ${e.name} ${e.version}`);
    assert.deepEqual(replay.slice(0, live.length - 1), live.slice(1));
    // A watch still open when the stand-in stops is ended, not waited for.
    const open = await fetch(`${standIn.url}/apis/${GROUP}/${VERSION}/${PLURAL}?watch=true`, {
      headers: { authorization: `Bearer ${standIn.token}` },
    });
    const reading = open.text();
    await standIn.stop();
    const lines = (await reading).split("\n").filter((line) => line !== "");
    assert.deepEqual(lines.map((line) => JSON.parse(line).object.metadata.name), ["two"]);
  },
);

// The two-container pod of the live test: `server` answers on :7000 (its
// readiness probe), `client` runs as uid 1000 with nothing but its own
// files; both share `/shared` (emptyDir), `/mem` (Memory emptyDir), and the
// claim `workspace` is the client's.
function podSandbox(name: string): KubeObject {
  const server =
    // It exits (3) when /shared/crash appears: its restartPolicy brings it back.
    "import os,socket,threading,time\n" +
    "def watch():\n while not os.path.exists('/shared/crash'): time.sleep(0.05)\n" +
    " os.remove('/shared/crash'); os._exit(3)\n" +
    "threading.Thread(target=watch,daemon=True).start()\n" +
    "s=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n" +
    "s.bind(('0.0.0.0',7000))\ns.listen(8)\nwhile True:\n c,_=s.accept()\n c.sendall(b'hello-from-server')\n c.close()\n";
  return sandbox(name, {
    volumeClaimTemplates: [{
      metadata: { name: "workspace" },
      spec: { accessModes: ["ReadWriteOnce"], resources: { requests: { storage: "1Gi" } } },
    }],
    podTemplate: {
      metadata: { labels: { "app.kubernetes.io/managed-by": "waffle" } },
      spec: {
        terminationGracePeriodSeconds: 1,
        initContainers: [{
          name: "prep",
          image: IMAGE,
          command: ["sh", "-c", "echo prepared > /shared/init-done"],
          volumeMounts: [{ name: "shared", mountPath: "/shared" }],
        }],
        containers: [
          {
            name: "server",
            image: IMAGE,
            command: ["python3", "-c", server],
            ports: [{ name: "hello", containerPort: 7000 }],
            readinessProbe: { tcpSocket: { port: "hello" }, periodSeconds: 1 },
            volumeMounts: [{ name: "shared", mountPath: "/shared" }, {
              name: "mem",
              mountPath: "/mem",
            }],
          },
          {
            name: "client",
            image: IMAGE,
            command: ["sleep", "infinity"],
            env: [
              { name: "PLAIN", value: "plain-value" },
              {
                name: "FROM_SECRET",
                valueFrom: { secretKeyRef: { name: `${name}-waffle`, key: "agent-token" } },
              },
            ],
            workingDir: "/workspace",
            securityContext: {
              runAsUser: 1000,
              runAsGroup: 1000,
              readOnlyRootFilesystem: true,
              allowPrivilegeEscalation: false,
              privileged: false,
              capabilities: { drop: ["ALL"] },
            },
            resources: {
              limits: { memory: "64Mi", cpu: "500m" },
              requests: { memory: "64Mi", cpu: "500m" },
            },
            volumeMounts: [
              { name: "shared", mountPath: "/shared" },
              { name: "shared", mountPath: "/sub", subPath: "nested/dir" },
              { name: "mem", mountPath: "/mem" },
              { name: "workspace", mountPath: "/workspace" },
              { name: "secrets", mountPath: "/var/run/waffle", readOnly: true },
            ],
          },
        ],
        volumes: [
          { name: "shared", emptyDir: {} },
          { name: "mem", emptyDir: { medium: "Memory", sizeLimit: "8Mi" } },
          { name: "secrets", secret: { secretName: `${name}-waffle`, defaultMode: 0o400 } },
        ],
      },
    },
  });
}

/** A running two-container pod (podSandbox) in a stand-in. */
interface PodFixture extends Api {
  docker: DockerClient;
  name: string;
  ip: string;
  ids: Record<string, string>;
  inClient(script: string): Promise<Shell>;
  inServer(script: string): Promise<Shell>;
}

function podTest(name: string, fn: (pod: PodFixture) => Promise<void>): void {
  liveTest(`k8s stand-in: ${name}`, async (docker) => {
    await withStandIn(docker, async (standIn) => {
      const ns = "tenant-b";
      const name = "wfl-pod1";
      const ref = { group: GROUP, version: VERSION, namespace: ns, plural: PLURAL };
      const api = { standIn, ...clients(standIn), ns, ref };
      // The Sandbox first: its pod waits (retried) for the Secret it names, owned by the Sandbox.
      const created = await api.custom.createNamespacedCustomObject({
        ...ref,
        body: podSandbox(name),
      }) as KubeObject;
      const owner = {
        apiVersion: `${GROUP}/${VERSION}`,
        kind: "Sandbox",
        name,
        uid: created.metadata.uid,
      };
      await api.core.createNamespacedSecret({
        namespace: ns,
        body: {
          metadata: { name: `${name}-waffle`, ownerReferences: [owner] },
          stringData: { "agent-token": "s3cret" },
        },
      });
      await standIn.settled(120_000);
      const object = await api.custom.getNamespacedCustomObject({ ...ref, name }) as KubeObject;
      const ids = standIn.podContainers(ns, name)!;
      await fn({
        ...api,
        docker,
        name,
        ip: object.status.podIPs[0],
        ids,
        inClient: (script) => shell(docker, ids.client!, script),
        inServer: (script) => shell(docker, ids.server!, script),
      });
    });
  }, LIVE);
}

podTest(
  "a pod's containers share one network, one IPC namespace and one kernel's locks",
  async (pod) => {
    const { custom, ref, name, ns, ip, inClient, inServer } = pod;
    const object = await custom.getNamespacedCustomObject({ ...ref, name }) as KubeObject;
    const ready = object.status.conditions.find((c: KubeObject) => c.type === "Ready");
    assert.deepEqual([ready.status, ready.reason], ["True", "DependenciesReady"]);
    assert.equal(object.status.nodeName, "standin");
    assert.equal(object.status.serviceFQDN, `${name}.${ns}.svc.cluster.local`);
    // The host reaches the pod's IP (as waffle's server must).
    assert.equal(await readSocket(ip, 7000), "hello-from-server");
    // One network: the client reaches the server on 127.0.0.1; nothing off the machine.
    const local = await inClient(
      `python3 -c "import socket;s=socket.create_connection(('127.0.0.1',7000));print(s.recv(99).decode())"`,
    );
    assert.equal(local.stdout.trim(), "hello-from-server", local.stderr);
    const outside = await inClient(
      `python3 -c "import socket;socket.create_connection(('1.1.1.1',53),timeout=3)"`,
    );
    assert.notEqual(outside.exitCode, 0, "an internal network routes nowhere");
    // One IPC namespace: a queue one makes, the other sees.
    const queue = await inServer("ipcmk -Q");
    const queueId = queue.stdout.match(/\d+/)?.[0];
    assert.ok(queueId !== undefined, queue.stdout + queue.stderr);
    assert.match((await inClient("ipcs -q")).stdout, new RegExp(`\\b${queueId}\\b`));
    // The init container ran first, into the shared emptyDir.
    assert.equal((await inClient("cat /shared/init-done")).stdout.trim(), "prepared");
    // One kernel's POSIX locks on the shared emptyDir: "database is locked" while the other holds a write.
    await assertSharedLocks(inServer, inClient);
  },
);

podTest("a pod's containers run as their spec says, and one that exits comes back", async (pod) => {
  const { docker, core, ns, name, ip, ids, inClient } = pod;
  assert.equal((await inClient("id -u; id -g")).stdout.trim(), "1000\n1000");
  const readOnly = await inClient("touch /rootfile");
  assert.notEqual(readOnly.exitCode, 0);
  assert.match(readOnly.stderr, /Read-only file system/);
  const status = (await inClient("grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status")).stdout;
  assert.match(status, /CapEff:\s+0000000000000000/);
  assert.match(status, /CapBnd:\s+0000000000000000/);
  assert.match(status, /NoNewPrivs:\s+1/);
  assert.equal(
    (await inClient("printenv PLAIN FROM_SECRET; pwd")).stdout,
    "plain-value\ns3cret\n/workspace\n",
  );
  assert.equal((await inClient("stat -c %a /var/run/waffle/agent-token")).stdout.trim(), "400");
  assert.equal((await inClient("echo x > /sub/f && cat /shared/nested/dir/f")).stdout.trim(), "x");
  const overflow = await inClient("dd if=/dev/zero of=/mem/big bs=1M count=16");
  assert.notEqual(overflow.exitCode, 0, "the Memory emptyDir's sizeLimit is its tmpfs size");
  const client = await docker.inspectContainer(ids.client!);
  assert.equal(client?.HostConfig.Memory, 64 * 2 ** 20);
  assert.equal(client?.HostConfig.PidsLimit, POD_PIDS_LIMIT);
  assert.equal(client?.HostConfig.NanoCpus, 0.5e9);
  // A container that exits is restarted (restartPolicy Always), the Pod's status says so.
  await inClient("touch /shared/crash");
  await waitUntil(async () => {
    const podObject = await core.readNamespacedPod({ namespace: ns, name });
    const server = podObject.status?.containerStatuses?.find((c) => c.name === "server");
    return (server?.restartCount ?? 0) >= 1 && server?.ready === true;
  }, "the server's restart");
  assert.equal(await readSocket(ip, 7000), "hello-from-server");
  assert.equal((await inClient("test -e /shared/crash; echo $?")).stdout, "1\n");
});

podTest(
  "a claim outlives Suspended; delete removes the pod, its claim and its Secret",
  async (pod) => {
    const { standIn, docker, custom, core, ref, ns, name, ids, inClient } = pod;
    await inClient("echo kept > /workspace/keep.txt");
    await custom.patchNamespacedCustomObject({
      ...ref,
      name,
      body: { spec: { operatingMode: "Suspended" } },
    }, MERGE);
    await standIn.settled(60_000);
    const object = await custom.getNamespacedCustomObject({ ...ref, name }) as KubeObject;
    const conditions = Object.fromEntries(
      object.status.conditions.map((c: KubeObject) => [c.type, [c.status, c.reason]]),
    );
    assert.deepEqual(conditions, {
      Ready: ["False", "SandboxSuspended"],
      Suspended: ["True", "PodTerminated"],
    });
    assert.equal(object.status.podIPs, undefined);
    assert.equal(standIn.podContainers(ns, name), undefined);
    for (const id of Object.values(ids)) {
      assert.equal(
        await docker.inspectContainer(id),
        null,
        `container ${id} left`,
      );
    }
    const claim = await core.readNamespacedPersistentVolumeClaim({
      namespace: ns,
      name: `workspace-${name}`,
    });
    assert.equal(claim.status?.phase, "Bound");
    await custom.patchNamespacedCustomObject({
      ...ref,
      name,
      body: { spec: { operatingMode: "Running" } },
    }, MERGE);
    await standIn.settled(120_000);
    const resumed = standIn.podContainers(ns, name)!;
    assert.notEqual(resumed.client, ids.client);
    assert.equal(
      (await shell(docker, resumed.client!, "cat /workspace/keep.txt")).stdout,
      "kept\n",
    );
    assert.equal(
      (await shell(docker, resumed.client!, "ls /shared")).stdout,
      "init-done\nnested\n",
      "a new pod's emptyDir is new (only the init container's file and the subPath made at mount)",
    );
    // Delete: the pod, its containers, the claim (and its files) and the Secret go.
    await custom.deleteNamespacedCustomObject({ ...ref, name });
    await waitUntil(() => standIn.podContainers(ns, name) === undefined, "the pod to go");
    await standIn.settled(60_000);
    await waitUntil(
      async () =>
        (await docker.listContainers({ all: true, labels: [`io.kubernetes.pod.name=${name}`] }))
          .length === 0,
      "containers to go",
    );
    assert.deepEqual((await core.listNamespacedPersistentVolumeClaim({ namespace: ns })).items, []);
    assert.deepEqual((await core.listNamespacedPod({ namespace: ns })).items, []);
    assert.deepEqual(
      (await core.listNamespacedSecret({ namespace: ns })).items,
      [],
      "the garbage collector took the Secret",
    );
    await waitUntil(async () => {
      for await (const _ of Deno.readDir(`${standIn.root}/pvcs/${ns}`)) return false;
      return true;
    }, "the claim's files to go");
  },
);

// The server holds a write transaction on /shared/db; the client is refused
// ("database is locked") until it commits, then sees its row.
async function assertSharedLocks(
  inServer: (script: string) => Promise<Shell>,
  inClient: (script: string) => Promise<Shell>,
): Promise<void> {
  const holder = "import sqlite3,os,time\n" +
    "c=sqlite3.connect('/shared/db',isolation_level=None)\nc.execute('create table if not exists t(x)')\n" +
    "os.chmod('/shared/db',0o666)\n" +
    "c.execute('begin immediate')\nc.execute('insert into t values(1)')\nopen('/shared/held','w').close()\n" +
    "for _ in range(600):\n if os.path.exists('/shared/release'): break\n time.sleep(0.05)\nc.execute('commit')\n" +
    "open('/shared/committed','w').close()\n";
  await inServer(
    `cat > /shared/holder.py <<'EOF'\n${holder}EOF\nchmod 666 /shared/holder.py; (python3 /shared/holder.py >/dev/null 2>&1 &)`,
  );
  await waitUntil(
    async () => (await inClient("test -e /shared/held")).exitCode === 0,
    "the write transaction",
  );
  const write =
    `python3 -c "import sqlite3;c=sqlite3.connect('/shared/db',timeout=0,isolation_level=None);c.execute('begin immediate');print(c.execute('select count(*) from t').fetchone()[0]);c.execute('commit')"`;
  const refused = await inClient(write);
  assert.notEqual(refused.exitCode, 0, `${refused.stdout} ${refused.stderr}`);
  assert.match(refused.stderr, /database is locked/);
  await inClient("touch /shared/release");
  await waitUntil(
    async () => (await inClient("test -e /shared/committed")).exitCode === 0,
    "the commit",
  );
  const after = await inClient(write);
  assert.equal(after.stdout.trim(), "1", after.stderr);
}

interface Shell {
  exitCode: number;
  stdout: string;
  stderr: string;
}

// `sh -c script` in a running container, its output as text.
async function shell(docker: DockerClient, id: string, script: string): Promise<Shell> {
  const result = await docker.exec(id, ["sh", "-c", script], { timeoutMs: 30_000 });
  const text = (bytes: Uint8Array): string => new TextDecoder().decode(bytes);
  return { exitCode: result.exitCode, stdout: text(result.stdout), stderr: text(result.stderr) };
}

async function readSocket(hostname: string, port: number): Promise<string> {
  const conn = await Deno.connect({ hostname, port });
  const chunks: Uint8Array[] = [];
  for await (const chunk of conn.readable) chunks.push(chunk);
  return new TextDecoder().decode(new Uint8Array(chunks.flatMap((c) => [...c])));
}

async function fetchJsonLines(standIn: StandIn, path: string): Promise<KubeObject[]> {
  const response = await fetch(`${standIn.url}${path}`, {
    headers: { authorization: `Bearer ${standIn.token}` },
  });
  const text = await response.text();
  return text.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line));
}

async function waitUntil(check: () => boolean | Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 1200; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`Timed out waiting for ${what}`);
}
