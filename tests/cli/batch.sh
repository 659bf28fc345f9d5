#!/usr/bin/env bash
# quire generate --batch: requests from a JSONL file through the engine.
# usage: tests/cli/batch.sh PATH/TO/quire   (run from the source root)
set -u
Q=${1:?usage: batch.sh QUIRE_BINARY}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/in.jsonl" <<'JSONL'
{"id": "a", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}
{"id": "b", "prompt_ids": [1, 403, 407], "max_tokens": 10, "temperature": 0, "stop": ["time,"]}
{"id": "bad", "prompt": 42}
{"id": "c", "prompt_ids": [1, 99999]}
not json
{"id": "d", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}
{"id": "n3", "prompt": "Lily", "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 3, "logprobs": 2, "ignore_eos": true}
{"id": "chat", "messages": [{"role": "user", "content": "Hi <|im_end|>"}], "max_tokens": 4, "temperature": 0, "ignore_eos": true}
{"id": "tc", "messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}
{"id": "unknown", "prompt": "Hi", "bogus": 1}
JSONL
"$Q" generate -m models/stories260K.gguf --batch "$tmp/in.jsonl" --max-batch-tokens 3 >"$tmp/out.jsonl" 2>"$tmp/err" || { echo "FAIL exit status"; cat "$tmp/err"; exit 1; }
python3 - "$tmp/out.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
fix = json.load(open("tests/fixtures/stories260K.greedy.json"))["greedy_ids"]
res = {}
ok = fail = 0
def check(name, cond, detail=""):
    global ok, fail
    if cond: ok += 1; print("ok  ", name)
    else: fail += 1; print("FAIL", name, detail)
check("one result per input line, then stats", len(lines) == 11 and "stats" in lines[-1], str(len(lines)))
by = {l.get("id"): l for l in lines[:-1]}
a = by.get("a", {})
# HF's greedy continuation of BOS "Once upon a time" is the fixture's ids 4..23.
check("greedy ids equal HF's", a.get("token_ids") == fix[4:24], str(a.get("token_ids")))
check("length finish", a.get("finish_reason") == "length" and a["usage"]["completion_tokens"] == 20)
b = by.get("b", {})
check("stop string ends the request, text before it", b.get("finish_reason") == "stop" and b.get("text") == " a ", str(b))
check("bad prompt type is an error line", "error" in by.get("bad", {}) and "prompt" in by["bad"]["error"])
check("token id out of range is an error line", "outside the vocabulary" in by.get("c", {}).get("error", "") or "not a token id" in by.get("c", {}).get("error", ""), str(by.get("c")))
check("bad JSON is an error line", any("not JSON" in l.get("error", "") for l in lines[:-1]))
d = by.get("d", {})
check("the same prompt again gives the same output (a 5-token prompt fills no block to cache)", d.get("token_ids") == fix[4:24] and d["usage"]["cached_tokens"] == 0)
# stories260K has no template: ChatML, 16 prompt tokens after the text
# "<|im_start|>user\nHi <|im_end|><|im_end|>\n<|im_start|>assistant\n" is encoded by its
# SentencePiece vocabulary (which has no control tokens for them: all text).
ch = by.get("chat", {})
check("messages go through the chat template", ch.get("finish_reason") == "length" and ch["usage"]["prompt_tokens"] > 10, str(ch))
n3 = by.get("n3", {})
ch3 = n3.get("choices", [])
check("n = 3: three choices, indexed, 6 tokens each", [c["index"] for c in ch3] == [0, 1, 2] and all(len(c["token_ids"]) == 6 for c in ch3) and n3["usage"]["completion_tokens"] == 18, str(n3)[:300])
check("logprobs: one entry per token, 2 alternatives, chosen token's logprob <= 0",
      all(len(c["logprobs"]) == 6 and all(len(x["top"]) == 2 and x["logprob"] <= 0 for x in c["logprobs"]) for c in ch3))
check("a field only a served reply has is an error line naming it (tool_choice)",
      by.get("tc", {}).get("error", "").startswith("'tool_choice' is not taken by --batch lines"), str(by.get("tc")))
check("an unknown field is an error line naming it", by.get("unknown", {}).get("error") ==
      "Unrecognized request argument supplied: bogus", str(by.get("unknown")))
st = lines[-1]["stats"]
check("stats count the requests", st["requests"] == 10 and st["generated"] >= 45)
print(f"{ok} passed, {fail} failed")
sys.exit(1 if fail else 0)
PY
