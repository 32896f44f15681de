#!/usr/bin/env bash
# Build the llama.cpp peer on the GPU machine (no network) from the tree trim.sh prepared.
#
# Run THERE, from the repository root, with ".peer" carried:
#   bash benchmarks/llamacpp_cuda/build.sh
#
# What it does (each step timed, a summary last):
#   1. llama.cpp (vendor/llama.cpp of llama-cpp-python) with CMake + ninja into $BUILD_DIR
#      (default /tmp/llama-build), CUDA for sm_$CUDA_ARCH: the shared libraries (llama, ggml*,
#      mtmd) and the tools llama-bench and llama-batched-bench, in $BUILD_DIR/bin.
#   2. llama-cpp-python into $SITE (default /tmp/site) with pip --no-build-isolation, and its
#      missing dependency diskcache from .peer/wheels. Two ways (PEER_PKG):
#        prebuilt (default): the package is installed without compiling anything
#          (-DLLAMA_BUILD=OFF) and the libraries of step 1 are copied into llama_cpp/lib. One
#          compile of ggml-cuda instead of two: the CUDA compile is ~5.5 min on 16 cores, and
#          a device command may run 10 min.
#        compile: the package compiles llama.cpp itself, as `pip install` would
#          (CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 ..."): a second CUDA
#          compile, another ~5.5 min; its build tree is kept in $PKG_BUILD_DIR.
#        none: skip step 2.
#   3. Checks: llama-bench starts, and `import llama_cpp` (PYTHONPATH=$SITE) loads the
#      libraries and reports GPU offload.
#
# Then, for example:
#   /tmp/llama-build/bin/llama-bench -m MODEL.gguf -p 512,2048 -n 128 -fa 1 -ngl 99 -r 3
#   PYTHONPATH=/tmp/site python3 -m strata.bench ...   (the llamacpp arm)
#
# Environment (defaults in brackets):
#   PYTHON [python3]  BUILD_DIR [/tmp/llama-build]  SITE [/tmp/site]  PKG_BUILD_DIR [/tmp/llama-pkg-build]
#   CUDA_ARCH [90]  JOBS [nproc]  PEER_PKG [prebuilt|compile|none]
#   PEER_CUDA [1]: 0 builds for the CPU only (to check this script on a machine without CUDA)
#   TARGETS [llama-bench llama-batched-bench]: extra tools to build in step 1
#   PEER_CONFIGURE_ONLY [0]: 1 stops after configuring step 1 (a quick check)
set -euo pipefail

PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-/tmp/llama-build}
SITE=${SITE:-/tmp/site}
PKG_BUILD_DIR=${PKG_BUILD_DIR:-/tmp/llama-pkg-build}
CUDA_ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
PEER_PKG=${PEER_PKG:-prebuilt}
PEER_CUDA=${PEER_CUDA:-1}
TARGETS=${TARGETS:-llama-bench llama-batched-bench}

die() { echo "build.sh: error: $*" >&2; exit 1; }
say() { echo "build.sh: $*"; }
SUMMARY=()
T0=$(date +%s)
timed() {  # timed LABEL CMD...: run, print and remember how long it took
    local label=$1; shift
    local t=$(date +%s)
    say "== $label"
    "$@"
    local dt=$(( $(date +%s) - t ))
    SUMMARY+=("$(printf '%-44s %4d s (%dm%02ds)' "$label" "$dt" $((dt / 60)) $((dt % 60)))")
    say "== $label: done in ${dt} s"
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PEER="$ROOT/.peer"
SRC="$PEER/llama-cpp-python"
L="$SRC/vendor/llama.cpp"
[ -f "$L/CMakeLists.txt" ] || die "no $L: run benchmarks/llamacpp_cuda/trim.sh here first, then carry \".peer\" to the device"
case "$PEER_PKG" in prebuilt|compile|none) ;; *) die "PEER_PKG must be prebuilt, compile or none (got '$PEER_PKG')" ;; esac

# llama.cpp's CMake asks git for its commit: stop git at .peer (not strata's repo), pass the one
# trim.sh noted instead.
export GIT_CEILING_DIRECTORIES="$PEER"
COMMIT=$(cat "$SRC/LLAMA_CPP_COMMIT" 2>/dev/null || echo unknown)

# --- tools -------------------------------------------------------------------------------------
command -v cmake >/dev/null || die "cmake not found"
GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); else say "ninja not found: using Makefiles"; fi
CUDA_FLAGS=(-DGGML_CUDA=OFF)
if [ "$PEER_CUDA" = 1 ]; then
    NVCC=""
    for c in /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
        if [ -n "$c" ] && [ -x "$c" ]; then NVCC=$c; break; fi
    done
    [ -n "$NVCC" ] || die "nvcc not found (looked at /usr/local/cuda/bin/nvcc and PATH); PEER_CUDA=0 builds for the CPU"
    say "nvcc: $NVCC ($("$NVCC" --version | grep -o 'release [0-9.]*' || true))"
    export CUDACXX=$NVCC
    CUDA_FLAGS=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH" "-DCMAKE_CUDA_COMPILER=$NVCC")
    # ggml-cuda links cuBLAS. Where the toolkit beside nvcc lacks it, fall back to the pip wheel
    # (nvidia-cublas, which torch uses) if python has one; its headers and .so.NN carry no
    # unversioned link, so name the libraries to FindCUDAToolkit directly.
    CUDA_ROOT=$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)
    if ! find "$CUDA_ROOT"/ -name cublas_v2.h 2>/dev/null | grep -q .; then
        say "no cublas_v2.h in $CUDA_ROOT: looking for the nvidia-cublas wheel of $PYTHON"
        NV=$("$PYTHON" -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || true)
        HDR=$([ -n "$NV" ] && find "$NV/nvidia" -name cublas_v2.h 2>/dev/null | head -1 || true)
        LIB=$([ -n "$NV" ] && find "$NV/nvidia" -name 'libcublas.so*' 2>/dev/null | sort | head -1 || true)
        LIBLT=$([ -n "$NV" ] && find "$NV/nvidia" -name 'libcublasLt.so*' 2>/dev/null | sort | head -1 || true)
        [ -n "$HDR" ] && [ -n "$LIB" ] && [ -n "$LIBLT" ] \
            || die "cuBLAS not found: neither in $CUDA_ROOT nor in $PYTHON's nvidia packages"
        INC=$(dirname "$HDR")
        say "cuBLAS from the wheel: $LIB, $LIBLT, headers $INC"
        CUDA_FLAGS+=("-DCUDA_cublas_LIBRARY=$LIB" "-DCUDA_cublasLt_LIBRARY=$LIBLT"
                     "-DCMAKE_CUDA_FLAGS=-I$INC" "-DCMAKE_CXX_FLAGS=-I$INC" "-DCMAKE_C_FLAGS=-I$INC")
    fi
    # ggml-cuda also links the driver (libcuda, for its VMM memory pool). A toolkit put together
    # from pip wheels has no lib64/stubs/libcuda.so: then name the driver's own library.
    if ! find "$CUDA_ROOT"/ -name 'libcuda.so' 2>/dev/null | grep -q .; then
        DRV=""
        for d in ${CUDA_DRIVER_DIRS:-} /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
            for f in "$d/libcuda.so" "$d/libcuda.so.1"; do
                if [ -e "$f" ]; then DRV=$f; break 2; fi
            done
        done
        [ -n "$DRV" ] || DRV=$(ldconfig -p 2>/dev/null | grep -o '/[^ ]*/libcuda\.so[.0-9]*$' | head -1 || true)
        [ -n "$DRV" ] || die "no libcuda.so stub in $CUDA_ROOT and no driver libcuda.so found (set CUDA_DRIVER_DIRS)"
        say "driver library: $DRV (the toolkit has no stubs/libcuda.so)"
        CUDA_FLAGS+=("-DCUDA_cuda_driver_LIBRARY=$DRV")
    fi
fi
say "cmake $(cmake --version | head -1 | grep -o '[0-9][0-9.]*'), jobs $JOBS, llama.cpp commit $COMMIT, python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"

# Options common to both builds: no network (curl, openssl), no server / web UI.
COMMON_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "-DLLAMA_BUILD_COMMIT=$COMMIT")

# --- 1. llama.cpp: libraries + llama-bench ---------------------------------------------------
build_llama() {
    # CMAKE_BUILD_RPATH_USE_ORIGIN: the libraries find each other through $ORIGIN, so the copies
    # put into the Python package in step 2 load without this build tree.
    cmake -S "$L" -B "$BUILD_DIR" ${GEN[@]+"${GEN[@]}"} "${COMMON_FLAGS[@]}" "${CUDA_FLAGS[@]}" \
        -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON \
        || die "cmake configure of $L failed"
    if [ "${PEER_CONFIGURE_ONLY:-0}" = 1 ]; then say "PEER_CONFIGURE_ONLY=1: configured $BUILD_DIR, stopping"; exit 0; fi
    # shellcheck disable=SC2086
    cmake --build "$BUILD_DIR" --config Release -j "$JOBS" --target $TARGETS llama ggml mtmd \
        || die "cmake build failed"
    [ -x "$BUILD_DIR/bin/llama-bench" ] || die "no $BUILD_DIR/bin/llama-bench after the build"
}
if [ "$PEER_CUDA" = 1 ]; then WHAT="CUDA sm_$CUDA_ARCH"; else WHAT="CPU only"; fi
timed "llama.cpp build ($WHAT): $TARGETS" build_llama

# --- 2. the Python package -------------------------------------------------------------------
pip_install_pkg() {  # CMAKE_ARGS in the environment
    "$PYTHON" -c 'import scikit_build_core' 2>/dev/null \
        || die "scikit-build-core is not importable by $PYTHON (pip --no-build-isolation needs it installed)"
    mkdir -p "$SITE"
    # --no-index: no network there. --no-build-isolation: use the installed scikit-build-core and
    # cmake/ninja. --upgrade: replace an earlier llama_cpp in $SITE.
    "$PYTHON" -m pip install --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
        --upgrade --target "$SITE" --config-settings="build-dir=$PKG_BUILD_DIR" "$SRC" \
        || die "pip install of $SRC failed"
    # The package's CMakeLists also installs its libraries into the source tree (llama_cpp/lib):
    # drop them, so that the carried tree stays as trim.sh left it.
    rm -rf "$SRC/llama_cpp/lib"
}
install_prebuilt() {
    CMAKE_ARGS="-DLLAMA_BUILD=OFF" pip_install_pkg
    local lib="$SITE/llama_cpp/lib"
    mkdir -p "$lib"
    # The shared libraries of step 1 (llama, llama-common, ggml*, mtmd), symlinks kept.
    local n=0 f
    for f in "$BUILD_DIR"/bin/lib*.so*; do
        cp -P "$f" "$lib/"
        n=$((n + 1))
    done
    [ "$n" -gt 0 ] && [ -e "$lib/libllama.so" ] && [ -e "$lib/libggml.so" ] \
        || die "no libllama.so / libggml.so copied from $BUILD_DIR/bin"
    say "copied $n libraries into $lib"
}
install_compiled() {
    local flags="${CUDA_FLAGS[*]} ${COMMON_FLAGS[*]}"
    say "CMAKE_ARGS=$flags"
    CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" pip_install_pkg
}
install_diskcache() {
    local whl
    whl=$(ls "$PEER"/wheels/diskcache-*.whl 2>/dev/null | head -1) \
        || die "no diskcache wheel in $PEER/wheels (trim.sh downloads it)"
    if [ -n "$whl" ]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$whl" \
            || die "pip install of $whl failed"
    fi
}
case "$PEER_PKG" in
    prebuilt) timed "llama-cpp-python install (libraries of step 1)" install_prebuilt ;;
    compile) timed "llama-cpp-python install (compiles llama.cpp)" install_compiled ;;
    none) say "PEER_PKG=none: the Python package is not installed" ;;
esac
[ "$PEER_PKG" = none ] || timed "diskcache install" install_diskcache

# --- 3. checks ------------------------------------------------------------------------------------
say "== checks"
"$BUILD_DIR/bin/llama-bench" --help >/dev/null 2>&1 || die "$BUILD_DIR/bin/llama-bench --help failed"
say "llama-bench: $BUILD_DIR/bin/llama-bench runs"
if [ "$PEER_CUDA" = 1 ]; then
    ls "$BUILD_DIR"/bin/libggml-cuda.so* >/dev/null 2>&1 || die "no libggml-cuda.so in $BUILD_DIR/bin"
fi
if [ "$PEER_PKG" != none ]; then
    PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PEER_CUDA="$PEER_CUDA" "$PYTHON" - <<'EOF' || die "import llama_cpp from $SITE failed"
import os
import llama_cpp
import diskcache  # noqa: F401  (llama_cpp.llama_cache needs it)
gpu = bool(llama_cpp.llama_supports_gpu_offload())
print(f"build.sh: llama_cpp {llama_cpp.__version__} from {os.path.dirname(llama_cpp.__file__)}; GPU offload: {gpu}")
print("build.sh: system info:", llama_cpp.llama_print_system_info().decode(errors="replace").strip())
if os.environ["PEER_CUDA"] == "1" and not gpu:
    raise SystemExit("build.sh: error: llama_cpp was built without GPU offload")
EOF
fi

say "summary (total $(( $(date +%s) - T0 )) s):"
for s in "${SUMMARY[@]}"; do echo "  $s"; done
say "llama-bench: $BUILD_DIR/bin/llama-bench"
[ "$PEER_PKG" = none ] || say "Python package: PYTHONPATH=$SITE"
