#!/usr/bin/env bash
# Puts `waffle` on PATH: one bundled artefact and the pinned Deno that runs it.
#
# Usage: bash scripts/install.sh [--prefix DIR] [--no-docker]
#   Runs scripts/setup.sh (idempotent: Deno, node_modules, and unless
#   --no-docker the Docker engine, daemon and runner image), bundles main.ts
#   into a build directory (`deno bundle`, split into chunks that each
#   command loads on use; `deno compile` cannot fetch its runtime here), and
#   installs
#       DIR/lib/waffle/waffle-<digest12>/ the build (CLI and runner in one): waffle.js,
#                                        its chunks, SHA256SUMS; never rewritten
#       DIR/lib/waffle/artefact          the current build's directory name
#       DIR/lib/waffle/mod.js            the library as one ES module (lib/mod.ts bundled)
#       DIR/lib/waffle/deno              the pinned Deno
#       DIR/lib/waffle/runner-cache/     the runner's warm Deno cache (root only)
#       DIR/lib/waffle/runtime/          the runtime kit: glibc's loader and the
#                                        libraries Deno needs, the spawn helper
#                                        (image/runtime_kit.sh), so any image works
#       DIR/bin/waffle                   a launcher: deno run … waffle-<digest12>/waffle.js "$@"
#   Where `deno compile` can fetch its runtime, DIR/lib/waffle/waffle (one
#   binary) replaces the artefact and Deno (WAFFLE_INSTALL_BUNDLE=1: always
#   bundle). DIR defaults to /usr/local. Sandboxes mount that same build and Deno
#   read-only as their runner; the build's digest (over every file) is part of
#   each sandbox's posture, so installing a new build recycles them on next use.
#   A process that runs while a new build is installed keeps loading its own
#   build's chunks: the previous build stays, older ones are removed. Other
#   files are replaced only when their content changed, each atomically.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PREFIX=/usr/local
docker=--docker
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix)
      PREFIX="${2:?--prefix needs a directory}"
      shift 2
      ;;
    --no-docker)
      docker=""
      shift
      ;;
    -h | --help)
      sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install: unknown argument '$1' (see --help)" >&2
      exit 2
      ;;
  esac
done
case "$PREFIX" in
  /*) ;;
  *) echo "install: --prefix must be an absolute path, got '$PREFIX'" >&2 && exit 2 ;;
esac

say() { printf 'install: %s\n' "$*" >&2; }

bash "$REPO/scripts/setup.sh" $docker
export PATH="$REPO/.tools/bin:$PATH"
DENO_BIN="$(readlink -f "$REPO/.tools/bin/deno")"

# Replaces $2 with $1 unless they are the same bytes (atomic rename).
place() {
  local from="$1" to="$2" mode="$3"
  if [[ -f "$to" ]] && cmp -s "$from" "$to"; then
    rm -f "$from"
    return 1
  fi
  chmod "$mode" "$from"
  mv -f "$from" "$to"
}

LIB="$PREFIX/lib/waffle"
mkdir -p "$LIB" "$PREFIX/bin"
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT

# The library, for other projects: `import { openSandbox } from "$LIB/mod.js"`
# (one self-contained ES module, npm packages included; it runs the CLI beside it).
deno run --allow-all "$REPO/scripts/build_artefact.ts" "$build/mod.js" lib/mod.ts
if place "$build/mod.js" "$LIB/mod.js" 0644; then say "installed $LIB/mod.js"; fi

# A compiled binary where Deno can fetch its runtime (denort); otherwise the
# bundled artefact run by the pinned Deno.
if [[ "${WAFFLE_INSTALL_BUNDLE:-0}" != 1 ]] &&
  (cd "$REPO" && DENO_NO_UPDATE_CHECK=1 timeout 300 deno compile --quiet --allow-all \
    --include runner/heartbeat_worker.ts -o "$build/waffle" main.ts) 2>"$build/compile.err"; then
  place "$build/waffle" "$LIB/waffle" 0755 && say "installed $LIB/waffle (deno compile)" || true
  (cd "$REPO" && deno eval --quiet \
    "import { writeArtefactDigest } from './lib/config/self.ts'; writeArtefactDigest('$LIB/waffle');")
  ln -sfn "$LIB/waffle" "$PREFIX/bin/waffle"
  # The default home's egress CA, made once (its key readable by the proxy alone).
if ca=$("$PREFIX/bin/waffle" egress ca 2>&1); then say "egress CA: $ca"; else say "egress CA not made: $ca"; fi
say "done: $("$PREFIX/bin/waffle" --help | head -1)"
  exit 0
fi
plain="$(sed 's/\x1b\[[0-9;]*m//g' "$build/compile.err" 2>/dev/null || echo "WAFFLE_INSTALL_BUNDLE=1")"
why="$(grep -m1 -o 'error sending request for url ([^)]*)' <<<"$plain" || grep -m1 'error' <<<"$plain" || true)"
say "deno compile cannot build here (${why:-$plain}); installing the bundled artefact"
name="$(deno run --allow-all "$REPO/scripts/build_artefact.ts" "$build/app")"
previous="$(cat "$LIB/artefact" 2>/dev/null || true)"
# Checks a build in place against its SHA256SUMS and records its files' stamps.
stamp() {
  (cd "$REPO" && deno eval --quiet \
    "import { writeArtefactDigest } from './lib/config/self.ts'; writeArtefactDigest('$1/waffle.js');")
}
if [[ -d "$LIB/$name" ]] && cmp -s "$build/app/SHA256SUMS" "$LIB/$name/SHA256SUMS" &&
  stamp "$LIB/$name" 2>/dev/null; then
  say "artefact unchanged: $LIB/$name"
else
  # Copied beside, then renamed: the directory appears whole.
  rm -rf "$LIB/.$name.tmp"
  cp -R "$build/app" "$LIB/.$name.tmp"
  rm -rf "$LIB/$name"
  mv "$LIB/.$name.tmp" "$LIB/$name"
  stamp "$LIB/$name"
  say "installed $LIB/$name"
fi
cp "$DENO_BIN" "$build/deno"
if place "$build/deno" "$LIB/deno" 0755; then say "installed $LIB/deno"; fi
"$REPO/image/runtime_kit.sh" "$LIB/runtime" "$LIB/deno"
# The runner's warm Deno cache, made for this build (and remade with it).
deno run --allow-all "$REPO/scripts/runner_cache.ts" "$LIB/$name/waffle.js"

# The launcher names the build itself, never a name a later install repoints:
# chunks load on use, each from the directory its process started in.
cat >"$build/launcher" <<EOF
#!/bin/sh
# waffle: the bundled artefact run by its pinned Deno (scripts/install.sh).
DENO_NO_UPDATE_CHECK=1 exec "$LIB/deno" run --allow-all --quiet --no-prompt --no-config "$LIB/$name/waffle.js" "\$@"
EOF
printf '%s\n' "$name" >"$build/artefact"
place "$build/artefact" "$LIB/artefact" 0644 || true
if place "$build/launcher" "$PREFIX/bin/waffle" 0755; then say "installed $PREFIX/bin/waffle"; fi
# The previous build stays for the processes still running it; older ones go,
# and so does the single-file artefact of installs before builds were directories.
if [[ "$previous" != "$name" ]]; then
  for old in "$LIB"/waffle-*/; do
    old="${old%/}"
    [[ -d "$old" ]] || continue
    case "$(basename "$old")" in "$name" | "$previous") ;; *) rm -rf "$old" && say "removed $old" ;; esac
  done
fi
rm -f "$LIB/waffle.js" "$LIB/waffle.js.sha256"
# The default home's egress CA, made once (its key readable by the proxy alone).
if ca=$("$PREFIX/bin/waffle" egress ca 2>&1); then say "egress CA: $ca"; else say "egress CA not made: $ca"; fi
say "done: $("$PREFIX/bin/waffle" --help | head -1)"
