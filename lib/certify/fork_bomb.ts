/**
 * Containment of a fork bomb by the pids limit, in disposable containers of
 * the configured image (no network, read-only root, no capabilities, one
 * CPU, the commands' uid, each of the image's VOLUMEs under the same tmpfs
 * as in a sandbox) capped at 32 pids. First a bounded loop of
 * background sleeps must be stopped by the limit (never 200 of them); only
 * then does a real bomb run, for a few seconds, bounded inside by `timeout`
 * too. The peak task and process counts observed (`docker stats`, `docker
 * top`, and the pids cgroup when this host sees it) must stay within the
 * limit read back from Docker. Both containers are removed, with any
 * anonymous volume Docker gave them (none: an image with a VOLUME no tmpfs
 * can cover is refused before either is made).
 *
 * @module
 */
import type { DockerClient } from "../docker/client.ts";
import type { ContainerCreateBody } from "../docker/types.ts";
import { resolveImage } from "../lifecycle/ensure.ts";
import { type ImageFacts, imageVolumeMasks, SANDBOX_UID } from "../lifecycle/posture.ts";
import { type CheckResult, type Failure, judged } from "./check.ts";
import type { Cleanup } from "./cleanup.ts";
import { runLabels } from "./owner.ts";
import { findPidsCgroup, readPidsCgroup } from "./pids_cgroup.ts";
import { delay } from "./_poll.ts";

/** The pids limit of the disposable containers. */
export const FORK_BOMB_PIDS_LIMIT = 32;
/** How long the real bomb runs before the host kills its container. */
const BOMB_MS = 4000;

// Forks sleeps until the limit refuses one (a failed fork ends a
// non-interactive sh: the subshell exits non-zero), holds them for 3 s so the
// peak can be seen, and exits with the subshell's status.
const LOOP_SCRIPT = "exec 2>/dev/null; i=0; " +
  "( while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done ); rc=$?; sleep 3; exit $rc";
// The classic bomb; `timeout` bounds it even if this host dies meanwhile.
const BOMB_SCRIPT = "exec 2>/dev/null; b='bomb() { bomb | bomb & }; bomb; while :; do :; done'; " +
  `if command -v timeout >/dev/null; then exec timeout -s KILL 20 sh -c "$b"; fi; exec sh -c "$b"`;

/** What one disposable container's samples showed. */
export interface PidsPeak {
  /** Largest `docker stats` pids count (tasks, threads included). */
  tasks: number;
  /** Largest `docker top` process count. */
  processes: number;
  /** Largest `pids.current` of its cgroup, when visible from this host. */
  cgroupCurrent: number | undefined;
  /** Its cgroup's `pids.peak`, when the kernel keeps one. */
  cgroupPeak: number | undefined;
  /** Forks its cgroup refused (`pids.events`), when visible. */
  refused: number | undefined;
  /** Samples taken (all sources). */
  samples: number;
}

/** What the fork bomb check measured. */
export interface ForkBombFigures {
  /** The limit asked for. */
  limit: number;
  /** `HostConfig.PidsLimit` read back from Docker. */
  readBack: number | null;
  /** The cgroup's `pids.max`, when visible from this host. */
  cgroupMax: string | undefined;
  /** The bounded loop: its exit code (non-zero: the limit stopped it) and peak. */
  loop: PidsPeak & { exitCode: number };
  /** The real bomb's peak; undefined when it was not run (the loop was not contained). */
  bomb: PidsPeak | undefined;
  /** The largest count seen by any source in either container. */
  peak: number;
}

/** The fork bomb check's result. */
export type ForkBombCheck = CheckResult<ForkBombFigures>;

/**
 * Runs the fork bomb check.
 *
 * @param docker The daemon.
 * @param options The image, the size of its VOLUMEs' tmpfs (`tmpBytes`, as a
 * sandbox's), the run's id and cleanup, progress.
 * @returns The result with its figures.
 * @throws {DockerError} When the image is missing or a container cannot be created.
 * @throws {UncoverableVolumeError} When the image has a VOLUME no capped tmpfs can cover.
 *
 * @example
 * ```ts ignore
 * const check = await forkBombCheck(docker, {
 *   image: "waffle-runner:latest",
 *   tmpBytes: 256 * 1024 * 1024,
 *   runId,
 *   cleanup,
 * });
 * check.figures?.peak; // 32
 * ```
 */
export async function forkBombCheck(
  docker: DockerClient,
  options: {
    image: string;
    tmpBytes: number;
    runId: string;
    cleanup: Cleanup;
    onProgress?: (line: string) => void;
  },
): Promise<ForkBombCheck> {
  const started = performance.now();
  const image = await resolveImage(docker, options.image);
  const run = (phase: string, script: string): Promise<Phase> =>
    runPhase(docker, {
      ...options,
      name: `waffle-certify-${options.runId}-${phase}`,
      body: disposableBody(image, { ...options, script }),
      stopAfterMs: phase === "bomb" ? BOMB_MS : undefined,
    });
  options.onProgress?.(`fork bomb: a bounded loop under pids ${FORK_BOMB_PIDS_LIMIT}`);
  const loop = await run("pids-loop", LOOP_SCRIPT);
  const contained = loop.exitCode !== 0 && loop.readBack === FORK_BOMB_PIDS_LIMIT &&
    peakOf(loop.peak) <= FORK_BOMB_PIDS_LIMIT;
  let bomb: Phase | undefined;
  if (contained) {
    options.onProgress?.(`fork bomb: the bomb, for ${BOMB_MS / 1000} s`);
    bomb = await run("bomb", BOMB_SCRIPT);
  }
  const figures: ForkBombFigures = {
    limit: FORK_BOMB_PIDS_LIMIT,
    readBack: loop.readBack,
    cgroupMax: loop.cgroupMax,
    loop: { ...loop.peak, exitCode: loop.exitCode },
    bomb: bomb?.peak,
    peak: Math.max(peakOf(loop.peak), bomb === undefined ? 0 : peakOf(bomb.peak)),
  };
  return judged("fork bomb", {
    started,
    summary: describeBomb(figures),
    figures,
    failures: forkBombFailures(figures),
  });
}

/**
 * What a fork bomb check's figures fail on.
 *
 * @param f The figures.
 * @returns The failures; empty when it passed.
 */
export function forkBombFailures(f: ForkBombFigures): Failure[] {
  const failures: Failure[] = [];
  const fail = (mode: Failure["mode"], detail: string): number => failures.push({ mode, detail });
  if (f.readBack !== f.limit) fail("pids limit", `PidsLimit read back '${f.readBack}'`);
  if (f.cgroupMax !== undefined && f.cgroupMax !== String(f.limit)) {
    fail("pids limit", `cgroup pids.max '${f.cgroupMax}'`);
  }
  if (f.loop.exitCode === 0) fail("pids limit", "the bounded loop started all 200 sleeps");
  if (f.peak > f.limit) fail("pids limit", `${f.peak} tasks observed, limit ${f.limit}`);
  if (f.bomb === undefined) fail("pids limit", "the bomb was not run: the loop was not contained");
  const samples = f.loop.samples + (f.bomb?.samples ?? 0);
  if (samples === 0) fail("harness", "no pids sample");
  return failures;
}

function peakOf(p: PidsPeak): number {
  return Math.max(p.tasks, p.processes, p.cgroupCurrent ?? 0, p.cgroupPeak ?? 0);
}

function describeBomb(f: ForkBombFigures): string {
  const sources = (p: PidsPeak): string =>
    `peak ${peakOf(p)} (docker stats ${p.tasks}, docker top ${p.processes}${
      p.cgroupCurrent === undefined
        ? ""
        : `, cgroup ${p.cgroupPeak ?? p.cgroupCurrent}, ${p.refused ?? "?"} forks refused`
    })`;
  const loop = `bounded loop ${f.loop.exitCode === 0 ? "not stopped" : "stopped"} ` +
    `(exit ${f.loop.exitCode}) at ${sources(f.loop)}`;
  const bomb = f.bomb === undefined ? "bomb not run" : `bomb ${sources(f.bomb)}`;
  return `limit ${f.limit} (read back ${f.readBack}${
    f.cgroupMax === undefined ? "" : `, pids.max ${f.cgroupMax}`
  }); ${loop}; ${bomb}; peak observed ${f.peak}`;
}

// A disposable, locked-down container running `script` under the pids limit.
// It mounts nothing of its own: every VOLUME gets a capped tmpfs (an image
// with one no tmpfs can cover never gets here: resolveImage refuses it).
function disposableBody(
  image: ImageFacts,
  options: { runId: string; tmpBytes: number; script: string },
): ContainerCreateBody {
  return {
    Image: image.id,
    Entrypoint: ["/bin/sh", "-c"],
    Cmd: [options.script],
    User: `${SANDBOX_UID}:${SANDBOX_UID}`,
    WorkingDir: "/",
    Labels: runLabels(options.runId),
    HostConfig: {
      Init: true,
      Tmpfs: imageVolumeMasks(image, { sizeBytes: options.tmpBytes, mounted: [] }),
      PidsLimit: FORK_BOMB_PIDS_LIMIT,
      NetworkMode: "none",
      ReadonlyRootfs: true,
      CapDrop: ["ALL"],
      SecurityOpt: ["no-new-privileges"],
      Memory: 128 * 1024 * 1024,
      MemorySwap: 128 * 1024 * 1024,
      NanoCpus: 1e9,
      LogConfig: { Type: "none", Config: {} },
      RestartPolicy: { Name: "no" },
    },
  };
}

interface Phase {
  exitCode: number;
  readBack: number | null;
  cgroupMax: string | undefined;
  peak: PidsPeak;
}

// Creates, starts and samples one container until it exits (or, with
// `stopAfterMs`, until then), then removes it.
async function runPhase(
  docker: DockerClient,
  options: {
    name: string;
    body: ContainerCreateBody;
    cleanup: Cleanup;
    stopAfterMs: number | undefined;
  },
): Promise<Phase> {
  options.cleanup.container(options.name);
  const id = await options.cleanup.creating(
    docker.createContainer(options.name, options.body).then(async (id) => {
      await docker.startContainer(id);
      return id;
    }),
  );
  const sampler = new PidsSampler(docker, id);
  try {
    const inspected = await docker.inspectContainer(id);
    const cgroupMax = sampler.cgroupDir === undefined
      ? undefined
      : readPidsCgroup(sampler.cgroupDir)?.max;
    sampler.start();
    const exitCode = options.stopAfterMs === undefined
      ? await docker.waitContainer(id, { timeoutMs: 30_000 })
      : await delay(options.stopAfterMs).then(() => -1);
    await sampler.stop();
    return {
      exitCode,
      readBack: inspected?.HostConfig.PidsLimit ?? null,
      cgroupMax,
      peak: sampler.peak(),
    };
  } finally {
    await sampler.stop();
    await docker.removeContainer(id, { force: true });
  }
}

// Samples a container's task and process counts until stopped.
class PidsSampler {
  readonly cgroupDir: string | undefined;
  #docker: DockerClient;
  #id: string;
  #peak: PidsPeak = {
    tasks: 0,
    processes: 0,
    cgroupCurrent: undefined,
    cgroupPeak: undefined,
    refused: undefined,
    samples: 0,
  };
  #stopped = false;
  #loops: Promise<void>[] = [];

  constructor(docker: DockerClient, id: string) {
    this.#docker = docker;
    this.#id = id;
    this.cgroupDir = findPidsCgroup(id);
  }

  start(): void {
    const loop = async (sample: () => Promise<void>, pauseMs: number): Promise<void> => {
      while (!this.#stopped) {
        // `ps` can fail while processes vanish under it; the next sample counts.
        await sample().then(() => void this.#peak.samples++, () => {});
        await delay(pauseMs);
      }
    };
    const peak = this.#peak;
    this.#loops.push(loop(async () => {
      peak.tasks = Math.max(peak.tasks, (await this.#docker.stats(this.#id)).pids);
    }, 20));
    this.#loops.push(loop(async () => {
      const top = await this.#docker.top(this.#id, { psArgs: "-e -o pid" });
      peak.processes = Math.max(peak.processes, top.Processes.length);
    }, 50));
    const dir = this.cgroupDir;
    if (dir !== undefined) {
      this.#loops.push(loop(() => {
        const now = readPidsCgroup(dir);
        if (now === undefined) return Promise.reject(new Error("cgroup gone"));
        peak.cgroupCurrent = Math.max(peak.cgroupCurrent ?? 0, now.current);
        if (now.peak !== undefined) peak.cgroupPeak = now.peak;
        if (now.refused !== undefined) peak.refused = now.refused;
        return Promise.resolve();
      }, 5));
    }
  }

  peak(): PidsPeak {
    return { ...this.#peak };
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await Promise.all(this.#loops);
  }
}
