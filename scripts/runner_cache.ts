/**
 * Makes the runner cache beside an installed artefact: a Deno cache
 * (`DENO_DIR`) warmed by running the artefact exactly as a sandbox runs it,
 * at the same path (the build directory at `SANDBOX_ARTEFACT_DIR`, set up in
 * a private mount namespace, so nothing outside this process sees it) and
 * with the same V8 flags. Sandboxes mount it read-only as their runner's
 * `DENO_DIR` (`runnerCacheOf`), which spares each container start Deno's
 * analysis of the runner's modules into an empty cache. It needs root and
 * util-linux `unshare`; without them there is no cache and sandboxes start
 * with an empty one.
 *
 * The warm-up is a runner serving one request on a scratch queue, not just
 * its start: every module an idle sandbox's runner has loaded (its heartbeat
 * worker, what spawning a command and streaming its output load) must be in
 * the cache. Then Deno opens it once more, while it is writable (see the
 * script). A module missing from a read-only cache, or a cache Deno cannot
 * open read-only, is compiled in every container: an idle runner then held
 * ~7 MiB more (the allocator arenas of the threads that compiled) and
 * started ~90 ms later.
 *
 * Usage: deno run --allow-all scripts/runner_cache.ts ARTEFACT
 *   ARTEFACT: the installed build's entry, `…/lib/waffle/waffle-<digest12>/waffle.js`.
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { ARTEFACT_FLAGS, RUNNER_V8_FLAGS } from "../lib/config/self.ts";
import { ARTEFACT_ENTRY, installDirOf } from "../lib/config/artefact_dir.ts";
import { PROGRAM_DIR, SANDBOX_ARTEFACT_DIR } from "../lib/config/sandbox_paths.ts";
import { isDirectory, onPath } from "../lib/fs.ts";
import { Queue } from "../lib/queue/queue.ts";

const [artefact] = Deno.args;
if (artefact === undefined || !artefact.startsWith("/") || !artefact.endsWith(ARTEFACT_ENTRY)) {
  console.error(`runner_cache: give the installed build's ${ARTEFACT_ENTRY} as an absolute path`);
  Deno.exit(2);
}
const build = artefact.slice(0, artefact.lastIndexOf("/"));
const lib = installDirOf(artefact);
const cache = `${lib}/runner-cache`;
const temp = `${lib}/.runner-cache.${Deno.pid}`;
const parent = PROGRAM_DIR.slice(0, PROGRAM_DIR.lastIndexOf("/")) || "/";
const usable = Deno.uid() === 0 && onPath("unshare") && isDirectory(parent);
if (!usable) {
  await Deno.remove(cache, { recursive: true }).catch(() => {});
  console.error(
    `runner_cache: none (needs root, unshare and '${parent}'): sandboxes start with an empty Deno cache`,
  );
  Deno.exit(0);
}
await Deno.remove(temp, { recursive: true }).catch(() => {});
await Deno.mkdir(temp, { mode: 0o755 });
// A scratch queue with one request already in it: the runner serves it, then
// its idle exit ends the warm-up (long enough for its heartbeat worker to load).
const scratch = await Deno.makeTempDir({ prefix: "waffle-runner-cache-" });
const queue = Queue.open(`${scratch}/queue`, { create: true });
const warmUp = await queue.submit({ shell: "echo out; echo err >&2", stdin: new Uint8Array(1) });
await Deno.mkdir(`${scratch}/workspace`);
// $1 build, $2 Deno, $3 program dir, $4 the build's mount point, $5 its
// entry there, $6 the scratch directory, then the runner's Deno flags.
const script = `
mount -t tmpfs -o size=1m,mode=0755 waffle "${parent}"
mkdir -p "$3" "$4"; : >"$3/deno"
mount --bind -o ro "$1" "$4"
mount --bind -o ro "$2" "$3/deno"
deno="$3/deno"; entry="$5"; scratch="$6"
shift 6
export DENO_DIR="$CACHE" DENO_NO_UPDATE_CHECK=1
# Bounded: a runner that cannot serve (its reads keep failing) must not hang the install.
timeout 120 "$deno" "$@" "$entry" runner \
  --queue "$scratch/queue" --workspace "$scratch/workspace" --idle-exit 2 --log "$scratch/runner.log"
# Opened again while writable: Deno's upkeep on opening a filled cache (its
# statistics) is a write, and a read-only cache that still wants one is
# dropped for an empty one in memory: sandboxes would compile every module.
timeout 60 "$deno" "$@" "$entry" runner --help >/dev/null
`;
const made = await new Deno.Command("unshare", {
  args: [
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-ec",
    script,
    "sh",
    build,
    `${lib}/deno`,
    PROGRAM_DIR,
    SANDBOX_ARTEFACT_DIR,
    `${SANDBOX_ARTEFACT_DIR}/${ARTEFACT_ENTRY}`,
    scratch,
    ...ARTEFACT_FLAGS,
    RUNNER_V8_FLAGS,
  ],
  env: { CACHE: temp },
  stdin: "null",
  stdout: "inherit",
  stderr: "piped",
}).output();
const served = made.success && queue.state(warmUp).state === "done";
queue.close();
if (!served) {
  const log = await Deno.readTextFile(`${scratch}/runner.log`).catch(() => "");
  await Deno.remove(temp, { recursive: true }).catch(() => {});
  await Deno.remove(scratch, { recursive: true }).catch(() => {});
  const why = `${new TextDecoder().decode(made.stderr)}${log}`.trim() ||
    "its warm-up request was not served";
  console.error(`runner_cache: none: ${why}`);
  Deno.exit(0);
}
await Deno.remove(scratch, { recursive: true });
// World-readable (the runner is root without DAC capabilities), written by nobody else.
await new Deno.Command("chmod", { args: ["-R", "a+rX,go-w", temp] }).output();
await Deno.remove(cache, { recursive: true }).catch(() => {});
await Deno.rename(temp, cache);
console.error(`runner_cache: ${cache}`);
