#!/usr/bin/env bash
# The layout's checks: scripts/check_includes.py (the tree's includes point
# down the floors; it fails on a copy of the tree given one upward include,
# grammar -> engine, and one header name used twice) and
# scripts/check_functions.py (no function past 150 lines, no file past 1,500;
# it fails on a copy given a longer function).
# usage: tests/cli/layout.sh [PATH/TO/quire]   (run from the source root; the binary is unused)
set -u
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
fail=0
python3 scripts/check_includes.py || { echo "FAIL the tree has upward includes"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r base kernels engine grammar spec server "$tmp/"
python3 scripts/check_includes.py --root "$tmp" >/dev/null 2>&1 || { echo "FAIL the copy is not clean"; fail=1; }
sed -i '0,/#include "qerr.h"/s//#include "qerr.h"\n#include "engine.h"/' "$tmp/grammar/gram.c"
out=$(python3 scripts/check_includes.py --root "$tmp" 2>&1)
if [ $? -eq 1 ] && grep -q 'grammar/gram.c:.* grammar includes engine/engine.h' <<<"$out"; then
  echo "ok   an upward include fails the check"
else
  echo "FAIL an upward include passed: $out"; fail=1
fi
cp "$tmp/base/util.h" "$tmp/server/util.h"
sed -i '/#include "engine.h"/d' "$tmp/grammar/gram.c"
out=$(python3 scripts/check_includes.py --root "$tmp" 2>&1)
if [ $? -eq 1 ] && grep -q 'header name also used by' <<<"$out"; then
  echo "ok   a header name used twice fails the check"
else
  echo "FAIL a duplicate header name passed: $out"; fail=1
fi
python3 scripts/check_functions.py || { echo "FAIL a function or file past the limits"; fail=1; }
{
  echo "int too_long(int x)"
  echo "{"
  for i in $(seq 1 150); do echo "    x += $i;"; done
  echo "    return x;"
  echo "}"
} >>"$tmp/spec/ngram.c"
out=$(python3 scripts/check_functions.py --root "$tmp" 2>&1)
if [ $? -eq 1 ] && grep -q 'spec/ngram.c:.*too_long.* is 154 lines, past 150' <<<"$out"; then
  echo "ok   a function past 150 lines fails the check"
else
  echo "FAIL a long function passed: $out"; fail=1
fi
exit $fail
