/**
 * Shared by the tests that drive `waffle serve` with the real E2B SDK: a
 * `waffle serve` process (the CLI from source) on loopback in a fresh home
 * with one key per tenant, the SDK's options for a key, a raw HTTP/1.1 GET,
 * and `sdkTest`, which registers a live test (ignored with the reason where
 * Docker or the `base` image is missing; failing instead under
 * `WAFFLE_REQUIRE_DOCKER=1`).
 *
 * @module
 */
import assert from "node:assert/strict";
import { selfCommand } from "../lib/config/self.ts";
import { dockerGate } from "./_docker_gate.ts";
import type { DockerClient } from "../lib/docker/client.ts";
import { runCliProcess } from "./_helpers.ts";
import { type KubeRig, startKubeRig } from "./_k8s_rig.ts";
import { RESOURCES } from "./_k8s_api.ts";

const SANDBOXES = RESOURCES.find((resource) => resource.plural === "sandboxes")!;

/** The image of the `base` template. */
export const BASE = "waffle-base:bookworm";
const gate = await dockerGate();
const missing = !gate.ok
  ? gate.reason
  : await gate.client!.inspectImage(BASE) === null
  ? `image '${BASE}' is missing: run 'bash scripts/build_images.sh base'`
  : undefined;

/**
 * Where `serve()` runs its sandboxes: this host's Docker, unless a test file
 * said Kubernetes ({@linkcode serveOnKubernetes}).
 */
let onKubernetes: { rig: () => Promise<KubeRig>; skip: ReadonlyMap<string, string> } | undefined;

/**
 * Makes every `sdkTest` this module registers from now on run against a
 * server with `[backend] kind = "kubernetes"` on the stand-in (started once,
 * on first use), except the tests named in `skip`, which are registered
 * ignored with their reason.
 *
 * @param skip Test name (before any suffix) → why it does not apply on Kubernetes.
 * @returns Stops the rig, once the file's tests are done; says the Docker
 *   network (and the prefix of every container name) it had.
 */
export function serveOnKubernetes(
  skip: Record<string, string>,
): () => Promise<string | undefined> {
  let rig: Promise<KubeRig> | undefined;
  onKubernetes = {
    rig: () => rig ??= startKubeRig(gate.client!),
    skip: new Map(Object.entries(skip)),
  };
  return async () => {
    const started = await rig;
    await started?.stop();
    return started?.standIn.network;
  };
}

/** A running `waffle serve` with one key per tenant. */
export interface Served {
  url: string;
  home: string;
  /** The server process's pid (its memory is read from /proc). */
  pid: number;
  keys: { a: string; b: string };
  /** Kills the server with SIGKILL and starts another on the same home (`url` and `pid` change). */
  crashAndRestart(): Promise<void>;
  /** Stops the server with SIGTERM and starts another on the same home (`url` and `pid` change). */
  restart(): Promise<void>;
  stop(): Promise<void>;
  /** The sandboxes still there: this home's containers, or the stand-in's Sandbox objects. */
  leftovers(): Promise<string[]>;
  /** The stand-in, when the server's sandboxes are on Kubernetes. */
  kube?: KubeRig | undefined;
  /** What the server (each process on this home) wrote to stderr so far, with `captureStderr`; else "". */
  stderr(): string;
}

/** Starts `waffle serve` on 127.0.0.1:0 in a fresh home, with keys of tenants `a` and `b`. */
export async function serve(
  options: { toml?: string; kube?: KubeRig; captureStderr?: boolean } = {},
): Promise<Served> {
  const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-serve-" }));
  const toml = `${options.toml ?? ""}\n${options.kube?.backendToml ?? ""}`;
  await Deno.writeTextFile(`${home}/waffle.toml`, toml);
  const env = { WAFFLE_HOME: home };
  const key = async (tenant: string): Promise<string> => {
    const made = await runCliProcess(["serve", "key", "create", "--tenant", tenant], { env });
    assert.equal(made.code, 0, made.stderr);
    return made.stdout.trim();
  };
  const keys = { a: await key("a"), b: await key("b") };
  const logs = { text: "", capture: options.captureStderr === true };
  let { child, url, drained } = await startServe(env, logs);
  // Ends the server with the signal and starts another on the same home.
  const again = async (signal: "SIGKILL" | "SIGTERM"): Promise<void> => {
    child.kill(signal);
    await child.status;
    await child.stdout.cancel().catch(() => {});
    await drained;
    ({ child, url, drained } = await startServe(env, logs));
    served.url = url;
    served.pid = child.pid;
  };
  const leftovers = async (): Promise<string[]> => {
    if (options.kube !== undefined) {
      return options.kube.standIn.objects.list(SANDBOXES, undefined).map((o) =>
        String(o.metadata.name)
      );
    }
    const listed = await runCliProcess(["ps", "--json"], { env });
    return (JSON.parse(listed.stdout).sandboxes as { user: string }[]).map((row) => row.user);
  };
  const served: Served = {
    stderr: () => logs.text,
    kube: options.kube,
    leftovers,
    url,
    home,
    pid: child.pid,
    keys,
    crashAndRestart: () => again("SIGKILL"),
    restart: () => again("SIGTERM"),
    async stop(): Promise<void> {
      child.kill("SIGTERM");
      await child.status;
      await child.stdout.cancel().catch(() => {});
      await drained;
      if (options.kube !== undefined) {
        // What the server left on the stand-in: deleted as a user would.
        for (const object of options.kube.standIn.objects.list(SANDBOXES, undefined)) {
          options.kube.standIn.objects.delete(
            SANDBOXES,
            object.metadata.namespace,
            object.metadata.name,
          );
        }
        await options.kube.standIn.settled();
        await Deno.remove(home, { recursive: true }).catch(() => {});
        return;
      }
      // What the server left running: its pools' ready members, then each
      // sandbox of this home, removed by the CLI.
      await runCliProcess(["pool", "drain"], { env });
      const listed = await runCliProcess(["ps", "--json"], { env });
      for (const row of JSON.parse(listed.stdout).sandboxes as { tenant: string; user: string }[]) {
        await runCliProcess(["rm", "--purge", "--tenant", row.tenant, "--user", row.user], { env });
      }
      await Deno.remove(home, { recursive: true }).catch(() => {});
    },
  };
  return served;
}

/** Starts `waffle serve --listen 127.0.0.1:0 --json` on a home; its process and URL once listening. */
async function startServe(
  env: Record<string, string>,
  logs: { text: string; capture: boolean },
): Promise<{ child: Deno.ChildProcess; url: string; drained: Promise<void> }> {
  const self = selfCommand();
  const child = new Deno.Command(self.executable, {
    args: [...self.prefix, "serve", "--listen", "127.0.0.1:0", "--json"],
    env: { ...env, PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin" },
    stdin: "null",
    stdout: "piped",
    stderr: logs.capture ? "piped" : "inherit",
  }).spawn();
  // Kept for the test, and shown as it comes.
  const drained = (async () => {
    if (!logs.capture) return;
    for await (const chunk of child.stderr) {
      logs.text += new TextDecoder().decode(chunk);
      await Deno.stderr.write(chunk);
    }
  })().catch(() => {});
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (!text.includes("\n")) {
    const next = await reader.read();
    if (next.done) throw new Error(`waffle serve exited before listening: ${text}`);
    text += next.value;
  }
  reader.releaseLock();
  return {
    child,
    url: JSON.parse(text.slice(0, text.indexOf("\n"))).url as string,
    drained,
  };
}

/** One HTTP/1.1 GET with exactly these headers; the response's head and body as text. */
export async function rawGet(
  url: string,
  path: string,
  headers: Record<string, string>,
): Promise<string> {
  const { hostname, port } = new URL(url);
  const connection = await Deno.connect({ hostname, port: Number(port) });
  const head = Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`).join("");
  await connection.write(
    new TextEncoder().encode(`GET ${path} HTTP/1.1\r\n${head}connection: close\r\n\r\n`),
  );
  let text = "";
  for await (const chunk of connection.readable.pipeThrough(new TextDecoderStream())) text += chunk;
  return text;
}

/** The resident memory of a process (a server's: `Served.pid`), in bytes. */
export async function rssOf(pid: number): Promise<number> {
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  return Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)![1]) * 1024;
}

/** The SDK's options for a tenant's key: what the three variables give it. */
export function sdk(
  served: Served,
  key: string,
): { apiKey: string; apiUrl: string; sandboxUrl: string } {
  return { apiKey: key, apiUrl: served.url, sandboxUrl: served.url };
}

/**
 * Registers a file's last test: its stand-in stops (after `before`, e.g. the
 * file's own sandboxes and server) and leaves no container or network of its
 * own (other stand-ins may run beside it).
 *
 * @param stop What {@linkcode serveOnKubernetes} returned.
 * @param options `before`: run first; `name`: the test's name.
 */
export function stopRigTest(
  stop: () => Promise<string | undefined>,
  options: { before?: () => Promise<void>; name?: string } = {},
): void {
  baseTest(
    options.name ?? "kubernetes stand-in: stops, leaving no container or network of its own",
    async (docker) => {
      await options.before?.();
      const network = await stop();
      assert.ok(network !== undefined, "the stand-in ran");
      const ours = async (): Promise<string[]> =>
        (await docker.listContainers({ all: true, labels: ["waffle.k8s-standin"] }))
          .flatMap((container) => container.Names)
          .filter((name) => name.startsWith(`/${network}-`));
      for (let i = 0; i < 50 && (await ours()).length > 0; i++) {
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.deepEqual(await ours(), []);
      assert.equal(await docker.inspectNetwork(network), null, "its network is gone");
    },
    { sanitize: false },
  );
}

/**
 * Starts `waffle serve` as `sdkTest` does: on the stand-in when this file
 * said Kubernetes ({@linkcode serveOnKubernetes}), else on this host's Docker.
 *
 * @param options A `waffle.toml`, and the rig to use (default: the file's).
 * @returns The server.
 */
export async function serveForFile(
  options: { toml?: string; kube?: KubeRig; captureStderr?: boolean } = {},
): Promise<Served> {
  const kube = options.kube ?? await onKubernetes?.rig();
  return await serve({ ...options, ...(kube === undefined ? {} : { kube }) });
}

/**
 * Registers a live test that gets a fresh `waffle serve`, stopped after it.
 *
 * @param name The test's name.
 * @param fn The test.
 * @param options A `waffle.toml` for the server's home.
 */
export function sdkTest(
  name: string,
  fn: (served: Served) => Promise<void>,
  options: { toml?: string } = {},
): void {
  const skipped = onKubernetes?.skip.get(name);
  if (skipped !== undefined) {
    Deno.test({ name: `${name} [ignored: ${skipped}]`, ignore: true, fn: () => {} });
    return;
  }
  // The SDK keeps its HTTP connections for reuse: not a leak of the test's.
  baseTest(name, async () => {
    const served = await serveForFile(options);
    try {
      await fn(served);
    } finally {
      await served.stop();
    }
  }, { sanitize: false });
}

/**
 * Registers a live test that needs Docker and the `base` image: ignored
 * with the reason where either is missing, failing instead under
 * `WAFFLE_REQUIRE_DOCKER=1`.
 *
 * @param name The test's name.
 * @param fn The test, given the Docker client.
 * @param options `sanitize: false` turns Deno's resource and op sanitizers off.
 */
export function baseTest(
  name: string,
  fn: (docker: DockerClient) => Promise<void>,
  options: { sanitize?: boolean } = {},
): void {
  if (missing !== undefined) {
    if (Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1") {
      Deno.test({ name, fn: () => assert.fail(`Required (WAFFLE_REQUIRE_DOCKER=1): ${missing}`) });
    } else Deno.test({ name: `${name} [ignored: ${missing}]`, ignore: true, fn: () => {} });
    return;
  }
  const sanitize = options.sanitize ?? true;
  Deno.test({ name, sanitizeResources: sanitize, sanitizeOps: sanitize }, () => fn(gate.client!));
}
