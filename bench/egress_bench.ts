/**
 * The egress section of `deno task bench`: one HTTPS request per new
 * connection from Python's `ssl` in the python image (its context made once,
 * so only the connection is timed), timed inside the container, to a TLS
 * server on this machine's loopback:
 *
 * - `egress_https_direct`: the baseline, the same script in a
 *   `docker run --network host` container of the same image, to the
 *   upstream's address (no proxy);
 * - `egress_https_proxy`: from a waffle sandbox through its socket and the
 *   proxy (CONNECT, SNI checked, bytes passed through);
 * - `egress_https_secret`: the same to a host a secret is injected for (TLS
 *   terminated by the proxy and made anew to the upstream);
 * - `egress_https_flooded`: `egress_https_proxy` while another sandbox holds
 *   500 CONNECTs open and replaces each one as it is answered (its own
 *   `max_connections` caps it): what one sandbox's flood costs another.
 *
 * Interleaved, so every case sees the same machine.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { DockerClient } from "../lib/docker/mod.ts";
import type { Sandbox } from "../lib/sandbox/mod.ts";
import { dockerCli, uniqueUser } from "../tests/_sandbox_helpers.ts";
import {
  CONNECT_FLOOD,
  type EgressHome,
  egressHome,
  PYTHON_IMAGE,
  SECRET_ENV,
  sh,
  UPSTREAMS,
} from "../tests/_egress_sandbox.ts";
import { waitFor } from "../tests/_helpers.ts";
import type { BenchContext, Section } from "./section.ts";
import { type BenchReport, type BenchResult, ratioOf, summarize } from "./stats.ts";

/** Case names of this section. */
export const EGRESS_CASES = [
  "egress_https_direct",
  "egress_https_proxy",
  "egress_https_secret",
  "egress_https_flooded",
] as const;

/** The egress section. */
export const egressSection: Section = {
  name: "egress",
  cases: EGRESS_CASES,
  run: runEgressSection,
};

const ROUNDS = 5;

// Prints one line of per-request times in ms: each a new TCP connection
// (through the proxy: CONNECT first), a TLS handshake verified against the
// bundle (its context made once), one GET and the whole answer.
const TIMED = (options: { host: string; port: number; count: number; proxy: boolean }) =>
  `import socket, ssl, time
ctx = ssl.create_default_context(cafile="/ca.pem" if ${options.proxy ? "False" : "True"} else None)
out = []
for _ in range(${options.count}):
    t = time.perf_counter()
    if ${options.proxy ? "True" : "False"}:
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"CONNECT ${options.host}:${options.port} HTTP/1.1\\r\\nHost: ${options.host}\\r\\n\\r\\n")
        assert s.recv(200).startswith(b"HTTP/1.1 200")
    else:
        s = socket.create_connection(("127.0.0.1", ${options.port}))
    c = ctx.wrap_socket(s, server_hostname="${options.host}")
    c.sendall(b"GET / HTTP/1.1\\r\\nHost: ${options.host}\\r\\nAuthorization: Bearer x\\r\\nConnection: close\\r\\n\\r\\n")
    while c.recv(65536):
        pass
    c.close()
    out.append((time.perf_counter() - t) * 1000)
print(" ".join("%.3f" % v for v in out))
`;

/**
 * Runs the wanted cases; without Docker or the python image it says why and
 * measures nothing.
 *
 * @param context Counts, filter, progress and cleanup.
 * @returns Results and the ratios to the direct connection.
 */
export async function runEgressSection(context: BenchContext): Promise<BenchReport> {
  const docker = new DockerClient();
  try {
    await docker.ping();
    if (await docker.inspectImage(PYTHON_IMAGE) === null) {
      throw new Error(`no image '${PYTHON_IMAGE}'`);
    }
  } catch (error) {
    console.error(
      `bench: egress section skipped: ${error instanceof Error ? error.message : error}`,
    );
    return { results: [], ratios: [] };
  }
  Deno.env.set(SECRET_ENV, "bench-secret");
  const world = await egressHome(docker, {
    config: (w) => ({
      egress: [w.entry("api"), w.entry("secret")],
      secrets: ["gh"],
      extra: `[secrets.gh]\nfrom_env = "${SECRET_ENV}"\nhosts = ["secret.test"]\n` +
        `header = "Authorization"\nformat = "Bearer {}"`,
    }),
  });
  context.cleanup.add(() => world[Symbol.asyncDispose]());
  const sandbox = world.home.open(uniqueUser("bench-egress"));
  const perRound = Math.max(5, Math.ceil(context.n / ROUNDS));
  const samples = new Map<string, number[]>(EGRESS_CASES.map((name) => [name, []]));
  const take = (name: string, out: string): void => {
    samples.get(name)!.push(...out.trim().split(" ").map(Number));
  };
  // The first call attaches the sandbox and starts the proxy (and writes the bundle).
  await sh(sandbox, "true");
  for (let round = 0; round < ROUNDS; round++) {
    if (context.wants("egress_https_direct")) {
      // To the upstream's address (no proxy), trusting the same bundle.
      const timed = TIMED({
        host: UPSTREAMS.api.name,
        port: world.upstreams.api.port,
        count: perRound,
        proxy: false,
      });
      const bundle = `${world.home.home}/egress/public/bundle.pem`;
      const direct = await dockerCli([
        "run",
        "--rm",
        "--network",
        "host",
        "-v",
        `${bundle}:/ca.pem:ro`,
        PYTHON_IMAGE,
        "python3",
        "-c",
        timed,
      ]);
      if (direct.code !== 0) throw new Error(`direct run failed: ${direct.stderr}`);
      take("egress_https_direct", direct.stdout);
    }
    for (
      const [name, key] of [["egress_https_proxy", "api"], [
        "egress_https_secret",
        "secret",
      ]] as const
    ) {
      if (!context.wants(name)) continue;
      const timed = TIMED({
        host: UPSTREAMS[key].name,
        port: world.upstreams[key].port,
        count: perRound,
        proxy: true,
      });
      // In the sandbox the bundle is ssl's default (SSL_CERT_FILE).
      const out = await sh(sandbox, `python3 -c '${timed}'`);
      if (out.code !== 0) throw new Error(`${name} failed: ${out.stderr}`);
      take(name, out.stdout);
    }
    context.progress.step("egress: direct, proxy, secret", round + 1, ROUNDS);
  }
  if (context.wants("egress_https_flooded")) {
    take("egress_https_flooded", await flooded(world, sandbox, perRound * ROUNDS));
    context.progress.step("egress: under another sandbox's flood", 1, 1);
  }
  const results: BenchResult[] = [];
  for (const name of EGRESS_CASES) {
    const list = samples.get(name) ?? [];
    if (list.length > 0) {
      results.push(summarize(name, list, { note: "TCP + TLS + GET, new connection each" }));
    }
  }
  const find = (name: string): BenchResult | undefined => results.find((r) => r.name === name);
  const ratios = [
    ratioOf("egress_proxy_vs_direct", find("egress_https_proxy"), find("egress_https_direct")),
    ratioOf("egress_secret_vs_direct", find("egress_https_secret"), find("egress_https_direct")),
    ratioOf("egress_flooded_vs_proxy", find("egress_https_flooded"), find("egress_https_proxy")),
  ].filter((ratio) => ratio !== undefined);
  return { results, ratios };
}

// The sandbox's per-connection times while another sandbox of the same home
// floods the proxy with CONNECTs, until it is told to stop.
async function flooded(
  world: EgressHome,
  sandbox: Sandbox,
  count: number,
): Promise<string> {
  const flooder = world.home.open(uniqueUser("bench-flood"));
  const flood = await flooder.submit({
    shell: `python3 -c '${CONNECT_FLOOD(UPSTREAMS.api.name, world.upstreams.api.port)}'`,
  });
  try {
    await waitFor(
      () => world.audit().filter((line) => line.user === flooder.key.user).length > 100,
      { timeoutMs: 30_000, what: "the flood under way" },
    );
    const timed = TIMED({
      host: UPSTREAMS.api.name,
      port: world.upstreams.api.port,
      count,
      proxy: true,
    });
    const out = await sh(sandbox, `python3 -c '${timed}'`);
    if (out.code !== 0) throw new Error(`egress_https_flooded failed: ${out.stderr}`);
    return out.stdout;
  } finally {
    await Deno.writeTextFile(`${flooder.paths.workspace}/stop`, "");
    await flooder.queue.collect(flood);
    flooder.close();
  }
}
