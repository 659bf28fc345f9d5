#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this).
#   1. release build with warnings as errors (CUDA backend too where nvcc is found), ctest;
#   2. ASan + UBSan build of the unit tests, ctest;
#   3. libFuzzer targets, each to FUZZ_RUNS executions (default 1,000,000) or
#      FUZZ_MAX_TIME seconds (default 300), FUZZ_JOBS (default 2) at a time;
#   4. end-to-end tests: pytest against the real binary, in a venv with the
#      pinned versions of tests/e2e/requirements.txt;
#   5. the server's end-to-end tests against the ASan + UBSan binary.
# Environment: FUZZ_RUNS, FUZZ_MAX_TIME, FUZZ_JOBS, FUZZ_STRICT, FUZZ_SEED (libFuzzer seed, default 1: CI runs
# are reproducible; other seeds explore further locally), JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
bash scripts/deps.sh test
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

section() { printf '\n==== %s ====\n' "$*"; }

# Counts of a ctest log as "passed failed skipped".  ctest's "N% tests passed, F tests
# failed out of T" counts a skipped test (exit status 77, SKIP_RETURN_CODE) among the
# passed; it lists it under "The following tests did not run:" as "(Skipped)".
ctest_counts() {
  local total=0 failed=0 skipped=0 line
  if [ -f "$1" ]; then
    line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$1" | tail -1 || true)
    [[ $line =~ ([0-9]+)\ tests\ failed\ out\ of\ ([0-9]+) ]] && failed=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
    skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .+ \(Skipped\)$' "$1" || true)
  fi
  echo "$((total - failed - skipped)) $failed $skipped"
}
# Counts of a pytest log as "passed failed skipped", from its last summary line
# ("40 passed, 2 skipped in 9.10s"); errors count as failed.
pytest_counts() {
  local p=0 f=0 e=0 s=0 line=
  [ -f "$1" ] && line=$(grep -E '^=* *[0-9]+ (passed|failed|skipped|errors?|deselected|xfailed|xpassed)\b' "$1" | tail -1 || true)
  [[ $line =~ ([0-9]+)\ passed ]] && p=${BASH_REMATCH[1]}
  [[ $line =~ ([0-9]+)\ failed ]] && f=${BASH_REMATCH[1]}
  [[ $line =~ ([0-9]+)\ errors? ]] && e=${BASH_REMATCH[1]}
  [[ $line =~ ([0-9]+)\ skipped ]] && s=${BASH_REMATCH[1]}
  echo "$p $((f + e)) $s"
}
fuzz_counts() { echo "$fuzz_pass $fuzz_failed 0"; }
# The suite's counts, added up phase by phase.  `pending` is the phase running
# (counter, log, name): when a failure stops the script (set -e), the summary
# still counts what that phase ran.
sum_p=0 sum_f=0 sum_s=0 phases=() pending=() fuzz_pass=0 fuzz_failed=0
tally() { # counter log name
  local p f s
  read -r p f s <<<"$("$1"_counts "$2")"
  sum_p=$((sum_p + p)) sum_f=$((sum_f + f)) sum_s=$((sum_s + s))
  phases+=("$3: $p passed, $f failed, $s skipped")
  pending=()
}
begin() { # counter log name: a phase starts (its old log goes)
  [ -n "$2" ] && rm -f "$2"
  pending=("$@")
}
summary() {
  local rc=$?
  [ ${#pending[@]} -gt 0 ] && tally "${pending[@]}"
  section "summary"
  printf '%s\n' "${phases[@]}"
  [ "$rc" -ne 0 ] && echo "the suite stopped early (exit status $rc)"
  echo "suite: $sum_p passed, $sum_f failed, $sum_s skipped"
}
trap summary EXIT

section "release build (-Werror) and unit tests"
begin ctest build/ci-ctest.log "release ctest"
cmake -S . -B build/ci -DCMAKE_BUILD_TYPE=Release -DQUIRE_WERROR=ON >/dev/null
cmake --build build/ci -j "$JOBS"
ctest --test-dir build/ci --output-on-failure -j "$JOBS" | tee build/ci-ctest.log
tally "${pending[@]}"

section "ASan + UBSan build and unit tests"
begin ctest build/asan-ctest.log "asan ctest"
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DQUIRE_WERROR=ON -DQUIRE_CUDA=OFF \
  -DQUIRE_SANITIZE=address,undefined >/dev/null
cmake --build build/asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -j "$JOBS" | tee build/asan-ctest.log
tally "${pending[@]}"

# Every tests/fuzz/fuzz_*.c target runs until FUZZ_RUNS executions (default
# 1,000,000) from a scratch copy of its seed corpus, with FUZZ_MAX_TIME seconds
# (default 300) as a safety net, FUZZ_JOBS (default 2) targets at a time, each
# with its own log (build/fuzz/<target>.log).  A target fails the suite when it
# crashes, leaks, times out, or ends below FUZZ_RUNS executions (FUZZ_STRICT=0
# only reports those below).  A target's header comment may give "max_len: N"
# (the longest input worth trying) and "max_time: S" (its own safety net, in
# place of FUZZ_MAX_TIME when larger: a target whose speed swings with the
# corpus it grows) and "min_runs: N" (the executions it must reach when that
# time runs out first, in place of FUZZ_RUNS when smaller).  On CI's two cores the slowest take about
# 180 s (fuzz_schema), 135 s (fuzz_calls), 110 s (fuzz_tokenizer_load) and
# 90 s (fuzz_regex).
FUZZ_RUNS=${FUZZ_RUNS:-1000000}
FUZZ_MAX_TIME=${FUZZ_MAX_TIME:-300}
FUZZ_STRICT=${FUZZ_STRICT:-1}
fuzz_below=()
FUZZ_JOBS=${FUZZ_JOBS:-2}
section "fuzz targets, ${FUZZ_RUNS} executions each (at most ${FUZZ_MAX_TIME}s), ${FUZZ_JOBS} at a time"
begin fuzz "" "fuzz targets"
fuzz_start=$SECONDS
# The slow targets first, so that the last to finish are the quick ones.
fuzz_names=()
for n in fuzz_regex fuzz_schema fuzz_calls fuzz_tokenizer_encode fuzz_tokenizer_load fuzz_chat fuzz_oai; do
  [ -f "tests/fuzz/$n.c" ] && fuzz_names+=("$n")
done
for src in tests/fuzz/fuzz_*.c; do
  n=$(basename "$src" .c)
  [[ " ${fuzz_names[*]} " == *" $n "* ]] || fuzz_names+=("$n")
done
CC=clang cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQUIRE_CUDA=OFF -DQUIRE_FUZZ=ON \
  -DBUILD_TESTING=OFF >/dev/null
cmake --build build/fuzz -j "$JOBS" --target "${fuzz_names[@]}"
echo "fuzz build: $((SECONDS - fuzz_start))s"
fuzz_run() { # name: runs one target; its log is build/fuzz/<name>.log
  local name=$1 work=build/fuzz/corpus-$1 max_len max_time
  max_len=$(sed -n 's/^\( \*\|\/\/\) *max_len: *\([0-9][0-9]*\).*/\2/p' "tests/fuzz/$name.c" | head -1)
  max_time=$(sed -n 's/^\( \*\|\/\/\) *max_time: *\([0-9][0-9]*\).*/\2/p' "tests/fuzz/$name.c" | head -1)
  [ -n "$max_time" ] && [ "$max_time" -gt "$FUZZ_MAX_TIME" ] || max_time=$FUZZ_MAX_TIME
  rm -rf "$work" && mkdir -p "$work"
  [ -d "tests/fuzz/corpus/${name#fuzz_}" ] && cp -r "tests/fuzz/corpus/${name#fuzz_}"/. "$work"/
  exec "build/fuzz/$name" -runs="$FUZZ_RUNS" -max_total_time="$max_time" -seed="${FUZZ_SEED:-1}" \
    ${max_len:+-max_len="$max_len"} -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix=build/fuzz/ "$work" >"build/fuzz/$name.log" 2>&1
}
fuzz_check() { # name rc seconds: prints the target's line; 0 when it passed
  local name=$1 rc=$2 secs=$3 units rate need=$FUZZ_RUNS min_runs
  min_runs=$(sed -n 's/^\( \*\|\/\/\) *min_runs: *\([0-9][0-9]*\).*/\2/p' "tests/fuzz/$name.c" | head -1)
  [ -n "$min_runs" ] && [ "$min_runs" -lt "$need" ] && need=$min_runs
  units=$(sed -n 's/^stat::number_of_executed_units: *//p' "build/fuzz/$name.log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "build/fuzz/$name.log")
  echo "-- $name: ${units:-0} executions, ${rate:-0} exec/s, ${secs}s"
  grep -E "^(stat::peak_rss_mb)|ERROR|SUMMARY" "build/fuzz/$name.log" || true
  if [ "$rc" -ne 0 ]; then
    tail -50 "build/fuzz/$name.log"
    echo "FAIL $name: exit status $rc (crash, leak, timeout or out of memory; see build/fuzz/$name.log)"
    return 1
  fi
  if [ "${units:-0}" -lt "$FUZZ_RUNS" ] && [ "${units:-0}" -ge "$need" ]; then
    echo "   ($name's max_time ran out first; its floor is $need executions)"
  elif [ "${units:-0}" -lt "$FUZZ_RUNS" ]; then
    if [ "$FUZZ_STRICT" = 1 ]; then
      echo "FAIL $name: ${units:-0} executions in ${secs}s, fewer than $need"
      return 1
    fi
    echo "BELOW $name: ${units:-0} executions in ${secs}s, fewer than $FUZZ_RUNS"
    fuzz_below+=("$name")
  fi
}
declare -A fuzz_pid_name=() fuzz_began=()
fuzz_reap() { # waits for one running target and checks it
  local pid rc=0
  wait -n -p pid "${!fuzz_pid_name[@]}" || rc=$?
  local name=${fuzz_pid_name[$pid]}
  unset "fuzz_pid_name[$pid]"
  if ! fuzz_check "$name" "$rc" $((SECONDS - ${fuzz_began[$name]})); then
    fuzz_failed=1
    for pid in "${!fuzz_pid_name[@]}"; do kill "$pid" 2>/dev/null || true; done
    exit 1
  fi
  fuzz_pass=$((fuzz_pass + 1))
}
for name in "${fuzz_names[@]}"; do
  while [ "${#fuzz_pid_name[@]}" -ge "$FUZZ_JOBS" ]; do fuzz_reap; done
  fuzz_began[$name]=$SECONDS
  fuzz_run "$name" &
  fuzz_pid_name[$!]=$name
done
while [ "${#fuzz_pid_name[@]}" -gt 0 ]; do fuzz_reap; done
echo "fuzz: $((SECONDS - fuzz_start))s in all; below $FUZZ_RUNS executions: ${fuzz_below[*]:-none}"
echo "fuzz: $fuzz_pass passed, 0 failed"
tally "${pending[@]}"

if [ -d tests/e2e ] && ls tests/e2e/test_*.py >/dev/null 2>&1; then
  section "end-to-end tests"
  begin pytest build/e2e.log "e2e"
  python3 -m venv build/venv
  build/venv/bin/pip install -q -r tests/e2e/requirements.txt
  # -rs: each skipped test with its reason (MaskBench needs ../shared, a clone may lack it)
  QUIRE_BIN=build/ci/quire build/venv/bin/python -m pytest -q -rs tests/e2e | tee build/e2e.log
  tally "${pending[@]}"

  # The server's own tests once more on the sanitizer build: a memory error,
  # undefined behaviour or a leak at exit kills the server or its exit status,
  # and the test that saw it fails.
  section "end-to-end server tests on the ASan + UBSan build"
  begin pytest build/e2e-asan.log "e2e on the sanitizer build"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 QUIRE_SANITIZED=1 \
    QUIRE_BIN=build/asan/quire build/venv/bin/python -m pytest -q -rs tests/e2e/test_hostile.py \
    tests/e2e/test_serve_openai.py tests/e2e/test_serve_ws.py tests/e2e/test_sessions.py tests/e2e/test_soak.py \
    tests/e2e/test_store_damage.py tests/e2e/test_dropin.py | tee build/e2e-asan.log
  tally "${pending[@]}"
fi
# The summary (passed, failed and skipped of every phase, then the suite's
# line) comes from the EXIT trap, also when a failure stops the suite.
