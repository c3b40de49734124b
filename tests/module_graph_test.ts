/**
 * What `waffle exec` (and `wait`, the same module) loads: for a sandbox
 * without egress, no egress and no MCP module; and the layers of `lib/`
 * (`deno task layers`): every import goes downward. Read from Deno's own
 * module graph (`deno info --json`), so the test sees exactly what a run
 * loads. Deterministic: nothing runs, no Docker.
 */
import assert from "node:assert/strict";
import { type ModuleGraph, moduleGraph, reachable, REPO_DIR } from "../scripts/_module_graph.ts";

const REPO = REPO_DIR;

async function graphOf(entry: string): Promise<ModuleGraph> {
  return await moduleGraph(`${REPO}${entry}`);
}

// The repository files a run of the root loads, as paths from the repository.
function loadedFiles(graph: ModuleGraph, follow?: (target: string) => boolean): string[] {
  return [...reachable(graph, follow)].filter((specifier) => specifier.startsWith(`file://${REPO}`))
    .map((specifier) => specifier.slice(`file://${REPO}`.length)).sort();
}

const egressOrMcp = (path: string): boolean => /^lib\/(egress|mcp)\//.test(path);

Deno.test("waffle exec's static module graph holds no lib/egress or lib/mcp module", async () => {
  const loaded = loadedFiles(await graphOf("lib/cli/exec.ts"));
  // The walk found the exec path itself.
  assert.ok(loaded.includes("lib/queue/queue.ts"), loaded.join("\n"));
  assert.deepEqual(loaded.filter(egressOrMcp), []);
});

Deno.test("waffle exec's and the runner's static graphs load no Node module but node:sqlite", async () => {
  // Deno initialises its Node compatibility on the first such import (about
  // 7 ms for node:path, 25 ms for node:net, measured): every call would pay.
  for (const entry of ["lib/cli/exec.ts", "lib/cli/runner.ts"]) {
    const node = [...reachable(await graphOf(entry))].filter((specifier) =>
      specifier.startsWith("node:") && specifier !== "node:sqlite"
    );
    assert.deepEqual(node, [], `${entry} loads ${node.join(", ")}`);
  }
});

Deno.test("waffle exec's and ps's static graphs hold no docker-modem: their GETs go without it", async () => {
  for (const entry of ["lib/cli/exec.ts", "lib/cli/fleet.ts"]) {
    const loaded = [...reachable(await graphOf(entry))];
    if (entry === "lib/cli/fleet.ts") {
      assert.ok(loaded.some((specifier) => specifier.endsWith("/lib/docker/client.ts")), entry);
    }
    const modem = loaded.filter((specifier) => specifier.includes("docker-modem"));
    assert.deepEqual(modem, [], `${entry} loads ${modem.join(", ")}`);
  }
});

Deno.test("waffle exec reaches lib/egress only through a dynamic import, and lib/mcp never", async () => {
  // Every dynamic import followed (a full ensure, the files API) but those
  // into lib/egress, which an attached sandbox alone makes.
  const graph = await graphOf("lib/cli/exec.ts");
  const loaded = loadedFiles(graph, (target) => !target.includes("/lib/egress/"));
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
