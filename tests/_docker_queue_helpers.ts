/**
 * Helpers for `docker_queue_test.ts`: a sandbox in its own temporary
 * `WAFFLE_HOME` whose container is always force-removed afterwards (and only
 * that container), a raw lock holder on a queue file, and readers of the
 * container's pids cgroup.
 *
 * As a program (`deno run -A tests/_docker_queue_helpers.ts lock DB_FILE`):
 * takes `BEGIN EXCLUSIVE` on the file, prints `locked`, then answers JSON
 * lines `{"op":"query","sql":…,"params":[…]}` with `{"rows":[…]}` until
 * `{"op":"release"}` or the end of stdin, and rolls back.
 *
 * @module
 */
import { DatabaseSync } from "node:sqlite";
import { fileURLToPath } from "node:url";
import type { SandboxConfig } from "../lib/config/config.ts";
import type { DockerClient } from "../lib/docker/mod.ts";
import { BUSY_TIMEOUT_MS } from "../lib/queue/connection.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";
import { openSandbox, type Sandbox } from "../lib/lifecycle/sandbox.ts";
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
 * A process holding `BEGIN EXCLUSIVE` on a queue file: nobody else can read
 * or write the file until it is released.
 */
export interface ExclusiveLock {
  /** The holder's pid. */
  pid: number;
  /** Runs a read inside the exclusive transaction; returns its rows. */
  query(sql: string, ...params: (string | number)[]): Promise<Record<string, unknown>[]>;
  /** Rolls back (nothing was written), closes and waits for the holder to exit. Idempotent. */
  release(): Promise<void>;
}

/**
 * Takes an exclusive lock on a queue file through a raw `node:sqlite`
 * connection in a child process (this file run as a program), configured
 * like waffle's own: TRUNCATE journal (a DELETE-mode connection would unlink
 * a journal that the other side's connections expect to truncate) and the
 * busy timeout (the runner may hold the lock for a moment).
 *
 * A separate process, like the runner: POSIX record locks belong to a
 * process, and one close() of the database file by that process outside
 * SQLite drops them all. (`Deno.watchFs` opens and closes every file it
 * reports an event for: while the host queue watched `outbound.db` itself, an
 * in-process lock was seen lost in the middle of this test.)
 *
 * @param path The database file.
 * @returns The held lock.
 */
export async function lockExclusive(path: string): Promise<ExclusiveLock> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", "--no-prompt", fileURLToPath(import.meta.url), "lock", path],
    cwd: fileURLToPath(new URL("../", import.meta.url)),
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const writer = child.stdin.getWriter();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).pipeThrough(splitLines())
    .getReader();
  const next = async (): Promise<string> => {
    const { value, done } = await lines.read();
    if (done) throw new Error("the lock holder exited");
    return value;
  };
  const send = (message: unknown): Promise<void> =>
    writer.write(new TextEncoder().encode(`${JSON.stringify(message)}\n`));
  let released: Promise<void> | undefined;
  const release = (): Promise<void> =>
    released ??= (async () => {
      await send({ op: "release" }).catch(() => {});
      await writer.close().catch(() => {});
      while (!(await lines.read()).done) { /* drain */ }
      const status = await child.status;
      if (!status.success) throw new Error(`the lock holder exited with ${status.code}`);
    })();
  const first = await next().catch((error) => error as Error);
  if (first !== "locked") {
    await release().catch(() => {});
    throw new Error(`Cannot lock '${path}': ${first instanceof Error ? first.message : first}`);
  }
  return {
    pid: child.pid,
    async query(sql, ...params): Promise<Record<string, unknown>[]> {
      await send({ op: "query", sql, params });
      const reply = JSON.parse(await next()) as {
        rows?: Record<string, unknown>[];
        error?: string;
      };
      if (reply.error !== undefined) throw new Error(reply.error);
      return reply.rows ?? [];
    },
    release,
  };
}

function splitLines(): TransformStream<string, string> {
  let buffer = "";
  return new TransformStream({
    transform(chunk, controller): void {
      buffer += chunk;
      const parts = buffer.split("\n");
      buffer = parts.pop() ?? "";
      for (const line of parts) controller.enqueue(line);
    },
    flush(controller): void {
      if (buffer !== "") controller.enqueue(buffer);
    },
  });
}

// The lock holder: locks, answers queries, releases on request or stdin EOF.
async function lockMain(path: string): Promise<void> {
  const db = new DatabaseSync(path);
  const out = (line: string): void =>
    void Deno.stdout.writeSync(new TextEncoder().encode(`${line}\n`));
  try {
    db.exec(`PRAGMA busy_timeout = ${BUSY_TIMEOUT_MS}`);
    const mode = db.prepare("PRAGMA journal_mode = TRUNCATE").get() as Record<string, unknown>;
    if (String(Object.values(mode)[0]).toLowerCase() !== "truncate") {
      throw new Error(`journal_mode refused: ${JSON.stringify(mode)}`);
    }
    db.exec("PRAGMA synchronous = FULL");
    db.exec("BEGIN EXCLUSIVE");
  } catch (error) {
    out(`error: ${messageOf(error)}`);
    db.close();
    return;
  }
  out("locked");
  try {
    for await (
      const line of Deno.stdin.readable.pipeThrough(new TextDecoderStream()).pipeThrough(
        splitLines(),
      )
    ) {
      const message = JSON.parse(line) as {
        op: string;
        sql?: string;
        params?: (string | number)[];
      };
      if (message.op === "release") break;
      try {
        out(JSON.stringify({ rows: db.prepare(message.sql ?? "").all(...(message.params ?? [])) }));
      } catch (error) {
        out(JSON.stringify({ error: messageOf(error) }));
      }
    }
  } finally {
    if (db.isTransaction) db.exec("ROLLBACK");
    db.close();
  }
}

/** What the kernel says about a container's pids cgroup. */
export interface PidsCgroup {
  /** The cgroup directory on this host. */
  dir: string;
  /** `pids.max` ("max" or a number). */
  max: string;
  /** `pids.current`: tasks (threads included) now. */
  current: number;
  /** `pids.peak`, when the kernel has it. */
  peak: number | undefined;
  /** Forks refused because of the limit (`pids.events` "max N"), when available. */
  refused: number | undefined;
}

/**
 * Finds a container's pids cgroup on this host (cgroup v1 or v2, cgroupfs
 * or systemd driver). Undefined when the daemon is not local (Docker
 * Desktop, a remote host) or the hierarchy is not visible.
 *
 * @param containerId Full container id.
 * @returns The cgroup directory, or undefined.
 */
export function findPidsCgroup(containerId: string): string | undefined {
  const candidates = [
    `/sys/fs/cgroup/pids/docker/${containerId}`,
    `/sys/fs/cgroup/pids/system.slice/docker-${containerId}.scope`,
    `/sys/fs/cgroup/system.slice/docker-${containerId}.scope`,
    `/sys/fs/cgroup/docker/${containerId}`,
  ];
  return candidates.find((dir) => readOr(`${dir}/pids.current`) !== undefined);
}

/**
 * Reads a pids cgroup.
 *
 * @param dir The cgroup directory.
 * @returns Its counters; undefined once it is gone.
 */
export function readPidsCgroup(dir: string): PidsCgroup | undefined {
  const current = readOr(`${dir}/pids.current`);
  if (current === undefined) return undefined;
  const peak = readOr(`${dir}/pids.peak`);
  const events = readOr(`${dir}/pids.events`);
  const refused = events === undefined ? undefined : /^max (\d+)$/m.exec(events)?.[1];
  return {
    dir,
    max: readOr(`${dir}/pids.max`) ?? "?",
    current: Number(current),
    peak: peak === undefined ? undefined : Number(peak),
    refused: refused === undefined ? undefined : Number(refused),
  };
}

function readOr(path: string): string | undefined {
  try {
    return Deno.readTextFileSync(path).trim();
  } catch {
    return undefined;
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
 * Size of a file; 0 when missing.
 *
 * @param path The file.
 * @returns Bytes.
 */
export function sizeOf(path: string): number {
  try {
    return Deno.statSync(path).size;
  } catch {
    return 0;
  }
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

if (import.meta.main) {
  const [mode, path] = Deno.args;
  if (mode === "lock" && path !== undefined) await lockMain(path);
  else {
    Deno.stderr.writeSync(
      new TextEncoder().encode("usage: _docker_queue_helpers.ts lock DB_FILE\n"),
    );
    Deno.exit(2);
  }
}
