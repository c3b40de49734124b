/**
 * `waffle k8s image` (the waffle image of the installed artefact, made with
 * Docker's API) and `waffle k8s kit` (what the pod's init container runs).
 *
 * @module
 */
import { DockerClient } from "../docker/mod.ts";
import { selfCommand } from "../config/self.ts";
import { SANDBOX_UID } from "../lifecycle/posture.ts";
import { UsageError } from "../errors.ts";
import { buildWaffleImage, copyKit } from "../k8s/image.ts";
import { parse, stringFlag } from "./args.ts";
import { type CliIo, processIo } from "./io.ts";

/** Help text of `waffle k8s image`. */
export const K8S_IMAGE_HELP = `Usage: waffle k8s image [--tag REF] [--json]

Makes the waffle image a Kubernetes pod runs (its init container and its
waffle-agent container) from the installed artefact this waffle runs:
/opt/waffle holds its Deno, runtime kit, build and runner cache. Made with
Docker's API from those files, with no registry; push it to your cluster's
registry yourself. Nothing is made when REF already names an image of this
artefact.

Options:
  --tag REF   the image reference (default waffle:<artefact digest 12>)
  --json      print one JSON object
`;

/** Help text of `waffle k8s kit`. */
export const K8S_KIT_HELP = `Usage: waffle k8s kit --to DIR [--workspace DIR] [--mode DIR=OCTAL]...

Copies the kit of the waffle image (/opt/waffle/{deno,rt,app,cache,empty})
into DIR, modes kept, replacing what is there. The pod's init container runs
it into the volume the runner mounts; users never need to. --workspace gives
a fresh workspace claim's root (root's) to the commands' uid; --mode sets a
directory's mode (an emptyDir comes 0777).
`;

/**
 * Runs `waffle k8s image`.
 *
 * @param args Arguments after `image`.
 * @param io Where to write (default the process's streams).
 * @returns The exit status.
 */
export async function k8sImageCommand(args: string[], io: CliIo = processIo()): Promise<number> {
  const parsed = parse(args, {
    tag: { type: "string" },
    json: { type: "boolean" },
    help: { type: "boolean", short: "h" },
  });
  if (parsed.values.help) {
    await io.stdout(K8S_IMAGE_HELP);
    return 0;
  }
  if (parsed.positionals.length > 0) {
    throw new UsageError(`Unexpected argument '${parsed.positionals[0]}'`);
  }
  const image = await buildWaffleImage(new DockerClient(), {
    tag: stringFlag(parsed, "tag"),
    self: selfCommand(),
  });
  await io.stdout(
    parsed.values.json
      ? `${JSON.stringify(image)}\n`
      : `${image.ref} ${image.id} (${image.built ? "built" : "already there"})\n`,
  );
  return 0;
}

/**
 * Runs `waffle k8s kit`.
 *
 * @param args Arguments after `kit`.
 * @param io Where to write (default the process's streams).
 * @returns The exit status.
 */
export async function k8sKitCommand(args: string[], io: CliIo = processIo()): Promise<number> {
  const parsed = parse(args, {
    to: { type: "string" },
    workspace: { type: "string" },
    mode: { type: "string", multiple: true },
    help: { type: "boolean", short: "h" },
  });
  if (parsed.values.help) {
    await io.stdout(K8S_KIT_HELP);
    return 0;
  }
  if (parsed.positionals.length > 0) {
    throw new UsageError(`Unexpected argument '${parsed.positionals[0]}'`);
  }
  const to = stringFlag(parsed, "to");
  if (to === undefined) throw new UsageError("Missing --to DIR");
  const copied = await copyKit(to);
  await io.stdout(`copied ${copied.join(", ")} to ${to}\n`);
  const workspace = stringFlag(parsed, "workspace");
  if (workspace !== undefined) await giveWorkspace(workspace);
  for (const given of (parsed.values.mode ?? []) as string[]) await setMode(given);
  return 0;
}

// `DIR=MODE` (octal): an emptyDir comes 0777, where a Docker sandbox's
// tmpfs is the runner's alone (0700) or shared with a sticky bit (1777).
async function setMode(given: string): Promise<void> {
  const match = /^(\/[^=\0]*)=([0-7]{3,4})$/.exec(given);
  if (match === null) {
    throw new UsageError(`Invalid --mode '${given}': expected DIR=OCTAL, e.g. /tmp=1777`);
  }
  const [, dir, mode] = match as unknown as [string, string, string];
  const info = await Deno.lstat(dir);
  if (!info.isDirectory) throw new UsageError(`'${dir}' is not a directory`);
  await Deno.chmod(dir, parseInt(mode, 8));
}

// A fresh claim's root is root's: the commands' uid must own it, as a
// Docker sandbox's workspace is theirs. Only the root of the claim (a mount
// point, never a link), and only while root owns it: what a sandbox made
// inside is never walked.
async function giveWorkspace(dir: string): Promise<void> {
  const info = await Deno.lstat(dir);
  if (!info.isDirectory) throw new UsageError(`Workspace '${dir}' is not a directory`);
  if (info.uid === 0) {
    await Deno.chown(dir, SANDBOX_UID, SANDBOX_UID);
    await Deno.chmod(dir, 0o755);
  }
}
