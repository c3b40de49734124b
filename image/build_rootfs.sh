#!/usr/bin/env bash
# Assembles the waffle runner rootfs from files already on this host:
# a static busybox (sh + core utils), waffle's spawn helper (compiled here
# from image/spawn_helper.c with `gcc -static`: the runner starts every
# command through it), util-linux `setpriv` with its libraries (the runner's
# fallback where the helper is missing), the glibc
# pieces the host's Deno binary links against, /etc/passwd + /etc/group with
# the `waffle` user (uid/gid 10001), and the empty mount points waffle binds
# at run time.
#
# No Deno binary and no waffle sources go into the image: waffle mounts the
# Deno executable at /opt/waffle/deno and the repository at /opt/waffle/src,
# read-only, when it starts a runner. See image/README.md for the contract.
#
# Usage:
#   image/build_rootfs.sh --tar FILE      build the rootfs and write it as a tarball
#   image/build_rootfs.sh --out DIR       build the rootfs into DIR (must not exist)
#   image/build_rootfs.sh --print-inputs  list the host files the rootfs is made of
#
# Environment:
#   DENO_BIN   Deno binary whose shared libraries are copied
#              (default: <repo>/.tools/bin/deno, then `deno` on PATH)
#   CC         C compiler for the spawn helper (default: gcc); it needs the
#              static C library (Debian: apt-get install -y gcc libc6-dev)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"

log() { printf 'build_rootfs: %s\n' "$*" >&2; }
die() {
  printf 'build_rootfs: error: %s\n' "$*" >&2
  exit 1
}

find_deno() {
  if [[ -n "${DENO_BIN:-}" ]]; then
    [[ -x "$DENO_BIN" ]] || die "DENO_BIN '$DENO_BIN' is not executable"
    printf '%s\n' "$DENO_BIN"
  elif [[ -x "$REPO/.tools/bin/deno" ]]; then
    printf '%s\n' "$REPO/.tools/bin/deno"
  elif command -v deno >/dev/null 2>&1; then
    command -v deno
  else
    die "No Deno binary found; run scripts/setup.sh or set DENO_BIN"
  fi
}

# Prefer the static busybox so the image needs no extra libraries for it.
find_busybox() {
  local candidate
  for candidate in /bin/busybox /usr/bin/busybox; do
    if [[ -x "$candidate" ]]; then
      printf '%s\n' "$candidate"
      return
    fi
  done
  if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    log "busybox missing: apt-get install -y busybox-static"
    DEBIAN_FRONTEND=noninteractive apt-get install -y busybox-static >&2 ||
      {
        DEBIAN_FRONTEND=noninteractive apt-get update >&2 &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y busybox-static >&2
      } ||
      die "Could not install 'busybox-static'"
    command -v busybox || die "busybox still missing after installing 'busybox-static'"
  else
    die "busybox not found; install the Debian package 'busybox-static'"
  fi
}

# The spawn helper and the library lister, shared with image/runtime_kit.sh.
# shellcheck source=image/common.sh
source "$HERE/common.sh"
SPAWN_HELPER_PATH=/usr/libexec/waffle/spawn

# util-linux setpriv: the runner starts a command as `setsid setpriv --reuid=U
# --regid=G --clear-groups -- env -i ...`, exec'ing in place, so that Deno can
# posix_spawn it instead of forking the whole runner (busybox's setpriv has
# no uid options), where the spawn helper is missing. Optional: without
# helper and setpriv the runner forks as before.
find_setpriv() {
  local candidate
  for candidate in /usr/bin/setpriv /bin/setpriv; do
    if [[ -x "$candidate" ]] && "$candidate" --version 2>/dev/null | grep -q util-linux; then
      printf '%s\n' "$candidate"
      return
    fi
  done
  log "warning: util-linux setpriv not found (Debian package 'util-linux'): commands will" \
    "be started by forking the runner"
}

input_files() {
  local deno busybox setpriv
  deno="$(find_deno)"
  busybox="$(find_busybox)"
  setpriv="$(find_setpriv)"
  printf '%s\n' "$SELF" "$HERE/common.sh" "$busybox"
  spawn_helper_inputs
  [[ -z "$setpriv" ]] || printf '%s\n' "$setpriv"
  {
    libs_of "$deno"
    libs_of "$busybox"
    [[ -z "$setpriv" ]] || libs_of "$setpriv"
  } | sort -u
}

# Host path -> path inside the usr-merged rootfs (/lib64/x -> /usr/lib64/x).
usr_path() {
  case "$1" in
    /lib/* | /lib64/* | /lib32/* | /libx32/* | /bin/* | /sbin/*) printf '/usr%s\n' "$1" ;;
    *) printf '%s\n' "$1" ;;
  esac
}

build_into() {
  local root="$1" deno busybox setpriv lib dest applet libdirs
  deno="$(find_deno)"
  busybox="$(find_busybox)"
  setpriv="$(find_setpriv)"
  log "deno (for its libraries): $deno"
  log "busybox: $busybox"
  log "setpriv: ${setpriv:-none}"

  mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib,usr/local/bin,etc,root,tmp,var/tmp}
  mkdir -p "$root"/{workspace,queue,opt/waffle,proc,dev,sys}
  build_spawn_helper "$root$SPAWN_HELPER_PATH"
  # usr-merged layout, as on Debian bookworm: ldd's /lib64/... paths keep working.
  ln -s usr/bin "$root/bin"
  ln -s usr/sbin "$root/sbin"
  ln -s usr/lib "$root/lib"

  libdirs=()
  while IFS= read -r lib; do
    [[ -n "$lib" ]] || continue
    dest="$root$(usr_path "$lib")"
    case "$lib" in
      /lib64/*) [[ -e "$root/lib64" ]] || ln -s usr/lib64 "$root/lib64" ;;
    esac
    mkdir -p "$(dirname "$dest")"
    cp -L "$lib" "$dest"
    chmod 0755 "$dest"
    libdirs+=("$(dirname "$(usr_path "$lib")")")
    log "library: $lib"
  done < <({
    libs_of "$deno"
    libs_of "$busybox"
    [[ -z "$setpriv" ]] || libs_of "$setpriv"
  } | sort -u)
  [[ ${#libdirs[@]} -gt 0 ]] || die "ldd found no libraries for '$deno'"

  # Before the applets: it takes the place of busybox's setpriv.
  if [[ -n "$setpriv" ]]; then
    cp -L "$setpriv" "$root/usr/bin/setpriv"
    chmod 0755 "$root/usr/bin/setpriv"
  fi

  cp -L "$busybox" "$root/usr/bin/busybox"
  chmod 0755 "$root/usr/bin/busybox"
  local count=0
  while IFS= read -r applet; do
    [[ -n "$applet" && "$applet" != busybox && "$applet" != *[/[:space:]]* ]] || continue
    [[ -e "$root/usr/bin/$applet" ]] && continue
    ln -s busybox "$root/usr/bin/$applet"
    count=$((count + 1))
  done < <("$busybox" --list)
  log "busybox applets linked: $count"
  install_shims "$root"

  cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
waffle:x:10001:10001:waffle:/workspace:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
  cat >"$root/etc/group" <<'EOF'
root:x:0:
waffle:x:10001:
nogroup:x:65534:
EOF
  cat >"$root/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF
  printf '%s\n' "${libdirs[@]}" | sort -u >"$root/etc/ld.so.conf"
  if command -v ldconfig >/dev/null 2>&1; then
    ldconfig -r "$root" 2>/dev/null || log "ldconfig -r failed; relying on the default search path"
  fi

  chmod 1777 "$root/tmp" "$root/var/tmp"
  chmod 0700 "$root/root"
  chmod 0755 "$root/workspace" "$root/queue" "$root/opt/waffle"
  if [[ "$(id -u)" == 0 ]]; then
    chown -R 0:0 "$root"
    chown 10001:10001 "$root/workspace" "$root/queue"
  fi
}

# Small stand-ins for tools Debian's busybox does not build in.
install_shims() {
  local root="$1"
  if [[ ! -e "$root/usr/bin/nohup" ]]; then
    cat >"$root/usr/bin/nohup" <<'EOF'
#!/bin/sh
# waffle shim: busybox nohup (ignore SIGHUP, then exec the command)
if [ $# -eq 0 ]; then echo "Usage: nohup COMMAND [ARG]..." >&2; exit 125; fi
trap '' HUP
if [ -t 1 ]; then exec >>nohup.out; fi
if [ -t 2 ]; then exec 2>&1; fi
exec "$@"
EOF
    chmod 0755 "$root/usr/bin/nohup"
    log "shim: nohup"
  fi
  if [[ ! -e "$root/usr/bin/pgrep" ]]; then
    cat >"$root/usr/bin/pgrep" <<'EOF'
#!/bin/sh
# waffle shim: pgrep [-f] [-x] PATTERN (extended regex), prints matching pids
full=0; exact=0
while [ $# -gt 0 ]; do
  case "$1" in
    -f) full=1 ;;
    -x) exact=1 ;;
    -fx | -xf) full=1; exact=1 ;;
    --) shift; break ;;
    -*) echo "pgrep: unsupported option '$1'" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
if [ $# -ne 1 ]; then echo "Usage: pgrep [-f] [-x] PATTERN" >&2; exit 2; fi
# Never report this shim, its helpers, or the caller named in PGREP_EXCLUDE (pkill).
ps -o pid,ppid,comm,args | awk -v self="$$" -v other="${PGREP_EXCLUDE:--1}" \
  -v pat="$1" -v full="$full" -v exact="$exact" '
  NR > 1 {
    pid = $1; ppid = $2; comm = $3
    if (pid == self || ppid == self || pid == other || ppid == other) next
    $1 = ""; $2 = ""; $3 = ""; args = $0; sub(/^ +/, "", args)
    s = full ? args : comm
    if (exact ? s ~ ("^(" pat ")$") : s ~ pat) { print pid; n++ }
  }
  END { exit n ? 0 : 1 }'
EOF
    chmod 0755 "$root/usr/bin/pgrep"
    log "shim: pgrep"
  fi
  if [[ ! -e "$root/usr/bin/pkill" ]]; then
    cat >"$root/usr/bin/pkill" <<'EOF'
#!/bin/sh
# waffle shim: pkill [-SIGNAL] [-f] [-x] PATTERN, built on the pgrep shim
sig=TERM
case "${1:-}" in -f | -x | -fx | -xf | --) ;; -*) sig="${1#-}"; shift ;; esac
pids=$(PGREP_EXCLUDE=$$ pgrep "$@") || exit 1
# shellcheck disable=SC2086
kill -s "$sig" $pids
EOF
    chmod 0755 "$root/usr/bin/pkill"
    log "shim: pkill"
  fi
}

mode="${1:-}"
case "$mode" in
  --print-inputs)
    input_files
    ;;
  --out)
    [[ $# -eq 2 ]] || die "Usage: build_rootfs.sh --out DIR"
    [[ ! -e "$2" ]] || die "Output directory '$2' already exists"
    build_into "$2"
    log "rootfs ready in '$2'"
    ;;
  --tar)
    [[ $# -eq 2 ]] || die "Usage: build_rootfs.sh --tar FILE"
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/waffle-rootfs.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    build_into "$tmp/root"
    owner_flags=(--numeric-owner)
    if [[ "$(id -u)" != 0 ]]; then
      # Without root the files cannot be chowned; make the tarball root-owned at least.
      owner_flags+=(--owner=0 --group=0)
      log "warning: not root, so /workspace and /queue stay root-owned in the image"
    fi
    tar "${owner_flags[@]}" --sort=name -C "$tmp/root" -cf "$2" .
    log "rootfs tarball '$2' ($(du -h "$2" | cut -f1))"
    ;;
  *)
    die "Usage: build_rootfs.sh --tar FILE | --out DIR | --print-inputs"
    ;;
esac
