#!/usr/bin/env bash
# build_llamacpp.sh - builds llama.cpp's llama-bench and llama-batched-bench
# from the llama.cpp sources vendored in PyPI's llama-cpp-python sdist, for
# measuring the peer on the same machine:
#
#     bash bench/build_llamacpp.sh            # CPU (-march=native); prints the llama-bench path
#     LLAMA_BENCH=$(bash bench/build_llamacpp.sh) bash bench/generate.sh
#     GPU=1 bash bench/build_llamacpp.sh      # CUDA (sm_90 unless CUDA_ARCH says otherwise)
#
# LLAMA_CPP_SRC names a llama.cpp source tree to build instead of fetching
# the sdist (a machine without PyPI: bench/gpu/families.sh unpacks one from
# a tarball made by `bash bench/build_llamacpp.sh pack FILE.tar.xz`).
#
# Nothing of llama.cpp is committed: it is fetched into bench/peer/
# (git-ignored) and built there.  Needs cmake and a C++ compiler (and nvcc
# for GPU=1); takes several minutes on 2 cores, about 6 on 16 with CUDA.
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/peer
fetch() {
    mkdir -p "$DIR"
    local src=$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp
    if [ ! -d "$src" ]; then
        python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DIR" >&2
        tar xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
    fi
    echo "$src"
}
if [ "${1:-}" = pack ]; then
    # The parts of the tree the build reads (about 5 MB as tar.xz), for carrying to a machine without PyPI.
    out=$(realpath -m "${2:?usage: build_llamacpp.sh pack FILE.tar.xz}")
    src=$(fetch)
    tar cf - -C "$(dirname "$src")" --exclude=llama.cpp/tools/ui llama.cpp/CMakeLists.txt llama.cpp/cmake \
        llama.cpp/ggml llama.cpp/src llama.cpp/include llama.cpp/common llama.cpp/vendor llama.cpp/tools \
        llama.cpp/scripts llama.cpp/licenses llama.cpp/app llama.cpp/LICENSE | xz -9 -T2 > "$out"
    echo "$out"
    exit 0
fi
src=${LLAMA_CPP_SRC:-$(fetch)}
if [ "${GPU:-0}" = 1 ]; then
    build=$src/build-cuda
    flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_NATIVE=OFF)
else
    build=$src/build
    flags=(-DGGML_NATIVE=ON -DGGML_CUDA=OFF)
fi
bin=$build/bin/llama-bench
if [ ! -x "$bin" ] || [ ! -x "$build/bin/llama-batched-bench" ]; then
    cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF >&2
    cmake --build "$build" -j "$(nproc)" --target llama-bench llama-batched-bench >&2
fi
echo "$bin"
