/**
 * Builds waffle's single artefact: `main.ts` and everything it imports,
 * npm packages included, bundled into one JavaScript file that the pinned
 * Deno runs as both the CLI and the sandbox's runner.
 *
 * docker-modem loads `ssh2` (and its native and WebAssembly parts) for
 * `ssh://` daemons, which waffle refuses anyway (`lib/docker/client.ts`):
 * the artefact replaces that `require` with a stub that throws, so no CLI
 * start pays for it and no native module is needed.
 *
 * Usage: deno run --allow-all scripts/build_artefact.ts OUTPUT [ENTRY]
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { HEARTBEAT_SOURCE } from "../runner/worker_name.ts";

// ENTRY: main.ts (the CLI and runner), or lib/mod.ts for the library bundle (`mod.js`).
const [output, entry = "main.ts"] = Deno.args;
if (output === undefined || !output.startsWith("/")) {
  console.error("build_artefact: give the output file as an absolute path");
  Deno.exit(2);
}
const repo = new URL("../", import.meta.url).pathname;
// It must end in .js: deno bundle adds its `require` for npm code only to JavaScript output.
const bundled = `${output}.bundle.tmp.js`;
const built = await new Deno.Command(Deno.execPath(), {
  args: [
    "bundle",
    "--quiet",
    "--platform",
    "deno",
    "--external",
    "ssh2",
    "--external",
    "cpu-features",
    "-o",
    bundled,
    entry,
  ],
  cwd: repo,
  env: { DENO_NO_UPDATE_CHECK: "1" },
}).output();
if (!built.success) {
  console.error(`build_artefact: deno bundle failed: ${new TextDecoder().decode(built.stderr)}`);
  Deno.exit(1);
}
const source = await Deno.readTextFile(bundled);
await Deno.remove(bundled);
// The runner's heartbeat thread gets its own few kilobytes (started from a
// blob URL), not a second copy of the whole artefact.
const workerFile = `${output}.worker.tmp.js`;
const worker = await new Deno.Command(Deno.execPath(), {
  args: ["bundle", "--quiet", "--platform", "deno", "-o", workerFile, "runner/heartbeat_worker.ts"],
  cwd: repo,
  env: { DENO_NO_UPDATE_CHECK: "1" },
}).output();
if (!worker.success) {
  console.error(
    `build_artefact: bundling the heartbeat worker failed: ${
      new TextDecoder().decode(worker.stderr)
    }`,
  );
  Deno.exit(1);
}
const workerSource = await Deno.readTextFile(workerFile);
await Deno.remove(workerFile);
const STUB =
  `({ Client: class { constructor() { throw new Error("ssh:// Docker hosts are not supported"); } } })`;
const needle = /__require\d*\("ssh2"\)/g;
const count = source.match(needle)?.length ?? 0;
if (count === 0) {
  console.error("build_artefact: the bundle no longer requires 'ssh2'; update this script");
  Deno.exit(1);
}
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
if (!source.includes(EAGER_REQUIRE)) {
  console.error("build_artefact: the bundle's require shim changed; update this script");
  Deno.exit(1);
}
const text = `globalThis.${HEARTBEAT_SOURCE} = ${JSON.stringify(workerSource)};\n` +
  source.replace(EAGER_REQUIRE, LAZY_REQUIRE).replace(needle, STUB);
// Anything else left to a runtime require would fail where the artefact runs
// (`debug` tries `supports-color` inside a try, and does without).
const OPTIONAL = ["supports-color"];
const left = [...text.matchAll(/__require\d*\("([^"]+)"\)/g)].map((m) => m[1]!)
  .filter((name) => !name.startsWith("node:") && !isNodeBuiltin(name) && !OPTIONAL.includes(name));
if (left.length > 0) {
  console.error(
    `build_artefact: unresolved requires in the bundle: ${[...new Set(left)].join(", ")}`,
  );
  Deno.exit(1);
}
const temp = `${output}.tmp`;
await Deno.writeTextFile(temp, text, { mode: 0o644 });
await Deno.rename(temp, output);
console.error(
  `build_artefact: ${output} (${(text.length / 1024).toFixed(0)} KiB, ssh2 stubbed ×${count})`,
);

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
