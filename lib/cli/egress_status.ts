/**
 * `waffle egress status` and `waffle egress reload`: the proxy of this home
 * as it runs now, and every identity's policy written anew from today's
 * config.
 *
 * @module
 */
import { loadWaffleConfig } from "../config/config.ts";
import { DockerClient } from "../docker/client.ts";
import { egressStatus, reloadPolicies } from "../egress/status.ts";
import { homeEgress } from "../config/egress_paths.ts";
import { controlCall } from "../egress/policy_writer.ts";
import { EXIT_FAILURE } from "../exit_codes.ts";
import { noPositionals, parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle egress status`. */
export const EGRESS_STATUS_HELP = `Usage: waffle egress status [--json] [--config FILE]

Shows this home's egress proxy: its container and state, whether its
control socket answers, the CA (file and SHA-256 fingerprint: what clients
in a sandbox trust for the hosts a secret is injected for), each identity it
serves (tenant, user, server, allowed destinations, the names of the
secrets it holds; never a value) and the audit file. Exit status 1 when the
proxy exists but does not answer.
`;

/** Help of `waffle egress reload`. */
export const EGRESS_RELOAD_HELP = `Usage: waffle egress reload [--json] [--config FILE]

Writes every identity's policy from today's waffle.toml at once: the proxy
applies it to the next connection, also of a command already running. (Any
waffle call does the same for its own sandbox.) An identity the config no
longer attaches gets an empty list until its next call recycles it.
`;

/** Help of `waffle egress ca`. */
export const EGRESS_CA_HELP = `Usage: waffle egress ca [--json] [--config FILE]

Makes this home's waffle CA if it has none yet (install.sh runs this for the
default home) and prints its certificate file and SHA-256 fingerprint. The
proxy presents certificates of this CA for the hosts a secret is injected
for; sandboxes trust it through their CA bundle. Its private key is readable
by the proxy alone.
`;

/**
 * Runs `waffle egress ca`.
 *
 * @param args Arguments after `ca`.
 * @param io Process streams.
 * @returns 0.
 */
export async function egressCaCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { json: { type: "boolean" }, config: { type: "string" } });
  noPositionals(parsed.positionals);
  const config = loadWaffleConfig({ configPath: stringFlag(parsed, "config") });
  const { prepareEgressHome } = await import("../egress/supervisor.ts");
  const { fingerprint } = await import("../egress/ca.ts");
  await prepareEgressHome(config.sandbox.home, config.egress);
  const path = homeEgress(config.sandbox.home).caCert;
  const sha256 = await fingerprint(Deno.readTextFileSync(path));
  await io.stdout(
    parsed.values.json ? `${JSON.stringify({ path, sha256 })}\n` : `${path} SHA-256 ${sha256}\n`,
  );
  return 0;
}

/**
 * Runs `waffle egress status`.
 *
 * @param args Arguments after `status`.
 * @param io Process streams.
 * @returns 0, or 1 when the proxy exists and does not answer.
 */
export async function egressStatusCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { json: { type: "boolean" }, config: { type: "string" } });
  noPositionals(parsed.positionals);
  const config = loadWaffleConfig({ configPath: stringFlag(parsed, "config") });
  const status = await egressStatus(new DockerClient(), config.sandbox.home);
  const failed = status.proxy !== null && !status.answering.ok;
  if (parsed.values.json) {
    await io.stdout(`${JSON.stringify({ home: config.sandbox.home, ...status })}\n`);
    return failed ? EXIT_FAILURE : 0;
  }
  const lines = [
    `proxy      ${
      status.proxy === null
        ? "none (started by the first call of a sandbox with [sandbox] egress)"
        : `${status.proxy.name} ${status.proxy.state}, started ${status.proxy.startedAt}, ${status.proxy.restarts} restarts`
    }`,
    `control    ${
      status.answering.ok
        ? `answers (${status.answering.ms.toFixed(1)} ms)`
        : status.answering.detail
    }`,
    `ca         ${
      status.ca === null ? "none yet" : `${status.ca.path} SHA-256 ${status.ca.fingerprint}`
    }`,
    `audit      ${status.audit.path} (${status.audit.bytes} bytes)`,
    ...status.identities.map((entry) => {
      const who = entry.identity;
      const server = who.server === null ? "" : ` server ${who.server}`;
      return `identity   ${entry.id} ${who.tenant}/${who.user}${server}: ${
        entry.allow.join(", ") || "nothing"
      }${entry.secrets.length > 0 ? `; secrets ${entry.secrets.join(", ")}` : ""}${
        entry.socket ? "" : " (no socket)"
      }`;
    }),
  ];
  await io.stdout(`${lines.join("\n")}\n`);
  return failed ? EXIT_FAILURE : 0;
}

/**
 * Runs `waffle egress reload`.
 *
 * @param args Arguments after `reload`.
 * @param io Process streams.
 * @returns 0.
 */
export async function egressReloadCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { json: { type: "boolean" }, config: { type: "string" } });
  noPositionals(parsed.positionals);
  const config = loadWaffleConfig({ configPath: stringFlag(parsed, "config") });
  const written = reloadPolicies(config);
  // A proxy that is down reads them when it starts.
  await controlCall(homeEgress(config.sandbox.home), "sync").catch(() => {});
  if (parsed.values.json) {
    await io.stdout(`${JSON.stringify({ identities: written })}\n`);
  } else {
    await io.stdout(`reloaded ${written.length} identities\n`);
  }
  return 0;
}
