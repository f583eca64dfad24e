#!/usr/bin/env bash
# train-overlap.sh - gw-train's step time and exposed communication with 2 ranks,
# gradient allreduce overlapped with backward vs after it (--no-overlap), on
# Fashion-MNIST (28x28x1, batch 32 per rank) and on synthetic 224x224x3 data
# (batch 8 per rank), all in one run.  From each run's metrics file it takes the
# steps after the first BENCH_SKIP (warm-up) and reports medians of (see
# train_step in tools/gw-train-loop.c for the clock readings):
#   step      the step's wall time, batch * ranks / img_per_s: from the start of
#             forward to the end of the optimizer, plus the wait for this step's
#             batch when it was taken just before the step (host backends)
#   compute   forward + backward (on a device backend this includes taking and
#             staging the next batch, done once backward is queued) + the loss
#             average and the optimizer after the gradients are in
#   comm      the gradient allreduce: first bucket start to last bucket done
#   exposed   the part of it not hidden: end of backward to last bucket done
# and exposed / step.  The metrics' data_ms is not added in: the next batch's
# wait that it holds on a device backend is inside compute already, and this
# batch's wait is inside the wall step time.
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
[[ $steps =~ ^[0-9]+$ && $skip =~ ^[0-9]+$ && $skip -lt $steps ]] || die "need 0 <= BENCH_SKIP < BENCH_STEPS"
model=${BENCH_MODEL:-resnet50}
ranks=${BENCH_RANKS:-2}
[[ $ranks =~ ^[0-9]+$ && $ranks -ge 2 ]] || die "BENCH_RANKS=$ranks: at least 2 (one rank makes no allreduce to overlap)"
for b in tools/gw-run tools/gw-train; do
  [ -x "$build/$b" ] || meson compile -C "$build" >/dev/null || die "$build/$b is missing and does not build"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$root/bench/results"
csv=$root/bench/results/train-overlap-$(date +%Y%m%d-%H%M%S).csv
echo "data,overlap,step_ms,compute_ms,comm_ms,exposed_ms,exposed_fraction,img_per_s" > "$csv"

# medians STEPS_FILE BATCH -> "step compute comm exposed fraction img_per_s": over
# the training rows after the warm-up; a missing or short file or a value that is
# not a finite number (the trainer writes NaN and inf as null) fails in one line.
medians() {
  PYTHONPATH=$here PYTHONDONTWRITEBYTECODE=1 python3 - "$1" "$steps" "$skip" "$(($2 * ranks))" <<'PY'
import os, sys
from compare_lib import train_rows
path, steps, skip, imgs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def fail(msg):
    sys.exit("train-overlap.sh: %s: %s" % (os.path.basename(path)[:-len(".jsonl")], msg))
rows = train_rows(path, steps, skip, ("loss", "img_per_s", "compute_ms", "comm_ms", "comm_exposed_ms"), fail)
cols = {k: [] for k in ("step", "compute", "comm", "exposed", "frac", "img")}
for r in rows:
    if r["img_per_s"] <= 0:
        fail("step %s: img_per_s is %s" % (r.get("step"), r["img_per_s"]))
    step = 1e3 * imgs / r["img_per_s"]  # the wall step time in ms (img_per_s is rounded to 0.01)
    cols["step"].append(step)
    cols["compute"].append(r["compute_ms"])
    cols["comm"].append(r["comm_ms"])
    cols["exposed"].append(r["comm_exposed_ms"])
    cols["frac"].append(r["comm_exposed_ms"] / step)
    cols["img"].append(r["img_per_s"])
med = {k: sorted(v)[len(v) // 2] for k, v in cols.items()}
print("%.1f %.2f %.2f %.2f %.3f %.2f" % (med["step"], med["compute"], med["comm"], med["exposed"], med["frac"],
                                          med["img"]))
PY
}

run() { # label batch data-args...
  local label=$1 batch=$2; shift 2
  for mode in overlap no-overlap; do
    local m=$work/$label-$mode.jsonl extra=()
    [ "$mode" = no-overlap ] && extra=(--no-overlap)
    "$build/tools/gw-run" -n "$ranks" "$build/tools/gw-train" --model "$model" --steps "$steps" --no-eval \
      --metrics "$m" --batch "$batch" "$@" "${extra[@]}" > "$work/$label-$mode.log" 2>&1 ||
      { cat "$work/$label-$mode.log" >&2; die "gw-train failed ($label, $mode)"; }
    local stepms comp comm exp frac img out
    out=$(medians "$m" "$batch") || exit 1
    read -r stepms comp comm exp frac img <<<"$out"
    printf '%-14s %-11s step %8.1f ms  compute %8.1f ms  comm %7.1f ms  exposed %7.1f ms (%5.1f%%)  %7.1f img/s\n' \
      "$label" "$mode" "$stepms" "$comp" "$comm" "$exp" "$(awk -v f="$frac" 'BEGIN{print 100*f}')" "$img"
    echo "$label,$mode,$stepms,$comp,$comm,$exp,$frac,$img" >> "$csv"
  done
}

echo "# $model, $ranks ranks, medians of steps $((skip + 1))..$steps"
run fashion-mnist 32 --data fashion-mnist
run synthetic-224 8 --data synthetic --synthetic-samples 512 --image-size 224 --in-channels 3 --classes 1000
echo "# written to $csv"
