/**
 * Upstream servers for the egress proxy's tests: an HTTP/1.1 echo server
 * and a git smart-HTTP server, each on a loopback port with a certificate
 * from a test CA, each counting the TCP connections it accepts and
 * recording the requests it answers.
 *
 * They run on `node:net`/`node:tls` rather than `Deno.serve` because only
 * there is a connection visible at accept (before the TLS handshake and any
 * request: a refused destination must see none) and the client's SNI
 * readable. The HTTP/1.1 parser here is small: strict about framing
 * (Content-Length or chunked, never both), lenient about the rest.
 *
 * Needs `--allow-net`, `--allow-read`, `--allow-write` (temp dirs), and for
 * the git server `--allow-run` (the host's `git` and `git-http-backend`)
 * and `--allow-env`.
 *
 * @module
 */
import * as net from "node:net";
import * as tls from "node:tls";
import { join } from "node:path";
import { settlesWithin } from "../lib/async.ts";
import { concat } from "../lib/bytes.ts";
import { type CertifiedKey, mintCa, mintLeaf } from "../lib/egress/ca.ts";

export type { CertifiedKey };

const KIB = 1024;
const MIB = 1024 * KIB;
/** How much of a request body a {@linkcode RecordedRequest} keeps. */
export const RECORDED_BODY_LIMIT: number = MIB;
/** The largest `n` of `GET /bytes/<n>`. */
export const MAX_BYTES: number = 64 * MIB;
/** The longest wait of `GET /slow/<ms>`. */
export const MAX_SLOW_MS = 10_000;
/** The README the git server's one commit holds. */
export const GIT_README = "hello from upstream\n";

const MAX_HEAD = 64 * KIB;
const MAX_HEADER_LINES = 256;
const MAX_BODY = 256 * MIB;
const MAX_REQUESTS_PER_CONNECTION = 10_000;
const READ_CHUNK = 64 * KIB;
const HIGH_WATER = MIB;
// A read or a write waits this long for the peer before the connection is cut.
const IDLE_MS = 30_000;
const CLOSE_MS = 5_000;
const CGI_TIMEOUT_MS = 60_000;
const GIT_TIMEOUT_MS = 30_000;
const GIT_BACKEND = "/usr/lib/git-core/git-http-backend";
// Fixed identity and dates, so the one commit has the same id on every run.
const GIT_IDENTITY = {
  GIT_AUTHOR_NAME: "Waffle Test",
  GIT_AUTHOR_EMAIL: "test@waffle.invalid",
  GIT_AUTHOR_DATE: "2026-01-01T00:00:00Z",
  GIT_COMMITTER_NAME: "Waffle Test",
  GIT_COMMITTER_EMAIL: "test@waffle.invalid",
  GIT_COMMITTER_DATE: "2026-01-01T00:00:00Z",
};

/** One request a test server received. */
export interface RecordedRequest {
  /** Which TCP connection it came on: 1 for the first accepted, and so on. */
  connection: number;
  method: string;
  /** The request target as sent (origin-form `/a?b`, or absolute-form if a client sent that). */
  path: string;
  /** The headers, names lower-cased; repeated fields joined with `, `. */
  headers: Record<string, string>;
  /** The body as text, its first {@linkcode RECORDED_BODY_LIMIT} bytes (the rest is read and dropped). */
  body: string;
  /** The TLS server name the client sent; null without SNI or without TLS. */
  sni: string | null;
}

/** A running echo server, from {@linkcode startUpstream}. */
export interface Upstream {
  /** The name its certificate is for (and that its JSON answers carry). */
  name: string;
  /** The address it listens on. */
  hostname: string;
  port: number;
  /** `https://NAME:PORT` (or `http://` without TLS). */
  url: string;
  /** TCP connections accepted so far, counted at accept (before any TLS or HTTP). */
  readonly connections: number;
  /** The requests received so far, in order; each is recorded once its body is all in, before it is answered. */
  requests: RecordedRequest[];
  /** Stops it: cuts open connections and waits (bounded) for their handlers. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** Options of {@linkcode startUpstream}. */
export interface StartUpstreamOptions {
  /** The host name its certificate is for, e.g. `api.test` or `127.0.0.1`. */
  name: string;
  /** The CA that signs its certificate. */
  ca: CertifiedKey;
  /** The loopback address to listen on; default `127.0.0.1`. */
  hostname?: string;
  /** Whether it speaks TLS; default true. */
  tls?: boolean;
}

/** A running git smart-HTTP server, from {@linkcode startGitServer}. */
export interface GitServer {
  /** The name its certificate is for. */
  name: string;
  /** The address it listens on. */
  hostname: string;
  port: number;
  /** The repository's URL, `https://NAME:PORT/repo.git`. */
  url: string;
  /** The id of the repository's one commit (on `main`, which HEAD names). */
  commit: string;
  /** TCP connections accepted so far, counted at accept. */
  readonly connections: number;
  /** The requests received so far, recorded as {@linkcode Upstream.requests} are. */
  requests: RecordedRequest[];
  /** Stops it and removes its temp dirs. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** Options of {@linkcode startGitServer}. */
export interface StartGitServerOptions {
  /** The host name its certificate is for, e.g. `git.test` or `127.0.0.1`. */
  name: string;
  /** The CA that signs its certificate. */
  ca: CertifiedKey;
  /** The loopback address to listen on; default `127.0.0.1`. */
  hostname?: string;
}

let cachedCa: Promise<CertifiedKey> | undefined;

/**
 * The test CA: minted on first use, then the same one for the whole process.
 *
 * @example
 * ```ts ignore
 * const ca = await testCa();
 * ```
 *
 * @returns The CA certificate and key (PEM).
 */
export function testCa(): Promise<CertifiedKey> {
  cachedCa ??= mintCa({ commonName: "waffle test CA" }).catch((error) => {
    cachedCa = undefined;
    throw error;
  });
  return cachedCa;
}

/**
 * Writes a CA's certificate as `ca.pem` in a directory.
 *
 * @example
 * ```ts ignore
 * const caFile = await writeCaFile(await testCa(), dir);
 * ```
 *
 * @param ca The CA.
 * @param dir An existing directory.
 * @returns The file's path.
 */
export async function writeCaFile(ca: CertifiedKey, dir: string): Promise<string> {
  const path = join(dir, "ca.pem");
  await Deno.writeTextFile(path, ca.cert);
  return path;
}

/**
 * Starts an HTTP/1.1 echo server on an ephemeral port. Every request gets
 * 200 and `{"upstream", "method", "path", "headers"}` as JSON, except:
 * `GET /bytes/<n>` answers n bytes (byte k is k mod 256; n at most
 * {@linkcode MAX_BYTES}), and `/slow/<ms>` waits that long (at most
 * {@linkcode MAX_SLOW_MS}) before its JSON. Keep-alive and `Connection:
 * close` are honoured; `Expect: 100-continue` is answered.
 *
 * @example
 * ```ts ignore
 * await using upstream = await startUpstream({ name: "api.test", ca: await testCa() });
 * ```
 *
 * @param options Its name, CA, address and whether it speaks TLS.
 * @returns The running server.
 * @throws {RangeError} When `hostname` is not an IP literal.
 */
export async function startUpstream(options: StartUpstreamOptions): Promise<Upstream> {
  const hostname = loopbackAddress(options.hostname);
  const secure = options.tls ?? true;
  const leaf = secure ? await mintLeaf(options.ca, options.name) : null;
  const requests: RecordedRequest[] = [];
  const listener = await listen({
    hostname,
    leaf,
    handler: (request, exchange) => echo(options.name, requests, request, exchange),
  });
  return {
    name: options.name,
    hostname,
    port: listener.port,
    url: `${secure ? "https" : "http"}://${urlHost(options.name)}:${listener.port}`,
    get connections(): number {
      return listener.connections;
    },
    requests,
    [Symbol.asyncDispose]: () => listener.close(),
  };
}

/**
 * Starts a git smart-HTTP server over TLS: `git-http-backend` as a CGI,
 * serving one bare repository, `repo.git`, whose one commit on `main` holds
 * `README` ({@linkcode GIT_README}). Clone it with the host's git and
 * `GIT_SSL_CAINFO` set to a {@linkcode writeCaFile} file.
 *
 * @example
 * ```ts ignore
 * await using git = await startGitServer({ name: "127.0.0.1", ca: await testCa() });
 * ```
 *
 * @param options Its name, CA and address.
 * @returns The running server.
 * @throws {Error} When the host's git cannot make the repository.
 */
export async function startGitServer(options: StartGitServerOptions): Promise<GitServer> {
  const hostname = loopbackAddress(options.hostname);
  const root = await Deno.makeTempDir({ prefix: "waffle-git-upstream-" });
  try {
    const commit = await makeRepository(root);
    const leaf = await mintLeaf(options.ca, options.name);
    const requests: RecordedRequest[] = [];
    const cgi = { projectRoot: join(root, "srv"), home: join(root, "home") };
    const listener = await listen({
      hostname,
      leaf,
      handler: (request, exchange) => gitBackend(cgi, requests, request, exchange),
    });
    return {
      name: options.name,
      hostname,
      port: listener.port,
      url: `https://${urlHost(options.name)}:${listener.port}/repo.git`,
      commit,
      get connections(): number {
        return listener.connections;
      },
      requests,
      async [Symbol.asyncDispose](): Promise<void> {
        await listener.close();
        await Deno.remove(root, { recursive: true }).catch(() => {});
      },
    };
  } catch (error) {
    await Deno.remove(root, { recursive: true }).catch(() => {});
    throw error;
  }
}

// ---------------------------------------------------------------------------
// The echo server's handler.

async function echo(
  name: string,
  requests: RecordedRequest[],
  request: IncomingRequest,
  exchange: Exchange,
): Promise<void> {
  requests.push(await request.record());
  const get = request.method === "GET" || request.method === "HEAD";
  const bytes = /^\/bytes\/(\d{1,12})$/.exec(request.pathname);
  if (get && bytes !== null) {
    const n = Number(bytes[1]);
    if (n > MAX_BYTES) throw new HttpError(400, `/bytes/<n> takes at most ${MAX_BYTES}`);
    await exchange.respond(200, {
      "content-type": "application/octet-stream",
      "content-length": String(n),
    }, patternBytes(n));
    return;
  }
  const slow = /^\/slow\/(\d{1,12})$/.exec(request.pathname);
  if (slow !== null) {
    const ms = Number(slow[1]);
    if (ms > MAX_SLOW_MS) throw new HttpError(400, `/slow/<ms> takes at most ${MAX_SLOW_MS}`);
    await sleep(ms, exchange.signal);
  }
  const body = new TextEncoder().encode(JSON.stringify({
    upstream: name,
    method: request.method,
    path: request.target,
    headers: request.headers,
  }));
  await exchange.respond(200, { "content-type": "application/json" }, body);
}

// Byte k of the answer is k mod 256 (READ_CHUNK is a multiple of 256).
async function* patternBytes(n: number): AsyncGenerator<Uint8Array> {
  const block = Uint8Array.from({ length: READ_CHUNK }, (_, i) => i % 256);
  for (let sent = 0; sent < n; sent += block.length) {
    yield n - sent >= block.length ? block : block.subarray(0, n - sent);
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(new ConnectionClosed());
    const done = (): void => {
      clearTimeout(timer);
      signal.removeEventListener("abort", aborted);
    };
    const aborted = (): void => {
      done();
      reject(new ConnectionClosed());
    };
    const timer = setTimeout(() => {
      done();
      resolve();
    }, ms);
    signal.addEventListener("abort", aborted);
  });
}

// ---------------------------------------------------------------------------
// The git server: the repository and the CGI.

async function makeRepository(root: string): Promise<string> {
  const home = join(root, "home");
  const bare = join(root, "srv", "repo.git");
  const work = join(root, "work");
  await Deno.mkdir(home);
  await Deno.mkdir(join(root, "srv"));
  await git(["init", "--quiet", "--bare", "--initial-branch=main", bare], { cwd: root, home });
  await git(["-c", "init.defaultBranch=main", "clone", "--quiet", bare, work], { cwd: root, home });
  await Deno.writeTextFile(join(work, "README"), GIT_README);
  await git(["add", "README"], { cwd: work, home });
  await git(["commit", "--quiet", "-m", "Initial commit"], { cwd: work, home });
  await git(["push", "--quiet", "origin", "main"], { cwd: work, home });
  return (await git(["rev-parse", "refs/heads/main"], { cwd: bare, home })).trim();
}

// Runs the host's git with none of the user's config and a fixed identity.
async function git(args: string[], options: { cwd: string; home: string }): Promise<string> {
  const output = await new Deno.Command("git", {
    args,
    cwd: options.cwd,
    clearEnv: true,
    env: {
      PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
      HOME: options.home,
      GIT_CONFIG_NOSYSTEM: "1",
      ...GIT_IDENTITY,
    },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(GIT_TIMEOUT_MS),
  }).output();
  const decoder = new TextDecoder();
  if (!output.success) {
    throw new Error(
      `git ${args.join(" ")} failed (${output.code}): ${decoder.decode(output.stderr)}`,
    );
  }
  return decoder.decode(output.stdout);
}

interface CgiPaths {
  /** GIT_PROJECT_ROOT: the directory that holds `repo.git`. */
  projectRoot: string;
  /** HOME for the backend, so the user's git config stays out. */
  home: string;
}

async function gitBackend(
  paths: CgiPaths,
  requests: RecordedRequest[],
  request: IncomingRequest,
  exchange: Exchange,
): Promise<void> {
  let pathInfo: string;
  try {
    pathInfo = decodeURIComponent(request.pathname);
  } catch {
    throw new HttpError(400, "Undecodable path");
  }
  const env: Record<string, string> = {
    PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
    HOME: paths.home,
    GIT_CONFIG_NOSYSTEM: "1",
    GIT_PROJECT_ROOT: paths.projectRoot,
    GIT_HTTP_EXPORT_ALL: "1",
    GATEWAY_INTERFACE: "CGI/1.1",
    SERVER_PROTOCOL: `HTTP/${request.version}`,
    SERVER_SOFTWARE: "waffle-test-git",
    REQUEST_METHOD: request.method,
    PATH_INFO: pathInfo,
    QUERY_STRING: request.query,
    REMOTE_ADDR: request.remoteAddress,
  };
  for (const [name, value] of Object.entries(request.headers)) {
    if (name === "content-type") env.CONTENT_TYPE = value;
    else if (name === "content-length") env.CONTENT_LENGTH = value;
    else {
      // HTTP_CONTENT_ENCODING (gzip'd bodies) and HTTP_GIT_PROTOCOL (v2) among them.
      const variable = `HTTP_${name.toUpperCase().replaceAll("-", "_")}`;
      if (/^[A-Z0-9_]+$/.test(variable)) env[variable] = value;
    }
  }
  const child = new Deno.Command(GIT_BACKEND, {
    clearEnv: true,
    env,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const kill = (): void => {
    try {
      child.kill("SIGKILL");
    } catch {
      // Already gone.
    }
  };
  const timer = setTimeout(kill, CGI_TIMEOUT_MS);
  exchange.signal.addEventListener("abort", kill);
  const stderr = collect(child.stderr, 64 * KIB).catch(() => "");
  const fed = feed(request, child.stdin).then((record) => void requests.push(record));
  fed.catch(() => {}); // a client gone mid-body rejects it before anyone awaits it
  const stdout = child.stdout.getReader();
  try {
    const { status, reason, headers, rest } = await readCgiHead(stdout);
    await exchange.respond(status, headers, cgiBody(rest, stdout), reason);
    await fed;
  } catch (error) {
    kill();
    if (error instanceof HttpError || error instanceof ConnectionClosed) throw error;
    throw new HttpError(502, `git-http-backend: ${error}; ${await stderr}`);
  } finally {
    clearTimeout(timer);
    exchange.signal.removeEventListener("abort", kill);
    await stdout.cancel().catch(() => {});
    if (!(await settlesWithin(child.status, CLOSE_MS))) kill();
    await child.status;
    await stderr;
  }
}

// Streams the request body to the CGI's stdin (until the CGI stops reading)
// and returns the request's record once the body is all in.
async function feed(
  request: IncomingRequest,
  stdin: WritableStream<Uint8Array>,
): Promise<RecordedRequest> {
  const writer = stdin.getWriter();
  let open = true;
  const record = await request.record(async (chunk) => {
    if (!open) return;
    try {
      await writer.write(chunk);
    } catch {
      open = false; // The CGI has exited or closed its stdin; the body is still read to its end.
    }
  });
  await writer.close().catch(() => {});
  return record;
}

async function collect(stream: ReadableStream<Uint8Array>, limit: number): Promise<string> {
  const parts: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of stream) {
    if (size < limit) parts.push(chunk.subarray(0, limit - size));
    size += chunk.length;
  }
  return new TextDecoder().decode(concat(parts));
}

interface CgiHead {
  status: number;
  reason: string;
  headers: Record<string, string>;
  /** Body bytes read along with the head. */
  rest: Uint8Array;
}

async function readCgiHead(stdout: ReadableStreamDefaultReader<Uint8Array>): Promise<CgiHead> {
  let buffer: Uint8Array = new Uint8Array(0);
  let end = -1;
  while ((end = headEnd(buffer)) < 0) {
    if (buffer.length > MAX_HEAD) throw new Error("CGI head too large");
    const { done, value } = await stdout.read();
    if (done) throw new Error("CGI ended before its head");
    buffer = concat([buffer, value]);
  }
  const head = latin1(buffer.subarray(0, end));
  let status = 200;
  let reason = "OK";
  const headers: Record<string, string> = {};
  for (const line of head.split(/\r?\n/)) {
    const colon = line.indexOf(":");
    if (colon <= 0) continue;
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    if (name === "status") {
      const match = /^(\d{3})\s*(.*)$/.exec(value);
      if (match === null) throw new Error(`Bad CGI status: ${value}`);
      status = Number(match[1]);
      reason = match[2] || reasonPhrase(status);
    } else {
      headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
    }
  }
  if (status === 200 && headers.location !== undefined) status = 302;
  return { status, reason, headers, rest: buffer.subarray(end) };
}

async function* cgiBody(
  first: Uint8Array,
  stdout: ReadableStreamDefaultReader<Uint8Array>,
): AsyncGenerator<Uint8Array> {
  if (first.length > 0) yield first;
  for (let total = first.length; total <= MAX_BODY;) {
    const { done, value } = await stdout.read();
    if (done) return;
    total += value.length;
    yield value;
  }
  throw new Error("CGI output too large");
}

// ---------------------------------------------------------------------------
// The HTTP/1.1 server both use.

/** A parsed request whose body is still on the wire. */
interface IncomingRequest {
  connection: number;
  sni: string | null;
  remoteAddress: string;
  method: string;
  target: string;
  pathname: string;
  query: string;
  version: "1.0" | "1.1";
  headers: Record<string, string>;
  /** Reads the whole body (passing each chunk to `onChunk`) and returns the request's record. */
  record(onChunk?: (chunk: Uint8Array) => Promise<void>): Promise<RecordedRequest>;
}

type Handler = (request: IncomingRequest, exchange: Exchange) => Promise<void>;

interface Listener {
  port: number;
  readonly connections: number;
  close(): Promise<void>;
}

async function listen(
  options: { hostname: string; leaf: CertifiedKey | null; handler: Handler },
): Promise<Listener> {
  const lifetime = new AbortController();
  const sockets = new Set<net.Socket>();
  const serving = new Set<Promise<void>>();
  // A TLS socket's connection ordinal, by its peer's address (the raw
  // socket of 'connection' and the TLS one of 'secureConnection' differ).
  const ordinals = new Map<string, number>();
  let connections = 0;
  const track = (socket: net.Socket): void => {
    if (lifetime.signal.aborted) {
      socket.destroy();
      return;
    }
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {}); // reported through 'close'
  };
  const serve = (socket: net.Socket, connection: number, sni: string | null): void => {
    const served: Promise<void> = serveConnection(socket, {
      connection,
      sni,
      handler: options.handler,
      stopped: lifetime.signal,
    }).catch(() => {}).finally(() => serving.delete(served));
    serving.add(served);
  };
  const server = options.leaf === null ? net.createServer() : tls.createServer({
    cert: options.leaf.cert,
    key: options.leaf.key,
    ALPNProtocols: ["http/1.1"],
  });
  server.on("connection", (socket: net.Socket) => {
    connections += 1;
    track(socket);
    if (socket.destroyed) return;
    if (options.leaf === null) serve(socket, connections, null);
    else {
      const key = peerKey(socket);
      ordinals.set(key, connections);
      socket.on("close", () => ordinals.delete(key));
    }
  });
  server.on("secureConnection", (socket: tls.TLSSocket) => {
    track(socket);
    if (socket.destroyed) return;
    const key = peerKey(socket);
    const ordinal = ordinals.get(key) ?? connections;
    ordinals.delete(key);
    const name = (socket as { servername?: unknown }).servername;
    serve(socket, ordinal, typeof name === "string" && name !== "" ? name : null);
  });
  server.on("tlsClientError", (_error: Error, socket: net.Socket) => socket.destroy());
  server.on("error", () => {});
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen({ port: 0, host: options.hostname }, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as net.AddressInfo).port;
  let closing: Promise<void> | undefined;
  return {
    port,
    get connections(): number {
      return connections;
    },
    close(): Promise<void> {
      closing ??= (async () => {
        lifetime.abort();
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        for (const socket of sockets) socket.destroy();
        await settlesWithin(closed, CLOSE_MS);
        await settlesWithin(Promise.allSettled([...serving]), CLOSE_MS);
      })();
      return closing;
    },
  };
}

function peerKey(socket: net.Socket): string {
  return `${socket.remoteAddress}|${socket.remotePort}`;
}

/** An answer the server gives itself (bad framing, bad target, …); the connection closes after it. */
class HttpError extends Error {
  override name = "HttpError";
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

/** The peer went away (or the server stopped) mid-exchange. */
class ConnectionClosed extends Error {
  override name = "ConnectionClosed";
  constructor(message = "Connection closed") {
    super(message);
  }
}

interface ConnectionInfo {
  connection: number;
  sni: string | null;
  handler: Handler;
  /** Aborted when the server stops. */
  stopped: AbortSignal;
}

async function serveConnection(socket: net.Socket, info: ConnectionInfo): Promise<void> {
  const gone = new AbortController();
  const abort = (): void => gone.abort();
  socket.on("close", abort);
  info.stopped.addEventListener("abort", abort);
  const reader = new SocketReader(socket);
  let exchange: Exchange | undefined;
  try {
    for (let served = 0; served < MAX_REQUESTS_PER_CONNECTION; served++) {
      const head = await reader.readHead();
      if (head === null) break;
      const parsed = parseHead(head);
      exchange = new Exchange(socket, gone.signal, parsed);
      const body = new RequestBody(reader, framing(parsed.method, parsed.headers));
      if (parsed.version === "1.1" && /100-continue/i.test(parsed.headers.expect ?? "")) {
        await write(socket, "HTTP/1.1 100 Continue\r\n\r\n");
      }
      const request = incoming(socket, info, parsed, body);
      await info.handler(request, exchange);
      if (!exchange.started) throw new Error("Handler gave no answer");
      await body.drain();
      if (!exchange.keepAlive) break;
      exchange = undefined;
    }
  } catch (error) {
    if (error instanceof HttpError && exchange?.started !== true && !socket.destroyed) {
      const answer = new TextEncoder().encode(`${error.message}\n`);
      const headers = { "content-type": "text/plain", "connection": "close" };
      await writeHead(socket, "1.1", error.status, reasonPhrase(error.status), {
        ...headers,
        "content-length": String(answer.length),
      }).then(() => write(socket, answer)).catch(() => {});
    } else {
      socket.destroy();
    }
  } finally {
    info.stopped.removeEventListener("abort", abort);
    await closeSocket(socket);
  }
}

async function closeSocket(socket: net.Socket): Promise<void> {
  if (socket.destroyed) return;
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()));
  socket.end();
  if (!(await settlesWithin(closed, CLOSE_MS))) socket.destroy();
}

interface ParsedHead {
  method: string;
  target: string;
  version: "1.0" | "1.1";
  headers: Record<string, string>;
}

function parseHead(head: string): ParsedHead {
  const lines = head.split(/\r?\n/);
  if (lines.length > MAX_HEADER_LINES) throw new HttpError(431, "Too many header lines");
  const start = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+) (\S+) HTTP\/1\.([01])$/.exec(lines[0] ?? "");
  if (start === null) throw new HttpError(400, "Bad request line");
  const headers: Record<string, string> = {};
  for (const line of lines.slice(1)) {
    if (line === "") continue;
    const match = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*$/.exec(line);
    if (match === null) throw new HttpError(400, "Bad header line");
    const name = match[1]!.toLowerCase();
    const value = match[2]!;
    headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
  }
  return {
    method: start[1]!,
    target: start[2]!,
    version: start[3] === "0" ? "1.0" : "1.1",
    headers,
  };
}

type Framing = { kind: "fixed"; length: number } | { kind: "chunked" };

function framing(method: string, headers: Record<string, string>): Framing {
  if (method === "CONNECT") throw new HttpError(405, "This server is not a proxy");
  const coding = headers["transfer-encoding"];
  if (coding !== undefined) {
    if (headers["content-length"] !== undefined) {
      throw new HttpError(400, "Both Content-Length and Transfer-Encoding");
    }
    if (coding.toLowerCase().split(",").map((s) => s.trim()).at(-1) !== "chunked") {
      throw new HttpError(400, `Unsupported Transfer-Encoding: ${coding}`);
    }
    return { kind: "chunked" };
  }
  const length = headers["content-length"];
  if (length === undefined) return { kind: "fixed", length: 0 };
  if (!/^\d{1,12}$/.test(length)) throw new HttpError(400, `Bad Content-Length: ${length}`);
  if (Number(length) > MAX_BODY) throw new HttpError(413, "Body too large");
  return { kind: "fixed", length: Number(length) };
}

function incoming(
  socket: net.Socket,
  info: ConnectionInfo,
  head: ParsedHead,
  body: RequestBody,
): IncomingRequest {
  let pathname = head.target;
  let query = "";
  if (!head.target.startsWith("/")) {
    try {
      const url = new URL(head.target);
      pathname = url.pathname;
      query = url.search.slice(1);
    } catch {
      // `*` (OPTIONS) or junk: left as it is.
    }
  } else {
    const mark = head.target.indexOf("?");
    if (mark >= 0) {
      pathname = head.target.slice(0, mark);
      query = head.target.slice(mark + 1);
    }
  }
  return {
    connection: info.connection,
    sni: info.sni,
    remoteAddress: socket.remoteAddress ?? "",
    method: head.method,
    target: head.target,
    pathname,
    query,
    version: head.version,
    headers: head.headers,
    async record(onChunk): Promise<RecordedRequest> {
      const kept: Uint8Array[] = [];
      let size = 0;
      for (let chunk = await body.read(); chunk !== null; chunk = await body.read()) {
        if (size < RECORDED_BODY_LIMIT) kept.push(chunk.subarray(0, RECORDED_BODY_LIMIT - size));
        size += chunk.length;
        await onChunk?.(chunk);
      }
      return {
        connection: info.connection,
        method: head.method,
        path: head.target,
        headers: { ...head.headers },
        body: new TextDecoder().decode(concat(kept)),
        sni: info.sni,
      };
    },
  };
}

/** One request's answer: writes the head and streams the body. */
class Exchange {
  started = false;
  keepAlive: boolean;
  #socket: net.Socket;
  #head: ParsedHead;

  constructor(socket: net.Socket, readonly signal: AbortSignal, head: ParsedHead) {
    this.#socket = socket;
    this.#head = head;
    const tokens = (head.headers.connection ?? "").toLowerCase().split(",").map((s) => s.trim());
    this.keepAlive = head.version === "1.1"
      ? !tokens.includes("close")
      : tokens.includes("keep-alive");
  }

  async respond(
    status: number,
    headers: Record<string, string>,
    body: Uint8Array | AsyncIterable<Uint8Array>,
    reason: string = reasonPhrase(status),
  ): Promise<void> {
    if (this.started) throw new Error("Answered twice");
    this.started = true;
    const out: Record<string, string> = {};
    for (const [name, value] of Object.entries(headers)) {
      if (!["connection", "keep-alive", "transfer-encoding"].includes(name)) out[name] = value;
    }
    let chunked = false;
    if (body instanceof Uint8Array) out["content-length"] = String(body.length);
    else if (out["content-length"] === undefined) {
      if (this.#head.version === "1.1") chunked = true;
      else this.keepAlive = false; // an HTTP/1.0 body without a length ends with the connection
    }
    if (chunked) out["transfer-encoding"] = "chunked";
    out.connection = this.keepAlive ? "keep-alive" : "close";
    await writeHead(this.#socket, this.#head.version, status, reason, out);
    if (this.#head.method === "HEAD" || status === 204 || status === 304) return;
    if (body instanceof Uint8Array) {
      if (body.length > 0) await write(this.#socket, body);
      return;
    }
    for await (const chunk of body) {
      if (this.signal.aborted) throw new ConnectionClosed();
      if (chunk.length === 0) continue;
      if (chunked) await write(this.#socket, `${chunk.length.toString(16)}\r\n`);
      await write(this.#socket, chunk);
      if (chunked) await write(this.#socket, "\r\n");
    }
    if (chunked) await write(this.#socket, "0\r\n\r\n");
  }
}

function writeHead(
  socket: net.Socket,
  version: string,
  status: number,
  reason: string,
  headers: Record<string, string>,
): Promise<void> {
  const lines = [`HTTP/${version} ${status} ${reason}`, `date: ${new Date().toUTCString()}`];
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  return write(socket, `${lines.join("\r\n")}\r\n\r\n`);
}

// Writes, waiting (bounded) for the socket to drain when its buffer is full.
function write(socket: net.Socket, data: Uint8Array | string): Promise<void> {
  if (socket.destroyed || !socket.writable) return Promise.reject(new ConnectionClosed());
  if (socket.write(data)) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const settle = (error?: Error): void => {
      clearTimeout(timer);
      socket.off("drain", drained);
      socket.off("close", closed);
      if (error === undefined) resolve();
      else reject(error);
    };
    const drained = (): void => settle();
    const closed = (): void => settle(new ConnectionClosed());
    const timer = setTimeout(() => {
      socket.destroy();
      settle(new ConnectionClosed("Write stalled"));
    }, IDLE_MS);
    socket.on("drain", drained);
    socket.on("close", closed);
  });
}

/** Buffers a socket's bytes for the parser, pausing it when the buffer is full. */
class SocketReader {
  #socket: net.Socket;
  #buffer: Uint8Array = new Uint8Array(0);
  #ended = false;
  #wake: (() => void) | undefined;

  constructor(socket: net.Socket) {
    this.#socket = socket;
    socket.on("data", (chunk: Uint8Array) => {
      this.#buffer = this.#buffer.length === 0 ? chunk : concat([this.#buffer, chunk]);
      if (this.#buffer.length >= HIGH_WATER) socket.pause();
      this.#notify();
    });
    const ended = (): void => {
      this.#ended = true;
      this.#notify();
    };
    socket.on("end", ended);
    socket.on("close", ended);
  }

  /** Reads a request head (without its blank line); null when the peer closed before one. */
  async readHead(): Promise<string | null> {
    for (let fills = 0; fills <= MAX_HEAD; fills++) {
      let skip = 0; // RFC 9112 §2.2: empty lines before a request line are ignored
      while (this.#buffer[skip] === 0x0d || this.#buffer[skip] === 0x0a) skip++;
      if (skip > 0) this.#take(skip);
      const end = headEnd(this.#buffer);
      if (end >= 0) return latin1(this.#take(end)).trimEnd();
      if (this.#buffer.length > MAX_HEAD) throw new HttpError(431, "Request head too large");
      if (!(await this.#fill())) {
        if (this.#buffer.length === 0) return null;
        throw new HttpError(400, "Connection ended inside the request head");
      }
    }
    throw new HttpError(431, "Request head too large");
  }

  /** Reads one line (without its line end); throws at the end of the stream. */
  async readLine(max: number): Promise<string> {
    for (let fills = 0; fills <= max; fills++) {
      const lf = this.#buffer.indexOf(0x0a);
      if (lf >= 0) return latin1(this.#take(lf + 1)).replace(/\r?\n$/, "");
      if (this.#buffer.length > max) throw new HttpError(400, "Line too long");
      if (!(await this.#fill())) throw new HttpError(400, "Connection ended inside a line");
    }
    throw new HttpError(400, "Line too long");
  }

  /** Reads at most `max` (> 0) bytes; throws at the end of the stream. */
  async read(max: number): Promise<Uint8Array> {
    if (this.#buffer.length === 0 && !(await this.#fill())) {
      throw new HttpError(400, "Connection ended inside the body");
    }
    return this.#take(Math.min(max, this.#buffer.length));
  }

  #take(n: number): Uint8Array {
    const taken = this.#buffer.subarray(0, n);
    this.#buffer = this.#buffer.subarray(n);
    return taken;
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  // Waits for more bytes: true when some came, false at the end of the stream.
  async #fill(): Promise<boolean> {
    const before = this.#buffer.length;
    if (this.#ended) return false;
    this.#socket.resume();
    let timer: ReturnType<typeof setTimeout> | undefined;
    await new Promise<void>((resolve) => {
      this.#wake = resolve;
      timer = setTimeout(() => {
        this.#socket.destroy();
        this.#ended = true;
        this.#notify();
      }, IDLE_MS);
    });
    clearTimeout(timer);
    return this.#buffer.length > before;
  }
}

/** A request body on the wire, read through its framing; breaking off a read does not end it. */
class RequestBody {
  #reader: SocketReader;
  #chunked: boolean;
  #left: number;
  #total = 0;
  #done: boolean;
  #inChunk = false;

  constructor(reader: SocketReader, framing: Framing) {
    this.#reader = reader;
    this.#chunked = framing.kind === "chunked";
    this.#left = framing.kind === "fixed" ? framing.length : 0;
    this.#done = framing.kind === "fixed" && framing.length === 0;
  }

  /** The next piece of the body; null after its end. */
  async read(): Promise<Uint8Array | null> {
    if (this.#done) return null;
    if (this.#chunked && this.#left === 0 && !(await this.#nextChunk())) return null;
    const chunk = await this.#reader.read(Math.min(this.#left, READ_CHUNK));
    this.#left -= chunk.length;
    if (!this.#chunked && this.#left === 0) this.#done = true;
    return chunk;
  }

  /** Reads and drops what is left, so the next request can be parsed. */
  async drain(): Promise<void> {
    for (let chunk = await this.read(); chunk !== null; chunk = await this.read()) {
      // Dropped; bounded by MAX_BODY.
    }
  }

  // Reads the next chunk-size line (after the previous chunk's CRLF); false after the last chunk.
  async #nextChunk(): Promise<boolean> {
    if (this.#inChunk && (await this.#reader.readLine(2)) !== "") {
      throw new HttpError(400, "Chunk not followed by CRLF");
    }
    this.#inChunk = true;
    const line = await this.#reader.readLine(4 * KIB);
    const size = /^([0-9a-fA-F]{1,8})[ \t]*(;.*)?$/.exec(line);
    if (size === null) throw new HttpError(400, `Bad chunk size line: ${line.slice(0, 40)}`);
    this.#left = parseInt(size[1]!, 16);
    this.#total += this.#left;
    if (this.#total > MAX_BODY) throw new HttpError(413, "Body too large");
    if (this.#left > 0) return true;
    for (let trailers = 0; trailers < MAX_HEADER_LINES; trailers++) {
      if ((await this.#reader.readLine(MAX_HEAD)) === "") {
        this.#done = true;
        return false;
      }
    }
    throw new HttpError(431, "Too many trailer lines");
  }
}

// Where a head ends: the index after its blank line (LF LF or LF CR LF); -1 if not yet.
function headEnd(bytes: Uint8Array): number {
  for (let i = bytes.indexOf(0x0a); i >= 0; i = bytes.indexOf(0x0a, i + 1)) {
    if (bytes[i + 1] === 0x0a) return i + 2;
    if (bytes[i + 1] === 0x0d && bytes[i + 2] === 0x0a) return i + 3;
  }
  return -1;
}

function latin1(bytes: Uint8Array): string {
  return new TextDecoder("latin1").decode(bytes);
}

function reasonPhrase(status: number): string {
  const phrases: Record<number, string> = {
    200: "OK",
    302: "Found",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
  };
  return phrases[status] ?? "Unknown";
}

function loopbackAddress(hostname: string | undefined): string {
  const address = hostname ?? "127.0.0.1";
  if (net.isIP(address) === 0) {
    throw new RangeError(
      `Cannot listen as 'hostname' must be an IP literal: current value is ${address}`,
    );
  }
  return address;
}

function urlHost(name: string): string {
  return name.includes(":") ? `[${name}]` : name;
}
