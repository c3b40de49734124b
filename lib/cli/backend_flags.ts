/**
 * The flags that choose where a command runs, shared by `exec` and `wait`.
 *
 * @module
 */
import type { ParseArgsConfig } from "node:util";
import { UsageError } from "../errors.ts";
import { type Backend, openHostBackend } from "../host_backend.ts";
import { type Parsed, stringFlag } from "./args.ts";

/** Flag definitions for backend selection. */
export const BACKEND_OPTIONS: NonNullable<ParseArgsConfig["options"]> = {
  backend: { type: "string" },
  queue: { type: "string" },
  user: { type: "string" },
  tenant: { type: "string" },
  image: { type: "string" },
};

/** Opens a Docker backend; injected so the CLI core does not import Docker code. */
export type DockerOpener = (options: { tenant: string; user: string; image?: string }) => Promise<Backend>;

let dockerOpener: DockerOpener | undefined;

/**
 * Registers how the Docker backend is opened (done once by `main.ts`).
 *
 * @param opener The opener.
 */
export function setDockerOpener(opener: DockerOpener): void {
  dockerOpener = opener;
}

/**
 * Opens the backend the flags ask for. Docker is the default; the host
 * backend is used only when named, never as a fallback.
 *
 * @param parsed Parsed flags.
 * @returns The backend.
 * @throws {UsageError} On a bad combination of flags.
 */
export async function openBackend(parsed: Parsed): Promise<Backend> {
  const backend = stringFlag(parsed, "backend") ?? "docker";
  const queue = stringFlag(parsed, "queue");
  if (backend === "host") {
    if (queue === undefined) throw new UsageError("Missing --queue DIR: the host backend needs it");
    return openHostBackend(queue);
  }
  if (backend !== "docker") {
    throw new UsageError(`Unknown --backend '${backend}': expected 'docker' or 'host'`);
  }
  if (queue !== undefined) throw new UsageError("--queue is only for --backend host");
  const user = stringFlag(parsed, "user");
  if (user === undefined) throw new UsageError("Missing --user U: the Docker backend needs it");
  if (dockerOpener === undefined) throw new UsageError("The Docker backend is not available in this build");
  const image = stringFlag(parsed, "image");
  return await dockerOpener({
    tenant: stringFlag(parsed, "tenant") ?? "default",
    user,
    ...(image === undefined ? {} : { image }),
  });
}
