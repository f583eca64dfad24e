#!/usr/bin/env bash
# hier-small.sh - gradwire's small allreduces across two "machines" of two ranks
# each (shm inside a machine, tcp between them): what a multi-node job's
# latency-bound calls cost on each algorithm.  Root only: the machines are two
# network namespaces (own host names, UTS namespaces) on a bridge, 10.78.0.1-2,
# removed at exit.  For ring, tree and exchange (GW_ALGO), gw-perf float32 sum
# from BENCH_MIN to BENCH_MAX (8 B .. 64 KiB) by 8, BENCH_ITERS (200) timed
# calls after 20, every result checked; prints the out-of-place and in-place
# microseconds per call and writes bench/results/hier-small-<date>.csv.
# BUILD (default build) picks the build.
#
# 2026-12-04 on the 2-core machine (4 ranks on 2 cores), before and after
# wait_step stopped sleeping in poll() for shm waits beside idle sockets:
# exchange 570-670 -> 39-88 us at every size to 32 KiB, tree 8 B 2283 -> 145
# us and 512 B 203 -> 143 us (noisy), ring unchanged (about 230 us: its
# channels wait on one transport each).
set -u
cd "$(dirname "$0")/.."
build=$(cd "${BUILD:-build}" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "hier-small.sh: needs root (network namespaces)"; exit 2; }
min=${BENCH_MIN:-8} max=${BENCH_MAX:-64K} iters=${BENCH_ITERS:-200}
tag="gwh$$"
# Every namespace of this run, found by its tag: also one made just before a failure.
cleanup() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk -v t="$tag" 'index($1, t) == 1 {print $1}'); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}
trap cleanup EXIT
ns_add() { ip netns add "$1" && ip -n "$1" link set lo up; }
ns_add "${tag}sw" && ip -n "${tag}sw" link add br0 type bridge && ip -n "${tag}sw" link set br0 up || exit 1
for k in 0 1; do
  ns_add "${tag}n$k" && ip link add "${tag}a$k" type veth peer name "${tag}b$k" &&
    ip link set "${tag}a$k" netns "${tag}n$k" && ip link set "${tag}b$k" netns "${tag}sw" &&
    ip -n "${tag}n$k" link set "${tag}a$k" name eth0 && ip -n "${tag}n$k" addr add "10.78.0.$((k + 1))/24" dev eth0 &&
    ip -n "${tag}n$k" link set eth0 up && ip -n "${tag}sw" link set "${tag}b$k" master br0 &&
    ip -n "${tag}sw" link set "${tag}b$k" up || exit 1
done
export GW_JOB_TOKEN="hier-$$-$RANDOM"
out=bench/results/hier-small-$(date +%F-%H%M%S).csv
echo "algo,size,oop_us,ip_us,path" > "$out"
work=$(mktemp -d)
for algo in ring tree exchange; do
  pids=()
  for k in 0 1; do
    ip netns exec "${tag}n$k" unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$k" \
      env GW_ALGO=$algo timeout 300 "$build/tools/gw-run" -n 2 --nnodes 2 --node-rank $k --master 10.78.0.1:29511 \
      "$build/tools/gw-perf" -b "$min" -e "$max" -f 8 -n "$iters" -w 20 -d float32 >"$work/$algo.$k.log" 2>&1 &
    pids+=($!)
  done
  ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  if [ $ok = 0 ]; then
    echo "hier-small.sh: $algo failed:"; tail -5 "$work/$algo".*.log; rm -rf "$work"; exit 1
  fi
  awk -v a=$algo '$1 == "[0]" && $2 ~ /^[0-9]+$/ {printf "%s,%s,%s,%s,%s\n", a, $2, $7, $11, $NF}' "$work/$algo.0.log" >> "$out"
done
rm -rf "$work"
printf '%-9s %9s %10s %10s  %s\n' algo bytes "oop us" "ip us" path
tail -n +2 "$out" | awk -F, '{printf "%-9s %9s %10s %10s  %s\n", $1, $2, $3, $4, $5}'
echo "wrote $out"
