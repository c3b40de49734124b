/// <reference lib="dom" />
/**
 * The console's one way to the server: waffle's and E2B's REST API with the
 * key in `X-API-Key` (never in a URL), and a sandbox's envd over Connect
 * with `E2b-Sandbox-Id` and `X-Access-Token`.
 *
 * @module
 */
import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { Process } from "../lib/serve/gen/process/process_pb.ts";
import { Filesystem } from "../lib/serve/gen/filesystem/filesystem_pb.ts";
import type { ConsoleSandbox } from "./types.ts";

const KEY_ITEM = "waffle.key";
let key: string = sessionStorage.getItem(KEY_ITEM) ?? "";

/** An answer of the API that is not a success, with its one-line message. */
export class ApiError extends Error {
  /** The HTTP status (0 when the request did not reach the server). */
  readonly status: number;
  /**
   * @param status The HTTP status.
   * @param message The server's message.
   */
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

/** @returns The key in use ("" when signed out). */
export function currentKey(): string {
  return key;
}

/**
 * Keeps the key for this tab only (sessionStorage), or forgets it.
 *
 * @param value The key, or "" to sign out.
 */
export function setKey(value: string): void {
  key = value;
  // A sandbox's access token was fetched with the old key: the next key must fetch its own.
  envds.clear();
  if (value === "") sessionStorage.removeItem(KEY_ITEM);
  else sessionStorage.setItem(KEY_ITEM, value);
}

/**
 * One call of the API.
 *
 * @param method The HTTP method.
 * @param path The path and query, e.g. `/waffle/v1/whoami`.
 * @param body A JSON body, if any.
 * @returns The parsed JSON answer (undefined for an empty one).
 * @throws {ApiError} With the server's message on a failure.
 */
export async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { "X-API-Key": key };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response: Response;
  try {
    response = await fetch(path, {
      method,
      headers,
      credentials: "omit",
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
  } catch (cause) {
    throw new ApiError(0, `Cannot reach the server: ${errorText(cause)}`);
  }
  const text = await response.text();
  if (!response.ok) throw new ApiError(response.status, failureText(response, text));
  return (text === "" ? undefined : JSON.parse(text)) as T;
}

/**
 * The message of an error, on one line.
 *
 * @param error Anything thrown.
 * @returns One line of text.
 */
export function errorText(error: unknown): string {
  const text = error instanceof Error ? error.message : String(error);
  return text.replace(/\s+/g, " ").trim().slice(0, 500);
}

function failureText(response: Response, text: string): string {
  try {
    const parsed = JSON.parse(text) as { message?: unknown };
    if (typeof parsed.message === "string") return parsed.message;
  } catch {
    // Not JSON: the status says it.
  }
  return `${response.status} ${response.statusText}`.trim();
}

/** A sandbox's envd services, as the browser speaks them. */
export interface Envd {
  /** The process service (Start, Connect, SendInput, Update…). */
  process: Client<typeof Process>;
  /** The filesystem service (ListDir…). */
  filesystem: Client<typeof Filesystem>;
  /** The headers that authorize a plain envd route (`/files`). */
  headers: Record<string, string>;
}

const envds = new Map<string, Promise<Envd>>();

/**
 * The envd of a sandbox: its access token is read once from
 * `GET /sandboxes/{id}`.
 *
 * @param sandboxId The sandbox.
 * @returns Its clients.
 */
export function envdOf(sandboxId: string): Promise<Envd> {
  let found = envds.get(sandboxId);
  if (found === undefined) {
    found = openEnvd(sandboxId);
    envds.set(sandboxId, found);
    found.catch(() => envds.delete(sandboxId));
  }
  return found;
}

async function openEnvd(sandboxId: string): Promise<Envd> {
  const detail = await api<{ envdAccessToken?: string }>(
    "GET",
    `/sandboxes/${encodeURIComponent(sandboxId)}`,
  );
  const headers = {
    "E2b-Sandbox-Id": sandboxId,
    "X-Access-Token": detail.envdAccessToken ?? "",
  };
  const transport = createConnectTransport({
    baseUrl: location.origin,
    interceptors: [(next) => (request) => {
      for (const [name, value] of Object.entries(headers)) request.header.set(name, value);
      return next(request);
    }],
  });
  return {
    process: createClient(Process, transport),
    filesystem: createClient(Filesystem, transport),
    headers,
  };
}

/**
 * The sandboxes the key sees.
 *
 * @returns waffle's list.
 */
export function listSandboxes(): Promise<{ at: number; sandboxes: ConsoleSandbox[] }> {
  return api("GET", "/waffle/v1/sandboxes");
}

/**
 * A path segment, escaped.
 *
 * @param id A sandbox or snapshot id.
 * @returns It, URL-encoded.
 */
export function seg(id: string): string {
  return encodeURIComponent(id);
}
