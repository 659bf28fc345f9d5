#!/usr/bin/env python3
"""Generates tests/fixtures/tokenizers/<name>/hf_cases.json with HF tokenizers.

    pip install tokenizers==0.23.3
    python3 scripts/gen_tok_fixtures.py [tests/fixtures/tokenizers]

For each tokenizer.json under the folder it records what HF tokenizers does
with a set of texts (the texts of encodings.json, texts around special tokens,
and seeded random strings over all of Unicode) and with random id sequences:

  {"version": "<tokenizers version>",
   "texts": [{"text", "ids", "ids_plain", "ids_add", "decoded_plain", "decoded", "decoded_skip"}],
   "decodes": [{"ids", "text", "text_skip"}]}

ids: encode(text, add_special_tokens=False) (special tokens recognised, HF's
default); ids_plain: the same with encode_special_tokens=True (special tokens
are plain text); ids_add: add_special_tokens=True; decoded_plain:
decode(ids_plain); decoded/decoded_skip: decode(ids) without/with
skip_special_tokens.  The unit tests compare quire's
encoder and decoder with these.
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

POOL = (
    ["Hello", "world", " ", "  ", "\n", "\t", "\r\n", "'s", "'LL", "don't", "123", "4567", "3.14", "½", "٣",
     "é", "e\u0301", "\u0301", "ñ", "Å", "A\u030a", "ﬁ", "İ", "ß", "Σ", "东京", "我想在", "한국어", "\u1100\u1161\u11a8",
     "👨\u200d👩\u200d👧", "🦙", "😀", "\u3000", "\u0085", "\u180e", "\u2028", "\u00a0", "\u200b", "▁", "▁▁",
     "<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "<0x41>",
     "!!", "...", "—", "«", "»", "{", "}", "def", " f(x):", "    ", "\u0e01\u0e32", "ʻ", "ﾃｽﾄ", "x" * 40]
)


def random_texts(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(1, 12)
        parts = []
        for _ in range(k):
            r = rng.random()
            if r < 0.6:
                parts.append(rng.choice(POOL))
            elif r < 0.8:
                parts.append(chr(rng.randint(0x20, 0x7e)))
            else:
                while True:
                    cp = rng.choice([rng.randint(0x80, 0x7ff), rng.randint(0x800, 0xffff), rng.randint(0x10000, 0x10ffff)])
                    if not 0xd800 <= cp < 0xe000:
                        break
                parts.append(chr(cp))
        out.append("".join(parts))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizers"
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, "tokenizer.json")
        if not os.path.isfile(path):
            continue
        tok = Tokenizer.from_file(path)
        rng = random.Random(1234)
        texts = []
        enc = os.path.join(root, name, "encodings.json")
        if os.path.isfile(enc):
            for e in json.load(open(enc, encoding="utf-8")):
                if e["text"] not in texts:
                    texts.append(e["text"])
        specials = [t.content for t in tok.get_added_tokens_decoder().values()][:6]
        for s in specials:
            texts += [s, " " + s + " x", "a" + s + s + "b", "\n" + s + "\nHi " + s]
        texts += random_texts(rng, 60)
        cases = []
        for t in texts:
            tok.encode_special_tokens = False
            ids = tok.encode(t, add_special_tokens=False).ids
            ids_add = tok.encode(t, add_special_tokens=True).ids
            tok.encode_special_tokens = True
            ids_plain = tok.encode(t, add_special_tokens=False).ids
            tok.encode_special_tokens = False
            cases.append({"text": t, "ids": ids, "ids_plain": ids_plain, "ids_add": ids_add,
                          "decoded_plain": tok.decode(ids_plain, skip_special_tokens=False),
                          "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        n = tok.get_vocab_size(with_added_tokens=True)
        decodes = []
        for _ in range(40):
            ids = [rng.randrange(n + 2) for _ in range(rng.randint(1, 12))]
            if rng.random() < 0.5:  # runs of byte-fallback tokens and their neighbours
                ids = [rng.randrange(min(n, 300)) for _ in range(rng.randint(1, 12))]
            decodes.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                            "text_skip": tok.decode(ids, skip_special_tokens=True)})
        out = {"version": tokenizers.__version__, "texts": cases, "decodes": decodes}
        with open(os.path.join(root, name, "hf_cases.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(name, len(cases), "texts", len(decodes), "decodes")


if __name__ == "__main__":
    main()
