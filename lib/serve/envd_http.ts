/**
 * envd's plain HTTP routes for one sandbox: `GET /health`, and `GET`/`POST
 * /files`, done inside the sandbox as its unprivileged uid through waffle's
 * files API (the host never resolves a sandbox path). `/files` accepts the
 * sandbox's access token or a URL signed with it.
 *
 * @module
 */
import { sha256 } from "@noble/hashes/sha2";
import { FilesError } from "../errors.ts";
import { dirname, normalize } from "../path.ts";
import type { EnvdSandbox } from "./envd_context.ts";
import { writeFile } from "../files/mod.ts";
import { metadataProblem } from "../files/metadata.ts";
import { sameSecret } from "./secret.ts";

/** The user the SDKs name by default, whose home maps onto the workspace. */
export const SANDBOX_HOME = "/home/user";

/**
 * A path the SDK names, as waffle's files API takes it: the user's home
 * (`/home/user`, or a relative path) is the sandbox's workspace; any other
 * absolute path is the sandbox's own.
 *
 * @param path As the SDK sent it.
 * @returns The path for the files API.
 */
export function sandboxPath(path: string): string {
  if (path === SANDBOX_HOME || path === `${SANDBOX_HOME}/`) return "/workspace";
  if (path.startsWith(`${SANDBOX_HOME}/`)) {
    return `/workspace/${path.slice(SANDBOX_HOME.length + 1)}`;
  }
  return path;
}

/**
 * The inverse of {@linkcode sandboxPath} for a path the sandbox reports: the
 * workspace is named as the user's home again, so the SDK sees the paths it
 * named.
 *
 * @param path An absolute path inside the sandbox.
 * @returns The path as the SDK names it.
 */
export function clientPath(path: string): string {
  if (path === "/workspace") return SANDBOX_HOME;
  if (path.startsWith("/workspace/")) return `${SANDBOX_HOME}/${path.slice("/workspace/".length)}`;
  return path;
}

/**
 * The signature E2B's SDKs put in a signed `/files` URL:
 * `v1_` + unpadded base64 of sha256(`path:operation:user:token[:expiration]`).
 *
 * @param fields What is signed.
 * @returns The signature.
 */
export function fileSignature(
  fields: {
    path: string;
    operation: "read" | "write";
    user: string;
    token: string;
    expiration?: number;
  },
): string {
  const text = [fields.path, fields.operation, fields.user, fields.token].join(":") +
    (fields.expiration === undefined ? "" : `:${fields.expiration}`);
  const digest = sha256(new TextEncoder().encode(text));
  return `v1_${btoa(String.fromCharCode(...digest)).replace(/=+$/, "")}`;
}

/**
 * The sandbox whose token signed a `/files` URL: under `E2B_SANDBOX_URL` a
 * signed URL names no sandbox, so each candidate's token is tried (as E2B's
 * proxy cannot, waffle can: it holds every token).
 *
 * @param request A request without a sandbox id.
 * @param sandboxes The candidates, their ids and access tokens (asked only for a signed URL).
 * @returns The id whose token made the URL's signature, if any.
 */
export function signedFilesSandbox(
  request: Request,
  sandboxes: () => Iterable<{ id: string; accessToken: string }>,
): string | undefined {
  const url = new URL(request.url);
  const signature = url.searchParams.get("signature");
  if (url.pathname !== "/files" || signature === null) return undefined;
  const operation = request.method === "GET" ? "read" : request.method === "POST" ? "write" : "";
  if (operation === "") return undefined;
  const expirationText = url.searchParams.get("signature_expiration");
  for (const sandbox of sandboxes()) {
    const wanted = fileSignature({
      path: url.searchParams.get("path") ?? "",
      operation,
      user: url.searchParams.get("username") ?? "",
      token: sandbox.accessToken,
      ...(expirationText === null ? {} : { expiration: Number(expirationText) }),
    });
    if (sameSecret(signature, wanted)) return sandbox.id;
  }
  return undefined;
}

/** What the envd routes need of the sandbox they serve. */
export interface EnvdTarget {
  /** The open waffle sandbox. */
  sandbox: EnvdSandbox;
  /** Its access token. */
  accessToken: string;
  /** Why it takes no call now (it is paused): `/health` answers 502, `/files` 409. */
  paused?: string | undefined;
}

/**
 * Answers `/health` and `/files` for one sandbox; undefined for other paths.
 *
 * @param request The request (already routed to this sandbox).
 * @param target The sandbox and its token.
 * @returns The response, or undefined.
 */
export async function envdHttp(
  request: Request,
  target: EnvdTarget,
): Promise<Response | undefined> {
  const url = new URL(request.url);
  if (url.pathname === "/health" && request.method === "GET") {
    // 502 is how the SDKs' isRunning() learns a sandbox does not run.
    if (target.paused !== undefined) return error(502, target.paused);
    return new Response(null, { status: 204 });
  }
  if (url.pathname !== "/files") return undefined;
  const operation = request.method === "GET" ? "read" : request.method === "POST" ? "write" : "";
  if (operation === "") return error(405, `Method '${request.method}' is not allowed on /files`);
  const user = url.searchParams.get("username") ?? "user";
  if (user === "root") {
    return error(403, "User 'root' is refused: commands and files run as the unprivileged user");
  }
  // The SDK signs the user as the URL names it: '' for the default user.
  const signedUser = url.searchParams.get("username") ?? "";
  const denied = checkFileAuth(request, url, {
    operation,
    user: signedUser,
    token: target.accessToken,
  });
  if (denied !== undefined) return denied;
  if (target.paused !== undefined) return error(409, target.paused);
  const path = url.searchParams.get("path");
  return operation === "read"
    ? await readFile(target.sandbox, path)
    : await writeFiles(request, target.sandbox, path);
}

function checkFileAuth(
  request: Request,
  url: URL,
  expected: { operation: "read" | "write"; user: string; token: string },
): Response | undefined {
  const header = request.headers.get("x-access-token");
  if (header !== null) {
    return sameSecret(header, expected.token) ? undefined : error(401, "Invalid access token");
  }
  const signature = url.searchParams.get("signature");
  if (signature === null) return error(401, "Missing access token or signature");
  const expirationText = url.searchParams.get("signature_expiration");
  const expiration = expirationText === null ? undefined : Number(expirationText);
  if (expiration !== undefined && !(expiration * 1000 > Date.now())) {
    // envd's own words, which E2B's SDK tests compare.
    return error(401, "signature is already expired");
  }
  const wanted = fileSignature({
    path: url.searchParams.get("path") ?? "",
    operation: expected.operation,
    user: expected.user,
    token: expected.token,
    ...(expiration === undefined ? {} : { expiration }),
  });
  return sameSecret(signature, wanted) ? undefined : error(401, "Invalid signature");
}

async function readFile(sandbox: EnvdSandbox, path: string | null): Promise<Response> {
  if (path === null || path === "") return error(400, "Missing 'path'");
  const reader = sandbox.files.read(sandboxPath(path)).getReader();
  // The first read says whether the file is there, before any header goes out.
  let first: ReadableStreamReadResult<Uint8Array>;
  try {
    first = await reader.read();
  } catch (cause) {
    return filesFailure(cause, path);
  }
  const body = new ReadableStream<Uint8Array>({
    start(controller): void {
      if (first.done) controller.close();
      else controller.enqueue(first.value);
    },
    async pull(controller): Promise<void> {
      if (first.done) return;
      const next = await reader.read();
      if (next.done) controller.close();
      else controller.enqueue(next.value);
    },
    cancel(reason): Promise<void> {
      return reader.cancel(reason);
    },
  });
  // These bytes are the sandbox's, answered on the console's origin: a
  // browser must save them, never render or sniff them.
  const name = encodeURIComponent(path.split("/").pop() || "file");
  return new Response(body, {
    headers: {
      "content-type": "application/octet-stream",
      "x-content-type-options": "nosniff",
      "content-disposition": `attachment; filename*=UTF-8''${name}`,
      "content-security-policy": "sandbox; default-src 'none'",
    },
  });
}

async function writeFiles(
  request: Request,
  sandbox: EnvdSandbox,
  path: string | null,
): Promise<Response> {
  const type = request.headers.get("content-type") ?? "";
  const metadata = requestMetadata(request.headers);
  const problem = metadataProblem(metadata);
  if (problem !== undefined) {
    await request.body?.cancel().catch(() => {});
    return error(400, problem);
  }
  const written: Written[] = [];
  // The file being written, for the error that names it.
  let current = path ?? "";
  try {
    if (type.startsWith("multipart/form-data")) {
      if (request.body === null) return error(400, "Empty multipart body");
      const { multipartFiles } = await import("./multipart.ts");
      for await (const file of multipartFiles(request.body, type)) {
        // Several files at once name each by its file name; one may be named by `path`.
        const target = path ?? file.name;
        if (!target) {
          await file.data.cancel();
          return error(400, "Missing 'path' for an uploaded file");
        }
        current = target;
        await writeOne(sandbox, target, file.data, metadata);
        written.push(entry(target, metadata));
      }
    } else {
      if (path === null || path === "") return error(400, "Missing 'path'");
      let body = request.body ?? new Uint8Array();
      if (request.headers.get("content-encoding") === "gzip" && body instanceof ReadableStream) {
        body = body.pipeThrough(new DecompressionStream("gzip"));
      }
      await writeOne(sandbox, path, body, metadata);
      written.push(entry(path, metadata));
    }
  } catch (cause) {
    return filesFailure(cause, current);
  }
  return Response.json(written);
}

// A path the SDK names, absolute as envd reports it (relative is under the home).
function absolutePath(path: string): string {
  return normalize(path.startsWith("/") ? path : `${SANDBOX_HOME}/${path}`);
}

// envd makes a file's missing parent directories: here `mkdir -p` inside the
// sandbox, as its uid, before the write (which reports what still fails).
async function writeOne(
  sandbox: EnvdSandbox,
  path: string,
  data: ReadableStream<Uint8Array> | Uint8Array,
  metadata: Record<string, string>,
): Promise<void> {
  const target = sandboxPath(absolutePath(path));
  const parent = dirname(target);
  if (parent !== "/workspace" && parent !== "/tmp" && parent !== "/") {
    await sandbox.run(["mkdir", "-p", "--", parent], { timeoutMs: MKDIR_TIMEOUT_MS })
      .catch(() => undefined);
  }
  await writeFile(sandbox, target, data, { metadata });
}

/** The header that carries one metadata key (`X-Metadata-<key>`). */
const METADATA_HEADER = "x-metadata-";

/**
 * A write's metadata, from its `X-Metadata-<key>` headers. Header names are
 * case-insensitive, so keys are lower case (as envd keeps them); a header
 * sent twice arrives joined (`a, b`), as HTTP combines repeated fields.
 */
function requestMetadata(headers: Headers): Record<string, string> {
  const metadata: Record<string, string> = {};
  for (const [name, value] of headers) {
    if (name.startsWith(METADATA_HEADER)) {
      metadata[name.slice(METADATA_HEADER.length).toLowerCase()] = value;
    }
  }
  return metadata;
}

/** One written file, as the SDK reads it. */
interface Written {
  name: string;
  path: string;
  type: "file";
  metadata?: Record<string, string>;
}

const MKDIR_TIMEOUT_MS = 30_000;

function entry(path: string, metadata: Record<string, string>): Written {
  const absolute = absolutePath(path);
  return {
    name: absolute.slice(absolute.lastIndexOf("/") + 1),
    path: absolute,
    type: "file",
    ...(Object.keys(metadata).length > 0 ? { metadata } : {}),
  };
}

function filesFailure(cause: unknown, path: string): Response {
  const message = cause instanceof Error ? cause.message : String(cause);
  if (cause instanceof FilesError && /no such file|not found|does not exist/i.test(message)) {
    return error(404, `Path '${path}' not found`);
  }
  if (/no space|quota/i.test(message)) return error(507, message);
  return error(400, message);
}

/**
 * An envd error answer: `{code, message}` with the same status.
 *
 * @param status The HTTP status.
 * @param message One line.
 * @returns The response.
 */
export function error(status: number, message: string): Response {
  return Response.json({ code: status, message }, { status });
}
