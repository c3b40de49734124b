/**
 * The E2B SDK test of `waffle serve` (`serve_e2b_test.ts`), run again with
 * `[backend] kind = "kubernetes"` against the Kubernetes stand-in: the real
 * `waffle serve` makes, suspends and deletes agent-sandbox `Sandbox`
 * objects, and each sandbox is a pod of real containers (the runner, and
 * `waffle agent` holding its queue and answering its envd). The stand-in is
 * a MOCK of the API server and the kubelet (`_k8s_standin.ts`): no cluster
 * can run on this machine. Then what is Kubernetes' own: the objects hold
 * everything (a second server serves the same sandboxes), and pause is a
 * suspend (the pod goes, the workspace claim stays).
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import { delay, runCliProcess, suffixTestNames } from "./_helpers.ts";
import {
  baseTest,
  sdk,
  type Served,
  serveForFile,
  serveOnKubernetes,
  stopRigTest,
} from "./_serve_helpers.ts";
import { type KubeObject, RESOURCES } from "./_k8s_api.ts";
import { K8S_ANNOTATIONS } from "../lib/k8s/sandbox_object.ts";

const SANDBOXES = RESOURCES.find((resource) => resource.plural === "sandboxes")!;
const SECRETS = RESOURCES.find((resource) => resource.plural === "secrets")!;

suffixTestNames(" [kubernetes]");
const stopRig = serveOnKubernetes({
  "e2b SDK: pause freezes a background counter, calls fail while paused, connect resumes it where it was":
    "a Suspended Sandbox's pod is deleted, so its processes end; the Kubernetes pause test below checks what holds instead",
});
await import("./serve_e2b_test.ts");

// A sandbox's object as the stand-in holds it.
function objectOf(served: Served, id: string): KubeObject {
  const found = served.kube!.standIn.objects.list(SANDBOXES, undefined)
    .find((object) => object.metadata.labels?.["waffle.dev/id"] === id);
  assert.ok(found !== undefined, `no Sandbox object for '${id}'`);
  return found;
}

baseTest(
  "kubernetes: a sandbox is its objects: a second server, sharing nothing but the cluster, serves it",
  async () => {
    const first = await serveForFile();
    let second: Served | undefined;
    try {
      const sandbox = await Sandbox.create("base", {
        ...sdk(first, first.keys.a),
        timeoutMs: 120_000,
      });
      await sandbox.files.write("/home/user/note.txt", "kept in the claim");
      const object = objectOf(first, sandbox.sandboxId);
      assert.equal(object.metadata.namespace, "waffle-a");
      assert.equal(object.metadata.annotations[K8S_ANNOTATIONS.tenant], "a");
      assert.equal(object.spec.operatingMode, "Running");
      const secret = first.kube!.standIn.objects.find(
        SECRETS,
        "waffle-a",
        object.metadata.annotations[K8S_ANNOTATIONS.secret],
      );
      assert.ok(secret !== undefined, "its Secret is beside it");
      // Another server: its own home and keys, the same cluster.
      second = await serveForFile({ kube: first.kube! });
      const listed = await Sandbox.list(sdk(second, second.keys.a)).nextItems();
      assert.ok(listed.some((s) => s.sandboxId === sandbox.sandboxId), "listed by the second");
      const other = await Sandbox.list(sdk(second, second.keys.b)).nextItems();
      assert.ok(!other.some((s) => s.sandboxId === sandbox.sandboxId), "not by another tenant");
      const same = await Sandbox.connect(sandbox.sandboxId, sdk(second, second.keys.a));
      assert.equal((await same.commands.run("cat note.txt")).stdout, "kept in the claim");
      await same.kill();
      for (let i = 0; i < 100 && (await first.leftovers()).length > 0; i++) await delay(100);
      assert.deepEqual(await first.leftovers(), []);
    } finally {
      await second?.stop();
      await first.stop();
    }
  },
  { sanitize: false },
);

baseTest(
  "kubernetes: pause suspends (the pod goes, the claim stays), connect resumes with the files",
  async () => {
    const served = await serveForFile();
    try {
      const opts = sdk(served, served.keys.a);
      const sandbox = await Sandbox.create("base", { ...opts, timeoutMs: 120_000 });
      await sandbox.files.write("/home/user/kept.txt", "before the pause");
      const object = objectOf(served, sandbox.sandboxId);
      const { namespace, name } = object.metadata;
      assert.ok(served.kube!.standIn.podContainers(namespace, name) !== undefined, "a pod runs");
      assert.equal(await sandbox.pause(), true);
      assert.equal(objectOf(served, sandbox.sandboxId).spec.operatingMode, "Suspended");
      await served.kube!.standIn.settled();
      assert.equal(served.kube!.standIn.podContainers(namespace, name), undefined, "no pod");
      assert.equal((await sandbox.getInfo()).state, "paused");
      assert.equal(await Sandbox.pause(sandbox.sandboxId, opts), false, "already paused: 409");
      await assert.rejects(
        sandbox.commands.run("true"),
        new RegExp(`Sandbox '${sandbox.sandboxId}' is paused`),
      );
      const resumed = await Sandbox.connect(sandbox.sandboxId, opts);
      assert.equal((await resumed.getInfo()).state, "running");
      assert.equal((await resumed.commands.run("cat kept.txt")).stdout, "before the pause");
      await resumed.kill();
    } finally {
      await served.stop();
    }
  },
  { sanitize: false },
);

baseTest(
  "kubernetes: a tenant's max_sandboxes counts its own sandboxes, creates under way included",
  async () => {
    const served = await serveForFile({ toml: "[serve.tenants.a]\nmax_sandboxes = 1\n" });
    try {
      // Two at once: one is made, the other refused with 429.
      const made = await Promise.allSettled([
        Sandbox.create("base", { ...sdk(served, served.keys.a), timeoutMs: 60_000 }),
        Sandbox.create("base", { ...sdk(served, served.keys.a), timeoutMs: 60_000 }),
      ]);
      const ok = made.filter((m) => m.status === "fulfilled");
      const refused = made.filter((m) => m.status === "rejected");
      assert.equal(ok.length, 1, JSON.stringify(made.map((m) => m.status)));
      assert.match(String((refused[0] as PromiseRejectedResult).reason), /429|limit/i);
      // Another tenant is not counted against it.
      const other = await Sandbox.create("base", {
        ...sdk(served, served.keys.b),
        timeoutMs: 60_000,
      });
      await other.kill();
      await (ok[0] as PromiseFulfilledResult<Sandbox>).value.kill();
    } finally {
      await served.stop();
    }
  },
  { sanitize: false },
);

baseTest("kubernetes: doctor reads the Sandbox objects through the kubeconfig", async () => {
  const served = await serveForFile();
  try {
    const run = await runCliProcess(["doctor", "--no-docker", "--json"], {
      env: { WAFFLE_HOME: served.home },
    });
    const rows = JSON.parse(run.stdout).checks as { name: string; ok: boolean; detail: string }[];
    const sandboxes = rows.find((row) => row.name === "kubernetes sandboxes");
    assert.ok(sandboxes?.ok === true, run.stdout);
    assert.match(sandboxes.detail, /Sandbox objects readable: \d+ of waffle's/);
    assert.ok(rows.find((row) => row.name === "kubernetes credentials")?.ok, run.stdout);
  } finally {
    await served.stop();
  }
}, { sanitize: false });

baseTest(
  "kubernetes: a fork or a snapshot is refused in one line, naming the backend",
  async () => {
    const served = await serveForFile();
    try {
      const sandbox = await Sandbox.create("base", {
        ...sdk(served, served.keys.a),
        timeoutMs: 60_000,
      });
      const post = async (path: string, body: unknown): Promise<Response> =>
        await fetch(`${served.url}/sandboxes/${sandbox.sandboxId}${path}`, {
          method: "POST",
          headers: { "x-api-key": served.keys.a, "content-type": "application/json" },
          body: JSON.stringify(body),
        });
      const forked = await post("/fork", { count: 2 });
      assert.equal(forked.status, 201);
      const outcomes = await forked.json() as { error?: { code: number; message: string } }[];
      assert.equal(outcomes.length, 2);
      for (const outcome of outcomes) {
        assert.equal(outcome.error?.code, 501);
        assert.match(
          outcome.error!.message,
          /Fork is not available with \[backend\] kind = "kubernetes"/,
        );
      }
      const snapshot = await post("/snapshots", {});
      assert.equal(snapshot.status, 400);
      assert.match((await snapshot.json()).message, /Snapshots are not available with \[backend\]/);
      // Nothing was made: the one sandbox is all the stand-in holds.
      assert.deepEqual(await served.leftovers(), [`wfl-${sandbox.sandboxId}`]);
      await sandbox.kill();
    } finally {
      await served.stop();
    }
  },
  { sanitize: false },
);

stopRigTest(stopRig);
