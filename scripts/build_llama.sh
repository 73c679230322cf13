#!/usr/bin/env bash
# Build llama.cpp's `llama-eval-callback` from the llama.cpp sources vendored in the
# llama-cpp-python 0.3.36 sdist (the sources that produced the dumps in fixtures/).
#
# Installs into a cache folder outside the repository:
#   ${ATTNCHECK_LLAMA_DIR:-$HOME/.cache/attncheck/llama-0.3.36}/bin/llama-eval-callback
# The binary is linked statically against llama/ggml (-DBUILD_SHARED_LIBS=OFF), so it
# runs from there. If a working binary is already there, nothing is built.
#
# Progress and build logs go to stderr; the last line of stdout is the binary path.
#
# Environment:
#   ATTNCHECK_LLAMA_DIR   install folder (default: $HOME/.cache/attncheck/llama-0.3.36)
#   ATTNCHECK_BUILD_JOBS  parallel build jobs (default: 2)
#   ATTNCHECK_NATIVE      ON (default) tunes ggml for this CPU; OFF for a portable binary
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
# sha256 of llama_cpp_python-0.3.36.tar.gz on PyPI (sdists there never change)
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
DIR="${ATTNCHECK_LLAMA_DIR:-$HOME/.cache/attncheck/llama-${LLAMA_CPP_PYTHON_VERSION}}"
BIN="$DIR/bin/llama-eval-callback"
JOBS="${ATTNCHECK_BUILD_JOBS:-2}"
NATIVE="${ATTNCHECK_NATIVE:-ON}"

log() { printf '[build_llama +%ss] %s\n' "$SECONDS" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The binary "runs" if `--version` (or `--help`) exits cleanly.
binary_runs() {
    [ -x "$1" ] || return 1
    "$1" --version >/dev/null 2>&1 && return 0
    "$1" --help >/dev/null 2>&1
}

if binary_runs "$BIN"; then
    log "already built"
    printf '%s\n' "$BIN"
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

# --- sources -----------------------------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/attncheck-llama.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

start=$(date +%s)
log "downloading llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION} sdist"
# `--no-binary llama-cpp-python` (not `:all:`): the same sdist, but pip may use wheels for
# the build backend it installs to read the sdist's metadata; with `:all:` it builds
# scikit-build-core and its whole build chain from source first (minutes instead of seconds).
python3 -m pip download --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" -d "$WORK/sdist" >&2

sdist=$(find "$WORK/sdist" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' -print -quit)
[ -n "$sdist" ] || sdist=$(find "$WORK/sdist" -maxdepth 1 -name 'llama-cpp-python-*.tar.gz' -print -quit)
[ -n "$sdist" ] || die "sdist not found after pip download"
if command -v sha256sum >/dev/null 2>&1; then
    got=$(sha256sum "$sdist" | cut -d' ' -f1)
    [ "$got" = "$SDIST_SHA256" ] || die "sha256 of $(basename "$sdist") is $got, expected $SDIST_SHA256"
fi
tar -xzf "$sdist" -C "$WORK"
SRC=$(find "$WORK" -maxdepth 3 -type d -path '*/vendor/llama.cpp' -print -quit)
[ -n "$SRC" ] && [ -f "$SRC/CMakeLists.txt" ] || die "vendor/llama.cpp not found in the sdist"

# --- build -------------------------------------------------------------------
# LLAMA_CURL is not passed: this llama.cpp no longer uses curl (the option is
# deprecated and ignored). LLAMA_OPENSSL=OFF keeps libssl-dev out of the build.
log "configuring ${SRC#"$WORK"/}"
cmake -S "$SRC" -B "$WORK/build" \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_NATIVE="$NATIVE" \
    -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_BUILD_TYPE=Release >&2

log "building llama-eval-callback with -j${JOBS}"
cmake --build "$WORK/build" --target llama-eval-callback -j"$JOBS" >&2

built="$WORK/build/bin/llama-eval-callback"
[ -x "$built" ] || die "build finished but $built is missing"

# --- install -----------------------------------------------------------------
mkdir -p "$DIR/bin"
cp "$built" "$BIN.tmp.$$"
mv -f "$BIN.tmp.$$" "$BIN"

if command -v ldd >/dev/null 2>&1 && ldd "$BIN" 2>/dev/null | grep -q 'not found'; then
    ldd "$BIN" >&2 || true
    die "installed binary has unresolved shared libraries"
fi
binary_runs "$BIN" || die "installed binary does not run: $BIN"

end=$(date +%s)
{
    echo "llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION} (vendor/llama.cpp)"
    echo "cmake: -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=${NATIVE} -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((end - start)) s"
} > "$DIR/BUILD-INFO"

log "built in $((end - start)) s"
printf '%s\n' "$BIN"
