"""Differential test: quire's tokenizers against HF tokenizers (PyPI, pinned).

For every tokenizer.json the project carries (and those in ../shared when it
is there), QUIRE_DIFF_N random strings (default 10,000; seed QUIRE_DIFF_SEED,
default 1234) are encoded by both, with and without the post-processor's
special tokens, and the ids must be equal; decoding the ids must give equal
text in both.  Run longer locally: QUIRE_DIFF_N=100000 QUIRE_DIFF_SEED=7 pytest ...
"""
import json
import os
import subprocess
import zlib

import pytest
from tokenizers import Tokenizer

from conftest import ROOT, shared_dir
from strings import random_strings

N = int(os.environ.get("QUIRE_DIFF_N", "10000"))
SEED = int(os.environ.get("QUIRE_DIFF_SEED", "1234"))


def tokenizer_files():
    found = {}
    for base in (shared_dir() / "fixtures" / "tokenizers", ROOT / "tests" / "fixtures" / "tokenizers"):
        if base.is_dir():
            for d in sorted(base.iterdir()):
                if (d / "tokenizer.json").is_file():
                    found[d.name] = d / "tokenizer.json"
    stories = ROOT / "tests" / "fixtures" / "models" / "stories260K-hf" / "tokenizer.json"
    found["stories260K"] = stories
    return sorted(found.items())


def run_quire(quire, args, lines):
    data = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines)
    p = subprocess.run([quire, "tokenize", *args, "--jsonl"], input=data.encode(), capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    out = [json.loads(l) for l in p.stdout.decode().split("\n") if l]
    assert len(out) == len(lines)
    return out


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


@pytest.mark.parametrize("name,path", tokenizer_files(), ids=lambda v: v if isinstance(v, str) else "")
def test_encode_decode_matches_hf(quire, name, path):
    hf = Tokenizer.from_file(str(path))
    texts = random_strings(SEED + zlib.crc32(name.encode()) % 1000, N)
    for add_special in (False, True):
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add_special)]
        args = ["-m", str(path), "--special"] + ([] if add_special else ["--no-add-special"])
        got = run_quire(quire, args, texts)
        bad = [i for i in range(len(texts)) if got[i] != want[i]]
        if bad:
            i = bad[0]
            j = first_diff(got[i], want[i])
            pytest.fail(f"{name}: {len(bad)}/{len(texts)} differ (add_special={add_special}); first: "
                        f"{texts[i]!r}\n quire {got[i][max(0, j-3):j+5]}\n hf    {want[i][max(0, j-3):j+5]} at {j}")
    ids = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    want_text = hf.decode_batch(ids, skip_special_tokens=False)
    got_text = run_quire(quire, ["-m", str(path), "--decode"], ids)
    bad = [i for i in range(len(ids)) if got_text[i] != want_text[i]]
    assert not bad, f"{name}: {len(bad)} decodes differ; first {texts[bad[0]]!r}: {got_text[bad[0]]!r} vs {want_text[bad[0]]!r}"
    # decode(encode(s)) == s for a pure byte-level tokenizer (no normalizer,
    # no decoder cleanup): every valid string comes back.
    if name == "gpt2":
        lost = [i for i in range(len(texts)) if got_text[i] != texts[i]]
        assert not lost, f"{name}: decode(encode(s)) != s for {texts[lost[0]]!r}"
    # The streaming detokenizer: its chunks joined equal the full decode, and
    # no chunk ends inside a UTF-8 character (a split one would have come back
    # as U+FFFD from quire's JSON writer and broken the join).
    chunks = run_quire(quire, ["-m", str(path), "--decode", "--stream"], ids)
    bad = [i for i in range(len(ids)) if "".join(chunks[i]) != want_text[i]]
    assert not bad, f"{name}: {len(bad)} streamed decodes differ; first {texts[bad[0]]!r}: {chunks[bad[0]]!r}"


GGUF_PAIRS = [("gpt2", "ggml-vocab-gpt-2.gguf"), ("llama-spm", "ggml-vocab-llama-spm.gguf")]


@pytest.mark.parametrize("name,gguf", GGUF_PAIRS)
def test_gguf_vocab_matches_hf(quire, name, gguf):
    """A GGUF vocabulary encodes as HF does with the same model's tokenizer.json."""
    d = ROOT / "tests" / "fixtures" / "tokenizers" / name
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    texts = random_strings(SEED + 17 + zlib.crc32(name.encode()) % 1000, N)
    want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    got = run_quire(quire, ["-m", str(d / gguf), "--special", "--no-add-special"], texts)
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    assert not bad, f"{name} GGUF: {len(bad)}/{len(texts)} differ; first {texts[bad[0]]!r}: {got[bad[0]][:12]} vs {want[bad[0]][:12]}"
