/**
 * envd's `filesystem.Filesystem` service for one sandbox: `Stat`, `ListDir`,
 * `MakeDir`, `Move`, `Remove`, the `WatchDir` stream and the polling
 * watchers. Everything runs inside the sandbox as its unprivileged uid: a
 * fixed script or program with the paths as separate arguments (GNU `find`,
 * `mkdir`, `mv` of the image), or waffle's files API; the host never
 * resolves a sandbox path, and what the sandbox prints back is parsed as
 * untrusted data. A path's last component is never followed: a symlink is
 * reported, moved and removed as the link it is.
 *
 * Watching polls the directory's listing from inside the sandbox and
 * reports what changed between two listings (a rename shows as a removal
 * and a creation).
 *
 * @module
 */
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import type { DescMessage, MessageInitShape } from "@bufbuild/protobuf";
import { FilesError } from "../errors.ts";
import { readMetadata } from "../files/mod.ts";
import { basename, dirname, normalize } from "../path.ts";
import { escapeControls } from "../terminal/control_text.ts";
import { clientPath, SANDBOX_HOME, sandboxPath } from "./envd_http.ts";
import { type EnvdContext, refuseRoot } from "./envd_context.ts";
import {
  type CreateWatcherResponseSchema,
  type EntryInfoSchema,
  EventType,
  Filesystem,
  type FilesystemEventSchema,
  FileType,
  type GetWatcherEventsResponseSchema,
  type ListDirResponseSchema,
  type MakeDirResponseSchema,
  type MoveResponseSchema,
  type StatResponseSchema,
  type WatchDirResponseSchema,
} from "./gen/filesystem/filesystem_pb.ts";

type Shape<T extends DescMessage> = MessageInitShape<T>;
type Empty = Record<never, never>;
type EntryInfo = MessageInitShape<typeof EntryInfoSchema>;
type FsEvent = MessageInitShape<typeof FilesystemEventSchema>;
type WatchMessage = MessageInitShape<typeof WatchDirResponseSchema>;

/** How long one filesystem command may run in the sandbox. */
const OP_TIMEOUT_MS = 60_000;
/** The most bytes of listing one command may print (past it: `resource_exhausted`). */
const LIST_BYTES = 16 * 1024 * 1024;
/** The most entries a watch keeps of its directory. */
const WATCH_ENTRIES = 10_000;
/** The listing's bytes a watch reads per poll. */
const WATCH_BYTES = 4 * 1024 * 1024;
/** How often a watch lists its directory. */
const POLL_MS = 300;
/** Watches (streams and polling watchers together) of one sandbox at once. */
const MAX_WATCHES = 4;
/** Events a polling watcher holds for its next `GetWatcherEvents`; the oldest go first. */
const WATCHER_EVENTS = 1000;
/** A polling watcher nobody asked for this long is removed. */
const WATCHER_IDLE_MS = 10 * 60_000;
/** The deepest a recursive watch looks. */
const RECURSIVE_DEPTH = 64;
/** Keepalive interval when the client names none (`Keepalive-Ping-Interval`, seconds). */
const DEFAULT_KEEPALIVE_S = 90;

// find's record of one entry: type, size, permission bits, `ls -l` bits,
// owner, group, mtime, link target, path; each field ends with a NUL, which
// no name can hold.
const FORMAT = "%y\\0%s\\0%m\\0%M\\0%u\\0%g\\0%T@\\0%l\\0%p\\0";
const FIELDS = 9;

// Exit codes of the scripts' own checks.
const EXIT = { notFound: 91, exists: 92, denied: 93, notDirectory: 94 } as const;

// ListDir: the directory itself (depth 0) and its entries down to `$2`.
// A directory the uid may not read is refused before find runs, so an
// error find prints later is about an entry below, which is skipped.
const LIST_SCRIPT = `
if [ ! -e "$1" ] && [ ! -L "$1" ]; then exit ${EXIT.notFound}; fi
if [ -L "$1" ] || [ ! -d "$1" ]; then exit ${EXIT.notDirectory}; fi
if [ ! -r "$1" ] || [ ! -x "$1" ]; then exit ${EXIT.denied}; fi
find -P -- "$1" -maxdepth "$2" -printf "$3" 2>/dev/null
[ $? -le 1 ]`;

// MakeDir: with its parents; an existing directory is `already_exists`.
const MAKE_DIR_SCRIPT = `
if [ -d "$1" ]; then exit ${EXIT.exists}; fi
if [ -e "$1" ] || [ -L "$1" ]; then exit ${EXIT.notDirectory}; fi
mkdir -p -- "$1" && exec find -P -- "$1" -maxdepth 0 -printf "$2"`;

// Move: rename(2) semantics (`mv -T`: a directory destination is replaced,
// never entered), the destination's parent made first.
const MOVE_SCRIPT = `
if [ ! -e "$1" ] && [ ! -L "$1" ]; then exit ${EXIT.notFound}; fi
mkdir -p -- "$3" && mv -T -- "$1" "$2" && exec find -P -- "$2" -maxdepth 0 -printf "$4"`;

/** One entry as the sandbox listed it. */
interface Listed {
  /** Its path inside the sandbox. */
  path: string;
  /** find's type letter. */
  kind: string;
  size: bigint;
  mode: number;
  permissions: string;
  owner: string;
  group: string;
  /** Modification time as find printed it: seconds and nanoseconds. */
  mtime: { seconds: bigint; nanos: number };
  target: string;
}

/**
 * Registers the `filesystem.Filesystem` service of one sandbox.
 *
 * @param router The sandbox's Connect router.
 * @param context The sandbox, its kill signal and its record.
 */
export function registerFilesystem(router: ConnectRouter, context: EnvdContext): void {
  const watches = new Watches(context);
  router.service(Filesystem, {
    async stat(request, handler): Promise<Shape<typeof StatResponseSchema>> {
      refuseRoot(handler);
      const path = placePath(request.path);
      const [entry] = await entries(context, [await statIn(context, handler, path)]);
      return { entry: entry! };
    },
    async listDir(request, handler): Promise<Shape<typeof ListDirResponseSchema>> {
      refuseRoot(handler);
      const path = placePath(request.path);
      const depth = Math.min(Math.max(request.depth, 1), RECURSIVE_DEPTH);
      const listed = await listIn(context, handler, path, { depth, maxBytes: LIST_BYTES });
      return { entries: await entries(context, listed.sort(walkOrder)) };
    },
    async makeDir(request, handler): Promise<Shape<typeof MakeDirResponseSchema>> {
      refuseRoot(handler);
      const path = placePath(request.path);
      const out = await runScript(context, handler, [MAKE_DIR_SCRIPT, path, FORMAT], path);
      return { entry: toEntry(single(out, path)) };
    },
    async move(request, handler): Promise<Shape<typeof MoveResponseSchema>> {
      refuseRoot(handler);
      const source = placePath(request.source);
      const destination = placePath(request.destination);
      const out = await runScript(
        context,
        handler,
        [MOVE_SCRIPT, source, destination, dirname(destination), FORMAT],
        source,
      );
      const [entry] = await entries(context, [single(out, destination)]);
      return { entry: entry! };
    },
    async remove(request, handler): Promise<Empty> {
      refuseRoot(handler);
      const path = placePath(request.path);
      try {
        await context.sandbox.files.remove(path);
      } catch (cause) {
        const failure = removeFailure(cause, request.path);
        // envd removes as `rm -rf` does: a path that is not there is removed.
        if (failure.code !== Code.NotFound) throw failure;
      }
      return {};
    },
    async *watchDir(request, handler): AsyncGenerator<WatchMessage> {
      refuseRoot(handler);
      const watch = await watches.open(handler, request, handler.signal);
      try {
        yield { event: { case: "start", value: {} } };
        yield* watchStream(context, watch, handler);
      } finally {
        watches.close(watch);
      }
    },
    async createWatcher(request, handler): Promise<Shape<typeof CreateWatcherResponseSchema>> {
      refuseRoot(handler);
      return { watcherId: await watches.createWatcher(handler, request) };
    },
    getWatcherEvents(request, handler): Shape<typeof GetWatcherEventsResponseSchema> {
      refuseRoot(handler);
      return { events: watches.takeEvents(request.watcherId) };
    },
    removeWatcher(request, handler): Empty {
      refuseRoot(handler);
      watches.removeWatcher(request.watcherId);
      return {};
    },
  });
}

/**
 * A path the SDK names, inside the sandbox: relative paths are under the
 * user's home, `.` and `..` are resolved as text, a trailing slash goes (it
 * would make the kernel follow a final symlink), then {@linkcode sandboxPath}.
 */
function placePath(path: string): string {
  if (path.includes("\0")) {
    throw new ConnectError("A path cannot hold a NUL byte", Code.InvalidArgument);
  }
  const absolute = normalize(path.startsWith("/") ? path : `${SANDBOX_HOME}/${path}`);
  const trimmed = absolute.length > 1 && absolute.endsWith("/") ? absolute.slice(0, -1) : absolute;
  return sandboxPath(trimmed);
}

async function statIn(
  context: EnvdContext,
  handler: HandlerContext,
  path: string,
): Promise<Listed> {
  const out = await runIn(
    context,
    handler,
    ["find", "-P", "--", path, "-maxdepth", "0", "-printf", FORMAT],
    path,
  );
  return single(out, path);
}

/** A directory's entries (not itself), down to `depth`, as the sandbox lists them. */
async function listIn(
  context: EnvdContext,
  handler: { signal: AbortSignal; timeoutMs(): number | undefined },
  path: string,
  options: { depth: number; maxBytes: number },
): Promise<Listed[]> {
  const out = await runScript(
    context,
    handler,
    [LIST_SCRIPT, path, String(options.depth), FORMAT],
    path,
    options.maxBytes,
  );
  const listed = parseListing(out);
  // The first record is the directory itself (find's depth 0).
  if (listed[0]?.path !== path) {
    throw new ConnectError(
      `The sandbox's listing of '${clientPath(path)}' is malformed`,
      Code.Internal,
    );
  }
  return listed.slice(1);
}

function runScript(
  context: EnvdContext,
  handler: { signal: AbortSignal; timeoutMs(): number | undefined },
  [script, ...args]: string[],
  path: string,
  maxBytes = LIST_BYTES,
): Promise<Uint8Array> {
  return runIn(
    context,
    handler,
    ["/bin/sh", "-c", script!, "waffle-envd", ...args],
    path,
    maxBytes,
  );
}

/**
 * Runs one command in the sandbox; its stdout, or the `ConnectError` its
 * failure stands for.
 */
async function runIn(
  context: EnvdContext,
  handler: { signal: AbortSignal; timeoutMs(): number | undefined },
  argv: string[],
  path: string,
  maxBytes = LIST_BYTES,
): Promise<Uint8Array> {
  if (context.killed.aborted) throw new ConnectError("The sandbox was killed", Code.Unavailable);
  const deadline = handler.timeoutMs();
  let result;
  try {
    result = await context.sandbox.run(argv, {
      encoding: "bytes",
      // One byte past the cap says the listing did not fit.
      outputCap: Math.min(maxBytes + 1, 64 * 1024 * 1024),
      timeoutMs: deadline === undefined
        ? OP_TIMEOUT_MS
        : Math.min(Math.max(deadline, 1), OP_TIMEOUT_MS),
      signal: AbortSignal.any([handler.signal, context.killed]),
      env: { LC_ALL: "C" },
    });
  } catch (cause) {
    if (context.killed.aborted) throw new ConnectError("The sandbox was killed", Code.Unavailable);
    throw new ConnectError(
      `The sandbox could not run the filesystem command: ${
        cause instanceof Error ? cause.message : String(cause)
      }`,
      Code.Unavailable,
    );
  }
  if (result.stdoutTruncated || result.stdout.byteLength > maxBytes) {
    throw new ConnectError(
      `The listing of '${clientPath(path)}' is over ${maxBytes} bytes`,
      Code.ResourceExhausted,
    );
  }
  if (result.success) return result.stdout;
  throw commandFailure(result, path, context.killed);
}

function commandFailure(
  result: {
    exitCode: number | null;
    timedOut: boolean;
    cancelled: boolean;
    error: string | null;
    stderr: Uint8Array;
  },
  path: string,
  killed: AbortSignal,
): ConnectError {
  const named = clientPath(path);
  if (killed.aborted) return new ConnectError("The sandbox was killed", Code.Unavailable);
  if (result.timedOut) {
    return new ConnectError(`The operation on '${named}' timed out`, Code.DeadlineExceeded);
  }
  if (result.cancelled) {
    return new ConnectError(`The operation on '${named}' was cancelled`, Code.Canceled);
  }
  switch (result.exitCode) {
    case EXIT.notFound:
      return new ConnectError(`Path '${named}' not found`, Code.NotFound);
    case EXIT.exists:
      return new ConnectError(`Directory '${named}' already exists`, Code.AlreadyExists);
    case EXIT.denied:
      return new ConnectError(`Permission denied on '${named}'`, Code.PermissionDenied);
    case EXIT.notDirectory:
      return new ConnectError(`Path '${named}' is not a directory`, Code.InvalidArgument);
  }
  return errnoFailure(new TextDecoder().decode(result.stderr), named, result);
}

// The tools end their message with the system's error text (LC_ALL=C); the
// path, quoted, comes before it, so a name cannot pose as the error.
const ERRNO_CODES: [RegExp, Code, string][] = [
  [/: No such file or directory$/, Code.NotFound, "not found"],
  [/: Not a directory$/, Code.NotFound, "not found: a parent is not a directory"],
  [/: File exists$/, Code.AlreadyExists, "already exists"],
  [
    /: (Permission denied|Operation not permitted|Read-only file system)$/,
    Code.PermissionDenied,
    "permission denied",
  ],
  [
    /: (No space left on device|Disk quota exceeded)$/,
    Code.ResourceExhausted,
    "no space left in the sandbox",
  ],
  [
    /: Directory not empty$/,
    Code.FailedPrecondition,
    "the destination is a directory that is not empty",
  ],
  [/: Is a directory$/, Code.InvalidArgument, "is a directory"],
];

function errnoFailure(
  stderr: string,
  named: string,
  result: { exitCode: number | null; error: string | null },
): ConnectError {
  const last = stderr.trimEnd().split("\n").at(-1) ?? "";
  for (const [pattern, code, what] of ERRNO_CODES) {
    if (pattern.test(last)) return new ConnectError(`Path '${named}': ${what}`, code);
  }
  const said = escapeControls(last, { utf8: true }).slice(0, 300);
  return new ConnectError(
    `The operation on '${named}' failed in the sandbox (exit ${result.exitCode ?? "none"})${
      said ? `: ${said}` : result.error ? `: ${result.error}` : ""
    }`,
    Code.Internal,
  );
}

function removeFailure(cause: unknown, path: string): ConnectError {
  const message = cause instanceof Error ? cause.message : String(cause);
  if (cause instanceof FilesError) {
    // The files API's own messages start with the kind of failure.
    if (message.startsWith("No such file or directory")) {
      return new ConnectError(`Path '${path}' not found`, Code.NotFound);
    }
    if (message.startsWith("Permission denied")) {
      return new ConnectError(`Permission denied removing '${path}'`, Code.PermissionDenied);
    }
    if (message.startsWith("No space left")) {
      return new ConnectError(`No space left removing '${path}'`, Code.ResourceExhausted);
    }
    return new ConnectError(message, Code.Internal);
  }
  return new ConnectError(`Cannot remove '${path}': ${message}`, Code.Unavailable);
}

/** The one record a command about `path` printed. */
function single(out: Uint8Array, path: string): Listed {
  const [entry, ...more] = parseListing(out);
  if (entry === undefined || more.length > 0) {
    throw new ConnectError(
      `The sandbox's answer about '${clientPath(path)}' is malformed`,
      Code.Internal,
    );
  }
  return entry;
}

/**
 * find's records, checked field by field: the sandbox wrote them, so a bad
 * one is an error, never a guess.
 */
function parseListing(out: Uint8Array): Listed[] {
  const fields = new TextDecoder().decode(out).split("\0");
  if (fields.pop() !== "" || fields.length % FIELDS !== 0) {
    throw new ConnectError("The sandbox's listing is malformed", Code.Internal);
  }
  const listed: Listed[] = [];
  for (let at = 0; at < fields.length; at += FIELDS) {
    const [kind, size, mode, permissions, owner, group, mtime, target, path] = fields.slice(
      at,
      at + FIELDS,
    ) as [
      string,
      string,
      string,
      string,
      string,
      string,
      string,
      string,
      string,
    ];
    const time = /^(-?\d{1,15})(?:\.(\d{1,9})\d*)?$/.exec(mtime);
    if (
      !/^[a-zA-Z]$/.test(kind) || !/^\d{1,19}$/.test(size) || !/^[0-7]{1,6}$/.test(mode) ||
      time === null
    ) {
      throw new ConnectError("The sandbox's listing is malformed", Code.Internal);
    }
    listed.push({
      path,
      kind,
      size: BigInt(size),
      mode: parseInt(mode, 8),
      permissions,
      owner,
      group,
      mtime: { seconds: BigInt(time[1]!), nanos: Number((time[2] ?? "").padEnd(9, "0")) },
      target,
    });
  }
  return listed;
}

function fileType(kind: string): FileType {
  return kind === "f"
    ? FileType.FILE
    : kind === "d"
    ? FileType.DIRECTORY
    : kind === "l"
    ? FileType.SYMLINK
    : FileType.UNSPECIFIED;
}

/**
 * The entries with their metadata (E2B's file metadata, `files/metadata.ts`),
 * read inside the sandbox for the files and directories among them; a file
 * whose metadata is over the limits fails the call with the reason.
 */
async function entries(context: EnvdContext, listed: Listed[]): Promise<EntryInfo[]> {
  const withMetadata = listed.filter((entry) => entry.kind === "f" || entry.kind === "d");
  if (withMetadata.length === 0) return listed.map((entry) => toEntry(entry));
  if (context.killed.aborted) throw new ConnectError("The sandbox was killed", Code.Unavailable);
  let found: Record<string, string>[];
  try {
    found = await readMetadata(context.sandbox, withMetadata.map((entry) => entry.path), {
      shown: clientPath,
    });
  } catch (cause) {
    if (context.killed.aborted) throw new ConnectError("The sandbox was killed", Code.Unavailable);
    const message = cause instanceof Error ? cause.message : String(cause);
    throw new ConnectError(
      message,
      !(cause instanceof FilesError)
        ? Code.Unavailable
        : / is over \d+ bytes$/.test(message)
        ? Code.ResourceExhausted
        : Code.Internal,
    );
  }
  const byEntry = new Map(withMetadata.map((entry, i) => [entry, found[i]!]));
  return listed.map((entry) => toEntry(entry, byEntry.get(entry)));
}

function toEntry(listed: Listed, metadata: Record<string, string> = {}): EntryInfo {
  const path = clientPath(listed.path);
  return {
    name: basename(path) || path,
    type: fileType(listed.kind),
    path,
    size: listed.size,
    mode: listed.mode,
    permissions: listed.permissions,
    owner: listed.owner,
    group: listed.group,
    modifiedTime: listed.mtime,
    ...(listed.kind === "l" ? { symlinkTarget: linkTarget(listed) } : {}),
    metadata,
  };
}

// envd lists as a directory walk does: each directory's entries by name,
// each followed by what is under it (find's order is the directory's own).
function walkOrder(a: Listed, b: Listed): number {
  const left = a.path.split("/");
  const right = b.path.split("/");
  for (let i = 0; i < Math.min(left.length, right.length); i++) {
    if (left[i] !== right[i]) return left[i]! < right[i]! ? -1 : 1;
  }
  return left.length - right.length;
}

// envd reports a link's target as an absolute path: a relative one is read
// from the link's directory (as text: nothing is followed on the host).
function linkTarget(listed: Listed): string {
  const target = listed.target.startsWith("/")
    ? listed.target
    : `${dirname(listed.path)}/${listed.target}`;
  return clientPath(normalize(target));
}

/** One watched directory: its last listing, by path relative to it. */
interface Watch {
  /** The directory inside the sandbox. */
  root: string;
  /** Depth of the listing. */
  depth: number;
  /** Whether events carry the entry. */
  includeEntry: boolean;
  /** What the last listing saw: a signature per relative name. */
  seen: Map<string, string>;
  /** Ends the polling (client gone, sandbox killed, watcher removed). */
  stop: AbortSignal;
}

/** The watches of one sandbox: at most {@linkcode MAX_WATCHES}, polling watchers by id. */
class Watches {
  readonly #context: EnvdContext;
  readonly #open = new Set<Watch>();
  readonly #watchers = new Map<string, Watcher>();

  constructor(context: EnvdContext) {
    this.#context = context;
    context.killed.addEventListener("abort", () => {
      for (const watcher of this.#watchers.values()) watcher.stop.abort();
      this.#watchers.clear();
    }, { once: true });
  }

  /** Starts a watch: checks the directory and takes the first listing. */
  async open(
    handler: HandlerContext,
    request: { path: string; recursive: boolean; includeEntry: boolean },
    stop: AbortSignal,
  ): Promise<Watch> {
    if (this.#open.size >= MAX_WATCHES) {
      throw new ConnectError(
        `A sandbox may have ${MAX_WATCHES} watches at once`,
        Code.ResourceExhausted,
      );
    }
    const watch: Watch = {
      root: placePath(request.path),
      depth: request.recursive ? RECURSIVE_DEPTH : 1,
      includeEntry: request.includeEntry,
      seen: new Map(),
      stop: AbortSignal.any([stop, this.#context.killed]),
    };
    this.#open.add(watch);
    try {
      poll(watch, await listWatched(this.#context, handler, watch));
    } catch (error) {
      this.#open.delete(watch);
      throw error;
    }
    return watch;
  }

  close(watch: Watch): void {
    this.#open.delete(watch);
  }

  async createWatcher(
    handler: HandlerContext,
    request: { path: string; recursive: boolean; includeEntry: boolean },
  ): Promise<string> {
    // A watcher whose polling failed waits for its owner to ask; one asked
    // for by nobody goes after the idle time, and the rest count against the cap.
    for (const [id, watcher] of this.#watchers) {
      if (watcher.failure !== undefined && Date.now() - watcher.asked > WATCHER_IDLE_MS) {
        this.#watchers.delete(id);
      }
    }
    if (this.#watchers.size >= MAX_WATCHES) {
      throw new ConnectError(
        `A sandbox may have ${MAX_WATCHES} watchers at once`,
        Code.ResourceExhausted,
      );
    }
    const stop = new AbortController();
    const watch = await this.open(handler, request, stop.signal);
    const id = crypto.randomUUID();
    const watcher: Watcher = { watch, stop, events: [], asked: Date.now(), failure: undefined };
    this.#watchers.set(id, watcher);
    void this.#pollWatcher(id, watcher);
    return id;
  }

  async #pollWatcher(id: string, watcher: Watcher): Promise<void> {
    // Polls until removed, idle too long, or failing; its events wait for
    // GetWatcherEvents, the oldest dropped past WATCHER_EVENTS.
    const handler = { signal: watcher.watch.stop, timeoutMs: () => undefined };
    try {
      while (await pause(POLL_MS, watcher.watch.stop)) {
        if (Date.now() - watcher.asked > WATCHER_IDLE_MS) {
          this.removeWatcher(id);
          return;
        }
        const events = poll(
          watcher.watch,
          await listWatched(this.#context, handler, watcher.watch),
        );
        watcher.events.push(...events);
        if (watcher.events.length > WATCHER_EVENTS) {
          watcher.events.splice(0, watcher.events.length - WATCHER_EVENTS);
        }
      }
    } catch (error) {
      watcher.failure = error instanceof ConnectError ? error : ConnectError.from(error);
    } finally {
      this.close(watcher.watch);
    }
  }

  takeEvents(id: string): FsEvent[] {
    const watcher = this.#watchers.get(id);
    if (watcher === undefined) throw new ConnectError(`Watcher '${id}' not found`, Code.NotFound);
    watcher.asked = Date.now();
    const events = watcher.events.splice(0);
    if (events.length === 0 && watcher.failure !== undefined) {
      this.removeWatcher(id);
      throw watcher.failure;
    }
    return events;
  }

  removeWatcher(id: string): void {
    const watcher = this.#watchers.get(id);
    if (watcher === undefined) throw new ConnectError(`Watcher '${id}' not found`, Code.NotFound);
    this.#watchers.delete(id);
    watcher.stop.abort();
  }
}

/** A polling watcher (`CreateWatcher`): a watch whose events wait to be asked for. */
interface Watcher {
  watch: Watch;
  stop: AbortController;
  events: FsEvent[];
  /** When `GetWatcherEvents` last asked. */
  asked: number;
  /** Why the polling ended, told by the next `GetWatcherEvents`. */
  failure: ConnectError | undefined;
}

async function listWatched(
  context: EnvdContext,
  handler: { signal: AbortSignal; timeoutMs(): number | undefined },
  watch: Watch,
): Promise<Listed[]> {
  const listed = await listIn(context, handler, watch.root, {
    depth: watch.depth,
    maxBytes: WATCH_BYTES,
  });
  if (listed.length > WATCH_ENTRIES) {
    throw new ConnectError(
      `The watched directory '${clientPath(watch.root)}' has more than ${WATCH_ENTRIES} entries`,
      Code.ResourceExhausted,
    );
  }
  return listed;
}

/** The events between the watch's last listing and this one, which becomes the last. */
function poll(watch: Watch, listed: Listed[]): FsEvent[] {
  const events: FsEvent[] = [];
  const now = new Map<string, string>();
  const event = (name: string, type: EventType, entry?: Listed): FsEvent => ({
    name,
    type,
    ...(watch.includeEntry && entry !== undefined ? { entry: toEntry(entry) } : {}),
  });
  for (const entry of listed) {
    const name = entry.path.slice(watch.root.length + (watch.root === "/" ? 0 : 1));
    const signature = `${entry.kind}|${entry.size}|${entry.mtime.seconds}.${entry.mtime.nanos}`;
    const full = `${signature}|${entry.mode}`;
    now.set(name, full);
    const before = watch.seen.get(name);
    if (before === undefined) {
      events.push(event(name, EventType.CREATE, entry));
      // A file that appeared with content was written, as inotify would say.
      if (entry.kind === "f" && entry.size > 0n) events.push(event(name, EventType.WRITE, entry));
    } else if (!before.startsWith(`${signature}|`)) {
      events.push(event(name, EventType.WRITE, entry));
    } else if (before !== full) {
      events.push(event(name, EventType.CHMOD, entry));
    }
  }
  for (const name of watch.seen.keys()) {
    if (!now.has(name)) events.push(event(name, EventType.REMOVE));
  }
  watch.seen = now;
  return events;
}

/** `WatchDir`'s events after `start`, with a keepalive while idle, until the client or the sandbox goes. */
async function* watchStream(
  context: EnvdContext,
  watch: Watch,
  handler: HandlerContext,
): AsyncGenerator<WatchMessage> {
  const keepaliveMs =
    (Number(handler.requestHeader.get("keepalive-ping-interval")) || DEFAULT_KEEPALIVE_S) *
    1000;
  let sent = Date.now();
  while (await pause(POLL_MS, watch.stop)) {
    const listed = await listWatched(context, handler, watch).catch((error) => {
      if (watch.stop.aborted) return undefined;
      throw error;
    });
    if (listed === undefined) break;
    for (const event of poll(watch, listed)) {
      yield { event: { case: "filesystem", value: event } };
      sent = Date.now();
    }
    if (Date.now() - sent >= keepaliveMs) {
      yield { event: { case: "keepalive", value: {} } };
      sent = Date.now();
    }
  }
  if (context.killed.aborted) throw new ConnectError("The sandbox was killed", Code.Unavailable);
}

/** Waits `ms`; false when `stop` aborted first (or already had). */
function pause(ms: number, stop: AbortSignal): Promise<boolean> {
  if (stop.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      stop.removeEventListener("abort", done);
      resolve(true);
    }, ms);
    stop.addEventListener("abort", done, { once: true });
  });
}
