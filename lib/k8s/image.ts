/**
 * The waffle image a pod runs: the installed artefact that is running, its
 * Deno, runtime kit and runner cache under `/opt/waffle`, made with Docker's
 * API from a tar of those files (as `docker import` does: no registry, no
 * base image, no Dockerfile). In the pod its init container copies the same
 * files into a volume ({@linkcode copyKit}) for the runner in the user's
 * image.
 *
 * @module
 */
import { UsageError } from "../errors.ts";
import type { DockerClient } from "../docker/mod.ts";
import { artefactDigest, runnerCacheOf, runtimeKitOf, type SelfCommand } from "../config/self.ts";
import {
  PROGRAM_DIR,
  SANDBOX_ARTEFACT_DIR,
  SANDBOX_CHANNEL_DIR,
  SANDBOX_RUNTIME,
} from "../config/sandbox_paths.ts";
import { RUNNER_CACHE, SANDBOX_ARTEFACT_ARGV, SANDBOX_DENO_ENV } from "../lifecycle/posture.ts";
import { TarWriter } from "./tar.ts";

/** The repository of the images `waffle k8s image` makes (`waffle:<digest12>`). */
export const WAFFLE_IMAGE_REPO = "waffle";
/** The label naming the artefact digest an image was made from. */
export const WAFFLE_IMAGE_ARTEFACT_LABEL = "waffle.artefact";
/** What the kit holds, under `/opt/waffle` in the image and at the root of the kit volume. */
export const KIT_ENTRIES = ["deno", "rt", "app", "cache", "empty"] as const;
/** How long an image import may take (it sends ~150 MB). */
const IMPORT_TIMEOUT_MS = 10 * 60_000;

/** Options of {@linkcode buildWaffleImage}. */
export interface BuildImageOptions {
  /** The image reference; default `waffle:<artefact digest 12>`. */
  tag?: string | undefined;
  /** The waffle to package; default the running one. */
  self: SelfCommand;
}

/** What {@linkcode buildWaffleImage} did. */
export interface WaffleImage {
  /** `repo:tag`. */
  ref: string;
  /** The image id (`sha256:…`). */
  id: string;
  /** False when an image of this artefact already had that reference. */
  built: boolean;
  /** The artefact's digest (hex). */
  artefact: string;
  /** The argv prefix the image's entrypoint runs. */
  entrypoint: string[];
}

/**
 * Makes (or finds) the waffle image of the installed artefact `self` runs.
 *
 * @param docker The Docker client.
 * @param options The artefact and the reference.
 * @returns The image.
 * @throws {UsageError} From a source checkout or a compiled binary, or on a bad tag.
 */
export async function buildWaffleImage(
  docker: DockerClient,
  options: BuildImageOptions,
): Promise<WaffleImage> {
  const { self } = options;
  if (self.artefact === undefined) {
    throw new UsageError(
      self.sourceRoot !== undefined
        ? `'waffle k8s image' packages an installed artefact, and this is the checkout '${self.sourceRoot}': run scripts/install.sh, then its waffle`
        : `'waffle k8s image' packages the bundled artefact, not the compiled binary '${self.executable}': install with WAFFLE_INSTALL_BUNDLE=1 scripts/install.sh`,
    );
  }
  const digest = artefactDigest(self.artefact);
  const ref = options.tag ?? `${WAFFLE_IMAGE_REPO}:${digest.slice(0, 12)}`;
  const [repo, tag] = splitRef(ref);
  const entrypoint = [...SANDBOX_ARTEFACT_ARGV];
  const existing = await docker.inspectImage(ref);
  if (existing !== null && existing.labels[WAFFLE_IMAGE_ARTEFACT_LABEL] === digest) {
    return { ref, id: existing.id, built: false, artefact: digest, entrypoint };
  }
  const cache = runnerCacheOf(self.artefact);
  const env = {
    PATH: "/usr/local/bin:/usr/bin:/bin",
    // The pod's only writable place for it is its /tmp.
    HOME: "/tmp",
    ...SANDBOX_DENO_ENV,
    ...(cache === undefined ? {} : { DENO_DIR: RUNNER_CACHE }),
  };
  const changes = [
    `ENTRYPOINT ${JSON.stringify(entrypoint)}`,
    `CMD []`,
    ...Object.entries(env).map(([name, value]) => `ENV ${name}=${value}`),
    `LABEL ${WAFFLE_IMAGE_ARTEFACT_LABEL}=${digest}`,
  ];
  const tarFile = await Deno.makeTempFile({ prefix: "waffle-image-", suffix: ".tar" });
  try {
    await writeImageTar(tarFile, { ...self, artefact: self.artefact }, cache);
    const id = await docker.importImage(tarFile, {
      repo,
      tag,
      changes,
      timeoutMs: IMPORT_TIMEOUT_MS,
    });
    return { ref, id, built: true, artefact: digest, entrypoint };
  } finally {
    await Deno.remove(tarFile).catch(() => {});
  }
}

// The image's root file system: /opt/waffle (deno, rt, app, cache, empty,
// chan) and a /tmp.
async function writeImageTar(
  tarFile: string,
  self: SelfCommand & { artefact: string },
  cache: string | undefined,
): Promise<void> {
  const build = self.artefact.slice(0, self.artefact.lastIndexOf("/"));
  const program = PROGRAM_DIR.slice(1);
  using out = await Deno.open(tarFile, { write: true, truncate: true });
  const tar = new TarWriter(out);
  await tar.addDir("tmp", 0o1777);
  await tar.addDir(program.split("/")[0]!, 0o755);
  await tar.addDir(program, 0o755);
  await tar.addTree(await Deno.realPath(self.executable), `${program}/deno`);
  await tar.addTree(await Deno.realPath(runtimeKitOf(self)), SANDBOX_RUNTIME.slice(1));
  await tar.addTree(await Deno.realPath(build), SANDBOX_ARTEFACT_DIR.slice(1));
  if (cache === undefined) await tar.addDir(RUNNER_CACHE.slice(1), 0o755);
  else await tar.addTree(await Deno.realPath(cache), RUNNER_CACHE.slice(1));
  await tar.addFile(`${program}/empty`, new Uint8Array(), 0o644);
  await tar.addDir(SANDBOX_CHANNEL_DIR.slice(1), 0o755);
  await tar.finish();
}

// `repo[:tag]` (a registry's `host:port/` kept in the repo); the tag defaults to `latest`.
function splitRef(ref: string): [string, string] {
  const slash = ref.lastIndexOf("/");
  const colon = ref.lastIndexOf(":");
  const [repo, tag] = colon > slash ? [ref.slice(0, colon), ref.slice(colon + 1)] : [ref, "latest"];
  const path = "[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
  const repoPattern = new RegExp(`^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?${path}(?:/${path})*$`);
  if (!/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/.test(tag) || !repoPattern.test(repo)) {
    throw new UsageError(`Image reference '${ref}' is not a valid 'repository[:tag]'`);
  }
  return [repo, tag];
}

/**
 * Copies the kit this image runs (`/opt/waffle/{deno,rt,app,cache,empty}`)
 * into `to`, modes kept, what is already there replaced: `waffle k8s kit`,
 * run by the pod's init container into the volume the runner mounts.
 *
 * @param to The destination directory (made if missing).
 * @param options `from`: where the kit is (default `/opt/waffle`).
 * @returns The entries copied.
 */
export async function copyKit(to: string, options: { from?: string } = {}): Promise<string[]> {
  const from = options.from ?? PROGRAM_DIR;
  await Deno.mkdir(to, { recursive: true });
  for (const name of KIT_ENTRIES) {
    // Missing in the image: a one-line error, before anything is copied.
    await Deno.lstat(`${from}/${name}`).catch(() => {
      throw new UsageError(`Kit entry '${from}/${name}' is missing: is this the waffle image?`);
    });
  }
  for (const name of KIT_ENTRIES) await copyTree(`${from}/${name}`, `${to}/${name}`);
  return [...KIT_ENTRIES];
}

// Copies a file, directory or symlink, replacing what is at `to` (a file
// through a temporary name, so a reader never sees half of one).
async function copyTree(from: string, to: string): Promise<void> {
  const info = await Deno.lstat(from);
  const mode = (info.mode ?? 0o644) & 0o7777;
  const there = await Deno.lstat(to).catch(() => undefined);
  if (info.isDirectory) {
    if (there !== undefined && !there.isDirectory) await Deno.remove(to, { recursive: true });
    await Deno.mkdir(to, { recursive: true });
    for await (const entry of Deno.readDir(from)) {
      await copyTree(`${from}/${entry.name}`, `${to}/${entry.name}`);
    }
    await Deno.chmod(to, mode);
    return;
  }
  if (there?.isDirectory) await Deno.remove(to, { recursive: true });
  const temp = `${to}.kit-tmp`;
  await Deno.remove(temp).catch(() => {});
  if (info.isSymlink) await Deno.symlink(await Deno.readLink(from), temp);
  else {
    await Deno.copyFile(from, temp);
    await Deno.chmod(temp, mode);
  }
  await Deno.rename(temp, to);
}
