/**
 * What `waffle serve` says a sandbox costs: E2B's `getMetrics` through the
 * real JS SDK (a tenant sees only its own sandboxes), and the Prometheus
 * text of `GET /metrics`, parsed with an npm Prometheus text parser
 * (`parse-prometheus-text-format`). That parser folds a labelled
 * histogram's `_sum` and `_count` away, so those two are read by line.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox, SandboxNotFoundError } from "e2b";
import parsePrometheus from "parse-prometheus-text-format";
import { Histogram, prometheusText } from "../lib/serve/prometheus.ts";
import { sdk, sdkTest, type Served } from "./_serve_helpers.ts";
import { delay } from "./_helpers.ts";

interface Family {
  name: string;
  type: string;
  metrics: { value?: string; labels?: Record<string, string>; buckets?: Record<string, string> }[];
}

async function scrape(served: Served, key: string | undefined): Promise<Response> {
  return await fetch(`${served.url}/metrics`, {
    headers: key === undefined ? {} : { authorization: `Bearer ${key}` },
  });
}

function family(families: Family[], name: string): Family {
  const found = families.find((f) => f.name === name);
  assert.ok(found !== undefined, `no family '${name}'`);
  return found;
}

function lineValue(text: string, pattern: RegExp): number {
  const match = pattern.exec(text);
  assert.ok(match !== null, `no line ${pattern}`);
  return Number(match[1]);
}

// Cumulative buckets never go down, and +Inf holds every observation.
function assertHistogram(text: string, families: Family[], name: string, count: number): void {
  const buckets = family(families, name).metrics[0]?.buckets ?? {};
  // Ordered by bound: an object puts integer-like keys ("1", "5") first.
  const values = Object.entries(buckets)
    .map(([le, value]) => [le === "+Inf" ? Infinity : Number(le), Number(value)])
    .sort((x, y) => x[0]! - y[0]!)
    .map(([, value]) => value!);
  assert.ok(values.length >= 2);
  for (let i = 1; i < values.length; i++) assert.ok(values[i]! >= values[i - 1]!, name);
  assert.equal(Number(buckets["+Inf"]), count);
  assert.equal(lineValue(text, new RegExp(`^${name}_count\\{tenant="a"\\} (\\S+)$`, "m")), count);
  assert.ok(lineValue(text, new RegExp(`^${name}_sum\\{tenant="a"\\} (\\S+)$`, "m")) > 0);
}

Deno.test("prometheusText() writes histograms a Prometheus parser reads back", async () => {
  const create = new Histogram([0.5, 1, 5]);
  for (const seconds of [0.2, 0.7, 3, 9]) create.observe("a", seconds);
  create.observe("b", 1);
  const text = await prometheusText("a", {
    records: [],
    create,
    command: new Histogram([1]),
    latest: () => undefined,
    rootOf: () => "/nonexistent",
    egress: () => Promise.resolve(undefined),
    poolSizes: () => [{ template: "base", ready: 3, cap: 4 }],
  });
  const families = parsePrometheus(text) as Family[];
  const buckets = family(families, "waffle_sandbox_create_seconds").metrics[0]?.buckets;
  assert.deepEqual(buckets, { "0.5": "1", "1": "2", "5": "3", "+Inf": "4" });
  assert.equal(lineValue(text, /^waffle_sandbox_create_seconds_sum\{tenant="a"\} (\S+)$/m), 12.9);
  assert.equal(family(families, "waffle_pool_ready").metrics[0]?.value, "3");
  assert.equal(family(families, "waffle_pool_capacity").metrics[0]?.labels?.template, "base");
  assert.ok(!text.includes('tenant="b"'), "another tenant's series");
});

sdkTest("getMetrics gives a sandbox's samples to its tenant only", async (served) => {
  const sandbox = await Sandbox.create("base", {
    ...sdk(served, served.keys.a),
    timeoutMs: 120_000,
  });
  await sandbox.commands.run("head -c 40000000 /dev/urandom > /home/user/forty; sync");
  // Sampled every 5 s (and on a call when the newest is older): the write shows within a few.
  let metrics = await sandbox.getMetrics();
  for (let tries = 0; tries < 40 && (metrics.at(-1)?.diskUsed ?? 0) < 38_000_000; tries++) {
    await delay(500);
    metrics = await sandbox.getMetrics();
  }
  assert.ok(metrics.length >= 1);
  const last = metrics.at(-1)!;
  assert.ok(last.timestamp instanceof Date && !Number.isNaN(last.timestamp.getTime()));
  assert.ok(last.cpuCount >= 1);
  assert.ok(last.cpuUsedPct >= 0 && last.cpuUsedPct <= 110);
  assert.ok(last.memUsed > 0 && last.memUsed < last.memTotal);
  assert.ok(last.diskUsed >= 38_000_000 && last.diskUsed <= last.diskTotal);
  // The static form, with a range: the same sandbox's samples, none in the future.
  const ranged = await Sandbox.getMetrics(sandbox.sandboxId, {
    ...sdk(served, served.keys.a),
    start: new Date(Date.now() - 3600_000),
    end: new Date(Date.now() + 60_000),
  });
  assert.ok(ranged.length >= metrics.length);
  const future = await Sandbox.getMetrics(sandbox.sandboxId, {
    ...sdk(served, served.keys.a),
    start: new Date(Date.now() + 3600_000),
  });
  assert.deepEqual(future, []);
  // Another tenant's key: not found, as for any of its routes.
  await assert.rejects(
    Sandbox.getMetrics(sandbox.sandboxId, sdk(served, served.keys.b)),
    SandboxNotFoundError,
  );
  const bad = await fetch(`${served.url}/sandboxes/${sandbox.sandboxId}/metrics?start=yesterday`, {
    headers: { "x-api-key": served.keys.a },
  });
  assert.equal(bad.status, 400);
  await bad.body?.cancel();
  await sandbox.kill();
});

sdkTest("GET /metrics counts a tenant's sandboxes, creates and commands", async (served) => {
  const a = sdk(served, served.keys.a);
  const first = await Sandbox.create("base", { ...a, timeoutMs: 120_000 });
  const second = await Sandbox.create("base", { ...a, timeoutMs: 120_000 });
  const other = await Sandbox.create("base", { ...sdk(served, served.keys.b), timeoutMs: 120_000 });
  await first.commands.run("true");
  await first.commands.run("sleep 0.3");
  await second.commands.run("echo hi");
  await other.commands.run("true");
  await second.pause();

  const refused = await scrape(served, undefined);
  assert.equal(refused.status, 401);
  await refused.body?.cancel();

  const response = await scrape(served, served.keys.a);
  assert.equal(response.status, 200);
  assert.match(response.headers.get("content-type") ?? "", /^text\/plain; version=0\.0\.4/);
  const text = await response.text();
  const families = parsePrometheus(text) as Family[];
  const states = Object.fromEntries(
    family(families, "waffle_sandboxes").metrics.map((m) => [m.labels?.state, Number(m.value)]),
  );
  assert.deepEqual(states, { creating: 0, running: 1, paused: 1 });
  assertHistogram(text, families, "waffle_sandbox_create_seconds", 2);
  assertHistogram(text, families, "waffle_command_seconds", 3);
  assert.equal(family(families, "waffle_sandboxes").type, "GAUGE");
  assert.equal(family(families, "waffle_sandbox_create_seconds").type, "HISTOGRAM");
  // Tenant b's sandbox and commands are nowhere in tenant a's scrape.
  assert.ok(!text.includes('tenant="b"'));
  assert.ok(!text.includes(other.sandboxId));
  for (const sandbox of [first, second, other]) await sandbox.kill();
});
