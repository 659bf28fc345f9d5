#!/usr/bin/env bash
# tokenize.sh - encode throughput of quire's tokenizers beside HF tokenizers
# (Rust, through its Python binding, pinned in tests/e2e/requirements.txt), on
# the same machine, the same texts and one thread each.
#
#     bash bench/tokenize.sh                 # every tokenizer in tests/fixtures/tokenizers
#
# Texts (made into bench/out/, about 1 MB each):
#   english  the license texts in /usr/share/common-licenses, then the Debian
#            changelogs in /usr/share/doc (sorted), cut at 1,000,000 bytes;
#   mixed    tests/e2e/strings.py's random strings (seed 1): mixed scripts,
#            emoji, whitespace runs, digits, code, combining marks.
# Each figure is the best of 5 encodes, with special-token parsing on and no
# BOS/EOS: quire encodes the text as one string; HF both as one string and as
# a batch of its lines on one thread, and the faster is shown.  Token counts
# (whole-string encodes) are compared too.
# Environment: QUIRE_BIN (default ./build/quire), QUIRE_VENV (default bench/.venv-tok).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QUIRE_BIN=${QUIRE_BIN:-$ROOT/build/quire}
VENV=${QUIRE_VENV:-$ROOT/bench/.venv-tok}
OUT=$ROOT/bench/out
mkdir -p "$OUT"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -r "$ROOT/tests/e2e/requirements.txt"
fi
PY=$VENV/bin/python

"$PY" - "$OUT" "$ROOT" <<'PYEOF'
import glob, gzip, os, sys
out, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "tests", "e2e"))
from strings import random_strings
parts = []
for f in sorted(glob.glob("/usr/share/common-licenses/*")):
    if os.path.isfile(f):
        parts.append(open(f, encoding="utf-8", errors="replace").read())
for f in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz")):
    parts.append(gzip.open(f, "rt", encoding="utf-8", errors="replace").read())
    if sum(map(len, parts)) > 1_200_000:
        break
en = "".join(parts).encode()[:1_000_000].decode("utf-8", errors="ignore")
open(os.path.join(out, "english.txt"), "w", encoding="utf-8", newline="").write(en)
mixed, n = [], 0
for s in random_strings(1, 200000):
    mixed.append(s)
    n += len(s.encode())
    if n > 1_000_000:
        break
open(os.path.join(out, "mixed.txt"), "w", encoding="utf-8", newline="").write("\n".join(mixed))
PYEOF

echo "| tokenizer | text | MB | quire MB/s | HF tokenizers MB/s | quire / HF | tokens (quire = HF) |"
echo "|---|---|---|---|---|---|---|"
for d in "$ROOT"/tests/fixtures/tokenizers/*/; do
    [ -f "$d/tokenizer.json" ] || continue
    name=$(basename "$d")
    for text in english mixed; do
        f=$OUT/$text.txt
        q=$("$QUIRE_BIN" tokenize -m "$d/tokenizer.json" --special --no-add-special --bench 5 <"$f" 2>&1 >/dev/null | tail -1)
        qmbs=$(echo "$q" | awk '{ print $(NF-1) }')
        qn=$(echo "$q" | awk '{ print $5 }')
        read -r hmbs hn < <(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$PY" - "$d/tokenizer.json" "$f" <<'PYEOF'
import sys, time
from tokenizers import Tokenizer
t = Tokenizer.from_file(sys.argv[1])
text = open(sys.argv[2], encoding="utf-8", newline="").read()
n = len(text.encode())
# HF's two ways: the text as one string, and its lines as a batch (on one
# thread: RAYON_NUM_THREADS=1); the faster one is reported.
lines = text.splitlines(keepends=True)
best = 1e9
for _ in range(5):
    t0 = time.perf_counter()
    ids = t.encode(text, add_special_tokens=False).ids
    best = min(best, time.perf_counter() - t0)
    t0 = time.perf_counter()
    t.encode_batch(lines, add_special_tokens=False)
    best = min(best, time.perf_counter() - t0)
print("%.2f %d" % (n / best / 1e6, len(ids)))
PYEOF
)
        mb=$(stat -c %s "$f" | awk '{ printf "%.2f", $1 / 1e6 }')
        ratio=$(awk -v a="$qmbs" -v b="$hmbs" 'BEGIN { printf "%.1fx", a / b }')
        same=$([ "$qn" = "$hn" ] && echo "$qn (same)" || echo "$qn vs $hn")
        echo "| $name | $text | $mb | $qmbs | $hmbs | $ratio | $same |"
    done
done
echo
echo "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), quire $QUIRE_BIN, tokenizers $("$PY" -c 'import tokenizers; print(tokenizers.__version__)'))"
