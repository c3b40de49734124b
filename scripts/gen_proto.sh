#!/usr/bin/env bash
# Regenerates lib/serve/gen/ (the TypeScript schemas of the envd protos in
# proto/) with buf and protoc-gen-es. The generated files are committed, so
# only someone who changes a .proto needs to run this.
#
# Usage: bash scripts/gen_proto.sh
#   Installs @bufbuild/buf and @bufbuild/protoc-gen-es at their pinned
#   versions with npm into .tools/protogen (once; later runs reuse them), then
#   runs `buf generate` in proto/ (config proto/buf.gen.yaml), which replaces
#   lib/serve/gen/, and formats the output with deno fmt.
# Needs npm and the npm registry on the first run.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
BUF_VERSION="1.75.0"
PROTOC_GEN_ES_VERSION="2.17.0"
TOOLS="$REPO/.tools/protogen"
BIN="$TOOLS/node_modules/.bin"

say() { printf 'gen_proto: %s\n' "$*"; }
die() {
  printf 'gen_proto: error: %s\n' "$*" >&2
  exit 1
}

# Prints the version of an npm package installed in $TOOLS, or nothing.
installed_version() {
  local manifest="$TOOLS/node_modules/$1/package.json"
  [[ -f "$manifest" ]] || return 0
  sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$manifest" | head -n1
}

ensure_tools() {
  if [[ "$(installed_version @bufbuild/buf)" == "$BUF_VERSION" &&
    "$(installed_version @bufbuild/protoc-gen-es)" == "$PROTOC_GEN_ES_VERSION" ]]; then
    say "buf $BUF_VERSION and protoc-gen-es $PROTOC_GEN_ES_VERSION already in $TOOLS"
    return
  fi
  command -v npm >/dev/null 2>&1 || die "npm not found; install Node.js and npm first (apt-get install -y npm)"
  say "npm install --prefix $TOOLS @bufbuild/buf@$BUF_VERSION @bufbuild/protoc-gen-es@$PROTOC_GEN_ES_VERSION"
  mkdir -p "$TOOLS"
  npm install --prefix "$TOOLS" --save-exact --include=optional --no-audit --no-fund \
    "@bufbuild/buf@$BUF_VERSION" "@bufbuild/protoc-gen-es@$PROTOC_GEN_ES_VERSION"
  [[ -x "$BIN/buf" ]] || die "npm did not install '$BIN/buf'"
  [[ -x "$BIN/protoc-gen-es" ]] || die "npm did not install '$BIN/protoc-gen-es'"
}

ensure_tools
say "buf generate (proto/ -> lib/serve/gen/)"
# buf finds the `local` plugin protoc-gen-es on PATH.
(cd "$REPO/proto" && PATH="$BIN:$PATH" buf generate)
"$REPO/.tools/bin/deno" fmt --quiet "$REPO/lib/serve/gen"
say "generated: $(cd "$REPO" && find lib/serve/gen -name '*.ts' | sort | tr '\n' ' ')"
