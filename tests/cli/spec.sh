#!/usr/bin/env bash
# quire generate --batch --spec ngram: greedy requests whose prompts repeat
# themselves, with n-gram drafts of up to 1, 4 and 8 tokens in every step;
# every output must equal the one without drafts, drafts must be made and
# some kept, and every block must come back (the engine checks at the end).
# Bad flag values are usage errors (exit status 2).
# usage: tests/cli/spec.sh PATH/TO/quire   (run from the source root)
set -u
Q=${1:?usage: spec.sh QUIRE_BINARY}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

python3 - >"$tmp/in.jsonl" <<'PY'
import json
for i in range(16):
    stretch = [3 + (i * 37 + k * 11) % 500 for k in range(4 + i % 9)]
    print(json.dumps({"id": f"r{i}", "prompt_ids": [1] + stretch + stretch, "max_tokens": 120,
                      "temperature": 0, "ignore_eos": True}))
PY
M=models/stories260K.gguf
"$Q" generate -m $M --batch "$tmp/in.jsonl" --device cpu -t 2 >"$tmp/plain.jsonl" 2>"$tmp/err" || { bad "run without drafts"; cat "$tmp/err"; }
for k in 1 4 8; do
    "$Q" generate -m $M --batch "$tmp/in.jsonl" --device cpu -t 2 --spec ngram --spec-k $k >"$tmp/spec$k.jsonl" 2>"$tmp/err" ||
        { bad "run with drafts, k $k"; cat "$tmp/err"; }
    if python3 - "$tmp/plain.jsonl" "$tmp/spec$k.jsonl" <<'PY'
import json, sys
def load(p):
    lines = [json.loads(l) for l in open(p)]
    return {l["id"]: l["token_ids"] for l in lines[:-1]}, lines[-1]["stats"]
a, sa = load(sys.argv[1])
b, sb = load(sys.argv[2])
assert len(a) == 16 and a == b, "outputs differ"
assert sa["spec_drafted"] == 0 and sb["spec_drafted"] > 0 and 0 < sb["spec_accepted"] <= sb["spec_drafted"], (sa, sb)
PY
    then ok "k $k: the same 16 outputs with drafts"; else bad "k $k: outputs or counts"; fi
done
"$Q" generate -m $M --batch "$tmp/in.jsonl" --spec draft >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q -- "--spec" "$tmp/err" && ok "--spec draft is a usage error" || bad "--spec draft"
"$Q" generate -m $M --batch "$tmp/in.jsonl" --spec ngram --spec-k 17 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q -- "--spec-k" "$tmp/err" && ok "--spec-k 17 is a usage error" || bad "--spec-k 17"
"$Q" generate -m $M -p "Once" --spec ngram >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q -- "need --batch" "$tmp/err" && ok "--spec without --batch is a usage error" || bad "--spec without --batch"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
