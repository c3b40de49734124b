/**
 * The kubelet half of the Kubernetes stand-in (a MOCK of Kubernetes: no
 * cluster can run here; see tests/_k8s_standin.ts): runs a pod spec with
 * Docker, its containers joined as a pod joins them.
 *
 * A pod is a holder container (the pause container's part: it sleeps, with
 * `IpcMode: shareable`, hostname = the pod's name, on the stand-in's bridge
 * network), its init containers run to completion in order, then its
 * containers with `NetworkMode` and `IpcMode` `container:<holder>` (and
 * `PidMode` too with shareProcessNamespace): one network namespace (they
 * reach each other on 127.0.0.1), one IPC namespace, one kernel (POSIX locks
 * on a shared emptyDir hold across them).
 *
 * Mapped from the pod spec: command/args (entrypoint/cmd, as Kubernetes
 * overrides an image's), env (value, valueFrom.secretKeyRef), workingDir,
 * securityContext (pod's, then container's: runAsUser/runAsGroup,
 * capabilities add/drop, readOnlyRootFilesystem, allowPrivilegeEscalation
 * false → no-new-privileges, privileged, seccompProfile Unconfined),
 * resources.limits memory and cpu, restartPolicy (Docker's own restart
 * policy, with its backoff), terminationGracePeriodSeconds (stop timeout),
 * readinessProbe (tcpSocket and httpGet from the host against the pod IP,
 * exec in the container). Volumes: emptyDir (a host directory, 0777, as the
 * kubelet makes it; medium Memory: a tmpfs Docker volume with the sizeLimit,
 * shared by the pod's containers; no subPath into it), persistentVolumeClaim
 * (a host directory per claim, `pvcs/<ns>/<claim>`, that outlives the pod;
 * its size is NOT enforced), secret (files written with defaultMode or an
 * item's mode, mounted read-only), hostPath (an existing path, bound as
 * it is). volumeMounts' subPath binds the host
 * subdirectory (Docker API 1.41 has no volume subpath).
 *
 * Not modelled: the pod's pids limit is per container (`PidsLimit` =
 * {@linkcode POD_PIDS_LIMIT}, the kubelet's podPidsLimit, on each container
 * rather than on a pod cgroup), requests (no scheduling), fsGroup,
 * `$(VAR)` expansion, configMap and projected volumes, liveness and startup
 * probes, image pull policies (images must be present), hostNetwork/hostPID/
 * hostIPC (refused), and the service-account token (never mounted).
 *
 * @module
 */
import type { ContainerCreateBody, DockerClient, HostConfigMount } from "../lib/docker/mod.ts";
import type { KubeObject } from "./_k8s_api.ts";

/** The kubelet's podPidsLimit here: each of a pod's containers gets this many pids. */
export const POD_PIDS_LIMIT = 4096;

/** What a pod needs from its surroundings. */
export interface KubeletOptions {
  docker: DockerClient;
  /** Host directory holding pods' volumes and the claims. */
  root: string;
  /** The bridge network pods join. */
  network: string;
  /** The Docker label key and value naming this stand-in on every object. */
  label: [string, string];
  /** Prefix of every Docker object's name. */
  prefix: string;
  /** The image of the holder containers (must have `sleep`). */
  holderImage: string;
  /** A Secret's object, or undefined. */
  secret(namespace: string, name: string): KubeObject | undefined;
}

/** A pod to run. */
export interface PodDesc {
  namespace: string;
  name: string;
  uid: string;
  spec: KubeObject;
}

/** A started pod's Docker objects. */
export interface RunningPod {
  desc: PodDesc;
  holder: string;
  ip: string;
  /** Container name → Docker id. */
  containers: Map<string, string>;
  volumes: string[];
}

/** Host directory of a claim. */
export function claimDir(root: string, namespace: string, claim: string): string {
  return `${root}/pvcs/${namespace}/${claim}`;
}

/** Bytes of a quantity (`256Mi`, `1G`, `1e3`, `500m`). */
export function quantity(value: unknown): number {
  const text = String(value);
  const match = /^([0-9.]+(?:e[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|m)?$/.exec(text);
  if (match === null) throw new Error(`Quantity '${text}' is not valid`);
  const units: Record<string, number> = {
    Ki: 2 ** 10,
    Mi: 2 ** 20,
    Gi: 2 ** 30,
    Ti: 2 ** 40,
    Pi: 2 ** 50,
    k: 1e3,
    M: 1e6,
    G: 1e9,
    T: 1e12,
    P: 1e15,
    m: 1e-3,
  };
  return Number(match[1]) * (units[match[2] ?? ""] ?? 1);
}

/** Runs pod specs with Docker. */
export class Kubelet {
  readonly #o: KubeletOptions;

  /** @param options Where pods run. */
  constructor(options: KubeletOptions) {
    this.#o = options;
  }

  #name(pod: PodDesc, container: string): string {
    return `${this.#o.prefix}-${pod.namespace}-${pod.name}-${pod.uid.slice(0, 8)}-${container}`
      .slice(0, 200);
  }

  #labels(pod: PodDesc, container: string): Record<string, string> {
    const [key, value] = this.#o.label;
    return {
      [key]: value,
      "io.kubernetes.pod.namespace": pod.namespace,
      "io.kubernetes.pod.name": pod.name,
      "io.kubernetes.pod.uid": pod.uid,
      "io.kubernetes.container.name": container,
    };
  }

  /**
   * Starts a pod: volumes, holder, init containers to completion (each
   * retried a few times, as restartPolicy Always retries them), containers.
   * On failure, whatever was made is removed.
   *
   * @returns The running pod.
   */
  async start(desc: PodDesc): Promise<RunningPod> {
    const spec = desc.spec;
    if (spec.hostNetwork || spec.hostPID || spec.hostIPC) {
      throw new Error(`Pod '${desc.name}': hostNetwork, hostPID and hostIPC are not modelled`);
    }
    const pod: RunningPod = { desc, holder: "", ip: "", containers: new Map(), volumes: [] };
    try {
      const volumes = await this.#volumes(pod);
      pod.holder = await this.#docker().createContainer(this.#name(desc, "pause"), {
        Image: this.#o.holderImage,
        Entrypoint: ["sleep", "infinity"],
        Cmd: [],
        User: "65534:65534",
        Hostname: desc.name.slice(0, 63),
        Labels: this.#labels(desc, "POD"),
        HostConfig: {
          NetworkMode: this.#o.network,
          IpcMode: "shareable",
          ReadonlyRootfs: true,
          CapDrop: ["ALL"],
          SecurityOpt: ["no-new-privileges"],
          Memory: 16 * 2 ** 20,
          PidsLimit: 8,
          // A Memory emptyDir is one tmpfs for the pod's life: Docker
          // unmounts a tmpfs volume no running container holds (an init
          // container's writes would be lost), so the holder holds each.
          Mounts: [...volumes.entries()].flatMap(([name, volume]) =>
            volume.dockerVolume === undefined ? [] : [{
              Type: "volume" as const,
              Source: volume.dockerVolume,
              Target: `/standin-volumes/${name}`,
              ReadOnly: true,
            }]
          ),
        },
      });
      await this.#docker().startContainer(pod.holder);
      const network = await this.#docker().inspectNetwork(this.#o.network);
      pod.ip = network?.containers[pod.holder] ?? "";
      if (pod.ip === "") throw new Error(`Pod '${desc.name}' got no IP on '${this.#o.network}'`);
      for (const container of spec.initContainers ?? []) {
        await this.#runInit(pod, container, volumes);
      }
      for (const container of spec.containers) {
        const id = await this.#docker().createContainer(
          this.#name(desc, container.name),
          this.#body(pod, container, volumes, { init: false }),
        );
        pod.containers.set(container.name, id);
        await this.#docker().startContainer(id);
      }
      return pod;
    } catch (err) {
      await this.stop(pod);
      throw err;
    }
  }

  #docker(): DockerClient {
    return this.#o.docker;
  }

  // Runs an init container to completion; a failure is retried with a backoff, a few times.
  async #runInit(
    pod: RunningPod,
    container: KubeObject,
    volumes: Map<string, Volume>,
  ): Promise<void> {
    let backoff = 200;
    for (let attempt = 1;; attempt++) {
      const id = await this.#docker().createContainer(
        this.#name(pod.desc, `${container.name}-init${attempt}`),
        this.#body(pod, container, volumes, { init: true }),
      );
      pod.containers.set(`init:${container.name}:${attempt}`, id);
      await this.#docker().startContainer(id);
      const code = await this.#docker().waitContainer(id, { timeoutMs: 300_000 });
      await this.#docker().removeContainer(id, { force: true });
      pod.containers.delete(`init:${container.name}:${attempt}`);
      if (code === 0) return;
      if (attempt >= 4) {
        throw new Error(
          `Init container '${container.name}' of pod '${pod.desc.name}' exited ${code}`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, backoff));
      backoff *= 2;
    }
  }

  // The create body of one container of the pod.
  #body(
    pod: RunningPod,
    container: KubeObject,
    volumes: Map<string, Volume>,
    options: { init: boolean },
  ): ContainerCreateBody {
    const spec = pod.desc.spec;
    const security = { ...(spec.securityContext ?? {}), ...(container.securityContext ?? {}) };
    const uid = security.runAsUser;
    const gid = security.runAsGroup;
    const limits = container.resources?.limits ?? {};
    const restart = spec.restartPolicy ?? "Always";
    return {
      Image: container.image,
      ...(container.command === undefined ? {} : { Entrypoint: container.command, Cmd: [] }),
      ...(container.args === undefined ? {} : { Cmd: container.args }),
      Env: this.#env(pod.desc, container),
      ...(container.workingDir === undefined ? {} : { WorkingDir: container.workingDir }),
      ...(uid === undefined ? {} : { User: gid === undefined ? String(uid) : `${uid}:${gid}` }),
      Labels: this.#labels(pod.desc, container.name),
      StopTimeout: spec.terminationGracePeriodSeconds ?? 30,
      HostConfig: {
        NetworkMode: `container:${pod.holder}`,
        IpcMode: `container:${pod.holder}`,
        ...(spec.shareProcessNamespace ? { PidMode: `container:${pod.holder}` } : {}),
        CapDrop: security.capabilities?.drop ?? [],
        CapAdd: security.capabilities?.add ?? [],
        ReadonlyRootfs: security.readOnlyRootFilesystem === true,
        Privileged: security.privileged === true,
        SecurityOpt: [
          ...(security.allowPrivilegeEscalation === false ? ["no-new-privileges"] : []),
          ...(security.seccompProfile?.type === "Unconfined" ? ["seccomp=unconfined"] : []),
        ],
        PidsLimit: POD_PIDS_LIMIT,
        ...(limits.memory === undefined
          ? {}
          : { Memory: quantity(limits.memory), MemorySwap: quantity(limits.memory) }),
        ...(limits.cpu === undefined ? {} : { NanoCpus: Math.round(quantity(limits.cpu) * 1e9) }),
        RestartPolicy: options.init || restart === "Never"
          ? { Name: "no" }
          : { Name: restart === "OnFailure" ? "on-failure" : "always" },
        Mounts: this.#mounts(container, volumes),
      },
    };
  }

  #env(pod: PodDesc, container: KubeObject): string[] {
    return (container.env ?? []).flatMap((entry: KubeObject): string[] => {
      if (entry.valueFrom === undefined) return [`${entry.name}=${entry.value ?? ""}`];
      const ref = entry.valueFrom.secretKeyRef;
      if (ref === undefined) throw new Error(`Env '${entry.name}': only secretKeyRef is modelled`);
      const data = this.#o.secret(pod.namespace, ref.name)?.data?.[ref.key];
      if (data === undefined) {
        if (ref.optional) return [];
        throw new Error(`Env '${entry.name}': secret '${ref.name}' key '${ref.key}' not found`);
      }
      return [`${entry.name}=${new TextDecoder().decode(base64(data))}`];
    });
  }

  #mounts(container: KubeObject, volumes: Map<string, Volume>): HostConfigMount[] {
    return (container.volumeMounts ?? []).map((mount: KubeObject): HostConfigMount => {
      const volume = volumes.get(mount.name);
      if (volume === undefined) throw new Error(`Volume mount '${mount.name}' names no volume`);
      const readOnly = mount.readOnly === true || volume.readOnly;
      const sub = String(mount.subPath ?? "");
      if (sub.split("/").includes("..") || sub.startsWith("/")) {
        throw new Error(`subPath '${sub}' must be a relative path without '..'`);
      }
      if (volume.dockerVolume !== undefined) {
        if (sub !== "") {
          throw new Error(`subPath into the Memory emptyDir '${mount.name}' is not modelled`);
        }
        // NoCopy: Kubernetes never fills a volume with what the image has at its path.
        return {
          Type: "volume",
          Source: volume.dockerVolume,
          Target: mount.mountPath,
          ReadOnly: readOnly,
          VolumeOptions: { NoCopy: true },
        };
      }
      const source = sub === "" ? volume.dir! : `${volume.dir}/${sub}`;
      // As the kubelet does: a missing subPath is made a directory (0777 here, as an emptyDir).
      try {
        Deno.statSync(source);
      } catch {
        Deno.mkdirSync(source, { recursive: true });
        Deno.chmodSync(source, 0o777);
      }
      return { Type: "bind", Source: source, Target: mount.mountPath, ReadOnly: readOnly };
    });
  }

  // The pod's volumes made on the host (or as tmpfs Docker volumes).
  async #volumes(pod: RunningPod): Promise<Map<string, Volume>> {
    const desc = pod.desc;
    const base = `${this.#o.root}/pods/${desc.uid}/volumes`;
    const volumes = new Map<string, Volume>();
    for (const volume of desc.spec.volumes ?? []) {
      const dir = `${base}/${volume.name}`;
      if (volume.emptyDir !== undefined && volume.emptyDir.medium === "Memory") {
        const name = `${this.#name(desc, `vol-${volume.name}`)}`;
        const size = volume.emptyDir.sizeLimit === undefined
          ? ""
          : `,size=${Math.floor(quantity(volume.emptyDir.sizeLimit))}`;
        await this.#docker().createVolume(name, {
          labels: this.#labels(desc, volume.name),
          // 0777, as the kubelet makes an emptyDir of either medium.
          driverOpts: { type: "tmpfs", device: "tmpfs", o: `mode=0777${size}` },
        });
        pod.volumes.push(name);
        volumes.set(volume.name, { dockerVolume: name, readOnly: false });
      } else if (volume.emptyDir !== undefined) {
        await Deno.mkdir(dir, { recursive: true });
        await Deno.chmod(dir, 0o777);
        volumes.set(volume.name, { dir, readOnly: false });
      } else if (volume.persistentVolumeClaim !== undefined) {
        const claim = claimDir(
          this.#o.root,
          desc.namespace,
          volume.persistentVolumeClaim.claimName,
        );
        await Deno.stat(claim).catch(() => {
          throw new Error(`PVC '${volume.persistentVolumeClaim.claimName}' is not bound`);
        });
        volumes.set(volume.name, {
          dir: claim,
          readOnly: volume.persistentVolumeClaim.readOnly === true,
        });
      } else if (volume.hostPath !== undefined) {
        // Tests mount files of this machine (a checkout) with it.
        await Deno.stat(volume.hostPath.path).catch(() => {
          throw new Error(`hostPath '${volume.hostPath.path}' does not exist`);
        });
        volumes.set(volume.name, { dir: volume.hostPath.path, readOnly: false });
      } else if (volume.secret !== undefined) {
        await this.#secretVolume(desc, volume.secret, dir);
        volumes.set(volume.name, { dir, readOnly: true });
      } else {
        throw new Error(
          `Volume '${volume.name}': only emptyDir, persistentVolumeClaim, secret and hostPath are modelled`,
        );
      }
    }
    return volumes;
  }

  async #secretVolume(desc: PodDesc, source: KubeObject, dir: string): Promise<void> {
    const secret = this.#o.secret(desc.namespace, source.secretName);
    if (secret === undefined) {
      if (source.optional) return void await Deno.mkdir(dir, { recursive: true });
      throw new Error(`Secret '${source.secretName}' not found`);
    }
    await Deno.mkdir(dir, { recursive: true, mode: 0o755 });
    const data: Record<string, string> = secret.data ?? {};
    const items: { key: string; path: string; mode?: number }[] = source.items ??
      Object.keys(data).map((key) => ({ key, path: key }));
    for (const item of items) {
      const value = data[item.key];
      if (value === undefined) {
        throw new Error(`Secret '${source.secretName}' has no key '${item.key}'`);
      }
      const file = `${dir}/${item.path}`;
      const mode = item.mode ?? source.defaultMode ?? 0o644;
      await Deno.writeFile(file, base64(value), { mode });
      await Deno.chmod(file, mode);
    }
  }

  /**
   * Whether every container runs and every readiness probe passes, and each
   * container's status as a Pod's `status.containerStatuses` has it.
   *
   * @returns Ready, why not, and the containers' statuses.
   */
  async observe(
    pod: RunningPod,
  ): Promise<{ ready: boolean; message: string; statuses: KubeObject[] }> {
    const statuses: KubeObject[] = [];
    let message = "";
    for (const container of pod.desc.spec.containers) {
      const id = pod.containers.get(container.name);
      const info = id === undefined ? null : await this.#docker().inspectContainer(id);
      const running = info !== null && info.State.Running && !info.State.Restarting;
      const probe = container.readinessProbe;
      const ready = running &&
        (probe === undefined || await this.#probe(pod, container, id!, probe));
      statuses.push({
        name: container.name,
        image: container.image,
        containerID: id === undefined ? "" : `docker://${id}`,
        ready,
        started: running,
        restartCount: info?.RestartCount ?? 0,
        state: running
          ? { running: { startedAt: info!.State.StartedAt.replace(/\.\d+Z$/, "Z") } }
          : { waiting: { reason: info === null ? "ContainerCreating" : "CrashLoopBackOff" } },
        ...(info !== null && info.State.ExitCode !== 0
          ? { lastState: { terminated: { exitCode: info.State.ExitCode } } }
          : {}),
      });
      if (message === "" && !ready) {
        message = `container ${container.name} is ${running ? "not ready" : "not running"}`;
      }
    }
    return { ready: message === "", message, statuses };
  }

  async #probe(
    pod: RunningPod,
    container: KubeObject,
    id: string,
    probe: KubeObject,
  ): Promise<boolean> {
    const port = (value: unknown): number =>
      typeof value === "number"
        ? value
        : Number((container.ports ?? []).find((p: KubeObject) => p.name === value)?.containerPort);
    const timeoutMs = (probe.timeoutSeconds ?? 1) * 1000;
    try {
      if (probe.tcpSocket !== undefined) {
        const conn = await withTimeout(
          Deno.connect({ hostname: pod.ip, port: port(probe.tcpSocket.port) }),
          timeoutMs,
        );
        conn.close();
        return true;
      }
      if (probe.httpGet !== undefined) {
        const url = `http://${pod.ip}:${port(probe.httpGet.port)}${probe.httpGet.path ?? "/"}`;
        const response = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
        await response.body?.cancel();
        return response.status >= 200 && response.status < 400;
      }
      if (probe.exec !== undefined) {
        const result = await this.#docker().exec(id, probe.exec.command, { timeoutMs });
        return result.exitCode === 0;
      }
    } catch {
      return false;
    }
    return true;
  }

  /** Removes a pod's containers (its own first, the holder last), tmpfs volumes and host volumes. */
  async stop(pod: RunningPod): Promise<void> {
    const grace = pod.desc.spec.terminationGracePeriodSeconds ?? 30;
    await Promise.all(
      [...pod.containers.values()].map(async (id) => {
        await this.#docker().stopContainer(id, {
          timeoutSeconds: grace,
          timeoutMs: (grace + 30) * 1000,
        })
          .catch(() => {});
        await this.#docker().removeContainer(id, { force: true }).catch(() => {});
      }),
    );
    if (pod.holder !== "") {
      await this.#docker().removeContainer(pod.holder, { force: true }).catch(() => {});
    }
    for (const volume of pod.volumes) await this.#docker().removeVolume(volume).catch(() => {});
    await Deno.remove(`${this.#o.root}/pods/${pod.desc.uid}`, { recursive: true }).catch(() => {});
  }
}

interface Volume {
  /** Host directory (emptyDir, claim, secret). */
  dir?: string;
  /** A tmpfs Docker volume (Memory emptyDir). */
  dockerVolume?: string;
  readOnly: boolean;
}

function base64(value: string): Uint8Array {
  return Uint8Array.from(atob(value), (c) => c.charCodeAt(0));
}

async function withTimeout<T extends Deno.Conn>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let late = false;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      late = true;
      reject(new Error("probe timed out"));
    }, ms);
  });
  // A connection that arrives after the timeout is closed.
  promise.then((conn) => late && conn.close(), () => {});
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
