#!/usr/bin/env bash
# train-overlap.sh - gw-train's step time and exposed communication with 2 ranks,
# gradient allreduce overlapped with backward vs after it (--no-overlap), on
# Fashion-MNIST (28x28x1, batch 32 per rank) and on synthetic 224x224x3 data
# (batch 8 per rank), all in one run.  From each run's metrics file it takes the
# steps after the first BENCH_SKIP (warm-up) and reports medians: step time,
# compute, communication (first bucket start to last bucket done) and exposed
# communication (end of backward to last bucket done), and exposed / step.
# Writes bench/results/train-overlap-<date>.csv.
#
# Environment (defaults in brackets):
#   BUILD         build directory, relative to the repository root [build]
#   BENCH_STEPS   steps per run [20]     BENCH_SKIP   warm-up steps left out [4]
#   BENCH_MODEL   [resnet50]             BENCH_RANKS  [2]
set -euo pipefail

prog=train-overlap.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
root=$(cd "$here/.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build
steps=${BENCH_STEPS:-20}
skip=${BENCH_SKIP:-4}
model=${BENCH_MODEL:-resnet50}
ranks=${BENCH_RANKS:-2}
for b in tools/gw-run tools/gw-train; do
  [ -x "$build/$b" ] || meson compile -C "$build" >/dev/null || die "$build/$b is missing and does not build"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$root/bench/results"
csv=$root/bench/results/train-overlap-$(date +%Y%m%d-%H%M%S).csv
echo "data,overlap,step_ms,compute_ms,comm_ms,exposed_ms,exposed_fraction,img_per_s" > "$csv"

# median of column $1 (a JSON key) over the training lines after the warm-up
median() {
  python3 - "$1" "$2" "$skip" <<'PY'
import json, sys
key, path, skip = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(path) if '"type":"train"' in l][skip:]
v = sorted(r[key] for r in rows)
print("%.2f" % v[len(v) // 2] if v else "nan")
PY
}

run() { # label data-args...
  local label=$1; shift
  for mode in overlap no-overlap; do
    local m=$work/$label-$mode.jsonl extra=()
    [ "$mode" = no-overlap ] && extra=(--no-overlap)
    "$build/tools/gw-run" -n "$ranks" "$build/tools/gw-train" --model "$model" --steps "$steps" --no-eval \
      --metrics "$m" "$@" "${extra[@]}" > "$work/$label-$mode.log" 2>&1 ||
      { cat "$work/$label-$mode.log" >&2; die "gw-train failed ($label, $mode)"; }
    local img comp comm exp
    img=$(median img_per_s "$m"); comp=$(median compute_ms "$m"); comm=$(median comm_ms "$m")
    exp=$(median comm_exposed_ms "$m")
    local stepms frac
    read -r stepms frac < <(python3 - "$m" "$skip" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"type":"train"' in l][int(sys.argv[2]):]
step = sorted(r["compute_ms"] + r["comm_exposed_ms"] + r["data_ms"] for r in rows)
frac = sorted(r["comm_exposed_ms"] / (r["compute_ms"] + r["comm_exposed_ms"] + r["data_ms"]) for r in rows)
print("%.1f %.3f" % (step[len(step) // 2], frac[len(frac) // 2]))
PY
)
    printf '%-14s %-11s step %8.1f ms  compute %8.1f ms  comm %7.1f ms  exposed %7.1f ms (%5.1f%%)  %7.1f img/s\n' \
      "$label" "$mode" "$stepms" "$comp" "$comm" "$exp" "$(awk -v f="$frac" 'BEGIN{print 100*f}')" "$img"
    echo "$label,$mode,$stepms,$comp,$comm,$exp,$frac,$img" >> "$csv"
  done
}

echo "# $model, $ranks ranks, medians of steps $((skip + 1))..$steps"
run fashion-mnist --data fashion-mnist --batch 32
run synthetic-224 --data synthetic --synthetic-samples 512 --image-size 224 --in-channels 3 --classes 1000 --batch 8
echo "# written to $csv"
