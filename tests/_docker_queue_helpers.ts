/**
 * Helpers for `docker_queue_test.ts`: a sandbox in its own temporary
 * `WAFFLE_HOME` whose container is always force-removed afterwards (and only
 * that container), and small file readers. The lock holder and the pids
 * cgroup readers are the library's (`lib/certify/`), shared with
 * `waffle doctor --deep`.
 *
 * @module
 */
import type { SandboxConfig } from "../lib/config/config.ts";
import type { DockerClient } from "../lib/docker/mod.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";
import { openSandbox, type Sandbox } from "../lib/sandbox/open.ts";
import { removeHomeVolumes } from "./_sandbox_helpers.ts";

/**
 * Runs `fn` with a fresh sandbox of a unique user in a temporary
 * `WAFFLE_HOME`. Whatever happens, the sandbox's queue is closed, its
 * container is force-removed (after checking through its `waffle.state` label
 * that it belongs to this home: other people's containers are never touched)
 * and the home is deleted.
 *
 * @param docker The Docker client.
 * @param label Part of the user id, to recognise the container.
 * @param config Sandbox config overrides (the home is set here).
 * @param fn The test body.
 * @returns What `fn` returned.
 */
export async function withSandbox<T>(
  docker: DockerClient,
  label: string,
  config: Partial<Omit<SandboxConfig, "home">>,
  fn: (sandbox: Sandbox) => Promise<T>,
): Promise<T> {
  const home = await Deno.makeTempDir({ prefix: `waffle-dq-${label}-` });
  const user = `dq-${label}-${crypto.randomUUID().slice(0, 12)}`;
  let sandbox: Sandbox | undefined;
  let outcome: { ok: true; value: T } | { ok: false; error: unknown };
  try {
    sandbox = openSandbox(user, { tenant: "waffle-tests", config: { ...config, home }, docker });
    outcome = { ok: true, value: await fn(sandbox) };
  } catch (error) {
    outcome = { ok: false, error };
  }
  const problems: string[] = [];
  try {
    sandbox?.close();
  } catch (error) {
    problems.push(`closing the queue: ${messageOf(error)}`);
  }
  if (sandbox !== undefined) {
    try {
      await removeOwnContainer(docker, sandbox.key.containerName, sandbox.paths.root);
    } catch (error) {
      problems.push(`removing container ${sandbox.key.containerName}: ${messageOf(error)}`);
    }
  }
  await removeHomeVolumes(home).catch((error) =>
    problems.push(`removing volumes of ${home}: ${messageOf(error)}`)
  );
  await Deno.remove(home, { recursive: true }).catch((error) =>
    problems.push(`removing ${home}: ${messageOf(error)}`)
  );
  // Never hide the test's own failure behind a cleanup problem.
  if (!outcome.ok) throw outcome.error;
  if (problems.length > 0) throw new Error(`Cleanup failed: ${problems.join("; ")}`);
  return outcome.value;
}

/**
 * Force-removes a container when it carries this state root in its
 * `waffle.state` label, and checks that it is gone.
 *
 * @param docker The Docker client.
 * @param name Container name.
 * @param stateRoot The sandbox's state root.
 */
async function removeOwnContainer(
  docker: DockerClient,
  name: string,
  stateRoot: string,
): Promise<void> {
  const container = await docker.inspectContainer(name);
  if (container === null) return;
  const owner = container.Config.Labels[LABELS.state];
  if (owner !== stateRoot) {
    throw new Error(`container '${name}' belongs to '${owner}', not to this test: left alone`);
  }
  await docker.removeContainer(container.Id, { force: true });
  if (await docker.inspectContainer(container.Id) !== null) {
    throw new Error(`container '${name}' still exists after a forced removal`);
  }
}

/**
 * Lines of a text file (empty lines dropped); none when it does not exist.
 *
 * @param path The file.
 * @returns Its lines.
 */
export async function linesOf(path: string): Promise<string[]> {
  const content = await Deno.readTextFile(path).catch(() => "");
  return content.split("\n").filter((line) => line !== "");
}

/**
 * The message of anything thrown.
 *
 * @param error A thrown value.
 * @returns Its message.
 */
export function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
