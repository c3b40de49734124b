/**
 * Checks that waffle's layers import downward only: every import (static,
 * dynamic or type-only) between two units of `lib/`, `runner/` and
 * `main.ts` must go to a unit of a lower rank. Prints each edge that goes
 * up or sideways and the import circles among units, and exits 1 when
 * there is one. The graph is Deno's own (`deno info --json`), so the check
 * sees exactly what a run loads.
 *
 * A unit is a folder of `lib/` (`lib/queue`), `runner`, `main.ts`, or one
 * of `lib/`'s own files (the base, rank 0, except those named in `RANKS`).
 *
 * Usage: deno task layers [--only UNIT,UNIT…] [--json]
 *        deno task layers --closure FILE
 *   --only     report only edges and circles among these units (e.g.
 *              lib/config,lib/lifecycle,lib/egress,lib/mcp)
 *   --json     the edges as JSON lines instead of text
 *   --closure  instead, what a run of FILE loads before its first dynamic
 *              import (e.g. lib/cli/exec.ts for `waffle exec`): its modules
 *              and their bytes of source by unit, npm packages and node:
 *              modules, and the lib/egress and lib/mcp modules among them
 *
 * @module
 */
// deno-lint-ignore-file no-console
import {
  type GraphModule,
  type ModuleGraph,
  moduleGraph,
  reachable,
  REPO_DIR,
} from "./_module_graph.ts";

/**
 * The layers, lowest first. A unit may import units of a lower rank only;
 * units of one rank are peers and may not import each other.
 */
const RANKS: readonly (readonly string[])[] = [
  ["lib/*"],
  ["lib/queue", "lib/docker", "lib/terminal", "lib/http"],
  ["lib/config"],
  ["lib/lifecycle", "lib/host_backend.ts", "runner"],
  ["lib/egress"],
  ["lib/files"],
  ["lib/sandbox"],
  ["lib/mcp"],
  ["lib/certify"],
  ["lib/k8s"],
  ["lib/serve"],
  ["lib/cli"],
  ["lib/mod.ts", "main.ts"],
];

/** One import between two units. */
interface Edge {
  from: string;
  to: string;
  fromUnit: string;
  toUnit: string;
  kind: "static" | "dynamic" | "type";
}

const repo = REPO_DIR;
const only = flagValue("--only")?.split(",").filter((unit) => unit !== "");
const asJson = Deno.args.includes("--json");
const rankOf = new Map<string, number>();
RANKS.forEach((units, rank) => units.forEach((unit) => rankOf.set(unit, rank)));
const closureOf = flagValue("--closure");
if (closureOf !== undefined) {
  printClosure(await infoOf(closureOf.startsWith("/") ? closureOf : `${repo}${closureOf}`));
  Deno.exit(0);
}

const files = [...walk(`${repo}lib`), ...walk(`${repo}runner`), `${repo}main.ts`];
// One root that imports every file, as a data: URL (no temporary file).
const root = `data:application/typescript,${
  encodeURIComponent(files.map((file) => `import ${JSON.stringify(`file://${file}`)};`).join("\n"))
}`;
const info = await infoOf(root);

const edges = collectEdges(info.modules);
const wanted = (edge: Edge): boolean =>
  only === undefined || (only.includes(edge.fromUnit) && only.includes(edge.toUnit));
const wrong = edges.filter((edge) => wanted(edge) && !downward(edge));
const circles = cyclesOf(edges.filter(wanted));

if (asJson) {
  for (const edge of wrong) console.log(JSON.stringify(edge));
} else {
  const byPair = Map.groupBy(wrong, (edge) => `${edge.fromUnit} -> ${edge.toUnit}`);
  for (const [pair, list] of [...byPair].sort(([a], [b]) => a.localeCompare(b))) {
    console.log(`${pair} (${list.length})`);
    for (const edge of list) console.log(`    ${edge.from} -> ${edge.to} [${edge.kind}]`);
  }
  for (const circle of circles) console.log(`circle among: ${circle.join(", ")}`);
  console.log(
    `layers: ${wrong.length} import(s) not downward, ${circles.length} circle(s) among units`,
  );
}
Deno.exit(wrong.length > 0 || circles.length > 0 ? 1 : 0);

// Deno's module graph of a root; exit 2 when it cannot be read.
async function infoOf(rootSpecifier: string): Promise<ModuleGraph> {
  try {
    return await moduleGraph(rootSpecifier);
  } catch (error) {
    console.error(`layers: ${error instanceof Error ? error.message : String(error)}`);
    Deno.exit(2);
  }
}

// What a run of the root loads before its first dynamic import: code
// imports only (a type-only one loads nothing).
function printClosure(graph: ModuleGraph): void {
  const byName = new Map(graph.modules.map((module) => [module.specifier, module]));
  const seen = reachable(graph);
  const local = [...seen].filter((specifier) => unitOf(specifier) !== undefined);
  const size = (specifier: string): number => byName.get(specifier)?.size ?? 0;
  const total = local.reduce((sum, specifier) => sum + size(specifier), 0);
  console.log(`${graph.roots[0]}: ${local.length} modules, ${total} bytes of source`);
  const byUnit = Map.groupBy(local, (specifier) => unitOf(specifier)!);
  for (const [unit, list] of [...byUnit].sort(([a], [b]) => a.localeCompare(b))) {
    const bytes = list.reduce((sum, specifier) => sum + size(specifier), 0);
    console.log(`    ${unit.padEnd(18)} ${String(list.length).padStart(3)} ${bytes}`);
  }
  const outside = [...seen].filter((s) => s.startsWith("npm:") || s.startsWith("node:")).sort();
  console.log(`npm and node: ${outside.join(" ") || "none"}`);
  const egressOrMcp = local.filter((s) => /^lib\/(egress|mcp)$/.test(unitOf(s)!)).sort();
  console.log(`lib/egress and lib/mcp: ${egressOrMcp.length}`);
  for (const specifier of egressOrMcp) {
    console.log(`    ${specifier.slice(`file://${repo}`.length)} ${size(specifier)}`);
  }
}

function flagValue(name: string): string | undefined {
  const at = Deno.args.indexOf(name);
  return at < 0 ? undefined : Deno.args[at + 1];
}

function walk(dir: string): string[] {
  const found: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) found.push(...walk(path));
    else if (entry.isFile && entry.name.endsWith(".ts")) found.push(path);
  }
  return found.sort();
}

// The unit a repository file belongs to; undefined outside lib/, runner/ and main.ts.
function unitOf(specifier: string): string | undefined {
  if (!specifier.startsWith(`file://${repo}`)) return undefined;
  const path = specifier.slice(`file://${repo}`.length);
  const parts = path.split("/");
  if (path === "main.ts") return "main.ts";
  if (parts[0] === "runner") return "runner";
  if (parts[0] !== "lib") return undefined;
  if (parts.length > 2) return `lib/${parts[1]}`;
  return rankOf.has(path) ? path : "lib/*";
}

function collectEdges(modules: GraphModule[]): Edge[] {
  const found: Edge[] = [];
  for (const module of modules) {
    const fromUnit = unitOf(module.specifier);
    if (fromUnit === undefined) continue;
    for (const dep of module.dependencies ?? []) {
      const target = dep.code?.specifier ?? dep.type?.specifier;
      if (target === undefined) continue;
      const toUnit = unitOf(target);
      if (toUnit === undefined || toUnit === fromUnit) continue;
      found.push({
        from: module.specifier.slice(`file://${repo}`.length),
        to: target.slice(`file://${repo}`.length),
        fromUnit,
        toUnit,
        kind: dep.isDynamic ? "dynamic" : dep.code === undefined ? "type" : "static",
      });
    }
  }
  return found;
}

function downward(edge: Edge): boolean {
  const from = rankOf.get(edge.fromUnit);
  const to = rankOf.get(edge.toUnit);
  // A unit RANKS does not name yet is reported, so a new folder gets a place.
  return from !== undefined && to !== undefined && to < from;
}

// The strongly connected components of more than one unit (Tarjan).
function cyclesOf(list: Edge[]): string[][] {
  const graph = new Map<string, Set<string>>();
  for (const edge of list) {
    if (!graph.has(edge.fromUnit)) graph.set(edge.fromUnit, new Set());
    graph.get(edge.fromUnit)!.add(edge.toUnit);
  }
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const components: string[][] = [];
  const visit = (unit: string): void => {
    index.set(unit, index.size);
    low.set(unit, index.get(unit)!);
    stack.push(unit);
    onStack.add(unit);
    for (const next of graph.get(unit) ?? []) {
      if (!index.has(next)) {
        visit(next);
        low.set(unit, Math.min(low.get(unit)!, low.get(next)!));
      } else if (onStack.has(next)) {
        low.set(unit, Math.min(low.get(unit)!, index.get(next)!));
      }
    }
    if (low.get(unit) === index.get(unit)) {
      const component: string[] = [];
      let top: string;
      do {
        top = stack.pop()!;
        onStack.delete(top);
        component.push(top);
      } while (top !== unit);
      if (component.length > 1) components.push(component.sort());
    }
  };
  for (const unit of [...graph.keys()].sort()) if (!index.has(unit)) visit(unit);
  return components;
}
