#!/usr/bin/env python3
"""scripts/gpu_check_summary.py OUTDIR - the tables at the end of scripts/gpu-check.sh's
summary, from the CSV, text and metrics files its steps left in OUTDIR (what is
missing is said or left out)."""
import csv, os, sys
out = sys.argv[1]
def rows(name):
    # whole rows only: a run stopped while writing (a time limit) can leave the
    # last one cut short (its missing fields come as None)
    p = os.path.join(out, name)
    if not (os.path.exists(p) and os.path.getsize(p)): return []
    return [r for r in csv.DictReader(open(p)) if None not in r.values()]
for name in ("gw-perf-device-n2", "gw-perf-device-n4", "gw-perf-device-staged-n2", "gw-perf-host-n2",
             "gw-perf-device-n2-ce", "gw-perf-device-allgather-n2", "gw-perf-device-allgather-n2-ce",
             "gw-perf-device-n2-chunk1m", "gw-perf-device-n4-ringonly", "gw-perf-device-n2-flagkernel",
             "gw-perf-device-n2-async", "gw-perf-device-n4-async", "gw-perf-device-n4-async-256m"):
    r = rows(name + ".csv")
    if not r:
        print(f"{name}: no results"); continue
    wrong = sum(int(x["oop_wrong"]) + int(x["ip_wrong"]) for x in r)
    big = max(r, key=lambda x: int(x["size"]))
    small = min(r, key=lambda x: int(x["size"]))
    print(f"{name}: #wrong {wrong} over {len(r)} sizes; {small['size']} B {float(small['oop_time_us']):.1f} us; "
          f"{big['size']} B busbw {float(big['oop_busbw']):.2f} GB/s")
for coll, kern, ce in (("allreduce", "gw-perf-device-n2", "gw-perf-device-n2-ce"),
                       ("allgather", "gw-perf-device-allgather-n2", "gw-perf-device-allgather-n2-ce")):
    k, c = rows(kern + ".csv"), rows(ce + ".csv")
    if k and c:
        kb, cb = max(k, key=lambda x: int(x["size"])), max(c, key=lambda x: int(x["size"]))
        print(f"device ring {coll} copies, kernel vs copy engine at {kb['size']} B: busbw "
              f"{float(kb['oop_busbw']):.2f} vs {float(cb['oop_busbw']):.2f} GB/s = "
              f"{float(kb['oop_busbw']) / max(float(cb['oop_busbw']), 1e-9):.2f}x")
for n in (2, 4):
    k, a = rows(f"gw-perf-device-n{n}.csv"), rows(f"gw-perf-device-n{n}-async.csv")
    if k and a:
        sync = {x["size"]: float(x["oop_busbw"]) for x in k}
        pick = [x for x in a if int(x["size"]) >= 65536 and x["size"] in sync and
                (int(x["size"]).bit_length() - 17) % 4 == 0]
        print(f"device ring, {n} ranks, busbw stream-ordered (GW_DEV_ASYNC=1) vs synchronized per chunk: " +
              ", ".join(f"{x['size']} B {float(x['oop_busbw']):.2f} vs {sync[x['size']]:.2f} GB/s = "
                        f"{float(x['oop_busbw']) / max(sync[x['size']], 1e-9):.2f}x" for x in pick))
k, c = rows("gw-perf-device-n4.csv"), rows("gw-perf-device-n4-ringonly.csv")
if k and c:
    ring = {x["size"]: float(x["oop_time_us"]) for x in c}
    small = [x for x in k if int(x["size"]) <= 262144 and x["size"] in ring]
    print("device buffers, 4 ranks, us per allreduce, staged under 64 KiB (default) vs ring only: " +
          ", ".join(f"{x['size']} B {float(x['oop_time_us']):.1f} vs {ring[x['size']]:.1f}" for x in small))
r = rows("reduce-bw.csv")
if r:
    worst = min(float(x["ratio"]) for x in r)
    for x in r:
        print(f"reduce {x['dtype']:>9} {int(x['bytes']) >> 20:5d} MiB: {float(x['reduce_GBps']):8.1f} GB/s vs copy "
              f"{float(x['copy_GBps']):8.1f} GB/s = {float(x['ratio']):.3f}")
    print(f"goal (reduce >= 0.90 of copy): {'met' if worst >= 0.9 else 'MISSED'} (worst {worst:.3f})")
import json, re
def img_s(name):
    p = os.path.join(out, name)
    if not os.path.exists(p): return None
    m = re.findall(r": ([0-9.]+) img/s", open(p).read())
    return [float(x) for x in m]
def one(name):
    v = img_s(name)
    return v[-1] if v else None
gw = {t: one(f"model-bench-{t}.txt")
      for t in ("tf32", "bf16", "fp16", "fp16-nhwc", "bf16-nofuse", "bf16-nhwc", "bf16-nhwc-g1")}
pt = {t: one(f"model-bench-torch-{t}.txt") for t in ("tf32", "bf16", "fp16")}
for t, what in (("tf32", "tf32 (NCHW both)"), ("bf16", "bf16 NCHW vs channels_last amp bf16"),
                ("fp16", "fp16 NCHW vs channels_last amp fp16")):
    if gw[t] and pt[t]:
        print(f"model_bench cudnn {what}: {gw[t]:.1f} vs pytorch {pt[t]:.1f} img/s = {gw[t] / pt[t]:.2f}x"
              + (" (issue 10's goal: 1.1x)" if t == "bf16" else ""))
    elif pt[t]:
        print(f"pytorch {t}: {pt[t]:.1f} img/s (gradwire's run gave no figure)")
if gw["fp16-nhwc"] and pt["fp16"]:
    print(f"model_bench cudnn fp16 NHWC vs channels_last amp fp16: {gw['fp16-nhwc']:.1f} vs pytorch {pt['fp16']:.1f} "
          f"img/s = {gw['fp16-nhwc'] / pt['fp16']:.2f}x")
if gw["bf16"] and gw["bf16-nofuse"]:
    print(f"model_bench cudnn bf16 NCHW: batch norm fused {gw['bf16']:.1f} vs unfused {gw['bf16-nofuse']:.1f} img/s = "
          f"{gw['bf16'] / gw['bf16-nofuse']:.2f}x")
if gw["bf16"] and gw["bf16-nhwc"]:
    print(f"model_bench cudnn bf16: NCHW {gw['bf16']:.1f} vs NHWC {gw['bf16-nhwc']:.1f} img/s = "
          f"{gw['bf16'] / gw['bf16-nhwc']:.2f}x")
if gw["bf16-nhwc"] and gw["bf16-nhwc-g1"]:
    print(f"model_bench cudnn bf16 NHWC: batch-norm sums over 1-8 blocks per piece {gw['bf16-nhwc']:.1f} vs one "
          f"{gw['bf16-nhwc-g1']:.1f} img/s = {gw['bf16-nhwc'] / gw['bf16-nhwc-g1']:.2f}x")
best = max(((gw[t], t) for t in ("bf16", "bf16-nhwc") if gw[t]), default=None)
if best and pt["bf16"]:
    print(f"model_bench cudnn bf16, the faster layout ({'NHWC' if best[1] == 'bf16-nhwc' else 'NCHW'}): {best[0]:.1f} "
          f"vs pytorch {pt['bf16']:.1f} img/s = {best[0] / pt['bf16']:.2f}x (issue 10's goal: 1.1x)")
for tag in ("n1", "n2", "n2-hoststep", "n2-async"):
    p = os.path.join(out, f"gw-train-{tag}.jsonl")
    if not os.path.exists(p): continue
    steps = []
    for l in open(p):
        if '"train"' not in l: continue
        try:  # a diverged run writes nan, which JSON has no word for
            steps.append(json.loads(re.sub(r'(?<![\w"])-?(nan|inf)(?![\w"])', 'null', l)))
        except ValueError:
            pass
    late = [s for s in steps[len(steps) // 2:] if s.get('img_per_s')]
    if late:
        ips = len(late) / sum(1 / s['img_per_s'] for s in late)  # images over their seconds, not a mean of rates
        # null: not finite, or no such time (one rank makes no allreduce)
        ms = lambda k: "n/a" if late[-1].get(k) is None else f"{late[-1][k]:.0f} ms"
        print(f"gw-train cudnn {tag}: {ips:.1f} img/s (steps {late[0]['step']}..{late[-1]['step']}; compute "
              f"{ms('compute_ms')}, comm {ms('comm_ms')}, data {ms('data_ms')} in the last)"
              + (f" = {ips / pt['bf16']:.2f}x pytorch's channels_last amp bf16 {pt['bf16']:.1f} (issue 10's goal: 1.1x)"
                 if pt["bf16"] else ""))
