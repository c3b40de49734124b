#!/usr/bin/env bash
# Builds the waffle runner image from host files, without any image registry:
# image/build_rootfs.sh assembles a small rootfs tarball and `docker import`
# turns it into an image. The image carries a content hash of the rootfs
# inputs as a label, so an unchanged host gives no rebuild.
#
# Usage: scripts/build_image.sh [--force] [--json] [--image NAME]
#   --force       rebuild even when an image with the same content hash exists
#   --json        print a final JSON object {image, id, hash, built} on stdout
#   --image NAME  image reference (default: $WAFFLE_IMAGE or waffle-runner:latest)
# Progress lines go to stderr.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
ROOTFS_SCRIPT="$REPO/image/build_rootfs.sh"

# Bump when the image contract in image/README.md changes.
CONTRACT=1
HASH_LABEL="waffle.image.hash"
CONTRACT_LABEL="waffle.image.contract"

image="${WAFFLE_IMAGE:-waffle-runner:latest}"
force=0
json=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --force) force=1 ;;
    --json) json=1 ;;
    --image)
      [[ $# -ge 2 ]] || {
        echo "build_image: error: --image needs a value" >&2
        exit 2
      }
      image="$2"
      shift
      ;;
    -h | --help)
      sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "build_image: error: unknown argument '$1'" >&2
      exit 2
      ;;
  esac
  shift
done

log() { printf 'build_image: %s\n' "$*" >&2; }
die() {
  printf 'build_image: error: %s\n' "$*" >&2
  exit 1
}

command -v docker >/dev/null 2>&1 || die "docker CLI not in PATH; run scripts/setup.sh --docker"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
  die "Docker daemon unavailable; run scripts/setup.sh --docker"

# Everything that shapes the image goes into the hash: the import changes,
# the rootfs script itself and every host file it copies (path + content).
changes=(
  "USER 10001:10001"
  "WORKDIR /workspace"
  "ENV PATH=/usr/local/bin:/usr/bin:/bin"
)
inputs="$("$ROOTFS_SCRIPT" --print-inputs)"
hash="sha256:$({
  printf 'contract=%s\narch=%s\n' "$CONTRACT" "$(uname -m)"
  printf 'change=%s\n' "${changes[@]}"
  while IFS= read -r f; do
    [[ -n "$f" ]] || continue
    # Repo files by relative path, so every checkout of the same commit agrees.
    printf 'file=%s %s\n' "${f#"$REPO"/}" "$(sha256sum <"$f" | cut -d' ' -f1)"
  done <<<"$inputs"
} | sha256sum | cut -d' ' -f1)"
log "image '$image', input hash $hash"

emit() {
  local id="$1" built="$2"
  if [[ "$json" == 1 ]]; then
    printf '{"image":"%s","id":"%s","hash":"%s","built":%s}\n' "$image" "$id" "$hash" "$built"
  fi
}

existing="$(docker image inspect --format "{{ index .Config.Labels \"$HASH_LABEL\" }}" "$image" 2>/dev/null || true)"
old_id="$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)"
if [[ "$force" == 0 && "$existing" == "$hash" ]]; then
  id="$(docker image inspect --format '{{.Id}}' "$image")"
  log "up to date: '$image' is $id (use --force to rebuild)"
  emit "$id" false
  exit 0
fi
if [[ -n "$existing" ]]; then
  log "rebuilding: '$image' has hash '$existing'"
elif [[ "$force" == 0 ]]; then
  log "building: no image '$image' with contract labels yet"
else
  log "building (--force)"
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/waffle-image.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$ROOTFS_SCRIPT" --tar "$tmp/rootfs.tar"

import_args=()
for c in "${changes[@]}"; do import_args+=(--change "$c"); done
import_args+=(--change "LABEL $CONTRACT_LABEL=$CONTRACT $HASH_LABEL=$hash")
import_args+=(--message "waffle runner rootfs $hash")
log "docker import -> '$image'"
docker import "${import_args[@]}" "$tmp/rootfs.tar" "$image" >/dev/null
id="$(docker image inspect --format '{{.Id}}' "$image")"
log "built '$image' as $id"
if [[ -n "$old_id" && "$old_id" != "$id" ]]; then
  # Drop the superseded image unless a container still uses it.
  if docker image rm "$old_id" >/dev/null 2>&1; then log "removed previous image $old_id"; fi
fi
emit "$id" true
