/**
 * `waffle serve`: E2B's API (control REST and envd) on this home's sandboxes,
 * and `waffle serve key` to manage the API keys.
 *
 * @module
 */
import { loadWaffleConfig } from "../config/config.ts";
import { DockerClient } from "../docker/mod.ts";
import { UsageError } from "../errors.ts";
import { openServeDb, serveDbPath } from "../serve/db.ts";
import { openJsonLines } from "../jsonl_log.ts";
import { dirname, join } from "../path.ts";
import { keysFile, KeyStore } from "../serve/keys.ts";
import { startServer } from "../serve/server.ts";
import { KubeApi } from "../k8s/client.ts";
import { noPositionals, parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";
import { serveKeyCommand } from "./serve_key.ts";
import { parseListen, tenantLimitsOf } from "../config/serve_schema.ts";

/** Help of `waffle serve`. */
export const SERVE_HELP =
  `Usage: waffle serve [--listen HOST:PORT] [--config FILE] [--tls-cert F --tls-key F]
                    [--insecure-http] [--json]
       waffle serve key create|ls|rm ...

Serves E2B's API on this home's sandboxes, so E2B's SDKs work against waffle
with three variables: E2B_API_KEY (a key from 'waffle serve key create'),
E2B_API_URL and E2B_SANDBOX_URL (both http://HOST:PORT of this server).

--listen defaults to [serve] listen (127.0.0.1:3000); port 0 takes any free
one. A non-loopback address needs --tls-cert and --tls-key, or
--insecure-http. --json prints one line, {"url": ...}, once listening.
Sandboxes outlive the server: a server started again serves them. SIGINT or
SIGTERM stops it.
`;

/**
 * `waffle serve`.
 *
 * @param args The arguments after `serve`.
 * @param io The CLI's streams.
 * @returns The exit status.
 */
export async function serveCommand(args: string[], io: CliIo): Promise<number> {
  if (args[0] === "key") return await serveKeyCommand(args.slice(1), io);
  // `serve` serves; only `serve key` has subcommands, which answer --help themselves.
  if (args.includes("--help") || args.includes("-h")) {
    await io.stdout(SERVE_HELP);
    return 0;
  }
  const parsed = parse(args, {
    listen: { type: "string" },
    config: { type: "string" },
    "tls-cert": { type: "string" },
    "tls-key": { type: "string" },
    "insecure-http": { type: "boolean" },
    json: { type: "boolean" },
  });
  noPositionals(parsed.positionals);
  const config = loadWaffleConfig({ configPath: stringFlag(parsed, "config") });
  const settings = config.serve;
  const listenText = stringFlag(parsed, "listen");
  let listen = settings.listen;
  if (listenText !== undefined) {
    const read = parseListen(listenText);
    if ("problem" in read) {
      throw new UsageError(`Invalid --listen '${listenText}': ${read.problem}`);
    }
    listen = read.address;
  }
  const tls = await readTls(stringFlag(parsed, "tls-cert"), stringFlag(parsed, "tls-key"));
  const loopback = ["127.0.0.1", "localhost", "::1"].includes(listen.hostname);
  if (!loopback && tls === undefined && parsed.values["insecure-http"] !== true) {
    throw new UsageError(
      `Address '${listen.hostname}' is not loopback: give --tls-cert and --tls-key, or --insecure-http`,
    );
  }
  const home = config.sandbox.home;
  const db = openServeDb(home);
  const journal = openServeDb(home, { survives: "process-death" });
  // The home's keys, or a keys file several servers share (a mounted Secret).
  const keys = settings.keysFile === undefined
    ? new KeyStore(db)
    : keysFile(settings.keysFile, { onError: (line) => void io.stderr(`waffle serve: ${line}\n`) });
  // Every API call, one line each (key name or id, tenant, sandbox, method, status).
  const audit = openJsonLines(join(dirname(serveDbPath(home)), "audit.jsonl"), {
    onError: (message) => void io.stderr(`waffle serve: ${message}\n`),
  });
  const stop = new AbortController();
  const backend = settings.backend;
  if (
    backend.kind === "kubernetes" &&
    (config.sandbox.network !== "none" || (config.sandbox.egress?.length ?? 0) > 0)
  ) {
    // A pod reaches nothing but DNS until the proxy takes TCP (docs/kubernetes.md).
    throw new UsageError(
      `Egress ([sandbox] network = "${config.sandbox.network}", ${
        config.sandbox.egress?.length ?? 0
      } egress entries) is not available with [backend] kind = "kubernetes"`,
    );
  }
  if (backend.kind === "kubernetes" && settings.warm.size > 0) {
    throw new UsageError(
      `Warm pools ([templates.${
        [...settings.warm.keys()][0]
      }] warm) are not available with [backend] kind = "kubernetes"`,
    );
  }
  const server = await startServer({
    home,
    db,
    journal,
    ...(backend.kind === "kubernetes"
      ? {
        kubernetes: {
          api: await KubeApi.open({ kubeconfig: backend.kubeconfig, context: backend.context }),
          settings: backend,
          limits: {
            memoryBytes: config.sandbox.memoryBytes,
            cpus: config.sandbox.cpus,
            diskBytes: config.sandbox.quotaBytes,
            tmpBytes: config.sandbox.tmpBytes,
          },
        },
      }
      : { docker: new DockerClient() }),
    hostname: listen.hostname,
    port: listen.port,
    domain: settings.domain,
    verifyKey: (key) => {
      const owner = keys.verify(key);
      return owner === undefined
        ? undefined
        : { keyId: owner.id, keyName: owner.name, tenant: owner.tenant, admin: owner.admin };
    },
    limitsOf: (tenant) => tenantLimitsOf(settings, tenant),
    templateImage: (template) => settings.templates.get(template),
    timeouts: { defaultS: settings.defaultTimeoutSeconds, maxS: settings.maxTimeoutSeconds },
    resources: {
      cpuCount: config.sandbox.cpus,
      memoryMB: Math.round(config.sandbox.memoryBytes / 2 ** 20),
      diskSizeMB: Math.round(config.sandbox.quotaBytes / 2 ** 20),
    },
    maxBodyBytes: settings.maxBodyBytes,
    maxStreamsPerKey: settings.maxStreamsPerKey,
    grant: config.sandbox,
    configPath: config.path,
    pools: [...settings.warm].map(([template, warm]) => ({
      template,
      warm,
      image: settings.templates.get(template)!,
    })),
    audit: (entry) => void audit.append({ time: new Date().toISOString(), ...entry }),
    tls,
    // A cap the config leaves out is lib/http's default (it owns them).
    connectionLimits: {
      ...(settings.maxConnections === undefined ? {} : { maxConnections: settings.maxConnections }),
      ...(settings.maxConnectionsPerPeer === undefined
        ? {}
        : { maxConnectionsPerPeer: settings.maxConnectionsPerPeer }),
      headerTimeoutMs: settings.headerTimeoutSeconds * 1000,
      requestTimeoutMs: settings.requestTimeoutSeconds * 1000,
    },
    onEvent: (line) => void io.stderr(`waffle serve: ${line}\n`),
    signal: stop.signal,
  });
  const scheme = tls === undefined ? "http" : "https";
  const host = server.address.hostname.includes(":")
    ? `[${server.address.hostname}]`
    : server.address.hostname;
  const url = `${scheme}://${host}:${server.address.port}`;
  if (parsed.values.json) await io.stdout(`${JSON.stringify({ url })}\n`);
  else await io.stderr(`waffle serve: listening on ${url}\n`);
  const onSignal = (): void => stop.abort();
  for (const signal of ["SIGINT", "SIGTERM"] as const) Deno.addSignalListener(signal, onSignal);
  try {
    await server.finished;
  } finally {
    for (const signal of ["SIGINT", "SIGTERM"] as const) {
      Deno.removeSignalListener(signal, onSignal);
    }
    db.close();
    journal.close();
    audit.close();
  }
  return 0;
}

async function readTls(
  cert: string | undefined,
  key: string | undefined,
): Promise<{ cert: string; key: string } | undefined> {
  if (cert === undefined && key === undefined) return undefined;
  if (cert === undefined || key === undefined) {
    throw new UsageError("Give both --tls-cert and --tls-key, or neither");
  }
  const read = async (path: string, what: string): Promise<string> => {
    try {
      return await Deno.readTextFile(path);
    } catch (cause) {
      throw new UsageError(`Cannot read ${what} '${path}': ${(cause as Error).message}`, { cause });
    }
  };
  return { cert: await read(cert, "--tls-cert"), key: await read(key, "--tls-key") };
}
