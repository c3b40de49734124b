/**
 * One MCP client script, written once and run against any stdio server
 * command: the official SDK client (`StdioClientTransport`) drives every
 * feature `@modelcontextprotocol/server-everything` has and records a
 * transcript of what came back, one entry per feature. Run against the
 * server directly and through `waffle mcp run`, the two transcripts must be
 * equal (tests/mcp_differential_test.ts).
 *
 * The transcript keeps results whole and drops only what differs between
 * two runs of the same server on its own, each by {@linkcode normalize} or at
 * the one call that needs it (every such place says why):
 *
 * - `created at <time>` in the dynamic resources' text (and inside their
 *   base64 blobs): the server's clock, in its own locale and timezone;
 * - `taskId`, `createdAt`, `lastUpdatedAt`: a task's random id and its
 *   timestamps;
 * - an `elicitationId` that is a UUID: the URL elicitation's error path makes
 *   a random one (the script's own ids are not UUIDs and stay);
 * - `get-env`'s names and values: the server's environment (host or
 *   container), of which only the shape is kept;
 * - which level the simulated logger picks (`Math.random()`);
 * - a progress notification's `progressToken`: the SDK's id of the request,
 *   the client's own bookkeeping (that one request's progress shares one
 *   token is checked instead).
 *
 * Notifications are read off the wire, before the SDK: it consumes some
 * itself (progress) and drops a progress that lands in the same read as its
 * request's answer, which would make the transcript depend on how the bytes
 * happened to be chunked.
 *
 * Strings longer than {@linkcode COMPACT_CHARS} are replaced by their
 * length and SHA-256 so a failure's diff stays readable: a compaction, not a
 * normalization (equal digests mean equal strings).
 *
 * @module
 */
import { Client, type JSONRPCMessage } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { sha256 } from "@noble/hashes/sha2";
import { bytesToHex } from "@noble/hashes/utils";
import * as z from "zod";

/** The features, in the order the script runs them; each is one transcript entry. */
export const FEATURES = [
  "initialize",
  "listing",
  "roots",
  "tools",
  "list_changed",
  "resources",
  "prompts",
  "completion",
  "logging",
  "sampling",
  "elicitation",
  // Runs alongside the next two (it waits most of its 5 s): see BACKGROUND.
  "tasks",
  "progress",
  "cancellation",
  "ping",
  // Last: a relay that cannot carry 10 MiB may end the session here.
  "large_result",
] as const;

/** One feature's name. */
export type Feature = typeof FEATURES[number];

/** What the script recorded: one normalized entry per feature (`{ error }` when it failed). */
export type Transcript = Record<Feature, unknown>;

/**
 * The one feature that runs while the next ones do: `tasks` spends most of
 * its time waiting on the server's stages, as `progress` and
 * `cancellation` do on theirs. Neither of those looks at what `tasks`
 * changes (task status notifications, the elicitation it carries), so
 * their transcripts do not depend on the overlap.
 */
const BACKGROUND = { feature: "tasks", joinBefore: "ping" } as const satisfies {
  feature: Feature;
  joinBefore: Feature;
};

/** How to start the server under test: a stdio command. */
export interface ServerCommand {
  /** The program. */
  command: string;
  /** Its arguments. */
  args: string[];
  /** Its whole environment. */
  env: Record<string, string>;
}

/** A finished run of the script. */
export interface ScriptRun {
  /** The normalized transcript. */
  transcript: Transcript;
  /** Every tool the script called (the test checks it covers every listed tool). */
  called: string[];
  /** The last lines the server process wrote on stderr, for a failure's message. */
  stderr: string;
  /** How long each feature took, for the test's output (never compared). */
  elapsedMs: Record<Feature, number>;
}

/** Strings longer than this are recorded as `{ sha256, length }`. */
export const COMPACT_CHARS = 2048;

/**
 * The 10 MiB step's message: 10 MiB less 512 bytes, because
 * server-everything's SDK (1.x) drops any incoming line over 10 MiB
 * (`ReadBuffer`'s default), so the request must fit under that; the result
 * (`Echo: ` + the message, in a JSON-RPC envelope) is then within a few
 * hundred bytes of 10 MiB.
 */
export const LARGE_MESSAGE: string = "0123456789abcdef".repeat((10 * 1024 * 1024 - 512) / 16);

/** The text `echo` answers {@linkcode LARGE_MESSAGE} with. */
export const LARGE_RESULT_TEXT: string = `Echo: ${LARGE_MESSAGE}`;

/** The client's own read limit: above the 10 MiB result (the SDK's default is exactly 10 MiB). */
const CLIENT_MAX_BUFFER_BYTES = 64 * 1024 * 1024;
/** Per request: long enough for a 10 MiB message through a sandbox, short enough to fail a step soon. */
const REQUEST_TIMEOUT_MS = 30_000;
/** How long a step waits for a notification or a server request it expects. */
const WAIT_MS = 10_000;

/** The roots the client advertises, then the list it changes to. */
const FIRST_ROOTS = [{ uri: "file:///work/differential", name: "differential" }];
const SECOND_ROOTS = [
  ...FIRST_ROOTS,
  { uri: "file:///work/differential/second", name: "second" },
];

/** The one answer of the client's "model". */
const SAMPLING_REPLY = {
  model: "differential-model",
  role: "assistant" as const,
  content: { type: "text" as const, text: "42, says the fixed reply" },
  stopReason: "endTurn",
};

/** The user's fixed answers to a form elicitation, by field name; a form gets the fields it asks for. */
const FORM_ANSWERS: Record<string, unknown> = {
  name: "Ada Lovelace",
  check: true,
  firstLine: "It was a dark and stormy night.",
  email: "ada@example.com",
  homepage: "https://example.com/ada",
  birthdate: "1815-12-10",
  integer: 42,
  number: 3.14,
  untitledSingleSelectEnum: "Joey",
  untitledMultipleSelectEnum: ["Piano", "Drums"],
  titledSingleSelectEnum: "hero-3",
  titledMultipleSelectEnum: ["fish-2"],
  legacyTitledEnum: "pet-2",
  interpretation: "programming",
  favoriteColor: "Blue",
  agreeToTerms: true,
};

/** A gzip input that needs no network: a `data:` URL. */
const GZIP_DATA = `data:text/plain;base64,${btoa("waffle differential test\n".repeat(64))}`;

/** Any JSON object (results of methods the SDK has no typed surface for: tasks). */
const AnyObject = z.looseObject({});

/** A notification or a server request as the client saw it. */
interface Seen {
  method: string;
  params: unknown;
}

/** One connected client and everything it saw. */
class Session {
  /** Every notification the server sent, as it came off the wire (before the SDK). */
  readonly notifications: Seen[] = [];
  /** The id of every response the server sent. */
  readonly responses: unknown[] = [];
  /** Every request the server sent the client, as the handlers got it. */
  readonly serverRequests: Seen[] = [];
  /** The tools called. */
  readonly called = new Set<string>();
  /** The server's stderr, its last chunks. */
  readonly stderr: string[] = [];
  /** What the client answers roots/list with. */
  roots: { uri: string; name: string }[] = FIRST_ROOTS;
  readonly client: Client;
  readonly transport: StdioClientTransport;

  constructor(server: ServerCommand) {
    this.transport = new StdioClientTransport({
      command: server.command,
      args: server.args,
      env: server.env,
      stderr: "pipe",
      maxBufferSize: CLIENT_MAX_BUFFER_BYTES,
    });
    this.transport.stderr?.on("data", (chunk: Uint8Array) => {
      this.stderr.push(new TextDecoder().decode(chunk));
      if (this.stderr.length > 40) this.stderr.shift();
    });
    // Every message passes observe() first (see the module documentation):
    // the client sets onmessage when it connects.
    let deliver: StdioClientTransport["onmessage"];
    Object.defineProperty(this.transport, "onmessage", {
      get: () =>
        deliver === undefined ? undefined : (message: JSONRPCMessage): void => {
          this.observe(message);
          deliver?.(message);
        },
      set: (handler: StdioClientTransport["onmessage"]) => deliver = handler,
    });
    this.client = new Client({ name: "waffle-differential", version: "1.0.0" }, {
      capabilities: {
        sampling: {},
        elicitation: { form: {}, url: {} },
        roots: { listChanged: true },
        // Lets server-everything register its `-async` tools. The client
        // answers their requests at once (no task), which they accept.
        tasks: { requests: { sampling: { createMessage: {} }, elicitation: { create: {} } } },
      },
    });
    // Expected noise: a progress after its request's end, or after a cancellation.
    this.client.onerror = () => {};
    this.client.fallbackNotificationHandler = () => Promise.resolve();
    this.client.setRequestHandler("roots/list", (request) => {
      this.serverRequests.push({ method: request.method, params: request.params });
      return { roots: this.roots };
    });
    this.client.setRequestHandler("sampling/createMessage", (request) => {
      this.serverRequests.push({ method: request.method, params: request.params });
      return SAMPLING_REPLY;
    });
    this.client.setRequestHandler("elicitation/create", (request) => {
      this.serverRequests.push({ method: request.method, params: request.params });
      const params = request.params as { mode?: string; requestedSchema?: { properties?: object } };
      if (params.mode === "url") return { action: "accept" as const };
      const fields = Object.keys(params.requestedSchema?.properties ?? {});
      const content = Object.fromEntries(
        fields.filter((field) => field in FORM_ANSWERS).map((
          field,
        ) => [field, FORM_ANSWERS[field]]),
      );
      return {
        action: "accept" as const,
        content: content as Record<string, string | number | boolean | string[]>,
      };
    });
  }

  /** Records a message from the server. */
  observe(message: JSONRPCMessage): void {
    const fields = message as { id?: unknown; method?: unknown; params?: unknown };
    if (typeof fields.method === "string") {
      if (fields.id === undefined) {
        this.notifications.push({ method: fields.method, params: fields.params });
      }
    } else {
      this.responses.push(fields.id);
    }
  }

  /** Calls a tool, remembering that it was covered. */
  call(
    name: string,
    args: Record<string, unknown> = {},
    options: Parameters<Client["callTool"]>[1] = {},
  ): Promise<unknown> {
    this.called.add(name);
    return this.client.callTool({ name, arguments: args }, {
      timeout: REQUEST_TIMEOUT_MS,
      ...options,
    });
  }

  /** Sends a request the SDK has no typed method for, with any object as its result. */
  raw(method: string, params: Record<string, unknown>): Promise<Record<string, unknown>> {
    return this.client.request({ method, params }, AnyObject, { timeout: REQUEST_TIMEOUT_MS });
  }

  /** Where the notification and server request logs stand now. */
  mark(): { notifications: number; requests: number; responses: number } {
    return {
      notifications: this.notifications.length,
      requests: this.serverRequests.length,
      responses: this.responses.length,
    };
  }

  /** Notifications of these methods since `mark`. */
  notificationsSince(at: { notifications: number }, ...methods: string[]): Seen[] {
    return this.notifications.slice(at.notifications).filter((seen) =>
      methods.includes(seen.method)
    );
  }

  /** Server requests since `mark`. */
  requestsSince(at: { requests: number }): Seen[] {
    return this.serverRequests.slice(at.requests);
  }

  /** Waits (at most {@linkcode WAIT_MS}) until `check` holds; throws naming `what` otherwise. */
  async until(check: () => boolean, what: string): Promise<void> {
    const deadline = Date.now() + WAIT_MS;
    while (!check()) {
      if (Date.now() > deadline) throw new Error(`No ${what} within ${WAIT_MS} ms`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }
}

/**
 * Runs the script against one server: connects, runs every feature in
 * {@linkcode FEATURES} order (a failing feature is recorded as `{ error }`
 * and the next one still runs), closes.
 *
 * @example
 * ```ts ignore
 * const run = await runScript({ command: "mcp-server-everything", args: ["stdio"], env: {} });
 * console.log(Object.keys(run.transcript));
 * ```
 *
 * @param server The stdio command of the server (or of `waffle mcp run`).
 * @returns The normalized transcript, the tools called and the server's stderr tail.
 * @throws {Error} When the session cannot even start (`initialize` fails).
 */
export async function runScript(server: ServerCommand): Promise<ScriptRun> {
  const session = new Session(server);
  try {
    await session.client.connect(session.transport, { timeout: REQUEST_TIMEOUT_MS });
  } catch (error) {
    await session.client.close().catch(() => {});
    throw new Error(
      `Cannot initialize '${server.args.join(" ")}': ${describe(error)}\n` +
        session.stderr.join("").trim(),
    );
  }
  const transcript = {} as Transcript;
  const elapsedMs = {} as Record<Feature, number>;
  const record = async (feature: Feature): Promise<void> => {
    const started = Date.now();
    try {
      transcript[feature] = normalize(await STEPS[feature](session));
    } catch (error) {
      transcript[feature] = { error: describe(error) };
    }
    elapsedMs[feature] = Date.now() - started;
  };
  try {
    let background: Promise<void> | undefined;
    for (const feature of FEATURES) {
      if (feature === BACKGROUND.feature) {
        background = record(feature);
        continue;
      }
      if (feature === BACKGROUND.joinBefore) await background;
      await record(feature);
    }
  } finally {
    await session.client.close().catch(() => {});
  }
  return {
    transcript,
    called: [...session.called].sort(),
    stderr: session.stderr.join("").trim(),
    elapsedMs,
  };
}

const STEPS: Record<Feature, (session: Session) => Promise<unknown>> = {
  initialize(session): Promise<unknown> {
    const { client } = session;
    return Promise.resolve({
      protocolVersion: client.getNegotiatedProtocolVersion(),
      serverInfo: client.getServerVersion(),
      capabilities: client.getServerCapabilities(),
      instructions: client.getInstructions(),
    });
  },

  async listing(session): Promise<unknown> {
    const { client } = session;
    const tools = await client.listTools(undefined, { timeout: REQUEST_TIMEOUT_MS });
    // The server registers its client-dependent tools on `initialized`, one
    // `tools/list_changed` each, all before it answers the first request.
    const toolsListChanged = session.notificationsSince(
      { notifications: 0 },
      "notifications/tools/list_changed",
    ).length;
    return {
      tools: tools.tools,
      toolsListChanged,
      resources: (await client.listResources(undefined, { timeout: REQUEST_TIMEOUT_MS })).resources,
      resourceTemplates: (await client.listResourceTemplates(undefined, {
        timeout: REQUEST_TIMEOUT_MS,
      })).resourceTemplates,
      prompts: (await client.listPrompts(undefined, { timeout: REQUEST_TIMEOUT_MS })).prompts,
    };
  },

  async roots(session): Promise<unknown> {
    const isRootsLog = (count: number) => (seen: Seen): boolean =>
      seen.method === "notifications/message" &&
      String((seen.params as { data?: unknown }).data).startsWith(`Roots updated: ${count} `);
    // The server asks for the roots by itself 350 ms after `initialized`.
    await session.until(() => session.notifications.some(isRootsLog(1)), "first roots/list");
    const first = await session.call("get-roots-list");
    const at = session.mark();
    session.roots = SECOND_ROOTS;
    await session.client.sendRootsListChanged();
    await session.until(
      () => session.notifications.slice(at.notifications).some(isRootsLog(2)),
      "roots/list after roots/list_changed",
    );
    const second = await session.call("get-roots-list");
    return {
      first,
      second,
      requests: session.serverRequests.filter((seen) => seen.method === "roots/list"),
      logs: session.notifications.filter((seen) => isRootsLog(1)(seen) || isRootsLog(2)(seen)),
    };
  },

  async tools(session): Promise<unknown> {
    const env = await session.call("get-env");
    return {
      echo: await session.call("echo", { message: 'differential ☃ über \u{1F9C7} "quoted"' }),
      annotatedError: await session.call("get-annotated-message", { messageType: "error" }),
      annotatedSuccess: await session.call("get-annotated-message", { messageType: "success" }),
      annotatedDebugImage: await session.call("get-annotated-message", {
        messageType: "debug",
        includeImage: true,
      }),
      env: envShape(env),
      resourceLinks: await session.call("get-resource-links", { count: 4 }),
      resourceReferenceText: await session.call("get-resource-reference", {
        resourceType: "Text",
        resourceId: 2,
      }),
      resourceReferenceBlob: await session.call("get-resource-reference", {
        resourceType: "Blob",
        resourceId: 3,
      }),
      structuredNewYork: await session.call("get-structured-content", { location: "New York" }),
      structuredChicago: await session.call("get-structured-content", { location: "Chicago" }),
      structuredLosAngeles: await session.call("get-structured-content", {
        location: "Los Angeles",
      }),
      sum: await session.call("get-sum", { a: 2, b: 40.5 }),
      sumInvalid: await attempt(session.call("get-sum", { a: "two", b: 40 })),
      tinyImage: await session.call("get-tiny-image"),
      gzipResource: await session.call("gzip-file-as-resource", {
        name: "differential.txt.gz",
        data: GZIP_DATA,
        outputType: "resource",
      }),
      unknownTool: await attempt(session.call("no-such-tool")),
    };
  },

  async list_changed(session): Promise<unknown> {
    const at = session.mark();
    const link = await session.call("gzip-file-as-resource", {
      name: "listed.txt.gz",
      data: GZIP_DATA,
      outputType: "resourceLink",
    });
    await session.until(
      () => session.notificationsSince(at, "notifications/resources/list_changed").length > 0,
      "resources/list_changed",
    );
    const listed = await session.client.listResources(undefined, { timeout: REQUEST_TIMEOUT_MS });
    return {
      link,
      session: listed.resources.filter((resource) => resource.uri.includes("/session/")),
      notifications: session.notificationsSince(
        at,
        "notifications/resources/list_changed",
        "notifications/tools/list_changed",
        "notifications/prompts/list_changed",
      ),
    };
  },

  async resources(session): Promise<unknown> {
    const { client } = session;
    const read = (uri: string): Promise<unknown> =>
      attempt(client.readResource({ uri }, { timeout: REQUEST_TIMEOUT_MS }));
    const staticDocuments: Record<string, unknown> = {};
    const listed = await client.listResources(undefined, { timeout: REQUEST_TIMEOUT_MS });
    for (const resource of listed.resources) {
      if (resource.uri.includes("/static/")) {
        staticDocuments[resource.uri] = await read(resource.uri);
      }
    }
    const subscribed = "demo://resource/dynamic/text/1";
    const at = session.mark();
    const subscribe = await client.subscribeResource({ uri: subscribed }, {
      timeout: REQUEST_TIMEOUT_MS,
    });
    const start = await session.call("toggle-subscriber-updates");
    await session.until(
      () => session.notificationsSince(at, "notifications/resources/updated").length > 0,
      "resources/updated",
    );
    const stop = await session.call("toggle-subscriber-updates");
    const unsubscribe = await client.unsubscribeResource({ uri: subscribed }, {
      timeout: REQUEST_TIMEOUT_MS,
    });
    return {
      staticDocuments,
      dynamicText: await read("demo://resource/dynamic/text/5"),
      dynamicBlob: await read("demo://resource/dynamic/blob/6"),
      sessionResource: await read("demo://resource/session/differential.txt.gz"),
      badIndex: await read("demo://resource/dynamic/text/0"),
      unknown: await read("demo://resource/nowhere"),
      subscription: {
        subscribe,
        start,
        stop,
        unsubscribe,
        // The interval of updates is 5 s: only the one sent at once is certain.
        notifications: session.notificationsSince(
          at,
          "notifications/resources/updated",
          "notifications/message",
        ).slice(0, 3),
      },
    };
  },

  async prompts(session): Promise<unknown> {
    const get = (name: string, args?: Record<string, string>): Promise<unknown> =>
      attempt(session.client.getPrompt(
        args === undefined ? { name } : { name, arguments: args },
        { timeout: REQUEST_TIMEOUT_MS },
      ));
    return {
      simple: await get("simple-prompt"),
      argsBoth: await get("args-prompt", { city: "Portland", state: "Oregon" }),
      argsRequiredOnly: await get("args-prompt", { city: "Paris" }),
      completable: await get("completable-prompt", { department: "Engineering", name: "Alice" }),
      resourceText: await get("resource-prompt", { resourceType: "Text", resourceId: "7" }),
      resourceBlob: await get("resource-prompt", { resourceType: "Blob", resourceId: "8" }),
      resourceInvalid: await get("resource-prompt", { resourceType: "Audio", resourceId: "1" }),
      unknown: await get("no-such-prompt"),
    };
  },

  async completion(session): Promise<unknown> {
    const complete = (params: Parameters<Client["complete"]>[0]): Promise<unknown> =>
      attempt(session.client.complete(params, { timeout: REQUEST_TIMEOUT_MS }));
    const team = { type: "ref/prompt" as const, name: "completable-prompt" };
    return {
      department: await complete({ ref: team, argument: { name: "department", value: "S" } }),
      nameInContext: await complete({
        ref: team,
        argument: { name: "name", value: "" },
        context: { arguments: { department: "Engineering" } },
      }),
      nameWithoutContext: await complete({ ref: team, argument: { name: "name", value: "A" } }),
      resourceType: await complete({
        ref: { type: "ref/prompt", name: "resource-prompt" },
        argument: { name: "resourceType", value: "B" },
      }),
      templateVariable: await complete({
        ref: { type: "ref/resource", uri: "demo://resource/dynamic/text/{resourceId}" },
        argument: { name: "resourceId", value: "12" },
      }),
    };
  },

  async logging(session): Promise<unknown> {
    const { client } = session;
    const isSimulated = (seen: Seen): boolean =>
      seen.method === "notifications/message" &&
      /level[- ]message/.test(String((seen.params as { data?: unknown }).data));
    const debug = await client.setLoggingLevel("debug", { timeout: REQUEST_TIMEOUT_MS });
    const at = session.mark();
    const start = await session.call("toggle-simulated-logging");
    await session.until(
      () => session.notifications.slice(at.notifications).some(isSimulated),
      "simulated log message",
    );
    const stop = await session.call("toggle-simulated-logging");
    // Which level the simulated logger picks is random: keep that its data
    // names its level, not which one it is.
    const simulated = session.notifications.slice(at.notifications).filter(isSimulated)
      .slice(0, 1).map((seen) => {
        const { level, data, ...rest } = seen.params as { level: string; data: unknown };
        const named = String(data).toLowerCase().startsWith(level);
        return { ...rest, level: "<random>", data: named ? "<names its level>" : data };
      });
    // At "error" the server's info message about a subscription is not sent;
    // at "info" it is. Each arrives (or not) before the request's answer.
    const quiet = session.mark();
    const error = await client.setLoggingLevel("error", { timeout: REQUEST_TIMEOUT_MS });
    await client.subscribeResource({ uri: "demo://resource/dynamic/text/2" }, {
      timeout: REQUEST_TIMEOUT_MS,
    });
    const atError = session.notificationsSince(quiet, "notifications/message");
    const loud = session.mark();
    const info = await client.setLoggingLevel("info", { timeout: REQUEST_TIMEOUT_MS });
    await client.unsubscribeResource({ uri: "demo://resource/dynamic/text/2" }, {
      timeout: REQUEST_TIMEOUT_MS,
    });
    const atInfo = session.notificationsSince(loud, "notifications/message");
    return { debug, start, simulated, stop, error, atError, info, atInfo };
  },

  async progress(session): Promise<unknown> {
    const at = session.mark();
    const result = await session.call("trigger-long-running-operation", {
      duration: 1,
      steps: 4,
    }, { onprogress: () => {} });
    return { progress: progressSince(session, at), result };
  },

  async sampling(session): Promise<unknown> {
    const at = session.mark();
    const sync = await session.call("trigger-sampling-request", {
      prompt: "What is 6 x 7?",
      maxTokens: 16,
    });
    const asyncTool = await session.call("trigger-sampling-request-async", {
      prompt: "And 7 x 6?",
      maxTokens: 8,
    });
    return { sync, async: asyncTool, requests: session.requestsSince(at) };
  },

  async elicitation(session): Promise<unknown> {
    const at = session.mark();
    const url = "https://example.com/differential/consent";
    return {
      form: await session.call("trigger-elicitation-request"),
      url: await session.call("trigger-url-elicitation", { url, elicitationId: "differential-1" }),
      // The error path throws -32042 first; the same call again proceeds.
      urlErrorPath: await attempt(
        session.call("trigger-url-elicitation", {
          url,
          elicitationId: "differential-2",
          errorPath: true,
        }),
      ),
      urlRetry: await session.call("trigger-url-elicitation", {
        url,
        elicitationId: "differential-2",
        errorPath: true,
      }),
      async: await session.call("trigger-elicitation-request-async"),
      requests: session.requestsSince(at),
    };
  },

  async tasks(session): Promise<unknown> {
    const at = session.mark();
    const research = async (args: Record<string, unknown>): Promise<[unknown, string]> => {
      // The SDK's callTool() refuses a task for a result: the request goes raw.
      session.called.add("simulate-research-query");
      const created = await session.raw("tools/call", {
        name: "simulate-research-query",
        arguments: args,
        task: { ttl: 60_000 },
      });
      const taskId = (created as { task?: { taskId?: unknown } }).task?.taskId;
      if (typeof taskId !== "string") throw new Error(`No task: ${JSON.stringify(created)}`);
      return [created, taskId];
    };
    const [created, taskId] = await research({ topic: "python", ambiguous: true });
    // The task works until it needs the user, then waits for tasks/result to
    // carry its elicitation: polled until then, only the last answer kept.
    let waiting = await session.raw("tasks/get", { taskId });
    const deadline = Date.now() + WAIT_MS;
    while (waiting.status !== "input_required") {
      if (Date.now() > deadline) {
        throw new Error(`Task still ${waiting.status} after ${WAIT_MS} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
      waiting = await session.raw("tasks/get", { taskId });
    }
    const listed = await session.raw("tasks/list", {});
    const result = await session.raw("tasks/result", { taskId });
    const completed = await session.raw("tasks/get", { taskId });
    const statuses = session.notificationsSince(at, "notifications/tasks/status");
    const elicitations = session.requestsSince(at);
    // A second task, cancelled at once.
    const again = session.mark();
    const [second, secondId] = await research({ topic: "rust" });
    const cancel = await session.raw("tasks/cancel", { taskId: secondId });
    const cancelled = await session.raw("tasks/get", { taskId: secondId });
    return {
      created,
      waiting,
      listed,
      elicitations,
      result,
      completed,
      statuses,
      second,
      cancel,
      cancelled,
      secondStatuses: session.notificationsSince(again, "notifications/tasks/status"),
    };
  },

  async cancellation(session): Promise<unknown> {
    const at = session.mark();
    const controller = new AbortController();
    const reported: unknown[] = [];
    // The operation reports at 0.5 s and 1 s and answers at 1 s; the client
    // cancels at its first report.
    const cancelled = await attempt(
      session.call("trigger-long-running-operation", { duration: 1, steps: 2 }, {
        signal: controller.signal,
        onprogress: (update) => {
          reported.push(update);
          controller.abort(new Error("differential: the client cancelled"));
        },
      }),
    );
    // The SDK's progress token is the request's id: the cancelled call's.
    const cancelledId = (session.notificationsSince(at, "notifications/progress")[0]?.params as {
      progressToken?: unknown;
    } | undefined)?.progressToken;
    // Started after the cancellation, this answers after the cancelled call
    // would have: an answer to that one (the server not knowing it was
    // cancelled) would have come first.
    const after = await session.call("trigger-long-running-operation", {
      duration: 1.5,
      steps: 1,
    });
    return {
      reported,
      cancelled,
      after,
      // server-everything's operation does not stop: it still reports.
      progress: progressSince(session, at),
      answeredAfterCancel: session.responses.slice(at.responses).includes(cancelledId),
      ping: await session.client.ping({ timeout: REQUEST_TIMEOUT_MS }),
      echo: await session.call("echo", { message: "still here" }),
    };
  },

  async ping(session): Promise<unknown> {
    const pings: unknown[] = [];
    for (let i = 0; i < 3; i++) {
      pings.push(await session.client.ping({ timeout: REQUEST_TIMEOUT_MS }));
    }
    return { pings };
  },

  async large_result(session): Promise<unknown> {
    const result = await session.call("echo", { message: LARGE_MESSAGE }) as {
      content?: { type: string; text?: string }[];
    };
    const text = result.content?.[0]?.text ?? "";
    return {
      parts: result.content?.map((part) => part.type),
      length: text.length,
      sha256: digest(text),
    };
  },
};

/**
 * The progress notifications since `at`, without their token (the SDK's
 * request id, bookkeeping of the client); all of them must share one.
 */
function progressSince(session: Session, at: { notifications: number }): unknown[] {
  const seen = session.notificationsSince(at, "notifications/progress").map((notification) =>
    notification.params as { progressToken?: unknown }
  );
  const tokens = new Set(seen.map((params) => params.progressToken));
  if (tokens.size > 1) throw new Error(`Progress of ${tokens.size} requests: ${[...tokens]}`);
  return seen.map(({ progressToken: _, ...rest }) => rest);
}

/** `get-env`'s answer reduced to its shape: the environment itself is the host's or the container's. */
function envShape(result: unknown): unknown {
  const content = (result as { content?: { type: string; text?: string }[] }).content ?? [];
  let parsed: unknown;
  try {
    parsed = JSON.parse(content[0]?.text ?? "");
  } catch {
    parsed = undefined;
  }
  const isObject = parsed !== null && typeof parsed === "object" && !Array.isArray(parsed);
  return {
    parts: content.map((part) => part.type),
    objectOfStrings: isObject &&
      Object.values(parsed as object).every((value) => typeof value === "string"),
  };
}

/**
 * A promise's outcome as data: `{ result }` or `{ error }` with the error's
 * name, code, message and data.
 */
async function attempt(promise: Promise<unknown>): Promise<unknown> {
  try {
    return { result: await promise };
  } catch (error) {
    const { name, message, code, data } = error as {
      name?: string;
      message?: string;
      code?: unknown;
      data?: unknown;
    };
    return { error: { name, code, message, data } };
  }
}

function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

function digest(text: string): string {
  return bytesToHex(sha256(new TextEncoder().encode(text)));
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
// textResource()/blobResource() end their text with `toLocaleTimeString()`.
const CREATED_AT = /(created at ).+$/;

/**
 * The transcript form of a value: JSON-shaped, with what differs between two
 * runs of the same server replaced (see the module documentation) and long
 * strings compacted.
 *
 * @param value Anything JSON-like.
 * @returns The normalized copy.
 */
export function normalize(value: unknown, key = ""): unknown {
  if (typeof value === "string") {
    if (key === "taskId") return "<task-id>";
    if (key === "createdAt" || key === "lastUpdatedAt") return "<time>";
    if (key === "elicitationId" && UUID.test(value)) return "<uuid>";
    if (key === "blob") return normalizeBlob(value);
    const text = value.replace(CREATED_AT, "$1<time>");
    return text.length > COMPACT_CHARS ? { sha256: digest(text), length: text.length } : text;
  }
  if (Array.isArray(value)) return value.map((item) => normalize(item));
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(
      Object.entries(value).filter(([, item]) => item !== undefined).map((
        [name, item],
      ) => [name, normalize(item, name)]),
    );
  }
  return value;
}

// A dynamic blob is base64 of a text that ends with its creation time.
function normalizeBlob(blob: string): unknown {
  let text: string | undefined;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(
      Uint8Array.from(atob(blob), (char) => char.charCodeAt(0)),
    );
  } catch {
    text = undefined;
  }
  if (text !== undefined && CREATED_AT.test(text)) {
    return { base64Of: text.replace(CREATED_AT, "$1<time>") };
  }
  return blob.length > COMPACT_CHARS ? { sha256: digest(blob), length: blob.length } : blob;
}
