#!/usr/bin/env bash
# Builds images of the kinds users bring, offline, from Debian's packages only
# (no registry): each one is a rootfs loaded with `docker import`. waffle
# runs any of them unmodified (`waffle exec --image TAG ...`).
#
# Usage: scripts/build_images.sh [--force] KIND...
#   python   waffle-python:bookworm: Debian bookworm (debootstrap minbase) with
#            python3, pip, venv, requests, git and curl; ENV LANG=C.UTF-8
#   base     waffle-base:bookworm, what `waffle serve` starts sandboxes from:
#            the python image's packages plus bash, procps, python-is-python3
#            and less, and a user `user` (uid/gid 10001, the uid commands run
#            as; home /home/user, shell /bin/bash); no sudo, no setuid added
#   musl     waffle-musl:latest: musl's loader and libc, a static busybox and a
#            musl-linked program (/usr/bin/musl-hello); no glibc anywhere
#   noshell  waffle-noshell:latest: one static program (/hello), no shell, no
#            /etc/passwd, an ENTRYPOINT and a VOLUME of its own
#   all      the four
# Idempotent: an image whose `waffle.build.hash` label matches its inputs is
# kept. Progress goes to stderr. Needs root (apt, debootstrap).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HASH_LABEL="waffle.build.hash"
MIRROR="${WAFFLE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
PYTHON_PACKAGES="python3,python3-pip,python3-venv,python3-requests,git,curl,ca-certificates"
BASE_PACKAGES="$PYTHON_PACKAGES,bash,procps,python-is-python3,less"
# waffle's command uid (SANDBOX_UID in lib/lifecycle/posture.ts): base's `user`.
BASE_UID=10001

force=0
kinds=()
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    python | base | musl | noshell) kinds+=("$arg") ;;
    all) kinds+=(python base musl noshell) ;;
    -h | --help)
      sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "build_images: error: unknown argument '$arg' (python, base, musl, noshell, all)" >&2
      exit 2
      ;;
  esac
done
[[ ${#kinds[@]} -gt 0 ]] || {
  echo "build_images: error: name what to build: python, base, musl, noshell or all" >&2
  exit 2
}

log() { printf 'build_images: %s\n' "$*" >&2; }
die() {
  printf 'build_images: error: %s\n' "$*" >&2
  exit 1
}

need_packages() {
  local missing=() tool package
  for pair in "$@"; do
    tool="${pair%%:*}"
    package="${pair#*:}"
    command -v "$tool" >/dev/null 2>&1 || missing+=("$package")
  done
  [[ ${#missing[@]} -eq 0 ]] && return
  [[ "$(id -u)" == 0 ]] || die "missing ${missing[*]}: install them as root"
  log "apt-get install -y ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >&2 || {
    DEBIAN_FRONTEND=noninteractive apt-get update >&2 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >&2
  } || die "could not install ${missing[*]}"
}

# The image's current hash label, empty when there is no such image.
current_hash() {
  docker image inspect --format "{{ index .Config.Labels \"$HASH_LABEL\" }}" "$1" 2>/dev/null || true
}

# Imports the rootfs directory $2 as image $1 with hash $3 and `--change` lines after.
import_dir() {
  local tag="$1" dir="$2" hash="$3"
  shift 3
  local changes=(--change "LABEL $HASH_LABEL=$hash")
  for change in "$@"; do changes+=(--change "$change"); done
  tar --numeric-owner -C "$dir" -c . | docker import "${changes[@]}" - "$tag" >/dev/null
  log "built $tag ($(docker image inspect --format '{{.Size}}' "$tag") bytes)"
}

# Runs "$2 DIR" in a scratch directory unless image $1 has hash $3.
build_if_stale() {
  local tag="$1" builder="$2" hash="$3"
  if [[ $force == 0 && "$(current_hash "$tag")" == "$hash" ]]; then
    log "up to date: $tag"
    return
  fi
  local dir
  dir="$(mktemp -d /tmp/waffle-image.XXXXXX)"
  trap 'rm -rf "$dir"' RETURN
  "$builder" "$dir" "$hash"
}

# A Debian rootfs at $1/root: debootstrap minbase with the packages $2, apt's
# downloads and lists dropped.
debian_root() {
  local dir="$1" packages="$2"
  log "debootstrap $SUITE ($packages) from $MIRROR: a few minutes"
  debootstrap --variant=minbase --include="$packages" "$SUITE" "$dir/root" "$MIRROR" >&2 ||
    die "debootstrap failed (is $MIRROR reachable?)"
  rm -rf "$dir/root/var/cache/apt/archives/"*.deb "$dir/root/var/lib/apt/lists/"*
}

# Imports a Debian rootfs as $1 with the Debian kinds' ENV; `--change` lines after $3.
import_debian() {
  local tag="$1" root="$2" hash="$3"
  shift 3
  import_dir "$tag" "$root" "$hash" \
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "ENV LANG=C.UTF-8" "$@"
}

build_python() {
  local dir="$1" hash="$2"
  debian_root "$dir" "$PYTHON_PACKAGES"
  import_debian waffle-python:bookworm "$dir/root" "$hash" 'CMD ["python3"]'
}

# The set-id files under a rootfs, one relative path a line, sorted.
setid_files() {
  (cd "$1" && find . -xdev -type f -perm /6000 | sort)
}

build_base() {
  local dir="$1" hash="$2" root="$1/root" before
  debian_root "$dir" "$BASE_PACKAGES"
  before="$(setid_files "$root")"
  # Written into the files, not with useradd: no chroot, no host tools in play.
  printf 'user:x:%d:%d:user:/home/user:/bin/bash\n' "$BASE_UID" "$BASE_UID" >>"$root/etc/passwd"
  printf 'user:x:%d:\n' "$BASE_UID" >>"$root/etc/group"
  printf 'user:*:19000:0:99999:7:::\n' >>"$root/etc/shadow"
  printf 'user:*::\n' >>"$root/etc/gshadow"
  # The sandbox's root file system is read-only: the user's home is the
  # workspace (the writable, quota'd volume), so `~/x` and E2B's
  # `/home/user/x` name the same file as the files API does.
  install -d -m 0755 "$root/home"
  ln -s /workspace "$root/home/user"
  [[ ! -e "$root/usr/bin/sudo" ]] || die "sudo found in the base image"
  [[ "$(setid_files "$root")" == "$before" ]] || die "the base image gained a set-id file"
  import_debian waffle-base:bookworm "$root" "$hash" 'CMD ["/bin/bash"]'
}

# A tiny C program, built with $1 into $2 ($3: extra flags).
compile_hello() {
  local cc="$1" out="$2" flags="$3" src
  src="$(mktemp /tmp/waffle-hello.XXXXXX.c)"
  cat >"$src" <<'EOF'
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
  char cwd[4096];
  printf("hello from uid %d gid %d in %s", (int)getuid(), (int)getgid(),
         getcwd(cwd, sizeof cwd) ? cwd : "?");
  for (int i = 1; i < argc; i++) printf(" %s", argv[i]);
  printf("\n");
  return 0;
}
EOF
  # shellcheck disable=SC2086
  "$cc" $flags -Os -o "$out" "$src"
  rm -f "$src"
}

build_musl() {
  local dir="$1" hash="$2" root="$1/root" loader
  mkdir -p "$root"/{bin,lib,usr/bin,etc,tmp,workspace}
  loader="$(dpkg -L musl | grep -E '/ld-musl-[^/]+\.so\.1$' | head -n1)"
  [[ -n "$loader" ]] || die "package 'musl' has no ld-musl loader"
  # musl's loader is its libc: one file serves both names.
  cp -L "$loader" "$root/lib/$(basename "$loader")"
  compile_hello musl-gcc "$root/usr/bin/musl-hello" ""
  readelf -lW "$root/usr/bin/musl-hello" | grep -q "ld-musl" || die "musl-hello is not musl-linked"
  cp "$(command -v busybox)" "$root/bin/busybox"
  for applet in sh ls cat echo id mkdir rm sleep env head true false pwd; do
    ln -s busybox "$root/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
  chmod 1777 "$root/tmp"
  import_dir waffle-musl:latest "$root" "$hash" "ENV PATH=/usr/bin:/bin" "ENV MUSL_IMAGE=1"
}

build_noshell() {
  local dir="$1" hash="$2" root="$1/root"
  mkdir -p "$root/app"
  compile_hello gcc "$root/hello" "-static -s"
  import_dir waffle-noshell:latest "$root" "$hash" "ENV PATH=/" "WORKDIR /app" \
    'ENTRYPOINT ["/hello", "entrypoint"]' "VOLUME /data"
}

command -v docker >/dev/null 2>&1 || die "docker CLI not in PATH; run scripts/setup.sh --docker"
# A kind's recipe: the functions that build it and what they read, so an
# edit to another kind's recipe rebuilds nothing else.
recipe_hash() {
  {
    declare -f "build_$1" import_dir
    case "$1" in
      python) declare -f debian_root import_debian && echo "$SUITE $PYTHON_PACKAGES" ;;
      base) declare -f debian_root import_debian setid_files && echo "$SUITE $BASE_PACKAGES $BASE_UID" ;;
      *) declare -f compile_hello ;;
    esac
    [[ "$1" != musl ]] || sha256sum "$(command -v busybox)"
  } | sha256sum | cut -c1-16
}

for kind in "${kinds[@]}"; do
  case "$kind" in
    python)
      need_packages debootstrap:debootstrap
      build_if_stale waffle-python:bookworm build_python "$(recipe_hash python)"
      ;;
    base)
      need_packages debootstrap:debootstrap
      build_if_stale waffle-base:bookworm build_base "$(recipe_hash base)"
      ;;
    musl)
      need_packages musl-gcc:musl-tools busybox:busybox-static
      build_if_stale waffle-musl:latest build_musl "$(recipe_hash musl)"
      ;;
    noshell)
      build_if_stale waffle-noshell:latest build_noshell "$(recipe_hash noshell)"
      ;;
  esac
done
