#!/usr/bin/env bash
# netns.sh BUILD NNODES [RPN] - runs gradwire across NNODES "machines" on this one:
# each node is a network namespace plus a UTS namespace with its own host name
# (so the runtime sees different machines), joined by veth pairs to a bridge in a
# switch namespace of its own; addresses 10.79.0.K+1/24 exist only inside these
# namespaces.  On each node gw-run starts RPN ranks (default 2).  Checks: the collective grid
# across the nodes (GW_TEST_MAX_COUNT, default 65537), same-node pairs on shm and
# cross-node pairs on tcp, gw-perf with checking (also on emulated device buffers), the (hierarchical) tree,
# its timeouts naming a straggler on every rank, everything forced onto tcp, and
# (when built with libibverbs) the same over the ib transport's verbs emulator.
# The namespaces are removed on exit, also when a check fails.  Exits 77 (meson:
# skipped) without root or without `ip netns`.
set -u
build=${1:?usage: netns.sh BUILD NNODES [RPN]}
nnodes=${2:-2}
rpn=${3:-2}
build=$(cd "$build" && pwd)
gwrun=$build/tools/gw-run
[ "$(id -u)" -eq 0 ] || { echo "netns: needs root; skipped"; exit 77; }
command -v ip >/dev/null && command -v unshare >/dev/null || { echo "netns: needs ip and unshare; skipped"; exit 77; }

tag="gw$$"
work=$(mktemp -d)
namespaces=()
cleanup() {
  for ns in "${namespaces[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ns_add() { ip netns add "$1" && namespaces+=("$1") && ip -n "$1" link set lo up; }
if ! ns_add "${tag}sw" 2>/dev/null; then echo "netns: cannot create network namespaces; skipped"; exit 77; fi
ip -n "${tag}sw" link add br0 type bridge && ip -n "${tag}sw" link set br0 up || exit 1
for ((k = 0; k < nnodes; k++)); do
  ns_add "${tag}n$k" || exit 1
  ip link add "${tag}a$k" type veth peer name "${tag}b$k" || exit 1
  ip link set "${tag}a$k" netns "${tag}n$k" && ip link set "${tag}b$k" netns "${tag}sw" || exit 1
  ip -n "${tag}n$k" link set "${tag}a$k" name eth0
  ip -n "${tag}n$k" addr add "10.79.0.$((k + 1))/24" dev eth0
  ip -n "${tag}n$k" link set eth0 up
  ip -n "${tag}sw" link set "${tag}b$k" master br0
  ip -n "${tag}sw" link set "${tag}b$k" up
done
export GW_JOB_TOKEN="netns-$$-$RANDOM"

failures=0
# run_job NAME TIMEOUT CMD...: gw-run on every node, in parallel; all must exit 0.
# With ARRIVAL=1 only node 0 gets --node-rank: the others, on machines without
# the master's address, join node 0's gw-run and are numbered as they come.
run_job() {
  local name=$1 limit=$2
  shift 2
  local pids=() start=$SECONDS
  for ((k = 0; k < nnodes; k++)); do
    local nr=(--node-rank "$k")
    [ "${ARRIVAL:-0}" = 1 ] && [ "$k" -gt 0 ] && nr=()
    ip netns exec "${tag}n$k" unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$k" \
      timeout "$limit" "$gwrun" -n "$rpn" --nnodes "$nnodes" "${nr[@]}" --master 10.79.0.1:29500 "$@" \
      >"$work/$name.$k.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for ((k = 0; k < nnodes; k++)); do
    local code=0
    wait "${pids[$k]}" || code=$?
    [ $code -eq 0 ] || { rc=1; echo "netns: $name: node $k failed (exit $code)"; }
  done
  if [ $rc -ne 0 ]; then
    for ((k = 0; k < nnodes; k++)); do echo "--- $name node $k"; tail -n 30 "$work/$name.$k.log"; done
    failures=$((failures + 1))
  else
    echo "netns: $name on $nnodes nodes x $rpn ranks: ok ($((SECONDS - start)) s)"
  fi
  return $rc
}

expect_in_logs() { # NAME PATTERN WHAT
  if cat "$work/$1".*.log | grep -q "$2"; then echo "netns: $3: ok"; else
    echo "netns: $3: no line matching '$2'"; failures=$((failures + 1)); fi
}

export GW_TEST_MAX_COUNT=${GW_TEST_MAX_COUNT:-65537}
ARRIVAL=1 GW_DEBUG=INFO GW_DEBUG_SUBSYS=INIT run_job grid 900 "$build/test/test_collectives" --from-env
expect_in_logs grid "this node is node $((nnodes - 1)) of $nnodes" "nodes without --node-rank numbered by arrival"
[ "$rpn" -gt 1 ] && expect_in_logs grid "via shm" "same-node pairs use shm"
expect_in_logs grid "via tcp 10.79.0" "cross-node pairs use tcp"
# gw-perf checking every dtype from 4 B to 1 MiB, then float32 at 4 MiB (at 6
# ranks, several 256 KiB chunks per block; 16 MiB took 4x the time and reached
# no other path).  Every dtype at 4 MiB took 3x the time of both: checking a
# 4-million-element int8 sum is 24 million hashes per rank.
# The host tcp run checks every dtype; the others (device staging, ib, both)
# one each, a different width each: the bytes crossing the machines are the
# same code whatever the dtype, and each dtype's reductions have the grids
# (every dtype in all four took 33 s more of the 70 this script ran).
# GW_NETNS_PERF=0 leaves them out (CI's sanitizer pass: gw-perf's code and the
# staging run under ASan in their own suites).
perf_jobs() { # NAME DTYPE GW-PERF-ARGS...: DTYPE up to 1 MiB, float32 at 4 MiB
  local name=$1 dtype=$2
  shift 2
  [ "${GW_NETNS_PERF:-1}" = 0 ] && { echo "netns: $name left out (GW_NETNS_PERF=0)"; return; }
  run_job "$name" 300 "$build/tools/gw-perf" -b 4 -e 1M -f 4 -n 1 -w 1 -c 1 -d "$dtype" "$@"
  run_job "$name-4M" 300 "$build/tools/gw-perf" -b 4M -e 4M -n 1 -w 1 -c 1 -d float32 "$@"
}
perf_jobs perf all
# Device buffers (emulated GPUs) across machines: no device ring (its neighbours
# are not all on one machine), so they go through pinned host staging, every
# result checked (64 KiB pieces: several per block from 1 MiB).
GW_DEV_EMULATE=1 GW_DEV_STAGE_BYTES=65536 GW_DEBUG=INFO GW_DEBUG_SUBSYS=INIT perf_jobs perf-device bfloat16 -D
[ "${GW_NETNS_PERF:-1}" = 0 ] ||
  expect_in_logs perf-device "no device ring" "device buffers across machines go through staging"
# The tree across machines: hierarchical (a chain inside each machine) when a
# machine has several ranks; the tree's counts around its half split and chunks.
GW_ALGO=tree GW_TEST_COUNTS=0,1,7,9,64,65,1023,65537,131073 GW_DEBUG=INFO GW_DEBUG_SUBSYS=INIT \
  run_job grid-tree 900 "$build/test/test_collectives" --from-env
[ "$rpn" -gt 1 ] && expect_in_logs grid-tree "trees: hierarchical over $nnodes machines" "the trees are hierarchical"
# Timeouts on the (hierarchical) tree name the straggler on every rank: one rank
# never calls its allreduce (bench/faults_rank's straggler scenario, 6 s late),
# with 1 float (tree 0 alone) and 1000 (both trees), the victim a machine's
# first rank (a leader, interior across machines) and then its last; each
# other rank's error must name it (a wait on a rank that waits itself holds
# off part of the grace, by depth, so the rank below or above the straggler
# reports first).
straggler_job() { # VICTIM COUNT
  local d="$work/straggle-$1-$2" k bad=0 n=0
  mkdir -p "$d"
  GW_ALGO=tree GW_TIMEOUT=2 FAULTS_SCENARIO=straggler FAULTS_DIR="$d" FAULTS_VICTIM=$1 FAULTS_LATE=6 \
    FAULTS_COUNT=$2 run_job "straggler-tree-$1-$2" 120 "$build/bench/faults_rank" run || return
  for ((k = 0; k < nnodes * rpn; k++)); do
    [ "$k" -eq "$1" ] && continue
    n=$((n + 1))
    if ! grep -q "from rank $1, which has not" "$d/rank.$k" 2>/dev/null; then
      bad=1
      echo "netns: straggler $1 (count $2): rank $k does not name it: $(cut -f 9 "$d/rank.$k" 2>/dev/null)"
    fi
  done
  if [ $bad -eq 0 ] && [ $n -gt 0 ]; then echo "netns: tree timeouts name straggler $1 (count $2) on all $n others: ok"
  else failures=$((failures + 1)); fi
}
if [ -x "$build/bench/faults_rank" ] && [ $((nnodes * rpn)) -ge 3 ]; then
  straggler_job "$rpn" 1
  straggler_job $((2 * rpn - 1)) 1000
fi
GW_TRANSPORT=tcp GW_DEBUG=INFO GW_DEBUG_SUBSYS=INIT GW_TEST_MAX_COUNT=1023 run_job grid-tcp 600 \
  "$build/test/test_collectives" --from-env
# Every connection logged is tcp: none via another transport, and some at all
# (an absence alone would pass with the log lines gone, or no same-node pair).
if cat "$work"/grid-tcp.*.log | grep -E "(ring|tree|exchange) [0-9]+: [0-9]+ -> [0-9]+ via " | grep -qv " via tcp"; then
  echo "netns: GW_TRANSPORT=tcp still used another transport"; failures=$((failures + 1))
elif ! cat "$work"/grid-tcp.*.log | grep -q " via tcp"; then
  echo "netns: GW_TRANSPORT=tcp: no connection was logged"; failures=$((failures + 1))
else
  echo "netns: GW_TRANSPORT=tcp keeps every pair on tcp: ok"
fi
# The ib transport (verbs emulator) between the machines: shm inside a node, ib
# across, the grid and gw-perf with checking.
if [ -e "$build/test/test_ib" ]; then
  GW_IB_EMULATE=1 GW_DEBUG=INFO GW_DEBUG_SUBSYS=INIT GW_TEST_MAX_COUNT=65537 run_job grid-ib 900 \
    "$build/test/test_collectives" --from-env
  expect_in_logs grid-ib "via ib gwemu0" "cross-node pairs use ib (emulated)"
  [ "$rpn" -gt 1 ] && expect_in_logs grid-ib "via shm" "same-node pairs still use shm"
  GW_IB_EMULATE=1 perf_jobs perf-ib float64
  GW_IB_EMULATE=1 GW_DEV_EMULATE=1 GW_DEV_STAGE_BYTES=65536 perf_jobs perf-device-ib int8 -D
fi
# The switch stops forwarding between the machines mid-job (node 1's port
# taken off the bridge: every interface stays up, nothing is reset): the ranks
# whose waits cross it say the network stopped delivering, with the bytes or
# keepalive probes unanswered, on both sides (it was said as a peer that "has
# not started" the operation, or as a line of waits suggesting calls that
# differ), and the job ends.  Over the verbs emulator the fabric is not cut
# (it is this machine's memory), only the liveness sockets.  Last: the
# bridge is mended after each.
net_cut_job() { # NAME PATTERN [ENV=VALUE...]
  local name=$1 pattern=$2 pids=() k i code bad=0
  shift 2
  for ((k = 0; k < nnodes; k++)); do
    ip netns exec "${tag}n$k" unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$k" \
      env GW_TIMEOUT=3 "$@" timeout 120 "$gwrun" -n "$rpn" --nnodes "$nnodes" --node-rank "$k" \
      --master 10.79.0.1:29500 "$build/tools/gw-perf" -b 1M -e 1M -n 1000000 -w 0 -c 0 >"$work/$name.$k.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < 600; i++)); do grep -q "out-of-place" "$work/$name.0.log" 2>/dev/null && break; sleep 0.1; done
  sleep 1
  ip -n "${tag}sw" link set "${tag}b1" nomaster
  for ((k = 0; k < nnodes; k++)); do
    code=0
    wait "${pids[$k]}" || code=$?
    [ $code -ne 0 ] && [ $code -ne 124 ] || { bad=1; echo "netns: $name: node $k exited $code"; }
  done
  ip -n "${tag}sw" link set "${tag}b1" master br0
  for k in 0 1; do
    grep -Eq "$pattern" "$work/$name.$k.log" || {
      bad=1; echo "netns: $name: node $k does not say the network stopped delivering:"; tail -n 12 "$work/$name.$k.log"; }
  done
  if [ $bad -eq 0 ]; then echo "netns: $name: a cut between the machines is said as such on both sides: ok"
  else failures=$((failures + 1)); fi
}
net_cut_job netcut "the network is not delivering: ([0-9]+ bytes this rank sent to node[0-9]|node[0-9] has answered nothing)"
# Keepalive's end (16 s) before GW_TIMEOUT's, over tcp and then over the
# emulator (on 2 nodes only: each waits it out): said as the machine no longer
# answering (it was "did rank 1 exit", and over ib "closed the connection (it
# exited or died)": nobody closed anything).
# The launchers, their heartbeats' timeout short (2 s), see each other fall
# silent with the machine not answering either: the network's, said once and
# left to keepalive, not a launcher taken for stopped or hung.
if [ "$nnodes" -eq 2 ]; then
  net_cut_job netcut-keepalive "rank [0-9]+'s machine stopped answering: it went away" GW_TIMEOUT=60 \
    GW_RUN_HEARTBEAT_TIMEOUT=2
  if ! grep -q "the network between them is down; waiting on it" "$work"/netcut-keepalive.*.log ||
    grep -q "stopped or hung" "$work"/netcut-keepalive.*.log; then
    echo "netns: netcut-keepalive: the launchers took the cut for a stopped one, or said nothing of it:"
    grep -h "gw-run:" "$work"/netcut-keepalive.*.log | head -8
    failures=$((failures + 1))
  else
    echo "netns: netcut-keepalive: the launchers' silence over a cut is the network's: ok"
  fi
  [ -e "$build/test/test_ib" ] &&
    net_cut_job netcut-ib "machine stopped answering on the connection's liveness socket" GW_IB_EMULATE=1
fi
echo "netns: $failures failed"
[ $failures -eq 0 ]
