/**
 * Which waffle this is: its version (from `deno.json`, the one place it is
 * written) and the build that runs, so evidence such as `waffle doctor
 * --deep`'s header names the exact artefact it was made with.
 *
 * @module
 */
import { artefactCommand, artefactDigest, selfCommand } from "./self.ts";
import { WAFFLE_VERSION } from "./version.ts";

export { WAFFLE_VERSION };

/** The build of waffle that runs. */
export interface BuildIdentity {
  /** {@linkcode WAFFLE_VERSION}. */
  version: string;
  /** How it runs: `compiled binary`, `bundled artefact` or `source checkout`. */
  kind: "compiled binary" | "bundled artefact" | "source checkout";
  /** The binary, the artefact, or the checkout's root. */
  path: string;
  /** SHA-256 of the binary or artefact; undefined from a source checkout. */
  digest: string | undefined;
  /** The artefact sandboxes run as their runner, when the config names another one. */
  runner?: { path: string; digest: string } | undefined;
}

/**
 * This process's build, and the runner artefact the config names (if any).
 *
 * @param options `runner`: the config's runner artefact.
 * @returns The identity.
 * @throws {UsageError} When the configured runner artefact is not installed.
 *
 * @example
 * ```ts
 * import { buildIdentity } from "./build_identity.ts";
 * const { version, kind } = buildIdentity();
 * ```
 */
export function buildIdentity(options: { runner?: string | undefined } = {}): BuildIdentity {
  const self = selfCommand();
  const runner = options.runner === undefined ? undefined : artefactCommand(options.runner);
  const ran = runner?.artefact === undefined
    ? undefined
    : { path: runner.artefact, digest: artefactDigest(runner.artefact) };
  if (self.artefact !== undefined) {
    return {
      version: WAFFLE_VERSION,
      kind: "bundled artefact",
      path: self.artefact,
      digest: artefactDigest(self.artefact),
      runner: ran,
    };
  }
  if (self.sourceRoot === undefined) {
    return {
      version: WAFFLE_VERSION,
      kind: "compiled binary",
      path: self.executable,
      digest: artefactDigest(self.executable),
      runner: ran,
    };
  }
  return {
    version: WAFFLE_VERSION,
    kind: "source checkout",
    path: self.sourceRoot,
    digest: undefined,
    runner: ran,
  };
}
