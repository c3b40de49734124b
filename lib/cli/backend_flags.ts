/**
 * The flags that choose where a command runs, shared by `exec` and `wait`.
 *
 * @module
 */
import { absoluteConfigPath } from "../config/config.ts";
import type { ParseArgsConfig } from "node:util";
import { UsageError } from "../errors.ts";
import { openHostBackend } from "../host_backend.ts";
import type { Backend } from "../queue/backend.ts";
import { openSandbox } from "../sandbox/open.ts";
import { type Parsed, stringFlag } from "./args.ts";

/** Flag definitions for backend selection. */
export const BACKEND_OPTIONS: NonNullable<ParseArgsConfig["options"]> = {
  backend: { type: "string" },
  queue: { type: "string" },
  user: { type: "string" },
  tenant: { type: "string" },
  image: { type: "string" },
  config: { type: "string" },
};

/**
 * Opens the backend the flags ask for. Docker is the default; the host
 * backend is used only when named, never as a fallback.
 *
 * @param parsed Parsed flags.
 * @returns The backend.
 * @throws {UsageError} On a bad combination of flags.
 */
export function openBackend(parsed: Parsed): Backend {
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
  const image = stringFlag(parsed, "image");
  const configPath = stringFlag(parsed, "config");
  return openSandbox(user, {
    tenant: stringFlag(parsed, "tenant") ?? "default",
    // The config file travels as a setting, so every later load reads the same file.
    config: {
      ...(image === undefined ? {} : { image }),
      ...(configPath === undefined ? {} : { configPath: absoluteConfigPath(configPath) }),
    },
  });
}
