#!/usr/bin/env bash
# families.sh - the new families on one GPU beside llama.cpp, in one run:
# quire's CUDA backend (bench_gpu: random bf16 weights in each config's
# shape) and llama.cpp (CUDA, flash attention on, every layer on the GPU) on
# F16 GGUF files of the same shapes written by bench/make_model.py --config
# (random weights; one file at a time on disk).  Rows: decode at batch 1
# (128 tokens after a 128-token prompt: llama-bench tg128 at depth 128),
# decode of 256 sequences (128 + 128 each: llama-batched-bench -npp 128
# -ntg 128 -npl 256, its S_TG) and prefill of one 2,048-token prompt
# (llama-bench pp2048).
#
#     bash bench/gpu/families.sh BENCH_GPU LLAMA_BIN_DIR [CONFIG ...]
#
# LLAMA_BIN_DIR holds llama-bench and llama-batched-bench
# (GPU=1 bash bench/build_llamacpp.sh).  CONFIGs default to the four of
# issue 28.  GGUF_DIR (default /tmp/quire-families) holds the files while
# they are measured.  Output: quire's tables, llama.cpp's, then one table of
# both, on stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BENCH=${1:?usage: families.sh BENCH_GPU LLAMA_BIN_DIR [CONFIG ...]}
LBIN=${2:?usage: families.sh BENCH_GPU LLAMA_BIN_DIR [CONFIG ...]}
shift 2
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(qwen3-8b gemma-3-12b-text mistral-7b-instruct-v0.3 phi-4-mini-instruct)
GG=${GGUF_DIR:-/tmp/quire-families}
PY=${PYTHON:-python3}
mkdir -p "$GG"
# SKIP_QUIRE=1 or SKIP_LLAMA=1 leaves a side out (its tables from an earlier
# run in GGUF_DIR, if any, still fill the last table).
for c in "${CONFIGS[@]}"; do
    cfg=$ROOT/bench/configs/$c.json
    [ -f "$cfg" ] || cfg=$c
    name=$(basename "$cfg" .json)
    if [ "${SKIP_QUIRE:-0}" != 1 ]; then
        echo "## quire: $name"
        "$BENCH" --config "$cfg" --batches 1,256 --prompt 128 --gen 128 --prefill 2048 2>>"$GG/$name.quire.log" |
            tee "$GG/$name.quire.txt"
    fi
done
for c in "${CONFIGS[@]}"; do
    cfg=$ROOT/bench/configs/$c.json
    [ -f "$cfg" ] || cfg=$c
    name=$(basename "$cfg" .json)
    [ "${SKIP_LLAMA:-0}" != 1 ] || continue
    f=$GG/$name.gguf
    t0=$(date +%s)
    "$PY" "$ROOT/bench/make_model.py" --config "$cfg" --dtype f16 --fill tile --out "$f"
    echo "(GGUF written in $(( $(date +%s) - t0 )) s)"
    echo "## llama.cpp: $name"
    log=$GG/$name.llama.log
    "$LBIN/llama-bench" -m "$f" -ngl 99 -fa on -p 2048 -n 0 -r 3 -o md 2>>"$log" | tee "$GG/$name.lpp.txt"
    "$LBIN/llama-bench" -m "$f" -ngl 99 -fa on -p 0 -n 128 -d 128 -r 3 -o md 2>>"$log" | tee "$GG/$name.ltg.txt"
    "$LBIN/llama-batched-bench" -m "$f" -ngl 99 -fa on -c $((256 * 256 + 256)) -b 2048 -ub 512 \
        -npp 128 -ntg 128 -npl 256 2>>"$log" | tee "$GG/$name.lbb.txt"
    rm -f "$f"
done
declare -A L1 L256 LPP Q1 Q256 QPP QF
for c in "${CONFIGS[@]}"; do
    name=$(basename "$c" .json)
    # the rows as bench_gpu prints them: "| decode, batch 1, context 128-256 (tok/s, sum) | 123 | | |"
    row() { [ -f "$GG/$name.quire.txt" ] && awk -F'|' -v pat="$1" -v col="$2" \
        'index($2, pat) == 2 {gsub(/[ ,*]/, "", $col); print $col; exit}' "$GG/$name.quire.txt" || true; }
    Q1[$name]=$(row "decode, batch 1, context" 3)
    Q256[$name]=$(row "decode, batch 256, context" 3)
    QPP[$name]=$(row "prefill, " 3)
    QF[$name]=$(row "decode, batch 1: ms per token" 5 | sed 's/%.*/%/')
    cell() { [ -f "$GG/$name.$1.txt" ] && awk -F'|' -v pat="$2" \
        'index($0, pat) {split($(NF-1), a, "±"); gsub(/ /, "", a[1]); print a[1]; exit}' "$GG/$name.$1.txt" || true; }
    LPP[$name]=$(cell lpp pp2048)
    L1[$name]=$(cell ltg tg128)
    L256[$name]=$([ -f "$GG/$name.lbb.txt" ] && awk -F'|' '$2 ~ /^ *128 *$/ && $4 ~ /^ *256 *$/ {gsub(/ /, "", $9); print $9; exit}' \
        "$GG/$name.lbb.txt" || true)
done
echo
echo "| model | decode batch 1: quire tok/s (share of floor) | llama.cpp | decode 256 seqs: quire tok/s | llama.cpp | prefill 2,048: quire tok/s | llama.cpp |"
echo "|---|---|---|---|---|---|---|"
for c in "${CONFIGS[@]}"; do
    name=$(basename "$c" .json)
    echo "| $name | ${Q1[$name]} (${QF[$name]}) | ${L1[$name]} | ${Q256[$name]} | ${L256[$name]} | ${QPP[$name]} | ${LPP[$name]} |"
done
