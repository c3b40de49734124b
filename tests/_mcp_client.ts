/**
 * A real SDK client that advertises sampling and elicitation, as a host's
 * MCP client does, and counts each time its handlers run: what a sandboxed
 * server must not reach unless its `client_requests` lists them.
 *
 * @module
 */
import { Client } from "@modelcontextprotocol/client";

/** How often the client's handlers ran. */
export interface HandlerCalls {
  sampling: number;
  elicitation: number;
}

/**
 * Builds the client (connect it yourself, so a transport's own handler can be
 * set first). Sampling answers `answer`; elicitation declines.
 *
 * @param name The client's name in `initialize`.
 * @param answer The text its "model" answers a sampling request with.
 * @returns The client and its handler counts.
 */
export function samplingClient(
  name: string,
  answer: string,
): { client: Client; calls: HandlerCalls } {
  const client = new Client(
    { name, version: "1.0.0" },
    { capabilities: { sampling: {}, elicitation: {} } },
  );
  const calls: HandlerCalls = { sampling: 0, elicitation: 0 };
  client.setRequestHandler("sampling/createMessage", () => {
    calls.sampling++;
    return {
      model: "host-model",
      role: "assistant" as const,
      content: { type: "text" as const, text: answer },
    };
  });
  client.setRequestHandler("elicitation/create", () => {
    calls.elicitation++;
    return { action: "decline" as const };
  });
  return { client, calls };
}

/** The `initialize` request the raw-line tests send first: id 1, protocol 2025-06-18. */
export const INITIALIZE_REQUEST: Readonly<Record<string, unknown>> = Object.freeze({
  jsonrpc: "2.0",
  id: 1,
  method: "initialize",
  params: {
    protocolVersion: "2025-06-18",
    capabilities: {},
    clientInfo: { name: "t", version: "1" },
  },
});
