/**
 * The warnings `waffle mcp plan`, `mcp run` and `doctor` give for a config
 * that would otherwise fail silently: a host variable the server's `env`
 * names that is not set, and an allowlisted tool the server does not offer.
 * One wording, wherever it is shown.
 *
 * @module
 */
import { unsetHostEnv } from "../mcp/plan.ts";
import type { EnvSource } from "../config/mcp_types.ts";
import type { CliIo } from "./io.ts";

/**
 * The warning for a host variable a server's `env` names that is not set.
 *
 * @example
 * ```ts
 * import { unsetEnvWarning } from "./mcp_warnings.ts";
 * unsetEnvWarning("memory", { name: "TOKEN", host: "TOKEN" });
 * // "server 'memory': host variable 'TOKEN' is not set (mcp.memory.env); the server starts without it"
 * ```
 *
 * @param server The server's name.
 * @param entry The variable's name in the server, and the host variable it comes from.
 * @returns One line.
 */
export function unsetEnvWarning(server: string, entry: { name: string; host: string }): string {
  const as = entry.name === entry.host ? "" : ` (for '${entry.name}')`;
  return `server '${server}': host variable '${entry.host}'${as} is not set (mcp.${server}.env); the server starts without it`;
}

/**
 * The warning for allowlisted tools a server does not offer.
 *
 * @example
 * ```ts
 * import { notOfferedWarning } from "./mcp_warnings.ts";
 * notOfferedWarning("files", ["read_fiel"]);
 * // "server 'files' does not offer 'read_fiel', which mcp.files.tools allows (misspelt, or removed?)"
 * ```
 *
 * @param server The server's name.
 * @param tools The tools its `tools` names that it did not list.
 * @returns One line.
 */
export function notOfferedWarning(server: string, tools: string[]): string {
  const names = tools.map((tool) => `'${tool}'`).join(", ");
  return `server '${server}' does not offer ${names}, which mcp.${server}.tools allows (misspelt, or removed?)`;
}

/**
 * Writes one warning line to stderr for each host variable a planned
 * server's `env` names that is not set (before the server starts without it).
 *
 * @example
 * ```ts ignore
 * await warnUnsetEnv(launch.planned, io);
 * ```
 *
 * @param planned The server's plan (its name and `envSources`).
 * @param io Where the lines go (stderr).
 */
export async function warnUnsetEnv(
  planned: { name: string; envSources: readonly EnvSource[] },
  io: Pick<CliIo, "stderr">,
): Promise<void> {
  for (const entry of unsetHostEnv(planned.envSources)) {
    await io.stderr(`waffle: warning: ${unsetEnvWarning(planned.name, entry)}\n`);
  }
}
