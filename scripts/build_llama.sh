#!/usr/bin/env bash
# Build llama.cpp's `llama-eval-callback` and `llama-quantize` from the llama.cpp sources vendored in a
# llama-cpp-python sdist: 0.3.36 (the sources that produced the dumps in fixtures/, the default) or 0.2.90
# (August 2024, the older `ggml_debug:` format, for the upgrade tests of `attncheck diff`).
#
#   scripts/build_llama.sh [VERSION]      # last line of stdout: the llama-eval-callback path
#
# Installs into a cache folder outside the repository:
#   ${ATTNCHECK_LLAMA_DIR:-$HOME/.cache/attncheck/llama-VERSION}/bin/{llama-eval-callback,llama-quantize}
#   .../src      the llama.cpp sources (the ground truth per architecture: src/models/<arch>.cpp, gguf-py/)
#   .../build    the cmake build folder, so a missing target is built without rebuilding the rest
# The binaries are linked statically against llama/ggml (-DBUILD_SHARED_LIBS=OFF), so they run from there.
# Each target that already runs is kept; only missing ones are built.
#
# Progress and build logs go to stderr; the last line of stdout is the llama-eval-callback path.
#
# Environment:
#   ATTNCHECK_LLAMA_DIR   install folder (default: $HOME/.cache/attncheck/llama-VERSION)
#   ATTNCHECK_BUILD_JOBS  parallel build jobs (default: 2)
#   ATTNCHECK_NATIVE      ON (default) tunes ggml for this CPU; OFF for a portable binary
set -euo pipefail

VERSION="${1:-0.3.36}"
# sha256 of each sdist on PyPI (sdists there never change)
case "$VERSION" in
    0.3.36) SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e ;;
    0.2.90) SDIST_SHA256=419b041c62dbdb9f7e67883a6ef2f247d583d08417058776be0bff05b4ec9e3d ;;
    *) printf 'build_llama: unknown version %s (0.3.36 or 0.2.90)\n' "$VERSION" >&2; exit 2 ;;
esac
DIR="${ATTNCHECK_LLAMA_DIR:-$HOME/.cache/attncheck/llama-${VERSION}}"
TARGETS=(llama-eval-callback llama-quantize)
JOBS="${ATTNCHECK_BUILD_JOBS:-2}"
NATIVE="${ATTNCHECK_NATIVE:-ON}"

log() { printf '[build_llama %s +%ss] %s\n' "$VERSION" "$SECONDS" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# A binary "runs" if `--version` (or `--help`) exits cleanly; llama-quantize prints its usage and exits 1.
binary_runs() {
    [ -x "$1" ] || return 1
    "$1" --version >/dev/null 2>&1 && return 0
    "$1" --help >/dev/null 2>&1 && return 0
    # `|| true`: under pipefail the binary's own exit 1 (or SIGPIPE once grep -q has matched) would fail the pipe
    { "$1" --help 2>&1 || true; } | grep -qi usage
}

missing_targets=()
for t in "${TARGETS[@]}"; do
    binary_runs "$DIR/bin/$t" || missing_targets+=("$t")
done
if [ "${#missing_targets[@]}" -eq 0 ] && [ -f "$DIR/src/CMakeLists.txt" ]; then
    log "already built"
    printf '%s\n' "$DIR/bin/llama-eval-callback"
    exit 0
fi

# --- build tools -------------------------------------------------------------
have_pip() { command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; }

missing=()
for tool in gcc g++ make cmake tar; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
have_pip || missing+=("python3-pip")

if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing missing tools (${missing[*]}) with apt-get"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update >&2
        pkgs=()
        for tool in "${missing[@]}"; do
            case "$tool" in
                gcc|g++|make) pkgs+=(build-essential) ;;
                cmake) pkgs+=(cmake) ;;
                tar) pkgs+=(tar) ;;
                python3-pip) pkgs+=(python3 python3-pip) ;;
            esac
        done
        # shellcheck disable=SC2046
        apt-get install -y --no-install-recommends $(printf '%s\n' "${pkgs[@]}" | sort -u) >&2
    else
        die "missing tools: ${missing[*]} (install build-essential, cmake and python3-pip, or run as root)"
    fi
fi
have_pip || die "python3 -m pip does not work"

start=$(date +%s)
mkdir -p "$DIR/bin"

# --- sources (kept in $DIR/src) ----------------------------------------------
if [ ! -f "$DIR/src/CMakeLists.txt" ]; then
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/attncheck-llama.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
    log "downloading llama-cpp-python==${VERSION} sdist"
    # `--no-binary llama-cpp-python` (not `:all:`): the same sdist, but pip may use wheels for
    # the build backend it installs to read the sdist's metadata; with `:all:` it builds
    # scikit-build-core and its whole build chain from source first (minutes instead of seconds).
    python3 -m pip download --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==${VERSION}" -d "$WORK/sdist" >&2
    sdist=$(find "$WORK/sdist" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' -print -quit)
    [ -n "$sdist" ] || sdist=$(find "$WORK/sdist" -maxdepth 1 -name 'llama-cpp-python-*.tar.gz' -print -quit)
    [ -n "$sdist" ] || die "sdist not found after pip download"
    if command -v sha256sum >/dev/null 2>&1; then
        got=$(sha256sum "$sdist" | cut -d' ' -f1)
        [ "$got" = "$SDIST_SHA256" ] || die "sha256 of $(basename "$sdist") is $got, expected $SDIST_SHA256"
    fi
    tar -xzf "$sdist" -C "$WORK"
    src=$(find "$WORK" -maxdepth 3 -type d -path '*/vendor/llama.cpp' -print -quit)
    [ -n "$src" ] && [ -f "$src/CMakeLists.txt" ] || die "vendor/llama.cpp not found in the sdist"
    rm -rf "$DIR/src" "$DIR/build"
    mv "$src" "$DIR/src"
fi
SRC="$DIR/src"

# --- build -------------------------------------------------------------------
# LLAMA_CURL=OFF: 0.3.36 no longer uses curl (the option is ignored there); 0.2.90 would look for libcurl.
# LLAMA_OPENSSL=OFF keeps libssl-dev out of the build.
FLAGS=(-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
       -DGGML_NATIVE="$NATIVE" -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release)
if [ ! -f "$DIR/build/CMakeCache.txt" ]; then
    log "configuring $SRC"
    cmake -S "$SRC" -B "$DIR/build" "${FLAGS[@]}" >&2
fi
for t in "${missing_targets[@]}"; do
    log "building $t with -j${JOBS}"
    cmake --build "$DIR/build" --target "$t" -j"$JOBS" >&2
    built="$DIR/build/bin/$t"
    [ -x "$built" ] || die "build finished but $built is missing"
    cp "$built" "$DIR/bin/$t.tmp.$$"
    mv -f "$DIR/bin/$t.tmp.$$" "$DIR/bin/$t"
    if command -v ldd >/dev/null 2>&1 && ldd "$DIR/bin/$t" 2>/dev/null | grep -q 'not found'; then
        ldd "$DIR/bin/$t" >&2 || true
        die "installed binary has unresolved shared libraries"
    fi
    binary_runs "$DIR/bin/$t" || die "installed binary does not run: $DIR/bin/$t"
done

end=$(date +%s)
{
    echo "llama-cpp-python ${VERSION} (vendor/llama.cpp, kept in src/)"
    echo "cmake: ${FLAGS[*]}"
    echo "targets: ${TARGETS[*]}"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((end - start)) s"
} > "$DIR/BUILD-INFO"

log "built in $((end - start)) s"
printf '%s\n' "$DIR/bin/llama-eval-callback"
