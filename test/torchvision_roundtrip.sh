#!/usr/bin/env bash
# test/torchvision_roundtrip.sh GW_TRAIN - weights travel gradwire -> torchvision ->
# gradwire: gw-train writes a fresh resnet50, torchvision's resnet50 loads it strictly,
# trains one step (so every tensor changes) and saves its state_dict, gw-train loads
# that and writes it again, and the two files must hold the same tensors bit for bit.
# Also: gw-train refuses a resnet18 file for a resnet50, naming the tensor.
# Exits 77 (skipped) without a Python that has torch and torchvision (Debian's
# python3-torch, python3-torchvision).
set -eu
gw_train=$1
here=$(cd "$(dirname "$0")" && pwd)
py=""
for cand in /usr/bin/python3 python3; do
  if "$cand" -c "import torch, torchvision" 2>/dev/null; then py=$cand; break; fi
done
[ -n "$py" ] || { echo "torchvision-roundtrip: no python3 with torch and torchvision; skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$gw_train" --model resnet50 --seed 3 --steps 0 --save-weights "$work/ours.safetensors"
"$py" "$here/fixtures/torchvision_roundtrip.py" train "$work/ours.safetensors" "$work/torch.safetensors"
"$gw_train" --model resnet50 --steps 0 --load-weights "$work/torch.safetensors" --save-weights "$work/back.safetensors"
"$py" "$here/fixtures/torchvision_roundtrip.py" same "$work/torch.safetensors" "$work/back.safetensors"

"$gw_train" --model resnet18 --steps 0 --save-weights "$work/r18.safetensors"
if "$gw_train" --model resnet50 --steps 0 --load-weights "$work/r18.safetensors" 2>"$work/err"; then
  echo "FAIL: gw-train loaded resnet18 weights into a resnet50"; exit 1
fi
grep -q "layer1.0.conv1.weight" "$work/err" || { echo "FAIL: the refusal does not name the tensor:"; cat "$work/err"; exit 1; }
echo "refused as expected: $(cat "$work/err")"
echo "torchvision-roundtrip: ok"
