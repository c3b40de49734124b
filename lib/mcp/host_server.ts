/**
 * Starts an MCP server on the host, for a plan whose `where` is `host`
 * (authority and execution "host"). The process gets a cleared environment:
 * a fixed PATH, its own state directories (`HOME`, `XDG_*_HOME`, `TMPDIR`
 * under `<waffle home>/mcp-state/<server>`, made 0700 first), and only the
 * config's `env`; it runs in its own process group, which `close` ends as a
 * whole.
 *
 * @module
 */
import { settlesWithin } from "../async.ts";
import { isDirectory } from "../fs.ts";
import { UsageError, WaffleError } from "../errors.ts";
import type { ServerConnection } from "./connection.ts";
import { packageLaunch } from "./package_cache.ts";
import type { PlannedServer } from "./plan.ts";
import { prepareHostState } from "./server_state.ts";

/** The PATH every host server gets (an allowlisted `PATH` replaces it). */
export const HOST_SERVER_PATH = "/usr/local/bin:/usr/bin:/bin";
/** After its input is closed, how long a server may take to exit by itself. */
const EXIT_GRACE_MS = 2000;
/** After SIGTERM, how long before SIGKILL. */
const TERM_GRACE_MS = 1000;

/** Options of {@linkcode openHostServer}. */
export interface HostServerOptions {
  /** The resolved environment (the plan's `envSources`: literals and the host's values). */
  env: Record<string, string>;
  /** The npm package cache (`DENO_DIR` of a package server). */
  cacheDir: string;
  /**
   * The working directory (default: the plan's `cwd`). One inside the
   * server's state root is created if missing; any other must exist.
   */
  cwd?: string | undefined;
}

/** A host server's connection, with a way to end it at once (on a signal). */
export interface HostServerConnection extends ServerConnection {
  /** The process id (and process group id). */
  readonly pid: number;
  /** Kills the whole process group now (SIGKILL); resolves when the process exited. */
  kill(): Promise<void>;
}

/**
 * Spawns a planned host server.
 *
 * @example
 * ```ts ignore
 * const server = await openHostServer(planned, { env: resolveEnv(planned.envSources), cacheDir });
 * ```
 *
 * @param planned The launch decision; must be "launch" with `where` "host".
 * @param options Environment, cache and working directory.
 * @returns The connection.
 * @throws {UsageError} When the plan is not a host launch or has no program.
 * @throws {WaffleError} When the state directories cannot be made, the working directory is
 *   missing, or the program cannot be started.
 */
export function openHostServer(
  planned: PlannedServer,
  options: HostServerOptions,
): Promise<HostServerConnection> {
  // The one place a server process starts on the host: nothing but a host
  // plan gets here, whatever failed before.
  if (planned.decision !== "launch" || planned.where !== "host") {
    return Promise.reject(
      new UsageError(
        `Server '${planned.name}' is not planned for the host; it is never started there`,
      ),
    );
  }
  const { package: spec, command, args } = planned.program;
  let argv: string[];
  let extra: Record<string, string> = {};
  if (spec !== undefined) {
    const built = packageLaunch(spec, args, {
      deno: [Deno.execPath()],
      cacheDir: options.cacheDir,
    });
    argv = built.argv;
    extra = built.env;
  } else if (command !== undefined && command.startsWith("/")) {
    argv = [command, ...args];
  } else {
    return Promise.reject(new UsageError(`Server '${planned.name}' has no program to run`));
  }
  const cwd = options.cwd ?? planned.cwd;
  try {
    prepareHostState(planned.state);
    // The state root's own subdirectories are waffle's to make; a directory
    // elsewhere on the host is the operator's, and a typo must not create one.
    if (cwd === planned.state.root || cwd.startsWith(`${planned.state.root}/`)) {
      Deno.mkdirSync(cwd, { recursive: true, mode: 0o700 });
    } else if (!isDirectory(cwd)) {
      throw new WaffleError(
        `Working directory '${cwd}' of server '${planned.name}' does not exist (mcp.${planned.name}.cwd)`,
      );
    }
  } catch (cause) {
    return Promise.reject(
      cause instanceof WaffleError
        ? cause
        : new WaffleError(`Cannot create working directory '${cwd}': ${String(cause)}`, { cause }),
    );
  }
  // The state variables, then the config's env over them, then what a
  // package launch needs (DENO_DIR).
  const env: Record<string, string> = {
    PATH: HOST_SERVER_PATH,
    ...planned.state.env,
    ...options.env,
    ...extra,
  };
  let child: Deno.ChildProcess;
  try {
    child = new Deno.Command(argv[0]!, {
      args: argv.slice(1),
      cwd,
      env,
      clearEnv: true,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
      // setsid(): its own process group (pgid = pid), killed as a whole.
      detached: true,
    }).spawn();
  } catch (cause) {
    const why = cause instanceof Deno.errors.NotFound ? "not found" : String(cause);
    return Promise.reject(
      new WaffleError(`Cannot start server '${planned.name}' ('${argv[0]}'): ${why}`, { cause }),
    );
  }
  return Promise.resolve(processConnection(child));
}

function processConnection(child: Deno.ChildProcess): HostServerConnection {
  const pid = child.pid;
  const input = child.stdin.getWriter();
  const status = child.status.then((s) => {
    // Whatever the server left behind in its group goes with it.
    signalGroup(pid, "SIGKILL");
    return s;
  });
  const closed = status.then((s) =>
    s.signal === null ? `exited with status ${s.code}` : `killed by ${s.signal}`
  );
  const stdin = new WritableStream<Uint8Array>({
    write: (chunk) => input.write(chunk),
    close: () => input.close(),
    abort: () => input.abort(),
  });
  const kill = async (): Promise<void> => {
    signalGroup(pid, "SIGKILL");
    await status;
  };
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= (async () => {
      // Not awaited: a pending write to a server that does not read would hold it.
      input.close().catch(() => {});
      if (!await settlesWithin(status, EXIT_GRACE_MS)) {
        signalGroup(pid, "SIGTERM");
        if (!await settlesWithin(status, TERM_GRACE_MS)) signalGroup(pid, "SIGKILL");
      }
      await status;
    })();
    return closing;
  };
  return {
    pid,
    stdin,
    stdout: child.stdout,
    stderr: child.stderr,
    close,
    closed,
    kill,
  };
}

function signalGroup(pid: number, signal: Deno.Signal): void {
  try {
    Deno.kill(-pid, signal);
  } catch {
    // ESRCH: the group is gone.
  }
}
