/**
 * `BorrowedStream` (`lib/mcp/borrowed_stream.ts`): a writer lends each chunk
 * to the reader and may reuse its memory only once the reader has asked for
 * the next one, so a server's stdout is relayed with no copy per chunk.
 */
import assert from "node:assert/strict";
import { BorrowedStream } from "../lib/mcp/borrowed_stream.ts";

// Lets every pending callback run (a settled promise's handlers included).
const settle = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 0));

Deno.test("BorrowedStream: hand() resolves only once the reader asked for the next chunk", async () => {
  const stream = new BorrowedStream();
  const reader = stream.readable.getReader();
  const buffer = new Uint8Array([1, 1]);
  let handed = false;
  const first = stream.hand(buffer).then(() => handed = true);
  const read = await reader.read();
  assert.deepEqual(read.value, new Uint8Array([1, 1]));
  await settle();
  // The reader holds the chunk: the writer must not touch the buffer yet.
  assert.equal(handed, false);
  const next = reader.read();
  await first;
  buffer.fill(2);
  const second = stream.hand(buffer);
  assert.deepEqual((await next).value, new Uint8Array([2, 2]));
  const end = reader.read();
  await second;
  stream.close();
  assert.equal((await end).done, true);
});

Deno.test("BorrowedStream: a reader that cancels fails the writer's pending and later hands", async () => {
  const stream = new BorrowedStream();
  const reader = stream.readable.getReader();
  const pending = stream.hand(new Uint8Array([1]));
  await reader.read();
  await reader.cancel();
  await assert.rejects(pending, /cancelled/);
  await assert.rejects(stream.hand(new Uint8Array([2])), /cancelled|ended/);
  stream.close();
});

Deno.test("BorrowedStream: nothing is read ahead of the reader", async () => {
  const stream = new BorrowedStream();
  let handed = 0;
  const writing = (async () => {
    for (let i = 0; i < 3; i++) {
      await stream.hand(new Uint8Array([i]));
      handed++;
    }
    stream.close();
  })();
  await settle();
  // No read yet: nothing was taken.
  assert.equal(handed, 0);
  const chunks: number[] = [];
  for await (const chunk of stream.readable) chunks.push(chunk[0]!);
  await writing;
  assert.deepEqual(chunks, [0, 1, 2]);
  assert.equal(handed, 3);
});
