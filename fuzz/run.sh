#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) and runs each for a bounded time.
#
# Usage: fuzz/run.sh [-d BUILD_DIR] [-t SECONDS] [-j PARALLEL] [-o RESULTS] [-m] [TARGET...]
#   -d  build tree (default build-fuzz; configured on first use)
#   -t  seconds per target (default 12)
#   -j  targets run at once (default 1; the machine has 2 CPUs)
#   -o  results file: one "ok NAME ..." / "not ok NAME ..." line per target, then a final
#       "N passed, N failed" line (scripts/summarize.py reads it)
#   -m  afterwards, merge what the run found into fuzz/corpus/TARGET (-merge=1, edges only)
# Targets default to all. Each run's new inputs go to a scratch directory, not to the tree,
# unless -m; a crash input is kept as BUILD_DIR/fuzz-out/TARGET/crash-* (copy it to
# fuzz/regressions/TARGET/ once fixed). Logs: BUILD_DIR/fuzz-out/TARGET.log.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=build-fuzz secs=12 jobs=1 results="" merge=0
while getopts "d:t:j:o:m" opt; do
  case $opt in
    d) dir=$OPTARG ;;
    t) secs=$OPTARG ;;
    j) jobs=$OPTARG ;;
    o) results=$OPTARG ;;
    m) merge=1 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(proto handshake json shm http ws serve_frame serve_options)

# Inputs as long as each protocol's messages get, within reason.
declare -A max_len=([proto]=4096 [handshake]=8192 [json]=8192 [shm]=4096 [http]=8192 [ws]=8192 [serve_frame]=8192 [serve_options]=16384)

if [[ ! -f "$dir/build.ninja" ]]; then
  CC=clang meson setup "$dir" -Dfuzz=enabled -Db_sanitize=address,undefined -Db_lundef=false \
    -Dpython=disabled -Dlua=disabled -Dtests=false >/dev/null || exit 1
fi
ninja -C "$dir" -j2 "${targets[@]/#/fuzz/fuzz_}" >/dev/null || ninja -C "$dir" -j1 "${targets[@]/#/fuzz/fuzz_}" || exit 1

out="$dir/fuzz-out"
rm -rf "$out" && mkdir -p "$out"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

run_one() { # run_one TARGET: fuzzes it for $secs seconds; a summary line on stdout
  local t=$1 scratch="$out/$t.new"
  mkdir -p "$scratch" "$out/$t"
  "$dir/fuzz/fuzz_$t" "$scratch" "fuzz/corpus/$t" -max_total_time="$secs" \
    -max_len="${max_len[$t]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/$t/" >"$out/$t.log" 2>&1
  local rc=$?
  local last execs speed cov ft corp
  last=$(grep -E '^#[0-9]+' "$out/$t.log" | tail -n 1)
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$out/$t.log" | grep -oE '[0-9]+$')
  speed=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$out/$t.log" | grep -oE '[0-9]+$')
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+')
  ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+')
  corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' <<<"$last" | cut -d' ' -f2)
  local status=ok
  [[ $rc -eq 0 ]] || status="not ok"
  echo "$status $t execs=${execs:-?} exec/s=${speed:-?} cov=${cov:-?} ft=${ft:-?} corp=${corp:-?} rc=$rc"
  if [[ $rc -ne 0 ]]; then
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$out/$t.log" | head -n 5 >&2
  fi
}

lines="$out/lines"
: >"$lines"
running=0
for t in "${targets[@]}"; do
  run_one "$t" >>"$lines" &
  running=$((running + 1))
  if [[ $running -ge $jobs ]]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

# Merging keeps the fewest inputs that reach every edge the corpus and the run reached
# (-use_counters=0: edges, not hit counts), so the corpus in the tree stays small.
if [[ $merge -eq 1 ]]; then
  for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "$out/$t.min"
    if "$dir/fuzz/fuzz_$t" -merge=1 -use_counters=0 -max_len="${max_len[$t]}" "$out/$t.min" \
      "fuzz/corpus/$t" "$out/$t.new" >"$out/$t.merge.log" 2>&1; then
      rm -f "fuzz/corpus/$t"/* && cp "$out/$t.min"/* "fuzz/corpus/$t/"
    else
      echo "merge of $t failed (see $out/$t.merge.log)" >&2
    fi
  done
fi

# In the order the targets were named, then the count line.
passed=0 failed=0
report=$(for t in "${targets[@]}"; do grep -E "^(ok|not ok) $t " "$lines"; done)
echo "$report"
passed=$(grep -c '^ok ' <<<"$report")
failed=$(grep -c '^not ok ' <<<"$report")
failed=$((failed + ${#targets[@]} - passed - failed)) # a target that printed nothing failed
summary="$passed passed, $failed failed"
echo "$summary"
if [[ -n $results ]]; then
  mkdir -p "$(dirname "$results")"
  { echo "$report"; echo "$summary"; } >"$results"
fi
[[ $failed -eq 0 ]]
