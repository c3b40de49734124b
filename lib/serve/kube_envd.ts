/**
 * envd for a server on Kubernetes: each request for a sandbox is passed to
 * its pod's agent (`waffle agent`), streamed both ways, with a proof of the
 * agent token added (never the token: `agent_proof.ts`), and the agent's
 * answer passed on only when it proves the token too. The agent checks the
 * sandbox's access token itself, as envd would, so the server adds no
 * authority a caller lacks. A removed or paused sandbox's streams are cut.
 *
 * @module
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import {
  codeToHttpStatus,
  contentTypeStreamRegExp,
  endStreamFlag,
  endStreamToJson,
  errorToJson,
} from "@connectrpc/connect/protocol-connect";
import { AGENT_RECYCLE_HEADER, AGENT_TOKEN_HEADER } from "../k8s/sandbox_object.ts";
import { proveRequest, provesAgent } from "./agent_proof.ts";
import { error } from "./envd_http.ts";
import type { KubeSandboxes } from "./kube_sandboxes.ts";
import { pausedMessage } from "./sandboxes.ts";
import type { SandboxRecord } from "./state.ts";

// Headers of one hop, never passed on (RFC 9110 §7.6.1), and what names
// the server rather than the agent.
const HOP_HEADERS = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "host",
  "content-length",
  AGENT_TOKEN_HEADER,
  // The tenant's API key is the control API's, never the sandbox's: a pod
  // (its runner shares the agent's network) is never shown it.
  "x-api-key",
]);

/** Routes envd requests to the sandboxes' agents. */
export class KubeEnvd {
  readonly #sandboxes: KubeSandboxes;

  /** @param sandboxes The server's sandboxes on Kubernetes. */
  constructor(sandboxes: KubeSandboxes) {
    this.#sandboxes = sandboxes;
  }

  // The answer that says the pod cannot serve reaches its client whole; then
  // (or after 5 s, whatever the client does) the pod is replaced.
  #thenRecycle(
    body: ReadableStream<Uint8Array> | null,
    record: SandboxRecord,
    why: string,
  ): ReadableStream<Uint8Array> | null {
    const recycle = (): void => void this.#sandboxes.recycle(record, why).catch(() => false);
    const fallback = setTimeout(recycle, 5000);
    const done = (): void => {
      clearTimeout(fallback);
      recycle();
    };
    if (body === null) {
      done();
      return null;
    }
    return body.pipeThrough(new TransformStream({ flush: done }));
  }

  /** Nothing to take over: each agent keeps its own processes. */
  restore(): void {}

  /**
   * Passes one request to its sandbox's agent.
   *
   * @param request The request (its `Host` already checked).
   * @param record The sandbox it names.
   * @returns The agent's response, streamed.
   */
  async respond(request: Request, record: SandboxRecord): Promise<Response> {
    if (record.state === "paused") return refusedPaused(request, pausedMessage(record.id));
    let route;
    try {
      route = await this.#sandboxes.route(record);
    } catch (cause) {
      return error(502, cause instanceof Error ? cause.message : String(cause));
    }
    const url = new URL(request.url);
    const headers = new Headers();
    for (const [name, value] of request.headers) {
      if (!HOP_HEADERS.has(name.toLowerCase())) headers.set(name, value);
    }
    // envd's Authorization is Basic (the user a command runs as); a bearer
    // there is the API key again (`GET /metrics`'s form).
    if (!/^basic\s/i.test(headers.get("authorization") ?? "basic ")) {
      headers.delete("authorization");
    }
    const target = `${url.pathname}${url.search}`;
    const proof = proveRequest(route.agentToken, { id: record.id, method: request.method, target });
    headers.set(AGENT_TOKEN_HEADER, proof.header);
    const signal = AbortSignal.any([route.killed, request.signal]);
    try {
      const answered = await fetch(`http://${route.authority}${target}`, {
        method: request.method,
        headers,
        body: request.body,
        redirect: "manual",
        signal,
        // A request body (an upload) streams as it comes.
        ...(request.body === null ? {} : { duplex: "half" }),
      } as RequestInit);
      // Whatever holds the pod's port without the token (a command, while
      // the agent is down) is answered for by nobody.
      if (!provesAgent(proof, answered.headers.get(AGENT_TOKEN_HEADER))) {
        await answered.body?.cancel().catch(() => {});
        return error(502, `Sandbox '${record.id}' did not answer as its agent`);
      }
      const out = new Headers();
      for (const [name, value] of answered.headers) {
        if (!HOP_HEADERS.has(name.toLowerCase())) out.set(name, value);
      }
      const damage = answered.headers.get(AGENT_RECYCLE_HEADER);
      if (damage !== null) {
        out.delete(AGENT_RECYCLE_HEADER);
        return new Response(this.#thenRecycle(answered.body, record, damage), {
          status: answered.status,
          headers: out,
        });
      }
      return new Response(answered.body, { status: answered.status, headers: out });
    } catch (cause) {
      if (route.killed.aborted) return error(502, `Sandbox '${record.id}' was killed`);
      return error(502, `Sandbox '${record.id}' did not answer: ${(cause as Error).message}`);
    }
  }
}

// A paused sandbox has no pod to ask: answered here as its envd would
// (`envd_rpc.ts`'s refusePaused): /health 502, /files 409, and every
// Connect call `failed_precondition` in Connect's own framing (a stream's
// end-stream message, a unary call's JSON error).
function refusedPaused(request: Request, message: string): Response {
  const path = new URL(request.url).pathname;
  if (path === "/health") return error(502, message);
  if (path === "/files") return error(409, message);
  const failure = new ConnectError(message, Code.FailedPrecondition);
  const type = request.headers.get("content-type") ?? "";
  if (contentTypeStreamRegExp.test(type)) {
    const json = endStreamToJson(new Headers(), failure, undefined);
    const body = encodeEnvelope(endStreamFlag, new TextEncoder().encode(JSON.stringify(json)));
    return new Response(body, { status: 200, headers: { "content-type": type } });
  }
  return Response.json(errorToJson(failure, undefined), {
    status: codeToHttpStatus(failure.code),
  });
}
