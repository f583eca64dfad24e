#!/usr/bin/env bash
# compare.sh - gradwire's allreduce next to Open MPI's and the memory-bandwidth limit,
# all measured in one run on this machine (ratios, not absolute numbers: machines
# are shared and noisy).
#
# Runs membw, then BENCH_ROUNDS times in turn: gw-perf with 2 ranks through gw-run;
# mpi_allreduce with 2 ranks under mpirun as is; mpi_allreduce again with glibc
# keeping freed memory (GLIBC_TUNABLES below).  All float32 sum, sizes
# BENCH_MIN..BENCH_MAX by BENCH_FACTOR.  Then prints one line per size (each tool's
# best round) and writes the same table as CSV to bench/results/compare-<date>.csv.  It builds nothing except `meson compile -C $BUILD`
# when a binary is missing; it does not configure a build directory.  Its shell and
# Python helpers are in bench/lib.sh and bench/compare_lib.py (shared with
# compare-tcp.sh).
#
# Environment (defaults in brackets):
#   BUILD               build directory, relative to the repository root [build]
#   BENCH_MIN/MAX       smallest / largest size, suffix K M G allowed [8 / 256M]
#   BENCH_FACTOR        size step factor [2]
#   BENCH_SPLIT         sizes up to this use the small-size iteration counts [1M]
#   BENCH_ITERS, BENCH_WARMUP              iterations at sizes <= SPLIT [100, 10]
#   BENCH_ITERS_LARGE, BENCH_WARMUP_LARGE  iterations at sizes >  SPLIT [20, 3]
#   BENCH_ROUNDS        times each tool runs, alternating; per size the round with
#                       the lowest out-of-place time is kept [2]
#   BENCH_SKIP_GW=1     leave gradwire out (peers and membw only)
#   BENCH_TIMEOUT       seconds one invocation of a tool may take before it is
#                       stopped and the script fails [300]
#   MPIRUN_ARGS         replaces the default Open MPI options
#                       [--bind-to none --oversubscribe --mca pml ob1 --mca btl self,vader]
#   MEMBW_ARGS          passed to membw [-s 256 -r 10]
#
# `compare.sh --latency` instead measures small-message latency: allreduce time at
# 8 B .. 64 KiB (by 2; the table shows 8 B, 64 B, 1 KiB, 4 KiB, 64 KiB) for gradwire
# auto, ring, tree and exchange (recursive doubling; gw-perf -a) and Open MPI as is, at 2 and 4 ranks
# (BENCH_NRANKS), all in one run, BENCH_ROUNDS rounds alternating the tools;
# BENCH_ITERS / BENCH_WARMUP / BENCH_ROUNDS default to 1000 / 100 / 3 there.  It prints the issue's
# goals (auto no slower than Open MPI, within 10% of the best of ring, tree and exchange)
# and the ring/tree crossover, and writes bench/results/latency-<date>.csv.
set -euo pipefail

prog=compare.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
root=$(cd "$here/.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build

command -v mpirun >/dev/null 2>&1 ||
  die "mpirun not found: install Open MPI with 'apt-get install openmpi-bin libopenmpi-dev', then 'meson setup --reconfigure $build' so mpi_allreduce is built"
command -v python3 >/dev/null 2>&1 || die "python3 not found: it joins the results"

skip_gw=${BENCH_SKIP_GW:-0}
gw_run=$build/tools/gw-run
gw_perf=$build/tools/gw-perf
membw=$build/bench/membw
mpi_allreduce=$build/bench/mpi_allreduce

missing() {
  [[ -x $membw && -x $mpi_allreduce ]] || return 0
  [[ $skip_gw == 1 || (-x $gw_run && -x $gw_perf) ]] || return 0
  return 1
}
if missing; then
  [[ -f $build/build.ninja ]] ||
    die "no configured build in $build: run 'meson setup $build' in $root first (or set BUILD)"
  echo "# some binaries are missing: meson compile -C $build"
  meson compile -C "$build" || die "meson compile -C $build failed"
fi
[[ -x $membw ]] || die "$membw was not built"
[[ -x $mpi_allreduce ]] ||
  die "$mpi_allreduce was not built: meson found no MPI; 'apt-get install openmpi-bin libopenmpi-dev', then 'meson setup --reconfigure $build'"
if [[ $skip_gw != 1 ]]; then
  [[ -x $gw_run && -x $gw_perf ]] || die "$gw_run or $gw_perf was not built (BENCH_SKIP_GW=1 leaves gradwire out)"
fi

mode=bandwidth
if [[ ${1:-} == --latency ]]; then
  mode=latency
  : "${BENCH_MIN:=8}" "${BENCH_MAX:=64K}" "${BENCH_ITERS:=1000}" "${BENCH_WARMUP:=100}" "${BENCH_ROUNDS:=3}"
  export BENCH_MIN BENCH_MAX BENCH_ITERS BENCH_WARMUP BENCH_ROUNDS
elif [[ -n ${1:-} ]]; then
  die "unknown argument '$1' (only --latency)"
fi
bench_settings 2

bench_mpi_opts --bind-to none --oversubscribe --mca pml ob1 --mca btl "self,vader"
# Freed memory stays in the heap instead of going back to the kernel, so a buffer
# malloc'd again (Open MPI's temporary buffer in each large allreduce) is not faulted
# in afresh each time.
tunables=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296

work=$(mktemp -d "${TMPDIR:-/tmp}/gw-compare.XXXXXX")
trap 'rm -rf "$work"' EXIT
bench_results compare

t_start=$SECONDS
if [[ $mode == latency ]]; then
  [[ $skip_gw != 1 ]] || die "--latency compares gradwire: BENCH_SKIP_GW=1 makes no sense here"
  bench_results latency
  read -r -a nranks_list <<<"${BENCH_NRANKS:-2 4}"
  echo "# compare.sh --latency $stamp on $(hostname), $(nproc) CPUs; ${nranks_list[*]} ranks; sizes $min..$max B by $factor"
  bench_print_ranges
  for ((round = 1; round <= rounds; round++)); do
    for n in "${nranks_list[@]}"; do
      for algo in auto ring tree exchange; do
        run_step "gradwire $algo, $n ranks, round $round/$rounds" "$algo-n$n-r$round" \
          "$gw_run" -n "$n" "$gw_perf" -a "$algo" -d float32 -o sum -c 1
      done
      run_step "Open MPI, $n ranks, round $round/$rounds" "mpi-n$n-r$round" \
        mpirun "${mpi_opts[@]}" -np "$n" "$mpi_allreduce" -c 1
    done
  done
  PYTHONPATH=$here PYTHONDONTWRITEBYTECODE=1 python3 - "$work" "$out_csv" "$rounds" "$(nproc)" \
    "${nranks_list[@]}" <<'PY'
import csv, sys
from compare_lib import latency_report, wrong_results, load
work, out_csv, rounds, ncores = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
nranks = [int(x) for x in sys.argv[5:]]
rows, misses = latency_report(work, rounds, nranks, ncores, "compare.sh")
with open(out_csv, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["nranks", "size", "auto_us", "ring_us", "tree_us", "exchange_us", "mpi_us", "auto_over_best", "auto_over_mpi"])
    for r in rows:
        w.writerow(r[:2] + ["" if v is None else "%.4f" % v for v in r[2:]])
print()
print("goals missed: " + ("; ".join(misses) if misses else "none"))
print("CSV: %s" % out_csv)
wrong = wrong_results([("%s n=%d" % (k, n), load(work, "%s-n%d" % (k, n), rounds, "compare.sh"))
                       for n in nranks for k in ("auto", "ring", "tree", "exchange", "mpi")])
if wrong:
    print("WRONG RESULTS (figures not valid): " + "; ".join(wrong))
    sys.exit(1)
PY
  echo "# compare.sh --latency took $((SECONDS - t_start)) s"
  exit 0
fi
echo "# compare.sh $stamp on $(hostname), $(nproc) CPUs; sizes $min..$max B by $factor"
bench_print_ranges

echo
echo "## membw ${MEMBW_ARGS:-}"
# shellcheck disable=SC2086  # MEMBW_ARGS is a list of options
"$membw" ${MEMBW_ARGS:-} | tee "$work/membw.txt" || die "membw failed"

# Rounds alternate the tools, so a burst of load from someone else on a shared box
# hits one round of one tool rather than all of it; each size keeps its best round.
for ((round = 1; round <= rounds; round++)); do
  tag="round $round/$rounds"
  if [[ $skip_gw != 1 ]]; then
    run_step "gradwire (gw-perf, 2 ranks), $tag" "gw-r$round" \
      "$gw_run" -n 2 "$gw_perf" -d float32 -o sum -c 1
  fi
  run_step "Open MPI (mpi_allreduce, 2 ranks, as is), $tag" "mpi-r$round" \
    mpirun "${mpi_opts[@]}" -np 2 "$mpi_allreduce" -c 1
  run_step "Open MPI (mpi_allreduce, 2 ranks, GLIBC_TUNABLES=$tunables), $tag" "mpit-r$round" \
    mpirun "${mpi_opts[@]}" -x "GLIBC_TUNABLES=$tunables" -np 2 "$mpi_allreduce" -c 1
done

echo
echo "## comparison (out-of-place, best of $rounds rounds; busbw in GB/s)"
PYTHONPATH=$here PYTHONDONTWRITEBYTECODE=1 python3 - "$work" "$out_csv" "$skip_gw" "$rounds" <<'PY'
import csv, os, sys
from compare_lib import fmt, human, load as load_rounds, num, wrong_results

work, out_csv, skip_gw, rounds = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
def load(name):
    return load_rounds(work, name, rounds, "compare.sh")

membw = {}
with open(os.path.join(work, "membw.txt")) as f:
    for line in f:
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            membw[parts[0]] = float(parts[1])

gw, mpi, mpit = ({} if skip_gw else load("gw")), load("mpi"), load("mpit")
wrong = wrong_results((("gradwire", gw), ("Open MPI", mpi), ("Open MPI tuned", mpit)))

cols = ["size", "gw_time_us", "gw_busbw", "mpi_time_us", "mpi_busbw", "mpi_tuned_time_us",
        "mpi_tuned_busbw", "mpi_best_busbw", "busbw_ratio", "latency_ratio"]
rows = []
for size in sorted(set(gw) | set(mpi) | set(mpit)):
    g, m, t = gw.get(size, {}), mpi.get(size, {}), mpit.get(size, {})
    g_us, g_bw = num(g, "oop_time_us"), num(g, "oop_busbw")
    m_us, m_bw = num(m, "oop_time_us"), num(m, "oop_busbw")
    t_us, t_bw = num(t, "oop_time_us"), num(t, "oop_busbw")
    bws = [v for v in (m_bw, t_bw) if v is not None]
    lats = [v for v in (m_us, t_us) if v is not None and v > 0]
    best_bw = max(bws) if bws else None
    best_us = min(lats) if lats else None
    bw_ratio = g_bw / best_bw if g_bw is not None and best_bw else None
    lat_ratio = g_us / best_us if g_us is not None and best_us else None
    rows.append([size, g_us, g_bw, m_us, m_bw, t_us, t_bw, best_bw, bw_ratio, lat_ratio])

head = "%8s %10s %9s | %10s %9s | %10s %9s | %9s | %7s %7s" % (
    "size", "gw_us", "gw_busbw", "mpi_us", "mpi_busbw", "mpiT_us", "mpiT_bw", "mpi_best",
    "bw_x", "lat_x")
print(head)
print("-" * len(head))
for r in rows:
    print("%8s %10s %9s | %10s %9s | %10s %9s | %9s | %7s %7s" % (
        human(r[0]), fmt(r[1], ".2f"), fmt(r[2], ".2f"), fmt(r[3], ".2f"), fmt(r[4], ".2f"),
        fmt(r[5], ".2f"), fmt(r[6], ".2f"), fmt(r[7], ".2f"), fmt(r[8], ".2f"), fmt(r[9], ".2f")))
print("(mpiT = Open MPI with freed memory kept by glibc; bw_x = gw busbw / better MPI busbw,"
      " above 1: gradwire faster; lat_x = gw time / better MPI time, below 1: gradwire faster)")

with open(out_csv, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(cols)
    for r in rows:
        w.writerow([r[0]] + ["" if v is None else "%.4f" % v for v in r[1:]])

print()
for key in ("memcpy_1t_GBps", "memcpy_2t_GBps", "memcpy_2t_rw_GBps", "add_2t_rw_GBps"):
    if key in membw:
        print("%-22s %8.1f" % (key, membw[key]))
bound = membw.get("memcpy_2t_rw_GBps", 0.0) / 4
if bound > 0:
    print("memory-bandwidth bound for a 2-rank allreduce busbw = memcpy_2t_rw_GBps / 4 = %.2f GB/s"
          % bound)
    for size in (64 << 20, 256 << 20):
        r = next((r for r in rows if r[0] == size), None)
        if r is None:
            print("  %-5s not measured" % human(size))
            continue
        print("  %-5s gradwire busbw %s GB/s = %s of the bound; better Open MPI %s GB/s = %s" % (
            human(size), fmt(r[2], ".2f"), fmt(None if r[2] is None else r[2] / bound, ".0%"),
            fmt(r[7], ".2f"), fmt(None if r[7] is None else r[7] / bound, ".0%")))
else:
    print("membw gave no memcpy_2t_rw_GBps: no bound computed")

print()
print("CSV: %s" % out_csv)
if wrong:
    print("WRONG RESULTS (figures not valid): " + "; ".join(wrong))
    sys.exit(1)
PY
echo "# compare.sh took $((SECONDS - t_start)) s"
