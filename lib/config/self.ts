/**
 * How waffle starts itself as a runner: the same program, `runner` subcommand.
 *
 * @module
 */
import { sha256Hex } from "../digest.ts";
import { UsageError } from "../errors.ts";
import {
  ARTEFACT_ENTRY,
  buildDigest,
  currentBuild,
  installDirOf,
  isBuildDir,
  writeBuildStamp,
} from "./artefact_dir.ts";
import { SANDBOX_ARTEFACT_DIR, SANDBOX_RUNNER_CACHE, SANDBOX_RUNTIME } from "./sandbox_paths.ts";

/** The program to execute and the arguments that precede `runner …`. */
export interface SelfCommand {
  /** Absolute path of the executable. */
  executable: string;
  /** Arguments before the subcommand. */
  prefix: string[];
  /** Project root when running from source (mounted into containers). */
  sourceRoot: string | undefined;
  /**
   * The bundled artefact's entry (`…/waffle-<digest12>/waffle.js`) when
   * running from one; its directory is mounted into containers.
   */
  artefact?: string | undefined;
}

/** Deno's flags for running the bundled artefact: no config lookup in the caller's directory. */
export const ARTEFACT_FLAGS: readonly string[] = [
  "run",
  "--allow-all",
  "--quiet",
  "--no-prompt",
  "--no-config",
];

/**
 * The runner's own V8 flags. A 1 MiB young generation: an idle runner keeps
 * what its busiest moment grew, and V8's default (up to 16 MiB semi-spaces)
 * held ~7 MiB more after a burst of commands with output. Scavenges of a
 * small heap stay cheap. (The runner cache is made with the same flags: V8
 * refuses code cached under others.)
 */
export const RUNNER_V8_FLAGS = "--v8-flags=--max-semi-space-size=1";

/**
 * The warm Deno cache `scripts/install.sh` makes beside an installed
 * artefact (`…/lib/waffle/runner-cache`), for the runner as sandboxes run it:
 * mounted read-only as its `DENO_DIR`, it spares each container start
 * Deno's analysis of the artefact's modules into an empty cache.
 *
 * @param artefact The installed artefact.
 * @returns The cache directory, or undefined when there is none.
 */
export function runnerCacheOf(artefact: string): string | undefined {
  const cache = inProgramDir(artefact)
    ? SANDBOX_RUNNER_CACHE
    : `${installDirOf(artefact)}/runner-cache`;
  try {
    return Deno.statSync(cache).isDirectory ? cache : undefined;
  } catch {
    return undefined;
  }
}

// waffle running from its own image (a Kubernetes pod's agent): the program
// is laid out as every sandbox sees it, under PROGRAM_DIR.
function inProgramDir(artefact: string): boolean {
  return artefact === `${SANDBOX_ARTEFACT_DIR}/${ARTEFACT_ENTRY}`;
}

/**
 * The runtime kit a sandbox runs waffle's Deno with (`image/runtime_kit.sh`:
 * glibc's loader and libraries, the static spawn helper): `runtime/` beside
 * an installed artefact, `.tools/runtime/` in a checkout. Both are made by
 * the scripts that install Deno (`scripts/install.sh`, `scripts/setup.sh`).
 *
 * @param self How this waffle runs.
 * @returns The kit's directory.
 * @throws {UsageError} When it is missing.
 */
export function runtimeKitOf(self: SelfCommand): string {
  const kit = self.artefact === undefined
    ? `${self.sourceRoot}/.tools/runtime`
    : inProgramDir(self.artefact)
    ? SANDBOX_RUNTIME
    : `${installDirOf(self.artefact)}/runtime`;
  try {
    if (Deno.statSync(`${kit}/ld.so`).isFile) return kit;
  } catch {
    // reported below
  }
  const script = self.artefact !== undefined ? "scripts/install.sh" : "scripts/setup.sh";
  throw new UsageError(`Runtime kit '${kit}' is missing (no ld.so): run ${script}`);
}

/**
 * The command line that runs this same waffle: the compiled binary itself,
 * the bundled artefact (`deno run … waffle.js`), or `deno run --allow-all
 * <main.ts>` from source. The runner needs
 * `--allow-all`: it reads /proc (which Deno only allows with all
 * permissions), calls prctl through FFI, and runs arbitrary commands.
 *
 * @returns The executable and argument prefix.
 */
export function selfCommand(): SelfCommand {
  if (Deno.build.standalone) {
    return { executable: Deno.execPath(), prefix: [], sourceRoot: undefined };
  }
  // From a registry (JSR): no checkout to run; the CLI that scripts/install.sh put in /usr/local.
  if (!import.meta.url.startsWith("file:")) return installedBeside("/usr/local/lib/waffle");
  // Bundled: this module is one of the artefact's files.
  if (import.meta.url.endsWith(".js")) {
    const file = import.meta.filename!;
    // The library bundle (`…/lib/waffle/mod.js`, scripts/install.sh) runs the CLI beside it.
    if (file.endsWith("/lib/waffle/mod.js")) {
      return installedBeside(file.slice(0, -"/mod.js".length));
    }
    // The CLI: its entry is the main module (this module may be a chunk of it).
    const entry = decodeURIComponent(new URL(Deno.mainModule).pathname);
    return artefactCommand(entry, { executable: Deno.execPath() });
  }
  // lib/config/ → the checkout's root.
  const sourceRoot = import.meta.dirname!.replace(/\/lib\/config$/, "");
  const main = `${sourceRoot}/main.ts`;
  return {
    executable: Deno.execPath(),
    prefix: ["run", "--allow-all", "--quiet", "--no-prompt", main],
    sourceRoot,
  };
}

// The installed CLI in a prefix's lib/waffle: the compiled binary, or the artefact and its Deno.
function installedBeside(dir: string): SelfCommand {
  try {
    if (Deno.statSync(`${dir}/waffle`).isFile) {
      return { executable: `${dir}/waffle`, prefix: [], sourceRoot: undefined };
    }
  } catch {
    // not compiled: the bundled artefact
  }
  return artefactCommand(`${dir}/waffle.js`);
}

/**
 * How to run an installed artefact: `scripts/install.sh` puts the Deno that
 * runs it in its `lib/waffle` (`…/lib/waffle/deno`). The install's own name
 * `…/lib/waffle/waffle.js` stands for its current build.
 *
 * @param path The artefact: a build's entry (`…/waffle-<digest12>/waffle.js`)
 *   or `…/lib/waffle/waffle.js`.
 * @param options The Deno to run it with (default: the install's).
 * @returns The command.
 * @throws {UsageError} When the artefact or its Deno is not a file.
 */
export function artefactCommand(
  path: string,
  options: { executable?: string } = {},
): SelfCommand {
  const artefact = resolveArtefact(path);
  const executable = options.executable ?? `${installDirOf(artefact)}/deno`;
  for (const file of [artefact, executable]) {
    let isFile = false;
    try {
      isFile = Deno.statSync(file).isFile;
    } catch {
      // reported below
    }
    if (!isFile) {
      throw new UsageError(
        `Runner artefact '${artefact}' is not installed ('${file}' is missing): run scripts/install.sh`,
      );
    }
  }
  return { executable, prefix: [...ARTEFACT_FLAGS, artefact], sourceRoot: undefined, artefact };
}

// An install's `lib/waffle/waffle.js` is its current build's entry; any other path is itself.
function resolveArtefact(path: string): string {
  const lib = path.slice(0, path.lastIndexOf("/"));
  if (!path.endsWith(`/${ARTEFACT_ENTRY}`) || isBuildDir(lib)) return path;
  try {
    if (Deno.statSync(path).isFile) return path;
  } catch {
    // not a file: the install's name for its current build
  }
  return currentBuild(lib) ?? path;
}

/** Flags of `waffle runner`, as {@linkcode runnerArgs} renders them. */
export interface RunnerFlags {
  /** Workspace root of the commands. */
  workspace: string;
  /** Idle exit in seconds (0 never); omitted: the runner's default. */
  idleExitSeconds?: number | undefined;
  /** Requests at once. */
  concurrency?: number | undefined;
  /** Fallback poll interval. */
  pollMs?: number | undefined;
  /** Diagnostics file instead of stderr. */
  log?: string | undefined;
}

/**
 * The full argument list (after the executable) that starts a runner on a
 * queue with this same waffle: one place, so the host backend, tests and
 * benchmarks start the runner identically.
 *
 * @param queueDir The queue directory.
 * @param flags The runner's flags.
 * @returns Arguments for {@linkcode selfCommand}'s executable.
 */
export function runnerArgs(queueDir: string, flags: RunnerFlags): string[] {
  const optional: [string, string | number | undefined][] = [
    ["--log", flags.log],
    ["--idle-exit", flags.idleExitSeconds],
    ["--concurrency", flags.concurrency],
    ["--poll-ms", flags.pollMs],
  ];
  return [
    ...selfCommand().prefix,
    "runner",
    "--queue",
    queueDir,
    "--workspace",
    flags.workspace,
    ...optional.flatMap(([flag, value]) => value === undefined ? [] : [flag, String(value)]),
  ];
}

/**
 * The SHA-256 of the artefact, so that a new build changes every sandbox's
 * posture (and so recycles it). A build directory's digest covers all its
 * files (`SHA256SUMS`); a single file's, the install writes beside it with
 * the file's size and mtime. Either is recomputed when a file changed.
 *
 * @param artefact The artefact's path (a build's entry, or the compiled binary).
 * @returns The hex digest.
 */
export function artefactDigest(artefact: string): string {
  const dir = artefact.slice(0, artefact.lastIndexOf("/"));
  if (artefact.endsWith(".js") && isBuildDir(dir)) return buildDigest(dir);
  const stamp = stampOf(artefact);
  try {
    const [hex, ...rest] = Deno.readTextFileSync(`${artefact}.sha256`).trim().split(" ");
    if (hex !== undefined && /^[0-9a-f]{64}$/.test(hex) && rest.join(" ") === stamp) return hex;
  } catch {
    // No sidecar: hash the file.
  }
  return sha256Hex(Deno.readFileSync(artefact));
}

/**
 * Records the artefact's digest for {@linkcode artefactDigest} (the install
 * calls this once per build): a build directory's stamp, after checking its
 * files against `SHA256SUMS`, or a single file's sidecar.
 *
 * @param artefact The artefact's path.
 * @throws {UsageError} When a build's file differs from its `SHA256SUMS`.
 */
export function writeArtefactDigest(artefact: string): void {
  const dir = artefact.slice(0, artefact.lastIndexOf("/"));
  if (artefact.endsWith(".js") && isBuildDir(dir)) {
    writeBuildStamp(dir);
    return;
  }
  const hex = sha256Hex(Deno.readFileSync(artefact));
  const temp = `${artefact}.sha256.tmp`;
  Deno.writeTextFileSync(temp, `${hex} ${stampOf(artefact)}\n`, { mode: 0o644 });
  Deno.renameSync(temp, `${artefact}.sha256`);
}

// Size and mtime: a rebuilt or edited file has another stamp.
function stampOf(path: string): string {
  const info = Deno.statSync(path);
  return `${info.size} ${info.mtime?.getTime() ?? 0}`;
}
