"""model_bench_torch.py - the PyTorch side of bench/compare-model.sh: torchvision's
resnetNN in training mode, forward + label-smoothed cross-entropy + backward +
SGD with momentum on one fixed random batch, timed per step like
bench/model_bench.c, with the same thread count.  Prints one line:

  pytorch 1.13.0 resnet50 224x224x3 batch 16 threads 2: 10.1 img/s (median of 5 steps, ...)
"""
import argparse
import time

import torch
import torchvision

p = argparse.ArgumentParser()
p.add_argument("--depth", type=int, default=50)
p.add_argument("--image-size", type=int, default=224)
p.add_argument("--in-channels", type=int, default=3)
p.add_argument("--classes", type=int, default=1000)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--threads", type=int, default=0)
p.add_argument("--steps", type=int, default=5)
p.add_argument("--warmup", type=int, default=2)
a = p.parse_args()
if a.threads > 0:
    torch.set_num_threads(a.threads)
torch.manual_seed(1)
model = getattr(torchvision.models, "resnet%d" % a.depth)(num_classes=a.classes)
if a.in_channels != 3:
    model.conv1 = torch.nn.Conv2d(a.in_channels, 64, 7, 2, 3, bias=False)
model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
lossf = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
x = torch.rand(a.batch, a.in_channels, a.image_size, a.image_size) - 0.5
y = torch.randint(0, a.classes, (a.batch,))
times = []
for s in range(a.warmup + a.steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = lossf(model(x), y)
    loss.backward()
    opt.step()
    if s >= a.warmup:
        times.append(time.perf_counter() - t0)
times.sort()
med = times[len(times) // 2]
print("pytorch %s resnet%d %dx%dx%d batch %d threads %d: %.2f img/s (median of %d steps, %.3f s/step, loss %.3f)"
      % (torch.__version__, a.depth, a.image_size, a.image_size, a.in_channels, a.batch, torch.get_num_threads(),
         a.batch / med, a.steps, med, loss.item()))
