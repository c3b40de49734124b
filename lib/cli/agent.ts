/**
 * `waffle agent`: runs inside a sandbox's Kubernetes pod, beside its runner
 * (see `lib/serve/agent.ts`). Its flags are the pod spec's (`lib/k8s`), not a
 * user's: it is never run by hand.
 *
 * @module
 */
import * as z from "../schema.ts";
import { loadWaffleConfig } from "../config/config.ts";
import { UsageError } from "../errors.ts";
import { join } from "../path.ts";
import { openPodSandbox } from "../k8s/pod_sandbox.ts";
import { startAgent } from "../serve/agent.ts";
import { openServeDb } from "../serve/db.ts";
import { parseListen } from "../config/serve_schema.ts";
import { noPositionals, numberFlag, parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";

/** Help of `waffle agent`. */
export const AGENT_HELP =
  `Usage: waffle agent --queue DIR --channel DIR --secrets DIR --state DIR [--listen HOST:PORT]
                    [--max-body-bytes N] [--max-streams N]

Runs inside a sandbox's Kubernetes pod (the 'waffle-agent' container): holds
the host side of the queue in DIR, which the pod's runner container serves,
and answers the sandbox's envd on --listen (default 0.0.0.0:49983) to the
server that routes to it. Every request must carry the agent token. The
sandbox id is WAFFLE_SANDBOX_ID; --secrets holds 'access-token',
'agent-token' and 'env-vars.json' (the sandbox's Secret). --state is the
agent's own directory (its processes' journal). SIGTERM stops it.
`;

// A token: what the server generates (base64url), never a whole file of junk.
const tokenSchema = z.string().check(z.regex(/^[A-Za-z0-9_-]{16,256}$/));
const envVarsSchema = z.record(z.string().check(z.maxLength(256)), z.string());
const SECRET_FILE_BYTES = 1 << 20;

/**
 * `waffle agent`.
 *
 * @param args The arguments after `agent`.
 * @param io The CLI's streams.
 * @returns The exit status.
 */
export async function agentCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    queue: { type: "string" },
    channel: { type: "string" },
    secrets: { type: "string" },
    state: { type: "string" },
    listen: { type: "string" },
    "max-body-bytes": { type: "string" },
    "max-streams": { type: "string" },
  });
  noPositionals(parsed.positionals);
  const required = (name: string): string => {
    const value = stringFlag(parsed, name);
    if (value === undefined) throw new UsageError(`Missing --${name} (see 'waffle agent --help')`);
    return value;
  };
  const id = Deno.env.get("WAFFLE_SANDBOX_ID") ?? "";
  if (!/^[a-z0-9]{1,63}$/.test(id)) {
    throw new UsageError(`Invalid WAFFLE_SANDBOX_ID '${id.slice(0, 80)}': expected [a-z0-9]{1,63}`);
  }
  const listenText = stringFlag(parsed, "listen") ?? "0.0.0.0:49983";
  const listen = parseListen(listenText);
  if ("problem" in listen) {
    throw new UsageError(`Invalid --listen '${listenText}': ${listen.problem}`);
  }
  const secrets = required("secrets");
  const accessToken = readSecret(secrets, "access-token", (text) => tokenSchema.parse(text.trim()));
  const agentToken = readSecret(secrets, "agent-token", (text) => tokenSchema.parse(text.trim()));
  const envVars = readSecret(
    secrets,
    "env-vars.json",
    (text) => envVarsSchema.parse(JSON.parse(text)),
  );
  const state = required("state");
  // No config file in a pod: the defaults, and how this artefact runs waffle.
  const config = loadWaffleConfig({ overrides: { home: state } }).sandbox;
  const sandbox = openPodSandbox({
    queueDir: required("queue"),
    channelDir: required("channel"),
    config,
  });
  const journal = openServeDb(state, { survives: "process-death" });
  const stop = new AbortController();
  const onSignal = (): void => stop.abort();
  for (const signal of ["SIGINT", "SIGTERM"] as const) Deno.addSignalListener(signal, onSignal);
  try {
    const agent = await startAgent({
      sandbox,
      record: { id, accessToken, envVars },
      agentToken,
      journal,
      hostname: listen.address.hostname,
      port: listen.address.port,
      maxBodyBytes: numberFlag(parsed, "max-body-bytes", { integer: true }) ?? 64 * 1024 * 1024,
      maxStreams: numberFlag(parsed, "max-streams", { integer: true, max: 65536 }) ?? 64,
      signal: stop.signal,
      damaged: () => sandbox.damaged(),
    });
    await io.stderr(
      `waffle agent: sandbox '${id}' on ${agent.address.hostname}:${agent.address.port}\n`,
    );
    await agent.finished;
  } finally {
    for (const signal of ["SIGINT", "SIGTERM"] as const) {
      Deno.removeSignalListener(signal, onSignal);
    }
    sandbox.close();
    journal.close();
  }
  return 0;
}

// One file of the sandbox's Secret, size-capped and checked.
function readSecret<T>(dir: string, name: string, check: (text: string) => T): T {
  const path = join(dir, name);
  try {
    const info = Deno.statSync(path);
    if (!info.isFile || info.size > SECRET_FILE_BYTES) throw new Error("not a small regular file");
    return check(Deno.readTextFileSync(path));
  } catch (cause) {
    throw new UsageError(`Secret file '${path}' is missing or not valid`, { cause });
  }
}
