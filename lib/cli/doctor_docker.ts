/**
 * The Docker rows of `waffle doctor`: daemon, image, and a real sandbox
 * container with a bind-mount write/read round trip (the same mount class as
 * the queue files).
 *
 * @module
 */
import { join } from "../path.ts";
import { loadConfig } from "../config/config.ts";
import { DockerClient } from "../docker/mod.ts";
import { removeSandbox } from "../lifecycle/fleet.ts";
import { removeTree } from "../lifecycle/remove_tree.ts";
import { openSandbox } from "../lifecycle/sandbox.ts";
import type { DoctorCheck } from "./doctor.ts";

/**
 * The Docker checks, in order; later ones reuse what earlier ones learned.
 *
 * @returns The checks.
 */
export function dockerChecks(): DoctorCheck[] {
  const docker = new DockerClient();
  const config = loadConfig();
  return [
    {
      name: "docker daemon",
      run: async () => {
        const [version, info] = await Promise.all([docker.version(), docker.info()]);
        return `server ${version.Version} (API ${version.ApiVersion}), ${info.Architecture}, ${info.Driver}, cgroup ${info.CgroupDriver} v${
          info.CgroupVersion || "?"
        }`;
      },
    },
    {
      name: "runner image",
      run: async () => {
        const image = await docker.inspectImage(config.image);
        if (image === null) {
          throw new Error(
            `Image '${config.image}' not found; build it with 'bash scripts/build_image.sh'`,
          );
        }
        return `${config.image} = ${image.id.slice(0, 19)}`;
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
          const id = await sandbox.submit({
            shell: "cat /workspace/from-host > /workspace/from-sandbox",
          });
          const result = await sandbox.queue.wait(id);
          const tripMs = performance.now() - trip;
          const back = await Deno.readTextFile(join(sandbox.paths.workspace, "from-sandbox"));
          if (result.exitCode !== 0 || back !== token) {
            throw new Error(
              `Bind-mount round trip failed: exit ${result.exitCode}, read '${back.slice(0, 40)}'`,
            );
          }
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
  ];
}
