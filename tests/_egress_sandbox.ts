/**
 * A waffle home with egress for live tests: upstreams on loopback with
 * certificates from a test CA (tests/_egress_upstreams.ts), a `waffle.toml`
 * whose `[egress.hosts]` names them, `extra_ca` trusting the test CA, and
 * whatever lists, users and secrets a test adds.
 *
 * @module
 */
import type { DockerClient } from "../lib/docker/mod.ts";
import type { Sandbox } from "../lib/sandbox/open.ts";
import { egressAuditFile } from "../lib/egress/proxy_container.ts";
import type { EgressAuditLine } from "../lib/egress/audit.ts";
import { startUpstream, testCa, type Upstream, writeCaFile } from "./_egress_upstreams.ts";
import { dockerCli, run, tempHome, type TestHome } from "./_sandbox_helpers.ts";

/** The python image of the any-image issue: curl, git, python3 with requests. */
export const PYTHON_IMAGE = "waffle-python:bookworm";

/** The test's upstream names and the loopback address each listens on. */
export const UPSTREAMS = {
  api: { name: "api.test", ip: "127.0.0.1" },
  secret: { name: "secret.test", ip: "127.0.0.2" },
  other: { name: "other.test", ip: "127.0.0.3" },
  denied: { name: "denied.test", ip: "127.0.0.4" },
} as const;

/** Where a test's git server listens, by name. */
export const GIT_UPSTREAM = { name: "git.test", ip: "127.0.0.5" } as const;

/** The upstream a secret is for, and its host variable. */
export const SECRET_ENV = "WAFFLE_TEST_GH_TOKEN";
/** The secret's value: it must never be seen inside a sandbox. */
export const SECRET_VALUE = "s3cret-7f1c9a0e5b2d4c68";

/** What a test sets in `waffle.toml` beside the base tables. */
export interface EgressConfig {
  /** `[sandbox] egress`. */
  egress: string[];
  /** `[sandbox] secrets`. */
  secrets?: string[];
  /** More tables, as TOML. */
  extra?: string;
}

/** A home with upstreams and egress config. */
export interface EgressHome extends AsyncDisposable {
  /** The waffle home. */
  home: TestHome;
  /** The upstreams by key of {@linkcode UPSTREAMS}. */
  upstreams: Record<keyof typeof UPSTREAMS, Upstream>;
  /** The test CA's certificate file. */
  caFile: string;
  /** `host:port` of an upstream. */
  entry(key: keyof typeof UPSTREAMS): string;
  /** Writes `waffle.toml` anew: the base tables plus `extra`. */
  writeConfig(config: EgressConfig): Promise<void>;
  /** The audit lines so far. */
  audit(): EgressAuditLine[];
}

/**
 * Starts the upstreams and makes a home whose sandboxes use `image`.
 *
 * @param docker The daemon.
 * @param options The image and the first config.
 * @returns The home; `await using` it.
 */
export async function egressHome(
  docker: DockerClient,
  options: { image?: string; config: (home: EgressHome) => EgressConfig },
): Promise<EgressHome> {
  const ca = await testCa();
  const upstreams = {} as Record<keyof typeof UPSTREAMS, Upstream>;
  for (const [key, { name, ip }] of Object.entries(UPSTREAMS)) {
    upstreams[key as keyof typeof UPSTREAMS] = await startUpstream({ name, ca, hostname: ip });
  }
  const home = await tempHome(docker, { image: options.image ?? PYTHON_IMAGE });
  const caFile = await writeCaFile(ca, home.home);
  const image = options.image ?? PYTHON_IMAGE;
  const world: EgressHome = {
    home,
    upstreams,
    caFile,
    entry: (key) => `${UPSTREAMS[key].name}:${upstreams[key].port}`,
    async writeConfig(config): Promise<void> {
      const hosts = [...Object.values(UPSTREAMS), GIT_UPSTREAM].map(({ name, ip }) =>
        `"${name}" = "${ip}"`
      );
      await Deno.writeTextFile(
        `${home.home}/waffle.toml`,
        [
          "[sandbox]",
          `image = "${image}"`,
          `egress = ${JSON.stringify(config.egress)}`,
          `egress_addresses = ["127.0.0.0/8"]`,
          // The upstreams listen on the host's loopback.
          `egress_allow_host_loopback = true`,
          `secrets = ${JSON.stringify(config.secrets ?? [])}`,
          "",
          "[egress]",
          `extra_ca = "${caFile}"`,
          "",
          "[egress.hosts]",
          ...hosts,
          `"private.test" = "10.255.0.1"`,
          "",
          config.extra ?? "",
        ].join("\n"),
      );
    },
    audit(): EgressAuditLine[] {
      let text: string;
      try {
        text = Deno.readTextFileSync(egressAuditFile(home.home));
      } catch (error) {
        // No proxy has written yet (the link is made with the first attached sandbox).
        if (error instanceof Deno.errors.NotFound) return [];
        throw error;
      }
      return text.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line));
    },
    async [Symbol.asyncDispose](): Promise<void> {
      try {
        await home[Symbol.asyncDispose]();
      } finally {
        for (const upstream of Object.values(upstreams)) await upstream[Symbol.asyncDispose]();
      }
    },
  };
  await world.writeConfig(options.config(world));
  return world;
}

/**
 * Runs a shell command in a sandbox (as a command, through the queue).
 *
 * @param sandbox The sandbox.
 * @param shell The command line.
 * @returns Exit code and output.
 */
export async function sh(
  sandbox: Sandbox,
  shell: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const ran = await run(sandbox, shell);
  return { code: ran.result.exitCode ?? -1, stdout: ran.stdout, stderr: ran.stderr };
}

/**
 * Runs a shell command in a sandbox's container as its root runner would
 * (`docker exec -u 0`: the container's uid 0 with the runner's capabilities).
 *
 * @param containerId The container.
 * @param shell The command line.
 * @returns Exit code and output.
 */
export function asRoot(
  containerId: string,
  shell: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  return dockerCli(["exec", "-u", "0", containerId, "/bin/sh", "-c", shell]);
}

/**
 * A Python script: 500 CONNECTs to `host:port` open at once (one thread: the
 * sandbox's pids limit would not allow 500), each replaced by a new one as
 * soon as it is answered, until /workspace/stop exists. Prints tunnels and
 * refusals. The egress flood test and bench run it.
 */
export const CONNECT_FLOOD = (host: string, port: number): string => `
import socket, selectors, os
sel = selectors.DefaultSelector()
count = [0, 0]
request = b"CONNECT ${host}:${port} HTTP/1.1\\r\\nHost: ${host}:${port}\\r\\n\\r\\n"
def open_one():
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", 3128))
    sel.register(s, selectors.EVENT_WRITE)
for _ in range(500):
    open_one()
while not os.path.exists("/workspace/stop"):
    for key, events in sel.select(timeout=1):
        s = key.fileobj
        if events & selectors.EVENT_WRITE:
            try:
                s.send(request)
                sel.modify(s, selectors.EVENT_READ)
            except OSError:
                count[1] += 1
                sel.unregister(s); s.close(); open_one()
            continue
        try:
            line = s.recv(100)
        except OSError:
            line = b""
        count[0 if line.startswith(b"HTTP/1.1 200") else 1] += 1
        sel.unregister(s); s.close(); open_one()
print(count[0], count[1])
`;
