#!/usr/bin/env bash
# quire generate, end to end: exact greedy text, flags, errors.
# usage: tests/cli/generate.sh PATH/TO/quire   (run from the source root)
set -u
Q=${1:?usage: generate.sh QUIRE_BINARY}
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# The greedy text of karpathy/llama2.c's stories260K, as HF transformers made it.
python3 -c 'import json,sys; sys.stdout.write(json.load(open("tests/fixtures/stories260K.greedy.json"))["greedy_text"] + "\n")' >"$tmp/want.txt"

for m in models/stories260K.gguf tests/fixtures/models/stories260K-hf; do
  if "$Q" generate -m "$m" -n 256 --temp 0 >"$tmp/out.txt" 2>"$tmp/err.txt" && cmp -s "$tmp/out.txt" "$tmp/want.txt"; then
    ok "greedy text of $m equals llama2.c's published output"
  else
    bad "greedy text of $m"; diff "$tmp/want.txt" "$tmp/out.txt" | head -5; cat "$tmp/err.txt"
  fi
  if grep -q '^prompt: 1 tokens in .* tokens/s$' "$tmp/err.txt" && grep -q '^generation: 256 tokens in .* tokens/s$' "$tmp/err.txt"; then
    ok "speed lines for $m"
  else
    bad "speed lines for $m"; cat "$tmp/err.txt"
  fi
done

# The same seed gives the same sample; another seed another one.
"$Q" generate -m models/stories260K.gguf -n 64 --seed 5 --temp 0.9 --top-p 0.95 >"$tmp/s1" 2>/dev/null
"$Q" generate -m models/stories260K.gguf -n 64 --seed 5 --temp 0.9 --top-p 0.95 -t 1 >"$tmp/s2" 2>/dev/null
"$Q" generate -m models/stories260K.gguf -n 64 --seed 6 --temp 0.9 --top-p 0.95 >"$tmp/s3" 2>/dev/null
if cmp -s "$tmp/s1" "$tmp/s2" && ! cmp -s "$tmp/s1" "$tmp/s3"; then ok "seeded sampling is reproducible"; else bad "seeded sampling"; fi

# A prompt given as ids, printed back as ids.
out=$("$Q" generate -m models/stories260K.gguf --prompt-ids 1,403,407 -n 3 --temp 0 --ids 2>/dev/null)
if [ "$out" = "[261, 378, 432]" ]; then ok "--prompt-ids and --ids"; else bad "--prompt-ids/--ids gave '$out'"; fi

# A text prompt is tokenized as the fixture's ids were: "Once upon a time" is
# HF's greedy ids 0-3 after BOS, so the continuation is the fixture's ids 4-23.
want=$(python3 -c 'import json; g=json.load(open("tests/fixtures/stories260K.greedy.json"))["greedy_ids"]; print("[" + ", ".join(map(str, g[4:24])) + "]")')
for m in models/stories260K.gguf; do
  out=$("$Q" generate -m "$m" -p "Once upon a time" -n 20 --temp 0 --ids 2>/dev/null)
  if [ "$out" = "$want" ]; then ok "-p text prompt continues as HF's greedy ($m)"; else bad "-p on $m gave '$out', want '$want'"; fi
done
# Text output streams through the detokenizer: the whole text equals the fixture's.
out=$("$Q" generate -m models/stories260K.gguf -p "Once upon a time" -n 60 --temp 0 2>/dev/null)
want_text=$(python3 -c 'import json; print(json.load(open("tests/fixtures/stories260K.greedy.json"))["greedy_text"][len("Once upon a time"):][:80])')
case "$want_text" in "$out"*) ok "-p text output";; *) case "$out" in "$want_text"*) ok "-p text output";; *) bad "-p text output '$out'";; esac;; esac

# --chat: the prompt is the chat template's rendering, tokenized with its
# control tokens (ChatML for stories260K, which has no template).
n=$("$Q" generate -m models/stories260K.gguf -p "Hi" --chat -n 1 --temp 0 2>&1 >/dev/null | sed -n 's/^prompt: \([0-9]*\) tokens.*/\1/p')
want_n=$(printf '{"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":true}' | "$Q" template -m models/stories260K.gguf --tokens 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
if [ -n "$n" ] && [ "$n" = "$want_n" ]; then ok "--chat prompt is the template's tokens ($n)"; else bad "--chat prompt tokens '$n' vs template '$want_n'"; fi

# --help documents every flag the parser knows.
help=$("$Q" generate --help)
for f in --model --prompt --chat --system --no-special --prompt-ids --n-predict --temp --top-k --top-p --min-p --seed --threads --block-size --chunk --ignore-eos --ids --help; do
  case "$help" in *"$f"*) ;; *) bad "--help lacks $f"; continue ;; esac
done
ok "--help lists the flags"

# Errors: clear message, non-zero exit, no crash.
expect_err() { # name, pattern, command...
  local name=$1 pat=$2; shift 2
  "$@" >"$tmp/o" 2>"$tmp/e"; local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q -- "$pat" "$tmp/e"; then ok "$name"; else bad "$name (rc=$rc)"; cat "$tmp/e"; fi
}
expect_err "missing model" "No such file" "$Q" generate -m /nonexistent.gguf
expect_err "no -m" "-m MODEL is required" "$Q" generate
expect_err "unknown flag" "unknown option" "$Q" generate -m models/stories260K.gguf --bogus
expect_err "bad number" "invalid number" "$Q" generate -m models/stories260K.gguf -n abc
expect_err "bad temperature" "temperature" "$Q" generate -m models/stories260K.gguf --temp -1
expect_err "prompt id out of range" "not a token id" "$Q" generate -m models/stories260K.gguf --prompt-ids 1,99999
head -c 5000 models/stories260K.gguf >"$tmp/trunc.gguf"
expect_err "truncated GGUF" "cannot load model" "$Q" generate -m "$tmp/trunc.gguf"
printf 'not a model at all' >"$tmp/junk.bin"
expect_err "not a model" "not a GGUF" "$Q" generate -m "$tmp/junk.bin"
mkdir "$tmp/emptydir"
expect_err "empty folder" "config.json" "$Q" generate -m "$tmp/emptydir"
expect_err "unknown command" "unknown command" "$Q" frobnicate
expect_err "--chat without -p" "need -p" "$Q" generate -m models/stories260K.gguf --chat
expect_err "-p and --prompt-ids" "not both" "$Q" generate -m models/stories260K.gguf -p hi --prompt-ids 1
expect_err "-p not UTF-8" "not valid UTF-8" "$Q" generate -m models/stories260K.gguf -p $'\xff\xfe'

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
