/**
 * Docker Engine API access for waffle: a typed client over `docker-modem`
 * (no docker CLI), its error subclasses and the wire types it reads and sends.
 *
 * @module
 */
export {
  DEFAULT_DOCKER_SOCKET,
  describeDockerEndpoint,
  type DockerEndpoint,
  parseDockerHost,
} from "./endpoint.ts";
export {
  DEFAULT_DOCKER_TIMEOUT_MS,
  DockerClient,
  type DockerClientOptions,
  type ExecOptions,
  type KillOptions,
  type ListOptions,
  type RemoveOptions,
  type RequestOptions,
  type StopOptions,
  type TopOptions,
  type WaitOptions,
} from "./client.ts";
export { DockerConflictError, DockerNotFoundError } from "./errors.ts";
export { type DaemonFacts, daemonFacts, describeDaemon } from "./facts.ts";
// The base class, so callers can catch any Docker failure from this module alone.
export { DockerError } from "../errors.ts";
export { demuxDockerStream, type DemuxedOutput } from "./stream.ts";
export { quickGet, type QuickGetOptions, type QuickReply } from "./quick_get.ts";
export type {
  ContainerConfig,
  ContainerCreateBody,
  ContainerCreateHostConfig,
  ContainerHostConfig,
  ContainerInspect,
  ContainerMountPoint,
  ContainerState,
  ContainerStats,
  ContainerSummary,
  ContainerTop,
  DockerInfo,
  DockerVersion,
  DockerVolume,
  ExecResult,
  HostConfigMount,
  ImageSummary,
} from "./types.ts";
