#!/usr/bin/env bash
# run.sh - every GPU figure of bench/RESULTS.md in one go, on a machine with
# an NVIDIA GPU: the ceilings and quire's backend on the 1B and 8B bodies
# (bench_gpu), the real Qwen2.5-7B and Llama-3.2-1B shapes, long contexts,
# the projection kernel against cuBLAS, HF transformers on the
# same workloads (hf_peer.py, needs torch and transformers), and the engine
# end to end (bench/engine.sh, greedy and at temperature 0.8).
#
#     bash bench/gpu/run.sh [BUILD_DIR]      # default build-cuda
#
# Environment: SKIP_HF=1 leaves out the HF transformers peer.  Output: the
# tables on stdout, logs in bench/out/gpu-*.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$ROOT/build-cuda}
OUT=$ROOT/bench/out
mkdir -p "$OUT"
cd "$ROOT"
[ -x "$BUILD/bench_gpu" ] || { echo "run.sh: $BUILD/bench_gpu not found (cmake -B build-cuda && cmake --build build-cuda)" >&2; exit 2; }
C1=bench/configs/bench-1b-v32k.json
C8=bench/configs/bench-8b-v32k.json

echo "## quire on the GPU"
"$BUILD/bench_gpu" --config "$C1" --config "$C8" 2>"$OUT/gpu-bench.log" | tee "$OUT/gpu-bench.txt"
echo "## the real shapes, full vocabularies"
"$BUILD/bench_gpu" --config bench/configs/qwen2.5-7b-instruct.json --config bench/configs/llama-3.2-1b.json \
    --batches 1,8,64,256 2>>"$OUT/gpu-bench.log" | tee "$OUT/gpu-real.txt"
echo "## long contexts (4,000-4,064 positions)"
"$BUILD/bench_gpu" --config "$C1" --config "$C8" --batches 1,16 --prompt 4000 --gen 64 --prefill 0 \
    2>>"$OUT/gpu-bench.log" | tee "$OUT/gpu-long.txt"
echo "## the projection kernel against cuBLAS, one token"
"$BUILD/bench_gpu" --gemv 1 2>>"$OUT/gpu-bench.log" | tee "$OUT/gpu-gemv.txt"
if [ "${SKIP_HF:-0}" != 1 ]; then
    for c in "$C1" "$C8"; do
        echo "## HF transformers: $c"
        python3 bench/gpu/hf_peer.py --config "$c" --dtype float16 --decode-batches 1,64,256 --max-seconds 300 \
            2>&1 | tee "$OUT/gpu-hf-$(basename "$c" .json).txt" | tail -12
    done
fi
for t in 0 0.8; do
    echo "## the engine end to end, temperature $t"
    QUIRE_BIN="$BUILD/quire" RANDOM_WEIGHTS=$C1 EXTRA="--device cuda" GPU=1 TEMPERATURE=$t \
        bash bench/engine.sh | tee "$OUT/gpu-engine-t$t.txt"
done
