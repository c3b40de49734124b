/**
 * The host's side of egress: what a sandbox attached to egress gets (its
 * socket directory, the CA bundle, the proxy variables and its secrets'
 * placeholders), the files the proxy reads (the CA, each identity's policy
 * with its secrets' values), and the proxy's container, started (or
 * recreated when its spec changed) whenever a sandbox that needs it is
 * ensured. While the proxy is down a sandbox's egress fails closed: its
 * socket refuses, and it has no other route.
 *
 * @module
 */
import tls from "node:tls";
import { join } from "../path.ts";
import { DockerError } from "../errors.ts";
import type { SandboxConfig } from "../config/config.ts";
import { type DockerClient, DockerConflictError } from "../docker/mod.ts";
import { withLock } from "../lifecycle/lock.ts";
import { hostCanChown, LABELS } from "../lifecycle/posture.ts";
import { resolveImage } from "../lifecycle/ensure.ts";
import { type EgressPaths, homeEgress } from "../config/egress_paths.ts";
import type { EgressSettings } from "../config/egress_types.ts";
import type { EgressAttachment } from "../config/egress_types.ts";
import { egressAuditFile, proxyContainerSpec, proxyUser } from "./proxy_container.ts";
import { controlCall, writeOwned, writePolicy } from "./policy_writer.ts";
import { lexists } from "../fs.ts";

/** How long the host waits for the proxy to answer its control socket after a start. */
const PROXY_READY_MS = 30_000;

/**
 * Makes everything an attached identity needs and the proxy serve it: the
 * egress directories and CA (once per home), the CA bundle, the identity's
 * policy file (its secrets read now from the host; a value this process
 * cannot read keeps the one written before), its socket directory, and the
 * proxy container, running and answering. Call it before creating or
 * adopting the identity's container.
 *
 * @param docker The Docker client.
 * @param attachment The identity.
 * @param options The home and config (image, artefact) the proxy runs with.
 * @throws {DockerError} When the proxy cannot be started or does not answer.
 */
export async function ensureEgress(
  docker: DockerClient,
  attachment: EgressAttachment,
  options: { home: string; config: SandboxConfig },
): Promise<void> {
  const paths = homeEgress(options.home);
  await withLock(join(options.home, "locks", "egress.lock"), async () => {
    await prepareEgressHome(options.home, attachment.settings);
    writePolicy(options.home, attachment);
    await ensureProxy(docker, options);
  });
  await controlCall(paths, "sync");
}

/**
 * Makes a home's egress directory (see `lib/config/egress_paths.ts` for who may write which),
 * its CA (once: `install.sh` makes it for the default home through
 * `waffle egress ca`), the sandboxes' CA bundle and the audit's link.
 *
 * @param home The waffle home.
 * @param settings The `[egress]` settings (`extra_ca` joins the bundle).
 */
export async function prepareEgressHome(home: string, settings: EgressSettings): Promise<void> {
  const paths = homeEgress(home);
  const { uid, gid } = proxyUser();
  const dir = (path: string, mode: number, proxyGroup: boolean): void => {
    Deno.mkdirSync(path, { recursive: true, mode });
    const stat = Deno.lstatSync(path);
    if (!stat.isDirectory) throw new DockerError(`Egress directory '${path}' is not a directory`);
    if (hostCanChown()) Deno.chownSync(path, 0, proxyGroup ? gid : 0);
    Deno.chmodSync(path, mode);
  };
  dir(paths.root, 0o755, false);
  dir(join(paths.root, "ca"), 0o750, true);
  dir(paths.policies, 0o750, true);
  dir(paths.sockets, 0o755, false);
  dir(join(paths.root, "ctl"), 0o770, true);
  dir(join(paths.root, "public"), 0o755, false);
  if (!lexists(paths.caKey)) {
    const { mintCa } = await import("./ca.ts");
    const ca = await mintCa({ commonName: `waffle egress CA (${home})` });
    writeOwned(paths.caCert, ca.cert, { mode: 0o644, owner: { uid, gid } });
    writeOwned(paths.caKey, ca.key, { mode: 0o600, owner: { uid, gid } });
  }
  const extra = settings.extraCa === undefined ? "" : Deno.readTextFileSync(settings.extraCa);
  writeOwned(paths.extraCa, extra, { mode: 0o644, owner: { uid, gid } });
  const bundle = [systemRoots(), Deno.readTextFileSync(paths.caCert), extra].join("\n");
  writeOwned(join(paths.root, "public", "bundle.pem"), bundle, { mode: 0o644 });
  dir(join(paths.root, "audit"), 0o770, true);
  const link = egressAuditFile(home);
  const stat = lstatOrNull(link);
  // An audit file of before the proxy rotated it itself moves in beside it.
  if (stat?.isFile) Deno.renameSync(link, `${paths.audit}.before`);
  if (stat === null || stat.isFile) Deno.symlinkSync("egress/audit/egress.jsonl", link);
}

function lstatOrNull(path: string): Deno.FileInfo | null {
  try {
    return Deno.lstatSync(path);
  } catch {
    return null;
  }
}

// The host's own trust store, else the roots Deno carries.
function systemRoots(): string {
  for (const path of ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"]) {
    try {
      return Deno.readTextFileSync(path);
    } catch {
      // next
    }
  }
  return tls.rootCertificates.join("\n");
}

// The proxy container: created, recreated when its spec changed, started.
async function ensureProxy(
  docker: DockerClient,
  options: { home: string; config: SandboxConfig },
): Promise<void> {
  const image = await resolveImage(docker, options.config.image);
  const spec = proxyContainerSpec(options.home, { config: options.config, image });
  let found = await docker.inspectContainer(spec.name);
  if (
    found !== null &&
    (found.Config.Labels[LABELS.posture] !== spec.postureHash || found.Image !== image.id)
  ) {
    await docker.removeContainer(found.Id, { force: true });
    found = null;
  }
  let id = found?.Id;
  if (id === undefined) {
    try {
      id = await docker.createContainer(spec.name, spec.body);
    } catch (error) {
      if (!(error instanceof DockerConflictError)) throw error;
      id = (await docker.inspectContainer(spec.name))?.Id;
      if (id === undefined) throw error;
    }
  }
  if (found?.State.Running !== true) await docker.startContainer(id);
  await waitAnswering(homeEgress(options.home), PROXY_READY_MS);
}

async function waitAnswering(paths: EgressPaths, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      await controlCall(paths, "ping");
      return;
    } catch (error) {
      last = error;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
  throw new DockerError(
    `The egress proxy did not answer on '${paths.control}' within ${timeoutMs / 1000} s: ${
      last instanceof Error ? last.message : String(last)
    }`,
  );
}
