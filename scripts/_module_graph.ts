/**
 * Deno's own module graph (`deno info --json`) of a root, and what a run of
 * it loads: shared by `deno task layers` and `tests/module_graph_test.ts`,
 * so the check and the test read one graph the same way.
 *
 * @module
 */

/** One import of a module, as `deno info --json` gives it. */
export interface GraphDependency {
  specifier: string;
  code?: { specifier: string };
  type?: { specifier: string };
  isDynamic?: boolean;
}

/** One module of the graph. */
export interface GraphModule {
  specifier: string;
  size?: number;
  dependencies?: GraphDependency[];
}

/** A root's module graph. */
export interface ModuleGraph {
  roots: string[];
  modules: GraphModule[];
  redirects: Record<string, string>;
}

/** The repository's root directory, with a trailing slash. */
export const REPO_DIR = new URL("../", import.meta.url).pathname;

/**
 * Reads the module graph of a root with the repository's `deno.json`.
 *
 * @param rootSpecifier A file URL, an absolute path or a `data:` URL.
 * @returns The graph.
 * @throws {Error} When `deno info` fails, with its standard error.
 */
export async function moduleGraph(rootSpecifier: string): Promise<ModuleGraph> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "--config", `${REPO_DIR}deno.json`, rootSpecifier],
    cwd: REPO_DIR,
    env: { DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" },
  }).output();
  if (!out.success) {
    throw new Error(`deno info failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return JSON.parse(new TextDecoder().decode(out.stdout));
}

/**
 * The modules a run of the graph's roots loads, by code imports (a
 * type-only one loads nothing); a dynamic import is followed only when
 * `follow` says so.
 *
 * @param graph The graph.
 * @param follow Whether to follow a dynamic import of this specifier.
 * @returns The specifiers reached, roots included.
 */
export function reachable(
  graph: ModuleGraph,
  follow: (target: string) => boolean = () => false,
): Set<string> {
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
  return seen;
}
