/**
 * The Connect layer of `waffle serve` (lib/serve/connect.ts and the envd
 * schemas in lib/serve/gen/): a real `Deno.serve` on 127.0.0.1 with small
 * Process and Filesystem implementations, called by the client the e2b JS SDK
 * uses (connect-web, JSON) and by plain fetch, which checks the JSON the SDKs
 * put on and read from the wire.
 *
 * @module
 */
import assert from "node:assert/strict";
import { fromJson, type MessageInitShape as Init } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ConnectRouter, createClient } from "@connectrpc/connect";
import { createEnvelopeReadableStream, encodeEnvelope } from "@connectrpc/connect/protocol";
import { createConnectTransport } from "@connectrpc/connect-web";
import { connectHandler, type ConnectHandlerOptions } from "../lib/serve/connect.ts";
import {
  type ConnectResponseSchema,
  type ListResponseSchema,
  Process,
  type ProcessEvent,
  type SendSignalResponseSchema,
  Signal,
  type StartRequest,
  StartRequestSchema,
  type StartResponseSchema,
  type StreamInputResponseSchema,
} from "../lib/serve/gen/process/process_pb.ts";
import {
  type EntryInfoSchema,
  Filesystem,
  FileType,
  type StatResponseSchema,
} from "../lib/serve/gen/filesystem/filesystem_pb.ts";

const PID = 42;
// The longest the fake Start waits for the client to see its first output.
const FLUSH_WAIT_MS = 10_000;
// The body of a Start request exactly as the e2b SDK's commands.run sends it.
const SDK_START_JSON = {
  process: { cmd: "/bin/bash", args: ["-l", "-c", "echo hi"], envs: {}, cwd: "/home/user" },
  stdin: false,
};
const CONNECT_HEADERS = { "connect-protocol-version": "1" };
const STREAM_HEADERS = { ...CONNECT_HEADERS, "content-type": "application/connect+json" };
const UNARY_HEADERS = { ...CONNECT_HEADERS, "content-type": "application/json" };

/** What the fake services saw, and the gate of Start's second output. */
interface Fake {
  /** Resolved by the client once it has the first `data` event. */
  firstDataSeen: PromiseWithResolvers<void>;
  /** Whether Start sent its second output because the client saw the first. */
  releasedByClient?: boolean;
  /** Whether Connect's context.signal aborted when its client went away. */
  connectAborted: PromiseWithResolvers<boolean>;
  starts: StartRequest[];
  timeouts: (number | undefined)[];
}

function newFake(): Fake {
  return {
    firstDataSeen: Promise.withResolvers<void>(),
    connectAborted: Promise.withResolvers<boolean>(),
    starts: [],
    timeouts: [],
  };
}

function dataEvent(text: string): Init<typeof StartResponseSchema> {
  return {
    event: { event: { case: "data", value: { output: { case: "stdout", value: bytes(text) } } } },
  };
}

function bytes(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}

async function settledWithin(promise: Promise<void>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<boolean>((resolve) => timer = setTimeout(() => resolve(false), ms));
  try {
    return await Promise.race([promise.then(() => true), late]);
  } finally {
    clearTimeout(timer);
  }
}

function notFound(pid: number): ConnectError {
  return new ConnectError(`No process with pid '${pid}'`, Code.NotFound);
}

const ENTRY: Init<typeof EntryInfoSchema> = {
  name: "link",
  type: FileType.SYMLINK,
  path: "/home/user/link",
  size: 12n,
  mode: 0o777,
  permissions: "Lrwxrwxrwx",
  owner: "user",
  group: "user",
  modifiedTime: timestampFromDate(new Date("2024-05-01T12:00:00Z")),
  symlinkTarget: "/home/user/notes.txt",
  metadata: { origin: "test" },
};

function routes(fake: Fake): (router: ConnectRouter) => void {
  return (router) => {
    router.service(Process, {
      async *start(request): AsyncGenerator<Init<typeof StartResponseSchema>> {
        fake.starts.push(request);
        yield { event: { event: { case: "start", value: { pid: PID } } } };
        yield dataEvent("hi\n");
        fake.releasedByClient = await settledWithin(fake.firstDataSeen.promise, FLUSH_WAIT_MS);
        yield dataEvent("there\n");
        yield {
          event: {
            event: { case: "end", value: { exitCode: 3, exited: true, status: "exit status 3" } },
          },
        };
      },
      list(_request, context): Init<typeof ListResponseSchema> {
        fake.timeouts.push(context.timeoutMs());
        return {
          processes: [{
            config: { cmd: "/bin/bash", args: ["-l"], envs: { A: "1" }, cwd: "/home/user" },
            pid: PID,
            tag: "t1",
          }],
        };
      },
      sendSignal(request): Init<typeof SendSignalResponseSchema> {
        const selector = request.process?.selector;
        if (selector?.case !== "pid" || selector.value !== PID) {
          throw notFound(Number(selector?.value));
        }
        return {};
      },
      // Streams `start` for PID, then waits for the call to be aborted.
      async *connect(request, context): AsyncGenerator<Init<typeof ConnectResponseSchema>> {
        const selector = request.process?.selector;
        if (selector?.case !== "pid" || selector.value !== PID) {
          throw notFound(Number(selector?.value));
        }
        yield { event: { event: { case: "start", value: { pid: PID } } } };
        const aborted = new Promise<void>((resolve) =>
          context.signal.addEventListener("abort", () => resolve(), { once: true })
        );
        fake.connectAborted.resolve(await settledWithin(aborted, FLUSH_WAIT_MS));
      },
      async streamInput(requests): Promise<Init<typeof StreamInputResponseSchema>> {
        for await (const _ of requests) { /* drain */ }
        return {};
      },
    });
    router.service(Filesystem, {
      stat(request): Init<typeof StatResponseSchema> {
        if (request.path !== ENTRY.path) {
          throw new ConnectError(`No such path '${request.path}'`, Code.NotFound);
        }
        return { entry: ENTRY };
      },
    });
  };
}

/** A `Deno.serve` on 127.0.0.1 with the adapter; other paths answer 404. */
function startServer(
  fake: Fake,
  options: ConnectHandlerOptions = {},
): { baseUrl: string } & AsyncDisposable {
  const connect = connectHandler(routes(fake), options);
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    async (request) => await connect(request) ?? new Response("No route", { status: 404 }),
  );
  return {
    baseUrl: `http://127.0.0.1:${server.addr.port}`,
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

/** Posts enveloped JSON messages and returns the response's envelopes. */
async function streamCall(
  url: string,
  messages: unknown[],
): Promise<{ status: number; contentType: string | null; envelopes: [number, unknown][] }> {
  const body = messages.map((m) => encodeEnvelope(0, bytes(JSON.stringify(m))));
  const response = await fetch(url, {
    method: "POST",
    headers: STREAM_HEADERS,
    body: new Blob(body),
  });
  const envelopes: [number, unknown][] = [];
  for await (const { flags, data } of createEnvelopeReadableStream(response.body!)) {
    envelopes.push([flags, JSON.parse(new TextDecoder().decode(data))]);
  }
  return { status: response.status, contentType: response.headers.get("content-type"), envelopes };
}

Deno.test("connectHandler() streams Start's events to connect-web as they are produced", async () => {
  const fake = newFake();
  await using server = startServer(fake);
  const client = createClient(
    Process,
    createConnectTransport({ baseUrl: server.baseUrl, useBinaryFormat: false }),
  );
  const seen: string[] = [];
  let end: ProcessEvent["event"] | undefined;
  const stream = client.start(fromJson(StartRequestSchema, SDK_START_JSON), { timeoutMs: 60_000 });
  for await (const response of stream) {
    const event = response.event?.event;
    assert.ok(event !== undefined && event.case !== undefined, "every response has an event");
    if (event.case === "start") seen.push(`start ${event.value.pid}`);
    if (event.case === "data") {
      seen.push(`data ${new TextDecoder().decode(event.value.output.value)}`);
      fake.firstDataSeen.resolve();
    }
    if (event.case === "end") end = event;
  }
  assert.deepEqual(seen, [`start ${PID}`, "data hi\n", "data there\n"]);
  assert.equal(fake.releasedByClient, true, "the first data event reached the client alone");
  assert.ok(end?.case === "end");
  assert.equal(end.value.exitCode, 3);
  assert.equal(end.value.exited, true);
  assert.equal(end.value.status, "exit status 3");
  const [request] = fake.starts;
  assert.equal(request?.process?.cmd, "/bin/bash");
  assert.deepEqual(request.process.args, ["-l", "-c", "echo hi"]);
  assert.equal(request.stdin, false);
});

Deno.test("connectHandler() writes Start's events and end-stream as Connect JSON envelopes", async () => {
  const fake = newFake();
  fake.firstDataSeen.resolve();
  await using server = startServer(fake);
  const reply = await streamCall(`${server.baseUrl}/process.Process/Start`, [SDK_START_JSON]);
  assert.equal(reply.status, 200);
  assert.equal(reply.contentType, "application/connect+json");
  assert.deepEqual(reply.envelopes, [
    [0, { event: { start: { pid: PID } } }],
    [0, { event: { data: { stdout: btoa("hi\n") } } }],
    [0, { event: { data: { stdout: btoa("there\n") } } }],
    [0, { event: { end: { exitCode: 3, exited: true, status: "exit status 3" } } }],
    [2, {}],
  ]);
  // The server parsed the SDK's exact JSON into every field.
  const [request] = fake.starts;
  assert.deepEqual(request?.process?.args, SDK_START_JSON.process.args);
  assert.equal(request.process.cwd, "/home/user");
  assert.equal(request.stdin, false);
});

Deno.test("connectHandler() ends a failing stream with the error in the end-stream envelope", async () => {
  await using server = startServer(newFake());
  const reply = await streamCall(`${server.baseUrl}/process.Process/Connect`, [
    { process: { pid: 7 } },
  ]);
  assert.equal(reply.status, 200);
  assert.deepEqual(reply.envelopes, [
    [2, { error: { code: "not_found", message: "No process with pid '7'" } }],
  ]);
  const client = createClient(
    Process,
    createConnectTransport({ baseUrl: server.baseUrl, useBinaryFormat: false }),
  );
  await assert.rejects(
    async () => {
      for await (const _ of client.connect({ process: { selector: { case: "pid", value: 7 } } })) {
        // no event comes
      }
    },
    (error) => error instanceof ConnectError && error.code === Code.NotFound,
  );
});

Deno.test("connectHandler() aborts a stream's context.signal when its client goes away", async () => {
  const fake = newFake();
  await using server = startServer(fake);
  const client = createClient(
    Process,
    createConnectTransport({ baseUrl: server.baseUrl, useBinaryFormat: false }),
  );
  const abort = new AbortController();
  const events: string[] = [];
  await assert.rejects(async () => {
    const request = { process: { selector: { case: "pid" as const, value: PID } } };
    for await (const response of client.connect(request, { signal: abort.signal })) {
      events.push(response.event?.event.case ?? "none");
      abort.abort();
    }
  }, (error) => error instanceof ConnectError && error.code === Code.Canceled);
  assert.deepEqual(events, ["start"]);
  assert.equal(await fake.connectAborted.promise, true, "the handler saw the client go away");
});

Deno.test("connectHandler() answers unary errors as Connect JSON with a string code", async () => {
  await using server = startServer(newFake());
  const client = createClient(
    Process,
    createConnectTransport({ baseUrl: server.baseUrl, useBinaryFormat: false }),
  );
  await assert.rejects(
    client.sendSignal({
      process: { selector: { case: "pid", value: 7 } },
      signal: Signal.SIGKILL,
    }),
    (error) => error instanceof ConnectError && error.code === Code.NotFound,
  );
  // A known pid succeeds.
  await client.sendSignal({
    process: { selector: { case: "pid", value: PID } },
    signal: Signal.SIGKILL,
  });
  const response = await fetch(`${server.baseUrl}/process.Process/SendSignal`, {
    method: "POST",
    headers: UNARY_HEADERS,
    body: JSON.stringify({ process: { pid: 7 }, signal: "SIGNAL_SIGKILL" }),
  });
  assert.equal(response.status, 404);
  assert.equal(response.headers.get("content-type"), "application/json");
  assert.deepEqual(await response.json(), {
    code: "not_found",
    message: "No process with pid '7'",
  });
});

Deno.test("connectHandler() puts the proto3 JSON names of List and Stat on the wire", async () => {
  const fake = newFake();
  await using server = startServer(fake);
  const list = await fetch(`${server.baseUrl}/process.Process/List`, {
    method: "POST",
    headers: { ...UNARY_HEADERS, "connect-timeout-ms": "5000" },
    body: "{}",
  });
  assert.equal(list.status, 200);
  assert.deepEqual(await list.json(), {
    processes: [{
      config: { cmd: "/bin/bash", args: ["-l"], envs: { A: "1" }, cwd: "/home/user" },
      pid: PID,
      tag: "t1",
    }],
  });
  const stat = await fetch(`${server.baseUrl}/filesystem.Filesystem/Stat`, {
    method: "POST",
    headers: UNARY_HEADERS,
    body: JSON.stringify({ path: "/home/user/link" }),
  });
  assert.equal(stat.status, 200);
  assert.deepEqual(await stat.json(), {
    entry: {
      name: "link",
      type: "FILE_TYPE_SYMLINK",
      path: "/home/user/link",
      size: "12",
      mode: 0o777,
      permissions: "Lrwxrwxrwx",
      owner: "user",
      group: "user",
      modifiedTime: "2024-05-01T12:00:00Z",
      symlinkTarget: "/home/user/notes.txt",
      metadata: { origin: "test" },
    },
  });
  // The handler saw the deadline the client asked for.
  const [timeout] = fake.timeouts;
  assert.ok(timeout !== undefined && timeout > 0 && timeout <= 5000, `timeoutMs() ${timeout}`);
});

Deno.test("connectHandler() serves Filesystem.Stat to connect-web", async () => {
  await using server = startServer(newFake());
  const client = createClient(
    Filesystem,
    createConnectTransport({ baseUrl: server.baseUrl, useBinaryFormat: false }),
  );
  const { entry } = await client.stat({ path: "/home/user/link" });
  assert.equal(entry?.type, FileType.SYMLINK);
  assert.equal(entry.size, 12n);
  assert.equal(entry.modifiedTime?.seconds, BigInt(Date.UTC(2024, 4, 1, 12) / 1000));
  assert.equal(entry.symlinkTarget, "/home/user/notes.txt");
  await assert.rejects(
    client.stat({ path: "/nope" }),
    (error) => error instanceof ConnectError && error.code === Code.NotFound,
  );
});

Deno.test("connectHandler() leaves other paths to the caller", async () => {
  const connect = connectHandler(routes(newFake()));
  assert.equal(await connect(new Request("http://x/health")), undefined);
  assert.equal(
    await connect(new Request("http://x/process.Process/Nope", { method: "POST" })),
    undefined,
  );
});

Deno.test("connectHandler() caps request bodies, streamed ones as a whole", async () => {
  await using server = startServer(newFake(), { maxBodyBytes: 1024 });
  const unary = await fetch(`${server.baseUrl}/filesystem.Filesystem/Stat`, {
    method: "POST",
    headers: UNARY_HEADERS,
    body: JSON.stringify({ path: "x".repeat(4096) }),
  });
  assert.equal(unary.status, 429);
  assert.equal((await unary.json()).code, "resource_exhausted");
  // Each message is small; together they pass the cap.
  const input = { data: { input: { stdin: btoa("y".repeat(60)) } } };
  const reply = await streamCall(
    `${server.baseUrl}/process.Process/StreamInput`,
    Array.from({ length: 20 }, () => input),
  );
  assert.equal(reply.envelopes.length, 1);
  const [flags, end] = reply.envelopes[0]!;
  assert.equal(flags, 2);
  assert.equal((end as { error?: { code?: string } }).error?.code, "resource_exhausted");
});

Deno.test("connectHandler() refuses a maxBodyBytes that is not a positive integer", () => {
  assert.throws(
    () => connectHandler(() => {}, { maxBodyBytes: 0 }),
    new RangeError(
      "Cannot serve Connect as 'maxBodyBytes' must be an integer from 1 to 4294967295: current value is 0",
    ),
  );
});

Deno.test("StartRequestSchema parses the Start JSON the e2b SDK sends, every field set", () => {
  const request = fromJson(StartRequestSchema, SDK_START_JSON);
  assert.equal(request.process?.cmd, "/bin/bash");
  assert.deepEqual(request.process.args, ["-l", "-c", "echo hi"]);
  assert.deepEqual(request.process.envs, {});
  assert.equal(request.process.cwd, "/home/user");
  assert.equal(request.stdin, false);
  assert.equal(request.pty, undefined);
  assert.equal(request.tag, undefined);
  const pty = fromJson(StartRequestSchema, {
    process: { cmd: "/bin/bash", args: ["-i", "-l"], envs: { TERM: "xterm-256color" } },
    pty: { size: { cols: 80, rows: 24 } },
    tag: "t",
    stdin: true,
  });
  assert.deepEqual(pty.process?.envs, { TERM: "xterm-256color" });
  assert.equal(pty.process.cwd, undefined);
  assert.deepEqual([pty.pty?.size?.cols, pty.pty?.size?.rows, pty.tag, pty.stdin], [
    80,
    24,
    "t",
    true,
  ]);
});
