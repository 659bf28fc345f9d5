#!/usr/bin/env bash
# quire generate --batch --spec ngram / --draft: greedy requests whose
# prompts repeat themselves, with n-gram drafts and with the draft model's
# (stories260K cut to 4 layers) of up to 1, 4 and 8 tokens in every step;
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
for run in "ngram 1" "ngram 4" "ngram 8" "draft 1" "draft 4" "draft 8"; do
    set -- $run
    how=(--spec ngram)
    [ "$1" = draft ] && how=(--draft tests/fixtures/models/stories260K-draft4.gguf)
    "$Q" generate -m $M --batch "$tmp/in.jsonl" --device cpu -t 2 "${how[@]}" --spec-k $2 >"$tmp/spec.jsonl" 2>"$tmp/err" ||
        { bad "run with $1 drafts, k $2"; cat "$tmp/err"; }
    if python3 - "$tmp/plain.jsonl" "$tmp/spec.jsonl" <<'PY'
import json, sys
def load(p):
    lines = [json.loads(l) for l in open(p)]
    return {l["id"]: l["token_ids"] for l in lines[:-1]}, lines[-1]["stats"]
a, sa = load(sys.argv[1])
b, sb = load(sys.argv[2])
assert len(a) == 16 and a == b, "outputs differ"
assert sa["spec_drafted"] == 0 and sb["spec_drafted"] > 0 and 0 < sb["spec_accepted"] <= sb["spec_drafted"], (sa, sb)
PY
    then ok "$1 drafts, k $2: the same 16 outputs"; else bad "$1 drafts, k $2: outputs or counts"; fi
done
"$Q" generate -m $M --batch "$tmp/in.jsonl" --spec draft >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q -- "--draft PATH" "$tmp/err" && ok "--spec draft without --draft is a usage error" || bad "--spec draft"
"$Q" generate -m $M --batch "$tmp/in.jsonl" --spec ngram --draft tests/fixtures/models/stories260K-draft4.gguf >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q -- "--draft goes with" "$tmp/err" && ok "--draft with --spec ngram is a usage error" || bad "--draft with --spec ngram"
# A draft whose tokenizer has two tokens the other way round: refused at start.
cp -r tests/fixtures/models/stories260K-draft4-hf "$tmp/other" && chmod -R u+w "$tmp/other"
python3 - "$tmp/other/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
v = t["model"]["vocab"]
a, b = (next(k for k, i in v.items() if i == n) for n in (300, 301))
v[a], v[b] = 301, 300  # two tokens trade ids: a valid tokenizer, another vocabulary
json.dump(t, open(sys.argv[1], "w"))
PY
"$Q" generate -m $M --batch "$tmp/in.jsonl" --draft "$tmp/other" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "vocabulary is not the model's: token 300" "$tmp/err" && ok "a draft of another vocabulary is refused" ||
    { bad "a draft of another vocabulary"; cat "$tmp/err"; }
"$Q" generate -m $M --batch "$tmp/in.jsonl" --draft tests/fixtures/models/stories260K-draft4-hf --spec-k 4 >"$tmp/spec.jsonl" 2>"$tmp/err" &&
    python3 -c "
import json, sys
l = [json.loads(x) for x in open(sys.argv[1])]
a = {x['id']: x['token_ids'] for x in [json.loads(y) for y in open(sys.argv[2])][:-1]}
assert {x['id']: x['token_ids'] for x in l[:-1]} == a and l[-1]['stats']['spec_accepted'] > 0
" "$tmp/spec.jsonl" "$tmp/plain.jsonl" && ok "the draft as an HF folder: the same outputs" || { bad "the draft as an HF folder"; cat "$tmp/err"; }
"$Q" generate -m $M --batch "$tmp/in.jsonl" --spec ngram --spec-k 17 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q -- "--spec-k" "$tmp/err" && ok "--spec-k 17 is a usage error" || bad "--spec-k 17"
# One prompt runs on the engine too: speculation gives the same greedy text.
"$Q" generate -m $M -p "Once upon a time" -n 48 --temp 0 --ids >"$tmp/one.plain" 2>/dev/null
"$Q" generate -m $M -p "Once upon a time" -n 48 --temp 0 --ids --spec ngram >"$tmp/one.ngram" 2>/dev/null &&
"$Q" generate -m $M -p "Once upon a time" -n 48 --temp 0 --ids --draft tests/fixtures/models/stories260K-draft4-hf >"$tmp/one.draft" 2>/dev/null &&
    [ -s "$tmp/one.plain" ] && cmp -s "$tmp/one.plain" "$tmp/one.ngram" && cmp -s "$tmp/one.plain" "$tmp/one.draft" &&
    ok "--spec on one prompt: the same greedy ids" || bad "--spec on one prompt"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
