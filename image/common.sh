# Shell functions shared by image/build_rootfs.sh and image/runtime_kit.sh
# (sourced; the caller defines log, die and HERE).

# The spawn helper: its source, installed path, and the compiler that builds it.
SPAWN_HELPER_SOURCE="$HERE/spawn_helper.c"
# The runtime kit's metadata reader (the in-sandbox half of E2B file metadata).
METADATA_HELPER_SOURCE="$HERE/metadata_helper.c"

# The compiler's absolute path; dies unless it links static programs.
find_cc() {
  local cc="${CC:-gcc}" path libc
  path="$(command -v "$cc" 2>/dev/null)" ||
    die "C compiler '$cc' not found: the spawn helper is built with it" \
      "(apt-get install -y gcc libc6-dev, or run scripts/setup.sh --docker as root)"
  libc="$("$path" -print-file-name=libc.a 2>/dev/null || true)"
  [[ "$libc" == /* && -f "$libc" ]] ||
    die "'$path' has no static C library (libc.a): apt-get install -y libc6-dev"
  printf '%s\n' "$path"
}

# Host files that shape the helper: its source, the compiler driver, and libc.a.
spawn_helper_inputs() {
  local cc
  cc="$(find_cc)"
  printf '%s\n' "$SPAWN_HELPER_SOURCE" "$(readlink -f "$cc")" \
    "$(readlink -f "$("$cc" -print-file-name=libc.a)")"
}

# Compiles the static helper to $1 and checks it is static.
build_spawn_helper() {
  build_static_helper "$SPAWN_HELPER_SOURCE" "$1"
}

# Compiles the C source $1 to the static program $2 and checks it is static.
build_static_helper() {
  local source="$1" out="$2" cc headers
  cc="$(find_cc)"
  mkdir -p "$(dirname "$out")"
  chmod 0755 "$(dirname "$out")" "$(dirname "$(dirname "$out")")"
  "$cc" -static -Os -Wall -Wextra -Werror -s -o "$out" "$source" ||
    die "Could not compile '$source' with '$cc -static'"
  # Static: the spawn helper runs as root with the request's environment, so
  # no loader may honour LD_PRELOAD in it (runner/spawn.ts refuses a dynamic
  # one anyway); and a kit helper must run in any image, with no libc.
  headers="$(LC_ALL=C readelf -lW "$out")" || die "readelf (binutils) cannot read '$out'"
  ! grep -q 'INTERP' <<<"$headers" || die "'$out' came out dynamically linked"
  chmod 0755 "$out"
  log "static helper: $out ($(stat -c %s "$out") bytes, $cc -static -Os)"
}

# Shared libraries (absolute paths, as the dynamic linker looks them up) of a binary.
libs_of() {
  local out
  # A static binary makes ldd fail with "not a dynamic executable": no libraries.
  out="$(LC_ALL=C ldd "$1" 2>/dev/null)" || return 0
  printf '%s\n' "$out" | awk '
    $2 == "=>" && $3 ~ /^\// { print $3; next }
    $1 ~ /^\// { print $1 }
  ' | sort -u
}
