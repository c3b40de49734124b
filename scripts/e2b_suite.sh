#!/usr/bin/env bash
# Runs E2B's own JS SDK tests against `waffle serve` (issue 24).
#
# Usage: bash scripts/e2b_suite.sh [--json] [--sdk npm|checkout] E2B_CHECKOUT [DIR...]
#   E2B_CHECKOUT  a checkout of e2b-dev/E2B (the caller fetches it, at the tag
#                 of the SDK deno.json pins); it is copied, never changed, and
#                 nothing of it lands in this repository
#   DIR           test directories of packages/js-sdk, run one at a time
#                 (default: tests/sandbox/commands tests/sandbox/files
#                 tests/sandbox/pty)
#   --sdk npm     (default) the SDK under test is the npm package deno.json
#                 pins (`e2b@X`): its sources, read from the package's source
#                 map, over the checkout's src/ (type-only modules, absent
#                 from the map, stay the checkout's)
#   --sdk checkout  the checkout's own src/
#   --json        print the counts and every test as one JSON object as the
#                 last line instead of the list and the counts line
# Starts its own `waffle serve --listen 127.0.0.1:0` from this checkout (its
# own WAFFLE_HOME, a key of tenant `suite`, the `base` image
# waffle-base:bookworm must be built), runs vitest's `unit` project on each
# DIR with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL pointing at it, stops
# it and removes its sandboxes. The last line is
#     e2b suite: N passed, N failed, N skipped
# Needs node (>= 20.19) and npm (the registry reachable on the first run).
# Environment:
#   E2B_SUITE_WORK  where the copy, the npm packages, the waffle home and the
#                   reports go (default /tmp/waffle-e2b-suite); a second run
#                   reuses the npm packages
# Exit status: 0 when tests ran and none failed; 1 otherwise.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
export PATH="$REPO/.tools/bin:$PATH"
export DENO_NO_UPDATE_CHECK=1

json=0
sdk=npm
checkout=""
dirs=()
while (($# > 0)); do
  case "$1" in
    --json) json=1 ;;
    --sdk)
      sdk="${2:-}"
      shift
      ;;
    --sdk=*) sdk="${1#--sdk=}" ;;
    -h | --help)
      sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    -*)
      echo "e2b_suite: unknown option '$1'" >&2
      exit 2
      ;;
    *) if [[ -z "$checkout" ]]; then checkout="$1"; else dirs+=("$1"); fi ;;
  esac
  shift
done
say() { printf 'e2b suite: %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 2
}
[[ "$sdk" == npm || "$sdk" == checkout ]] || die "--sdk must be 'npm' or 'checkout', not '$sdk'"
[[ -n "$checkout" ]] || die "give the path of a checkout of e2b-dev/E2B (see --help)"
sdk_dir="$(cd "$checkout" && pwd)/packages/js-sdk"
[[ -f "$sdk_dir/package.json" && -d "$sdk_dir/tests" ]] ||
  die "'$checkout' has no packages/js-sdk with tests: not a checkout of e2b-dev/E2B"
((${#dirs[@]} > 0)) || dirs=(tests/sandbox/commands tests/sandbox/files tests/sandbox/pty)
command -v node >/dev/null && command -v npm >/dev/null || die "node and npm are needed"

work="${E2B_SUITE_WORK:-/tmp/waffle-e2b-suite}"
helper="$REPO/scripts/e2b_suite.ts"
deno_run=(deno run --quiet --allow-read --allow-write --allow-env --allow-run "$helper")
pin="$(sed -n 's/.*"e2b": "npm:e2b@\([0-9][^"]*\)".*/\1/p' "$REPO/deno.json")"
[[ -n "$pin" ]] || die "deno.json pins no npm:e2b version"
mkdir -p "$work"

# A fresh copy of the SDK package each run (the checkout stays untouched).
rm -rf "$work/js-sdk"
mkdir -p "$work/js-sdk"
(cd "$sdk_dir" && tar --exclude=./node_modules -cf - .) | tar -xf - -C "$work/js-sdk"
manifest="$sdk_dir/package.json"
if [[ "$sdk" == npm ]]; then
  if [[ ! -f "$work/npm-$pin/package/package.json" ]]; then
    say "fetching e2b@$pin from npm"
    rm -rf "$work/npm-$pin"
    mkdir -p "$work/npm-$pin"
    (cd "$work/npm-$pin" && npm pack --silent "e2b@$pin" >/dev/null && tar -xzf "e2b-$pin.tgz")
  fi
  manifest="$work/npm-$pin/package/package.json"
  "${deno_run[@]}" overlay "$work/npm-$pin/package/dist/index.mjs.map" "$work/js-sdk/src" >&2
fi
tested="$(sed -n 's/^ *"version": "\([^"]*\)".*/\1/p' "$manifest" | head -n 1)"
say "SDK e2b@$tested ($sdk), tests of $(sed -n 's/^ *"version": "\([^"]*\)".*/\1/p' "$sdk_dir/package.json" | head -n 1)"

# The npm packages the tests import, installed once per set of versions.
"${deno_run[@]}" deps "$manifest" "$sdk_dir/package.json" >"$work/deps.json.new"
if ! cmp -s "$work/deps.json.new" "$work/deps/package.json" || [[ ! -d "$work/deps/node_modules" ]]; then
  say "npm install (vitest and the SDK's dependencies)"
  rm -rf "$work/deps"
  mkdir -p "$work/deps"
  cp "$work/deps.json.new" "$work/deps/package.json"
  (cd "$work/deps" && npm install --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
fi
ln -sfn "$work/deps/node_modules" "$work/js-sdk/node_modules"
cat >"$work/js-sdk/vitest.waffle.mts" <<'EOF'
// The suite's `unit` project as packages/js-sdk/vitest.config.mts has it,
// without the browser projects (their plugins are not installed).
import { defineConfig } from 'vitest/config'
export default defineConfig({
  test: {
    projects: [{
      test: {
        name: 'unit',
        include: ['tests/**/*.test.ts'],
        isolate: true,
        globals: false,
        testTimeout: 30_000,
        environment: 'node',
        setupFiles: ['tests/globalFetchFallback.setup.ts'],
        deps: { interopDefault: true },
      },
    }],
  },
})
EOF

# Its own waffle serve, in its own home.
home="$work/home"
served=""
waffle=(deno run --allow-all --quiet --no-prompt "$REPO/main.ts")
stop_serve() {
  if [[ -n "$served" ]]; then
    kill -TERM "$served" 2>/dev/null || true
    wait "$served" 2>/dev/null || true
    served=""
  fi
  # What is left of this home's sandboxes is removed with the CLI.
  if [[ -d "$home" ]]; then
    WAFFLE_HOME="$home" "${waffle[@]}" ps --json 2>/dev/null |
      "${deno_run[@]}" sandboxes | while read -r tenant user; do
      WAFFLE_HOME="$home" "${waffle[@]}" rm --purge --tenant "$tenant" --user "$user" >/dev/null 2>&1 || true
    done
  fi
}
trap stop_serve EXIT
stop_serve
rm -rf "$home" "$work/reports"
mkdir -p "$home" "$work/reports"
docker image inspect waffle-base:bookworm >/dev/null 2>&1 ||
  die "image 'waffle-base:bookworm' is missing: run 'bash scripts/build_images.sh base'"
key="$(WAFFLE_HOME="$home" "${waffle[@]}" serve key create --tenant suite)"
WAFFLE_HOME="$home" "${waffle[@]}" serve --listen 127.0.0.1:0 --json >"$work/serve.out" 2>"$work/serve.err" </dev/null &
served=$!
url=""
for _ in $(seq 1 300); do
  url="$(sed -n 's/^{"url":"\([^"]*\)".*/\1/p' "$work/serve.out")"
  [[ -z "$url" ]] || break
  kill -0 "$served" 2>/dev/null || die "waffle serve exited: $(cat "$work/serve.err")"
  sleep 0.2
done
[[ -n "$url" ]] || die "waffle serve did not listen within 60 s"
say "waffle serve at $url (home $home, log $work/serve.err)"

# One directory at a time: each test makes its own sandbox.
cd "$work/js-sdk"
for dir in "${dirs[@]}"; do
  report="$work/reports/$(echo "$dir" | tr '/' '_').json"
  say "vitest run --project unit $dir"
  set +e
  env -u E2B_DEBUG -u E2B_DOMAIN -u E2B_ACCESS_TOKEN \
    E2B_API_KEY="$key" E2B_API_URL="$url" E2B_SANDBOX_URL="$url" \
    ./node_modules/.bin/vitest run --config vitest.waffle.mts --project unit "$dir" \
    --reporter=default --reporter=json "--outputFile.json=$report" </dev/null >&2
  set -e
  [[ -f "$report" ]] || say "vitest wrote no report for $dir"
done
stop_serve

summary=(summary "$work/reports")
((json == 0)) || summary+=(--json)
"${deno_run[@]}" "${summary[@]}"
