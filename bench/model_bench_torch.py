"""model_bench_torch.py - the PyTorch side of bench/compare-model.sh and of
scripts/gpu-check.sh: torchvision's resnetNN (or, where torchvision is not
installed, test/fixtures/resnet_ref.py, the same network under the same names) in
training mode, forward + label-smoothed cross-entropy + backward + SGD with
momentum on one fixed random batch, timed per step like bench/model_bench.c.
Prints one line:

  pytorch 1.13.0 resnet50 224x224x3 batch 16 cpu threads 2: 10.1 img/s (median of 5 steps, ...)

On a GPU (--device cuda): --channels-last, --amp fp16|bf16 (autocast, with a
GradScaler for fp16, as NVIDIA's recipes), --tf32 0|1 (cudnn.allow_tf32 for the
convolutions and matmul TF32), cudnn.benchmark on; each step ends with a device
synchronization so the time is the step's.

--profile N: N more steps after the timed ones under torch.profiler, printed
before that line: the operators taking the most time (self time on the GPU, on
the CPU without one) per step, beside model_bench --profile's table.
"""
import argparse
import contextlib
import os
import sys
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--depth", type=int, default=50)
p.add_argument("--image-size", type=int, default=224)
p.add_argument("--in-channels", type=int, default=3)
p.add_argument("--classes", type=int, default=1000)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--threads", type=int, default=0)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--device", default="cpu")
p.add_argument("--channels-last", action="store_true")
p.add_argument("--amp", choices=["off", "fp16", "bf16"], default="off")
p.add_argument("--tf32", type=int, default=1)
p.add_argument("--profile", type=int, default=0)
a = p.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
dev = torch.device(a.device)
cuda = dev.type == "cuda"
if cuda:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = bool(a.tf32)
    torch.backends.cuda.matmul.allow_tf32 = bool(a.tf32)
torch.manual_seed(1)
try:
    import torchvision
    model = getattr(torchvision.models, "resnet%d" % a.depth)(num_classes=a.classes)
    if a.in_channels != 3:
        model.conv1 = torch.nn.Conv2d(a.in_channels, 64, 7, 2, 3, bias=False)
    source = "torchvision"
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "fixtures"))
    import resnet_ref
    model = resnet_ref.ResNet(depth=a.depth, classes=a.classes, in_channels=a.in_channels)
    source = "resnet_ref"
fmt = torch.channels_last if a.channels_last else torch.contiguous_format
model = model.to(dev, memory_format=fmt)
model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
lossf = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
x = (torch.rand(a.batch, a.in_channels, a.image_size, a.image_size) - 0.5).to(dev, memory_format=fmt)
y = torch.randint(0, a.classes, (a.batch,)).to(dev)
amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.amp)
if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
    scaler = torch.amp.GradScaler(dev.type, enabled=a.amp == "fp16")
else:
    scaler = torch.cuda.amp.GradScaler(enabled=a.amp == "fp16")


def step():
    opt.zero_grad(set_to_none=True)
    amp = torch.autocast(dev.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    with amp:
        loss = lossf(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    if cuda:
        torch.cuda.synchronize()
    return loss


def profile(n):
    """n steps under torch.profiler: the top operators by self time per step."""
    from torch.profiler import ProfilerActivity
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(n):
            step()
    rows = []
    for ev in prof.key_averages():
        if cuda:  # self_cuda_time_total before torch 2.4, self_device_time_total after
            us = getattr(ev, "self_device_time_total", None)
            us = getattr(ev, "self_cuda_time_total", 0) if us is None else us
        else:
            us = ev.self_cpu_time_total
        if us > 0:
            rows.append((us / n / 1e3, ev.count // n, ev.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print("profile (%d step%s, per step, self %s time): total %.2f ms" % (n, "" if n == 1 else "s",
                                                                          "GPU" if cuda else "CPU", total))
    print("  %-64s %7s %10s %7s" % ("operator or kernel", "calls", "ms", "share"))
    for ms, calls, key in rows[:16]:
        print("  %-64s %7d %10.2f %6.1f%%" % (key[:64], calls, ms, 100 * ms / total if total else 0))


times = []
for s in range(a.warmup + a.steps):
    t0 = time.perf_counter()
    loss = step()
    if s >= a.warmup:
        times.append(time.perf_counter() - t0)
if a.profile > 0:
    try:  # the timing above stands whatever the profiler does
        profile(a.profile)
    except Exception as ex:  # noqa: BLE001 (CUPTI missing, an old torch, ...)
        print("profile failed: %s" % ex)
times.sort()
med = times[len(times) // 2]
what = "cpu threads %d" % torch.get_num_threads() if not cuda else "%s%s amp %s tf32 %d" % (
    torch.cuda.get_device_name(dev), " channels_last" if a.channels_last else "", a.amp, a.tf32)
print("pytorch %s resnet%d (%s) %dx%dx%d batch %d %s: %.2f img/s (median of %d steps, %.3f s/step, loss %.3f)"
      % (torch.__version__, a.depth, source, a.image_size, a.image_size, a.in_channels, a.batch, what,
         a.batch / med, a.steps, med, loss.item()))
