#!/bin/bash
# Per-process CPU per request of a server under wrk: the server (and its children: the
# workers) on CPU 0, wrk on CPU 1, loopback only. Used in docs/benchmarks.md (stops 43, 44).
#
#   bench/serve_split.sh SECONDS -- SERVER ARGV...
#
# The server is started with "--listen 127.0.0.1:PORT" appended and must answer GET / there.
# Prints req/s, the request count and p99, then one line per process: its CPU (user + system,
# from /proc/PID/stat) over the measured run divided by the requests. Bounded: a 1 s warm-up,
# then SECONDS of load (at most 60), then SIGTERM to the server.
set -eu
DUR=${1:?seconds}
shift
[ "${1:-}" = "--" ] && shift
[ "$DUR" -ge 1 ] && [ "$DUR" -le 60 ] || { echo "SECONDS: 1 .. 60" >&2; exit 2; }
PORT=$((20000 + RANDOM % 20000))
LOG=$(mktemp)
taskset -c 0 "$@" --listen 127.0.0.1:$PORT >"$LOG" 2>&1 &
SP=$!
trap 'kill -TERM $SP 2>/dev/null || true; wait $SP 2>/dev/null || true; rm -f "$LOG"' EXIT
up=0
for _ in $(seq 50); do
    if curl -s -o /dev/null "http://127.0.0.1:$PORT/"; then up=1; break; fi
    sleep 0.2
done
[ $up = 1 ] || { echo "the server did not answer; its output:" >&2; cat "$LOG" >&2; exit 1; }
taskset -c 1 wrk -t1 -c64 -d1s "http://127.0.0.1:$PORT/" >/dev/null
pids="$(pgrep -P $SP || true) $SP"
declare -A before
for p in $pids; do before[$p]=$(awk '{print $14+$15}' /proc/$p/stat); done
out=$(taskset -c 1 wrk --latency -t1 -c64 -d${DUR}s "http://127.0.0.1:$PORT/")
reqs=$(echo "$out" | awk '/requests in/{print $1}')
echo "req/s $(echo "$out" | awk '/Requests\/sec/{print $2}') requests $reqs p99 $(echo "$out" | awk '/ 99%/{print $2}')"
tck=$(getconf CLK_TCK)
for p in $pids; do
    a=$(awk '{print $14+$15}' /proc/$p/stat)
    echo "pid $p $(cat /proc/$p/comm) cpu_us/req $(awk -v d=$((a - ${before[$p]})) -v t=$tck -v n=$reqs 'BEGIN{printf "%.2f", d*1e6/t/n}')"
done
