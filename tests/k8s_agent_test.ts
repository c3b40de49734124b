/**
 * `waffle agent`, the host side of a sandbox inside its Kubernetes pod: it
 * shares the pod's network with the runner, so every request, loopback
 * included, must carry the agent token, and then (as envd) the sandbox's
 * access token. Real HTTP on loopback against a real agent over a real
 * queue; and the CLI as a process, refusing a bad id or Secret in one line.
 *
 * @module
 */
import assert from "node:assert/strict";
import { openPodSandbox } from "../lib/k8s/pod_sandbox.ts";
import { AGENT_TOKEN_HEADER } from "../lib/k8s/sandbox_object.ts";
import { startAgent } from "../lib/serve/agent.ts";
import {
  AGENT_PROOF_WINDOW_MS,
  type AgentProof,
  proveRequest,
  provesAgent,
} from "../lib/serve/agent_proof.ts";
import { openServeDb } from "../lib/serve/db.ts";
import { loadWaffleConfig } from "../lib/config/config.ts";
import { runCliProcess } from "./_helpers.ts";

const AGENT_TOKEN = "a".repeat(32);
const ACCESS_TOKEN = "b".repeat(32);

async function withAgent(fn: (url: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-agent-test-" });
  for (const sub of ["queue/inbound", "queue/outbound", "chan", "state"]) {
    await Deno.mkdir(`${dir}/${sub}`, { recursive: true });
  }
  const sandbox = openPodSandbox({
    queueDir: `${dir}/queue`,
    channelDir: `${dir}/chan`,
    config: loadWaffleConfig({ overrides: { home: `${dir}/state` } }).sandbox,
    readyTimeoutMs: 200,
  });
  const journal = openServeDb(`${dir}/state`, { survives: "process-death" });
  const stop = new AbortController();
  const agent = await startAgent({
    sandbox,
    record: { id: "abc", accessToken: ACCESS_TOKEN, envVars: {} },
    agentToken: AGENT_TOKEN,
    journal,
    hostname: "127.0.0.1",
    port: 0,
    maxBodyBytes: 1 << 20,
    maxStreams: 4,
    signal: stop.signal,
  });
  try {
    await fn(`http://127.0.0.1:${agent.address.port}`);
  } finally {
    stop.abort();
    await agent.finished;
    sandbox.close();
    journal.close();
    await Deno.remove(dir, { recursive: true });
  }
}

const PATHS: [string, string, Record<string, string>][] = [
  ["GET", "/health", {}],
  ["GET", "/files?path=x", {}],
  ["POST", "/files?path=x", {}],
  ["POST", "/process.Process/List", { "content-type": "application/json" }],
  ["POST", "/filesystem.Filesystem/Stat", { "content-type": "application/json" }],
  ["GET", "/anything/else", {}],
];

Deno.test("agent: every path, /health included, is refused without the agent token or with a wrong one", async () => {
  await withAgent(async (url) => {
    for (const [method, path, headers] of PATHS) {
      // The token itself is no proof of it: it is never sent.
      for (const token of [undefined, "a".repeat(31) + "c", "", ACCESS_TOKEN, AGENT_TOKEN]) {
        const response = await fetch(`${url}${path}`, {
          method,
          headers: {
            ...headers,
            "x-access-token": ACCESS_TOKEN,
            ...(token === undefined ? {} : { [AGENT_TOKEN_HEADER]: token }),
          },
          ...(method === "POST" ? { body: "{}" } : {}),
        });
        const body = await response.json();
        assert.equal(response.status, 401, `${method} ${path} with ${token}`);
        assert.equal(body.message, "Invalid agent token");
      }
    }
  });
});

// A proof of the agent token for one request to the agent of sandbox `abc`.
function proof(
  method: string,
  target: string,
  options: { now?: number; id?: string } = {},
): AgentProof {
  return proveRequest(AGENT_TOKEN, { id: options.id ?? "abc", method, target }, options);
}

Deno.test("agent: with a proof of the agent token, envd still asks for the sandbox's access token", async () => {
  await withAgent(async (url) => {
    const health = await fetch(`${url}/health`, {
      headers: { [AGENT_TOKEN_HEADER]: proof("GET", "/health").header },
    });
    await health.body?.cancel();
    assert.equal(health.status, 204);
    for (const path of ["/process.Process/List", "/filesystem.Filesystem/Stat"]) {
      const response = await fetch(`${url}${path}`, {
        method: "POST",
        headers: {
          [AGENT_TOKEN_HEADER]: proof("POST", path).header,
          "content-type": "application/json",
          "x-access-token": "b".repeat(31) + "c",
        },
        body: "{}",
      });
      assert.equal(response.status, 401, path);
      assert.equal((await response.json()).message, "Invalid access token");
    }
    const files = await fetch(`${url}/files?path=x`, {
      headers: { [AGENT_TOKEN_HEADER]: proof("GET", "/files?path=x").header },
    });
    await files.body?.cancel();
    assert.equal(files.status, 401);
  });
});

Deno.test("agent: a proof is spent once, on its own request, while fresh; the answer proves the agent", async () => {
  await withAgent(async (url) => {
    const get = async (target: string, header: string) => {
      const response = await fetch(`${url}${target}`, {
        headers: { [AGENT_TOKEN_HEADER]: header },
      });
      await response.body?.cancel();
      return response;
    };
    const first = proof("GET", "/health");
    const answered = await get("/health", first.header);
    assert.equal(answered.status, 204);
    assert.ok(provesAgent(first, answered.headers.get(AGENT_TOKEN_HEADER)), "the answer proves");
    assert.ok(!provesAgent(proof("GET", "/health"), answered.headers.get(AGENT_TOKEN_HEADER)));
    // What an impostor caught cannot be used again, nor elsewhere, nor later.
    assert.equal((await get("/health", first.header)).status, 401, "replayed");
    assert.equal((await get("/files?path=x", proof("GET", "/health").header)).status, 401);
    assert.equal((await get("/health", proof("GET", "/health", { id: "abd" }).header)).status, 401);
    const stale = proof("GET", "/health", { now: Date.now() - AGENT_PROOF_WINDOW_MS - 60_000 });
    assert.equal((await get("/health", stale.header)).status, 401, "stale");
    const refused = await get("/health", first.header);
    assert.equal(refused.headers.get(AGENT_TOKEN_HEADER), null, "a refusal proves nothing");
  });
});

Deno.test("agent: a bad sandbox id or Secret is one line naming it, and nothing listens", async () => {
  const dir = await Deno.makeTempDir({ prefix: "waffle-agent-cli-" });
  try {
    await Deno.mkdir(`${dir}/sec`);
    await Deno.writeTextFile(`${dir}/sec/access-token`, ACCESS_TOKEN);
    await Deno.writeTextFile(`${dir}/sec/agent-token`, "short");
    await Deno.writeTextFile(`${dir}/sec/env-vars.json`, "{}");
    const args = [
      "agent",
      "--queue",
      `${dir}/queue`,
      "--channel",
      `${dir}/chan`,
      "--secrets",
      `${dir}/sec`,
      "--state",
      `${dir}/state`,
      "--listen",
      "127.0.0.1:0",
    ];
    const badId = await runCliProcess(args, { env: { WAFFLE_SANDBOX_ID: "Bad/../id" } });
    assert.notEqual(badId.code, 0);
    assert.match(badId.stderr, /Invalid WAFFLE_SANDBOX_ID 'Bad\/\.\.\/id'/);
    assert.equal(badId.stderr.trim().split("\n").length, 1, badId.stderr);
    const badToken = await runCliProcess(args, { env: { WAFFLE_SANDBOX_ID: "abc" } });
    assert.notEqual(badToken.code, 0);
    assert.match(badToken.stderr, /Secret file '.*\/sec\/agent-token' is missing or not valid/);
    assert.equal(badToken.stderr.trim().split("\n").length, 1, badToken.stderr);
    // Nothing was made: the queue's directory is not there.
    await assert.rejects(Deno.stat(`${dir}/queue`), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
