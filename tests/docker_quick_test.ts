/**
 * Requests to the Docker daemon without docker-modem (`lib/docker/quick_get.ts`)
 * and the client's use of them: a request that reached the daemon is never
 * sent again another way unless it is a GET, so a create or a start cannot
 * happen twice. Against real unix sockets played by the test (no Docker).
 */
import assert from "node:assert/strict";
import { DockerClient } from "../lib/docker/client.ts";
import { quickRequest } from "../lib/docker/quick_get.ts";
import { DockerError } from "../lib/errors.ts";

/** A socket that answers each connection with `answer` (after reading the request). */
async function fakeDaemon(
  answer: (request: string) => string | "close" | "hang",
): Promise<AsyncDisposable & { path: string; requests: string[] }> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-quick-" });
  const path = `${dir}/docker.sock`;
  const listener = Deno.listen({ transport: "unix", path });
  const requests: string[] = [];
  const held: Deno.Conn[] = [];
  const serving = (async () => {
    for await (const conn of listener) {
      const buffer = new Uint8Array(64 * 1024);
      const n = await conn.read(buffer).catch(() => null);
      const request = new TextDecoder().decode(buffer.subarray(0, n ?? 0));
      requests.push(request);
      const reply = answer(request);
      if (reply === "hang") {
        held.push(conn);
        continue;
      }
      if (reply !== "close") await conn.write(new TextEncoder().encode(reply)).catch(() => {});
      conn.close();
    }
  })();
  return {
    path,
    requests,
    async [Symbol.asyncDispose](): Promise<void> {
      listener.close();
      await serving.catch(() => {});
      for (const conn of held) conn.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

const unix = (path: string) => ({ kind: "unix", socketPath: path }) as const;

Deno.test("quickRequest says what became of a request: reply, unsent, unreadable, late", async () => {
  await using ok = await fakeDaemon(() => 'HTTP/1.0 201 Created\r\n\r\n{"Id":"abc"}');
  const reply = await quickRequest(unix(ok.path), {
    method: "POST",
    path: "/containers/create?name=x",
    body: '{"Image":"i"}',
  });
  assert.deepEqual(reply, { kind: "reply", reply: { status: 201, body: { Id: "abc" } } });
  assert.match(ok.requests[0]!, /^POST \/containers\/create\?name=x HTTP\/1\.0\r\n/);
  assert.match(ok.requests[0]!, /Content-Length: 13\r\n\r\n\{"Image":"i"\}$/);

  const missing = `/tmp/waffle-no-such-docker-${crypto.randomUUID()}.sock`;
  assert.equal(
    (await quickRequest(unix(missing), { method: "GET", path: "/_ping" })).kind,
    "unsent",
  );

  await using text = await fakeDaemon(() => "HTTP/1.0 200 OK\r\n\r\nOK");
  assert.equal(
    (await quickRequest(unix(text.path), { method: "GET", path: "/_ping" })).kind,
    "unreadable",
  );

  await using closing = await fakeDaemon(() => "close");
  assert.equal(
    (await quickRequest(unix(closing.path), { method: "POST", path: "/x/start", body: "{}" })).kind,
    "unreadable",
    "an empty reply is no HTTP",
  );

  await using hanging = await fakeDaemon(() => "hang");
  const late = await quickRequest(unix(hanging.path), {
    method: "POST",
    path: "/x/start",
    body: "{}",
  }, {
    timeoutMs: 100,
  });
  assert.equal(late.kind, "late");
});

Deno.test("a POST that reached the daemon is never sent twice: an unreadable reply is an error, not a retry", async () => {
  await using daemon = await fakeDaemon(() => "close");
  const docker = new DockerClient({ host: `unix://${daemon.path}`, timeoutMs: 2000 });
  const error = await docker.startContainer("abc").then(() => undefined, (caught) => caught);
  assert.ok(error instanceof DockerError, String(error));
  assert.match(
    error.message,
    /^Docker POST \/containers\/abc\/start at '.*' gave a reply that is not JSON after the request was sent$/,
  );
  assert.equal(daemon.requests.length, 1, "the start was sent again");
});

Deno.test("a GET whose reply this path cannot read goes through docker-modem, once more", async () => {
  // Plain-text replies (as /_ping's "OK") are read by docker-modem.
  await using daemon = await fakeDaemon(() =>
    "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nOK"
  );
  const docker = new DockerClient({ host: `unix://${daemon.path}`, timeoutMs: 5000 });
  await docker.ping();
  assert.equal(daemon.requests.length, 2);
  assert.match(daemon.requests[0]!, /^GET \/_ping HTTP\/1\.0/);
  assert.match(daemon.requests[1]!, /^GET \/_ping HTTP\/1\.1/);
});
