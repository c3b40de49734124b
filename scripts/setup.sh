#!/usr/bin/env bash
# Prepares a machine to develop and run waffle. Idempotent: every step checks
# first and only acts when something is missing, so it is safe to run often.
#
# Usage: scripts/setup.sh [--docker] [--images] [--force-image] [--conformance] [--browser]
#   (always)       Deno 2.9.6 at .tools/bin/deno (from the npm package `deno`),
#                  then `deno install` so node_modules is complete on disk (the
#                  runner container mounts it read-only and cannot fetch).
#                  Then the MCP package cache .tools/mcp-cache gets the servers the
#                  tests run (npm:@modelcontextprotocol/server-everything,
#                  server-memory and server-filesystem), world-readable for the
#                  sandbox's uid, unless they are cached already. And the
#                  browser console's assets (scripts/build_console.ts ->
#                  lib/serve/console/assets.gen.ts), rebuilt only when its
#                  inputs changed.
#   --docker       also: install docker.io via apt when dockerd is missing,
#                  start dockerd when the daemon does not answer, install gcc and
#                  the static C library via apt when missing (the image's spawn
#                  helper is compiled with them), build the runner image
#                  (scripts/build_image.sh) when missing or stale, build the
#                  runtime kit .tools/runtime (image/runtime_kit.sh: what any
#                  image needs to run waffle's runner), and print the daemon's
#                  version, arch, storage and cgroup driver.
#   --images       also: build the user-style images the tests run
#                  (scripts/build_images.sh all: Debian python/git, the base
#                  image `waffle serve` uses, musl, no shell).
#   --force-image  rebuild the runner image even when it is up to date.
#   --conformance  also: the official MCP conformance suite
#                  (@modelcontextprotocol/conformance) and the Node.js it needs
#                  (>= 22, from the npm package `node`) in .tools/conformance,
#                  unless both are there at their pinned versions.
#   --browser      also: Debian's Chromium (apt package `chromium`, at
#                  /usr/bin/chromium) for the console's browser tests, which
#                  drive it with playwright-core, unless it already answers.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
DENO_VERSION="2.9.6"
DENO="$REPO/.tools/bin/deno"
DOCKER_WAIT_SECONDS=60

with_docker=0
with_images=0
force_image=0
with_conformance=0
with_browser=0
for arg in "$@"; do
  case "$arg" in
    --docker) with_docker=1 ;;
    --images) with_images=1 ;;
    --force-image) force_image=1 ;;
    --conformance) with_conformance=1 ;;
    --browser) with_browser=1 ;;
    -h | --help)
      sed -n '2,31p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "setup: error: unknown argument '$arg'" >&2
      exit 2
      ;;
  esac
done

say() { printf 'setup: %s\n' "$*"; }
die() {
  printf 'setup: error: %s\n' "$*" >&2
  exit 1
}
is_root() { [[ "$(id -u)" == 0 ]]; }

deno_platform_package() {
  case "$(uname -m)" in
    x86_64 | amd64) echo "linux-x64-glibc" ;;
    aarch64 | arm64) echo "linux-arm64-glibc" ;;
    *) die "No Deno npm build for architecture '$(uname -m)'" ;;
  esac
}

ensure_deno() {
  local current
  current="$("$DENO" --version 2>/dev/null | head -n1 || true)"
  if [[ "$current" == "deno $DENO_VERSION "* ]]; then
    say "deno $DENO_VERSION already at $DENO"
    return
  fi
  [[ -z "$current" ]] || say "found '$current' at $DENO, want $DENO_VERSION"
  command -v npm >/dev/null 2>&1 || die "npm not found; install Node.js and npm first (apt-get install -y npm)"
  local platform
  platform="$(deno_platform_package)"
  say "npm install --prefix $REPO/.tools deno@$DENO_VERSION"
  mkdir -p "$REPO/.tools/bin"
  npm install --prefix "$REPO/.tools" --save-exact --include=optional --no-audit --no-fund \
    "deno@$DENO_VERSION"
  local binary="$REPO/.tools/node_modules/@deno/$platform/deno"
  [[ -x "$binary" ]] || die "npm did not install '$binary' (optional dependency @deno/$platform missing?)"
  # Relative link, so the checkout can move.
  ln -sfn "../node_modules/@deno/$platform/deno" "$DENO"
  current="$("$DENO" --version | head -n1)"
  [[ "$current" == "deno $DENO_VERSION "* ]] || die "$DENO reports '$current', want $DENO_VERSION"
  say "installed $current at $DENO"
}

ensure_node_modules() {
  say "deno install (populates $REPO/node_modules from deno.lock)"
  (cd "$REPO" && "$DENO" install)
  # The runner container sees node_modules read-only with an empty DENO_DIR and
  # no network: prove every npm import resolves under exactly those conditions.
  local scratch
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/waffle-setup-deno.XXXXXX")"
  # shellcheck disable=SC2016 # the script is TypeScript, for deno eval
  if (cd "$REPO" && DENO_DIR="$scratch" DENO_NO_UPDATE_CHECK=1 "$DENO" eval --quiet --cached-only \
    --node-modules-dir=manual --config "$REPO/deno.json" '
      const config = JSON.parse(Deno.readTextFileSync("deno.json"));
      const names = Object.entries(config.imports ?? {})
        .filter(([, target]) => String(target).startsWith("npm:")).map(([name]) => name);
      for (const name of names) await import(name);
      console.log(`setup: node_modules complete (${names.join(", ")} load offline)`);
    '); then
    rm -rf "$scratch"
  else
    rm -rf "$scratch"
    die "node_modules is incomplete: npm imports do not load with --cached-only"
  fi
}

# The browser console (`waffle serve`'s /ui): bundled from ui/ by Deno's
# esbuild into lib/serve/console/assets.gen.ts, which the server and the
# artefact import. The script skips the build when its inputs' stamp matches.
ensure_console() {
  (cd "$REPO" && DENO_NO_UPDATE_CHECK=1 "$DENO" run --allow-read --allow-write --allow-run \
    --allow-env scripts/build_console.ts) | sed 's/^console: /setup: console: /' ||
    die "Cannot build the console (scripts/build_console.ts)"
}

# The npm MCP servers the tests run, fetched once by the host's Deno into the
# cache that sandboxes mount read-only (they have no network to fetch it).
MCP_CACHE="$REPO/.tools/mcp-cache"
MCP_PACKAGES=(
  "npm:@modelcontextprotocol/server-everything@2026.8.31"
  "npm:@modelcontextprotocol/server-memory@2026.8.31"
  "npm:@modelcontextprotocol/server-filesystem@2026.8.31"
)

ensure_mcp_cache() {
  local spec name version
  for spec in "${MCP_PACKAGES[@]}"; do
    name="${spec#npm:}"
    version="${name##*@}"
    name="${name%@*}"
    # Deno extracts a package under a temporary name and renames it: a
    # package.json there means the package is complete.
    if [[ -f "$MCP_CACHE/npm/registry.npmjs.org/$name/$version/package.json" ]]; then
      say "$spec already in $MCP_CACHE"
      continue
    fi
    say "deno cache $spec (into $MCP_CACHE)"
    mkdir -p "$MCP_CACHE"
    (cd "$MCP_CACHE" && DENO_DIR="$MCP_CACHE" DENO_NO_UPDATE_CHECK=1 NO_COLOR=1 \
      "$DENO" cache --no-config "$spec") || die "Cannot fetch MCP package '$spec'"
  done
  # The sandbox's uid 10001 reads the cache through a read-only mount.
  chmod -R a+rX "$MCP_CACHE"
}

# The MCP conformance suite tests servers by URL (tests/mcp_serve_test.ts);
# it needs Node.js >= 22, which the npm package `node` ships (as a binary
# package from the registry, for this machine's architecture).
CONFORMANCE_DIR="$REPO/.tools/conformance"
CONFORMANCE_VERSION="0.1.16"
CONFORMANCE_NODE_VERSION="22.23.3"

conformance_ready() {
  local node="$CONFORMANCE_DIR/node_modules/.bin/node"
  local manifest="$CONFORMANCE_DIR/node_modules/@modelcontextprotocol/conformance/package.json"
  [[ "$("$node" --version 2>/dev/null)" == "v$CONFORMANCE_NODE_VERSION" ]] &&
    [[ -f "$manifest" ]] &&
    [[ "$("$node" -p "require('$manifest').version" 2>/dev/null)" == "$CONFORMANCE_VERSION" ]]
}

ensure_conformance() {
  if conformance_ready; then
    say "conformance $CONFORMANCE_VERSION and node $CONFORMANCE_NODE_VERSION already in $CONFORMANCE_DIR"
    return
  fi
  command -v npm >/dev/null 2>&1 || die "npm not found; install Node.js and npm first (apt-get install -y npm)"
  say "npm install --prefix $CONFORMANCE_DIR node@$CONFORMANCE_NODE_VERSION @modelcontextprotocol/conformance@$CONFORMANCE_VERSION"
  mkdir -p "$CONFORMANCE_DIR"
  npm install --prefix "$CONFORMANCE_DIR" --save-exact --no-audit --no-fund --loglevel=error \
    "node@$CONFORMANCE_NODE_VERSION" "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" ||
    die "Cannot install the MCP conformance suite into '$CONFORMANCE_DIR'"
  conformance_ready || die "The conformance suite in '$CONFORMANCE_DIR' does not run with node $CONFORMANCE_NODE_VERSION"
  "$CONFORMANCE_DIR/node_modules/.bin/node" "$CONFORMANCE_DIR/node_modules/.bin/conformance" --version >/dev/null ||
    die "'conformance --version' fails in '$CONFORMANCE_DIR'"
  say "installed conformance $CONFORMANCE_VERSION with node $CONFORMANCE_NODE_VERSION in $CONFORMANCE_DIR"
}

# The console's browser tests (tests/console_browser_test.ts) drive Debian's
# Chromium through playwright-core: no browser is downloaded by npm.
ensure_chromium() {
  if /usr/bin/chromium --version 2>/dev/null | grep -q '^Chromium '; then
    say "chromium: $(/usr/bin/chromium --version 2>/dev/null)"
    return
  fi
  is_root || die "Chromium is missing and installing it needs root (apt-get install -y chromium)"
  command -v apt-get >/dev/null 2>&1 || die "Chromium is missing and apt-get is not available"
  say "apt-get install -y chromium"
  DEBIAN_FRONTEND=noninteractive apt-get install -y chromium ||
    {
      DEBIAN_FRONTEND=noninteractive apt-get update &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
    } ||
    die "Could not install 'chromium'"
  /usr/bin/chromium --version 2>/dev/null | grep -q '^Chromium ' ||
    die "'/usr/bin/chromium --version' fails after installing 'chromium'"
}

docker_answers() {
  command -v docker >/dev/null 2>&1 &&
    timeout 15 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

ensure_docker_installed() {
  if command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1; then
    say "docker engine installed: $(command -v dockerd)"
    return
  fi
  is_root || die "dockerd is missing and installing it needs root (apt-get install -y docker.io)"
  command -v apt-get >/dev/null 2>&1 || die "dockerd is missing and apt-get is not available"
  say "apt-get update && apt-get install -y docker.io"
  DEBIAN_FRONTEND=noninteractive apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io
}

ensure_docker_running() {
  if docker_answers; then
    say "docker daemon answers"
    return
  fi
  is_root || die "The Docker daemon does not answer and starting it needs root"
  local pid=""
  if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    say "systemctl start docker"
    systemctl start docker || say "systemctl start docker failed; waiting anyway"
  elif pgrep -x dockerd >/dev/null 2>&1; then
    say "a dockerd process exists but does not answer yet; waiting for it"
  else
    local log=/var/log/waffle-dockerd.log
    if ! touch "$log" 2>/dev/null; then
      mkdir -p "$REPO/.tools"
      log="$REPO/.tools/dockerd.log"
    fi
    say "starting dockerd in the background (log: $log)"
    # setsid + nohup: the daemon outlives this script and its terminal.
    setsid nohup dockerd >>"$log" 2>&1 </dev/null &
    pid=$!
  fi
  local waited=0
  until docker_answers; do
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$log" >&2 || true
      die "dockerd exited during startup (see $log)"
    fi
    ((waited < DOCKER_WAIT_SECONDS)) || die "Docker daemon did not answer within ${DOCKER_WAIT_SECONDS}s"
    sleep 1
    waited=$((waited + 1))
  done
  say "docker daemon answers after ${waited}s"
}

# gcc with the static C library: image/build_rootfs.sh compiles the spawn
# helper (image/spawn_helper.c) with `gcc -static`.
has_static_cc() {
  local libc
  command -v gcc >/dev/null 2>&1 || return 1
  libc="$(gcc -print-file-name=libc.a 2>/dev/null)" || return 1
  [[ "$libc" == /* && -f "$libc" ]]
}

ensure_build_tools() {
  if has_static_cc; then
    say "gcc with the static C library: $(command -v gcc)"
    return
  fi
  is_root || die "gcc or the static C library (libc.a) is missing and installing them needs root" \
    "(apt-get install -y gcc libc6-dev): the runner image's spawn helper is compiled with them"
  command -v apt-get >/dev/null 2>&1 ||
    die "gcc or the static C library (libc.a) is missing and apt-get is not available"
  say "apt-get install -y gcc libc6-dev"
  DEBIAN_FRONTEND=noninteractive apt-get install -y gcc libc6-dev ||
    {
      DEBIAN_FRONTEND=noninteractive apt-get update &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y gcc libc6-dev
    } ||
    die "Could not install 'gcc libc6-dev'"
  has_static_cc || die "gcc still cannot link statically after installing 'gcc libc6-dev'"
}

ensure_image() {
  local args=()
  ((force_image == 0)) || args+=(--force)
  say "scripts/build_image.sh ${args[*]:-}(rebuilds only when the image is missing or stale)"
  DENO_BIN="$DENO" "$REPO/scripts/build_image.sh" "${args[@]}"
}

print_docker_summary() {
  local summary
  summary="$(docker info --format \
    'server {{.ServerVersion}}, arch {{.Architecture}}, storage driver {{.Driver}}, cgroup driver {{.CgroupDriver}} (v{{.CgroupVersion}})')"
  say "docker: $summary"
  say "docker: API $(docker version --format '{{.Server.APIVersion}}'), image $(docker image inspect \
    --format '{{.Id}}' "${WAFFLE_IMAGE:-waffle-runner:latest}")"
}

ensure_deno
ensure_node_modules
ensure_console
ensure_mcp_cache
((with_conformance == 0)) || ensure_conformance
((with_browser == 0)) || ensure_chromium
if ((with_docker == 1)); then
  ensure_docker_installed
  ensure_docker_running
  ensure_build_tools
  ensure_image
  say "image/runtime_kit.sh $REPO/.tools/runtime (rebuilds only when its inputs changed)"
  "$REPO/image/runtime_kit.sh" "$REPO/.tools/runtime" "$DENO"
  ((with_images == 0)) || "$REPO/scripts/build_images.sh" all
  print_docker_summary
else
  say "skipping Docker (run with --docker to install/start it and build the runner image)"
fi
say "done"
