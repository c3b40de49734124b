#!/usr/bin/env bash
# Runs waffle's whole test suite on a machine prepared by scripts/setup.sh.
#
# Usage: bash scripts/test.sh [--json] [DENO TEST ARGS...]
#   Runs `scripts/setup.sh --docker --images --conformance --browser`
#   (idempotent: Deno, node_modules, Docker engine + daemon, runner image,
#   runtime kit, the test images, the MCP conformance suite, Chromium), then
#   `deno test --allow-all` over tests/ with the usual console output, and
#   ends with exactly one line
#       tests: N passed, N failed, N skipped
#   computed from the junit report (scripts/test_summary.ts; ignored tests
#   count as skipped, tests left out by --filter and test steps are not
#   counted, an uncaught error in a test module counts as one failure).
#   --json   print the counts as one JSON object as the last line instead
#   Any other argument goes to `deno test`; when none of them names an
#   existing file or directory, tests/ is added. Examples:
#       bash scripts/test.sh tests/cli_test.ts
#       bash scripts/test.sh --filter "runner timeout"
# Environment:
#   CI                     when set (not "false"/"0"), WAFFLE_REQUIRE_DOCKER
#                          defaults to 1: live Docker tests fail instead of
#                          being ignored when Docker is unusable
#   WAFFLE_REQUIRE_DOCKER  1: live Docker tests must run (see tests/_docker_gate.ts)
#   WAFFLE_JUNIT_PATH      keep the junit report here (default: a temp file)
# Exit status: 0 when at least one test ran, none failed and deno test
# succeeded; non-zero otherwise.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
export PATH="$REPO/.tools/bin:$PATH"
export DENO_NO_UPDATE_CHECK=1

json=0
deno_args=()
for arg in "$@"; do
  case "$arg" in
    --json) json=1 ;;
    -h | --help)
      sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) deno_args+=("$arg") ;;
  esac
done

say() { printf 'test: %s\n' "$*" >&2; }

# The final line when the suite could not even start.
give_up() {
  local status="$1"
  shift
  say "error: $*"
  if ((json == 1)); then
    printf '{"passed":0,"failed":0,"skipped":0,"ok":false,"error":"%s"}\n' "$*"
  else
    echo "tests: 0 passed, 0 failed, 0 skipped"
  fi
  exit "$status"
}

case "${CI:-}" in
  "" | false | 0) ;;
  *) export WAFFLE_REQUIRE_DOCKER="${WAFFLE_REQUIRE_DOCKER:-1}" ;;
esac

started=$SECONDS
setup_status=0
bash "$REPO/scripts/setup.sh" --docker --images --conformance --browser || setup_status=$?
((setup_status == 0)) ||
  give_up "$setup_status" "scripts/setup.sh --docker --images --conformance --browser failed (exit $setup_status)"
say "setup took $((SECONDS - started))s"

junit="${WAFFLE_JUNIT_PATH:-}"
[[ -z "$junit" || "$junit" == /* ]] || junit="$PWD/$junit"

cd "$REPO"
has_path=0
for arg in "${deno_args[@]+"${deno_args[@]}"}"; do
  [[ "$arg" == -* || ! -e "$arg" ]] || has_path=1
done
((has_path == 1)) || deno_args+=(tests/)

scratch="$(mktemp -d "${TMPDIR:-/tmp}/waffle-test.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
junit="${junit:-$scratch/junit.xml}"
rm -f "$junit"
log="$scratch/console.log"

say "WAFFLE_REQUIRE_DOCKER=${WAFFLE_REQUIRE_DOCKER:-0}"
say "deno test --allow-all --junit-path=$junit ${deno_args[*]}"
started=$SECONDS
# stdin from /dev/null: no test may wait on a terminal. The console output is
# shown as it comes and kept for the summary (uncaught errors are not in junit).
set +e
deno test --allow-all "--junit-path=$junit" "${deno_args[@]}" </dev/null 2>&1 | tee "$log"
deno_status=${PIPESTATUS[0]}
set -e
say "deno test exited $deno_status after $((SECONDS - started))s"

summary_args=(--junit "$junit" --log "$log" --deno-status "$deno_status")
((json == 0)) || summary_args+=(--json)
# Exits non-zero on a failed test, on nothing run and on a non-zero deno status.
summary_status=0
deno run --quiet --allow-read "$REPO/scripts/test_summary.ts" "${summary_args[@]}" ||
  summary_status=$?
exit "$summary_status"
