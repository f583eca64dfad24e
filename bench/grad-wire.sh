#!/usr/bin/env bash
# grad-wire.sh - gw-train's gradient allreduce time with float32 gradients
# against --grad-wire bf16 (and fp16), across a link of a given rate: two
# "machines" (network + UTS namespaces) joined by a veth pair shaped with tc tbf,
# one rank each, ResNet-50 on Fashion-MNIST (batch 32), --no-overlap so the whole
# allreduce is measured.  Runs alternate (fp32, bf16, fp16, fp32, ...); prints
# the median comm_ms of each after the warm-up steps and the ratios.  Needs root.
# The rate `local` runs both ranks on this machine instead (shared memory, no
# namespaces, no root): where the conversions weigh against the bytes saved.
#
# Environment: BUILD [build]  RATES ["2gbit 10gbit"; add "local"]  BENCH_STEPS [8]  BENCH_SKIP [3]  BENCH_REPS [2]
set -euo pipefail
prog=grad-wire.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
root=$(cd "$here/.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build
rates=${RATES:-"2gbit 10gbit"}
steps=${BENCH_STEPS:-8} skip=${BENCH_SKIP:-3} reps=${BENCH_REPS:-2}
[[ $steps =~ ^[0-9]+$ && $skip =~ ^[0-9]+$ && $skip -lt $steps ]] || die "need 0 <= BENCH_SKIP < BENCH_STEPS"
links=0 # whether a rate other than local needs the namespaces
for rate in $rates; do [ "$rate" = local ] || links=1; done
work=$(mktemp -d)
tag=gwire$$
cleanup() { ip netns del "${tag}0" 2>/dev/null || true; ip netns del "${tag}1" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
if ((links)); then
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, tc)"
  command -v tc >/dev/null || die "needs tc (iproute2)"
  ip netns add "${tag}0" && ip netns add "${tag}1"
  ip link add "${tag}a" type veth peer name "${tag}b"
  ip link set "${tag}a" netns "${tag}0" && ip link set "${tag}b" netns "${tag}1"
  for k in 0 1; do
    dev=$([ $k = 0 ] && echo "${tag}a" || echo "${tag}b")
    ip -n "$tag$k" addr add "10.89.0.$((k + 1))/24" dev "$dev"
    ip -n "$tag$k" link set "$dev" up
    ip -n "$tag$k" link set lo up
  done
fi
export GW_JOB_TOKEN="grad-wire-$$"

# The two "machines" share this one's cores: each rank gets half (its host
# name says another machine, so gw-train and gw-run would each take them all:
# 4 compute threads on 2 cores, and the ranks' compute times drifted apart).
half=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
run() { # wire -> median comm_ms
  local w=$1 k pids=() bad=()
  # gw-train appends to --metrics: the file of an earlier round goes first
  # (the second round read 16 rows of 8 steps and stopped the run)
  rm -f "$work/$w-0.jsonl" "$work/$w-1.jsonl"
  if [ "$rate" = local ]; then # one gw-run, two ranks (only rank 0 writes metrics)
    env OMP_NUM_THREADS=$half "$build/tools/gw-run" -n 2 --master 127.0.0.1:29533 \
      "$build/tools/gw-train" --model resnet50 --steps "$steps" --no-eval --data fashion-mnist --batch 32 \
      --threads $half --no-overlap --grad-wire "$w" --metrics "$work/$w-0.jsonl" >"$work/$w-0.log" 2>&1 ||
      { rc=$?; tail -n 5 "$work/$w-0.log" >&2; die "gw-train failed ($w, local: exit $rc)"; }
  fi
  for k in 0 1; do
    [ "$rate" = local ] && break
    # shellcheck disable=SC2016  # $0 and $@ are for sh
    ip netns exec "$tag$k" unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$k" \
      env OMP_NUM_THREADS=$half "$build/tools/gw-run" -n 1 --nnodes 2 --node-rank $k --master 10.89.0.1:29533 \
      "$build/tools/gw-train" --model resnet50 --steps "$steps" --no-eval --data fashion-mnist --batch 32 \
      --threads $half --no-overlap --grad-wire "$w" --metrics "$work/$w-$k.jsonl" >"$work/$w-$k.log" 2>&1 &
    pids+=($!)
  done
  # Each rank's own exit status (a bare `wait` returns 0 whatever they did).
  for k in 0 1; do
    [ "$rate" = local ] && break
    wait "${pids[k]}" || bad+=("rank $k exit $?")
  done
  if ((${#bad[@]})); then
    tail -n 5 "$work/$w-0.log" "$work/$w-1.log" >&2
    die "gw-train failed ($w: ${bad[*]})"
  fi
  # The median over steps skip+1..steps of rank 0's metrics (only rank 0
  # writes them: its comm_ms may include waiting for rank 1's backward, which
  # the even split of the cores above keeps small, and alike for every wire);
  # a missing or short file, or a step without a finite loss or comm_ms (NaN /
  # inf are written as null), is a failed measurement, said in one line.
  PYTHONPATH=$here PYTHONDONTWRITEBYTECODE=1 python3 - "$work/$w-0.jsonl" "$steps" "$skip" "$w" <<'PY' || exit 1
import sys
from compare_lib import train_rows
path, steps, skip, wire = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = train_rows(path, steps, skip, ("loss", "comm_ms"), lambda msg: sys.exit("grad-wire.sh: %s: %s" % (wire, msg)))
c = sorted(r["comm_ms"] for r in rows)
print("%.1f" % c[len(c) // 2])
PY
}

for rate in $rates; do
  for k in 0 1; do
    [ "$rate" = local ] && break
    dev=$([ $k = 0 ] && echo "${tag}a" || echo "${tag}b")
    ip netns exec "$tag$k" tc qdisc replace dev "$dev" root tbf rate "$rate" burst 4mb latency 50ms
  done
  declare -A best=()
  for ((r = 0; r < reps; r++)); do
    for w in fp32 bf16 fp16; do
      t=$(run $w)
      echo "$rate $w: comm ${t} ms"
      if [ -z "${best[$w]:-}" ] || awk -v a="$t" -v b="${best[$w]}" 'BEGIN{exit !(a < b)}'; then best[$w]=$t; fi
    done
  done
  printf '%s: fp32 %s ms, bf16 %s ms (%.2fx), fp16 %s ms (%.2fx)\n' "$rate" "${best[fp32]}" "${best[bf16]}" \
    "$(awk -v a="${best[fp32]}" -v b="${best[bf16]}" 'BEGIN{print a / b}')" "${best[fp16]}" \
    "$(awk -v a="${best[fp32]}" -v b="${best[fp16]}" 'BEGIN{print a / b}')"
  unset best
done
