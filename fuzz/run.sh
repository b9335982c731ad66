#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) and runs each for a bounded time.
#
# Usage: fuzz/run.sh [-d BUILD_DIR] [-t SECONDS] [-j PARALLEL] [-o RESULTS] [-m] [-c] [TARGET...]
#   -d  build tree (default build-fuzz; configured on first use)
#   -t  seconds per target (default 12)
#   -j  targets run at once (default 1; the machine has 2 CPUs)
#   -o  results file: one "ok NAME ..." / "not ok NAME ..." line per target, then a final
#       "N passed, N failed" line (scripts/summarize.py reads it)
#   -m  afterwards, merge what the run found into fuzz/corpus/TARGET (-merge=1, edges only)
#   -c  first remove the crash inputs that earlier runs left for the named targets
# Targets default to all. Each run's new inputs go to a scratch directory, not to the tree,
# unless -m; a crash input is kept as BUILD_DIR/fuzz-out/TARGET/crash-* (also leak-,
# timeout-, oom-; copy it to fuzz/regressions/TARGET/ once fixed) until -c: a later call, for
# the same target or another (a long run split into calls), leaves it there, and the end of
# each call names the targets that have some. A target's log (BUILD_DIR/fuzz-out/TARGET.log)
# and scratch inputs are those of the last call that ran it.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=build-fuzz secs=12 jobs=1 results="" merge=0 clean=0
while getopts "d:t:j:o:mc" opt; do
  case $opt in
    d) dir=$OPTARG ;;
    t) secs=$OPTARG ;;
    j) jobs=$OPTARG ;;
    o) results=$OPTARG ;;
    m) merge=1 ;;
    c) clean=1 ;;
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
mkdir -p "$out"
# Only the named targets' logs and scratch inputs are remade; crash inputs stay unless -c.
for t in "${targets[@]}"; do
  rm -rf "${out:?}/$t.new" "$out/$t.min" "$out/$t.log" "$out/$t.merge.log"
  [[ $clean -eq 0 ]] || rm -rf "${out:?}/$t"
done
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

run_one() { # run_one TARGET: fuzzes it for $secs seconds; a summary line on stdout
  local t=$1
  local scratch="$out/$t.new"
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
  # The inputs this call wrote (libFuzzer names the file it wrote for a crash, leak or timeout).
  local written
  written=$(grep -oE 'Test unit written to [^ ]+' "$out/$t.log" | sed 's/^Test unit written to //' | tr '\n' ',')
  echo "$status $t execs=${execs:-?} exec/s=${speed:-?} cov=${cov:-?} ft=${ft:-?} corp=${corp:-?} rc=$rc${written:+ wrote=${written%,}}"
  if [[ $rc -ne 0 ]]; then
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$out/$t.log" | head -n 5 >&2
  fi
}

lines=$(mktemp "$out/lines.XXXXXX") || exit 1
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
rm -f "$lines"
# Crash inputs from this call or earlier ones, which no later call removes (-c does).
for t in "${targets[@]}"; do
  kept=$(find "$out/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' \) 2>/dev/null | wc -l)
  [[ $kept -eq 0 ]] || echo "$t: $kept crash input(s) kept in $out/$t/ (from this call or earlier ones)" >&2
done
if [[ -n $results ]]; then
  mkdir -p "$(dirname "$results")"
  { echo "$report"; echo "$summary"; } >"$results"
fi
[[ $failed -eq 0 ]]
