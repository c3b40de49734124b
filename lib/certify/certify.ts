/**
 * A whole certification run against the user's own daemon and configured
 * image: the stress and the kill-mid-write check with the queue on bind
 * mounts (a sandbox of its own, in a throwaway home), the fork bomb in
 * disposable containers, and with `volume` the stress and kill check again
 * with the queue on Docker named volumes. Everything made is removed
 * afterwards; the caller may pass the {@linkcode Cleanup} to run it on an
 * interrupt too.
 *
 * @module
 */
import { loadConfig } from "../config/config.ts";
import { buildIdentity } from "../config/build_identity.ts";
import { DockerClient } from "../docker/client.ts";
import { type DaemonFacts, daemonFacts } from "../docker/facts.ts";
import { resolveImage } from "../lifecycle/ensure.ts";
import { messageOf } from "../queue/connection.ts";
import { UncoverableVolumeError } from "../errors.ts";
import { type AnyCheck, brokenCheck, judged, type QueueMount, skippedCheck } from "./check.ts";
import { CERTIFY_LABEL, Cleanup, type CleanupReport } from "./cleanup.ts";
import { type CertifyReport, type EvidenceHeader, verdictOf } from "./evidence.ts";
import { forkBombCheck } from "./fork_bomb.ts";
import { killCheck } from "./kill_check.ts";
import { registerLeftovers } from "./leftovers.ts";
import { queueMountFacts } from "./mounts.ts";
import { openBindRig, type QueueRig } from "./rig.ts";
import { DEFAULT_STRESS_SECONDS, stressCheck } from "./stress.ts";
import { openVolumeRig } from "./volume.ts";

/** Options of {@linkcode certify}. */
export interface CertifyOptions {
  /** Stress duration from the first heartbeat; default {@linkcode DEFAULT_STRESS_SECONDS}. */
  seconds?: number;
  /** Also run the queue checks on Docker named volumes. */
  volume?: boolean;
  /** The config file (`--config`); default the one waffle finds. */
  configPath?: string | undefined;
  /** The image; default the configured one. */
  image?: string;
  /** The daemon; default from `DOCKER_HOST`. */
  docker?: DockerClient;
  /** The run's cleanup (made with the same client), to run it on an interrupt too. */
  cleanup?: Cleanup;
  /** Receives progress lines. */
  onProgress?: (line: string) => void;
}

/**
 * Runs every check and returns the evidence. Never throws for what the
 * installation does: a failing or unrunnable check is a row of the report.
 *
 * @param options Duration, volume, config file, image, client, cleanup, progress.
 * @returns Header, checks, verdict and what was cleaned up.
 * @throws {UsageError} When the config is invalid or names a runner artefact that is not installed.
 *
 * @example
 * ```ts ignore
 * const report = await certify({ seconds: 30 });
 * report.verdict.status; // "supported"
 * ```
 */
export async function certify(options: CertifyOptions = {}): Promise<CertifyReport> {
  const runId = crypto.randomUUID().replaceAll("-", "").slice(0, 12);
  const config = loadConfig(
    options.configPath === undefined ? {} : { configPath: options.configPath },
  );
  const image = options.image ?? config.image;
  let docker = options.docker;
  let facts: DaemonFacts | undefined;
  let unavailable: string | undefined;
  try {
    docker ??= new DockerClient();
    facts = await daemonFacts(docker);
  } catch (error) {
    unavailable = messageOf(error);
  }
  const header: EvidenceHeader = {
    docker: facts ?? null,
    dockerUnavailable: unavailable ?? null,
    endpoint: docker?.location ?? (Deno.env.get("DOCKER_HOST") ?? "unix:///var/run/docker.sock"),
    host: { os: Deno.build.os, arch: Deno.build.arch, kernel: Deno.osRelease() },
    queueMounts: {},
    image: { ref: image, id: null },
    waffle: buildIdentity({ runner: config.runner }),
  };
  if (docker === undefined || facts === undefined) {
    const checks = allSkipped(options, "no Docker daemon");
    const cleanup = { containers: [], volumes: [], dirs: [], problems: [] };
    return { runId, header, checks, verdict: verdictOf(checks, header), cleanup };
  }
  const cleanup = options.cleanup ?? new Cleanup(docker);
  const checks: AnyCheck[] = [];
  let cleaned: CleanupReport;
  try {
    await removeLeftovers(docker, { cleanup, onProgress: options.onProgress });
    const found = await resolveImage(docker, image).catch((error: unknown) =>
      error instanceof UncoverableVolumeError ? error : messageOf(error)
    );
    if (typeof found === "string") checks.push(...allSkipped(options, found));
    else if (found instanceof UncoverableVolumeError) checks.push(...allRefused(options, found));
    else {
      header.image.id = found.id;
      const { runner, tmpBytes } = config;
      await runChecks(docker, {
        ...options,
        runId,
        image,
        runner,
        tmpBytes,
        cleanup,
        header,
        checks,
      });
    }
  } finally {
    // Whatever happens (every check catches its own failures).
    cleaned = await cleanup.run();
  }
  return { runId, header, checks, verdict: verdictOf(checks, header), cleanup: cleaned };
}

interface RunContext extends CertifyOptions {
  runId: string;
  image: string;
  runner: string | undefined;
  /** The size of each tmpfs over the image's VOLUMEs, as in a sandbox. */
  tmpBytes: number;
  cleanup: Cleanup;
  header: EvidenceHeader;
  checks: AnyCheck[];
}

async function runChecks(docker: DockerClient, ctx: RunContext): Promise<void> {
  const runId = ctx.runId;
  ctx.onProgress?.(
    `run ${runId} (label ${CERTIFY_LABEL}=${runId}): starting a sandbox of '${ctx.image}' ` +
      "(queue on bind mounts)",
  );
  await queueChecks(ctx, {
    mount: "bind mount",
    open: async () => (await openBindRig(docker, ctx)).rig,
  });
  if (ctx.cleanup.interrupted) return;
  ctx.checks.push(
    await guarded("fork bomb", { run: () => forkBombCheck(docker, { ...ctx, runId }) }),
  );
  if (!ctx.volume || ctx.cleanup.interrupted) return;
  ctx.onProgress?.("starting the same container with the queue on Docker named volumes");
  await queueChecks(ctx, {
    mount: "volume",
    open: async () => {
      const opened = await openVolumeRig(docker, { ...ctx, runId });
      return "skipped" in opened ? opened.skipped : opened.rig;
    },
  });
}

// What runs that died left (a kill -9, a crash), removed before this one
// makes anything; a failure to is a line of progress, not of the verdict.
async function removeLeftovers(
  docker: DockerClient,
  options: { cleanup: Cleanup; onProgress: ((line: string) => void) | undefined },
): Promise<void> {
  const { cleanup, onProgress } = options;
  try {
    const runs = await registerLeftovers(docker, cleanup);
    const removed = await cleanup.run();
    if (removed.containers.length + removed.volumes.length + removed.dirs.length > 0) {
      onProgress?.(
        `removed what runs that died left${runs.length === 0 ? "" : ` (${runs.join(", ")})`}: ` +
          `${removed.containers.length} containers, ${removed.volumes.length} volumes, ` +
          `${removed.dirs.length} directories`,
      );
    }
  } catch (error) {
    onProgress?.(`what runs that died left was not looked at: ${messageOf(error)}`);
  }
}

// The stress and the kill check on one rig (the kill check last: it kills
// the container). A rig that cannot be made here skips both; one that fails
// to start fails both.
async function queueChecks(
  ctx: RunContext,
  options: { mount: QueueMount; open: () => Promise<QueueRig | string> },
): Promise<void> {
  const { mount, open } = options;
  const started = performance.now();
  let rig: QueueRig | string;
  try {
    rig = await open();
    if (typeof rig !== "string") {
      const shell = await shellProblem(rig);
      if (shell !== undefined) rig = `${shell}: the checks run sh, echo and cat`;
    }
  } catch (error) {
    const message = `the sandbox did not start: ${messageOf(error)}`;
    ctx.checks.push(brokenCheck("stress", { mount, started, message }));
    ctx.checks.push(brokenCheck("kill mid-write", { mount, started, message }));
    return;
  }
  if (typeof rig === "string") {
    ctx.checks.push(skippedCheck("stress", { mount, reason: rig }));
    ctx.checks.push(skippedCheck("kill mid-write", { mount, reason: rig }));
    return;
  }
  const ready = rig;
  ctx.header.queueMounts[mount] = await queueMountFacts(ready).then(
    (facts) => facts.describe,
    (error) => `not looked at: ${messageOf(error)}`,
  );
  const seconds = ctx.seconds ?? DEFAULT_STRESS_SECONDS;
  const onProgress = ctx.onProgress;
  ctx.checks.push(
    await guarded("stress", {
      mount,
      run: () => stressCheck(ready, { seconds, ...progress(onProgress) }),
    }),
  );
  if (ctx.cleanup.interrupted) return;
  ctx.checks.push(
    await guarded("kill mid-write", { mount, run: () => killCheck(ready, progress(onProgress)) }),
  );
}

function progress(
  onProgress: ((line: string) => void) | undefined,
): { onProgress?: (line: string) => void } {
  return onProgress === undefined ? {} : { onProgress };
}

// Why the image cannot run the checks' commands, or undefined when it can.
async function shellProblem(rig: QueueRig): Promise<string | undefined> {
  const id = await rig.submit({ argv: ["sh", "-c", "echo ok | cat"] });
  const { result, stdout } = await rig.queue.collect(id);
  await rig.queue.ack(id);
  if (result.exitCode === 0 && new TextDecoder().decode(stdout) === "ok\n") return undefined;
  return `the image has no working sh (exit ${result.exitCode}${
    result.error === undefined || result.error === null ? "" : `: ${result.error}`
  })`;
}

// A check's result, or a failed one (mode `harness`) when it broke off.
async function guarded(
  name: string,
  options: { mount?: QueueMount; run: () => Promise<AnyCheck> },
): Promise<AnyCheck> {
  const { mount } = options;
  const started = performance.now();
  try {
    return await options.run();
  } catch (error) {
    return brokenCheck(name, { mount, started, message: messageOf(error) });
  }
}

function allSkipped(options: CertifyOptions, reason: string): AnyCheck[] {
  return everyCheck(options, (name, mount) => skippedCheck(name, { mount, reason }));
}

// An image waffle refuses to run fails every check (never a skip: no other
// installation runs it either), each naming why.
function allRefused(options: CertifyOptions, error: UncoverableVolumeError): AnyCheck[] {
  const started = performance.now();
  const failures = [{ mode: "image" as const, detail: error.message }];
  return everyCheck(
    options,
    (name, mount) =>
      judged(name, {
        mount,
        started,
        summary: `not run: ${error.message}`,
        figures: undefined,
        failures,
      }),
  );
}

function everyCheck(
  options: CertifyOptions,
  check: (name: string, mount: QueueMount | undefined) => AnyCheck,
): AnyCheck[] {
  const queue = (mount: QueueMount): AnyCheck[] => [
    check("stress", mount),
    check("kill mid-write", mount),
  ];
  return [
    ...queue("bind mount"),
    check("fork bomb", undefined),
    ...(options.volume ? queue("volume") : []),
  ];
}
