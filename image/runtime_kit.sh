#!/usr/bin/env bash
# Builds the runtime kit: what a sandbox needs of waffle's own runtime,
# whatever image it runs (glibc, musl, or no libc and no shell at all).
# waffle mounts the kit read-only at /opt/waffle/rt and starts Deno through
# the kit's own dynamic loader, so the image's libc never matters:
#
#   DEST/ld.so      the host's glibc loader (Deno's PT_INTERP), run explicitly:
#                   ld.so --library-path /opt/waffle/rt /opt/waffle/deno ...
#   DEST/lib*.so.*  every shared library Deno links against (ldd), by soname
#   DEST/spawn      waffle's static spawn helper (image/spawn_helper.c)
#   DEST/metadata   the static metadata reader (image/metadata_helper.c), run
#                   as a command to read files' user.e2b.* attributes
#   DEST/kit.hash   hash of the inputs: an unchanged host rebuilds nothing
#
# Usage: image/runtime_kit.sh DEST [DENO]   (DENO default: .tools/bin/deno)
# Replaces DEST atomically (a new directory renamed into place). Root-owned
# when run as root: the runner uses a spawn helper only if root owns it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"

log() { printf 'runtime_kit: %s\n' "$*" >&2; }
die() {
  printf 'runtime_kit: error: %s\n' "$*" >&2
  exit 1
}
# shellcheck source=image/common.sh
source "$HERE/common.sh"

dest="${1:?usage: image/runtime_kit.sh DEST [DENO]}"
deno="$(readlink -f "${2:-$REPO/.tools/bin/deno}")"
[[ -x "$deno" ]] || die "Deno binary '$deno' is not executable; run scripts/setup.sh"
case "$dest" in /*) ;; *) die "DEST must be an absolute path, got '$dest'" ;; esac

interp="$(LC_ALL=C readelf -lW "$deno" | sed -n 's/.*Requesting program interpreter: \(.*\)]$/\1/p')"
[[ "$interp" == /* ]] || die "'$deno' names no dynamic loader (PT_INTERP)"
mapfile -t libs < <(libs_of "$deno" | grep -vxF "$interp")
[[ ${#libs[@]} -gt 0 ]] || die "ldd found no libraries for '$deno'"

# Without a static C compiler the kit has no helpers: commands then start
# through the image's own (the default image has one) or by forking the
# runner, and metadata is read by `waffle files metadata` (a Deno start).
have_cc=0
(find_cc >/dev/null 2>&1) && have_cc=1

hash="$(
  {
    sha256sum "${BASH_SOURCE[0]}" "$HERE/common.sh"
    sha256sum "$(readlink -f "$interp")"
    for lib in "${libs[@]}"; do sha256sum "$(readlink -f "$lib")"; done
    if ((have_cc)); then
      while IFS= read -r input; do sha256sum "$input"; done < <(spawn_helper_inputs)
      sha256sum "$METADATA_HELPER_SOURCE"
    fi
  } | sha256sum | cut -d' ' -f1
)"
if [[ -f "$dest/kit.hash" && "$(cat "$dest/kit.hash")" == "$hash" ]]; then
  log "up to date: $dest"
  exit 0
fi

build="$dest.new.$$"
rm -rf "$build"
mkdir -p "$build"
trap 'rm -rf "$build"' EXIT
cp -L "$interp" "$build/ld.so"
for lib in "${libs[@]}"; do cp -L "$lib" "$build/$(basename "$lib")"; done
if ((have_cc)); then
  build_spawn_helper "$build/spawn"
  build_static_helper "$METADATA_HELPER_SOURCE" "$build/metadata"
else
  log "warning: no static C compiler (apt-get install -y gcc libc6-dev): the kit has no spawn helper" \
    "and no metadata reader"
fi
chmod 0755 "$build" "$build"/*
echo "$hash" >"$build/kit.hash"
chmod 0644 "$build/kit.hash"
[[ "$(id -u)" != 0 ]] || chown -R 0:0 "$build"
# The loader must run Deno from the kit alone, as it will in a sandbox.
"$build/ld.so" --library-path "$build" "$deno" --version >/dev/null ||
  die "Deno does not start through '$build/ld.so'"
if [[ -e "$dest" ]]; then
  mv "$dest" "$dest.old.$$"
  mv "$build" "$dest"
  rm -rf "$dest.old.$$"
else
  mkdir -p "$(dirname "$dest")"
  mv "$build" "$dest"
fi
trap - EXIT
log "built $dest: ld.so, ${#libs[@]} libraries$( ((have_cc)) && echo ", spawn, metadata")"
