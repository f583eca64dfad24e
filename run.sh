#!/usr/bin/env bash
# ./run.sh - installs what is missing, builds into build/, and runs the main job:
# ResNet-50 trained data-parallel on Fashion-MNIST by 2 local ranks (gw-run) on the
# CPU, the gradient allreduce overlapped with backward, evaluated on the test set
# after each epoch.  About 14 minutes of training on a 2-core machine (plus
# installing and building the first time); see README.md for the figures.  Output goes to runs/<date>/ (GW_RUN_DIR to choose): metrics.jsonl, plot.png,
# checkpoints/ and the trained weights.  Extra arguments go to gw-train (they can
# override the defaults below, e.g. ./run.sh --epochs 10, or ./run.sh --steps 20
# for a short try; with --no-eval there is no plot, with --steps 0 only the
# initial weights are written).
set -euo pipefail
cd "$(dirname "$0")"
. scripts/deps.sh
gw_install_deps
gw_build build
out=${GW_RUN_DIR:-runs/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
# The length: 3 epochs, unless the arguments give --steps (gw-train takes one
# or the other, so the default would make `./run.sh --steps 20` an error).
# The outputs follow what the arguments allow: no plot with --no-eval (it
# draws the evaluations), only the weights with --steps 0 (nothing trains).
length=(--epochs 3)
plot=(--plot "$out/plot.png")
outputs=(--metrics "$out/metrics.jsonl" --checkpoint-dir "$out/checkpoints")
prev=
for a in "$@"; do
  case $a in --steps | --steps=*) length=() ;; --no-eval) plot=() ;; esac
  if [ "$a" = --steps=0 ] || { [ "$prev" = --steps ] && [ "$a" = 0 ]; }; then plot=() outputs=(); fi
  prev=$a
done
build/tools/gw-run -n 2 build/tools/gw-train --data fashion-mnist --model resnet50 "${length[@]}" --batch 32 \
  --lr 0.2 --warmup-epochs 0.3 --zero-init-residual --label-smoothing 0.1 \
  "${outputs[@]}" "${plot[@]}" --save-weights "$out/resnet50-fashion-mnist.safetensors" "$@"
# What was written (no plot before an epoch's end: a short --steps run has none).
made=()
for f in metrics.jsonl plot.png resnet50-fashion-mnist.safetensors checkpoints; do
  if [ -e "$out/$f" ]; then made+=("$out/$f"); fi
done
echo "run.sh: wrote ${made[*]}"
