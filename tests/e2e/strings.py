"""Random test strings for differential tokenizer tests.

Mixed scripts, emoji (with ZWJ sequences and modifiers), whitespace runs of
every kind, digit runs, code, combining sequences, and odd code points
(private use, noncharacters, controls, U+FFFD).  Deterministic for a seed.
"""
import random

SCRIPTS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœŒ",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГД",
    "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔ",
    "的一是不了人我在有他这为之大来以个中上们",
    "あいうえおかきくけこアイウエオカキクケコ",
    "가나다라마바사아자차카타파하",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "अआइईउऊएऐओऔकखगघचछजझटठडढ",
    "שלוםעולםאבגדהוזחטיכלמנסעפצקרשת",
    "กขฃคฅฆงจฉชซฌญฎฏฐ",
]
EMOJI = ["😀", "🎉", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🤖", "🇫🇷", "✨", "🙏🏿", "1️⃣"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u2003", "\u3000", "\u200b", "\u2028", "\f", "\v"]
CODE = [
    "def f(x):\n    return x + 1\n",
    "for (int i = 0; i < n; i++) { a[i] *= 2; }",
    "if x == None: pass",
    '{"key": [1, 2.5, "v"], "ok": true}',
    "<div class=\"a\">Hi</div>",
    "SELECT * FROM t WHERE id = 42;",
    "x += y ** 2 // 3",
    "#include <stdio.h>",
    "   indented\n\tcode\n",
    "I'm you're it's we'll they've I'd",
]
WORDS = ["the", "The", "quick", "brown", "fox", "Hello", "world", "tokenizer", "don't", "12345",
         "3.14159", "1,000,000", "e-mail", "co-op", "U.S.A.", "naïve", "Straße", "日本語", "über"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u0915\u094d\u0937", "A\u030a", "\u1100\u1161\u11a8"]
ODD = ["\ue000", "\uf8ff", "\ufffd", "\ufffe", "\uffff", "\U0010fffd", "\x00", "\x01", "\x1b", "\x7f",
       "\u0378", "\U000e0001", "\u00ad", "\u200d", "\u2060", "\U0001f3fb"]


def piece(rng):
    k = rng.random()
    if k < 0.22:
        return rng.choice(WORDS)
    if k < 0.40:
        s = rng.choice(SCRIPTS)
        return "".join(rng.choice(s) for _ in range(rng.randint(1, 8)))
    if k < 0.55:
        return rng.choice(SPACES) * rng.randint(1, 3)
    if k < 0.63:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
    if k < 0.71:
        return rng.choice(EMOJI)
    if k < 0.78:
        return rng.choice(CODE)
    if k < 0.85:
        return rng.choice(COMBINING)
    if k < 0.90:
        return rng.choice(ODD)
    if k < 0.95:
        return "".join(chr(rng.randint(0x20, 0x7e)) for _ in range(rng.randint(1, 10)))
    # any code point outside the surrogates
    out = []
    for _ in range(rng.randint(1, 4)):
        c = rng.randint(0, 0x10FFFF)
        if 0xD800 <= c <= 0xDFFF:
            c = 0x20
        out.append(chr(c))
    return "".join(out)


def random_strings(seed, n, max_pieces=12):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        out.append("".join(piece(rng) for _ in range(rng.randint(1, max_pieces))))
    return out
