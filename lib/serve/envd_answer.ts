/**
 * How one sandbox's envd answers a request, wherever the sandbox runs: its
 * plain routes (their own auth), else, with its access token, its Connect
 * services, whose streams are cut when the sandbox is killed. The server's
 * router (`envd_router.ts`) and a pod's agent (`agent.ts`) both answer so.
 *
 * @module
 */
import type { ConnectFetchHandler } from "./connect.ts";
import { envdHttp, type EnvdTarget } from "./envd_http.ts";
import { sameSecret } from "./secret.ts";

/** One sandbox's envd, as {@linkcode answerEnvd} answers it. */
export interface EnvdEndpoint extends EnvdTarget {
  /** Aborted when the sandbox is killed: its streams are cut. */
  killed: AbortSignal;
  /** Its Connect services (made on first use). */
  services: () => ConnectFetchHandler;
}

/**
 * Answers one request for one sandbox's envd: its plain routes (their own
 * auth), else, with its access token, its Connect services. A killed
 * sandbox's streams are cut, not ended: the SDK then asks /health, which
 * says the sandbox is gone.
 *
 * @param request The request.
 * @param endpoint The sandbox, its token, its services.
 * @returns The response.
 */
export async function answerEnvd(request: Request, endpoint: EnvdEndpoint): Promise<Response> {
  const plain = await envdHttp(request, endpoint);
  if (plain !== undefined) return plain;
  const token = request.headers.get("x-access-token");
  if (token === null || !sameSecret(token, endpoint.accessToken)) {
    return Response.json({ code: "unauthenticated", message: "Invalid access token" }, {
      status: 401,
    });
  }
  const answered = await endpoint.services()(request);
  if (
    answered?.body && answered.headers.get("content-type")?.startsWith("application/connect+")
  ) {
    return new Response(droppedOnKill(answered.body, endpoint.killed), answered);
  }
  return answered ?? noRoute(new URL(request.url).pathname);
}

/**
 * A stream's body that is cut, not ended, when its sandbox is killed: the
 * client sees its connection dropped mid-stream (as a killed E2B sandbox's
 * streams are), and the SDK's health probe then tells it the sandbox is gone.
 *
 * @param body The stream's envelopes.
 * @param killed Aborted when the sandbox is killed.
 * @returns The same bytes until the kill.
 */
function droppedOnKill(
  body: ReadableStream<Uint8Array>,
  killed: AbortSignal,
): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let drop = (): void => {};
  return new ReadableStream<Uint8Array>({
    start(controller): void {
      drop = () => {
        controller.error(new Error("The sandbox was killed"));
        reader.cancel().catch(() => {});
      };
      if (killed.aborted) drop();
      else killed.addEventListener("abort", drop, { once: true });
    },
    async pull(controller): Promise<void> {
      const next = await reader.read().catch((cause) => ({ done: true, cause } as const));
      // Killed while reading: the stream is already errored, nothing more goes out.
      if (killed.aborted) return;
      if (!next.done) {
        controller.enqueue(next.value);
        return;
      }
      killed.removeEventListener("abort", drop);
      if ("cause" in next) controller.error(next.cause);
      else controller.close();
    },
    cancel(reason): Promise<void> {
      killed.removeEventListener("abort", drop);
      return reader.cancel(reason);
    },
  });
}

function noRoute(path: string): Response {
  return Response.json({ code: "unimplemented", message: `No route '${path}'` }, { status: 404 });
}
