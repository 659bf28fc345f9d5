#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this).
#   1. release build with warnings as errors (CUDA backend too where nvcc is found), ctest;
#   2. ASan + UBSan build of the unit tests, ctest;
#   3. libFuzzer targets, FUZZ_SECONDS each (default 60);
#   4. end-to-end tests: pytest against the real binary, in a venv with the
#      pinned versions of tests/e2e/requirements.txt.
# Environment: FUZZ_SECONDS, FUZZ_SEED (libFuzzer seed, default 1: CI runs
# are reproducible; other seeds explore further locally), JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
bash scripts/deps.sh test
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

section() { printf '\n==== %s ====\n' "$*"; }

section "release build (-Werror) and unit tests"
cmake -S . -B build/ci -DCMAKE_BUILD_TYPE=Release -DQUIRE_WERROR=ON >/dev/null
cmake --build build/ci -j "$JOBS"
ctest --test-dir build/ci --output-on-failure -j "$JOBS" | tee build/ci-ctest.log
n_release=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' build/ci-ctest.log)

section "ASan + UBSan build and unit tests"
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DQUIRE_WERROR=ON -DQUIRE_CUDA=OFF \
  -DQUIRE_SANITIZE=address,undefined >/dev/null
cmake --build build/asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -j "$JOBS" | tee build/asan-ctest.log
n_asan=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' build/asan-ctest.log)

section "fuzz targets, ${FUZZ_SECONDS}s each"
CC=clang cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQUIRE_CUDA=OFF -DQUIRE_FUZZ=ON \
  -DBUILD_TESTING=OFF >/dev/null
cmake --build build/fuzz -j "$JOBS"
fuzz_pass=0
for f in build/fuzz/fuzz_*; do
  name=$(basename "$f")
  corpus_src=tests/fuzz/corpus/${name#fuzz_}
  work=build/fuzz/corpus-$name
  rm -rf "$work" && mkdir -p "$work"
  [ -d "$corpus_src" ] && cp -r "$corpus_src"/. "$work"/
  echo "-- $name"
  rc=0
  "$f" -max_total_time="$FUZZ_SECONDS" -seed="${FUZZ_SEED:-1}" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix=build/fuzz/ "$work" >"build/fuzz/$name.log" 2>&1 || rc=$?
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)|ERROR|SUMMARY" "build/fuzz/$name.log" || true
  if [ "$rc" -ne 0 ]; then tail -50 "build/fuzz/$name.log"; echo "FAIL $name"; exit 1; fi
  fuzz_pass=$((fuzz_pass + 1))
done
echo "fuzz: $fuzz_pass passed, 0 failed"

if [ -d tests/e2e ] && ls tests/e2e/test_*.py >/dev/null 2>&1; then
  section "end-to-end tests"
  python3 -m venv build/venv
  build/venv/bin/pip install -q -r tests/e2e/requirements.txt
  QUIRE_BIN=build/ci/quire build/venv/bin/python -m pytest -q tests/e2e | tee build/e2e.log
  n_e2e=$(sed -n 's/^\([0-9]*\) passed.*/\1/p' build/e2e.log | tail -1)
fi
section "summary"
echo "release ctest ${n_release:-0}, asan ctest ${n_asan:-0}, fuzz targets $fuzz_pass, e2e ${n_e2e:-0}"
echo "suite: $(( ${n_release:-0} + ${n_asan:-0} + fuzz_pass + ${n_e2e:-0} )) passed, 0 failed"
