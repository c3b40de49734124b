/**
 * A minimal MCP client for health checks: `initialize`, then `tools/list`,
 * over any {@linkcode ServerConnection}. What the server says is untrusted
 * and read through the bounded, validating reader.
 *
 * @module
 */
import { ProtocolError } from "../errors.ts";
import type { ServerConnection } from "./connection.ts";
import { encodeMessage, OversizedLine, parseMessage, readLines } from "./jsonrpc.ts";

/** What a probe found. */
export interface ProbeResult {
  /** The server's `serverInfo.name`, when it gave one. */
  server: string | undefined;
  /** Milliseconds from the `initialize` request to its result. */
  initializeMs: number;
  /** Milliseconds from `tools/list` to its result. */
  listMs: number;
  /** The tools it listed (first page). */
  tools: string[];
}

/**
 * Initializes a server and lists its tools.
 *
 * @param connection The server.
 * @param options `timeoutMs` for the whole probe (default 60 s).
 * @returns Times and tool names.
 * @throws {ProtocolError} When the server answers with an error, garbage, or not in time.
 */
export async function probeServer(
  connection: ServerConnection,
  options: { timeoutMs?: number } = {},
): Promise<ProbeResult> {
  const writer = connection.stdin.getWriter();
  const lines = readLines(connection.stdout);
  const timeoutMs = options.timeoutMs ?? 60_000;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new ProtocolError(`No answer within ${timeoutMs} ms`)),
      timeoutMs,
    );
  });
  const call = async (id: number, method: string, params: unknown): Promise<unknown> => {
    await writer.write(encodeMessage({ jsonrpc: "2.0", id, method, params }));
    while (true) {
      const next = await Promise.race([lines.next(), expired]);
      if (next.done) throw new ProtocolError(`The server ended before answering '${method}'`);
      // A message over the limit cannot be the small answer waited for.
      if (next.value instanceof OversizedLine) continue;
      const parsed = parseMessage(next.value);
      if ("invalid" in parsed || parsed.kind !== "response" || parsed.message.id !== id) continue;
      if (parsed.message.error !== undefined) {
        throw new ProtocolError(`'${method}' failed: ${parsed.message.error.message}`);
      }
      return parsed.message.result;
    }
  };
  try {
    let started = performance.now();
    const init = await call(1, "initialize", {
      protocolVersion: "2025-06-18",
      capabilities: {},
      clientInfo: { name: "waffle-doctor", version: "1" },
    }) as { serverInfo?: { name?: unknown } } | undefined;
    const initializeMs = performance.now() - started;
    await writer.write(encodeMessage({ jsonrpc: "2.0", method: "notifications/initialized" }));
    started = performance.now();
    const listed = await call(2, "tools/list", {}) as { tools?: { name?: unknown }[] } | undefined;
    const listMs = performance.now() - started;
    const tools = (Array.isArray(listed?.tools) ? listed.tools : [])
      .map((tool) => String(tool?.name ?? "")).filter((name) => name !== "");
    const name = init?.serverInfo?.name;
    return { server: typeof name === "string" ? name : undefined, initializeMs, listMs, tools };
  } finally {
    clearTimeout(timer);
    writer.releaseLock();
    await lines.return(undefined).catch(() => {});
  }
}
