#!/usr/bin/env bash
# Prepare the llama.cpp peer so that it can travel to the GPU machine (see README.md beside this).
#
# Run HERE (a machine with network), from anywhere; it works in the repository root:
#   bash benchmarks/llamacpp_cuda/trim.sh
#
# It downloads the llama-cpp-python sdist (77 MB, mostly vocab GGUFs and docs), unpacks it into
# .peer/llama-cpp-python/, deletes what a CUDA build of the Python package and of llama-bench does
# not need, checks that CMake still configures the trimmed tree, downloads the diskcache wheel
# into .peer/wheels/, and prints the size of .peer. /.peer/ is ignored through .git/info/exclude.
#
# Environment:
#   PYTHON            python with pip (default: python3)
#   PEER_VERSION      llama-cpp-python version (default: 0.3.36, the `bench` extra's pin)
#   PEER_DL_CACHE     where the sdist is downloaded and kept between runs (default: /tmp/strata-peer-dl)
#   PEER_SKIP_CHECK=1 skip the CMake configure checks
set -euo pipefail

PYTHON=${PYTHON:-python3}
VERSION=${PEER_VERSION:-0.3.36}
DISKCACHE_VERSION=5.6.3
DL=${PEER_DL_CACHE:-/tmp/strata-peer-dl}

die() { echo "trim.sh: error: $*" >&2; exit 1; }
say() { echo "trim.sh: $*"; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
[ -f pyproject.toml ] && [ -d strata ] || die "$ROOT does not look like the strata repository root"
command -v cmake >/dev/null || die "cmake not found (needed for the configure check)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip"

# --- ignore /.peer/ the way /.whl/ is ignored: a line in .git/info/exclude, not .gitignore -------
EXCLUDE=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
touch "$EXCLUDE"
grep -qxF '/.peer/' "$EXCLUDE" || { echo '/.peer/' >>"$EXCLUDE"; say "added /.peer/ to $EXCLUDE"; }

# --- download the sdist (kept in $DL so that a re-run needs no network) ----------------------------
SDIST="$DL/llama_cpp_python-$VERSION.tar.gz"
if [ ! -s "$SDIST" ]; then
    mkdir -p "$DL"
    say "downloading the llama-cpp-python==$VERSION sdist into $DL"
    "$PYTHON" -m pip download --no-binary :all: --no-deps -d "$DL" "llama-cpp-python==$VERSION" \
        || die "pip download of llama-cpp-python==$VERSION failed"
fi
[ -s "$SDIST" ] || die "expected $SDIST after the download"
say "sdist: $SDIST ($(du -h "$SDIST" | cut -f1))"

# --- unpack -------------------------------------------------------------------------------------
PEER="$ROOT/.peer"
SRC="$PEER/llama-cpp-python"
# git (which llama.cpp's CMake asks for its build commit) must not climb into strata's own repo.
export GIT_CEILING_DIRECTORIES="$PEER"
rm -rf "$SRC"
mkdir -p "$SRC"
tar -xzf "$SDIST" -C "$SRC" --strip-components=1
[ -f "$SRC/pyproject.toml" ] && [ -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ] \
    || die "the sdist did not unpack as expected (no pyproject.toml or vendor/llama.cpp)"
say "unpacked: $(du -sh "$SRC" | cut -f1)"

# --- trim ---------------------------------------------------------------------------------------
L="$SRC/vendor/llama.cpp"
rmx() {  # remove paths relative to $1, each of which must exist (catches a layout change)
    local base=$1; shift
    local p
    for p in "$@"; do
        [ -e "$base/$p" ] || die "expected $base/$p to exist: has the sdist's layout changed?"
        rm -rf "${base:?}/$p"
    done
}
# A directory that some CMakeLists add_subdirectory()s under options this build leaves off (tests,
# examples, the server and its web UI, the unified app): keep an empty CMakeLists.txt so that any
# option set still configures, and the default targets only name sources that are here.
stub() {
    local p
    for p in "$@"; do
        [ -d "$L/$p" ] || die "expected directory $L/$p"
        rm -rf "${L:?}/$p"
        mkdir -p "$L/$p"
        printf '# %s: removed by strata benchmarks/llamacpp_cuda/trim.sh (not needed for llama-bench or the Python package).\nmessage(STATUS "llama.cpp %s: removed by trim.sh")\n' "$p" "$p" \
            >"$L/$p/CMakeLists.txt"
    done
}

# The sdist's .git (a 38 MB pack) only tells llama.cpp's commit: note it, for build.sh, then drop it.
COMMIT=$(git -C "$L" rev-parse --short=7 HEAD 2>/dev/null || true)
[ -n "$COMMIT" ] || die "could not read the vendored llama.cpp commit from the sdist's .git"
echo "$COMMIT" >"$SRC/LLAMA_CPP_COMMIT"
rmx "$SRC" .git .gitmodules
rmx "$L" .git .gitmodules

# The Python package: its docs, examples, tests and docker files. README.md and LICENSE.md stay
# (pyproject names README.md as the readme).
rmx "$SRC" docs examples tests docker scripts mkdocs.yml .github .readthedocs.yaml .dockerignore

# llama.cpp: documentation, vocab models (75 MB), benches, conversion scripts, CI, media.
rmx "$L" docs models benches media gguf-py conversion requirements requirements.txt scripts skills \
    grammars ci .devops .github .gemini .pi flake.nix build-xcframework.sh \
    convert_hf_to_gguf.py convert_hf_to_gguf_update.py convert_llama_ggml_to_gguf.py convert_lora_to_gguf.py
stub tests examples tools/server tools/ui tools/cli app

# ggml: every accelerator backend but CUDA (CPU, BLAS and RPC stay: small and generic).
rmx "$L/ggml/src" ggml-metal ggml-vulkan ggml-sycl ggml-opencl ggml-cann ggml-musa ggml-hip \
    ggml-hexagon ggml-webgpu ggml-zdnn ggml-zendnn ggml-virtgpu ggml-openvino ggml-et
# The CPU backend: only x86 code is compiled on an x86-64 host.
rmx "$L/ggml/src/ggml-cpu" arch/arm arch/loongarch arch/powerpc arch/riscv arch/s390 arch/wasm \
    spacemit kleidiai
# mtmd (built by the Python package) keeps its sources, not its sample media and tests.
rmx "$L/tools/mtmd" test-1.jpeg test-2.mp3 test-3.mp4 tests

cat >"$SRC/STRATA_TRIM.txt" <<EOF
llama-cpp-python==$VERSION sdist, trimmed by benchmarks/llamacpp_cuda/trim.sh on $(date -u +%Y-%m-%dT%H:%MZ).
vendored llama.cpp commit: $COMMIT
removed: docs, vocab models, tests/examples (stubbed CMakeLists), server + web UI + cli + app
(stubbed), non-CUDA accelerator backends, non-x86 CPU code, conversion scripts, CI files.
EOF

# --- the diskcache wheel (llama-cpp-python imports it; the GPU machine lacks it) --------------------
mkdir -p "$PEER/wheels"
rm -f "$PEER"/wheels/diskcache-*.whl
"$PYTHON" -m pip download --no-deps --only-binary=:all: -d "$PEER/wheels" "diskcache==$DISKCACHE_VERSION" \
    || die "pip download of diskcache==$DISKCACHE_VERSION failed"
ls "$PEER"/wheels/diskcache-*-py3-none-any.whl >/dev/null 2>&1 || die "no py3-none-any diskcache wheel in $PEER/wheels"

# --- check that CMake still configures the trimmed tree -----------------------------------------
if [ "${PEER_SKIP_CHECK:-0}" != 1 ]; then
    CHK=$(mktemp -d /tmp/strata-peer-cmake.XXXXXX)
    trap 'rm -rf "$CHK"' EXIT
    say "checking: cmake configure of vendor/llama.cpp, CPU, default options"
    cmake -S "$L" -B "$CHK/a" -DGGML_CUDA=OFF -DLLAMA_CURL=OFF >"$CHK/a.log" 2>&1 \
        || { tail -40 "$CHK/a.log" >&2; die "cmake configure (default options) failed: see above"; }
    say "checking: cmake configure of vendor/llama.cpp, CPU, the options build.sh uses"
    cmake -S "$L" -B "$CHK/b" -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_TOOLS=ON >"$CHK/b.log" 2>&1 \
        || { tail -40 "$CHK/b.log" >&2; die "cmake configure (build.sh options) failed: see above"; }
    say "checking: cmake configure of the Python package's CMakeLists (what scikit-build-core runs)"
    cmake -S "$SRC" -B "$CHK/c" -DGGML_CUDA=OFF -DLLAMA_OPENSSL=OFF -DSKBUILD_PLATLIB_DIR="$CHK/platlib" \
        >"$CHK/c.log" 2>&1 \
        || { tail -40 "$CHK/c.log" >&2; die "cmake configure of the Python package failed: see above"; }
    say "cmake configures: OK"
fi

# --- sizes ---------------------------------------------------------------------------------------
say "sizes:"
for p in "$SRC" "$PEER/wheels" "$PEER"; do du -sh "$p"; done | sed 's/^/  /'
BYTES=$(du -sb "$PEER" | cut -f1)
MIB=$((BYTES / 1048576))
say ".peer: $BYTES bytes ($MIB MiB); the device's limit is 64 MiB for the repo plus everything carried"
[ ! -e "$SRC/llama_cpp/lib" ] || die "unexpected $SRC/llama_cpp/lib (built libraries) in the trimmed tree"
[ "$MIB" -lt 45 ] || die ".peer is $MIB MiB, over the 45 MiB budget: trim more"
say "done. Carry \".peer\" in the device call and run benchmarks/llamacpp_cuda/build.sh there."
