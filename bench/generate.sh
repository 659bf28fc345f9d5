#!/usr/bin/env bash
# generate.sh - decode and prefill speed of `quire generate` on random-weight
# Llama models, beside llama.cpp's figures and the memory-bandwidth floor.
#
#     bash bench/generate.sh                 # all four models, 1 and 2 threads
#     bash bench/generate.sh --quick         # the 24M models only
#     bash bench/generate.sh --models 134m-f16 --threads 2 --reps 5
#
# Environment:
#     QUIRE_BIN    the quire binary (default ./build/quire)
#     QUIRE_VENV   a Python venv to use (default bench/.venv, made if missing,
#                  with bench/requirements.txt installed into it)
#     LLAMA_BENCH  llama.cpp's llama-bench, to measure the peer on the same
#                  machine and files (bench/build_llamacpp.sh builds one)
#
# Models are written to bench/models/ (git-ignored) by bench/make_model.py
# the first time they are needed.  Each (model, threads) pair runs REPS times
# (default 3) with a 128-token prompt of random ids (fixed seed), -n 128,
# --temp 0 --ignore-eos, and the table shows the median of each figure.
#
# The floor column is what memory bandwidth allows for decoding: each new
# token reads every weight matrix once (all but token_embd, of which it reads
# one row), so tokens/s <= bandwidth / weight bytes.  Bandwidth is measured
# here by bench/membw.c (best of 5 read-only passes over 1 GiB, 8 streams
# a thread, with the same thread count).  A model whose weights fit in the L3 cache can beat it.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
QUIRE_BIN=${QUIRE_BIN:-./build/quire}
VENV=${QUIRE_VENV:-$BENCH_DIR/.venv}
MODELS_DIR=$BENCH_DIR/models

ALL_MODELS="24m-f32 24m-f16 134m-f32 134m-f16"
models=$ALL_MODELS
threads="1 2"
reps=3
max_wait=300
n_prompt=128
n_gen=128
prompt_seed=1234

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    cat <<EOF
Options:
    --quick            only the 24M models (24m-f32 24m-f16)
    --models LIST      models to run, comma- or space-separated, from: $ALL_MODELS
    --threads LIST     thread counts (default "1 2")
    --reps N           runs per (model, threads) pair; the median is shown (default 3)
    --max-wait SECS    before each (model, threads) pair, wait up to SECS for other
                       processes to leave the CPUs idle (default 300; 0: do not wait)
    -h, --help         this text
EOF
}

while [ $# -gt 0 ]; do
    case $1 in
        --quick) models="24m-f32 24m-f16" ;;
        --models) models=${2//,/ }; shift ;;
        --threads) threads=${2//,/ }; shift ;;
        --reps) reps=$2; shift ;;
        --max-wait) max_wait=$2; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "generate.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for m in $models; do
    case " $ALL_MODELS " in *" $m "*) ;; *) echo "generate.sh: unknown model '$m' (known: $ALL_MODELS)" >&2; exit 2 ;; esac
done
case $reps in ''|*[!0-9]*|0) echo "generate.sh: --reps wants a positive integer" >&2; exit 2 ;; esac
case $max_wait in ''|*[!0-9]*) echo "generate.sh: --max-wait wants a number of seconds" >&2; exit 2 ;; esac
for t in $threads; do
    case $t in ''|*[!0-9]*|0) echo "generate.sh: --threads wants positive integers" >&2; exit 2 ;; esac
done

if [ ! -x "$QUIRE_BIN" ]; then
    echo "generate.sh: no quire binary at $QUIRE_BIN; build one (cmake -B build && cmake --build build --target quire) or set QUIRE_BIN" >&2
    exit 1
fi

# ---- the Python environment --------------------------------------------------
PY=$VENV/bin/python
if ! "$PY" -c 'import numpy' 2>/dev/null; then
    echo "== setting up the venv at $VENV" >&2
    [ -x "$PY" ] || python3 -m venv "$VENV"
    "$PY" -m pip install -q -r "$BENCH_DIR/requirements.txt"
fi

# ---- models ------------------------------------------------------------------
mkdir -p "$MODELS_DIR"
for m in $models; do
    f=$MODELS_DIR/$m.gguf
    if [ ! -s "$f" ]; then
        echo "== writing $f" >&2
        "$PY" "$BENCH_DIR/make_model.py" --preset "${m%-*}" --dtype "${m#*-}" --seed 0 --out "$f"
    fi
done

# Bytes of weights one decoded token reads: every tensor but token_embd, plus
# one row of token_embd.
weight_bytes() {
    "$PY" - "$1" <<'EOF'
import struct, sys
d = open(sys.argv[1], "rb").read(64 << 20)   # the header is well under this
p = 4
def u(fmt):
    global p
    v = struct.unpack_from("<" + fmt, d, p)[0]
    p += struct.calcsize(fmt)
    return v
def s():
    global p
    n = u("Q"); p += n
    return d[p - n:p]
SZ = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t):
    global p
    if t == 8: s()
    elif t == 9:
        et = u("I"); n = u("Q")
        if et in SZ: p += n * SZ[et]
        else:
            for _ in range(n): skip(et)
    else: p += SZ[t]
version = u("I"); n_t = u("Q"); n_kv = u("Q")
for _ in range(n_kv):
    s(); skip(u("I"))
total = 0
for _ in range(n_t):
    name = s(); nd = u("I"); ne = [u("Q") for _ in range(nd)]; t = u("I"); u("Q")
    n = 1
    for x in ne: n *= x
    b = n * {0: 4, 1: 2, 30: 2}[t]
    total += b // ne[-1] if name == b"token_embd.weight" else b
print(total)
EOF
}

# CPU time (in CPUs, e.g. 0.95) that the rest of the machine used over one
# second: other work running beside the benchmark skews it, 2-thread runs most.
busy_cpus() {
    local a b
    a=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat)
    sleep 1
    b=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat)
    awk -v a="$a" -v b="$b" -v n="$(nproc)" 'BEGIN { split(a, x, " "); split(b, y, " ");
        printf "%.2f", (y[2] > x[2]) ? n * (y[1] - x[1]) / (y[2] - x[2]) : 0 }'
}
# For telling whether something else ran during a pair of runs: the
# machine's busy and total CPU ticks, and the CPU ticks of this script's
# finished children (quire among them).
cpu_mark() {
    echo "$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat)" \
        "$(awk '{ print $16 + $17 }' "/proc/$$/stat")"
}
# CPUs used by others between two marks.
others_cpus() {
    awk -v a="$1" -v b="$2" -v n="$(nproc)" 'BEGIN { split(a, x, " "); split(b, y, " ");
        o = (y[1] - x[1]) - (y[3] - x[3]); if (o < 0) o = 0;
        printf "%.2f", (y[2] > x[2]) ? n * o / (y[2] - x[2]) : 0 }'
}

# Waits up to max_wait seconds for the machine to go quiet (under 0.2 CPUs
# busy), then goes on; a wait that runs out is noted under the table.
wait_idle() {
    local busy waited=0
    while :; do
        busy=$(busy_cpus)
        awk -v b="$busy" 'BEGIN { exit !(b > 0.2) }' || return 0
        if [ "$waited" -ge "$max_wait" ]; then
            echo "generate.sh: WARNING: other processes are using $busy CPUs $1; the figures will be low and noisy" >&2
            warnings+=("other processes used $busy CPUs $1")
            return 0
        fi
        [ "$waited" -eq 0 ] && echo "   waiting for other processes to finish (using $busy CPUs; at most ${max_wait}s)" >&2
        sleep 4
        waited=$((waited + 5))
    done
}
warnings=()
wait_idle "before the bandwidth measurement"

# ---- memory bandwidth --------------------------------------------------------
declare -A BW
echo "== measuring memory bandwidth" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ${CC:-cc} -O2 -march=native -pthread "$BENCH_DIR/membw.c" -o "$tmp/membw" 2>"$tmp/cc.log"; then
    # shellcheck disable=SC2086
    bw_out=$("$tmp/membw" 1024 $threads)
    bw_how="read-only, 8 streams a thread, best of 5 passes over 1 GiB"
else
    echo "generate.sh: could not compile membw.c ($(head -1 "$tmp/cc.log")); using a numpy copy instead" >&2
    # shellcheck disable=SC2086
    bw_out=$("$PY" - $threads <<'EOF'
import sys, time, numpy as np
a = np.ones(1 << 27); b = np.empty_like(a)       # 1 GiB each
best = min((lambda t0: (np.copyto(b, a), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(5))
for t in sys.argv[1:]:
    print("read %s %.2f" % (t, 2 * a.nbytes / best / 1e9))   # one thread whatever t is
EOF
)
    bw_how="numpy copy (read+write), 1 thread, best of 5 over 1 GiB"
fi
while read -r kind t gbps; do
    # Decoding only reads its weights, so the floor uses the read-only figure.
    [ "$kind" = read ] && BW[$t]=$gbps
    echo "   $kind bandwidth, $t thread(s): $gbps GB/s" >&2
done <<<"$bw_out"

# ---- the runs ----------------------------------------------------------------
prompt=$("$PY" -c "
import numpy as np
r = np.random.default_rng($prompt_seed)
print(','.join(str(x) for x in r.integers(259, 32000, size=$n_prompt)))")

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# llama.cpp on this machine class (2 vCPU Zen 3, AVX2), 134M shape, 128-token
# prompt, 128 generated tokens.
ref_prompt() {
    case "$1 $2" in
        "134m-f32 2") echo "365-435" ;;
        *) echo "-" ;;
    esac
}
ref_gen() {
    case "$1 $2" in
        "134m-f32 2") echo "36-41" ;;
        "134m-f32 1") echo "22-27" ;;
        "134m-f16 2") echo "61-62" ;;
        *) echo "-" ;;
    esac
}

# llama.cpp on this machine, when LLAMA_BENCH names its llama-bench binary:
# prompt at depth 0, generation at depth n_prompt (as quire's runs), same
# threads, median-free average of REPS runs as llama-bench reports it.
peer() { # model-file threads -> "prompt_tps gen_tps"
    if [ -z "${LLAMA_BENCH:-}" ] || [ ! -x "$LLAMA_BENCH" ]; then echo "- -"; return; fi
    local pp tg
    pp=$("$LLAMA_BENCH" -m "$1" -p "$n_prompt" -n 0 -t "$2" -r "$reps" -o csv 2>/dev/null | awk -F'","' 'NR == 2 { v = $(NF-1); printf "%.2f", v }')
    tg=$("$LLAMA_BENCH" -m "$1" -p 0 -n "$n_gen" -d "$n_prompt" -t "$2" -r "$reps" -o csv 2>/dev/null | awk -F'","' 'NR == 2 { v = $(NF-1); printf "%.2f", v }')
    echo "${pp:--} ${tg:--}"
}

rows=()
for m in $models; do
    f=$MODELS_DIR/$m.gguf
    wb=$(weight_bytes "$f")
    cat "$f" >/dev/null # into the page cache before timing
    for t in $threads; do
        wait_idle "before $m with $t thread(s)"
        pp=() tg=()
        mark0=$(cpu_mark)
        for ((r = 1; r <= reps; r++)); do
            log=$tmp/run.log
            if ! "$QUIRE_BIN" generate -m "$f" --prompt-ids "$prompt" -n "$n_gen" --temp 0 -t "$t" \
                --ignore-eos --ids >/dev/null 2>"$log"; then
                echo "generate.sh: quire generate failed on $m with $t thread(s):" >&2
                cat "$log" >&2
                exit 1
            fi
            p=$(awk '/^prompt:/ { print $(NF-1) }' "$log")
            g=$(awk '/^generation:/ { print $(NF-1) }' "$log")
            echo "   $m, $t thread(s), run $r: prompt $p tok/s, generation $g tok/s" >&2
            pp+=("$p") tg+=("$g")
        done
        others=$(others_cpus "$mark0" "$(cpu_mark)")
        if awk -v b="$others" 'BEGIN { exit !(b > 0.2) }'; then
            echo "generate.sh: WARNING: other processes used $others CPUs during $m with $t thread(s)" >&2
            warnings+=("other processes used $others CPUs during $m with $t thread(s)")
        fi
        pm=$(printf '%s\n' "${pp[@]}" | median)
        gm=$(printf '%s\n' "${tg[@]}" | median)
        bw=${BW[$t]:-}
        if [ -n "$bw" ]; then
            floor=$(awk -v bw="$bw" -v wb="$wb" 'BEGIN { printf "%.1f", bw * 1e9 / wb }')
        else
            floor="-"
        fi
        read -r ppeer gpeer <<<"$(peer "$f" "$t")"
        rows+=("| ${m%-*} | ${m#*-} | $t | $pm | $ppeer | $(ref_prompt "$m" "$t") | $gm | $gpeer | $(ref_gen "$m" "$t") | $floor | $(awk -v wb="$wb" 'BEGIN { printf "%.1f", wb / 1e6 }') |")
    done
done

echo
echo "quire generate: $n_prompt-token prompt, $n_gen generated tokens, --temp 0, median of $reps runs"
echo "($(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs; $QUIRE_BIN)"
echo
echo "| model | dtype | threads | quire prompt tok/s | llama.cpp here | llama.cpp (issue, Zen 3) | quire generation tok/s | llama.cpp here | llama.cpp (issue, Zen 3) | floor tok/s | weight MB/token |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "llama.cpp here: llama-bench ${LLAMA_BENCH:+($LLAMA_BENCH) }on this machine, same model files and threads (pp at depth 0, tg at depth $n_prompt); \"-\" when LLAMA_BENCH is not set."
echo "llama.cpp (issue, Zen 3): the figures quoted in the issue, 2 vCPU Zen 3 (AVX2), 134M shape, 128-token prompt."
for t in $threads; do
    [ -n "${BW[$t]:-}" ] && echo "memory bandwidth ($bw_how), $t thread(s): ${BW[$t]} GB/s"
done
echo "floor tok/s = bandwidth / weight bytes read per decoded token (weight MB/token column; all"
echo "weights but token_embd, plus one embedding row); the KV cache (a few MB here) is not counted."
echo "A model whose weights fit in the L3 cache can run above its floor."
for w in "${warnings[@]}"; do echo "WARNING: $w: figures may be low and noisy"; done
