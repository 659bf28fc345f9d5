#!/usr/bin/env python3
"""Generates engine/text/tok_unicode.c: the Unicode tables the tokenizer needs.

    python3 scripts/gen_tok_unicode.py > engine/text/tok_unicode.c

The data comes from Python's unicodedata module (Python 3.11 ships Unicode
14.0.0; the generated file records the version it was made from).  Tables:

Normalization data is limited to characters assigned by Unicode 9.0: HF
tokenizers' NFC/NFD come from the unicode-normalization-alignments crate,
whose tables are Unicode 9.0, so a combining mark added later (U+07FD, U+1ABF,
...) is left where it is there.  Normalization data of assigned characters is
stable, so "Unicode 14 data of the characters present in 9.0" is the 9.0 data.
Ages come from Perl's Unicode database (\p{In=9.0}); with that, NFC/NFD agree
with HF tokenizers 0.23 on every code point.

- canonical combining classes (non-zero ones), as ranges;
- full canonical decompositions (applied recursively), Hangul excluded (the C
  code decomposes Hangul syllables algorithmically);
- primary composites (canonical pairs that NFC recomposes: composition
  exclusions and singletons left out), Hangul excluded;
- normalization "unsafe" flags: bit 0 = the character can change under NFC or
  interact with its neighbour (NFC_Quick_Check No/Maybe, or ccc != 0), bit 1 =
  the same for NFD (has a canonical decomposition, or ccc != 0);
- White_Space, numeric (general category N*, Rust's char::is_numeric), word
  characters (the Rust regex crate's Unicode \\w), punctuation (P*);
- simple per-character lowercase mappings (Rust's char::to_lowercase, which is
  Python's str.lower() of one character: U+0130 maps to two characters).
"""
import subprocess
import sys
import unicodedata

MAXCP = 0x110000


def chars():
    for cp in range(MAXCP):
        if 0xD800 <= cp < 0xE000:
            continue
        yield cp


def is_hangul_syllable(cp):
    return 0xAC00 <= cp < 0xAC00 + 11172


def canon_decomp(cp):
    """Full canonical decomposition of one code point (list), Hangul excluded."""
    d = unicodedata.decomposition(chr(cp))
    if not d or d.startswith('<'):
        return [cp]
    out = []
    for h in d.split():
        out.extend(canon_decomp(int(h, 16)))
    return out


def ranges_of(pred):
    out = []
    for cp in chars():
        if pred(cp):
            if out and out[-1][1] == cp - 1:
                out[-1][1] = cp
            else:
                out.append([cp, cp])
    return out


def valued_ranges(fn):
    """Ranges of consecutive code points with the same non-zero value."""
    out = []
    for cp in chars():
        v = fn(cp)
        if not v:
            continue
        if out and out[-1][1] == cp - 1 and out[-1][2] == v:
            out[-1][1] = cp
        else:
            out.append([cp, cp, v])
    return out


def emit_array(name, ctype, items, per_line=6):
    print(f"static const {ctype} {name}[] = {{")
    for i in range(0, len(items), per_line):
        print("    " + " ".join(items[i:i + per_line]))
    print("};")
    print()


def assigned_by_9_0():
    """Code points assigned in Unicode 9.0 or earlier (Perl's \p{In=9.0})."""
    out = subprocess.run(["perl", "-e", 'for my $c (0..0x10FFFF) { next if $c>=0xD800 && $c<0xE000; '
                          'print "$c\\n" if chr($c) =~ /\\p{In=9.0}/ }'],
                         check=True, capture_output=True, text=True).stdout
    return {int(x) for x in out.split()}


def main():
    old = assigned_by_9_0()
    assert 0x0301 in old and 0x07FD not in old
    ccc = {cp: unicodedata.combining(chr(cp)) for cp in chars() if cp in old and unicodedata.combining(chr(cp))}

    decomp = {}
    for cp in chars():
        if is_hangul_syllable(cp) or cp not in old:
            continue
        d = canon_decomp(cp)
        if d != [cp]:
            decomp[cp] = d

    # nf_segment in tok_pretok.c sizes its buffer for 4 code points per byte
    assert max(len(v) for v in decomp.values()) <= 4

    comps = {}
    for cp in chars():
        if is_hangul_syllable(cp) or cp not in old:
            continue
        d = unicodedata.decomposition(chr(cp))
        if not d or d.startswith('<'):
            continue
        parts = [int(h, 16) for h in d.split()]
        if len(parts) != 2:
            continue
        # A primary composite survives NFC of its own decomposition.
        if unicodedata.normalize('NFC', chr(parts[0]) + chr(parts[1])) == chr(cp):
            comps[(parts[0], parts[1])] = cp

    seconds = {b for (_, b) in comps}
    seconds.update(range(0x1161, 0x1176))  # Hangul V jamo compose with L
    seconds.update(range(0x11A8, 0x11C3))  # Hangul T jamo compose with LV

    def unsafe(cp):
        v = 0
        c = chr(cp)
        if cp not in old:
            return 0
        if cp in ccc or cp in seconds or unicodedata.normalize('NFC', c) != c:
            v |= 1
        if cp in ccc or cp in decomp or is_hangul_syllable(cp):
            v |= 2
        return v

    # White_Space (PropList.txt); stable since Unicode 6.3, and what both
    # Rust's char::is_whitespace and Oniguruma's \\s match.
    white = [[0x9, 0xD], [0x20, 0x20], [0x85, 0x85], [0xA0, 0xA0], [0x1680, 0x1680], [0x2000, 0x200A],
             [0x2028, 0x2029], [0x202F, 0x202F], [0x205F, 0x205F], [0x3000, 0x3000]]
    numeric = ranges_of(lambda cp: unicodedata.category(chr(cp)) in ('Nd', 'Nl', 'No'))
    other_alpha_symbols = set(range(0x24B6, 0x24EA)) | set(range(0x1F130, 0x1F14A)) | \
        set(range(0x1F150, 0x1F16A)) | set(range(0x1F170, 0x1F18A))
    word = ranges_of(lambda cp: unicodedata.category(chr(cp))[0] in 'LM'
                     or unicodedata.category(chr(cp)) in ('Nd', 'Nl', 'Pc')
                     or cp in (0x200C, 0x200D) or cp in other_alpha_symbols)
    punct = ranges_of(lambda cp: unicodedata.category(chr(cp))[0] == 'P')

    lower = []
    for cp in chars():
        lo = chr(cp).lower()
        if lo != chr(cp):
            lower.append((cp, [ord(x) for x in lo]))

    print("/* tok_unicode.c - Unicode tables for the tokenizer.  GENERATED by")
    print(" * scripts/gen_tok_unicode.py from Python %s's unicodedata (Unicode %s;"
          % (sys.version.split()[0], unicodedata.unidata_version))
    print(" * normalization data only for characters of Unicode 9.0, as HF tokenizers has it);")
    print(" * do not edit by hand.  Lookups are binary searches over sorted tables;")
    print(" * Hangul syllables are (de)composed algorithmically in tok_pretok.c. */")
    print('#include "tok_internal.h"')
    print()
    print('const char tok_unicode_version[] = "%s";' % unicodedata.unidata_version)
    print()

    emit_array("ccc_ranges", "uint32_t",
               ["0x%x,0x%x,%d," % (a, b, v) for a, b, v in valued_ranges(lambda cp: ccc.get(cp, 0))], 6)
    emit_array("unsafe_ranges", "uint32_t",
               ["0x%x,0x%x,%d," % (a, b, v) for a, b, v in valued_ranges(unsafe)], 6)

    keys = sorted(decomp)
    data = []
    idx = []
    for cp in keys:
        idx.append("0x%x,%d,%d," % (cp, len(data), len(decomp[cp])))
        data.extend(decomp[cp])
    emit_array("decomp_index", "uint32_t", idx, 8)
    emit_array("decomp_data", "uint32_t", ["0x%x," % x for x in data], 14)

    pairs = sorted(comps.items())
    emit_array("comp_pairs", "uint64_t",
               ["0x%xull,0x%x," % ((a << 21) | b, c) for (a, b), c in pairs], 5)

    def emit_ranges(name, rs):
        emit_array(name, "uint32_t", ["0x%x,0x%x," % (a, b) for a, b in rs], 7)

    emit_ranges("white_ranges", white)
    emit_ranges("numeric_ranges", numeric)
    emit_ranges("word_ranges", word)
    emit_ranges("punct_ranges", punct)

    litems = []
    for cp, lo in lower:
        assert len(lo) <= 2
        litems.append("0x%x,0x%x,0x%x," % (cp, lo[0], lo[1] if len(lo) > 1 else 0))
    emit_array("lower_map", "uint32_t", litems, 7)

    print("""/* Index of the range containing cp in a table of (lo, hi[, value]) rows of
 * `width` words, or -1. */
static long range_find(const uint32_t *t, size_t words, size_t width, uint32_t cp)
{
    size_t lo = 0, hi = words / width;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *r = t + mid * width;
        if (cp < r[0]) hi = mid;
        else if (cp > r[1]) lo = mid + 1;
        else return (long)mid;
    }
    return -1;
}

#define NWORDS(a) (sizeof(a) / sizeof((a)[0]))

int tok_uni_ccc(uint32_t cp)
{
    if (cp < 0x300) return 0;
    long i = range_find(ccc_ranges, NWORDS(ccc_ranges), 3, cp);
    return i < 0 ? 0 : (int)ccc_ranges[i * 3 + 2];
}

int tok_uni_unsafe(uint32_t cp)
{
    if (cp < 0xc0) return 0;
    long i = range_find(unsafe_ranges, NWORDS(unsafe_ranges), 3, cp);
    return i < 0 ? 0 : (int)unsafe_ranges[i * 3 + 2];
}

int tok_uni_decomp(uint32_t cp, const uint32_t **out)
{
    size_t lo = 0, hi = NWORDS(decomp_index) / 3;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t k = decomp_index[mid * 3];
        if (cp < k) hi = mid;
        else if (cp > k) lo = mid + 1;
        else {
            *out = decomp_data + decomp_index[mid * 3 + 1];
            return (int)decomp_index[mid * 3 + 2];
        }
    }
    return 0;
}

uint32_t tok_uni_compose(uint32_t a, uint32_t b)
{
    uint64_t key = ((uint64_t)a << 21) | b;
    size_t lo = 0, hi = NWORDS(comp_pairs) / 2;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint64_t k = comp_pairs[mid * 2];
        if (key < k) hi = mid;
        else if (key > k) lo = mid + 1;
        else return (uint32_t)comp_pairs[mid * 2 + 1];
    }
    return 0;
}

int tok_uni_is_space(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13);
    return range_find(white_ranges, NWORDS(white_ranges), 2, cp) >= 0;
}

int tok_uni_is_numeric(uint32_t cp)
{
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return range_find(numeric_ranges, NWORDS(numeric_ranges), 2, cp) >= 0;
}

int tok_uni_is_word(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    return range_find(word_ranges, NWORDS(word_ranges), 2, cp) >= 0;
}

int tok_uni_is_punct(uint32_t cp)
{
    return range_find(punct_ranges, NWORDS(punct_ranges), 2, cp) >= 0;
}

int tok_uni_lower(uint32_t cp, uint32_t out[2])
{
    if (cp < 0x80) {
        out[0] = cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
        return 1;
    }
    size_t lo = 0, hi = NWORDS(lower_map) / 3;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t k = lower_map[mid * 3];
        if (cp < k) hi = mid;
        else if (cp > k) lo = mid + 1;
        else {
            out[0] = lower_map[mid * 3 + 1];
            out[1] = lower_map[mid * 3 + 2];
            return out[1] ? 2 : 1;
        }
    }
    out[0] = cp;
    return 1;
}""")


if __name__ == '__main__':
    main()
