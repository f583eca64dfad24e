#!/usr/bin/env bash
# transports.sh - gradwire's allreduce over each of its transports on this one
# machine, measured in one run: shm, tcp (loopback, GW_TRANSPORT=tcp) and ib
# through the user-space verbs emulator (GW_TRANSPORT=ib GW_IB_EMULATE=1), the
# same with the buffers registered (gw-perf -R: "ibreg", chunks leave straight
# from them), at
# BENCH_NRANKS ranks (default "2 4"), float32 sum, every result checked (#wrong
# must be 0).  Prints, per world size and size, each transport's best out-of-place
# busbw over the rounds that finished of BENCH_ROUNDS (default 2; a run that failed
# or timed out is left out, and said so) and ib's ratio to tcp and shm, and writes
# bench/results/transports-<date>-<time>.csv.  The emulated ib moves data with
# process_vm_writev: its figures say the transport runs and checks at every size
# and how much it costs on top of a copy, not what an HCA would do (see
# docs/architecture.md for what to measure on a real one).
#
# Usage: bench/transports.sh [BUILD]   (BUILD defaults to $BUILD, else ./build)
# Environment: BENCH_NRANKS ("2 4"), BENCH_ROUNDS (2), BENCH_MIN (1K), BENCH_MAX
# (64M), BENCH_FACTOR (4), BENCH_SPLIT (1M), BENCH_ITERS (100: sizes below the
# split, where 10 iterations were a window of tens of microseconds that one
# scheduler slice outweighed) and BENCH_ITERS_LARGE (10: from the split up).
set -euo pipefail
prog=transports.sh
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
build=$(cd "${1:-${BUILD:-$here/../build}}" && pwd)
gwrun=$build/tools/gw-run
gwperf=$build/tools/gw-perf
if [ ! -x "$gwrun" ] || [ ! -x "$gwperf" ]; then die "build gw-run and gw-perf first ($build)"; fi
# the build's own word (its tests may not be built)
has_ib() { grep -q '^#define GW_HAVE_IBVERBS 1' "$build/gw_config.h" 2>/dev/null; }
has_ib || echo "$prog: this build has no ib transport (libibverbs missing): shm and tcp only" >&2
nranks_list=${BENCH_NRANKS:-2 4}
rounds=${BENCH_ROUNDS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
transports="shm tcp"
has_ib && transports="shm tcp ib ibreg"
split=$(to_bytes "${BENCH_SPLIT:-1M}")
min=$(to_bytes "${BENCH_MIN:-1K}") max=$(to_bytes "${BENCH_MAX:-64M}")
# "first last iters warmup" per gw-perf invocation of a run
parts=()
((min < split)) && parts+=("$min $(( (max < split ? max : split - 1) )) ${BENCH_ITERS:-100} 10")
((max >= split)) && parts+=("$(( (min > split ? min : split) )) $max ${BENCH_ITERS_LARGE:-10} 2")

# $work/runs: one line per run, "TRANSPORT-NRANKS-ROUND EXIT": only the CSVs of
# runs that exited 0 are read (a failed or timed-out run may leave a cut one).
status=0
: >"$work/runs"
for n in $nranks_list; do
  for ((r = 1; r <= rounds; r++)); do
    for t in $transports; do
      env=(GW_TRANSPORT="${t%reg}") extra=()
      [ "${t%reg}" = ib ] && env+=(GW_IB_EMULATE=1)
      [ "$t" = ibreg ] && extra=(-R)
      rc=0 k=0
      : >"$work/$t-$n-$r.log"
      for part in "${parts[@]}"; do
        read -r first last it wu <<<"$part"
        k=$((k + 1))
        ((rc == 0)) || break
        env "${env[@]}" timeout 600 "$gwrun" -n "$n" "$gwperf" -b "$first" -e "$last" \
          -f "${BENCH_FACTOR:-4}" -n "$it" -w "$wu" -c 1 "${extra[@]}" --csv "$work/$t-$n-$r.$k.csv" \
          >>"$work/$t-$n-$r.log" 2>&1 || rc=$?
      done
      echo "$t-$n-$r $rc" >>"$work/runs"
      if ((rc != 0)); then
        why="exit $rc"
        ((rc != 124 && rc != 137)) || why+=": timed out after 600 s"
        echo "$prog: $t at $n ranks, round $r failed ($why):" >&2
        tail -n 5 "$work/$t-$n-$r.log" >&2
        status=1
      fi
    done
  done
done

bench_results transports
out=$out_csv
/usr/bin/env python3 - "$work" "$out" "$transports" "$nranks_list" "$rounds" <<'EOF' || status=1
import csv, os, sys
work, out, transports, nranks_list, rounds = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split(), int(sys.argv[5])
best, wrong, done, left_out = {}, 0, {}, []
with open(os.path.join(work, "runs")) as f:
    runs = [line.split() for line in f if line.strip()]
for name, rc in runs:
    t, n, r = name.split("-")
    if rc != "0":
        left_out.append("%s at %s ranks, round %s (exit %s%s)" % (t, n, r, rc, ", timed out" if rc in ("124", "137") else ""))
        continue
    done[(int(n), t)] = done.get((int(n), t), 0) + 1
    for part in sorted(p for p in os.listdir(work) if p.startswith(name + ".") and p.endswith(".csv")):
        with open(os.path.join(work, part)) as f:
            for row in csv.DictReader(f):
                size = int(row["size"])
                bw = float(row["oop_busbw"])
                wrong += int(row["oop_wrong"]) + int(row["ip_wrong"])
                key = (int(n), size, t)
                best[key] = max(best.get(key, 0.0), bw)
rows = []
for n in sorted({k[0] for k in best}):
    print(f"\n{n} ranks, float32 sum, out-of-place busbw GB/s (best of the rounds that finished: "
          + ", ".join(f"{t} {done.get((n, t), 0)}/{rounds}" for t in transports) + ")")
    print(f"{'size':>10} " + " ".join(f"{t:>8}" for t in transports) + ("   ib/tcp   ib/shm  ibreg/ib" if "ib" in transports else ""))
    for size in sorted({k[1] for k in best if k[0] == n}):
        vals = {t: best.get((n, size, t)) for t in transports}
        line = f"{size:>10} " + " ".join(f"{vals[t]:8.2f}" if vals[t] is not None else f"{'-':>8}" for t in transports)
        if "ib" in transports and vals.get("ib") and vals.get("tcp") and vals.get("shm"):
            line += f"   {vals['ib'] / vals['tcp']:6.2f}x  {vals['ib'] / vals['shm']:6.2f}x"
            if vals.get("ibreg"): line += f"   {vals['ibreg'] / vals['ib']:6.2f}x"
        print(line)
        rows.append([n, size] + [vals[t] if vals[t] is not None else "" for t in transports])
with open(out, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["nranks", "bytes"] + [f"{t}_busbw_gbps" for t in transports])
    w.writerows(rows)
print(f"\n#wrong over the runs read: {wrong}; CSV: {out}")
if left_out:
    # gw-perf also exits 1 when it counted wrong results: such a run is here too.
    print("left out (failed, output above): " + "; ".join(left_out))
sys.exit(1 if wrong or left_out else 0)
EOF
exit $status
