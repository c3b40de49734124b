/**
 * The audits' incremental tail windows (lib/serve/audit_window.ts) on real
 * files: appended lines show on the next call and only they are parsed; a
 * partial last line written in two appends is parsed once whole; a rotation
 * (rename to `.1` + a new file) is followed and reuses the old file's
 * window; a truncated file and a file rewritten in place are read anew; a
 * FIFO is not opened; a cold read yields to the event loop; and, over
 * random appends, rotations and truncations with a small window, every
 * answer equals reading the tail whole (the algorithm before the windows).
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "../lib/path.ts";
import { AuditWindows } from "../lib/serve/audit_window.ts";
import { runProcess } from "./_helpers.ts";

/** A line's value: its `n`, or undefined when it is not `{"n":<int>}`. */
function parseN(line: string): number | undefined {
  try {
    const value = JSON.parse(line);
    return Number.isInteger(value?.n) ? value.n : undefined;
  } catch {
    return undefined;
  }
}

/** A parser that counts the lines it is given. */
function counting(): { parse: (line: string) => number | undefined; calls: string[] } {
  const calls: string[] = [];
  return { calls, parse: (line) => (calls.push(line), parseN(line)) };
}

const line = (n: number) => `{"n":${n}}\n`;

async function append(path: string, text: string): Promise<void> {
  await Deno.writeTextFile(path, text, { append: true });
}

/** The tail as read whole: the algorithm the windows replace (the oracle). */
function oracle(files: string[], maxBytes: number, maxLineChars: number): number[] {
  let budget = maxBytes;
  const chunks: string[][] = [];
  for (const path of files) {
    if (budget <= 0) break;
    let data: Uint8Array;
    try {
      if (!Deno.statSync(path).isFile) continue;
      data = Deno.readFileSync(path);
    } catch {
      continue;
    }
    const length = Math.min(data.length, budget);
    const cut = data.length > length;
    budget -= length;
    const lines = new TextDecoder().decode(data.subarray(data.length - length)).split("\n");
    if (cut) lines.shift();
    chunks.unshift(lines);
    if (cut) break;
  }
  return chunks.flat().flatMap((text) => {
    if (text.length === 0 || text.length > maxLineChars) return [];
    const value = parseN(text);
    return value === undefined ? [] : [value];
  });
}

Deno.test("audit window: appended lines show on the next call, and only they are parsed", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "log.jsonl");
    const { parse, calls } = counting();
    const windows = new AuditWindows(parse, { maxBytes: 1 << 20, maxLineChars: 1024 });
    assert.deepEqual(await windows.tail([path]), []);
    await append(path, line(1) + line(2) + "garbage\n");
    assert.deepEqual(await windows.tail([path]), [1, 2]);
    assert.equal(calls.length, 3);
    assert.deepEqual(await windows.tail([path]), [1, 2]);
    assert.equal(calls.length, 3, "an unchanged file is not parsed again");
    await append(path, line(3) + line(4));
    assert.deepEqual(await windows.tail([path]), [1, 2, 3, 4]);
    assert.deepEqual(calls.slice(3), ['{"n":3}', '{"n":4}']);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("audit window: a partial last line written in two appends is parsed once whole", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "log.jsonl");
    const { parse, calls } = counting();
    const windows = new AuditWindows(parse, { maxBytes: 1 << 20, maxLineChars: 1024 });
    await append(path, line(1) + '{"n":12');
    assert.deepEqual(await windows.tail([path]), [1]);
    await append(path, "34}\n" + line(5));
    assert.deepEqual(await windows.tail([path]), [1, 1234, 5]);
    assert.equal(calls.filter((text) => text === '{"n":1234}').length, 1);
    // A last line that is whole without its newline counts (as reading the tail whole did).
    await append(path, '{"n":6}');
    assert.deepEqual(await windows.tail([path]), [1, 1234, 5, 6]);
    await append(path, "7}\n");
    assert.deepEqual(await windows.tail([path]), [1, 1234, 5], '`{"n":6}7}` is invalid');
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("audit window: a rotation is followed and the old file's window reused", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "log.jsonl");
    const { parse, calls } = counting();
    const windows = new AuditWindows(parse, { maxBytes: 1 << 20, maxLineChars: 1024 });
    await append(path, line(1) + line(2));
    assert.deepEqual(await windows.tail([path, `${path}.1`]), [1, 2]);
    await Deno.rename(path, `${path}.1`);
    await append(path, line(3));
    assert.deepEqual(await windows.tail([path, `${path}.1`]), [1, 2, 3]);
    assert.deepEqual(
      calls,
      ['{"n":1}', '{"n":2}', '{"n":3}'],
      "the rotated file is not parsed again",
    );
    // Rotated again: the oldest is gone.
    await Deno.rename(path, `${path}.1`);
    await append(path, line(4));
    assert.deepEqual(await windows.tail([path, `${path}.1`]), [3, 4]);

    // A small window: the rotated file's unterminated last line, valid when it was the newest,
    // is cut off once the new file takes most of the window.
    const small = new AuditWindows(parseN, { maxBytes: 64, maxLineChars: 1024 });
    await Deno.remove(`${path}.1`);
    await Deno.writeTextFile(path, line(1) + '{"n":2}');
    assert.deepEqual(await small.tail([path, `${path}.1`]), [1, 2]);
    await Deno.rename(path, `${path}.1`);
    const newer = [100, 101, 102, 103, 104, 105];
    await append(path, newer.map(line).join(""));
    const expected = oracle([path, `${path}.1`], 64, 1024);
    assert.deepEqual(expected, newer);
    assert.deepEqual(await small.tail([path, `${path}.1`]), expected);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("audit window: a truncated file, and one rewritten in place, are read anew", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "log.jsonl");
    const windows = new AuditWindows(parseN, { maxBytes: 1 << 20, maxLineChars: 1024 });
    await append(path, line(1) + line(2) + line(3));
    assert.deepEqual(await windows.tail([path]), [1, 2, 3]);
    await Deno.truncate(path, 0);
    await append(path, line(9));
    assert.deepEqual(await windows.tail([path]), [9]);
    // Same inode, rewritten longer: its old end's bytes changed, so it is not an append.
    await Deno.writeTextFile(path, line(7) + line(8) + line(6));
    assert.deepEqual(await windows.tail([path]), [7, 8, 6]);
    // Same inode and size, rewritten.
    await Deno.writeTextFile(path, line(5) + line(4) + line(3));
    assert.deepEqual(await windows.tail([path]), [5, 4, 3]);
    // Same inode and size, rewritten with lines that differ only at their start.
    const padded = (n: number) => `{"n":${n},"pad":"${"x".repeat(300)}"}\n`;
    await Deno.writeTextFile(path, padded(10) + padded(11));
    assert.deepEqual(await windows.tail([path]), [10, 11]);
    await Deno.writeTextFile(path, padded(10) + padded(12));
    assert.deepEqual(await windows.tail([path]), [10, 12]);
    // Truncated and written longer, its old end's line (at the same offset) differing.
    await Deno.writeTextFile(path, padded(10) + padded(13) + padded(14));
    assert.deepEqual(await windows.tail([path]), [10, 13, 14]);
    // Gone, then a FIFO: nothing, and the FIFO is never opened (it would block).
    await Deno.remove(path);
    assert.deepEqual(await windows.tail([path]), []);
    await runProcess("mkfifo", [path]);
    assert.deepEqual(await windows.tail([path]), []);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("audit window: a cold read of a large tail lets timers run between its chunks", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "log.jsonl");
    const lines: string[] = [];
    for (let i = 0; i < 100_000; i++) lines.push(line(i));
    await Deno.writeTextFile(path, lines.join(""));
    const windows = new AuditWindows(parseN, { maxBytes: 8 << 20, maxLineChars: 1024 });
    let ticks = 0;
    let done = false;
    const tick = (): void => {
      ticks++;
      if (!done) setTimeout(tick, 0);
    };
    setTimeout(tick, 0);
    const values = await windows.tail([path]);
    done = true;
    assert.equal(values.length, 100_000);
    assert.ok(ticks >= 2, `a timer ran ${ticks} times during the read`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("audit window: random appends, rotations, truncations equal reading the tail whole", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "log.jsonl");
    const files = [path, `${path}.1`];
    const options = { maxBytes: 2048, maxLineChars: 40 };
    const windows = new AuditWindows(parseN, options);
    // A fixed seed: the same run every time (xorshift).
    let seed = 0x2545f491;
    const random = (n: number): number => {
      seed ^= seed << 13;
      seed ^= seed >>> 17;
      seed ^= seed << 5;
      return (seed >>> 0) % n;
    };
    const pieces = [
      () => line(random(1e6)),
      () => `{"n":${random(1e6)}`,
      () => "}\n",
      () => "\n",
      () => "junk\n",
      () => `{"n":${"1".repeat(30 + random(40))}}\n`,
      () => "é".repeat(random(50)) + "\n",
      () => "\ufeff" + line(random(9)),
    ];
    for (let step = 0; step < 1500; step++) {
      const action = random(100);
      if (action < 2) {
        try {
          await Deno.rename(path, `${path}.1`);
        } catch { /* nothing to rotate */ }
      } else if (action < 3) {
        await Deno.writeTextFile(path, "");
      } else if (action < 4) {
        // A big append: past the window at once.
        await append(path, Array.from({ length: 200 }, () => line(random(1e6))).join(""));
      } else {
        let text = "";
        for (let i = random(4); i >= 0; i--) text += pieces[random(pieces.length)]!();
        await append(path, text);
      }
      if (random(3) === 0 || step % 50 === 0) {
        assert.deepEqual(
          await windows.tail(files),
          oracle(files, options.maxBytes, options.maxLineChars),
          `step ${step}`,
        );
      }
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
