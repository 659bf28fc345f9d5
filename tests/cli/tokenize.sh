#!/usr/bin/env bash
# quire tokenize, end to end: both directions, every kind of -m, errors.
# usage: tests/cli/tokenize.sh PATH/TO/quire   (run from the source root)
set -u
Q=${1:?usage: tokenize.sh QUIRE_BINARY}
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { # name, want, got
  if [ "$2" = "$3" ]; then ok "$1"; else bad "$1: want '$2' got '$3'"; fi
}
T=tests/fixtures/tokenizers

# The same text through a tokenizer.json folder, the file, an HF model folder and a GGUF.
check "stories GGUF" "[1, 403, 407, 261, 378]" "$(printf 'Once upon a time' | "$Q" tokenize -m models/stories260K.gguf)"
# HF folders follow tokenizer.json (stories260K-hf's template adds no BOS,
# as transformers does for it); the GGUF follows its add_bos_token.
check "stories HF folder" "[403, 407, 261, 378]" "$(printf 'Once upon a time' | "$Q" tokenize -m tests/fixtures/models/stories260K-hf)"
check "tokenizer.json file" "[403, 407, 261, 378]" "$(printf 'Once upon a time' | "$Q" tokenize -m tests/fixtures/models/stories260K-hf/tokenizer.json)"
check "llama2 folder: add_bos_token from tokenizer_config.json" "[1, 15043]" "$(printf 'Hello' | "$Q" tokenize -m $T/llama2)"
check "deepseek-coder folder: BOS from tokenizer_config.json, not in tokenizer.json" "32013" "$(printf 'Hi' | "$Q" tokenize -m $T/deepseek-coder-instruct | tr -d '[' | cut -d, -f1)"
check "deepseek-coder tokenizer.json alone: no BOS" "0" "$(printf 'Hi' | "$Q" tokenize -m $T/deepseek-coder-instruct/tokenizer.json | grep -c 32013)"
check "no BOS" "[403, 407, 261, 378]" "$(printf 'Once upon a time' | "$Q" tokenize -m models/stories260K.gguf --no-add-special)"
check "vocab-only GGUF (gpt2)" '[[15496, "Hello"], [995, "Ġworld"]]' "$(printf 'Hello world' | "$Q" tokenize -m $T/gpt2/ggml-vocab-gpt-2.gguf --pieces)"
check "decode" "Once upon a time" "$(echo '[1, 403, 407, 261, 378]' | "$Q" tokenize -m models/stories260K.gguf --decode --skip-special)"
# Special tokens are text unless --special.
plain=$(printf '<|im_start|>' | "$Q" tokenize -m $T/qwen2.5 --no-add-special)
special=$(printf '<|im_start|>' | "$Q" tokenize -m $T/qwen2.5 --no-add-special --special)
check "special token parsed only with --special" "[151644]" "$special"
[ "$plain" != "$special" ] && ok "special token is text by default" || bad "special token parsed without --special"
# JSON lines, both ways.
out=$(printf '"Once"\n"upon a"\n' | "$Q" tokenize -m models/stories260K.gguf --jsonl --no-add-special)
check "jsonl encode" "$(printf '[403]\n[407,261]')" "$out"
out=$(printf '[403]\n[407,261]\n' | "$Q" tokenize -m models/stories260K.gguf --jsonl --decode)
check "jsonl decode" "$(printf '"Once"\n"upon a"')" "$out"

expect_err() { # name, pattern, stdin, command...
  local name=$1 pat=$2 in=$3; shift 3
  printf '%b' "$in" | "$@" >/dev/null 2>/tmp/quire_tok_err.$$; local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q -- "$pat" /tmp/quire_tok_err.$$; then ok "$name"; else bad "$name (rc=$rc)"; cat /tmp/quire_tok_err.$$; fi
  rm -f /tmp/quire_tok_err.$$
}
expect_err "no -m" "-m MODEL is required" "" "$Q" tokenize
expect_err "missing model" "no such file" "" "$Q" tokenize -m /nonexistent
expect_err "not a tokenizer" "neither a GGUF" "hello" "$Q" tokenize -m CMakeLists.txt
expect_err "invalid UTF-8" "not valid UTF-8" '\xff\xfe' "$Q" tokenize -m models/stories260K.gguf
expect_err "decode: not JSON" "not JSON" "[1, 2" "$Q" tokenize -m models/stories260K.gguf --decode
expect_err "decode: id out of range" "not a token id" "[1, 99999]" "$Q" tokenize -m models/stories260K.gguf --decode
expect_err "jsonl: not a string" "expected a JSON string" "42\n" "$Q" tokenize -m models/stories260K.gguf --jsonl
expect_err "folder without tokenizer.json" "no tokenizer.json" "" "$Q" tokenize -m tests/unit

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
