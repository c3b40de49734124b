/**
 * What `waffle exec` (and `wait`, the same module) loads: for a sandbox
 * without egress, no egress and no MCP module; and the layers of `lib/`
 * (`deno task layers`): every import goes downward. Read from Deno's own
 * module graph (`deno info --json`), so the test sees exactly what a run
 * loads. Deterministic: nothing runs, no Docker.
 */
import assert from "node:assert/strict";

const REPO = new URL("../", import.meta.url).pathname;

interface Dependency {
  code?: { specifier: string };
  isDynamic?: boolean;
}

interface Graph {
  roots: string[];
  modules: { specifier: string; dependencies?: Dependency[] }[];
  redirects: Record<string, string>;
}

async function graphOf(entry: string): Promise<Graph> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "--config", `${REPO}deno.json`, `${REPO}${entry}`],
    cwd: REPO,
    env: { DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" },
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  return JSON.parse(new TextDecoder().decode(out.stdout));
}

// The repository files reachable from the root by code imports (type-only
// ones load nothing); a dynamic import is followed when `follow` says so.
function reachable(graph: Graph, follow: (target: string) => boolean): string[] {
  const byName = new Map(graph.modules.map((module) => [module.specifier, module]));
  const seen = new Set<string>();
  const stack = [...graph.roots];
  while (stack.length > 0) {
    const at = stack.pop()!;
    if (seen.has(at)) continue;
    seen.add(at);
    for (const dependency of byName.get(at)?.dependencies ?? []) {
      const code = dependency.code?.specifier;
      if (code === undefined) continue;
      const target = graph.redirects[code] ?? code;
      if (dependency.isDynamic && !follow(target)) continue;
      stack.push(target);
    }
  }
  return [...seen].filter((specifier) => specifier.startsWith(`file://${REPO}`))
    .map((specifier) => specifier.slice(`file://${REPO}`.length)).sort();
}

const egressOrMcp = (path: string): boolean => /^lib\/(egress|mcp)\//.test(path);

Deno.test("waffle exec's static module graph holds no lib/egress or lib/mcp module", async () => {
  const loaded = reachable(await graphOf("lib/cli/exec.ts"), () => false);
  // The walk found the exec path itself.
  assert.ok(loaded.includes("lib/queue/queue.ts"), loaded.join("\n"));
  assert.deepEqual(loaded.filter(egressOrMcp), []);
});

Deno.test("waffle exec reaches lib/egress only through a dynamic import, and lib/mcp never", async () => {
  // Every dynamic import followed (a full ensure, the files API) but those
  // into lib/egress, which an attached sandbox alone makes.
  const graph = await graphOf("lib/cli/exec.ts");
  const loaded = reachable(graph, (target) => !target.includes("/lib/egress/"));
  assert.ok(loaded.includes("lib/lifecycle/ensure.ts"), loaded.join("\n"));
  assert.ok(loaded.includes("lib/docker/client.ts"), loaded.join("\n"));
  assert.deepEqual(loaded.filter(egressOrMcp), []);
});

Deno.test("deno task layers: every import between lib's folders goes downward, no circle", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-read", "--allow-run", `${REPO}scripts/layers.ts`],
    cwd: REPO,
    env: { DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" },
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.match(text, /^layers: 0 import\(s\) not downward, 0 circle\(s\) among units$/m, text);
  assert.equal(out.code, 0, text);
});
