/**
 * Where the Docker daemon listens: `DOCKER_HOST` parsed, with no client
 * loaded (the hot path asks the daemon one question without docker-modem).
 *
 * @module
 */
import { DockerError } from "../errors.ts";

/** Socket used when neither the `host` option nor `DOCKER_HOST` names one. */
export const DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock";

/** Where the daemon listens, parsed from `DOCKER_HOST` or the `host` option. */
export type DockerEndpoint =
  | { kind: "unix"; socketPath: string }
  | { kind: "tcp"; host: string; port: number; protocol: "http" | "https" };

/**
 * Parses a Docker host string (`unix://`, bare path, `tcp://`, `http(s)://`).
 *
 * @param value The host string; empty or undefined means the default socket.
 * @returns The endpoint.
 * @throws {DockerError} For schemes waffle does not support (`ssh://`, `npipe://`).
 */
export function parseDockerHost(value: string | undefined): DockerEndpoint {
  if (value === undefined || value === "") {
    return { kind: "unix", socketPath: DEFAULT_DOCKER_SOCKET };
  }
  if (value.startsWith("/")) return { kind: "unix", socketPath: value };
  if (value.startsWith("unix://")) {
    return { kind: "unix", socketPath: value.slice("unix://".length) || DEFAULT_DOCKER_SOCKET };
  }
  const match = /^(tcp|http|https):\/\/([^/:]+|\[[^\]]+\])(?::(\d+))?\/?$/.exec(value);
  if (match === null) throw new DockerError(`Unsupported Docker host '${value}'`);
  const scheme = match[1] as "tcp" | "http" | "https";
  const port = match[3] === undefined ? (scheme === "https" ? 2376 : 2375) : Number(match[3]);
  const protocol = scheme === "https" || (scheme === "tcp" && port === 2376) ? "https" : "http";
  return { kind: "tcp", host: match[2] ?? "", port, protocol };
}

/**
 * The endpoint as shown in error messages: the socket path or `tcp://host:port`.
 *
 * @param endpoint The endpoint.
 * @returns Its description.
 */
export function describeDockerEndpoint(endpoint: DockerEndpoint): string {
  return endpoint.kind === "unix"
    ? endpoint.socketPath
    : `${endpoint.protocol === "https" ? "https" : "tcp"}://${endpoint.host}:${endpoint.port}`;
}

/**
 * `DOCKER_HOST`, or undefined when unset or not readable (no env permission).
 *
 * @returns The variable's value.
 */
export function dockerHostEnv(): string | undefined {
  try {
    return Deno.env.get("DOCKER_HOST");
  } catch {
    return undefined;
  }
}
