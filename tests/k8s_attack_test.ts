/**
 * Attacks on `waffle serve` with `[backend] kind = "kubernetes"`, mounted
 * for real: a real `waffle serve` process, real pods (the runner and
 * `waffle agent`) run by the Kubernetes stand-in (`_k8s_standin.ts`, a MOCK
 * of the API server and the kubelet: no cluster can run here). Each test
 * attacks the envd proxy, the agent's auth or the informer, and checks a
 * victim: another sandbox, another tenant, the agent token, the server.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import { delay, runProcess, text } from "./_helpers.ts";
import {
  baseTest,
  rawGet,
  sdk,
  type Served,
  serveForFile,
  serveOnKubernetes,
  stopRigTest,
} from "./_serve_helpers.ts";
import { type KubeObject, RESOURCES } from "./_k8s_api.ts";
import { AGENT_TOKEN_HEADER, K8S_ANNOTATIONS, SECRET_KEYS } from "../lib/k8s/sandbox_object.ts";
import type { DockerClient } from "../lib/docker/mod.ts";

const SANDBOXES = RESOURCES.find((resource) => resource.plural === "sandboxes")!;
const SECRETS = RESOURCES.find((resource) => resource.plural === "secrets")!;

const stopRig = serveOnKubernetes({});

/** A sandbox's object, pod and Secret as the stand-in holds them. */
interface Pod {
  object: KubeObject;
  ip: string;
  runner: string;
  agent: string;
  accessToken: string;
  agentToken: string;
}

function podOf(served: Served, id: string): Pod {
  const standIn = served.kube!.standIn;
  const object = standIn.objects.list(SANDBOXES, undefined)
    .find((o) => o.metadata.labels?.["waffle.dev/id"] === id);
  assert.ok(object !== undefined, `no Sandbox object for '${id}'`);
  const { namespace, name } = object.metadata;
  const containers = standIn.podContainers(namespace, name);
  assert.ok(containers !== undefined, `no pod for '${id}'`);
  const secret = standIn.objects.find(
    SECRETS,
    namespace,
    object.metadata.annotations[K8S_ANNOTATIONS.secret],
  );
  assert.ok(secret !== undefined, `no Secret for '${id}'`);
  const key = (name: string): string => atob(secret.data[name]);
  return {
    object,
    ip: object.status.podIPs[0],
    runner: containers.runner!,
    agent: containers["waffle-agent"]!,
    accessToken: key(SECRET_KEYS.accessToken),
    agentToken: key(SECRET_KEYS.agentToken),
  };
}

// A Connect unary call of envd through the server.
function stat(served: Served, id: string, headers: Record<string, string>): Promise<Response> {
  return fetch(`${served.url}/filesystem.Filesystem/Stat`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "connect-protocol-version": "1",
      "e2b-sandbox-id": id,
      ...headers,
    },
    body: JSON.stringify({ path: "/workspace" }),
  });
}

// A shell line in a container, its exit code and output.
async function sh(
  docker: DockerClient,
  container: string,
  line: string,
  user = "0",
): Promise<{ code: number; out: string }> {
  const result = await docker.exec(container, ["/bin/sh", "-c", line], {
    user,
    timeoutMs: 30_000,
  });
  return { code: result.exitCode, out: text(result.stdout) + text(result.stderr) };
}

// As a command of the sandbox runs (uid 10001, the runner's own helper).
function asCommand(
  docker: DockerClient,
  runner: string,
  line: string,
): Promise<{ code: number; out: string }> {
  return sh(docker, runner, `/opt/waffle/rt/spawn 10001 10001 /bin/sh -c '${line}'`);
}

baseTest(
  "kube envd: another sandbox's token, a forged agent token, hop-by-hop tricks and a foreign Host get nothing",
  async () => {
    const served = await serveForFile();
    try {
      const a = await Sandbox.create("base", { ...sdk(served, served.keys.a), timeoutMs: 120_000 });
      const b = await Sandbox.create("base", { ...sdk(served, served.keys.b), timeoutMs: 120_000 });
      const podA = podOf(served, a.sandboxId);
      const podB = podOf(served, b.sandboxId);
      // The control: A's own token reads A.
      const own = await stat(served, a.sandboxId, { "x-access-token": podA.accessToken });
      assert.equal(own.status, 200, await own.text());
      // B's token against A, alone and with every header trick.
      for (
        const extra of [
          {},
          { [AGENT_TOKEN_HEADER]: podA.accessToken },
          { connection: `close, ${AGENT_TOKEN_HEADER}, x-access-token` },
          { upgrade: "websocket", connection: "upgrade" },
          { "x-forwarded-host": `49983-${a.sandboxId}.example` },
        ]
      ) {
        const crossed = await stat(served, a.sandboxId, {
          "x-access-token": podB.accessToken,
          ...extra,
        });
        assert.equal(crossed.status, 401, `${JSON.stringify(extra)}: ${await crossed.text()}`);
      }
      // The client's own agent-token header is replaced, never passed on.
      const forged = await stat(served, a.sandboxId, {
        "x-access-token": podA.accessToken,
        [AGENT_TOKEN_HEADER]: "f".repeat(43),
      });
      assert.equal(forged.status, 200, await forged.text());
      // The control API: B's key cannot see or kill A.
      const info = await fetch(`${served.url}/sandboxes/${a.sandboxId}`, {
        headers: { "x-api-key": served.keys.b },
      });
      assert.equal(info.status, 404, await info.text());
      const killed = await fetch(`${served.url}/sandboxes/${a.sandboxId}`, {
        method: "DELETE",
        headers: { "x-api-key": served.keys.b },
      });
      assert.equal(killed.status, 404, await killed.text());
      // DNS rebinding: another site's Host or Origin, with A's own token.
      const { host } = new URL(served.url);
      for (
        const header of [
          { host: "evil.example" },
          { host: `evil.example:${new URL(served.url).port}` },
          { host, origin: "http://evil.example" },
          { host: `49983-${a.sandboxId}.evil.example` },
        ]
      ) {
        const rebound = await rawGet(served.url, "/health", {
          "e2b-sandbox-id": a.sandboxId,
          "x-access-token": podA.accessToken,
          ...header,
        });
        assert.match(rebound, /^HTTP\/1\.1 403/, rebound.slice(0, 300));
      }
      // Smuggling: Content-Length and Transfer-Encoding at once; a second
      // request hidden in the body must never be answered.
      const { hostname, port } = new URL(served.url);
      const conn = await Deno.connect({ hostname, port: Number(port) });
      const smuggled = `GET /sandboxes HTTP/1.1\r\nhost: ${hostname}:${port}\r\n` +
        `x-api-key: ${served.keys.a}\r\n\r\n`;
      const head = `POST /filesystem.Filesystem/Stat HTTP/1.1\r\nhost: ${hostname}:${port}\r\n` +
        `e2b-sandbox-id: ${a.sandboxId}\r\nx-access-token: ${podB.accessToken}\r\n` +
        `content-type: application/json\r\ncontent-length: 5\r\n` +
        `transfer-encoding: chunked\r\n\r\n0\r\n\r\n${smuggled}`;
      await conn.write(new TextEncoder().encode(head));
      let answer = "";
      const reader = conn.readable.pipeThrough(new TextDecoderStream()).getReader();
      const timer = setTimeout(() => conn.close(), 5_000);
      try {
        while (true) {
          const next = await reader.read().catch(() => ({ done: true, value: undefined }));
          if (next.done) break;
          answer += next.value;
        }
      } finally {
        clearTimeout(timer);
      }
      assert.doesNotMatch(answer, /HTTP\/1\.1 200/, answer.slice(0, 400));
      assert.ok(!answer.includes(a.sandboxId) || /HTTP\/1\.1 4\d\d/.test(answer), answer);
      await a.kill();
      await b.kill();
    } finally {
      await served.stop();
    }
  },
  { sanitize: false },
);

baseTest(
  "kube pod: a command and the runner reach no other agent, nor their own, and see nothing of the agent",
  async (docker) => {
    const served = await serveForFile();
    try {
      const a = await Sandbox.create("base", { ...sdk(served, served.keys.a), timeoutMs: 120_000 });
      const b = await Sandbox.create("base", { ...sdk(served, served.keys.b), timeoutMs: 120_000 });
      const podA = podOf(served, a.sandboxId);
      const podB = podOf(served, b.sandboxId);
      const curl = (target: string, headers = ""): string =>
        `curl -s -o /dev/null -w "%{http_code}" -m 5 ${headers} http://${target}:49983/health`;
      for (const as of ["command", "runner"] as const) {
        const run = (line: string) =>
          as === "command" ? asCommand(docker, podA.runner, line) : sh(docker, podA.runner, line);
        // B's agent, with A's own tokens (all A could know), and with none.
        const tokens = `-H "x-waffle-agent-token: ${podA.agentToken}" ` +
          `-H "x-access-token: ${podA.accessToken}"`;
        assert.equal((await run(curl(podB.ip))).out, "401", `${as}: B's agent`);
        assert.equal((await run(curl(podB.ip, tokens))).out, "401", `${as}: B's agent, A's tokens`);
        // Its own agent without the agent token.
        assert.equal((await run(curl("127.0.0.1"))).out, "401", `${as}: own agent`);
        assert.equal(
          (await run(curl("127.0.0.1", `-H "x-access-token: ${podA.accessToken}"`))).out,
          "401",
          `${as}: own agent, access token only`,
        );
        // Nothing of the agent: its Secret is not mounted, its process is not seen.
        // (The pattern's brackets keep this shell's own command line from matching.)
        const look = await run(
          'ls /var/run/waffle 2>&1; for f in /proc/[0-9]*/cmdline; do tr "\\0" " " <$f; echo; done | grep -c "agent --[q]ueue"',
        );
        assert.doesNotMatch(look.out, /agent-token|access-token/, look.out);
        assert.match(look.out, /^0$/m, `${as} sees the agent's process: ${look.out}`);
        const secrets = await run(`grep -rl "${podA.agentToken}" /tmp /queue /workspace 2>&1`);
        assert.doesNotMatch(secrets.out, /^\//m, `${as}: the agent token is in ${secrets.out}`);
      }
      await a.kill();
      await b.kill();
    } finally {
      await served.stop();
    }
  },
  { sanitize: false },
);

// Binds the agent's port as soon as it is free, and records each request's
// head; answers every one with a lie. Stops after 20 s.
const IMPOSTOR = `
import socket, time, os
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
end = time.time() + 60
while True:
    try:
        s.bind(("0.0.0.0", 49983))
        break
    except OSError:
        if time.time() > end:
            raise SystemExit(1)
        time.sleep(0.002)
s.listen(64)
open("/tmp/impostor.bound", "w").write(str(os.getpid()))
s.settimeout(0.5)
end = time.time() + 20
while time.time() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    c.settimeout(2)
    data = b""
    try:
        while b"\\r\\n\\r\\n" not in data:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    except Exception:
        pass
    if data:
        with open("/tmp/impostor.caught", "ab") as f:
            f.write(data.split(b"\\r\\n\\r\\n")[0] + b"\\n----\\n")
        body = b'{"lie":true}'
        try:
            c.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: "
                      + str(len(body)).encode() + b"\\r\\nconnection: close\\r\\n\\r\\n" + body)
        except Exception:
            pass
    c.close()
`;

baseTest(
  "kube pod: a command that takes the agent's port while the agent restarts gets no agent token, and its answers reach no client",
  async (docker) => {
    const served = await serveForFile();
    try {
      const a = await Sandbox.create("base", { ...sdk(served, served.keys.a), timeoutMs: 180_000 });
      const pod = podOf(served, a.sandboxId);
      // A command (uid 10001: a prompt-injected agent's code) waits for the port.
      await a.files.write("/tmp/impostor.py", IMPOSTOR);
      await a.commands.run("python3 /tmp/impostor.py >/tmp/impostor.log 2>&1", {
        background: true,
      });
      // The agent crashes (an OOM kill, a node's restart of it): its process dies.
      const pid = await runProcess("docker", ["inspect", "-f", "{{.State.Pid}}", pod.agent]);
      assert.equal(pid.code, 0, pid.stderr);
      // Clients keep calling while it is down, as a busy sandbox's SDK does.
      const answers: string[] = [];
      let calling = true;
      const calls = (async () => {
        for (let i = 0; i < 2000 && calling; i++) {
          const response = await stat(served, a.sandboxId, { "x-access-token": pod.accessToken })
            .catch((error) => new Response(String(error), { status: 599 }));
          answers.push(`${response.status} ${await response.text()}`);
          await delay(5);
        }
      })();
      Deno.kill(Number(pid.stdout.trim()), "SIGKILL");
      let caught = "";
      for (let i = 0; i < 200 && caught === ""; i++) {
        await delay(100);
        caught = (await sh(docker, pod.runner, "cat /tmp/impostor.caught 2>/dev/null")).out;
      }
      // A little longer: the window lasts until the server learns the pod is not ready.
      await delay(1000);
      calling = false;
      await calls;
      caught = (await sh(docker, pod.runner, "cat /tmp/impostor.caught 2>/dev/null")).out;
      const bound = (await sh(docker, pod.runner, "cat /tmp/impostor.bound 2>/dev/null")).out;
      assert.match(bound, /^\d+$/, "the impostor took the port");
      assert.notEqual(caught, "", "the server sent the impostor requests");
      // What it caught holds no agent token, and its lie reached no client.
      assert.ok(
        !caught.includes(pod.agentToken),
        `the agent token went to the impostor:\n${caught}`,
      );
      assert.ok(!answers.some((answer) => answer.includes('"lie"')), answers.join("\n"));
      await a.kill();
    } finally {
      await served.stop();
    }
  },
  { sanitize: false },
);

// An object as whoever may write a namespace's Sandboxes could make it:
// waffle's labels and annotations, its own Secret and pod.
function hostile(
  id: string,
  namespace: string,
  tenant: string,
  options: {
    annotations?: Record<string, string>;
    pod?: KubeObject;
    secretName?: string;
    name?: string;
  } = {},
): KubeObject {
  const name = options.name ?? `wfl-${id}`;
  const annotations = {
    [K8S_ANNOTATIONS.tenant]: tenant,
    [K8S_ANNOTATIONS.keyId]: "k_evil",
    [K8S_ANNOTATIONS.template]: "base",
    [K8S_ANNOTATIONS.image]: "waffle-base:bookworm",
    [K8S_ANNOTATIONS.metadata]: "{}",
    [K8S_ANNOTATIONS.startedAt]: String(Date.now()),
    [K8S_ANNOTATIONS.endAt]: String(Date.now() + 600_000),
    [K8S_ANNOTATIONS.secret]: options.secretName ?? `${name}-waffle`,
    [K8S_ANNOTATIONS.claim]: `workspace-${name}`,
    ...options.annotations,
  };
  return {
    apiVersion: "agents.x-k8s.io/v1beta1",
    kind: "Sandbox",
    metadata: {
      name,
      namespace,
      labels: {
        "app.kubernetes.io/managed-by": "waffle",
        "app.kubernetes.io/component": "sandbox",
        "waffle.dev/id": id,
        "waffle.dev/tenant": tenant,
      },
      annotations,
    },
    spec: options.pod === undefined
      ? {
        operatingMode: "Suspended",
        podTemplate: {
          spec: { containers: [{ name: "idle", image: "waffle-runner:latest" }] },
        },
      }
      : { operatingMode: "Running", podTemplate: { spec: options.pod } },
  };
}

function secretOf(name: string, namespace: string, data: Record<string, string>): KubeObject {
  return { apiVersion: "v1", kind: "Secret", metadata: { name, namespace }, stringData: data };
}

const EVIL_TOKENS = {
  [SECRET_KEYS.accessToken]: "e".repeat(43),
  [SECRET_KEYS.agentToken]: "f".repeat(43),
  [SECRET_KEYS.envVars]: "{}",
};

// A pod that listens on the agent's port and records what it is sent.
const LISTENER_POD = {
  restartPolicy: "Always",
  containers: [{
    name: "impostor",
    image: "waffle-base:bookworm",
    command: [
      "python3",
      "-c",
      IMPOSTOR.replace("end = time.time() + 20", "end = time.time() + 600"),
    ],
  }],
};

baseTest(
  "kube informer: hostile Sandbox objects (another tenant's claim, a taken id, a bad Secret, huge annotations) are skipped, never served",
  async (docker) => {
    const served = await serveForFile({ captureStderr: true });
    const standIn = served.kube!.standIn;
    try {
      const a = await Sandbox.create("base", { ...sdk(served, served.keys.a), timeoutMs: 180_000 });
      await a.files.write("/home/user/marker.txt", "a's own");
      // Tenant b's namespace holds an object claiming tenant a and a's sandbox id,
      // with a running pod that listens where a's agent would.
      standIn.objects.create(
        SECRETS,
        "waffle-b",
        secretOf(`wfl-${a.sandboxId}-waffle`, "waffle-b", EVIL_TOKENS),
      );
      standIn.objects.create(
        SANDBOXES,
        "waffle-b",
        hostile(a.sandboxId, "waffle-b", "a", { pod: LISTENER_POD }),
      );
      // Another claiming tenant a with an id of its own; one in a's namespace
      // with a Secret lacking the agent token; one with 1 MB of metadata.
      const fresh = (c: string) => `x${c.repeat(19)}`;
      standIn.objects.create(
        SECRETS,
        "waffle-b",
        secretOf(`wfl-${fresh("1")}-waffle`, "waffle-b", EVIL_TOKENS),
      );
      standIn.objects.create(SANDBOXES, "waffle-b", hostile(fresh("1"), "waffle-b", "a"));
      const { [SECRET_KEYS.agentToken]: _, ...lacking } = EVIL_TOKENS;
      standIn.objects.create(
        SECRETS,
        "waffle-a",
        secretOf(`wfl-${fresh("2")}-waffle`, "waffle-a", lacking),
      );
      standIn.objects.create(SANDBOXES, "waffle-a", hostile(fresh("2"), "waffle-a", "a"));
      standIn.objects.create(
        SECRETS,
        "waffle-a",
        secretOf(`wfl-${fresh("3")}-waffle`, "waffle-a", EVIL_TOKENS),
      );
      standIn.objects.create(
        SANDBOXES,
        "waffle-a",
        hostile(fresh("3"), "waffle-a", "a", {
          annotations: { [K8S_ANNOTATIONS.metadata]: JSON.stringify({ big: "m".repeat(1 << 20) }) },
        }),
      );
      // In a's own namespace, another object under another name claiming a's id.
      standIn.objects.create(
        SANDBOXES,
        "waffle-a",
        hostile(a.sandboxId, "waffle-a", "a", {
          name: "wfl-twin",
          secretName: `wfl-${fresh("3")}-waffle`,
        }),
      );
      await standIn.settled();
      const listener = standIn.podContainers("waffle-b", `wfl-${a.sandboxId}`)!.impostor!;
      // The server has seen them all by the time it lists what it learnt later.
      let listed: string[] = [];
      for (let i = 0; i < 100 && !listed.includes(fresh("3")); i++) {
        await delay(100);
        listed = (await Sandbox.list(sdk(served, served.keys.a)).nextItems()).map((s) =>
          s.sandboxId
        );
      }
      // a's traffic still goes to a's own pod, and none to the listener.
      const ran = await a.commands.run("cat marker.txt").then((r) => r.stdout, String);
      const caught = (await sh(docker, listener, "cat /tmp/impostor.caught 2>/dev/null")).out;
      assert.equal(caught, "", `the listener was sent a's traffic:\n${caught}`);
      assert.equal(ran, "a's own");
      // Tenant a sees its own sandbox and its own (huge) object, nothing of b's claims.
      assert.deepEqual(listed.sort(), [a.sandboxId, fresh("3")].sort());
      const ofB = (await Sandbox.list(sdk(served, served.keys.b)).nextItems()).map((s) =>
        s.sandboxId
      );
      assert.deepEqual(ofB, []);
      // The taken id's object deleted: a's sandbox is not forgotten.
      standIn.objects.delete(SANDBOXES, "waffle-b", `wfl-${a.sandboxId}`);
      await standIn.settled();
      await delay(500);
      assert.equal((await a.commands.run("cat marker.txt")).stdout, "a's own");
      assert.equal((await a.getInfo()).sandboxId, a.sandboxId);
      // Each skipped once, in one line naming it and why; the server still stands.
      const said = served.stderr().split("\n").filter((line) => line.includes("skipped"));
      const about = (name: string) => said.filter((line) => line.includes(name));
      assert.match(
        about(`waffle-b/wfl-${a.sandboxId}`).join("\n"),
        /^waffle serve: skipped Sandbox '.*': it claims tenant 'a', whose namespace is 'waffle-a'$/,
      );
      assert.match(
        about(`waffle-b/wfl-${fresh("1")}`).join("\n"),
        /^waffle serve: skipped Sandbox '.*': it claims tenant 'a', whose namespace is 'waffle-a'$/,
      );
      assert.match(
        about(`waffle-a/wfl-${fresh("2")}`).join("\n"),
        /^waffle serve: skipped Sandbox '.*': Secret 'waffle-a\/wfl-x2+-waffle': key 'agent-token' .*$/,
      );
      assert.match(
        about("waffle-a/wfl-twin").join("\n"),
        new RegExp(
          `^waffle serve: skipped Sandbox '.*': its id '${a.sandboxId}' is already 'waffle-a/wfl-${a.sandboxId}'$`,
        ),
      );
      assert.deepEqual(about(fresh("3")), []);
      await a.kill();
      assert.deepEqual(
        (await Sandbox.list(sdk(served, served.keys.a)).nextItems()).map((s) => s.sandboxId),
        [fresh("3")],
      );
    } finally {
      await served.stop();
    }
  },
  { sanitize: false },
);

stopRigTest(stopRig);
