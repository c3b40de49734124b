/**
 * doctor's MCP rows: one `mcp <name> authority` row per configured server
 * (always), and with Docker an `initialize` + `tools/list` probe of each
 * server that executes in a sandbox, in a throwaway home.
 *
 * @module
 */
import { loadWaffleConfig } from "../config/config.ts";
import { removeSandbox } from "../lifecycle/fleet.ts";
import { removeTree } from "../lifecycle/remove_tree.ts";
import { sandboxKey } from "../lifecycle/identity.ts";
import { DockerClient } from "../docker/mod.ts";
import { planLaunch, resolveEnv } from "../mcp/plan.ts";
import type { McpServerConfig } from "../mcp/policy.ts";
import { probeServer } from "../mcp/probe.ts";
import { openSandboxServer } from "../mcp/sandbox_server.ts";
import type { DoctorCheck } from "./doctor.ts";

/**
 * The MCP checks for the configured servers.
 *
 * @param options `docker`: also probe the sandboxed servers; `configPath`: the config file.
 * @returns The checks, in config order.
 */
export function mcpChecks(
  options: { docker: boolean; configPath?: string | undefined },
): DoctorCheck[] {
  const config = loadWaffleConfig({ configPath: options.configPath });
  const servers = Object.values(config.policy.servers);
  const rows: DoctorCheck[] = servers.map((server) => ({
    name: `mcp ${server.name} authority`,
    run: () => Promise.resolve(describe(server)),
  }));
  if (!options.docker) return rows;
  for (const server of servers.filter((s) => s.execution === "sandbox")) {
    // The throwaway home has no config of its own: the probe reads this one.
    rows.push({ name: `mcp ${server.name} probe`, run: () => probe(server, config.path) });
  }
  return rows;
}

function describe(server: McpServerConfig): string {
  return [
    `execution=${server.execution}`,
    `authority=${server.authority}`,
    `groups=${server.groups?.join(",") ?? "all"}`,
    `env=${server.env.length === 0 ? "none" : server.env.join(",")}`,
    `tools=${server.tools?.join(",") ?? "all"}`,
  ].join(" ");
}

// Starts the server as a session of a throwaway user in a throwaway home (so
// doctor never touches a real user's sandbox), initializes it and lists its tools.
async function probe(server: McpServerConfig, configPath: string | undefined): Promise<string> {
  const home = await Deno.makeTempDir({ prefix: "waffle-doctor-mcp-" });
  const config = loadWaffleConfig({ configPath, overrides: { home, idleSeconds: 60 } });
  const group = server.groups?.[0];
  const planned = planLaunch(config, group === undefined ? {} : { group }).servers
    .find((s) => s.name === server.name);
  if (planned === undefined || planned.decision !== "launch") {
    throw new Error(`Denied by policy: ${planned?.reasons.join("; ") ?? "not planned"}`);
  }
  const docker = new DockerClient();
  const started = performance.now();
  try {
    const connection = await openSandboxServer(planned, {
      user: "doctor",
      tenant: "default",
      env: resolveEnv(planned.env),
      config: config.sandbox,
    });
    try {
      const found = await probeServer(connection);
      const total = performance.now() - started;
      const allowed = planned.tools === "all"
        ? "all allowed"
        : `${found.tools.filter((tool) => planned.tools.includes(tool)).length} allowed`;
      return `${planned.where}: ${found.tools.length} tools (${allowed}), initialize ${
        found.initializeMs.toFixed(0)
      } ms, tools/list ${found.listMs.toFixed(1)} ms, ${
        total.toFixed(0)
      } ms with the container start`;
    } finally {
      await connection.close();
    }
  } finally {
    const key = sandboxKey("default", "doctor", { home });
    await removeSandbox(docker, key, { config: config.sandbox, purge: true }).catch(() => false);
    // What is left is a sandbox's state: never a recursive delete in process.
    await removeTree(home).catch(() => false);
  }
}
