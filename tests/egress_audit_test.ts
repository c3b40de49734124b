/**
 * The egress audit's bounds: a per-identity line budget with summary lines,
 * capped fields, and rotation that keeps one older file.
 *
 * @module
 */
import assert from "node:assert/strict";
import { AUDIT_LINES_PER_SECOND, EgressAudit, type EgressAuditLine } from "../lib/egress/audit.ts";

function line(destination: string): EgressAuditLine {
  return {
    time: new Date().toISOString(),
    tenant: "default",
    user: "alice",
    group: null,
    cron: null,
    server: null,
    method: "CONNECT",
    destination,
    port: 443,
    address: null,
    decision: "denied",
    reason: "test",
    secrets: [],
    bytesUp: 0,
    bytesDown: 0,
    durationMs: 0,
  };
}

function read(path: string): EgressAuditLine[] {
  return Deno.readTextFileSync(path).split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));
}

Deno.test("egress audit: past the budget, a second's further lines of one identity become one summary line", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const audit = new EgressAudit(`${dir}/egress.jsonl`);
    // At the start of a second, so the whole burst falls in it.
    await new Promise((resolve) => setTimeout(resolve, 1000 - (Date.now() % 1000)));
    for (let i = 0; i < 500; i++) audit.writeFor("s-a", line(`a${i}.test`));
    audit.writeFor("s-b", line("b.test"));
    await new Promise((resolve) => setTimeout(resolve, 1100));
    const lines = read(`${dir}/egress.jsonl`);
    const mine = lines.filter((l) => l.destination?.startsWith("a"));
    assert.equal(mine.length, AUDIT_LINES_PER_SECOND + 1);
    assert.equal(mine.at(-1)?.count, 500 - AUDIT_LINES_PER_SECOND);
    assert.equal(lines.filter((l) => l.destination === "b.test").length, 1);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("egress audit: no field is longer than 512 characters, and the file rotates keeping one older", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/egress.jsonl`;
    const audit = new EgressAudit(path, { maxBytes: 4096 });
    audit.write(line("x".repeat(100_000)));
    assert.ok(Deno.statSync(path).size < 1000);
    for (let i = 0; i < 100; i++) audit.write(line(`n${i}.test`));
    assert.ok(Deno.statSync(path).size <= 4096);
    assert.ok(Deno.statSync(`${path}.1`).size <= 4096);
    assert.equal(read(path).at(-1)?.destination, "n99.test");
    assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name).sort(), [
      "egress.jsonl",
      "egress.jsonl.1",
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
