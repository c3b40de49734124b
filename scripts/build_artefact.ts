/**
 * Builds waffle's artefact: `main.ts` and everything it imports, npm
 * packages included, bundled for the pinned Deno, which runs it as both the
 * CLI and the sandbox's runner.
 *
 * The CLI is a build directory (`lib/config/artefact_dir.ts`): the entry
 * `waffle.js`, the chunks esbuild splits off at each dynamic import, the
 * runner's heartbeat worker, and `SHA256SUMS`. A command parses only the
 * chunks it loads: one 2.6 MB script was parsed whole for every start, even
 * `--version`. The chunks' dynamic imports are rewritten to non-literal ones
 * (`import(new URL("./chunk.js", import.meta.url).href)`): Deno walks every
 * literal one ahead into an empty cache, a sandbox's first start included.
 *
 * The library (`lib/mod.ts`) stays one file, `mod.js`: other projects
 * import it, without `--allow-read` for chunks.
 *
 * docker-modem loads `ssh2` (and its native and WebAssembly parts) for
 * `ssh://` daemons, which waffle refuses anyway (`lib/docker/client.ts`):
 * the artefact replaces that `require` with a stub that throws, so no CLI
 * start pays for it and no native module is needed.
 *
 * Usage: deno run --allow-all scripts/build_artefact.ts OUTPUT [ENTRY]
 *   ENTRY main.ts (default): OUTPUT is the build directory to make (it must
 *   not exist); prints the name an install gives it (`waffle-<digest12>`).
 *   ENTRY lib/mod.ts: OUTPUT is the library's file.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { HEARTBEAT_BUNDLE } from "../runner/worker_name.ts";
import { ARTEFACT_ENTRY, buildDirName, SUMS_FILE, writeSums } from "../lib/config/artefact_dir.ts";

const [output, entry = "main.ts"] = Deno.args;
if (output === undefined || !output.startsWith("/")) {
  console.error("build_artefact: give the output as an absolute path");
  Deno.exit(2);
}
const repo = new URL("../", import.meta.url).pathname;
const BUNDLE_FLAGS = ["bundle", "--quiet", "--platform", "deno"];
const EXTERNALS = ["--external", "ssh2", "--external", "cpu-features"];

const STUB =
  `({ Client: class { constructor() { throw new Error("ssh:// Docker hosts are not supported"); } } })`;
const SSH2 = /__require\d*\("ssh2"\)/g;
// The bundle's `require` for npm code (docker-modem's CommonJS) comes from
// `node:module`, imported at the top: loading it costs ~35 ms of every
// start. Only CommonJS modules call it, and they initialise lazily, on the
// paths that talk to Docker through docker-modem: create it on first call.
const EAGER_REQUIRE =
  'import { createRequire as __deno_internal_createRequire } from "node:module";\n' +
  "var __require = __deno_internal_createRequire(import.meta.url);";
const LAZY_REQUIRE = "var __deno_internal_require;\n" +
  "var __require = (id) => (__deno_internal_require ??= globalThis.process" +
  '.getBuiltinModule("node:module").createRequire(import.meta.url))(id);';
// esbuild's chunk imports, as it writes them (a module's name may have a
// dot: the console's `assets.gen.ts` is the chunk `assets.gen-XXXX.js`).
const CHUNK_IMPORT = /\bimport\("(\.\/[A-Za-z0-9_.-]+\.js)"\)/g;

if (entry === "main.ts") await buildDirectory(output);
else await buildFile(output, entry);

// The CLI and runner: a directory of chunks.
async function buildDirectory(dir: string): Promise<void> {
  if (await exists(dir)) fail(`'${dir}' exists: give a new directory`);
  const temp = `${dir}.tmp`;
  await Deno.remove(temp, { recursive: true }).catch(() => {});
  await bundle(["--code-splitting", ...EXTERNALS, "--outdir", temp, "main.ts"]);
  await bundle(["-o", `${temp}/${HEARTBEAT_BUNDLE}`, "runner/heartbeat_worker.ts"]);
  const files: Record<string, string> = {};
  for await (const file of Deno.readDir(temp)) {
    if (!file.isFile || !file.name.endsWith(".js")) fail(`unexpected output '${file.name}'`);
    files[file.name] = await Deno.readTextFile(`${temp}/${file.name}`);
  }
  const patched = patchRequires(files);
  let imports = 0;
  for (const [name, text] of Object.entries(files)) {
    if (name === HEARTBEAT_BUNDLE) continue;
    const rewritten = text.replace(CHUNK_IMPORT, (_, chunk: string) => {
      if (files[chunk.slice(2)] === undefined) fail(`'${name}' imports '${chunk}', not built`);
      imports++;
      return `import(new URL(${JSON.stringify(chunk)}, import.meta.url).href)`;
    });
    // JSDoc types (`{import('net').Socket}`, undici's) are not imports.
    const code = rewritten.replace(/\/\*[\s\S]*?\*\//g, "");
    if (/\bimport\(\s*["'`]/.test(code)) fail(`'${name}' keeps a literal dynamic import`);
    files[name] = rewritten;
  }
  if (imports === 0) fail("the bundle has no dynamic chunk imports; update this script");
  if (files["main.js"] === undefined) fail("the bundle has no main.js");
  files[ARTEFACT_ENTRY] = files["main.js"]!;
  delete files["main.js"];
  await Deno.remove(temp, { recursive: true });
  await Deno.mkdir(temp, { mode: 0o755 });
  for (const [name, text] of Object.entries(files)) {
    await Deno.writeTextFile(`${temp}/${name}`, text, { mode: 0o644 });
  }
  const digest = writeSums(temp);
  await Deno.rename(temp, dir);
  const bytes = Object.values(files).reduce((sum, text) => sum + text.length, 0);
  console.error(
    `build_artefact: ${dir} (${Object.keys(files).length} files, ${
      (bytes / 1024).toFixed(0)
    } KiB, ${imports} chunk imports, ssh2 stubbed ×${patched}, ${SUMS_FILE} ${digest})`,
  );
  console.error(
    `build_artefact: what a start parses per lazily loaded module (files/KiB): ${
      closureReport(files)
    }`,
  );
  console.log(buildDirName(digest));
}

// Static import closures: what a start parses for each module loaded
// lazily (a command, or a piece such as `ensure`), e.g. `exec 42/470`, the
// entry's own closure included, so a change that pulls a large module into
// a hot command shows in the build's output.
function closureReport(files: Record<string, string>): string {
  const STATIC_IMPORT = /(?:\bfrom|\bimport)\s*"\.\/([A-Za-z0-9_.-]+\.js)"/g;
  const closure = (name: string): Set<string> => {
    const seen = new Set<string>();
    const todo = [name];
    for (let next = todo.pop(); next !== undefined; next = todo.pop()) {
      if (seen.has(next) || files[next] === undefined) continue;
      seen.add(next);
      for (const match of files[next]!.matchAll(STATIC_IMPORT)) todo.push(match[1]!);
    }
    return seen;
  };
  const kib = (names: Set<string>): string =>
    ([...names].reduce((sum, name) => sum + files[name]!.length, 0) / 1024).toFixed(0);
  const entry = closure(ARTEFACT_ENTRY);
  const commands = Object.keys(files)
    .filter((name) => /^[a-z_]+-[A-Z0-9]+\.js$/.test(name) && !name.startsWith("chunk-"))
    .map((name) => {
      const all = closure(name);
      for (const file of entry) all.add(file);
      return { command: name.replace(/-[A-Z0-9]+\.js$/, ""), all };
    })
    .sort((a, b) => a.command.localeCompare(b.command));
  return [
    `${ARTEFACT_ENTRY} ${entry.size}/${kib(entry)}`,
    ...commands.map(({ command, all }) => `${command} ${all.size}/${kib(all)}`),
  ].join(", ");
}

// The library: one self-contained ES module.
async function buildFile(file: string, from: string): Promise<void> {
  // It must end in .js: deno bundle adds its `require` for npm code only to JavaScript output.
  const bundled = `${file}.bundle.tmp.js`;
  await bundle([...EXTERNALS, "-o", bundled, from]);
  const files = { [file]: await Deno.readTextFile(bundled) };
  await Deno.remove(bundled);
  const patched = patchRequires(files);
  const temp = `${file}.tmp`;
  await Deno.writeTextFile(temp, files[file]!, { mode: 0o644 });
  await Deno.rename(temp, file);
  console.error(
    `build_artefact: ${file} (${
      (files[file]!.length / 1024).toFixed(0)
    } KiB, ssh2 stubbed ×${patched})`,
  );
}

async function bundle(args: string[]): Promise<void> {
  const built = await new Deno.Command(Deno.execPath(), {
    args: [...BUNDLE_FLAGS, ...args],
    cwd: repo,
    env: { DENO_NO_UPDATE_CHECK: "1" },
  }).output();
  if (!built.success) fail(`deno bundle failed: ${new TextDecoder().decode(built.stderr)}`);
}

// The lazy `require` and the ssh2 stub, over every file of the bundle, in
// place: the shim is in exactly one file, ssh2 required at least once.
function patchRequires(files: Record<string, string>): number {
  const shims = Object.values(files).filter((text) => text.includes(EAGER_REQUIRE)).length;
  if (shims !== 1) fail(`the bundle's require shim changed (${shims} found); update this script`);
  let ssh2 = 0;
  for (const [name, text] of Object.entries(files)) {
    ssh2 += text.match(SSH2)?.length ?? 0;
    files[name] = text.replace(EAGER_REQUIRE, LAZY_REQUIRE).replace(SSH2, STUB);
  }
  if (ssh2 === 0) fail("the bundle no longer requires 'ssh2'; update this script");
  // Anything else left to a runtime require would fail where the artefact runs
  // (`debug` tries `supports-color` inside a try, and does without; so does
  // `ws`, the Kubernetes client's, with its native `bufferutil` and
  // `utf-8-validate`).
  const OPTIONAL = ["supports-color", "bufferutil", "utf-8-validate"];
  const left = Object.values(files).flatMap((text) =>
    [...text.matchAll(/__require\d*\("([^"]+)"\)/g)].map((m) => m[1]!)
  ).filter((name) => !name.startsWith("node:") && !isNodeBuiltin(name) && !OPTIONAL.includes(name));
  if (left.length > 0) fail(`unresolved requires in the bundle: ${[...new Set(left)].join(", ")}`);
  return ssh2;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

function fail(message: string): never {
  console.error(`build_artefact: ${message}`);
  Deno.exit(1);
}

function isNodeBuiltin(name: string): boolean {
  return [
    "assert",
    "buffer",
    "child_process",
    "crypto",
    "events",
    "fs",
    "http",
    "https",
    "net",
    "os",
    "path",
    "querystring",
    "stream",
    "string_decoder",
    "tls",
    "url",
    "util",
    "zlib",
    "dns",
    "tty",
  ].includes(name.split("/")[0]!);
}
