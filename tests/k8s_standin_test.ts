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

liveTest(
  "k8s stand-in: answers client-node's create, get, list, patch, delete and watch as the API server does",
  async (docker) => {
    await withStandIn(docker, async (standIn) => {
      const { custom, core, config } = clients(standIn);
      const ns = "tenant-a";
      const ref = { group: GROUP, version: VERSION, namespace: ns, plural: PLURAL };
      const events: string[] = [];
      const list0 = await custom.listNamespacedCustomObject(ref) as KubeObject;
      assert.equal(list0.kind, "SandboxList");
      const watching = await new Watch(config).watch(
        `/apis/${GROUP}/${VERSION}/namespaces/${ns}/${PLURAL}`,
        { resourceVersion: list0.metadata.resourceVersion },
        (type, object) =>
          events.push(
            `${type} ${object.metadata.name} ${object.metadata.resourceVersion} ${
              JSON.stringify(object.metadata.labels ?? {})
            } ${object.metadata.generation}`,
          ),
        () => {},
      );
      try {
        const suspended = {
          operatingMode: "Suspended",
          podTemplate: { spec: { containers: [SLEEPER] } },
        };
        const one = await custom.createNamespacedCustomObject({
          ...ref,
          body: sandbox("one", suspended, { a: "b" }),
        }) as KubeObject;
        assert.equal(one.metadata.namespace, ns);
        assert.equal(one.metadata.generation, 1);
        assert.match(one.metadata.uid, /^[0-9a-f-]{36}$/);
        assert.match(one.metadata.creationTimestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
        await custom.createNamespacedCustomObject({ ...ref, body: sandbox("two", suspended) });
        // AlreadyExists, Invalid (name, containers), BadRequest (kind), as Status bodies.
        const again = await failure(() =>
          custom.createNamespacedCustomObject({ ...ref, body: sandbox("one", suspended) })
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
        const badName = await failure(() =>
          custom.createNamespacedCustomObject({ ...ref, body: sandbox("Bad_Name", suspended) })
        );
        assert.equal(badName.code, 422);
        assert.equal(badName.status.reason, "Invalid");
        assert.equal(badName.status.details.causes[0].field, "metadata.name");
        const noContainers = await failure(() =>
          custom.createNamespacedCustomObject({
            ...ref,
            body: sandbox("three", { podTemplate: { spec: {} } }),
          })
        );
        assert.equal(noContainers.code, 422);
        assert.equal(
          noContainers.status.details.causes[0].field,
          "spec.podTemplate.spec.containers",
        );
        const badPort = await failure(() =>
          custom.createNamespacedCustomObject({
            ...ref,
            body: sandbox("five", {
              podTemplate: {
                spec: { containers: [{ ...SLEEPER, ports: [{ containerPort: "80" }] }] },
              },
            }),
          })
        );
        assert.equal(badPort.code, 422);
        assert.equal(
          badPort.status.details.causes[0].field,
          "spec.podTemplate.spec.containers[0].ports[0].containerPort",
        );
        const wrongKind = await failure(() =>
          custom.createNamespacedCustomObject({
            ...ref,
            body: { ...sandbox("four", suspended), kind: "Pod" },
          })
        );
        assert.equal(wrongKind.code, 400);
        // Get, list with a label selector.
        const got = await custom.getNamespacedCustomObject({ ...ref, name: "one" }) as KubeObject;
        assert.equal(got.metadata.uid, one.metadata.uid);
        const selected = await custom.listNamespacedCustomObject({
          ...ref,
          labelSelector: "a=b",
        }) as KubeObject;
        assert.deepEqual(selected.items.map((i: KubeObject) => i.metadata.name), ["one"]);
        const all = await custom.listNamespacedCustomObject(ref) as KubeObject;
        assert.deepEqual(all.items.map((i: KubeObject) => i.metadata.name), ["one", "two"]);
        // Merge patch: a label, then the spec (generation moves); status only through /status.
        const merge = setHeaderOptions("Content-Type", PatchStrategy.MergePatch);
        const labelled = await custom.patchNamespacedCustomObject(
          {
            ...ref,
            name: "one",
            body: { metadata: { labels: { c: "d" } }, status: { podIPs: ["1.2.3.4"] } },
          },
          merge,
        ) as KubeObject;
        assert.deepEqual(labelled.metadata.labels, { a: "b", c: "d" });
        assert.equal(labelled.metadata.generation, 1);
        assert.ok(Number(labelled.metadata.resourceVersion) > Number(one.metadata.resourceVersion));
        assert.equal(labelled.status?.podIPs, undefined, "status is written only through /status");
        const respec = await custom.patchNamespacedCustomObject(
          {
            ...ref,
            name: "one",
            body: {
              metadata: { labels: { a: null } },
              spec: { podTemplate: { metadata: { labels: { x: "y" } } } },
            },
          },
          merge,
        ) as KubeObject;
        assert.deepEqual(respec.metadata.labels, { c: "d" });
        assert.equal(respec.metadata.generation, 2);
        assert.deepEqual(respec.spec.podTemplate.spec.containers, [SLEEPER]);
        const stale = await failure(() =>
          custom.patchNamespacedCustomObject(
            {
              ...ref,
              name: "one",
              body: {
                metadata: { resourceVersion: one.metadata.resourceVersion, labels: { e: "f" } },
              },
            },
            merge,
          )
        );
        assert.deepEqual([stale.code, stale.status.reason], [409, "Conflict"]);
        // JSON patch (client-node's default).
        const jsonPatched = await custom.patchNamespacedCustomObject({
          ...ref,
          name: "two",
          body: [{ op: "add", path: "/metadata/annotations", value: { "waffle.dev/end-at": "1" } }],
        }) as KubeObject;
        assert.deepEqual(jsonPatched.metadata.annotations, { "waffle.dev/end-at": "1" });
        // Delete: the object back, then 404.
        const deleted = await custom.deleteNamespacedCustomObject({
          ...ref,
          name: "one",
        }) as KubeObject;
        assert.equal(deleted.metadata.uid, one.metadata.uid);
        const gone = await failure(() => custom.getNamespacedCustomObject({ ...ref, name: "one" }));
        assert.deepEqual([gone.code, gone.status.reason, gone.status.message], [
          404,
          "NotFound",
          `${PLURAL}.${GROUP} "one" not found`,
        ]);
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
        // The watch saw every change of the namespace's Sandboxes, in order, once.
        await waitUntil(
          () => events.some((e) => e.startsWith("DELETED one")),
          "the watch's DELETED",
        );
        // The controller's status writes come between (MODIFIED): each change
        // is there, in resourceVersion order, the first an ADDED, the last of
        // "one" its DELETED.
        const of = (name: string): string[] =>
          events.filter((e) => e.split(" ")[1] === name).map((e) => e.split(" ")[0]!);
        assert.equal(of("one")[0], "ADDED");
        assert.equal(of("one").at(-1), "DELETED");
        assert.deepEqual(new Set(of("one").slice(1, -1)), new Set(["MODIFIED"]));
        assert.equal(of("two")[0], "ADDED");
        assert.ok(events.some((e) => e.startsWith("MODIFIED one") && e.endsWith(' {"c":"d"} 2')));
        const versions = events.map((e) => Number(e.split(" ")[2]));
        assert.deepEqual(versions, [...new Set(versions)].sort((a, b) => a - b));
        // A watch from a resourceVersion replays what followed it: what the live watch saw.
        const replay = (await fetchJsonLines(
          standIn,
          `/apis/${GROUP}/${VERSION}/namespaces/${ns}/${PLURAL}?watch=1&resourceVersion=${one.metadata.resourceVersion}&timeoutSeconds=1`,
        )).map((e) => `${e.type} ${e.object.metadata.name} ${e.object.metadata.resourceVersion}`);
        const live = events.map((e) => e.split(" ").slice(0, 3).join(" "));
        assert.deepEqual(replay.slice(0, live.length - 1), live.slice(1));
      } finally {
        watching.abort();
      }
      // No token, a wrong one, an unknown path.
      const anonymous = await fetch(
        `${standIn.url}/apis/${GROUP}/${VERSION}/namespaces/${ns}/${PLURAL}`,
      );
      assert.deepEqual([anonymous.status, (await anonymous.json()).reason], [401, "Unauthorized"]);
      const wrong = await fetch(`${standIn.url}/api/v1/namespaces/${ns}/secrets`, {
        headers: { authorization: "Bearer nope" },
      });
      assert.equal(wrong.status, 401);
      await wrong.body?.cancel();
      const unknown = await fetch(
        `${standIn.url}/apis/${GROUP}/${VERSION}/namespaces/${ns}/widgets`,
        {
          headers: { authorization: `Bearer ${standIn.token}` },
        },
      );
      assert.deepEqual([unknown.status, (await unknown.json()).kind], [404, "Status"]);
    });
  },
  LIVE,
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

liveTest(
  "k8s stand-in: a pod's containers share network, IPC and locks; securityContext holds; a claim outlives Suspended; delete removes all",
  async (docker) => {
    await withStandIn(docker, async (standIn) => {
      const { custom, core } = clients(standIn);
      const ns = "tenant-b";
      const name = "wfl-pod1";
      const ref = { group: GROUP, version: VERSION, namespace: ns, plural: PLURAL };
      // The Sandbox first: its pod waits (retried) for the Secret it names, owned by the Sandbox.
      const created = await custom.createNamespacedCustomObject({
        ...ref,
        body: podSandbox(name),
      }) as KubeObject;
      await core.createNamespacedSecret({
        namespace: ns,
        body: {
          metadata: {
            name: `${name}-waffle`,
            ownerReferences: [{
              apiVersion: `${GROUP}/${VERSION}`,
              kind: "Sandbox",
              name,
              uid: created.metadata.uid,
            }],
          },
          stringData: { "agent-token": "s3cret" },
        },
      });
      await standIn.settled(120_000);
      let object = await custom.getNamespacedCustomObject({ ...ref, name }) as KubeObject;
      const ready = object.status.conditions.find((c: KubeObject) => c.type === "Ready");
      assert.deepEqual([ready.status, ready.reason], ["True", "DependenciesReady"]);
      assert.equal(object.status.nodeName, "standin");
      assert.equal(object.status.serviceFQDN, `${name}.${ns}.svc.cluster.local`);
      const [ip] = object.status.podIPs;
      // The host reaches the pod's IP (as waffle's server must).
      assert.equal(await readSocket(ip, 7000), "hello-from-server");
      const ids = standIn.podContainers(ns, name)!;
      const inClient = (script: string): Promise<Shell> => shell(docker, ids.client!, script);
      const inServer = (script: string): Promise<Shell> => shell(docker, ids.server!, script);
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
      // The securityContext, env and volumes as the spec says.
      assert.equal((await inClient("id -u; id -g")).stdout.trim(), "1000\n1000");
      const readOnly = await inClient("touch /rootfile");
      assert.notEqual(readOnly.exitCode, 0);
      assert.match(readOnly.stderr, /Read-only file system/);
      const status =
        (await inClient("grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status")).stdout;
      assert.match(status, /CapEff:\s+0000000000000000/);
      assert.match(status, /CapBnd:\s+0000000000000000/);
      assert.match(status, /NoNewPrivs:\s+1/);
      assert.equal(
        (await inClient("printenv PLAIN FROM_SECRET; pwd")).stdout,
        "plain-value\ns3cret\n/workspace\n",
      );
      assert.equal((await inClient("stat -c %a /var/run/waffle/agent-token")).stdout.trim(), "400");
      assert.equal(
        (await inClient("echo x > /sub/f && cat /shared/nested/dir/f")).stdout.trim(),
        "x",
      );
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
      // The claim outlives Suspended, comes back on Running.
      await inClient("echo kept > /workspace/keep.txt");
      const merge = setHeaderOptions("Content-Type", PatchStrategy.MergePatch);
      await custom.patchNamespacedCustomObject({
        ...ref,
        name,
        body: { spec: { operatingMode: "Suspended" } },
      }, merge);
      await standIn.settled(60_000);
      object = await custom.getNamespacedCustomObject({ ...ref, name }) as KubeObject;
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
        assert.equal(await docker.inspectContainer(id), null, `container ${id} left`);
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
      }, merge);
      await standIn.settled(120_000);
      const resumed = standIn.podContainers(ns, name)!;
      assert.notEqual(resumed.client, ids.client);
      const kept = await shell(docker, resumed.client!, "cat /workspace/keep.txt");
      assert.equal(kept.stdout, "kept\n");
      assert.equal(
        (await shell(docker, resumed.client!, "ls /shared")).stdout,
        "init-done\nnested\n",
        "a new pod's emptyDir is new (only the init container's file and the subPath made at mount)",
      );
      // Delete: the pod, its containers and the claim go.
      await custom.deleteNamespacedCustomObject({ ...ref, name });
      await waitUntil(() => standIn.podContainers(ns, name) === undefined, "the pod to go");
      await standIn.settled(60_000);
      await waitUntil(
        async () =>
          (await docker.listContainers({ all: true, labels: [`io.kubernetes.pod.name=${name}`] }))
            .length === 0,
        "containers to go",
      );
      const claims = await core.listNamespacedPersistentVolumeClaim({ namespace: ns });
      assert.deepEqual(claims.items, []);
      const pods = await core.listNamespacedPod({ namespace: ns });
      assert.deepEqual(pods.items, []);
      const secrets = await core.listNamespacedSecret({ namespace: ns });
      assert.deepEqual(secrets.items, [], "the garbage collector took the Secret it owned");
      // The claim's files go with it.
      await waitUntil(async () => {
        for await (const _ of Deno.readDir(`${standIn.root}/pvcs/${ns}`)) return false;
        return true;
      }, "the claim's files to go");
    });
  },
  LIVE,
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
