/**
 * Starts an MCP server inside a sandbox (the user's persistent container or
 * a restricted one) as a session over the queue. Nothing here ever starts a
 * process on the host: every failure is an error, never a fallback.
 *
 * @module
 */
import { settlesWithin } from "../async.ts";
import type { SandboxConfig } from "../config/config.ts";
import { UsageError } from "../errors.ts";
import type { EgressAttachment } from "../config/egress_types.ts";
import { SANDBOX_DENO_ARGV, SANDBOX_MCP_CACHE } from "../lifecycle/posture.ts";
import { openSandbox } from "../sandbox/open.ts";
import type { ExecResult } from "../queue/protocol.ts";
import { QueueSession } from "../queue/session.ts";
import { BorrowedStream } from "./borrowed_stream.ts";
import type { ServerConnection } from "./connection.ts";
import { packageLaunch } from "./package_cache.ts";
import type { PlannedServer } from "./plan.ts";
import { statePreload, withStateDirectories } from "./server_state.ts";

/** Who the session is for and what it may see. */
export interface SandboxServerOptions {
  /** The user whose sandbox it runs in. */
  user: string;
  /** The user's tenant. */
  tenant: string;
  /** The resolved environment (the plan's `envSources`: literals and the host's values). */
  env: Record<string, string>;
  /** The sandbox settings. */
  config: SandboxConfig;
  /** Progress lines for the user (on stderr). */
  onProgress?: ((line: string) => void) | undefined;
  /**
   * A restricted server's own egress identity (`restrictedAttachment` of
   * the session's server, group or cron job); undefined: it reaches nothing.
   * A sandbox server's is its sandbox's, never this.
   */
  egress?: EgressAttachment | undefined;
}

/** After the end of its input, how long a server's session may take to end by itself. */
const END_WAIT_MS = 2500;
/** Unread server stderr held for the reader before more is dropped. */
const STDERR_BUFFER_BYTES = 256 * 1024;
/** After a cancel, how long the runner may take to report the tree dead. */
const CANCEL_WAIT_MS = 1000;
/** How long one of the closing writes (end of input, cancel, ack) may take. */
const WRITE_WAIT_MS = 500;

/**
 * Starts a planned server whose `where` is `sandbox` or `restricted`.
 *
 * @param planned The launch decision.
 * @param options User, environment, settings and (restricted) the session's egress identity.
 * @returns The connection.
 * @throws {UsageError} When the plan is not for a sandbox, or the server cannot run in one.
 */
export async function openSandboxServer(
  planned: PlannedServer,
  options: SandboxServerOptions,
): Promise<ServerConnection> {
  if (
    planned.decision !== "launch" || (planned.where !== "sandbox" && planned.where !== "restricted")
  ) {
    throw new UsageError(`Server '${planned.name}' is not planned for a sandbox`);
  }
  const launch = sandboxLaunch(planned);
  // The state directories' variables, then the config's env over them, then
  // what the launch itself needs (DENO_DIR).
  const env: Record<string, string> = { ...planned.state.env, ...options.env, ...launch.env };
  const cwd = relativeCwd(planned.cwd);
  const request = { argv: launch.argv, env, ...(cwd === undefined ? {} : { cwd }) };
  if (planned.where === "restricted") {
    options.onProgress?.(`starting a restricted container for '${planned.name}'`);
    // Docker's client loads only for a restricted container: a warm sandbox
    // session needs none of it (it is most of a cold CLI start).
    const { openRestricted } = await import("../sandbox/restricted.ts");
    const restricted = await openRestricted(options.user, {
      tenant: options.tenant,
      config: options.config,
      egress: options.egress,
    });
    try {
      const session = await QueueSession.open(restricted, request);
      return sessionConnection(session, () => restricted.dispose());
    } catch (error) {
      await restricted.dispose();
      throw error;
    }
  }
  const sandbox = openSandbox(options.user, { tenant: options.tenant, config: options.config });
  try {
    const session = await QueueSession.open(
      sandbox,
      { ...request, makeCwd: true },
      { revive: (trouble) => sandbox.ensure(trouble) },
    );
    return sessionConnection(session, () => Promise.resolve(sandbox.close()));
  } catch (error) {
    sandbox.close();
    throw error;
  }
}

// The server's argv, which makes its state directories first (inside the
// container, as its uid), and the variables the launch needs.
function sandboxLaunch(planned: PlannedServer): { argv: string[]; env: Record<string, string> } {
  const { package: spec, command, args } = planned.program;
  if (spec !== undefined) {
    // A compiled binary mounts no Deno into the sandbox.
    if (Deno.build.standalone) {
      throw new UsageError(
        `Server '${planned.name}' is an npm package, which needs waffle's Deno in the sandbox; this waffle binary has none`,
      );
    }
    return packageLaunch(spec, args, {
      deno: SANDBOX_DENO_ARGV,
      cacheDir: SANDBOX_MCP_CACHE,
      preload: statePreload(planned.state),
    });
  }
  if (command === undefined) throw new UsageError(`Server '${planned.name}' has no program`);
  return { argv: withStateDirectories([command, ...args], planned.state), env: {} };
}

// The plan speaks container paths ("/workspace/jobs/x"); a request names its
// cwd relative to the workspace.
function relativeCwd(cwd: string): string | undefined {
  if (cwd === "/workspace" || cwd === "") return undefined;
  if (!cwd.startsWith("/workspace/")) {
    throw new UsageError(`Working directory '${cwd}' is outside /workspace`);
  }
  return cwd.slice("/workspace/".length);
}

/**
 * A {@linkcode ServerConnection} over an open queue session.
 *
 * @param session The session.
 * @param release Called once the session is over (closes or removes its sandbox).
 * @returns The connection.
 */
export function sessionConnection(
  session: QueueSession,
  release: () => Promise<void>,
): ServerConnection {
  // Stdout is lent, never copied: the output's chunks are views of the
  // channel's one buffer, and the next is read only once the reader (the
  // relay, which copies at most one line) asked for it. A server flooding
  // stdout so costs no memory per chunk, whenever V8 collects.
  const out = new BorrowedStream();
  // Diagnostics must never hold up the conversation: stderr nobody reads
  // is buffered up to a bound (copies), then dropped (the runner's window bounds the rest).
  const err = new TransformStream<Uint8Array, Uint8Array>(
    {},
    new ByteLengthQueuingStrategy({ highWaterMark: STDERR_BUFFER_BYTES }),
  );
  const errWriter = err.writable.getWriter();
  let result: ExecResult | undefined;
  const finished = (async (): Promise<string> => {
    try {
      const chunks = session.output({ borrowed: true });
      let next = await chunks.next();
      while (!next.done) {
        const { stream, data } = next.value;
        if (stream === "stdout") await out.hand(data);
        else if ((errWriter.desiredSize ?? 0) > 0) errWriter.write(data.slice()).catch(() => {});
        next = await chunks.next();
      }
      result = next.value;
      return result.error ??
        (result.signal === null
          ? `exited with status ${result.exitCode}`
          : `killed by ${result.signal}`);
    } catch (error) {
      return error instanceof Error ? error.message : String(error);
    } finally {
      out.close();
      // Not awaited: a close waits for unread data to be read.
      errWriter.close().catch(() => {});
    }
  })();
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= (async () => {
      // Every step is bounded: a runner holding a lock on inbound.db would
      // otherwise make each commit wait out LOCK_WAIT_MS before the release.
      await settlesWithin(session.end(), WRITE_WAIT_MS);
      if (!await settlesWithin(finished, END_WAIT_MS)) {
        await settlesWithin(session.cancel(), WRITE_WAIT_MS);
        await settlesWithin(finished, CANCEL_WAIT_MS);
      }
      await settlesWithin(session.close(), WRITE_WAIT_MS);
      await release();
    })();
    return closing;
  };
  const stdin = new WritableStream<Uint8Array>({
    write: (chunk) => session.write(chunk),
    close: () => session.end(),
  });
  return { stdin, stdout: out.readable, stderr: err.readable, close, closed: finished };
}
