/**
 * Gate for live Docker tests. {@linkcode dockerGate} asks the daemon once
 * (through {@linkcode DockerClient.ping}, never the CLI) whether Docker is
 * usable; {@linkcode liveTest} registers a test that is ignored, with the
 * reason in its name, when it is not. With `WAFFLE_REQUIRE_DOCKER=1` such a
 * test fails with the reason instead, so CI cannot silently skip.
 *
 * The gate resolves at module load (top-level await) because `Deno.test`
 * registration is synchronous.
 *
 * @module
 */
import { DockerClient } from "../lib/docker/mod.ts";

/** The outcome of probing the Docker daemon. */
export interface DockerGate {
  /** Docker answered a ping. */
  ok: boolean;
  /** Why live tests are skipped; empty when `ok`. */
  reason: string;
  /** A client for the daemon that answered; undefined when not `ok`. */
  client: DockerClient | undefined;
  /** One line describing the daemon (version, arch, storage and cgroup driver) or the failure. */
  summary: string;
}

/** Options of {@linkcode liveTest}. */
export interface LiveTestOptions {
  /** Passed to `Deno.test`; default true. */
  sanitizeResources?: boolean;
  /** Passed to `Deno.test`; default true. */
  sanitizeOps?: boolean;
}

/** A live test body: gets a client connected to the daemon that answered the gate. */
export type LiveTestFn = (docker: DockerClient, t: Deno.TestContext) => void | Promise<void>;

let gatePromise: Promise<DockerGate> | undefined;

/** Probes Docker once per module instance; later calls return the same result. */
export function dockerGate(): Promise<DockerGate> {
  gatePromise ??= probe();
  return gatePromise;
}

async function probe(): Promise<DockerGate> {
  let client: DockerClient;
  try {
    client = new DockerClient({ timeoutMs: 5000 });
  } catch (err) {
    return failed("docker daemon unavailable", err);
  }
  try {
    await client.ping();
  } catch (err) {
    const missing = client.endpoint.kind === "unix" && !exists(client.endpoint.socketPath) &&
      !dockerInPath();
    return failed(missing ? "docker not in PATH" : "docker daemon unavailable", err);
  }
  let summary = `docker: daemon at '${client.location}'`;
  try {
    const [version, info] = await Promise.all([client.version(), client.info()]);
    summary = `docker: server ${version.Version} (API ${version.ApiVersion}), ` +
      `arch ${info.Architecture}, storage driver ${info.Driver}, ` +
      `cgroup driver ${info.CgroupDriver} (v${info.CgroupVersion || "?"}), at '${client.location}'`;
  } catch (err) {
    summary += ` (version/info failed: ${err instanceof Error ? err.message : String(err)})`;
  }
  return { ok: true, reason: "", client, summary };
}

function failed(reason: string, err: unknown): DockerGate {
  const detail = err instanceof Error ? err.message : String(err);
  return { ok: false, reason, client: undefined, summary: `docker: ${reason} (${detail})` };
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

function dockerInPath(): boolean {
  const path = Deno.env.get("PATH") ?? "";
  return path.split(":").some((dir) => dir !== "" && exists(`${dir}/docker`));
}

function requireDocker(): boolean {
  return Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1";
}

const gate = await dockerGate();
// deno-lint-ignore no-console -- test-run diagnostics: which daemon the live tests ran against
console.error(gate.summary);

/**
 * Registers a test that needs a Docker daemon. When the gate failed it is
 * registered as ignored, named `"<name> [ignored: <reason>]"`; with
 * `WAFFLE_REQUIRE_DOCKER=1` it is registered as a failing test instead.
 *
 * @example
 * ```ts
 * liveTest("docker: ping", async (docker) => {
 *   await docker.ping();
 * });
 * ```
 */
export function liveTest(name: string, fn: LiveTestFn, options: LiveTestOptions = {}): void {
  const sanitizers = {
    sanitizeResources: options.sanitizeResources ?? true,
    sanitizeOps: options.sanitizeOps ?? true,
  };
  const client = gate.client;
  if (gate.ok && client !== undefined) {
    Deno.test({ name, ...sanitizers, fn: (t) => fn(client, t) });
  } else if (requireDocker()) {
    Deno.test({
      name,
      ...sanitizers,
      fn: () => {
        throw new Error(`Docker is required (WAFFLE_REQUIRE_DOCKER=1): ${gate.summary}`);
      },
    });
  } else {
    Deno.test({ name: `${name} [ignored: ${gate.reason}]`, ignore: true, fn: () => {} });
  }
}
