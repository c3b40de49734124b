/**
 * `waffle doctor`: checks each part of the path a request takes and reports a
 * row per check with its time and, on failure, the reason.
 *
 * @module
 */
import { escapeControls } from "../terminal/control_text.ts";
import { join } from "../path.ts";
import { EXIT_FAILURE, EXIT_WAFFLE } from "../exit_codes.ts";
import { UsageError } from "../errors.ts";
import { messageOf } from "../queue/connection.ts";
import { openHostBackend } from "../host_backend.ts";
import { dockerChecks } from "./doctor_docker.ts";
import { mcpChecks } from "./doctor_mcp.ts";
import { sandboxChecks } from "./doctor_sandboxes.ts";
import { egressChecks } from "./doctor_egress.ts";
import { noPositionals, numberFlag, parse, type Parsed, stringFlag } from "./args.ts";
import { DEFAULT_STRESS_SECONDS } from "../certify/stress.ts";
import { loadConfig } from "../config/config.ts";
import { quotaSupport } from "../lifecycle/quota.ts";
import type { CliIo } from "./io.ts";

/** One check's outcome. */
export interface DoctorRow {
  /** What was checked. */
  name: string;
  /** False when the check failed (doctor then exits 1). */
  ok: boolean;
  /** True for a passing check that found something the operator should know. */
  warning: boolean;
  /** How long the check took. */
  ms: number;
  /** One line: what was found, or why it failed. */
  detail: string;
}

/** What a passing check reports: a detail line, or one marked as a warning. */
export type CheckOutcome = string | { detail: string; warning: true };

/**
 * A named check; returns a detail line or throws the reason. One that has not
 * answered within `timeoutMs` (default {@linkcode CHECK_TIMEOUT_MS}) fails
 * with that reason, and the next check runs.
 */
export type DoctorCheck = { name: string; run: () => Promise<CheckOutcome>; timeoutMs?: number };

/** The longest `--deep --seconds` accepted: an hour. */
export const MAX_DEEP_SECONDS = 3600;

/** How long a check may take before doctor reports it as failed and goes on: 2 minutes. */
export const CHECK_TIMEOUT_MS = 120_000;

/** Help text of `waffle doctor`. */
export const DOCTOR_HELP = `Usage: waffle doctor [--json] [--no-docker] [--config FILE]
       waffle doctor --deep [--seconds N] [--volume] [--json]

Checks the queue round trip on the host filesystem, reports the host's
fs.protected_* sysctls (waffle relies on none of them), whether each
sandbox's disk quota can be enforced (a WARN row when not) and, unless
--no-docker, the Docker daemon, the runner image, and a sandbox container
start with a bind-mount write/read round trip. One "sandbox <who>" row per
sandbox of this home: a WARN row for what its next call heals (a missing or
reset outbound/, set-aside trees waiting for removal, a stale warm.json).
One "mcp <name> authority" row per configured MCP server (execution,
authority, groups, env names, tools) and, with Docker, an initialize +
tools/list probe of each server that executes in a sandbox (in a throwaway
home). An "egress proxy" row: this home's proxy container, whether it
answers, how many identities it serves and its CA's fingerprint. With
[backend] kind = "kubernetes", a "kubernetes credentials" row and a
"kubernetes sandboxes" row (the API server lists agent-sandbox's Sandbox
objects for this identity). A check that has not answered in 2 minutes
fails; the next one runs.
Exit status 0 when every check passes, ${EXIT_FAILURE} otherwise.

--deep certifies this installation's Docker for the queue, with this waffle
and the configured image (a throwaway sandbox, removed afterwards, also on
Ctrl-C): N seconds (default ${DEFAULT_STRESS_SECONDS}) of 8 host clients against a runner in a
network-less container over the bind-mounted queue, a docker kill while the
runner's result write waits on a lock (then PRAGMA integrity_check of both
files), and a fork bomb in a disposable container capped at 32 pids. With
--volume the queue checks run again with the files on Docker named volumes.
stdout: a header (Docker version, API, OS, architecture, drivers, kernel,
the queue's mount, waffle's version and artefact digest), a row per check,
and a verdict: supported, not supported (naming the failing mode) or not
certified (a check was skipped: a skip never passes). Progress on stderr.
Exit status 0 when supported, ${EXIT_FAILURE} otherwise, ${EXIT_WAFFLE} without a Docker daemon.
`;

/**
 * Runs `waffle doctor`.
 *
 * @param args Arguments after `doctor`.
 * @param io Process streams.
 * @returns 0 when all checks pass, else 1.
 */
export async function doctorCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    json: { type: "boolean" },
    "no-docker": { type: "boolean" },
    config: { type: "string" },
    deep: { type: "boolean" },
    seconds: { type: "string" },
    volume: { type: "boolean" },
  });
  if (parsed.values.deep) return await deep(parsed, io);
  for (const flag of ["seconds", "volume"]) {
    if (parsed.values[flag] !== undefined) {
      throw new UsageError(`Option '--${flag}' needs '--deep'`);
    }
  }
  const docker = !parsed.values["no-docker"];
  const configPath = stringFlag(parsed, "config");
  // Each group is built on its own: a config or home one of them cannot
  // read is that group's failing row, and the others still run.
  const checks: DoctorCheck[] = [
    { name: "queue round trip (host fs)", run: queueRoundTrip },
    { name: "host sysctls", run: hostSysctls },
    { name: "disk quota", run: diskQuota },
    ...(docker ? await group("docker", () => dockerChecks()) : []),
    ...await group("mcp", () => mcpChecks({ docker, configPath })),
    ...await group("sandboxes", () => sandboxChecks({ docker })),
    ...(docker ? await group("egress", () => egressChecks({ configPath })) : []),
    ...await group("kubernetes", async () => {
      const { kubernetesChecks } = await import("./doctor_k8s.ts");
      return kubernetesChecks({ configPath });
    }),
  ];
  const rows: DoctorRow[] = [];
  for (const check of checks) {
    const started = performance.now();
    try {
      const outcome = await bounded(check);
      rows.push({
        name: check.name,
        ok: true,
        warning: typeof outcome !== "string",
        ms: performance.now() - started,
        detail: typeof outcome === "string" ? outcome : outcome.detail,
      });
    } catch (error) {
      rows.push({
        name: check.name,
        ok: false,
        warning: false,
        ms: performance.now() - started,
        detail: messageOf(error),
      });
    }
    if (!parsed.values.json) {
      const row = rows.at(-1)!;
      await io.stdout(
        `${row.ok ? (row.warning ? "WARN" : "ok  ") : "FAIL"}  ${row.name.padEnd(34)} ${
          row.ms.toFixed(1).padStart(8)
        } ms  ${escapeControls(row.detail)}\n`,
      );
    }
  }
  const ok = rows.every((row) => row.ok);
  if (parsed.values.json) await io.stdout(`${JSON.stringify({ ok, checks: rows })}\n`);
  return ok ? 0 : EXIT_FAILURE;
}

// `doctor --deep`, loaded only when asked for.
async function deep(parsed: Parsed, io: CliIo): Promise<number> {
  noPositionals(parsed.positionals);
  if (parsed.values["no-docker"]) {
    throw new UsageError("Option '--deep' needs Docker: drop '--no-docker'");
  }
  const seconds = numberFlag(parsed, "seconds", { integer: true, max: MAX_DEEP_SECONDS }) ??
    DEFAULT_STRESS_SECONDS;
  const { deepDoctor } = await import("./doctor_deep.ts");
  return await deepDoctor({
    seconds,
    volume: parsed.values.volume === true,
    json: parsed.values.json === true,
    configPath: stringFlag(parsed, "config"),
  }, io);
}

// The checks a builder makes, or one failing row named after the group.
async function group(
  name: string,
  build: () => DoctorCheck[] | Promise<DoctorCheck[]>,
): Promise<DoctorCheck[]> {
  try {
    return await build();
  } catch (error) {
    return [{ name, run: () => Promise.reject(error) }];
  }
}

// A check's outcome, or a failure once its time is up (the check itself may
// run on; doctor does not wait for it).
async function bounded(check: DoctorCheck): Promise<CheckOutcome> {
  const ms = check.timeoutMs ?? CHECK_TIMEOUT_MS;
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      check.run(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`No answer within ${ms / 1000} s`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

// Client + runner ping through a fresh queue on the host filesystem.
async function queueRoundTrip(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-doctor-" });
  const backend = openHostBackend(join(dir, "queue"), { idleExitSeconds: 2 });
  try {
    const boot = performance.now();
    await backend.ensure();
    const bootMs = performance.now() - boot;
    const started = performance.now();
    const id = await backend.queue.submit({ argv: ["true"] });
    const result = await backend.queue.wait(id);
    const rtt = performance.now() - started;
    if (result.exitCode !== 0) throw new Error(`'true' returned ${JSON.stringify(result)}`);
    await backend.queue.ack(id);
    return `runner start ${bootMs.toFixed(0)} ms, round trip of 'true' ${rtt.toFixed(1)} ms`;
  } finally {
    backend.close();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

// Whether this host can bound each sandbox's disk; a warning (not a failure)
// when it cannot, since everything else still works.
function diskQuota(): Promise<CheckOutcome> {
  const support = quotaSupport();
  const quota = loadConfig().quotaBytes;
  if (!support.supported) {
    return Promise.resolve({
      detail: `not enforced: ${support.reason}; a sandbox can fill the host's disk`,
      warning: true,
    });
  }
  return Promise.resolve(
    `${quota} bytes per sandbox (loop-mounted ext4 volume, nosuid,nodev)`,
  );
}

// The link and file protections of the host kernel that `host sysctls` reports.
const PROTECTED_SYSCTLS = [
  "protected_symlinks",
  "protected_hardlinks",
  "protected_fifos",
  "protected_regular",
] as const;

// Reported, not required: the queue's safety must not depend on how the
// kernel was tuned, so whatever the values, the row is ok. A value that
// cannot be read (an old kernel, a restricted /proc) shows as '?'.
function hostSysctls(): Promise<string> {
  const values = PROTECTED_SYSCTLS.map((name) => {
    let value = "?";
    try {
      value = Deno.readTextFileSync(`/proc/sys/fs/${name}`).trim();
    } catch {
      // Left as '?'.
    }
    return `${name}=${value}`;
  });
  return Promise.resolve(`relies on none; ${values.join(" ")}`);
}
