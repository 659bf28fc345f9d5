#!/usr/bin/env bash
# quire generate --batch --preempt swap: a KV pool far too small for the
# batch, so requests are swapped out to host memory and back; every output
# must equal the one of a pool that never preempts.  Bad flag values are
# usage errors (exit status 2).
# usage: tests/cli/preempt.sh PATH/TO/quire   (run from the source root)
set -u
Q=${1:?usage: preempt.sh QUIRE_BINARY}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# 24 greedy requests of 150 tokens (two of them with n = 2 samples, sharing
# the prompt's blocks): about 3,900 token slots; 1 MiB of KV holds 1,638.
python3 - >"$tmp/in.jsonl" <<'PY'
import json
for i in range(24):
    r = {"id": f"r{i}", "prompt_ids": [1] + [3 + (i * 37 + k * 11) % 500 for k in range(1 + i % 9)],
         "max_tokens": 150, "temperature": 0, "ignore_eos": True}
    if i % 11 == 5:
        r.update(n=2, temperature=0.8, seed=i)
    print(json.dumps(r))
PY
M=models/stories260K.gguf
# On the CPU: the outputs of two batch shapes are compared token for token.
"$Q" generate -m $M --batch "$tmp/in.jsonl" --kv-mem 64 --device cpu -t 2 >"$tmp/big.jsonl" 2>"$tmp/err" || { bad "large pool run"; cat "$tmp/err"; }
"$Q" generate -m $M --batch "$tmp/in.jsonl" --kv-mem 1 --preempt swap --swap-space 16 --device cpu -t 2 >"$tmp/swap.jsonl" 2>"$tmp/err" || { bad "swap run"; cat "$tmp/err"; }
"$Q" generate -m $M --batch "$tmp/in.jsonl" --kv-mem 1 --preempt recompute --device cpu -t 2 >"$tmp/rec.jsonl" 2>"$tmp/err" || { bad "recompute run"; cat "$tmp/err"; }
if python3 - "$tmp/big.jsonl" "$tmp/swap.jsonl" "$tmp/rec.jsonl" <<'PY'
import json, sys
def load(p):
    lines = [json.loads(l) for l in open(p)]
    ids = {}
    for l in lines[:-1]:
        ids[l["id"]] = [c["token_ids"] for c in l["choices"]] if "choices" in l else [l["token_ids"]]
    return ids, lines[-1]["stats"]
big, sb = load(sys.argv[1])
swap, ss = load(sys.argv[2])
rec, sr = load(sys.argv[3])
bad = 0
def check(name, cond, detail=""):
    global bad
    print(("ok   " if cond else "FAIL ") + name, "" if cond else detail)
    bad += not cond
check("large pool: 24 results of 150 tokens, no preemption",
      len(big) == 24 and all(len(t) == 150 for v in big.values() for t in v) and sb["preemptions"] == 0, str(sb))
check("1 MiB pool, --preempt swap: the same outputs", swap == big,
      str([k for k in big if swap.get(k) != big[k]]))
check("requests were swapped out and back in", ss["preemptions_swap"] > 0 and ss["swap_ins"] > 0 and ss["swapped_in_blocks"] > 0, str(ss))
check("1 MiB pool, --preempt recompute: the same outputs, nothing swapped",
      rec == big and sr["preemptions"] > 0 and sr["preemptions_swap"] == 0, str(sr))
check("swapping computes fewer tokens than recomputing", ss["tokens_computed"] < sr["tokens_computed"],
      f'{ss["tokens_computed"]} vs {sr["tokens_computed"]}')
sys.exit(1 if bad else 0)
PY
then pass=$((pass + 5)); else fail=$((fail + 1)); fi

for args in "--preempt disk" "--preempt swap --swap-space 0" "--preempt swap --swap-space -5" "--swap-space 64" "--preempt swap --swap-space many"; do
  "$Q" generate -m $M --batch "$tmp/in.jsonl" $args >/dev/null 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 2 ] && grep -q -- "--preempt\|--swap-space" "$tmp/err"; then ok "'$args' is a usage error: $(head -1 "$tmp/err")"
  else bad "'$args': exit $rc"; cat "$tmp/err"; fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
