#!/usr/bin/env bash
# engine.sh - the engine under load: continuous vs static batching, KV
# utilisation, and throughput as the token budget varies.
#
#     bash bench/engine.sh [MODEL]     # default: bench/models/24m-f32.gguf (made if missing)
#
# Workload: 256 requests, prompts of 8-64 random token ids, output lengths
# drawn uniformly from 16-512 (ignore_eos, greedy), all submitted at once
# (`quire generate --batch`).  Static batching is the same engine admitting a
# new batch of --max-seqs requests only when the previous batch has finished.
# Environment: QUIRE_BIN (default ./build/quire), THREADS (default: all),
# VOCAB (prompt ids are drawn below it; default 32000, the bench models'),
# RANDOM_WEIGHTS=CONFIG.json (a random model of that shape instead of MODEL),
# TEMPERATURE (default 0: greedy; else sampled with seeds),
# EXTRA (more flags for every run, e.g. "--device cuda"), GPU=1 (adds the
# larger batches a GPU serves: 256 sequences, 2048-token budget).
#
#     QUIRE_BIN=build/quire RANDOM_WEIGHTS=bench/configs/bench-1b-v32k.json \
#         EXTRA="--device cuda" GPU=1 bash bench/engine.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QUIRE_BIN=${QUIRE_BIN:-$ROOT/build/quire}
MODEL=${1:-$ROOT/bench/models/24m-f32.gguf}
OUT=$ROOT/bench/out
mkdir -p "$OUT"
if [ -n "${RANDOM_WEIGHTS:-}" ]; then
    MODEL_ARGS=(--random-weights "$RANDOM_WEIGHTS")
    MODEL=$RANDOM_WEIGHTS
else
    if [ ! -f "$MODEL" ]; then
        bash "$ROOT/bench/generate.sh" --models 24m-f32 --threads 1 --reps 1 >/dev/null
    fi
    MODEL_ARGS=(-m "$MODEL")
fi
VOCAB=${VOCAB:-32000}   # the bench models' vocabulary; set VOCAB for another model
python3 - "$OUT/engine.jsonl" "$VOCAB" "${TEMPERATURE:-0}" <<'PY'
import json, random, sys
random.seed(1)
vocab = int(sys.argv[2])
temp = float(sys.argv[3])
with open(sys.argv[1], "w") as f:
    for i in range(256):
        n = random.randint(8, 64)
        ids = [1] + [random.randint(3, vocab - 1) for _ in range(n - 1)]
        f.write(json.dumps({"id": i, "prompt_ids": ids, "max_tokens": random.randint(16, 512),
                            "temperature": temp, "seed": i, "ignore_eos": True}) + "\n")
PY
run() { # label, extra flags...
    local label=$1; shift
    # shellcheck disable=SC2086
    "$QUIRE_BIN" generate "${MODEL_ARGS[@]}" --batch "$OUT/engine.jsonl" ${THREADS:+-t $THREADS} ${EXTRA:-} "$@" 2>/dev/null | tail -1 |
        python3 -c 'import json,sys; s=json.load(sys.stdin)["stats"]; print("%s|%.1f|%.1f|%d|%.1f|%d" % (sys.argv[1], s["generated_tokens_per_s"], s["wall_s"], s["steps"], 100*s["kv_utilisation_avg"], s["preemptions"]))' "$label"
}
echo "model: $(basename "$MODEL"), 256 requests, outputs 16-512 tokens, temperature ${TEMPERATURE:-0}, $(nproc) CPUs"
echo
echo "| mode | max_seqs | budget | generated tok/s | wall s | steps | KV utilisation % | preemptions |"
echo "|---|---|---|---|---|---|---|---|"
c=$(run continuous --max-seqs 64 --max-batch-tokens 512)
st=$(run static --max-seqs 64 --max-batch-tokens 512 --static-batching)
for r in "$c" "$st"; do IFS='|' read -r l tps w steps u p <<<"$r"; echo "| $l | 64 | 512 | $tps | $w | $steps | $u | $p |"; done
ct=$(cut -d'|' -f2 <<<"$c"); stt=$(cut -d'|' -f2 <<<"$st")
echo
echo "continuous / static throughput: $(awk -v a="$ct" -v b="$stt" 'BEGIN { printf "%.2fx", a / b }')"
echo
echo "| budget (tokens/step) | generated tok/s | wall s | steps | KV utilisation % |"
echo "|---|---|---|---|---|"
for b in 64 128 256 512 1024; do
    IFS='|' read -r l tps w steps u p <<<"$(run b$b --max-seqs 64 --max-batch-tokens $b)"
    echo "| $b | $tps | $w | $steps | $u |"
done
if [ "${GPU:-0}" = 1 ]; then
    echo
    echo "| max_seqs | budget | generated tok/s | wall s | steps | KV utilisation % |"
    echo "|---|---|---|---|---|---|"
    for cfg in "128 2048" "256 2048"; do
        set -- $cfg
        IFS='|' read -r l tps w steps u p <<<"$(run s$1 --max-seqs $1 --max-batch-tokens $2)"
        echo "| $1 | $2 | $tps | $w | $steps | $u |"
    done
fi
