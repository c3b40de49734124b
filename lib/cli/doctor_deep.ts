/**
 * `waffle doctor --deep`: certifies this installation's Docker with the
 * waffle that runs (see `certify/mod.ts`). Progress goes to stderr, the
 * evidence (header, a row per check, the verdict) to stdout, as text or one
 * JSON object. An interrupt (Ctrl-C, SIGTERM) removes everything the run made
 * before the process exits.
 *
 * @module
 */
import { escapeControls } from "../terminal/control_text.ts";
import { certify, Cleanup, formatReport } from "../certify/mod.ts";
import type { CertifyReport } from "../certify/mod.ts";
import { DockerClient } from "../docker/client.ts";
import { EXIT_CANCELLED, EXIT_FAILURE, EXIT_WAFFLE, exitCodeOfSignal } from "../exit_codes.ts";
import type { CliIo } from "./io.ts";

/** SIGTERM's number, the same on every Linux architecture. */
const SIGTERM_NUMBER = 15;

/** Options of {@linkcode deepDoctor}. */
export interface DeepDoctorOptions {
  /** The stress's duration in seconds. */
  seconds: number;
  /** Also check the queue on Docker named volumes. */
  volume: boolean;
  /** Print one JSON object instead of text. */
  json: boolean;
  /** The config file (`--config`). */
  configPath?: string | undefined;
}

/**
 * Runs the deep checks and prints the evidence.
 *
 * @param options Duration, volume, output format.
 * @param io Process streams.
 * @returns 0 when supported; `EXIT_FAILURE` when a check failed or was
 * skipped; `EXIT_WAFFLE` when there is no Docker daemon. On an interrupt the
 * process exits (130 for SIGINT, 143 for SIGTERM) once the cleanup is done.
 *
 * @example
 * ```ts ignore
 * const status = await deepDoctor({ seconds: 30, volume: false, json: false }, processIo());
 * ```
 */
export async function deepDoctor(options: DeepDoctorOptions, io: CliIo): Promise<number> {
  const progress = (line: string): void =>
    void io.stderr(`doctor --deep: ${escapeControls(line)}\n`);
  let docker: DockerClient | undefined;
  try {
    docker = new DockerClient();
  } catch {
    // certify() reports the daemon as unavailable, with the reason.
  }
  const cleanup = docker === undefined ? undefined : new Cleanup(docker);
  const interrupt = cleanup === undefined ? undefined : onInterrupt(cleanup, io);
  let report: CertifyReport;
  try {
    report = await certify({
      seconds: options.seconds,
      volume: options.volume,
      configPath: options.configPath,
      ...(docker === undefined ? {} : { docker }),
      ...(cleanup === undefined ? {} : { cleanup }),
      onProgress: progress,
    });
  } finally {
    // An interrupt under way ends the process itself, once it has cleaned up.
    await interrupt?.stop();
  }
  await io.stdout(
    options.json
      ? `${JSON.stringify(report)}\n`
      : escapeControls(formatReport(report), { keepNewlines: true }),
  );
  if (report.verdict.status === "supported") return 0;
  return report.header.docker === null ? EXIT_WAFFLE : EXIT_FAILURE;
}

// SIGINT and SIGTERM: clean up, then exit as killed by that signal. A second
// signal while cleaning up is ignored: stopping halfway would leave things.
// `stop` removes the listeners, or waits for an interrupt under way (which exits).
function onInterrupt(cleanup: Cleanup, io: CliIo): { stop: () => Promise<void> } {
  let exiting: Promise<void> | undefined;
  const say = (line: string): Promise<void> =>
    io.stderr(`doctor --deep: ${escapeControls(line)}\n`);
  const interrupted = async (code: number): Promise<void> => {
    await say("interrupted: removing the run's containers, volumes and files");
    const removed = await cleanup.interrupt();
    await say(
      `removed ${removed.containers.length} containers, ${removed.volumes.length} volumes, ` +
        `${removed.dirs.length} directories${
          removed.problems.length === 0 ? "" : `; left: ${removed.problems.join("; ")}`
        }`,
    );
    Deno.exit(code);
  };
  const listeners: [Deno.Signal, () => void][] = [
    ["SIGINT", () => void (exiting ??= interrupted(EXIT_CANCELLED))],
    ["SIGTERM", () => void (exiting ??= interrupted(exitCodeOfSignal(SIGTERM_NUMBER)))],
  ];
  for (const [signal, listener] of listeners) Deno.addSignalListener(signal, listener);
  return {
    stop: async () => {
      if (exiting !== undefined) await exiting;
      for (const [signal, listener] of listeners) Deno.removeSignalListener(signal, listener);
    },
  };
}
