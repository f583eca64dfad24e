#!/usr/bin/env bash
# compare-tcp.sh - gradwire's allreduce over TCP next to Open MPI's tcp BTL and Gloo's
# TCP transport, all measured in one run on this machine (ratios, not absolute
# numbers: machines are shared and noisy).
#
# Two ranks, float32 sum, sizes BENCH_MIN..BENCH_MAX by BENCH_FACTOR counted down
# from BENCH_MAX (8, then 16 .. 256M by 4 by default), BENCH_ROUNDS times in turn:
#   gradwire  gw-perf under gw-run with GW_TRANSPORT=tcp;
#   Open MPI  mpi_allreduce under mpirun with --mca btl self,tcp (pml ob1);
#   Gloo      gloo_allreduce (bench/gloo_allreduce.cc) started by bench/run-pair.sh.
# Then one line per size with each tool's best round (of the rounds it completed: the
# table's heading says how many that was for each), and the same table as CSV in
# bench/results/compare-tcp-<date>.csv (compare-tcp-netns-<date>.csv in netns mode).
#
# Where the ranks talk:
#   default        both on loopback (lo, 127.0.0.1), as two processes of one host.
#   BENCH_NETNS=1  (root only) between two network namespaces that the script makes,
#                  gwb0 and gwb1, joined by a veth pair gwb0-v 10.77.0.1/24 <->
#                  gwb1-v 10.77.0.2/24 and connected to nothing else; one rank in each.
#                  gradwire: one `gw-run -n 1 --nnodes 2 --node-rank R --master
#                  10.77.0.1:PORT` per namespace (GW_JOB_TOKEN shared, fresh per run).
#                  Open MPI: mpirun itself runs in gwb0 and starts each rank through
#                  `ip netns exec gwb<rank>`; its PMIx server must accept the rank in
#                  gwb1 over the veth (PMIX_MCA_ptl_tcp_remote_connections=1), and the
#                  tcp BTL is limited to 10.77.0.0/24.  Gloo: one process per
#                  namespace, each bound to its own address; they meet in a FileStore
#                  directory (the file system is shared across network namespaces).
#                  The namespaces (and with them the veth) are deleted at exit,
#                  whatever the outcome; a namespace of that name that already exists
#                  stops the script before it touches anything.
# Shared memory is never used between the ranks: gradwire is forced onto TCP, Open
# MPI gets no vader BTL, and Gloo has no shared-memory transport.
#
# A tool that fails (until gradwire's TCP transport is there, gw-perf stops with "no
# transport connects") or was not built is reported and left out of the later rounds;
# the rounds it completed before still count (the heading says how many), and a tool
# with none is shown as "-".  The others still run, the table and CSV are still
# written, and the script then exits 1.  It builds nothing except `meson compile -C
# $BUILD` when a binary is missing (a failed build leaves out what it did not
# produce); it does not configure a build directory.
#
# Environment (defaults in brackets):
#   BUILD               build directory, relative to the repository root [build]
#   BENCH_NETNS=1       run between two network namespaces (root), see above [0]
#   BENCH_MIN/MAX       smallest / largest size, suffix K M G allowed [8 / 256M]
#   BENCH_FACTOR        size step factor [4]
#   BENCH_SPLIT         sizes up to this use the small-size iteration counts [1M]
#   BENCH_ITERS, BENCH_WARMUP              iterations at sizes <= SPLIT [100, 10]
#   BENCH_ITERS_LARGE, BENCH_WARMUP_LARGE  iterations at sizes >  SPLIT [20, 3]
#   BENCH_ROUNDS        times each tool runs, alternating; per size the round with
#                       the lowest out-of-place time is kept [2]
#   BENCH_SKIP_GW=1, BENCH_SKIP_MPI=1, BENCH_SKIP_GLOO=1   leave that tool out
#   BENCH_TIMEOUT       seconds one invocation of a tool may take before it is
#                       stopped and counted as failed [300]
#   MPIRUN_ARGS         replaces the default Open MPI options [--bind-to none
#                       --oversubscribe --mca pml ob1 --mca btl self,tcp
#                       --mca btl_tcp_if_include lo (netns: 10.77.0.0/24)]
#   BENCH_NETNS_MTU     MTU of the veth pair [1500, the kernel's default]
set -euo pipefail

prog=compare-tcp.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build

netns_mode=${BENCH_NETNS:-0}
skip_gw=${BENCH_SKIP_GW:-0}
skip_mpi=${BENCH_SKIP_MPI:-0}
skip_gloo=${BENCH_SKIP_GLOO:-0}
[[ $skip_gw == 1 && $skip_mpi == 1 && $skip_gloo == 1 ]] && die "every tool is skipped"

gw_run=$build/tools/gw-run
gw_perf=$build/tools/gw-perf
mpi_allreduce=$build/bench/mpi_allreduce
gloo_allreduce=$build/bench/gloo_allreduce
run_pair=$here/run-pair.sh

command -v python3 >/dev/null 2>&1 || die "python3 not found: it joins the results"
if [[ $netns_mode == 1 ]]; then
  [[ $(id -u) == 0 ]] || die "BENCH_NETNS=1 creates network namespaces: run it as root"
  command -v ip >/dev/null 2>&1 || die "ip not found: 'apt-get install iproute2'"
fi

missing() {
  [[ $skip_gw == 1 || (-x $gw_run && -x $gw_perf) ]] || return 0
  [[ $skip_mpi == 1 || -x $mpi_allreduce ]] || return 0
  [[ $skip_gloo == 1 || -x $gloo_allreduce ]] || return 0
  return 1
}
# A build that fails (gradwire's sources may be in the middle of a change) leaves
# out the tools it did not produce; the others still run.
if missing; then
  [[ -f $build/build.ninja ]] ||
    die "no configured build in $build: run 'meson setup $build' in $root first (or set BUILD)"
  echo "# some binaries are missing: meson compile -C $build"
  meson compile -C "$build" || echo "# $prog: meson compile -C $build failed; going on with what is built" >&2
fi

# failed[tool] = why it was left out; a tool that failed once is not run again.
declare -A failed=()
n_failed=0
not_built() {
  failed[$1]="not built: $2"
  n_failed=$((n_failed + 1))
  echo "# $prog: ${failed[$1]}" >&2
}
if [[ $skip_gw == 1 ]]; then
  failed[gw]="skipped (BENCH_SKIP_GW=1)"
elif [[ ! -x $gw_run || ! -x $gw_perf ]]; then
  not_built gw "$gw_run or $gw_perf is missing (BENCH_SKIP_GW=1 leaves gradwire out)"
fi
if [[ $skip_mpi == 1 ]]; then
  failed[mpi]="skipped (BENCH_SKIP_MPI=1)"
elif ! command -v mpirun >/dev/null 2>&1; then
  not_built mpi "mpirun not found: 'apt-get install openmpi-bin libopenmpi-dev', then 'meson setup --reconfigure $build' (BENCH_SKIP_MPI=1 leaves Open MPI out)"
elif [[ ! -x $mpi_allreduce ]]; then
  not_built mpi "$mpi_allreduce is missing: meson found no MPI? 'apt-get install openmpi-bin libopenmpi-dev', then 'meson setup --reconfigure $build' (BENCH_SKIP_MPI=1 leaves it out)"
fi
if [[ $skip_gloo == 1 ]]; then
  failed[gloo]="skipped (BENCH_SKIP_GLOO=1)"
elif [[ ! -x $gloo_allreduce ]]; then
  not_built gloo "$gloo_allreduce is missing: meson found no C++ compiler or no Gloo? 'apt-get install g++ libgloo-dev', then 'meson setup --reconfigure $build' (BENCH_SKIP_GLOO=1 leaves it out)"
fi
((${#failed[@]} < 3)) || die "no tool left to run"

bench_settings 4 top

# The namespaces, their veth ends and addresses; fixed, private, and made here.
ns=(gwb0 gwb1)
ns_addr=(10.77.0.1 10.77.0.2)
ns_net=10.77.0.0/24
if [[ $netns_mode == 1 ]]; then
  bench_mpi_opts --bind-to none --oversubscribe --mca pml ob1 --mca btl "self,tcp" \
    --mca btl_tcp_if_include "$ns_net"
else
  bench_mpi_opts --bind-to none --oversubscribe --mca pml ob1 --mca btl "self,tcp" \
    --mca btl_tcp_if_include lo
fi

ns_made=()  # namespaces this run created: the only ones it deletes
veth_made=0 # a veth pair exists that may still have an end outside the namespaces
netns_down() {
  local n p
  for n in "${ns_made[@]}"; do
    # Whatever still runs in it was started by this script (the namespace is new).
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns delete "$n" 2>/dev/null || echo "$prog: could not delete network namespace $n" >&2
  done
  ns_made=()
  if ((veth_made)) && ip link show "${ns[0]}-v" >/dev/null 2>&1; then
    ip link delete "${ns[0]}-v" 2>/dev/null || true
  fi
  veth_made=0
}

netns_up() {
  local i mtu=${BENCH_NETNS_MTU:-1500}
  for i in 0 1; do
    if ip netns list | awk '{ print $1 }' | grep -qx "${ns[i]}"; then
      die "network namespace ${ns[i]} already exists (left by an earlier run?); 'ip netns delete ${ns[i]}' if it is not in use"
    fi
  done
  for i in 0 1; do
    ip netns add "${ns[i]}" || die "ip netns add ${ns[i]} failed"
    ns_made+=("${ns[i]}")
  done
  veth_made=1
  ip link add "${ns[0]}-v" mtu "$mtu" type veth peer name "${ns[1]}-v" mtu "$mtu" ||
    die "could not create the veth pair ${ns[0]}-v / ${ns[1]}-v"
  for i in 0 1; do
    if ! { ip link set "${ns[i]}-v" netns "${ns[i]}" &&
      ip -n "${ns[i]}" addr add "${ns_addr[i]}/24" dev "${ns[i]}-v" &&
      ip -n "${ns[i]}" link set "${ns[i]}-v" up &&
      ip -n "${ns[i]}" link set lo up; }; then
      die "could not set up ${ns[i]}-v in ${ns[i]}"
    fi
  done
}

work=$(mktemp -d "${TMPDIR:-/tmp}/gw-compare-tcp.XXXXXX")
# Steps run in the background (lib.sh), so a signal is acted on at once: the step is
# stopped, then the namespaces go.
bench_async=1
cleanup() {
  bench_stop_step
  netns_down
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ $netns_mode == 1 ]]; then
  bench_results compare-tcp-netns
  netns_up
  where="between network namespaces ${ns[0]} (${ns_addr[0]}) and ${ns[1]} (${ns_addr[1]}) over a veth pair, MTU ${BENCH_NETNS_MTU:-1500}"
else
  bench_results compare-tcp
  where="over loopback (127.0.0.1, MTU $(cat /sys/class/net/lo/mtu 2>/dev/null || echo '?'))"
fi
mkdir -p "$work/gloo-store"

t_start=$SECONDS
echo "# $prog $stamp on $(hostname), $(nproc) CPUs; 2 ranks $where; sizes $min..$max B by $factor"
bench_print_ranges

# The command of each tool for one round (gradwire's netns master port is new each
# time, so a port in TIME_WAIT from the round before is never in the way).
gw_cmd() {
  if [[ $netns_mode == 1 ]]; then
    gw=("$run_pair" --netns "${ns[0]}" "${ns[1]}" --env GW_TRANSPORT=tcp --
      "$gw_run" -n 1 --nnodes 2 --node-rank %RANK% --master "${ns_addr[0]}:$((20000 + RANDOM % 10000))"
      "$gw_perf" -d float32 -o sum -c 1)
  else
    gw=(env GW_TRANSPORT=tcp "$gw_run" -n 2 "$gw_perf" -d float32 -o sum -c 1)
  fi
}
if [[ $netns_mode == 1 ]]; then
  # shellcheck disable=SC2016  # $OMPI_COMM_WORLD_RANK and $@ are for the rank's bash
  mpi=(env PMIX_MCA_ptl_tcp_remote_connections=1 "PMIX_MCA_ptl_tcp_if_include=$ns_net"
    ip netns exec "${ns[0]}" mpirun "${mpi_opts[@]}" -np 2
    bash -c 'exec ip netns exec "gwb$OMPI_COMM_WORLD_RANK" "$@"' netns-exec "$mpi_allreduce" -c 1)
  gloo=("$run_pair" --netns "${ns[0]}" "${ns[1]}" --env0 "GLOO_HOST=${ns_addr[0]}" --env1 "GLOO_HOST=${ns_addr[1]}"
    -- "$gloo_allreduce" -c 1 --iface "" --store-dir "$work/gloo-store")
else
  mpi=(mpirun "${mpi_opts[@]}" -np 2 "$mpi_allreduce" -c 1)
  gloo=("$run_pair" -- "$gloo_allreduce" -c 1 --iface "" --host 127.0.0.1 --store-dir "$work/gloo-store")
fi

# step TOOL NAME ROUND COMMAND...: try_step, noting a failure instead of stopping;
# completed[TOOL] counts the rounds it finished.
declare -A completed=([gw]=0 [mpi]=0 [gloo]=0)
step() {
  local tool=$1 name=$2 round=$3
  shift 3
  [[ -z ${failed[$tool]:-} ]] || return 0
  if try_step "$name, round $round/$rounds" "$tool-r$round" "$@"; then
    completed[$tool]=$((completed[$tool] + 1))
    return 0
  fi
  if grep -q "no transport connects" "$work/$tool-r$round.log" 2>/dev/null; then
    failed[$tool]="failed in round $round: no transport connects the ranks over TCP"
  else
    failed[$tool]="failed in round $round (its output is above)"
  fi
  n_failed=$((n_failed + 1))
  echo "# $prog: $name ${failed[$tool]}; left out from here on, the others go on" >&2
}

# Rounds alternate the tools, so a burst of load from someone else on a shared box
# hits one round of one tool rather than all of it; each size keeps its best round.
for ((round = 1; round <= rounds; round++)); do
  gw_cmd
  step gw "gradwire (gw-perf, GW_TRANSPORT=tcp, 2 ranks)" "$round" "${gw[@]}"
  step mpi "Open MPI (mpi_allreduce, btl self,tcp, 2 ranks)" "$round" "${mpi[@]}"
  step gloo "Gloo (gloo_allreduce, tcp, 2 ranks)" "$round" "${gloo[@]}"
done

status_lines=()
for tool in gw mpi gloo; do
  [[ -n ${failed[$tool]:-} ]] || continue
  if ((completed[$tool] > 0)); then
    status_lines+=("$tool: ${failed[$tool]}; its figures are from the ${completed[$tool]} round(s) it completed before")
  else
    status_lines+=("$tool: ${failed[$tool]}; not measured")
  fi
done
# Per size each tool's best round, of the rounds it completed (a tool that failed in
# round k keeps rounds 1..k-1): how many that was, per tool.
done_rounds="gw ${completed[gw]}/$rounds, mpi ${completed[mpi]}/$rounds, gloo ${completed[gloo]}/$rounds"

echo
echo "## comparison (out-of-place, best of the rounds each tool completed: $done_rounds; time in us, busbw in GB/s)"
PYTHONPATH=$here PYTHONDONTWRITEBYTECODE=1 python3 - "$work" "$out_csv" "$rounds" \
  "${completed[gw]}" "${completed[mpi]}" "${completed[gloo]}" "${status_lines[@]}" <<'PY' || exit 1
import csv, os, sys
from compare_lib import fmt, human, load, num, wrong_results

work, out_csv, rounds, notes = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[7:]
done = sys.argv[4:7]  # rounds each tool finished: a best of fewer is marked in the CSV
PROG = "compare-tcp.sh"
tables = {t: load(work, t, rounds, PROG) for t in ("gw", "mpi", "gloo")}
if not any(tables.values()):
    sys.exit("%s: no tool measured anything: %s" % (PROG, "; ".join(notes)))
gw, mpi, gloo = tables["gw"], tables["mpi"], tables["gloo"]
wrong = wrong_results((("gradwire", gw), ("Open MPI", mpi), ("Gloo", gloo)))

cols = ["size", "gw_time_us", "gw_busbw", "mpi_tcp_time_us", "mpi_tcp_busbw", "gloo_time_us",
        "gloo_busbw", "peer_best_time_us", "peer_best_busbw", "busbw_ratio", "latency_ratio",
        "gw_rounds", "mpi_rounds", "gloo_rounds"]
rows = []
for size in sorted(set(gw) | set(mpi) | set(gloo)):
    vals = []
    for t in (gw, mpi, gloo):
        vals += [num(t.get(size, {}), "oop_time_us"), num(t.get(size, {}), "oop_busbw")]
    g_us, g_bw, m_us, m_bw, l_us, l_bw = vals
    lats = [v for v in (m_us, l_us) if v is not None and v > 0]
    bws = [v for v in (m_bw, l_bw) if v is not None]
    best_us = min(lats) if lats else None
    best_bw = max(bws) if bws else None
    bw_ratio = g_bw / best_bw if g_bw is not None and best_bw else None
    lat_ratio = g_us / best_us if g_us is not None and best_us else None
    rows.append([size, g_us, g_bw, m_us, m_bw, l_us, l_bw, best_us, best_bw, bw_ratio, lat_ratio])

line = "%8s %10s %9s | %10s %9s | %10s %9s | %9s | %7s %7s"
head = line % ("size", "gw_us", "gw_busbw", "mpi_us", "mpi_busbw", "gloo_us", "gloo_bw",
               "peer_best", "bw_x", "lat_x")
print(head)
print("-" * len(head))
for r in rows:
    print(line % (human(r[0]), fmt(r[1], ".2f"), fmt(r[2], ".2f"), fmt(r[3], ".2f"),
                  fmt(r[4], ".2f"), fmt(r[5], ".2f"), fmt(r[6], ".2f"), fmt(r[8], ".2f"),
                  fmt(r[9], ".2f"), fmt(r[10], ".2f")))
print("(mpi = Open MPI tcp BTL, gloo = Gloo tcp; peer_best = the better peer busbw; bw_x = gw"
      " busbw / peer_best, above 1: gradwire faster; lat_x = gw time / the better peer time,"
      " below 1: gradwire faster)")

with open(out_csv, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(cols)
    for r in rows:
        w.writerow([r[0]] + ["" if v is None else "%.4f" % v for v in r[1:]] + done)

print()
by_size = {r[0]: r for r in rows}
small = rows[0] if rows else None
if small is not None:
    print("latency at %-5s gradwire %s us, Open MPI %s us, Gloo %s us" % (
        human(small[0]), fmt(small[1], ".2f"), fmt(small[3], ".2f"), fmt(small[5], ".2f")))
for size in (16 << 20, 64 << 20, 256 << 20):
    r = by_size.get(size)
    if r is not None:
        print("busbw at %-5s   gradwire %s GB/s, Open MPI %s GB/s, Gloo %s GB/s" % (
            human(size), fmt(r[2], ".2f"), fmt(r[4], ".2f"), fmt(r[6], ".2f")))
for note in notes:
    print("note: " + note)
print()
print("CSV: %s" % out_csv)
if wrong:
    print("WRONG RESULTS (figures not valid): " + "; ".join(wrong))
    sys.exit(1)
PY
echo "# $prog took $((SECONDS - t_start)) s"
((n_failed == 0)) || exit 1
