#!/usr/bin/env bash
# compare-model.sh - training throughput of gradwire's ResNet-50 (cpu backend,
# oneDNN) beside PyTorch's torchvision resnet50 on the CPU, in one run, at the two
# shapes the model issue names: 224x224x3 batch 16 (ImageNet) and 28x28x1 batch 64
# (Fashion-MNIST, 10 classes).  Each step is forward + label-smoothed cross-entropy
# + backward + SGD with momentum on a fixed random batch; both sides use the same
# thread count.  The two tools alternate BENCH_ROUNDS times and each keeps its best
# round (the machine is shared and noisy).  Prints one line per shape with both
# figures and the ratio, and writes bench/results/model-<date>.csv.
#
# Environment (defaults in brackets):
#   BUILD          build directory, relative to the repository root [build]
#   BENCH_THREADS  threads for both sides [the number of CPUs]
#   BENCH_STEPS    timed steps per round (the median is reported) [5]
#   BENCH_ROUNDS   rounds per tool and shape [2]
#   BENCH_SHAPES   "SIZE:CHANNELS:CLASSES:BATCH ..." [224:3:1000:16 28:1:10:64]
# Needs Python with torch and torchvision (Debian's python3-torch and
# python3-torchvision; installed here with apt-get when missing and root).
set -euo pipefail

prog=compare-model.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
root=$(cd "$here/.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build
threads=${BENCH_THREADS:-$(nproc)}
steps=${BENCH_STEPS:-5}
rounds=${BENCH_ROUNDS:-2}
shapes=${BENCH_SHAPES:-"224:3:1000:16 28:1:10:64"}

find_torch() {
  local cand
  for cand in /usr/bin/python3 python3; do
    if "$cand" -c "import torch, torchvision" 2>/dev/null; then echo "$cand"; return 0; fi
  done
  return 1
}
py=$(find_torch) || {
  [ "$(id -u)" = 0 ] || die "needs python3-torch and python3-torchvision (apt-get install them as root)"
  echo "$prog: installing python3-torch python3-torchvision" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch python3-torchvision >/dev/null
  py=$(find_torch) || die "python3-torch is installed but torch does not import"
}
[ -x "$build/bench/model_bench" ] || meson compile -C "$build" bench/model_bench >/dev/null ||
  die "bench/model_bench is missing from $build and does not build (oneDNN present?)"

mkdir -p "$root/bench/results"
csv=$root/bench/results/model-$(date +%Y%m%d-%H%M%S).csv
echo "shape,batch,threads,gradwire_img_s,pytorch_img_s,ratio" > "$csv"
best() { # best img/s of the lines on stdin
  sed -n 's/.*: \([0-9.]*\) img\/s.*/\1/p' | sort -g | tail -1
}
echo "# resnet50 training throughput, $threads threads, best of $rounds rounds (median of $steps steps each)"
for shape in $shapes; do
  IFS=: read -r size ch classes batch <<<"$shape"
  args=(--image-size "$size" --in-channels "$ch" --classes "$classes" --batch "$batch" --threads "$threads"
        --steps "$steps" --warmup 1)
  gw_out="" pt_out=""
  for ((r = 0; r < rounds; r++)); do
    gw_out+=$("$build/bench/model_bench" "${args[@]}")$'\n'
    pt_out+=$("$py" "$here/model_bench_torch.py" "${args[@]}")$'\n'
  done
  gw=$(best <<<"$gw_out")
  pt=$(best <<<"$pt_out")
  ratio=$(awk -v a="$gw" -v b="$pt" 'BEGIN { printf "%.2f", a / b }')
  printf '%-12s batch %-3s gradwire %8.2f img/s   pytorch %8.2f img/s   ratio %sx\n' \
    "${size}x${size}x${ch}" "$batch" "$gw" "$pt" "$ratio"
  echo "${size}x${size}x${ch},$batch,$threads,$gw,$pt,$ratio" >> "$csv"
done
echo "# written to $csv"
