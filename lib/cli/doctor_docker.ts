/**
 * The Docker rows of `waffle doctor`: daemon, image, and a real sandbox
 * container with a bind-mount write/read round trip (the same mount class as
 * the queue files).
 *
 * @module
 */
import { join } from "../path.ts";
import { loadConfig } from "../config/config.ts";
import { daemonFacts, describeDaemon, DockerClient } from "../docker/mod.ts";
import { resolveImage } from "../lifecycle/ensure.ts";
import { removeSandbox } from "../sandbox/remove.ts";
import { artefactCommand, runtimeKitOf, selfCommand } from "../config/self.ts";
import { removeTree } from "../lifecycle/remove_tree.ts";
import { openSandbox } from "../sandbox/open.ts";
import { SANDBOX_DENO_ARGV, SANDBOX_DENO_ENV } from "../lifecycle/posture.ts";
import type { DoctorCheck } from "./doctor.ts";
import { describeImage } from "./doctor_image.ts";

/**
 * The Docker checks, in order; later ones reuse what earlier ones learned.
 *
 * @returns The checks.
 */
export function dockerChecks(): DoctorCheck[] {
  const docker = new DockerClient();
  const config = loadConfig();
  let provided: Promise<string> | undefined;
  return [
    {
      name: "docker daemon",
      run: async () => describeDaemon(await daemonFacts(docker)),
    },
    {
      name: "runner image",
      run: async () => {
        const image = await resolveImage(docker, config.image);
        // What commands get from it; the runner brings its own runtime (any libc).
        const path = image.env.find((entry) => entry.startsWith("PATH="))?.slice(5);
        const kit = runtimeKitOf(
          config.runner === undefined ? selfCommand() : artefactCommand(config.runner),
        );
        return [
          `${config.image} = ${image.id.slice(0, 19)}`,
          `PATH ${path ?? "(waffle's)"}`,
          `${image.env.length} ENV`,
          `workdir ${image.workingDir || "/workspace"}`,
          ...(image.volumes.length === 0 ? [] : [`VOLUMEs as tmpfs: ${image.volumes.join(" ")}`]),
          `runtime kit ${kit}`,
        ].join(", ");
      },
    },
    {
      name: "sandbox start + bind mount",
      run: async () => {
        // A throwaway home, so doctor never touches a real user's sandbox.
        const home = await Deno.makeTempDir({ prefix: "waffle-doctor-home-" });
        const sandbox = openSandbox("doctor", {
          config: { home, image: config.image, idleSeconds: 60 },
          docker,
        });
        try {
          const started = performance.now();
          await sandbox.ensure();
          const startMs = performance.now() - started;
          const token = crypto.randomUUID();
          await Deno.writeTextFile(join(sandbox.paths.workspace, "from-host"), token);
          const trip = performance.now();
          // waffle's own Deno, so any image passes (one without a shell too).
          const id = await sandbox.submit({
            argv: [
              ...SANDBOX_DENO_ARGV,
              "eval",
              "--quiet",
              "Deno.copyFileSync('/workspace/from-host', '/workspace/from-sandbox')",
            ],
            env: { ...SANDBOX_DENO_ENV },
          });
          const result = await sandbox.queue.wait(id);
          const tripMs = performance.now() - trip;
          const back = await Deno.readTextFile(join(sandbox.paths.workspace, "from-sandbox"));
          if (result.exitCode !== 0 || back !== token) {
            throw new Error(
              `Bind-mount round trip failed: exit ${result.exitCode}, read '${back.slice(0, 40)}'`,
            );
          }
          // Looked at while the sandbox is up; the next row reports it.
          provided = describeImage(sandbox);
          await provided.catch(() => {});
          return `container ready in ${startMs.toFixed(0)} ms, write/read round trip ${
            tripMs.toFixed(1)
          } ms`;
        } finally {
          sandbox.close();
          await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true }).catch(
            () => false,
          );
          // What is left is a sandbox's state: never a recursive delete in process.
          await removeTree(home).catch(() => false);
        }
      },
    },
    {
      name: "image provides",
      run: () => provided ?? Promise.reject(new Error("Not looked at: the sandbox did not start")),
    },
  ];
}
