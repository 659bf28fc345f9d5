#!/usr/bin/env bash
# build_llamacpp.sh - builds llama.cpp's llama-bench (CPU, -march=native) from
# the llama.cpp sources vendored in PyPI's llama-cpp-python sdist, for
# measuring the peer on the same machine:
#
#     bash bench/build_llamacpp.sh            # prints the llama-bench path
#     LLAMA_BENCH=$(bash bench/build_llamacpp.sh) bash bench/generate.sh
#
# Nothing of llama.cpp is committed: it is fetched into bench/peer/
# (git-ignored) and built there.  Needs cmake and a C++ compiler; takes
# several minutes on 2 cores.
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/peer
mkdir -p "$DIR"
src=$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp
bin=$src/build/bin/llama-bench
if [ ! -x "$bin" ]; then
    if [ ! -d "$src" ]; then
        python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DIR" >&2
        tar xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
    fi
    cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
    cmake --build "$src/build" -j "$(nproc)" --target llama-bench >&2
fi
echo "$bin"
