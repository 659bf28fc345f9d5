#!/usr/bin/env bash
# quire generate --device, --gpu-mem-util and --random-weights.
# usage: tests/cli/device.sh PATH/TO/quire   (run from the source root)
# On a machine without a GPU (no nvidia-smi) --device cuda must fail cleanly
# and --device auto must run on the CPU; with a GPU those two checks are
# skipped (test_gpu and test_engine_cuda cover the device).
set -u
Q=${1:?usage: device.sh QUIRE_BINARY}
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
expect_rc() { # name, want rc, pattern, command...
  local name=$1 want=$2 pat=$3; shift 3
  "$@" >"$tmp/o" 2>"$tmp/e"; local rc=$?
  if [ $rc -eq "$want" ] && grep -q -- "$pat" "$tmp/e"; then ok "$name"; else bad "$name (rc=$rc, want $want)"; cat "$tmp/e"; fi
}
has_gpu=0
command -v nvidia-smi >/dev/null 2>&1 && has_gpu=1

M=models/stories260K.gguf
# --device cpu gives the same greedy text as the default on a GPU-less machine
# (and the same as llama2.c's output either way: generate.sh checks that).
"$Q" generate -m $M -n 40 --temp 0 --device cpu >"$tmp/cpu.txt" 2>"$tmp/cpu.err"; rc=$?
if [ $rc -eq 0 ] && grep -q "cpu backend" "$tmp/cpu.err" && [ -s "$tmp/cpu.txt" ]; then ok "--device cpu runs on the CPU"; else bad "--device cpu (rc=$rc)"; cat "$tmp/cpu.err"; fi

if [ $has_gpu -eq 0 ]; then
  "$Q" generate -m $M -n 40 --temp 0 >"$tmp/auto.txt" 2>"$tmp/auto.err"; rc=$?
  if [ $rc -eq 0 ] && grep -q "no CUDA device: .*running on the CPU" "$tmp/auto.err" && cmp -s "$tmp/cpu.txt" "$tmp/auto.txt"; then
    ok "--device auto falls back to the CPU, saying why"
  else
    bad "--device auto (rc=$rc)"; cat "$tmp/auto.err"
  fi
  expect_rc "--device cuda without a device fails cleanly" 1 "device cuda: .*CUDA" "$Q" generate -m $M -n 4 --device cuda
  if [ -s "$tmp/o" ]; then bad "--device cuda printed output"; else ok "--device cuda printed nothing on stdout"; fi
else
  echo "skip --device auto/cuda failure checks: nvidia-smi is present"
fi

expect_rc "--device bogus is rejected" 2 "not auto, cpu or cuda" "$Q" generate -m $M --device bogus
expect_rc "--gpu-mem-util 0 is rejected" 2 "gpu-mem-util" "$Q" generate -m $M --gpu-mem-util 0
expect_rc "--gpu-mem-util 1.5 is rejected" 2 "gpu-mem-util" "$Q" generate -m $M --gpu-mem-util 1.5
expect_rc "--gpu-mem-util abc is rejected" 2 "invalid number" "$Q" generate -m $M --gpu-mem-util abc
expect_rc "--device needs a value" 2 "needs a value" "$Q" generate -m $M --device

# Random weights: a tiny Qwen2 config (biases), on the CPU.
cat >"$tmp/tiny.json" <<'JSON'
{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "bos_token_id": 1, "eos_token_id": 2}
JSON
R=(generate --random-weights "$tmp/tiny.json" --device cpu --prompt-ids 1,5,7,9 -n 12 --ignore-eos)
a=$("$Q" "${R[@]}" --temp 0 2>"$tmp/r.err"); rc=$?
b=$("$Q" "${R[@]}" --temp 0 -t 1 2>/dev/null)
c=$("$Q" "${R[@]}" --temp 0 --weight-seed 1 2>/dev/null)
d=$("$Q" "${R[@]}" --temp 0.8 --seed 3 2>/dev/null)
e=$("$Q" "${R[@]}" --temp 0.8 --seed 3 2>/dev/null)
n=$(python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(len(v) if all(0 <= x < 300 for x in v) else -1)' "$a" 2>/dev/null)
if [ $rc -eq 0 ] && [ "$n" = 12 ]; then ok "--random-weights prints 12 token ids ($a)"; else bad "--random-weights (rc=$rc) '$a'"; cat "$tmp/r.err"; fi
if grep -q "model random:tiny.json" "$tmp/r.err"; then ok "the random model is named after its config"; else bad "random model name"; cat "$tmp/r.err"; fi
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "random weights: same seed, same ids (any thread count)"; else bad "random weights not deterministic: '$a' vs '$b'"; fi
if [ -n "$c" ] && [ "$a" != "$c" ]; then ok "--weight-seed changes the weights"; else bad "--weight-seed: '$a' vs '$c'"; fi
if [ -n "$d" ] && [ "$d" = "$e" ]; then ok "seeded sampling on random weights is reproducible"; else bad "sampling: '$d' vs '$e'"; fi

expect_rc "--random-weights needs --prompt-ids" 2 "prompt-ids" "$Q" generate --random-weights "$tmp/tiny.json"
expect_rc "--random-weights has no tokenizer for -p" 2 "prompt-ids" "$Q" generate --random-weights "$tmp/tiny.json" -p hi
expect_rc "-m and --random-weights together" 2 "not both" "$Q" generate -m $M --random-weights "$tmp/tiny.json" --prompt-ids 1
expect_rc "--random-weights: missing config" 1 "No such file" "$Q" generate --random-weights "$tmp/nope.json" --prompt-ids 1
printf '{"model_type": "llama",' >"$tmp/broken.json"
expect_rc "--random-weights: bad JSON" 1 "invalid JSON" "$Q" generate --random-weights "$tmp/broken.json" --prompt-ids 1
printf '{"model_type": "gpt2", "hidden_size": 8}' >"$tmp/gpt2.json"
expect_rc "--random-weights: unsupported architecture" 1 "gpt2" "$Q" generate --random-weights "$tmp/gpt2.json" --prompt-ids 1
expect_rc "--random-weights: id beyond the config's vocabulary" 1 "not a token id below 300" "$Q" generate --random-weights "$tmp/tiny.json" --prompt-ids 1,300

# --batch on random weights: prompt_ids work (text is empty), text prompts are error lines.
cat >"$tmp/in.jsonl" <<'JSONL'
{"id": "a", "prompt_ids": [1, 5, 7, 9], "max_tokens": 12, "temperature": 0, "ignore_eos": true}
{"id": "t", "prompt": "hello"}
JSONL
"$Q" generate --random-weights "$tmp/tiny.json" --device cpu --batch "$tmp/in.jsonl" >"$tmp/out.jsonl" 2>"$tmp/b.err"; rc=$?
got=$(python3 - "$tmp/out.jsonl" <<'PY' 2>&1
import json, sys
l = [json.loads(x) for x in open(sys.argv[1])]
by = {x.get("id"): x for x in l[:-1]}
a, t = by["a"], by["t"]
assert a["text"] == "" and len(a["token_ids"]) == 12 and a["finish_reason"] == "length", a
assert "tokenizer" in t["error"], t
print(json.dumps(a["token_ids"]))
PY
)
if [ $rc -eq 0 ] && [ "$got" = "$a" ]; then ok "--batch with random weights: token ids, empty text, same ids as a single prompt"; else bad "--batch random (rc=$rc): $got vs $a"; cat "$tmp/b.err"; fi

help=$("$Q" generate --help)
for f in --device --gpu-mem-util --random-weights --weight-seed; do
  case "$help" in *"$f"*) ok "--help lists $f" ;; *) bad "--help lacks $f" ;; esac
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
