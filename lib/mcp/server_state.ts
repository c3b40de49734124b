/**
 * Every MCP server's own writable state: where it lives, the variables that
 * name it (`HOME`, `XDG_CONFIG_HOME`, `XDG_DATA_HOME`, `XDG_STATE_HOME`,
 * `XDG_CACHE_HOME`, `TMPDIR`), and how the directories are made before the
 * server starts. A server's package directory is read-only (the host's npm
 * cache, mounted read-only): a server that writes next to its own code, or
 * into a HOME it cannot write, fails with EROFS; with these it need not.
 *
 * | where        | state root (= HOME)                        | lasts                       |
 * | ------------ | ------------------------------------------ | --------------------------- |
 * | `sandbox`    | `/workspace/.waffle/mcp/<server>`          | with the user's workspace   |
 * | `restricted` | `/home/sandbox/.waffle/mcp/<server>`       | the session (a tmpfs home)  |
 * | `host`       | `<waffle home>/mcp-state/<server>` (0700)  | with the waffle home        |
 *
 * Under the root: `.config`, `.local/share`, `.local/state`, `.cache` and
 * `tmp`, the XDG defaults relative to HOME, so a program that ignores the
 * variables lands in the same places. In a container the directories are
 * made inside it, as the sandbox's uid (the host never resolves a path in a
 * sandbox): by the server's own Deno (`--preload`) for an npm package, by
 * `/bin/sh -c 'mkdir -p …; exec …'` for a command. On the host they are
 * made by waffle, mode 0700.
 *
 * @module
 */
import { join } from "../path.ts";
import { WaffleError } from "../errors.ts";
import { RESTRICTED_HOME } from "../lifecycle/posture.ts";
import { CONTAINER_WORKSPACE } from "../config/mcp_types.ts";

/** Where a server executes (the plan's `where`). */
export type StateWhere = "host" | "sandbox" | "restricted";

/** A server's state: its root and the variables to give it. */
export interface ServerState {
  /** The state root; also `HOME`. */
  root: string;
  /**
   * `HOME`, the four `XDG_*_HOME`, `TMPDIR`, and a known package's own
   * setting (`MEMORY_FILE_PATH` for server-memory). The config's `env` wins
   * over every one of them.
   */
  env: Record<string, string>;
}

/** Sandbox servers' state roots: in the workspace, so they persist with it. */
export const SANDBOX_STATE_DIR = `${CONTAINER_WORKSPACE}/.waffle/mcp`;
/** Restricted servers' state roots: in the session's tmpfs home (the workspace is read-only). */
export const RESTRICTED_STATE_DIR = `${RESTRICTED_HOME}/.waffle/mcp`;
/** Host servers' state roots, under the waffle home. */
export const HOST_STATE_DIR = "mcp-state";

/** The state variables and where each points, relative to the state root. */
export const STATE_VARIABLES: Readonly<Record<string, string>> = Object.freeze({
  HOME: ".",
  XDG_CONFIG_HOME: ".config",
  XDG_DATA_HOME: ".local/share",
  XDG_STATE_HOME: ".local/state",
  XDG_CACHE_HOME: ".cache",
  TMPDIR: "tmp",
});

/**
 * Settings some well-known packages need to keep their state out of their
 * own (read-only) directory, relative to the state root. server-memory
 * writes `memory.jsonl` next to its code unless `MEMORY_FILE_PATH` says
 * otherwise (and reads a relative one against its code's directory too).
 */
export const PACKAGE_STATE_ENV: ReadonlyMap<string, Readonly<Record<string, string>>> = new Map([
  ["@modelcontextprotocol/server-memory", { MEMORY_FILE_PATH: ".local/share/memory.jsonl" }],
]);

/**
 * A server's state root.
 *
 * @example
 * ```ts
 * import { serverStateRoot } from "./server_state.ts";
 * serverStateRoot("memory", "sandbox"); // "/workspace/.waffle/mcp/memory"
 * serverStateRoot("memory", "host", { home: "/var/lib/waffle" }); // "/var/lib/waffle/mcp-state/memory"
 * ```
 *
 * @param name The server's name (`[mcp.<name>]`, so a safe path segment).
 * @param where Where it executes.
 * @param options `home`: the waffle home, for a host server (else shown as `$WAFFLE_HOME`).
 * @returns An absolute path (but for a host server planned without a home).
 */
export function serverStateRoot(
  name: string,
  where: StateWhere,
  options: { home?: string | undefined } = {},
): string {
  if (where === "sandbox") return `${SANDBOX_STATE_DIR}/${name}`;
  if (where === "restricted") return `${RESTRICTED_STATE_DIR}/${name}`;
  return join(options.home ?? "$WAFFLE_HOME", HOST_STATE_DIR, name);
}

/**
 * A server's state: its root and the variables naming its directories.
 *
 * @example
 * ```ts
 * import { serverState } from "./server_state.ts";
 * const state = serverState({ name: "memory", where: "sandbox" });
 * state.env.XDG_DATA_HOME; // "/workspace/.waffle/mcp/memory/.local/share"
 * ```
 *
 * @param server Its name, where it executes and its npm package (if any).
 * @param options `home`: the waffle home (host servers).
 * @returns The state.
 */
export function serverState(
  server: { name: string; where: StateWhere; package?: string | undefined },
  options: { home?: string | undefined } = {},
): ServerState {
  const root = serverStateRoot(server.name, server.where, options);
  const env: Record<string, string> = {};
  for (const [name, relative] of Object.entries(STATE_VARIABLES)) env[name] = join(root, relative);
  const known = server.package === undefined
    ? undefined
    : PACKAGE_STATE_ENV.get(/^npm:((?:@[^/@]+\/)?[^@]+)/.exec(server.package)?.[1] ?? "");
  for (const [name, relative] of Object.entries(known ?? {})) env[name] = join(root, relative);
  return { root, env };
}

/**
 * The directories to make before a server starts: the root and each
 * directory variable, parents first.
 *
 * @example
 * ```ts
 * import { serverState, stateDirectories } from "./server_state.ts";
 * stateDirectories(serverState({ name: "m", where: "sandbox" }))[0]; // "/workspace/.waffle/mcp/m"
 * ```
 *
 * @param state The server's state.
 * @returns Absolute paths.
 */
export function stateDirectories(state: ServerState): string[] {
  const dirs = Object.keys(STATE_VARIABLES).flatMap((name) => state.env[name] ?? []);
  return [state.root, ...dirs].filter((dir, i, all) => all.indexOf(dir) === i);
}

/**
 * Makes a host server's state directories (mode 0700; an existing root is
 * set to 0700 too). Needs write permission on the waffle home.
 *
 * @example
 * ```ts ignore
 * prepareHostState(serverState({ name: "local", where: "host" }, { home }));
 * ```
 *
 * @param state The state of a host server (absolute paths).
 * @throws {WaffleError} When the root is not absolute or a directory cannot be made.
 */
export function prepareHostState(state: ServerState): void {
  if (!state.root.startsWith("/")) {
    throw new WaffleError(`State directory '${state.root}' is not an absolute path`);
  }
  for (const dir of stateDirectories(state)) {
    try {
      Deno.mkdirSync(dir, { recursive: true, mode: 0o700 });
    } catch (cause) {
      throw new WaffleError(`Cannot create state directory '${dir}': ${String(cause)}`, { cause });
    }
  }
  for (const dir of [join(state.root, ".."), state.root]) {
    try {
      Deno.chmodSync(dir, 0o700);
    } catch (cause) {
      throw new WaffleError(`Cannot restrict state directory '${dir}': ${String(cause)}`, {
        cause,
      });
    }
  }
}

/**
 * A module for Deno's `--preload` that makes the state directories inside
 * the container, as the server's own uid, before the package's code runs:
 * a `data:` URL, so nothing needs to exist in the sandbox first and no shell
 * is needed.
 *
 * @example
 * ```ts
 * import { serverState, statePreload } from "./server_state.ts";
 * statePreload(serverState({ name: "m", where: "sandbox" })).startsWith("data:text/javascript,"); // true
 * ```
 *
 * @param state The server's state (container paths).
 * @returns The module's URL.
 */
export function statePreload(state: ServerState): string {
  const code = `for (const dir of ${
    JSON.stringify(stateDirectories(state))
  }) Deno.mkdirSync(dir, { recursive: true });`;
  return `data:text/javascript,${encodeURIComponent(code)}`;
}

/**
 * A command server's argv with the state directories made first:
 * `/bin/sh -c 'mkdir -p -- <dirs> && exec "$0" "$@"' <argv...>`. The image
 * needs `sh` and `mkdir` for it (as a `cwd` needs `mkdir`).
 *
 * @example
 * ```ts
 * import { serverState, withStateDirectories } from "./server_state.ts";
 * withStateDirectories(["/srv/server", "--stdio"], serverState({ name: "m", where: "sandbox" }))[0]; // "/bin/sh"
 * ```
 *
 * @param argv The server's program and arguments.
 * @param state The server's state (container paths).
 * @returns The argv to run.
 */
export function withStateDirectories(argv: readonly string[], state: ServerState): string[] {
  const quoted = stateDirectories(state).map((dir) => `'${dir.replaceAll("'", `'\\''`)}'`);
  return ["/bin/sh", "-c", `mkdir -p -- ${quoted.join(" ")} && exec "$0" "$@"`, ...argv];
}
